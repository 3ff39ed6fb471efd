"""The launch script reader now lives in planner.bash (lexer, parser, interpreter); this module
keeps the names the Megatron code and older imports use."""

from ..bash import (MAX_LOOP_ITERATIONS, MAX_SOURCE_DEPTH, Command, Interpreter, Partial, ShellResult,
                    ShellSyntaxError, Unknown, Word, Wrapper, flag_words, is_flags_text, read_script,
                    sbatch_options, tokenize)

__all__ = ["MAX_LOOP_ITERATIONS", "MAX_SOURCE_DEPTH", "Command", "Interpreter", "Partial", "ShellResult",
           "ShellSyntaxError", "Unknown", "Word", "Wrapper", "flag_words", "is_flags_text", "read_script",
           "sbatch_options", "tokenize"]
