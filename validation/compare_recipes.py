"""`plan --compare-with` on NVIDIA's Megatron-Bridge MoE recipes: is the planner's #1 at least as
fast as the published recipe under the model, and does its launch pass Megatron's rules?

Usage: python validation/compare_recipes.py [--only ID_SUBSTRING ...] [--json]

For each MoE row of validation/data/megatron_bridge_launches.yaml (the launches of the shared
Megatron-Bridge recipes, DGX H100 and DGX B200, read by the launch reader `planner check` uses),
on the DGX cluster of its published row (validation/bridge.py dgx_cluster), this does what
`planner plan --compare-with <launch> --precision <the launch's>` does: the search for the
recipe's model, global batch and sequence with the launch's training-recipe settings
(search/space.py recipe_settings), then the recipe's own launch priced beside #1. Printed per
row: the recipe's step and #1's (seconds, the model's), recipe / #1 (>= 1: #1 predicted at least
as fast), #1's layout and execution choices, and whether #1's emitted launch passes Megatron's
rules (megatron/rules.py) and reads back to the same step time. Exit 1 if a row fails either.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "validation"))

from bridge import dgx_cluster, load, read_launch  # noqa: E402

from planner.emit.plans import layout_text  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.megatron.emit import checked_args  # noqa: E402
from planner.megatron.launch import parse_words  # noqa: E402
from planner.megatron.rules import megatron_violations  # noqa: E402
from planner.search.planner import SearchOptions, search  # noqa: E402
from planner.search.space import recipe_settings  # noqa: E402

# #1's launch read back prices the step #1 was priced at, to this relative tolerance
READ_BACK_RTOL = 1e-9


def compare(row: dict, published: dict) -> dict:
    """One recipe: the search with its settings, its launch priced beside #1, #1's launch checked."""
    gpus = published["gpus"]
    cluster = dgx_cluster(row["system"], gpus)
    launch = read_launch(row["launch"], row["id"], gpus)
    model, s = launch.model, launch.strategy
    o = SearchOptions(global_batch_size=s.global_batch_size, seq_length=s.seq_length, top=1, precision=s.precision,
                      settings=recipe_settings(s, s.precision))
    res = search(model, cluster, o)
    recipe = estimate(model, cluster, s)
    out = {"id": row["id"], "recipe_s": recipe.step_time_s, "recipe_layout": layout_text(s),
           "search_s": res.seconds, "status": res.status}
    if not res.plans:
        return {**out, "error": "no plan"}
    top = res.plans[0]
    t = top.strategy
    args = checked_args(model, t)
    back = parse_words(args, "emitted", world_size=t.world_size)
    again = estimate(model, cluster, back.strategy.with_(stage_node_groups=t.stage_node_groups))
    return {**out, "top_s": top.step_time_s, "recipe_over_top": recipe.step_time_s / top.step_time_s,
            "top_layout": f"{layout_text(t)} mbs{t.micro_batch_size}", "recompute": t.recompute_label,
            "moe_overlap": t.moe_overlap_label, "violations": [v.rule for v in megatron_violations(back, model)],
            "read_back": abs(again.step_time_s - top.step_time_s) <= READ_BACK_RTOL * top.step_time_s,
            "verdict": top.memory_verdict}


def moe_rows(only=()) -> list[tuple[dict, dict]]:
    """(launch row, published row) of every MoE recipe, those whose id contains one of `only`."""
    perf, launches = load("megatron_bridge_perf.yaml", "megatron_bridge_launches.yaml")
    return [(r, perf[r["id"]]) for r in launches
            if perf[r["id"]]["shape"]["family"] != "dense" and (not only or any(x in r["id"] for x in only))]


def ok(rec: dict) -> bool:
    return "error" not in rec and rec["recipe_over_top"] >= 1.0 and not rec["violations"] and rec["read_back"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=(), help="rows whose id contains one of these")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    recs = [compare(row, published) for row, published in moe_rows(a.only)]
    if a.json:
        print(json.dumps(recs, indent=1))
    else:
        print(f"{'recipe':52s} {'recipe s':>9s} {'#1 s':>8s} {'recipe/#1':>9s}  #1 layout, recompute, MoE overlap; "
              "launch")
        for r in recs:
            if "error" in r:
                print(f"{r['id']:52s} {r['error']}")
                continue
            launch = "accepted, reads back" if not r["violations"] and r["read_back"] else \
                f"REFUSED {r['violations']}" if r["violations"] else "READ BACK DIFFERS"
            print(f"{r['id']:52s} {r['recipe_s']:9.3f} {r['top_s']:8.3f} {r['recipe_over_top']:9.2f}  "
                  f"{r['top_layout']}, {r['recompute']}, {r['moe_overlap']}; {launch}")
        worst = min((r["recipe_over_top"] for r in recs if "error" not in r), default=None)
        print(f"{sum(ok(r) for r in recs)} of {len(recs)} rows: #1 >= the recipe and its launch accepted"
              + (f"; least recipe/#1 {worst:.2f}" if worst is not None else ""))
    return 0 if all(ok(r) for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
