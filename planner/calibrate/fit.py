"""Fit a cluster's calibration parameters (planner/specs/calibration.py) to its own measurements.

The cost model is a black box here: every parameter is fitted by re-running the planner's own
model on the cluster with that parameter changed, through the same apply_calibration the
loader uses, so the fit stays right when the model changes.

- nccl-tests: per table, the link level it exercises (one node: scale-up of its node group;
  N nodes of one group: that group's scale-out; two groups: their interconnect). Per large
  message (>= LARGE_MESSAGE_BYTES) the attained bandwidth at which the model's time for that
  collective equals the measured one (1-D root finding); a table's value is the median, a level's
  the geometric mean of its tables (least squares in log space). Latency likewise from the
  small messages, where the bandwidth term is under a tenth of the measured time.
- Megatron logs: per log the steady-state iteration time (steady.py); the parameters are those
  the logs determine: least squares in log space of predicted / measured iteration time, each
  log weighted by its uncertainty (its median's standard error and the model's own error), a
  parameter kept only while its standard error stays under MAX_REL_STDERR. Compute scales (per
  GPU kind) come first, then link bandwidths that no nccl-tests measured.
- Memory: the report_memory lines give the allocator's overhead (reserved vs allocated) and the
  gap between the measured max allocated and the planner's predicted peak, per GPU kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import median

import numpy as np

from ..errors import SpecError
from ..specs.calibration import (MAX_BUS_OVER_LINE_RATE, MAX_LATENCY_S, Calibration, Key, Source, Value,
                                 all_keys, apply_calibration, base_gpu_name, bounds, current_value, format_value,
                                 line_rate, memory_overheads, parse_value)
from ..cost.memory import fixed_overhead_bytes
from .megatron_log import MegatronLog, parse_log
from .nccl_tests import COLLECTIVES, UNSUPPORTED, NcclFile, Table, collective_of, parse_nccl
from .robust import geometric_mean
from .steady import SteadyState, steady_state

# The planner's own iteration-time error on published dense runs (docs/accuracy.md: 2-4% MAPE, rows
# up to 7.7%): two logs whose residuals differ by less than this cannot tell one parameter from model error.
MODEL_TIME_ERROR = 0.05
# A parameter the logs pin to within 20% (one standard error, relative) is determined; beyond
# that it stays at its profile value (planner assumption).
MAX_REL_STDERR = 0.20
# Relative step of the numerical derivatives (d ln t / d ln parameter).
JACOBIAN_STEP = 0.01
# Large messages: Megatron's gradient buckets (>= 40M parameters, 80-160 MB) and TP activations of
# large models are at least this size; NCCL's bus bandwidth is near its plateau from here.
LARGE_MESSAGE_BYTES = 64 * 2**20
# Small messages: the model's bandwidth term is under this share of the measured time.
LATENCY_REGIME_BANDWIDTH_SHARE = 0.1
# Lower end of the bandwidth search, as a fraction of the line rate: slower is a broken fabric.
MIN_BUS_OVER_LINE_RATE = 1e-4
# Printed busbw / algbw must match the collective's factor for the given rank count (nccl-tests
# prints both with 2 decimals: 2% covers the rounding of rows above 1 GB/s).
BUSBW_FACTOR_TOLERANCE = 0.02
# The log's throughput x time x world size must agree with the planner's FLOPs count of the
# launch to within this factor: Megatron's count differs by version (causal attention halved
# since 2025, SwiGLU counted as two matrices in 2024) by up to ~25%; a world size or a model off
# by 2x lands outside (the geometric midpoint of 1 and 2).
FLOPS_AGREEMENT = math.sqrt(2)
# A log residual beyond this after the fit, with a parameter at a physical bound, means the log
# cannot be this launch on this cluster.
MAX_RESIDUAL_AT_BOUND = 0.03


@dataclass(frozen=True)
class LogInput:
    log: str
    launch: str


@dataclass(frozen=True)
class NcclInput:
    path: str
    nodes: int
    gpus_per_node: int | None = None
    groups: tuple[str, ...] | None = None


@dataclass
class LogCase:
    inp: LogInput
    log: MegatronLog
    model: object
    strategy: object
    steady: SteadyState
    ignored_flags: tuple
    before_s: float = 0.0
    after_s: float = 0.0
    sigma: float = MODEL_TIME_ERROR
    memory: list = field(default_factory=list)
    fits_before: bool | None = None
    fits_after: bool | None = None


@dataclass
class NcclCase:
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


@dataclass
class Result:
    calibration: Calibration
    before: object            # ClusterSpec as given (its old calibration, if any, applied)
    after: object             # ClusterSpec with the new calibration
    logs: list
    nccl: list
    warnings: list


def _cluster(base, values: dict):
    return apply_calibration(base, Calibration(values=tuple(values.items())))


# ---------------------------------------------------------------- the model's view of a test

def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests' bus bandwidth / algorithm bandwidth (doc/PERFORMANCE.md)."""
    if kind == "all-reduce":
        return 2 * (n - 1) / n
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n
    return 1.0


