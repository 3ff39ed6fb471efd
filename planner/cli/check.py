"""`planner check`: the CI gate on a Megatron-LM launch or a plan JSON."""

from __future__ import annotations

from typing import List, Optional

import typer

from ..megatron.check import parse_settings, run_check
from . import app, console


@app.command()
def check(
    cluster: str = typer.Option(..., "--cluster"),
    megatron_args: Optional[str] = typer.Option(None, "--megatron-args"),
    plan_file: Optional[str] = typer.Option(None, "--plan", help="A plan JSON written by `planner plan --json`"),
    model: Optional[str] = typer.Option(None, "--model"),
    world_size: Optional[int] = typer.Option(None, "--world-size", help="Default: from the launcher (torchrun, Slurm), else the cluster size"),
    set_values: Optional[List[str]] = typer.Option(None, "--set", help="NAME=VALUE for a script variable the planner cannot know (1=... for $1)"),
    verbose: bool = typer.Option(False, "--verbose", help="Also list the flags read that change nothing"),
    as_json: bool = typer.Option(False, "--json"),
):
    """CI gate: exit 0 if the launch is valid and fits, 1 if it breaks a rule or does not fit,
    2 if the input is unusable."""
    code = run_check(cluster, megatron_args, plan_file, model, world_size, as_json, console,
                     parse_settings(set_values), verbose)
    raise typer.Exit(code)
