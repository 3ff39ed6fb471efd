"""`planner compare`: two plans (or launches) side by side on one cluster."""

from __future__ import annotations

from typing import Optional

import typer

from ..library import load_cluster_ref
from ..megatron.check import load_plan_or_launch
from . import app, console, print_json


@app.command()
def compare(
    plan_a: str = typer.Argument(..., help="Plan JSON (plan --json, or plan.json from --emit) or Megatron launch file"),
    plan_b: str = typer.Argument(..., help="The same, for the other plan"),
    cluster: str = typer.Option(..., "--cluster"),
    model: Optional[str] = typer.Option(None, "--model", help="Default: the model the files name"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Two plans (or launches) side by side on one cluster, and the terms that differ."""
    from ..emit.explain import differing_terms, render_compare   # the cost model
    from ..emit.report import estimate_to_dict
    from ..estimate import estimate as run_estimate
    c = load_cluster_ref(cluster)
    ests = []
    for f in (plan_a, plan_b):
        m, s = load_plan_or_launch(f, c, model)
        ests.append(run_estimate(m, c, s))
    a, b = ests
    if as_json:
        print_json({"a": estimate_to_dict(a), "b": estimate_to_dict(b),
                    "differing_terms": [{"term": k, "a_s": va, "b_s": vb} for k, va, vb in differing_terms(a, b)]})
        raise typer.Exit(0)
    render_compare(a, b, console, f"{plan_a} vs {plan_b} on {c.name}")
    raise typer.Exit(0)
