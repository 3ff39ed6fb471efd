"""Fitting link bandwidths and latencies to nccl-tests output.

Per table, the link level it exercises (one node, or the nodes of one scale-up domain: scale-up
of its node group; more nodes of one group: that group's scale-out; two groups: their
interconnect); the table is checked against the node counts given (hosts, ranks, busbw / algbw). Per large message (>= LARGE_MESSAGE_BYTES)
the attained bandwidth at which the model's time for that collective equals the measured one
(1-D root finding); a table's value is the median, a level's the geometric mean of its tables
(least squares in log space). Latency likewise from the small messages, where the bandwidth
term is under a tenth of the measured time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

from ..errors import SpecError
from ..specs.calibration import (MAX_BUS_OVER_LINE_RATE, MAX_LATENCY_S, Calibration, Key, Source, Value,
                                 apply_calibration, current_value, line_rate)
from .fit_model import (LEVEL_ORDER, MIN_BUS_OVER_LINE_RATE, busbw_factor, cluster_with,
                        solve_bandwidth)
from .nccl_tests import COLLECTIVES, UNSUPPORTED, NcclFile, Table, collective_of, parse_nccl
from .robust import geometric_mean

# Large messages: Megatron's gradient buckets (>= 40M parameters, 80-160 MB) and TP activations of
# large models are at least this size; NCCL's bus bandwidth is near its plateau from here.
LARGE_MESSAGE_BYTES = 64 * 2**20
# Small messages: the model's bandwidth term is under this share of the measured time.
LATENCY_REGIME_BANDWIDTH_SHARE = 0.1
# Printed busbw / algbw must match the collective's factor for the given rank count (nccl-tests
# prints both with 2 decimals: 2% covers the rounding of rows above 1 GB/s).
BUSBW_FACTOR_TOLERANCE = 0.02
# Alternations of the bandwidth and latency fits of one level (each moves the other's rows by
# little: two settle them to print precision; one more to be sure).
NCCL_ALTERNATIONS = 3


@dataclass(frozen=True)
class NcclInput:
    """One nccl-tests output file: on how many nodes (and GPUs per node, node groups) it ran."""
    path: str
    nodes: int
    gpus_per_node: int | None = None
    groups: tuple[str, ...] | None = None


@dataclass
class NcclCase:
    """One table of an nccl-tests file, the link level it measures, and what was fitted to it."""
    inp: NcclInput
    file: NcclFile
    table: Table
    collective: str
    kind: str
    groups: tuple[str, ...]
    nodes: int
    gpus_per_node: int
    bw_key: Key
    lat_key: Key
    large: list            # rows used for the bandwidth
    measured_busbw: float = 0.0
    profile_busbw: float = 0.0
    calibrated_busbw: float = 0.0
    fitted_bw: float | None = None
    bw_rows: list = field(default_factory=list)
    fitted_latency: float | None = None
    latency_rows: list = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def level(self) -> str:
        if self.bw_key.scope == "interconnect":
            return f"interconnect {self.bw_key.target.replace(',', '-')}"
        return ("scale-up " if self.bw_key.field.startswith("scale_up") else "scale-out ") + self.bw_key.target


def model_time(cluster, case: NcclCase, size: float) -> float:
    """Seconds the planner's communication model gives for this nccl-tests collective: the
    one place that calls into planner/cost/comm.py."""
    from ..cost.comm import collective_time, group_link, p2p_link
    gs = [cluster.group(n) for n in case.groups]
    if case.kind == "send-recv":
        # sendrecv_perf: every rank sends to the next; the pair that crosses nodes sets the time
        in_domain = len(gs) == 1 and case.nodes <= gs[0].nodes_per_domain
        return collective_time("send-recv", size, 2, p2p_link(gs[0], gs[-1], in_domain, cluster))
    G = min(g.gpus_per_node for g in gs)
    link = group_link(gs, case.ranks, G // case.gpus_per_node, cluster)
    return collective_time(case.kind, size, case.ranks, link)


def nccl_cases(inp: NcclInput, base) -> list[NcclCase]:
    """The tables of one nccl-tests file, each checked against the cluster and the node counts
    given, with the link level it exercises."""
    f = parse_nccl(inp.path)
    names = [g.name for g in base.node_groups]
    if inp.groups:
        for g in inp.groups:
            if g not in names:
                from ..yamlio import suggest
                raise SpecError("--nccl-group", None, f"{inp.path}: unknown node group {g!r}{suggest(g, names)}")
        groups = tuple(inp.groups)
    elif len(names) == 1:
        groups = (names[0],)
    else:
        raise SpecError("--nccl-group", None, f"{inp.path}: the cluster has node groups {', '.join(names)}: "
                        "say which one the test ran on (two, comma-separated, for a test across them)")
    if len(groups) > 2 or (len(groups) == 2 and groups[0] == groups[1]):
        raise SpecError("--nccl-group", None, f"{inp.path}: expected one node group, or two different ones")
    gs = [base.group(g) for g in groups]
    if len(groups) == 2 and base.interconnect(*groups) is None:
        raise SpecError("--nccl-group", None, f"{inp.path}: the cluster has no interconnect between "
                        f"{groups[0]} and {groups[1]} to calibrate")
    if len(groups) == 2 and inp.nodes < 2:
        raise SpecError("--nccl-nodes", None, f"{inp.path}: a test across two node groups runs on >= 2 nodes")
    avail = sum(g.nodes for g in gs)
    if inp.nodes > avail:
        raise SpecError("--nccl-nodes", None, f"{inp.path}: found {inp.nodes}, node group(s) "
                        f"{', '.join(groups)} have {avail} nodes")
    cases = []
    for t in f.tables:
        coll = collective_of(t, inp.path)
        if coll in UNSUPPORTED:
            raise SpecError(inp.path, f"line {t.first_line}", f"{coll}_perf: not a collective the planner's "
                            f"model uses; expected one of {', '.join(c + '_perf' for c in COLLECTIVES)}")
        kind = COLLECTIVES[coll]
        if t.time_kind == "cputime":
            raise SpecError(inp.path, f"line {t.first_line}", "the table reports CPU time (-C 1), not the "
                            "collective's time: rerun without -C")
        for r in t.rows:
            for name, h in r.halves:
                if h.wrong:
                    raise SpecError(inp.path, f"line {r.line}", f"#wrong = {h.wrong} ({name}, {r.size} bytes): "
                                    "the collective returned wrong data; fix the fabric before calibrating from it")
        if t.out_of_bounds and t.out_of_bounds[0] > 0:
            raise SpecError(inp.path, f"line {t.out_of_bounds[1]}", f"Out of bounds values : {t.out_of_bounds[0]} "
                            "FAILED: the collective returned wrong data")
        G = min(g.gpus_per_node for g in gs)
        truncated = any("..." in d for _, _, d in t.ranks)
        per_host = None
        if t.ranks and not truncated:
            counts = [sum(1 for _, h, _ in t.ranks if h == host) for host in t.hosts]
            per_host = max(counts)
            if len(t.hosts) != inp.nodes:
                raise SpecError(inp.path, f"line {t.first_line}", f"the device report lists {len(t.hosts)} "
                                f"host(s) ({', '.join(t.hosts[:4])}{', ...' if len(t.hosts) > 4 else ''}), "
                                f"--nccl-nodes says {inp.nodes}")
        if per_host and inp.gpus_per_node and per_host != inp.gpus_per_node:
            raise SpecError(inp.path, f"line {t.first_line}", f"the device report has {per_host} ranks per host, "
                            f"--nccl-gpus-per-node says {inp.gpus_per_node}")
        g_per_node = inp.gpus_per_node or per_host or G
        if t.ranks and not truncated and len(t.ranks) != inp.nodes * g_per_node:
            raise SpecError(inp.path, f"line {t.first_line}", f"the device report lists {len(t.ranks)} ranks, "
                            f"--nccl-nodes {inp.nodes} x {g_per_node} GPUs per node = {inp.nodes * g_per_node}")
        if g_per_node > G or G % g_per_node:
            raise SpecError("--nccl-gpus-per-node", None, f"{inp.path}: found {g_per_node}, expected a divisor "
                            f"of the node group's {G} GPUs per node")
        # within one scale-up domain (a node, or the trays of one NVL72 rack: torchrun's
        # consecutive nodes) a collective runs on NVLink: it measures the scale-up level
        if len(groups) == 1 and inp.nodes <= gs[0].nodes_per_domain:
            bw_key, lat_key = (Key("node_groups", groups[0], "scale_up_bus_bandwidth"),
                               Key("node_groups", groups[0], "scale_up_latency"))
        elif len(groups) == 1:
            bw_key, lat_key = (Key("node_groups", groups[0], "scale_out_bus_bandwidth"),
                               Key("node_groups", groups[0], "nic_latency"))
        else:
            ic = base.interconnect(*groups)
            bw_key, lat_key = (Key("interconnect", f"{ic.a},{ic.b}", "bus_bandwidth"),
                               Key("interconnect", f"{ic.a},{ic.b}", "latency"))
        n = inp.nodes * g_per_node
        if n < 2:
            raise SpecError(inp.path, f"line {t.first_line}", "a collective over 1 rank measures no link")
        top = max(r.size for r in t.rows)
        large = [r for r in t.rows if r.size >= min(LARGE_MESSAGE_BYTES, top)]
        if kind != "send-recv":
            ratios = [h.busbw / h.algbw for r in large for _, h in r.halves if h.algbw >= 1e9]
            want = busbw_factor(kind, n)
            if ratios and abs(median(ratios) / want - 1) > BUSBW_FACTOR_TOLERANCE:
                q = median(ratios)
                implied = 2 / (2 - q) if kind == "all-reduce" and q < 2 else (1 / (1 - q) if q < 1 else float("inf"))
                raise SpecError(inp.path, f"line {large[0].line}", f"busbw / algbw = {q:.3f}, {coll}'s factor for "
                                f"{implied:.0f} ranks; --nccl-nodes {inp.nodes} x {g_per_node} GPUs per node "
                                f"= {n} ranks would give {want:.3f}")
        cases.append(NcclCase(inp=inp, file=f, table=t, collective=coll, kind=kind, groups=groups,
                              nodes=inp.nodes, gpus_per_node=g_per_node, bw_key=bw_key, lat_key=lat_key,
                              large=large))
    return cases


def fit_nccl(cases: list[NcclCase], base, values: dict, sources: dict, reasons: dict, warnings: list) -> None:
    """Bandwidth and latency per level, scale-up before scale-out before interconnects (a
    scale-out ring is capped by the scale-up link in the model). Bandwidth from the large
    messages whose latency term is small, latency from the small messages whose bandwidth term
    is small, alternated until both settle (each fit sees the other's current value)."""
    before = cluster_with(base, values)
    for c in cases:
        c.measured_busbw = median([h.busbw for r in c.large for _, h in r.halves])
        c.profile_busbw = model_busbw(before, c)
        top = max(r.size for r in c.table.rows)
        if top < LARGE_MESSAGE_BYTES:
            warnings.append(f"{c.inp.path}: largest message {top / 2**20:.3g} MiB, below {LARGE_MESSAGE_BYTES // 2**20} "
                            "MiB: its bus bandwidth may be short of the plateau (run nccl-tests with -e 1G or more)")
    for level in sorted({c.bw_key for c in cases}, key=lambda k: (LEVEL_ORDER[k.field], k.target)):
        mine = [c for c in cases if c.bw_key == level]
        lat_key = mine[0].lat_key
        lat = values.get(lat_key, Value(current_value(base, lat_key))).value
        used = []
        for _ in range(NCCL_ALTERNATIONS):
            used = [c for c in mine if _fit_case_bandwidth(c, base, {**values, lat_key: Value(lat)}, level)]
            if not used:
                break
            values[level] = Value(geometric_mean([c.fitted_bw for c in used]))   # least squares in log space
            alphas = [a for a in (_fit_case_latency(c, base, values, lat_key) for c in used) if a is not None]
            if not alphas:
                break
            lat = median(alphas)
        if not used:
            reasons.setdefault(level, f"the model's time for {mine[0].collective}_perf on {mine[0].level} does not "
                                      "depend on it")
            continue
        sources[level] = [Source(file=c.inp.path, lines=f"{c.bw_rows[0].line}-{c.bw_rows[-1].line}",
                                 date=f"{c.file.modified} (file modified)", sha256=c.file.sha256,
                                 what=f"{c.collective}_perf on {c.nodes} node(s) x {c.gpus_per_node} GPUs: median "
                                      f"over {sum(len(r.halves) for r in c.bw_rows)} results of "
                                      f"{c.bw_rows[0].size / 2**20:g}-{c.bw_rows[-1].size / 2**20:g} MiB")
                          for c in used]
        with_lat = [c for c in used if c.fitted_latency is not None]
        if not with_lat:
            reasons.setdefault(lat_key, "no message small enough for latency to dominate")
        elif 0 < lat <= MAX_LATENCY_S:
            values[lat_key] = Value(lat)
            sources[lat_key] = [Source(file=c.inp.path, lines=f"{c.latency_rows[0].line}-{c.latency_rows[-1].line}",
                                       date=f"{c.file.modified} (file modified)", sha256=c.file.sha256,
                                       what=f"{c.collective}_perf: median over {len(c.latency_rows)} results whose "
                                            f"bandwidth term is under {LATENCY_REGIME_BANDWIDTH_SHARE:.0%} of the time")
                                for c in with_lat]
        else:
            reasons.setdefault(lat_key, f"the small messages give {lat * 1e6:.3g} us, outside (0, "
                                        f"{MAX_LATENCY_S * 1e6:g} us] for the model's per-step latency")



def _fit_case_bandwidth(c: NcclCase, base, values: dict, level: Key) -> bool:
    """c.fitted_bw from the large messages whose latency term is under a tenth of the measured
    time (or the largest message, if none); False when the model's time does not depend on it.
    A message the model cannot match at the current latency is left out of this round; none
    matched at all is an error."""
    lat_key = c.lat_key
    zero = cluster_with(base, {**values, lat_key: Value(0.0)})
    here = cluster_with(base, values)
    rows = [r for r in c.large if all(model_time(here, c, r.size) - model_time(zero, c, r.size)
                                      <= LATENCY_REGIME_BANDWIDTH_SHARE * h.time_s for _, h in r.halves)]
    rows = rows or [max(c.large, key=lambda r: r.size)]
    sols, used, misses = [], [], []
    for r in rows:
        for _, h in r.halves:
            bw, why = solve_bandwidth(base, values, level, lambda cl, r=r: model_time(cl, c, r.size), h.time_s)
            if why == "ok":
                sols.append(bw)
                if r not in used:
                    used.append(r)
            elif why != "flat":
                misses.append((r, h, bw, why))
    if not sols and misses:
        r, h, t_edge, why = misses[-1]
        lr = line_rate(base, level)
        if why == "fast":
            raise SpecError(c.inp.path, f"line {r.line}", f"{r.size} bytes in {h.time_s * 1e6:.4g} us is faster than "
                            f"the planner's model gets ({t_edge * 1e6:.4g} us) with {level} at "
                            f"{MAX_BUS_OVER_LINE_RATE:g}x its line rate ({MAX_BUS_OVER_LINE_RATE * lr / 1e9:.4g} GB/s): "
                            "check --nccl-nodes / --nccl-gpus-per-node and the cluster's links; a ring across nodes "
                            "is also capped by the scale-up level (calibrate it with a 1-node nccl-tests)")
        raise SpecError(c.inp.path, f"line {r.line}", f"{r.size} bytes in {h.time_s * 1e6:.4g} us is slower than "
                        f"{level} at {MIN_BUS_OVER_LINE_RATE:g}x its line rate allows: a broken fabric, not a calibration")
    if not sols:
        return False
    c.fitted_bw, c.bw_rows = median(sols), used
    return True


def _fit_case_latency(c: NcclCase, base, values: dict, lat_key: Key) -> float | None:
    """The per-step latency from the results whose bandwidth term is under a tenth of their
    time: the model is affine in it, so two evaluations give each result's value."""
    zero = cluster_with(base, {**values, lat_key: Value(0.0)})
    unit = cluster_with(base, {**values, lat_key: Value(1e-6)})
    a_i, rows = [], []
    for r in c.table.rows:
        t0, t1 = model_time(zero, c, r.size), model_time(unit, c, r.size)
        for _, h in r.halves:
            if t1 > t0 and t0 <= LATENCY_REGIME_BANDWIDTH_SHARE * h.time_s:
                a_i.append((h.time_s - t0) / ((t1 - t0) / 1e-6))
                if r not in rows:
                    rows.append(r)
    if not a_i:
        c.fitted_latency, c.latency_rows = None, []
        return None
    c.fitted_latency, c.latency_rows = median(a_i), rows
    return c.fitted_latency


def model_busbw(cluster, c: NcclCase) -> float:
    """The bus bandwidth the model gives this test at its large messages, latency aside (its
    attained link bandwidth, in nccl-tests' busbw terms)."""
    zero = apply_calibration(cluster, Calibration(values=((c.lat_key, Value(0.0)),)))
    f = busbw_factor(c.kind, c.ranks)
    return median([r.size / model_time(zero, c, r.size) * f for r in c.large])
