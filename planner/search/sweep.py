"""What-if sweeps: the best plan of one model on each of several clusters and node counts, one
search per option in a process pool (`planner sweep`)."""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace

from ..errors import PlannerError, SpecError
from ..specs.cluster import MAX_NODES_PER_GROUP, ClusterSpec
from ..specs.model import ModelSpec
from .objective import Figures, figures
from .planner import SearchOptions, search

# options one sweep may run (each is a full search)
MAX_OPTIONS = 256


@dataclass(frozen=True)
class SweepOption:
    """One what-if: a cluster with its node groups at the node counts swept."""
    cluster: ClusterSpec
    base: str                       # the cluster's name as loaded
    nodes: tuple                    # ((group, nodes), ...)

    @property
    def label(self) -> str:
        return " ".join(f"{g}={n}" for g, n in self.nodes)


@dataclass
class SweepOutcome:
    option: SweepOption
    plan: object | None             # the best plan's Estimate
    figures: Figures | None
    status: str                     # the search's status, or "no-plan"
    gap: float
    seconds: float
    candidates: int
    priced: int
    error: str | None = None        # why nothing fits or nothing could be searched


def parse_nodes(values: list[str] | None) -> tuple[tuple[int, ...] | None, dict[str, tuple[int, ...]]]:
    """--nodes values: '16,32,64' (every node group at each count, together) or
    'GROUP=8,16' (that group at each count; several groups: every combination). Returns
    (the counts for every group, {group: counts})."""
    every, named = None, {}
    for v in values or []:
        name, sep, counts = v.rpartition("=")
        try:
            ns = tuple(int(x) for x in counts.split(","))
            assert ns and all(1 <= n <= MAX_NODES_PER_GROUP for n in ns) and (name or not sep)
        except (ValueError, AssertionError):
            raise SpecError("--nodes", None, f"found {v!r}, expected node counts in [1, {MAX_NODES_PER_GROUP}] "
                            "such as 16,32,64 (every node group) or h100=8,16 (one group)") from None
        if not sep:
            if every is not None:
                raise SpecError("--nodes", None, f"found {v!r} after {','.join(map(str, every))}; give the counts "
                                "for every group once (GROUP=... for one group)")
            every = ns
        else:
            if name in named:
                raise SpecError("--nodes", name, "given twice")
            named[name] = ns
    return every, named


def sweep_options(clusters: list[ClusterSpec], every, named: dict) -> list[SweepOption]:
    """The options of a sweep: each cluster at each combination of node counts (a group not
    named and no counts for every group: as the cluster file has it)."""
    known = {g.name for c in clusters for g in c.node_groups}
    for name in named:
        if name not in known:
            from ..yamlio import suggest
            raise SpecError("--nodes", name, f"no cluster has a node group of that name{suggest(name, known)}; "
                            f"groups: {', '.join(sorted(known))}")
    out = []
    for c in clusters:
        axes = []
        for g in c.node_groups:
            axes.append(named.get(g.name, None) or (None if every is not None else (g.nodes,)))
        # the groups without their own counts move together through `every`
        for shared in (every or (None,)):
            for combo in itertools.product(*[a if a is not None else (shared,) for a in axes]):
                groups = tuple(replace(g, nodes=n) for g, n in zip(c.node_groups, combo))
                out.append(SweepOption(replace(c, node_groups=groups), c.name,
                                       tuple((g.name, n) for g, n in zip(c.node_groups, combo))))
    if len(out) > MAX_OPTIONS:
        raise SpecError("--nodes", None, f"{len(out)} options to search, expected at most {MAX_OPTIONS}")
    return out


def run_one(args) -> SweepOutcome:
    """One option's search (in a worker process)."""
    model, option, o, train_tokens, index = args
    try:
        r = search(model, option.cluster, o)
    except PlannerError as exc:
        return SweepOutcome(option, None, None, "error", 0.0, 0.0, 0, 0, str(exc))
    if not r.plans:
        why = "nothing priced fits in memory" if r.candidates else "no plan in the space"
        return SweepOutcome(option, None, None, "no-plan", r.optimality_gap, r.seconds, r.candidates, r.priced, why)
    e = r.plans[0]
    return SweepOutcome(option, e, figures(e, train_tokens, o.charge_idle), r.status, r.optimality_gap,
                        r.seconds, r.candidates, r.priced)


def default_jobs() -> int:
    """Every core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_sweep(model: ModelSpec, options: list[SweepOption], o: SearchOptions, train_tokens=None,
              jobs: int | None = None, on_done=None) -> list[SweepOutcome]:
    """The best plan of each option (o with top 1), in the options' order. Searches run in a
    pool of `jobs` processes (default: every core), each search serial (no pool inside a
    pool); with one process (jobs 1, or one option) they run here, each search with `jobs`
    processes (SearchOptions.jobs). `on_done(k, n)` after each."""
    want = jobs or default_jobs()
    jobs = min(want, len(options)) or 1
    o = replace(o, top=1, jobs=want if jobs == 1 else 1)
    work = [(model, opt, o, train_tokens, i) for i, opt in enumerate(options)]
    out: list = [None] * len(work)
    if jobs == 1:
        for i, w in enumerate(work):
            out[i] = run_one(w)
            if on_done:
                on_done(i + 1, len(work))
        return out
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_one, w): w[-1] for w in work}
        try:
            for k, f in enumerate(as_completed(futures), 1):
                out[futures[f]] = f.result()
                if on_done:
                    on_done(k, len(work))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return out