def model_time(cluster, case: NcclCase, size: float) -> float:
    """Seconds the planner's communication model gives for this nccl-tests collective: the
    one place that calls into planner/cost/comm.py."""
    from ..cost.comm import collective_time, group_link, p2p_link
    gs = [cluster.group(n) for n in case.groups]
    if case.kind == "send-recv":
        # sendrecv_perf: every rank sends to the next; the pair that crosses nodes sets the time
        return collective_time("send-recv", size, 2, p2p_link(gs[0], gs[-1], case.nodes == 1, cluster))
    G = min(g.gpus_per_node for g in gs)
    link = group_link(gs, case.ranks, G // case.gpus_per_node, cluster)
    return collective_time(case.kind, size, case.ranks, link)


def _solve_bandwidth(base, values: dict, key: Key, fn, t_meas: float) -> tuple[float | None, str]:
    """(the attained bandwidth at which fn(cluster) = t_meas, "ok"), or (None, why): "flat" when
    fn does not depend on it, "fast" / "slow" when t_meas is out of reach within its bounds
    (fn falls as bandwidth rises)."""
    lr = line_rate(base, key)
    lo, hi = MIN_BUS_OVER_LINE_RATE * lr, MAX_BUS_OVER_LINE_RATE * lr

    def t(bw):
        return fn(_cluster(base, {**values, key: Value(bw)}))

    t_lo, t_hi = t(lo), t(hi)
    if not t_lo > t_hi * (1 + 1e-9):
        return None, "flat"
    if t_meas < t_hi:
        return t_hi, "fast"
    if t_meas > t_lo:
        return t_lo, "slow"
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):
        mid = 0.5 * (a + b)
        if t(math.exp(mid)) > t_meas:
            a = mid
        else:
            b = mid
    return math.exp(0.5 * (a + b)), "ok"


# ---------------------------------------------------------------- nccl-tests

def _nccl_cases(inp: NcclInput, base) -> list[NcclCase]:
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
        if inp.nodes == 1 and len(groups) == 1:
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


_LEVEL_ORDER = {"scale_up_bus_bandwidth": 0, "scale_out_bus_bandwidth": 1, "bus_bandwidth": 2}


def _fit_nccl(cases: list[NcclCase], base, values: dict, sources: dict, reasons: dict, warnings: list) -> None:
    """Bandwidth and latency per level, scale-up before scale-out before interconnects (a
    scale-out ring is capped by the scale-up link in the model). Bandwidth from the large
    messages whose latency term is small, latency from the small messages whose bandwidth term
    is small, alternated until both settle (each fit sees the other's current value)."""
    before = _cluster(base, values)
    for c in cases:
        c.measured_busbw = median([h.busbw for r in c.large for _, h in r.halves])
        c.profile_busbw = _model_busbw(before, c)
        top = max(r.size for r in c.table.rows)
        if top < LARGE_MESSAGE_BYTES:
            warnings.append(f"{c.inp.path}: largest message {top / 2**20:.3g} MiB, below {LARGE_MESSAGE_BYTES // 2**20} "
                            "MiB: its bus bandwidth may be short of the plateau (run nccl-tests with -e 1G or more)")
    for level in sorted({c.bw_key for c in cases}, key=lambda k: (_LEVEL_ORDER[k.field], k.target)):
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


# Alternations of the bandwidth and latency fits of one level (each moves the other's rows by
# little: two settle them to print precision; one more to be sure).
NCCL_ALTERNATIONS = 3


