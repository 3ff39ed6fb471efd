"""Layouts experts published, as launches, against the planner, and against the planner's own #1.

Usage: python validation/published.py [--json]

validation/data/published/ holds launches of runs whose throughput was published (each file's
header cites the paper and what it states): Llama 3 405B on 16,384 H100 (Dubey et al. 2024:
400 TFLOP/s per GPU, bf16) and DeepSeek-V3 on 2,048 H800 (DeepSeek-V3 report: 180K H800
GPU-hours per trillion tokens). For each: the published and predicted throughput, and the
planner's own top plan for the same model, cluster, batch and sequence with the ratio of its
predicted step to the published layout's predicted step (how much better the planner claims
to do; the terms that differ come from `planner compare`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.estimate import estimate  # noqa: E402
from planner.library import load_cluster_ref  # noqa: E402
from planner.megatron.launch import parse_file  # noqa: E402
from planner.search.planner import SearchOptions, search  # noqa: E402

PUBLISHED = [
    # file, cluster, published figure, what it is, how to turn the prediction into it
    ("llama3-405b-meta.sh", "dgx-h100-x2048", 400.0, "model TFLOP/s per GPU (Dubey et al. 2024, Table 4)",
     lambda e: e.model_tflops_per_gpu),
    ("deepseek-v3.sh", "h800-x256", 1e12 / (180e3 * 3600), "tokens/s per GPU (180K H800-hours per 1T tokens)",
     lambda e: e.tokens_per_s / e.strategy.world_size),
]


def rows() -> list[dict]:
    out = []
    for name, cluster_name, published, what, measure in PUBLISHED:
        cluster = load_cluster_ref(cluster_name)
        launch = parse_file(ROOT / "validation" / "data" / "published" / name, env={}, default_world_size=cluster.num_gpus)
        e = estimate(launch.model, cluster, launch.strategy)
        s = launch.strategy
        res = search(launch.model, cluster, SearchOptions(global_batch_size=s.global_batch_size,
                                                          seq_length=s.seq_length, top=1, precision=s.precision,
                                                          time_limit_s=60))
        top = res.plans[0] if res.plans else None
        out.append({"run": name, "published": published, "unit": what, "predicted": measure(e),
                    "error_pct": 100 * (measure(e) - published) / published, "published_layout_step_s": e.step_time_s,
                    "planner_top_step_s": top.step_time_s if top else None,
                    "planner_top_claims_speedup": e.step_time_s / top.step_time_s if top else None,
                    "planner_top": (f"tp{top.strategy.tp} pp{top.strategy.pp} dp{top.strategy.dp} cp{top.strategy.cp} "
                                    f"ep{top.strategy.ep} vpp{top.strategy.vpp}") if top else None,
                    "search_status": res.status,
                    # the published layout as a Megatron-LM launch: would it fit under this model?
                    "published_layout_verdict": e.memory_verdict,
                    "published_layout_peak_gib": e.peak_memory.total / 2**30,
                    "usable_gib": e.peak_memory.capacity / 2**30})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = rows()
    if a.json:
        print(json.dumps(out, indent=2))
        return
    for r in out:
        print(f"{r['run']}: published {r['published']:.0f}, predicted {r['predicted']:.0f} ({r['error_pct']:+.1f}%) "
              f"{r['unit']}; the planner's own #1 ({r['planner_top']}, {r['search_status']}) predicts "
              f"{r['planner_top_claims_speedup']:.2f}x the published layout's speed; as a Megatron-LM launch the "
              f"published layout needs {r['published_layout_peak_gib']:.1f} GiB of {r['usable_gib']:.1f} usable "
              f"({r['published_layout_verdict']})")


if __name__ == "__main__":
    main()
