"""Read a launch script the way bash would, without running anything.

The subset is the one Megatron-LM's own example scripts are written in: quoting, backslash
continuations, comments, variables with `${VAR:-d}` / `${VAR:=d}` / `${VAR-d}` / `${VAR:+w}`,
bash arrays (`A=( ... )`, `A+=( ... )`, `"${A[@]}"`), `export` / `unset`, `$(( ))` arithmetic,
`if` / `case` / `for` blocks, `&&` / `||`, `source FILE`, here-documents (`sbatch <<EOF`),
`bash -c "..."`, and `#SBATCH` headers. Which command is the launch (the last one that runs a
Python training script, behind `srun`, `torchrun`, ... prefixes) is planner.megatron.launch's
business.

Nothing is executed: `$(...)` and backticks stay text, and a value that depends on one, on a
script argument (`$1`) or on a variable nobody set is *unknown*: words carry the names they
depend on, so the reader can say which value is missing and how to give it (`--set NAME=VALUE`
or the environment). A default that would run a command (`X=${X:-$(hostname)}`) is unknown as
the variable it defaults (X), which --set gives. A condition that cannot be decided without
running something takes its default branch (`else`, or `*)` in a `case`), and every decision is
reported in `notes`. Branches that end the script (`exit`) are not taken: the checks a script
makes before it launches are assumed to pass.

Modules: `lexer` (text -> tokens; a word's parts), `parser` (tokens -> command nodes),
`expand` (parameter expansion and field splitting), `conditions` (tests and arithmetic),
`interpreter` (runs the nodes; `read_script`, `flag_words`), `slurm` (#SBATCH / srun options),
`words` (`Word` and the values a word is made of).
"""

from .interpreter import (MAX_LOOP_ITERATIONS, MAX_SOURCE_DEPTH, Command, Interpreter, ShellResult, Wrapper,
                          flag_words, is_flags_text, read_script, tokenize)
from .lexer import ShellSyntaxError
from .slurm import sbatch_options
from .words import Partial, Unknown, Word

__all__ = ["MAX_LOOP_ITERATIONS", "MAX_SOURCE_DEPTH", "Command", "Interpreter", "Partial", "ShellResult",
           "ShellSyntaxError", "Unknown", "Word", "Wrapper", "flag_words", "is_flags_text", "read_script",
           "sbatch_options", "tokenize"]