def _fit_case_bandwidth(c: NcclCase, base, values: dict, level: Key) -> bool:
    """c.fitted_bw from the large messages whose latency term is under a tenth of the measured
    time (or the largest message, if none); False when the model's time does not depend on it.
    A message the model cannot match at the current latency is left out of this round; none
    matched at all is an error."""
    lat_key = c.lat_key
    zero = _cluster(base, {**values, lat_key: Value(0.0)})
    here = _cluster(base, values)
    rows = [r for r in c.large if all(model_time(here, c, r.size) - model_time(zero, c, r.size)
                                      <= LATENCY_REGIME_BANDWIDTH_SHARE * h.time_s for _, h in r.halves)]
    rows = rows or [max(c.large, key=lambda r: r.size)]
    sols, used, misses = [], [], []
    for r in rows:
        for _, h in r.halves:
            bw, why = _solve_bandwidth(base, values, level, lambda cl, r=r: model_time(cl, c, r.size), h.time_s)
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
    zero = _cluster(base, {**values, lat_key: Value(0.0)})
    unit = _cluster(base, {**values, lat_key: Value(1e-6)})
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


def _model_busbw(cluster, c: NcclCase) -> float:
    """The bus bandwidth the model gives this test at its large messages, latency aside (its
    attained link bandwidth, in nccl-tests' busbw terms)."""
    zero = apply_calibration(cluster, Calibration(values=((c.lat_key, Value(0.0)),)))
    f = busbw_factor(c.kind, c.ranks)
    return median([r.size / model_time(zero, c, r.size) * f for r in c.large])


# ---------------------------------------------------------------- Megatron logs

