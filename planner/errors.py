"""Error types. Every user-facing error is one line: where, which field, what was found/expected."""

from __future__ import annotations


class PlannerError(Exception):
    """Base class for errors reported to the user as one clear line (exit code 2)."""

    exit_code = 2


class SpecError(PlannerError):
    """A spec file (model, cluster, profile, launch args, plan) is wrong.

    Rendered as ``<source>: <field>: <message>``.
    """

    def __init__(self, source: str, field: str | None, message: str):
        self.source = str(source)
        self.field = field
        self.message = message
        where = self.source if not field else f"{self.source}: {field}"
        super().__init__(f"{where}: {message}")


class InvalidStrategy(PlannerError):
    """A parallel configuration that breaks a rule (Megatron's or a placement rule)."""

    exit_code = 1

    def __init__(self, rule: str, message: str):
        self.rule = rule
        self.message = message
        super().__init__(f"[{rule}] {message}")
