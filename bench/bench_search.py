"""Search-time benchmark (not a test): `python bench/bench_search.py [--time-limit S]`.

Plans each scenario of the search issue once and prints candidates, priced, seconds and the top
plan. Machines here are noisy: compare runs made side by side.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.library import load_cluster_ref, load_model_ref  # noqa: E402
from planner.search.planner import SearchOptions, search  # noqa: E402

SCENARIOS = [
    ("llama3-8b", "dgx-h100-x8", 512, 8192),
    ("llama3-70b", "dgx-h100-x128", 1024, 8192),
    ("llama3.1-405b", "dgx-h100-x2048", 2048, 8192),
    ("mixtral-8x22b", "dgx-h100-x32", 1024, 4096),
    ("deepseek-v3", "h800-x256", 4096, 4096),
    ("llama3-70b", "mixed-512", 1024, 4096),
]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=120.0)
    a = ap.parse_args(argv)
    print(f"{'model':15s} {'cluster':16s} {'GPUs':>6s} {'cands':>7s} {'priced':>6s} {'secs':>6s}  top plan")
    for model, cluster, gbs, seq in SCENARIOS:
        m, c = load_model_ref(model), load_cluster_ref(cluster)
        t0 = time.perf_counter()
        r = search(m, c, SearchOptions(global_batch_size=gbs, seq_length=seq, top=1, time_limit_s=a.time_limit))
        dt = time.perf_counter() - t0
        if r.plans:
            e = r.plans[0]
            s = e.strategy
            top = (f"tp{s.tp} pp{s.pp} dp{s.dp} cp{s.cp} ep{s.ep} vpp{s.vpp} mbs{s.micro_batch_size} "
                   f"{s.recompute} z{s.zero_stage} step {e.step_time_s:.2f}s MFU {e.mfu * 100:.1f}%"
                   f" [{' '.join(sorted(set(e.stage_groups)))}]")
        else:
            top = "no plan fits"
        print(f"{model:15s} {cluster:16s} {c.num_gpus:6d} {r.candidates:7d} {r.priced:6d} {dt:6.1f}  {top}"
              + ("  (time limit)" if r.status == "time-limit" else ""))


if __name__ == "__main__":
    main()