def _check_log(case_log: MegatronLog, launch_path: str, model, s, iters) -> None:
    """Refuse a log that is not of this launch: world size and degrees (start-up line), model and
    batch (arguments dump, iteration lines), and the FLOPs its throughput implies."""
    from ..cost.compute import model_flops_per_step
    path = case_log.path
    deg = f"tp {s.tp} x pp {s.pp} x dp {s.dp} x cp {s.cp}"
    want = {"world_size": s.world_size, "data_parallel_size": s.dp, "context_parallel_size": s.cp,
            "tensor_model_parallel_size": s.tp, "pipeline_model_parallel_size": s.pp,
            "expert_model_parallel_size": s.ep, "num_layers": model.num_layers, "hidden_size": model.hidden_size,
            "num_attention_heads": model.num_attention_heads, "ffn_hidden_size": model.ffn_hidden_size,
            "seq_length": s.seq_length, "micro_batch_size": s.micro_batch_size,
            "global_batch_size": s.global_batch_size, "num_experts": model.num_experts}
    for run in case_log.runs:
        for k, (v, line) in run.world.items():
            if v != want[k]:
                what = "world size" if k == "world_size" else k.replace("_", " ")
                hint = "; without torchrun sizes a launch takes the whole cluster" if k == "world_size" else ""
                raise SpecError(path, f"line {line}", f"the log's {what} is {v}, launch {launch_path} has "
                                f"{want[k]} ({s.world_size} GPUs: {deg}{hint}): not the log of this launch")
        for k, (text, line) in run.args.items():
            if k in want and want[k] is not None and text.strip().isdigit() and int(text) != want[k]:
                raise SpecError(path, f"line {line}", f"the log's {k} is {text.strip()}, launch {launch_path} has "
                                f"{want[k]}: not the log of this launch")
    sizes = {it.global_batch_size for it in iters if it.global_batch_size is not None}
    if sizes and s.global_batch_size not in sizes:
        raise SpecError(path, f"line {iters[0].line}", f"global batch size {', '.join(map(str, sorted(sizes)))} in "
                        f"the log, {s.global_batch_size} in launch {launch_path}: not the log of this launch")
    rated = [it for it in iters[1:] if it.tflops_per_gpu and it.global_batch_size == s.global_batch_size]
    if rated:
        implied = median([it.tflops_per_gpu * 1e12 * it.elapsed_s * s.world_size for it in rated])
        full = model_flops_per_step(model, s)
        # the attention term a S^2 from two evaluations (F = l S + a S^2): Megatron halves it for
        # the causal mask since 2025
        half = model_flops_per_step(model, replace(s, seq_length=max(1, s.seq_length // 2)))
        attn = max(0.0, 2 * (full - 2 * half)) if s.seq_length % 2 == 0 else 0.0
        lo, hi = (full - attn / 2) / FLOPS_AGREEMENT, full * FLOPS_AGREEMENT
        if not lo <= implied <= hi:
            raise SpecError(path, f"line {rated[0].line}", f"throughput per GPU x time x {s.world_size} GPUs = "
                            f"{implied / 1e15:.4g} PFLOP per iteration, launch {launch_path} is "
                            f"{full / 1e15:.4g} PFLOP ({model.name}, {deg}): another world size or model")


def _load_launch(path: str, cluster):
    """(model, strategy, the flags the launch gives, as written) of a Megatron launch file or a
    plan JSON: anything `planner check` reads."""
    from ..megatron.check import is_plan_json, load_launch, load_plan_or_launch
    if is_plan_json(path):
        model, s = load_plan_or_launch(path, cluster, None)
        return model, s, ()
    ld = load_launch(path, cluster, None)
    return ld.model, ld.strategy, tuple(ld.launch.given.values())


def _log_case(inp: LogInput, before) -> LogCase:
    log = parse_log(inp.log)
    iters = log.iterations
    if not iters:
        raise SpecError(inp.log, None, "no Megatron iteration lines ('iteration N/ M | ... | elapsed time per "
                        "iteration (ms): ...'): not a training log, or training never logged")
    model, s, ignored = _load_launch(inp.launch, before)
    _check_log(log, inp.launch, model, s, iters)
    st = steady_state(log, s.global_batch_size)
    if st is None:
        raise SpecError(inp.log, None, f"no steady-state iteration line: {len(iters)} line(s), all warm-up, "
                        "skipped/nan or at another batch size")
    return LogCase(inp=inp, log=log, model=model, strategy=s, steady=st, ignored_flags=ignored,
                   sigma=math.hypot(st.relative_error, MODEL_TIME_ERROR))


def _step(case: LogCase, cluster) -> float:
    from ..estimate import estimate
    return estimate(case.model, cluster, case.strategy).step_time_s


def _residuals(cases, base, values) -> np.ndarray:
    cl = _cluster(base, values)
    return np.array([math.log(_step(c, cl) / c.steady.measured_s) / c.sigma for c in cases])


def _jacobian(cases, base, values, keys) -> np.ndarray:
    """d(weighted ln residual) / d ln parameter, central differences."""
    cols = []
    for k in keys:
        v = values[k].value
        up = _residuals(cases, base, {**values, k: Value(v * math.exp(JACOBIAN_STEP))})
        dn = _residuals(cases, base, {**values, k: Value(v * math.exp(-JACOBIAN_STEP))})
        cols.append((up - dn) / (2 * JACOBIAN_STEP))
    return np.array(cols).T if cols else np.zeros((len(cases), 0))


def _stderr(J: np.ndarray) -> np.ndarray | None:
    """Relative standard errors of the parameters (J is weighted); None if not identifiable."""
    H = J.T @ J
    if J.shape[1] == 0 or np.linalg.cond(H) > 1e10:
        return None
    return np.sqrt(np.diag(np.linalg.inv(H)))


def _fit_logs(cases: list[LogCase], base, values: dict, fixed: set, reasons: dict) -> list[Key]:
    """Choose the parameters the logs determine and fit them; returns the chosen keys."""
    cands = [k for k in all_keys(base) if k.field == "compute_time_scale"]
    links = [k for k in all_keys(base) if k.field in _LEVEL_ORDER and k not in fixed]
    full = {k: values.get(k, Value(current_value(base, k))) for k in cands + links}
    work = {**values, **full}
    J0 = _jacobian(cases, base, work, cands + links)
    sens = {k: float(np.max(np.abs(J0[:, i] * np.array([c.sigma for c in cases])))) for i, k in enumerate(cands + links)}
    order = sorted(cands, key=lambda k: -sens[k]) + sorted(links, key=lambda k: -sens[k])
    chosen: list[Key] = []
    for k in order:
        if sens[k] < 1e-6:
            reasons.setdefault(k, "no log ran on this GPU kind" if k in cands else "no logged launch uses this link")
            continue
        if len(chosen) + 1 > len(cases):
            reasons.setdefault(k, f"the logs determine {len(chosen)} parameter(s) at most ({len(cases)} log(s)); "
                                  f"this one moves their iteration time by {sens[k]:.2f}% per %")
            continue
        trial = chosen + [k]
        J = _jacobian(cases, base, work, trial)
        se = _stderr(J)
        if se is None or float(np.max(se)) > MAX_REL_STDERR:
            shown = "not separable from the others" if se is None else f"+-{float(se[-1]):.0%}"
            reasons.setdefault(k, f"the logs do not determine it ({shown}; needs <= {MAX_REL_STDERR:.0%})")
            continue
        chosen.append(k)
    if not chosen:
        return chosen
    # Levenberg-Marquardt in log space, within each parameter's physical bounds
    lo = np.array([math.log(max(bounds(base, k)[0], 1e-300)) for k in chosen])
    hi = np.array([math.log(bounds(base, k)[1]) for k in chosen])
    x = np.array([math.log(work[k].value) for k in chosen])

    def at(xv):
        return {**work, **{k: Value(math.exp(xi)) for k, xi in zip(chosen, xv)}}

    r = _residuals(cases, base, at(x))
    lam = 1e-3
    for _ in range(60):
        J = _jacobian(cases, base, at(x), chosen)
        H, g = J.T @ J, J.T @ r
        step = np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-12), -g)
        xn = np.clip(x + step, lo, hi)
        rn = _residuals(cases, base, at(xn))
        if rn @ rn < r @ r:
            x, r, lam = xn, rn, lam / 3
            if float(np.max(np.abs(step))) < 1e-7:
                break
        else:
            lam *= 4
            if lam > 1e8:
                break
        if float(r @ r) < 1e-14:
            break
    for i, k in enumerate(chosen):
        at_bound = x[i] <= lo[i] + 1e-6 or x[i] >= hi[i] - 1e-6
        worst = max(cases, key=lambda c: abs(math.log(_step(c, _cluster(base, at(x))) / c.steady.measured_s)))
        err = _step(worst, _cluster(base, at(x))) / worst.steady.measured_s - 1
        if at_bound and abs(err) > MAX_RESIDUAL_AT_BOUND:
            b = bounds(base, k)
            raise SpecError(worst.inp.log, None, f"measured {worst.steady.measured_s:.4g} s per iteration; the planner "
                            f"predicts {worst.before_s:.4g} s for {worst.inp.launch} and cannot reach it with {k} in its "
                            f"physical range ({b[0]:.3g}, {b[1]:.3g}]: is this the log of this launch on this cluster?")
        values[k] = Value(math.exp(x[i]))
    return chosen


# ---------------------------------------------------------------- memory

def _stage_of(rank: int, s, ignored: tuple) -> int:
    """Pipeline stage of a global rank: Megatron's default order 'tp-cp-ep-dp-pp' (PP outermost);
    with --use-tp-pp-dp-mapping the order is tp-pp-dp."""
    if "--use-tp-pp-dp-mapping" in ignored:
        return (rank // s.tp) % s.pp
    return rank // s.gpus_per_stage


def _memory(cases: list[LogCase], base, before, values: dict, sources: dict, reasons: dict) -> None:
    from ..estimate import estimate
    per_kind: dict = {}
    for c in cases:
        lines = c.log.memory
        if not lines:
            continue
        e = estimate(c.model, before, c.strategy)
        c.fits_before = e.fits
        latest: dict = {}
        for m in lines:   # max allocated / max reserved are peaks since start: the last report per rank
            key = m.rank if m.rank is not None else f"line {m.line}"
            if key not in latest or m.max_allocated >= latest[key].max_allocated:
                latest[key] = m
        for key, m in sorted(latest.items(), key=lambda kv: str(kv[0])):
            stage = _stage_of(m.rank, c.strategy, c.ignored_flags) if m.rank is not None else None
            if stage is not None and not 0 <= stage < c.strategy.pp:
                raise SpecError(c.inp.log, f"line {m.line}", f"[Rank {m.rank}] is outside launch {c.inp.launch}'s "
                                f"{c.strategy.world_size} ranks: not the log of this launch")
            pred = e.memory[stage] if stage is not None else None
            kinds = ({base_gpu_name(before.group(g).gpu) for g in pred.node_group.split("+")} if pred else
                     {base_gpu_name(g.gpu) for g in before.node_groups} if len(before.node_groups) == 1 else set())
            row = {"line": m.line, "rank": m.rank, "stage": stage, "max_allocated_bytes": m.max_allocated,
                   "max_reserved_bytes": m.max_reserved, "predicted_bytes": pred.total if pred else None,
                   "gap_bytes": m.max_allocated - pred.total if pred else None,
                   "outside_pytorch_bytes": m.device_used - m.reserved if m.device_used is not None else None}
            c.memory.append(row)
            if len(kinds) != 1:
                continue
            d = per_kind.setdefault(kinds.pop(), {"frag": [], "gap": [], "outside": [], "src": {}})
            if m.max_allocated > 0:
                d["frag"].append((m.max_reserved - m.max_allocated) / m.max_allocated)
            if row["gap_bytes"] is not None:
                d["gap"].append(row["gap_bytes"])
            if row["outside_pytorch_bytes"] is not None:
                # memory outside the allocator less what the model charges per communicator and
                # workspace for this launch: the rest is the GPU's fixed context
                gpu = before.group(pred.node_group.split("+")[0]).gpu if pred else before.node_groups[0].gpu
                per_launch = fixed_overhead_bytes(c.model, c.strategy, gpu) - memory_overheads(gpu)[0]
                d["outside"].append(max(0.0, row["outside_pytorch_bytes"] - per_launch))
            d["src"].setdefault(c.inp.log, (c, []))[1].append(m.line)
    for kind, d in per_kind.items():
        fk, rk = Key("gpus", kind, "fragmentation_fraction"), Key("gpus", kind, "cuda_context")
        srcs = [Source(file=p, lines=f"{min(ls)}-{max(ls)}", date=_date(c), sha256=c.log.sha256,
                       what=f"{len(ls)} report_memory line(s), the last per rank")
                for p, (c, ls) in d["src"].items()]
        if d["frag"]:
            # the worst rank decides whether a plan fits: the largest share of the allocator's pool
            # that is not in tensors
            values[fk] = Value(min(max(d["frag"]), 0.5))
            sources[fk] = [replace(s, what=s.what + ": (max reserved - max allocated) / max allocated, worst rank")
                           for s in srcs]
        reserve0 = memory_overheads(next(g.gpu for g in base.node_groups if base_gpu_name(g.gpu) == kind))[0]
        outside = max(d["outside"]) if d["outside"] else None
        gap = max(d["gap"]) if d["gap"] else None
        if outside is None and (gap is None or gap <= 0):
            why = "no [Rank r] memory lines to compare with the predicted peak" if gap is None else (
                f"the predicted peak is above the measured max allocated on every stage (by >= {-gap / 2**30:.2f} GiB, "
                "not credited); the log does not show memory outside PyTorch (--log-device-memory-used)")
            reasons.setdefault(rk, why)
            continue
        base_part = outside if outside is not None else reserve0
        values[rk] = Value(base_part + max(0.0, gap or 0.0))
        parts = (f"outside PyTorch, less NCCL/workspaces, {base_part / 2**30:.2f} GiB (measured)" if outside is not None
                 else f"profile context {reserve0 / 2**30:.2f} GiB (memory outside PyTorch not in the log)")
        sources[rk] = [replace(s, what=s.what + f": {parts} + max allocated above the predicted peak "
                               f"{max(0.0, gap or 0.0) / 2**30:.2f} GiB") for s in srcs]


def _date(c: LogCase) -> str:
    return c.steady.dates or f"{c.log.modified} (file modified)"


# ---------------------------------------------------------------- all together

def calibrate(base, prior: Calibration | None, logs: list[LogInput], nccl: list[NcclInput], created: str) -> Result:
    """Fit what the inputs determine; every other parameter keeps its prior calibrated value (and
    source) or its profile value (with the reason)."""
    prior = prior or Calibration()
    values: dict = prior.as_dict()
    before = _cluster(base, values)
    sources: dict = {}
    reasons: dict = {}
    warnings: list = []
    fresh: set = set()
    ncases = [c for inp in nccl for c in _nccl_cases(inp, base)]
    lcases = [_log_case(inp, before) for inp in logs]
    for k in {c.bw_key for c in ncases} | {c.lat_key for c in ncases}:
        values.pop(k, None)
    _fit_nccl(ncases, base, values, sources, reasons, warnings)
    fresh.update(sources)
    fixed = set(fresh) | {k for k in values if k.field in _LEVEL_ORDER}
    for c in lcases:
        c.before_s = _step(c, before)
    _memory(lcases, base, before, values, sources, reasons)
    if lcases:
        chosen = _fit_logs(lcases, base, values, fixed, reasons)
        after_tmp = _cluster(base, values)
        for k in chosen:
            sens = [c for c in lcases if abs(_step(c, _cluster(base, {**values, k: Value(values[k].value * 1.01)}))
                                             / _step(c, after_tmp) - 1) > 1e-6]
            sources[k] = [Source(file=c.inp.log, lines=c.steady.lines, date=_date(c), sha256=c.log.sha256,
                                 what=f"median of {len(c.steady.used)} steady-state iteration lines "
                                      f"({len(c.steady.warmup)} warm-up, {len(c.steady.outliers)} outlier(s), "
                                      f"{len(c.steady.excluded)} excluded) of launch {c.inp.launch}")
                          for c in sens]
    final = {}
    for k, v in values.items():
        # to the precision the file is written with, so that the report, the JSON and the
        # written cluster agree exactly
        v = Value(parse_value(k.field, format_value(k.field, v.value), "calibration", str(k)), v.sources)
        final[k] = Value(v.value, tuple(sources[k])) if k in sources else v
    left = []
    for k in all_keys(base):
        if k in final:
            continue
        left.append((k, reasons.get(k) or _default_reason(k)))
    cal = Calibration(values=tuple((k, final[k]) for k in all_keys(base) if k in final),
                      left_at_profile=tuple(left), created=created)
    for c in lcases:
        if c.steady.slow_runs:
            shown = ", ".join(f"run {i + 1}: {c.steady.per_run_s[i]:.4g} s" for i in c.steady.slow_runs)
            warnings.append(f"{c.inp.log}: runs differ beyond their jitter ({shown}; all: {c.steady.measured_s:.4g} s); "
                            "the median of all is used")
        if c.fits_before is False:
            warnings.append(f"{c.inp.log}: the planner says launch {c.inp.launch} does not fit in memory, yet the log "
                            "shows it ran: its memory model over-predicts this launch")
    return Result(calibration=cal, before=before, after=None, logs=lcases, nccl=ncases, warnings=warnings)


def _default_reason(k: Key) -> str:
    if k.field == "compute_time_scale":
        return "no Megatron log"
    if k.field in ("cuda_context", "fragmentation_fraction"):
        return "no memory (MB) report lines in any log of this GPU kind"
    if k.field == "scale_up_bus_bandwidth":
        return "no single-node nccl-tests of this node group, and the logs do not determine it"
    if k.field == "scale_out_bus_bandwidth":
        return "no multi-node nccl-tests of this node group, and the logs do not determine it"
    if k.field == "bus_bandwidth":
        return "no nccl-tests across these node groups, and the logs do not determine it"
    return "no nccl-tests of this link with small messages"


def finish(result: Result, after) -> None:
    """Predictions on the calibrated cluster as the written file gives it."""
    from ..estimate import estimate
    result.after = after
    for c in result.logs:
        e = estimate(c.model, after, c.strategy)
        c.after_s = e.step_time_s
        if c.memory:
            c.fits_after = e.fits
            if not e.fits and c.fits_before is not False:
                worst = max(e.memory, key=lambda m: m.total - m.capacity)
                result.warnings.append(
                    f"{c.inp.log}: with the calibrated memory overheads the planner says {c.inp.launch} does not fit "
                    f"(stage {worst.stage}: {worst.total / 2**30:.1f} of {worst.capacity / 2**30:.1f} GiB), yet it ran: "
                    "the predicted peak errs by a different amount on each stage, which one reserve per GPU "
                    "kind cannot follow (it takes the largest)")
    for c in result.nccl:
        c.calibrated_busbw = _model_busbw(after, c)
