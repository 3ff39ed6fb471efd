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
from planner.specs.cluster import cluster_from_dict  # noqa: E402
from planner.specs.model import model_from_dict  # noqa: E402

# Boundedness (issue 7): 12,500 DGX H100 nodes, and a 1,000-layer Llama-3-8B-wide model.
H100_100K = cluster_from_dict({"name": "h100-x100k", "node_groups": [
    {"name": "h100", "nodes": 12_500, "gpus_per_node": 8, "gpu": "h100-sxm-80g", "nics_per_node": 8,
     "nic_bandwidth": "400 Gb/s"}]}, "bench")
DEEP_1000 = model_from_dict({
    "name": "deep-1000", "num_layers": 1000, "hidden_size": 4096, "num_attention_heads": 32,
    "num_query_groups": 8, "ffn_hidden_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
    "swiglu": True, "normalization": "RMSNorm", "position_embedding_type": "rope"}, "bench")

SCENARIOS = [
    ("llama3-8b", "dgx-h100-x8", 512, 8192),
    ("llama3-70b", "dgx-h100-x128", 1024, 8192),
    ("llama3.1-405b", "dgx-h100-x2048", 2048, 8192),
    ("mixtral-8x22b", "dgx-h100-x32", 1024, 4096),
    ("deepseek-v3", "h800-x256", 4096, 4096),
    ("llama3-70b", "mixed-512", 1024, 4096),
    ("llama3.1-405b", H100_100K, 16384, 8192),
    (DEEP_1000, "dgx-h100-x128", 1024, 4096),
]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=120.0)
    a = ap.parse_args(argv)
    print(f"{'model':15s} {'cluster':16s} {'GPUs':>6s} {'cands':>7s} {'priced':>6s} {'secs':>6s}  top plan")
    for model, cluster, gbs, seq in SCENARIOS:
        m = load_model_ref(model) if isinstance(model, str) else model
        c = load_cluster_ref(cluster) if isinstance(cluster, str) else cluster
        t0 = time.perf_counter()
        r = search(m, c, SearchOptions(global_batch_size=gbs, seq_length=seq, top=1, time_limit_s=a.time_limit))
        dt = time.perf_counter() - t0
        if r.plans:
            e = r.plans[0]
            s = e.strategy
            top = (f"tp{s.tp} pp{s.pp} dp{s.dp} cp{s.cp} ep{s.ep} vpp{s.vpp} mbs{s.micro_batch_size} "
                   f"{s.recompute_label} z{s.zero_stage} step {e.step_time_s:.2f}s MFU {e.mfu * 100:.1f}%"
                   f" [{' '.join(sorted(set(e.stage_groups)))}]")
        else:
            top = "no plan fits"
        print(f"{m.name:15s} {c.name:16s} {c.num_gpus:6d} {r.candidates:7d} {r.priced:6d} {dt:6.1f}  {top}"
              + ("  (time limit)" if r.status == "time-limit" else ""))


if __name__ == "__main__":
    main()
