"""Search-time benchmark (not a test): `python bench/bench_search.py [--time-limit S] [--only K]
[--repeat N] [--jobs N[,M...] | --side-by-side]`.

Plans each bundled scenario once (with --repeat N: N times, each in a fresh process, so no
run finds the caches of another warm, and reports the median with the range) and prints one
table: seconds, status (optimal, or stopped by the time limit with its gap), the candidate
counts (candidates = pruned by memory + pruned by the step-time bound + pruned as dominated by
a plan found + priced) and the top plan. `--jobs` sets SearchOptions.jobs (default: every
core); several values (`--jobs 1,2`) run each scenario once per value, alternating, each in
a fresh process, and the table gives the seconds of each side by side with their ratio and
whether the plans and counts agree; `--side-by-side` is `--jobs 1,<cores>`: serial against
parallel in one run, the comparison to trust on a noisy machine.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.errors import PlannerError  # noqa: E402
from planner.library import load_cluster_ref, load_model_ref  # noqa: E402
from planner.search.planner import SearchOptions, search  # noqa: E402
from planner.search.sweep import default_jobs  # noqa: E402
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

# (model, cluster, global batch, sequence, extra SearchOptions)
SCENARIOS = [
    ("llama3-8b", "dgx-h100-x8", 512, 8192, {}),
    ("llama3-70b", "dgx-h100-x128", 1024, 8192, {}),
    ("llama3.1-405b", "dgx-h100-x2048", 2048, 8192, {}),
    ("llama3.1-405b", "dgx-h100-x2048", 2048, 8192, {"precision": "fp8", "zero_stages": (0, 1, 3)}),
    ("mixtral-8x22b", "dgx-h100-x32", 1024, 4096, {}),
    ("deepseek-v3", "h800-x256", 4096, 4096, {}),
    ("llama3-70b", "mixed-512", 1024, 4096, {}),
    ("qwen3-235b-a22b", "mixed-512", 1024, 4096, {}),
    ("qwen3-235b-a22b", "mixed-512", 1024, 8192, {}),
    ("deepseek-v3", "mixed-512", 1024, 4096, {}),
    ("deepseek-v3", "mixed-512", 1024, 8192, {}),
    ("llama3.1-405b", H100_100K, 16384, 8192, {}),
    (DEEP_1000, "dgx-h100-x128", 1024, 4096, {}),
]


def _top(r) -> str:
    if not r.plans:
        return "no plan fits"
    e = r.plans[0]
    s = e.strategy
    etp = f" etp{s.expert_tp}" if e.model.is_moe else ""
    return (f"tp{s.tp} pp{s.pp} dp{s.dp} cp{s.cp} ep{s.ep}{etp} vpp{s.vpp} mbs{s.micro_batch_size} "
            f"{s.recompute_label} z{s.zero_stage} {e.step_time_s:.2f}s MFU {e.mfu * 100:.1f}%"
            f" [{' '.join(sorted(set(e.stage_groups)))}]")


def _plan(scenario, time_limit: float, jobs: int = 1, slim: bool = False):
    """(seconds, result or error) of one search of a scenario with `jobs` processes; `slim`:
    without the estimates priced (a result sent back from a fresh process)."""
    model, cluster, gbs, seq, extra = scenario
    m = load_model_ref(model) if isinstance(model, str) else model
    c = load_cluster_ref(cluster) if isinstance(cluster, str) else cluster
    t0 = time.perf_counter()
    try:
        r = search(m, c, SearchOptions(global_batch_size=gbs, seq_length=seq, top=1,
                                       time_limit_s=time_limit, jobs=jobs, **extra))
    except PlannerError as exc:
        r = exc
    dt = time.perf_counter() - t0
    if slim and not isinstance(r, PlannerError):
        r.priced_estimates = []
    return dt, r


def _fresh(scenario, time_limit: float, jobs: int):
    """_plan in a fresh process (no run finds the caches of another warm)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(_plan, scenario, time_limit, jobs, True).result()


def run(scenarios, time_limit: float, repeat: int = 1, jobs: int | None = None):
    """Yields one row per scenario: (model, cluster, seq, options, seconds, result or error,
    every run's seconds). With repeat > 1 each run is a fresh process and seconds is the median."""
    jobs = jobs or default_jobs()
    for scenario in scenarios:
        model, cluster, _, seq, extra = scenario
        m = load_model_ref(model) if isinstance(model, str) else model
        c = load_cluster_ref(cluster) if isinstance(cluster, str) else cluster
        if repeat <= 1:
            dt, r = _plan(scenario, time_limit, jobs)
            yield m, c, seq, extra, dt, r, [dt]
            continue
        times = []
        for _ in range(repeat):
            dt, r = _fresh(scenario, time_limit, jobs)
            times.append(dt)
        yield m, c, seq, extra, statistics.median(times), r, times


def _outcome(r) -> tuple:
    """What must agree between runs with different jobs: the plans, the TIGHT plan named
    beside them, the status and every count."""
    if isinstance(r, PlannerError):
        return (str(r),)
    return ([e.strategy for e in r.plans], r.fastest_tight.strategy if r.fastest_tight else None, r.status,
            r.candidates, r.pruned_memory, r.pruned_bound, r.pruned_dominated, r.priced)


