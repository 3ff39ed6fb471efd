"""The errors a Megatron-LM launch is refused with while its flags are read.

`InvalidLaunch` lists what Megatron-LM's argparse or validate_args would refuse; a flag that
changes the model or the strategy and whose value the script cannot know without running is
refused with the `--set` that gives it (`unknown_value_error`).
"""

from __future__ import annotations

import re

from ..errors import InvalidStrategy, SpecError

class InvalidLaunch(InvalidStrategy):
    """Launch arguments Megatron-LM's argparse or validate_args would refuse (exit 1); every
    problem found, one line each."""

    def __init__(self, problems: list[tuple[str, str]], source: str):
        self.problems = problems
        self.source = source
        rule, msg = problems[0]
        super().__init__(rule, msg + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def unknown_value_error(source: str, opt: str, names: tuple[str, ...]) -> SpecError:
    """The flag `opt` depends on `names` (script variables, arguments, command output) the
    script cannot know without running: the --set that gives them."""
    shown = ", ".join(names)
    plain = [n for n in names if re.fullmatch(r"[A-Za-z_]\w*|\d+", n)]
    how = (" ".join(f"--set {n}=VALUE" for n in plain) + (" (or export it)" if len(plain) == 1 else " (or export them)")
           if len(plain) == len(names) else "write the value, or --set the variable it is assigned to")
    return SpecError(source, opt, f"its value depends on {shown}, which cannot be known without running the script; {how}")


def clean_unknown_name(name: str) -> str:
    """$TP / ${TP} / $1 -> TP / 1; a command substitution stays as written."""
    return name[1:].strip("{}") if re.fullmatch(r"\$\{?([A-Za-z_]\w*|\d+)\}?", name) else name
