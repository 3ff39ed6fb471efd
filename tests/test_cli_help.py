"""--help reads well: every option has help text, flags show no value placeholder, and plan's
options sit in named panels."""

from __future__ import annotations

import pytest

from _cli import run, env_with
from planner.cli import command


def _options():
    root = command()
    for name, sub in root.commands.items():
        for p in sub.params:
            if p.param_type_name == "option":
                yield name, p


def test_every_option_of_every_command_has_help_text():
    missing = [f"{name} {p.opts[0]}" for name, p in _options() if not (p.help or "").strip()]
    assert missing == []


def test_flags_have_no_value_placeholder():
    flags = [(name, p) for name, p in _options() if getattr(p, "is_flag", False)]
    assert len(flags) > 10
    assert all(p.metavar == "" for _, p in flags)


@pytest.mark.parametrize("cmd", ["plan", "check", "estimate", "sweep", "calibrate"])
def test_help_shows_no_bool_placeholder_and_ends_with_examples(cmd):
    r = run([cmd, "--help"], env=env_with(COLUMNS="100"))
    assert r.returncode == 0, r.stderr
    assert "<bool>" not in r.stdout
    assert "Examples:" in r.stdout and f"planner {cmd} " in r.stdout.split("Examples:")[1]


def test_plan_options_are_grouped_in_panels():
    plan = command().commands["plan"]
    panels = {p.rich_help_panel for p in plan.params if p.param_type_name == "option"}
    assert None not in panels
    assert {"Model and cluster", "Batch", "Search space", "Objective", "Output"} <= panels


FIRST_PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "256",
              "--seq-length", "8192"]


def _table_rows(text):
    return [ln for ln in text.splitlines() if ln.startswith("│")]


def test_first_plan_table_fits_100_columns_without_a_wrapped_cell():
    """At 100 columns the compact table holds each plan on one line; on a pipe (160 columns)
    and with --wide every column is there."""
    narrow = run(FIRST_PLAN, env=env_with(COLUMNS="100"))
    assert narrow.returncode == 0, narrow.stderr
    rows = _table_rows(narrow.stdout)
    assert len(rows) == 3 and all(len(r) <= 100 for r in rows)
    assert "layout" in narrow.stdout and "stages on" not in narrow.stdout
    wide = run(FIRST_PLAN + ["--wide"], env=env_with(COLUMNS="100"))
    assert "idle" in _table_rows(wide.stdout)[0] or "idle" in wide.stdout.split("┡")[0]
    piped = run(FIRST_PLAN, env=env_with(COLUMNS=None))
    assert "stages on" in piped.stdout and len(_table_rows(piped.stdout)) == 3