def side_by_side(scenarios, time_limit: float, jobs_list: list[int], repeat: int = 1):
    """Yields one row per scenario: (model, cluster, seq, options, {jobs: median seconds}, the
    last result, whether every run's plans and counts agree). Runs alternate between the jobs
    values, each in a fresh process."""
    for scenario in scenarios:
        model, cluster, _, seq, extra = scenario
        m = load_model_ref(model) if isinstance(model, str) else model
        c = load_cluster_ref(cluster) if isinstance(cluster, str) else cluster
        times: dict = {j: [] for j in jobs_list}
        outcomes = set()
        for _ in range(repeat):
            for j in jobs_list:
                dt, r = _fresh(scenario, time_limit, j)
                times[j].append(dt)
                outcomes.add(repr(_outcome(r)))
        yield m, c, seq, extra, {j: statistics.median(v) for j, v in times.items()}, r, len(outcomes) == 1


def _row(m, c, seq, extra, secs: str, r) -> str:
    opts = " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in extra.items())
    if isinstance(r, PlannerError):
        return f"| {m.name} | {c.name} | {c.num_gpus:,} | {seq} | {opts} | {secs} | refused: {r} | | | | | |"
    status = r.status if r.optimality_gap == 0 else f"{r.status}, gap {r.optimality_gap * 100:.2f}%"
    total = r.pruned_memory + r.pruned_bound + r.pruned_dominated + r.priced
    counts = f"{r.candidates:,}" + ("" if total == r.candidates else f" (counted {total:,})")
    return (f"| {m.name} | {c.name} | {c.num_gpus:,} | {seq} | {opts} | {secs} | {status} | {counts} "
            f"| {r.pruned_memory:,} | {r.pruned_bound + r.pruned_dominated:,} | {r.priced:,} | {_top(r)} |")


def _jobs_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
        assert out and all(j >= 1 for j in out)
    except (ValueError, AssertionError):
        raise SystemExit(f"bench_search.py: --jobs: found {text!r}, expected process counts >= 1 such as 1,2") from None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--only", type=int, action="append", help="run only scenario K (0-based; repeatable)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per scenario, each in a fresh process (median)")
    ap.add_argument("--jobs", default=None, help="processes per search (default: every core); several, "
                                                 "comma-separated: each scenario with each, side by side")
    ap.add_argument("--side-by-side", action="store_true", help="serial against parallel in one run: --jobs 1,<cores>")
    a = ap.parse_args(argv)
    todo = [SCENARIOS[k] for k in a.only] if a.only else SCENARIOS
    jobs = [1, max(default_jobs(), 2)] if a.side_by_side else _jobs_list(a.jobs) if a.jobs else [default_jobs()]
    if len(jobs) > 1:
        return _main_side_by_side(todo, a.time_limit, jobs, a.repeat)
    print(f"jobs {jobs[0]}")
    print("| model | cluster | GPUs | seq | options | seconds | status | candidates | pruned memory "
          "| pruned bound | priced | top plan |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m, c, seq, extra, dt, r, times in run(todo, a.time_limit, a.repeat, jobs[0]):
        secs = f"{dt:.1f}" if len(times) == 1 else f"{dt:.1f} ({min(times):.1f}-{max(times):.1f})"
        print(_row(m, c, seq, extra, secs, r), flush=True)
    who = resource.RUSAGE_SELF if a.repeat <= 1 else resource.RUSAGE_CHILDREN
    print(f"peak RSS {resource.getrusage(who).ru_maxrss / 2**20:.2f} GiB" + ("" if a.repeat <= 1 else " (largest run)"))


def _main_side_by_side(todo, time_limit: float, jobs: list[int], repeat: int) -> None:
    names = " / ".join(f"jobs {j}" for j in jobs)
    print(f"| model | cluster | GPUs | seq | options | seconds ({names}) | status | candidates | pruned memory "
          "| pruned bound | priced | top plan |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    totals = {j: 0.0 for j in jobs}
    agree, ratios = True, []
    for m, c, seq, extra, secs, r, same in side_by_side(todo, time_limit, jobs, repeat):
        for j in jobs:
            totals[j] += secs[j]
        ratios.append(secs[jobs[0]] / secs[jobs[-1]])
        agree &= same
        cell = " / ".join(f"{secs[j]:.1f}" for j in jobs) + f" ({ratios[-1]:.2f}x)" + ("" if same else " DIFFER")
        print(_row(m, c, seq, extra, cell, r), flush=True)
    print(f"side by side ({repeat} run(s) of each, alternating, each in a fresh process): "
          + ", ".join(f"jobs {j} {totals[j]:.1f} s in all" for j in jobs)
          + f"; jobs {jobs[0]} / jobs {jobs[-1]} {min(ratios):.2f}x-{max(ratios):.2f}x per scenario"
          + f"; plans and counts {'identical in every row' if agree else 'DIFFER in some row'}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20:.2f} GiB (the largest process)")


if __name__ == "__main__":
    main()
