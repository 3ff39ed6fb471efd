"""`planner plan`: enumerate degrees, micro-batch, recompute, ZeRO stage, virtual stages and the
placement of stages on node groups; prune by memory, then by a compute lower bound; price the
survivors with the full estimate; re-partition the layers of the best ones exactly (DP, or
ILP), and return the top K plans that fit."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import InvalidStrategy, PlannerError
from ..estimate import Estimate, _layer_time, _time_key, estimate
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy, check_structure
from ..cost import activations as act
from ..cost.memory import BYTES_PER_PARAM, in_flight_microbatches, stage_memory
from ..placement import placement_of
from .partition import PartitionProblem, partition_dp, partition_ilp

# The space searched. These bound it; the top plan is the optimum of this space under the cost
# model, not of every conceivable configuration.
MAX_PP = 128
MAX_CP = 32
MICRO_BATCHES = (1, 2, 4, 8)
VPP_CHOICES = (1, 2, 3, 4, 5, 6, 8)
# Context parallelism is only tried at long sequences: below CP_MIN_SEQ_LENGTH tokens no CP; below
# CP_FULL_RANGE_SEQ_LENGTH at most CP_SHORT_MAX. Under 8k tokens attention is a small share of a
# layer's FLOPs (s/6h in Narayanan's count) while CP adds a K/V ring exchange per layer.
CP_MIN_SEQ_LENGTH = 8192
CP_FULL_RANGE_SEQ_LENGTH = 16384
CP_SHORT_MAX = 2
# Plans use more than this fraction of the cluster's GPUs (a plan on fewer GPUs leaves the rest
# idle; heterogeneous clusters can still leave whole node groups idle through stage placement).
MIN_GPU_FRACTION = 0.5
REFINE_TOP = 12          # candidates whose stage split is re-optimised exactly
MAX_CANDIDATES = 200_000  # refuse a space larger than this (bounded time)


@dataclass(frozen=True)
class SearchOptions:
    global_batch_size: int
    seq_length: int
    top: int = 3
    fixed: tuple = ()                 # (("tp", 8), ...)
    precision: str = "bf16"
    recompute: tuple[str, ...] = ("none", "selective", "full")
    zero_stages: tuple[int, ...] = (0, 1)
    schedules: tuple[str, ...] = ("1f1b", "interleaved")
    solver: str = "dp"                # dp | ilp | ilp-highs
    allow_tp_across_nodes: bool = False
    time_limit_s: float = 60.0


@dataclass
class SearchResult:
    plans: list
    candidates: int = 0
    pruned_memory: int = 0
    pruned_bound: int = 0
    priced: int = 0
    seconds: float = 0.0
    solver: str = "dp"
    status: str = "optimal"
    optimality_gap: float = 0.0
    warnings: list = field(default_factory=list)
    closest: Estimate | None = None
    idle_groups: list = field(default_factory=list)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pow2_upto(n: int) -> list[int]:
    out, x = [], 1
    while x <= n:
        out.append(x)
        x *= 2
    return out


def stage_layouts(cluster: ClusterSpec, per_stage: int, pp: int):
    """Ways to put pp stages of `per_stage` GPUs on node groups: contiguous blocks of stages per
    group, in every order of the groups used (first stages hold the most activations)."""
    groups = cluster.node_groups
    caps = []
    for g in groups:
        ok = per_stage % g.gpus_per_node == 0 or g.gpus_per_node % per_stage == 0
        caps.append(g.num_gpus // per_stage if ok else 0)
    out = set()
    ranges = [range(0, min(c, pp) + 1) for c in caps]
    for counts in itertools.product(*ranges):
        if sum(counts) != pp:
            continue
        used = [i for i, c in enumerate(counts) if c]
        for order in itertools.permutations(used):
            seq = []
            for i in order:
                seq += [groups[i].name] * counts[i]
            out.add(tuple(seq))
    return sorted(out)


def enumerate_space(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions):
    fixed = dict(o.fixed)
    max_gpn = max(g.gpus_per_node for g in cluster.node_groups)
    N = cluster.num_gpus
    a, g = model.num_attention_heads, model.num_query_groups
    tps = [t for t in _pow2_upto(max_gpn if not o.allow_tp_across_nodes else 64)
           if a % t == 0 and (g % t == 0 or t % g == 0)]
    cps = [c for c in _pow2_upto(MAX_CP) if o.seq_length % (2 * c) == 0 or c == 1]
    if o.seq_length < CP_MIN_SEQ_LENGTH:
        cps = [1]
    elif o.seq_length < CP_FULL_RANGE_SEQ_LENGTH:
        cps = [c for c in cps if c <= CP_SHORT_MAX]
    eps = [1]
    if model.is_moe:
        eps = [e for e in _pow2_upto(min(model.num_experts, 256)) if model.num_experts % e == 0]
    pps = list(range(1, min(model.num_layers, MAX_PP) + 1))
    for key, vals in (("tp", tps), ("cp", cps), ("ep", eps), ("pp", pps)):
        if key in fixed:
            vals[:] = [fixed[key]]
    for tp in tps:
        for cp in cps:
            for pp in pps:
                base = tp * cp * pp
                if base > N:
                    break
                dps = [d for d in _divisors(o.global_batch_size) if base * d <= N and base * d > MIN_GPU_FRACTION * N]
                if "dp" in fixed:
                    dps = [fixed["dp"]]
                for dp in dps:
                    per = tp * cp * dp
                    for ep in eps:
                        for etp in ([1] if model.is_moe else [None]):
                            if model.is_moe and (per % (etp * ep) or (pp * per) % (etp * ep * pp)):
                                continue
                            if "etp" in fixed:
                                etp = fixed["etp"]
                            yield tp, cp, pp, dp, ep, etp


def _layer_split_even(L: int, pp: int) -> tuple[int, ...]:
    b, e = divmod(L, pp)
    return tuple(b + (1 if i < e else 0) for i in range(pp))


def _proportional_split(model: ModelSpec, s: Strategy, cluster: ClusterSpec, groups: tuple[str, ...]) -> tuple[int, ...]:
    """Layers in proportion to each stage GPU's speed (a starting point before the exact DP)."""
    tk = _time_key(s)
    speed = []
    for name in groups:
        gpu = cluster.group(name).gpu
        speed.append(1.0 / _layer_time(model, tk, gpu, False).total)
    L, v = model.num_layers, s.vpp
    tot = sum(speed)
    raw = [L * x / tot for x in speed]
    split = [max(v, int(round(r / v)) * v) for r in raw]
    while sum(split) > L:
        i = max(range(len(split)), key=lambda k: split[k] - raw[k])
        if split[i] - v < v:
            break
        split[i] -= v
    while sum(split) < L:
        i = min(range(len(split)), key=lambda k: split[k] - raw[k])
        split[i] += v
    if sum(split) != L or min(split) < 1:
        return _layer_split_even(L, s.pp)
    return tuple(split)


def partition_problem(model: ModelSpec, cluster: ClusterSpec, s: Strategy, e: Estimate) -> PartitionProblem:
    """Per-layer stage costs consistent with `estimate`: compute + exposed TP/CP/EP per layer on
    each stage's GPU; memory per layer with that stage's in-flight micro-batches; the rest of
    each stage (embedding, output layer, PP traffic) as fixed extras."""
    p, L = s.pp, model.num_layers
    tk = _time_key(s)
    placement = placement_of(s)
    bpp = BYTES_PER_PARAM[s.optimizer_convention]
    lt = np.zeros((p, L))
    lm = np.zeros((p, L))
    et = np.zeros(p)
    em = np.zeros(p)
    cap = np.zeros(p)
    ranges = s.stage_layer_ranges(model)
    for i in range(p):
        gpu = cluster.group(e.stage_groups[i].split("+")[0]).gpu
        st = e.stage_times[i]
        mem = e.memory[i]
        a, b = ranges[i]
        n_moe = sum(model.is_moe_layer(k) for k in range(a, b))
        exp = dict(st.exposed_by_axis)
        per_layer_comm = (exp.get("tp", 0.0) + exp.get("cp", 0.0)) / max(b - a, 1)
        ep_per_moe = exp.get("ep", 0.0) / max(n_moe, 1)
        dp_mb = exp.get("dp", 0.0) / max(b - a, 1)
        infl = in_flight_microbatches(s, i)
        for k in range(L):
            moe = model.is_moe_layer(k)
            t = _layer_time(model, tk, gpu, moe)
            lt[i, k] = t.total + per_layer_comm + dp_mb + (ep_per_moe if moe else 0.0)
            if moe:
                dense_p = model.attention_params + model.shared_expert_params
                norm_p = model.layer_norm_params + model.router_params
                exp_p = model.num_experts * model.expert_params
            else:
                dense_p = model.attention_params + model.dense_mlp_params
                norm_p = model.layer_norm_params
                exp_p = 0
            states = 0.0
            for state in ("parameters", "gradients", "optimizer"):
                states += (dense_p * placement.shard_factor(state, "dense")
                           + norm_p * placement.shard_factor(state, "norms")
                           + exp_p * placement.shard_factor(state, "experts")) * bpp[state]
            mode = "full" if s.recompute == "full" else ("selective" if s.recompute == "selective" else "none")
            lm[i, k] = states + act.layer_bytes(model, s, moe, mode) * infl
        used_t = sum(lt[i, k] for k in range(a, b))
        used_m = sum(lm[i, k] for k in range(a, b))
        et[i] = st.per_microbatch_s - used_t
        em[i] = mem.total - used_m
        cap[i] = mem.capacity
    return PartitionProblem(lt, lm, et, em, cap, s.num_microbatches, s.vpp)


def refine_partition(model, cluster, s: Strategy, e: Estimate, solver: str, warnings: list):
    if s.pp == 1 or (s.recompute_num_layers is not None):
        return None, "none"
    prob = partition_problem(model, cluster, s, e)
    res = None
    used = "dp"
    if solver.startswith("ilp"):
        try:
            res = partition_ilp(prob, multiple=s.vpp, solver="highs" if solver == "ilp-highs" else "cbc")
            used = res.solver
            if res.status == "time-limit":
                warnings.append("ILP hit its time limit; its partition may not be optimal")
        except Exception as exc:  # a missing or crashing solver falls back to the DP
            warnings.append(f"ILP solver failed ({type(exc).__name__}: {exc}); fell back to dynamic programming")
            res = None
    if res is None:
        res = partition_dp(prob, multiple=s.vpp)
        used = "dp"
        if res.status == "bound-limit":
            warnings.append(f"stage-partition DP stopped at its work cap; its split is within "
                            f"{res.gap * 100:.2f}% of optimal")
    if res.layers is None:
        return None, used
    return replace(s, layers_per_stage=res.layers), used


def search(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, progress=None) -> SearchResult:
    t0 = time.perf_counter()
    fixed = dict(o.fixed)
    res = SearchResult(plans=[], solver=o.solver)
    cands = []  # (lower bound, strategy)
    closest = None
    n = 0
    mbs_opts = [fixed["mbs"]] if "mbs" in fixed else list(MICRO_BATCHES)
    rec_opts = [fixed["recompute"]] if "recompute" in fixed else list(o.recompute)
    zero_opts = [fixed["zero"]] if "zero" in fixed else list(o.zero_stages)
    vpp_opts = [fixed["vpp"]] if "vpp" in fixed else list(VPP_CHOICES)
    for tp, cp, pp, dp, ep, etp in enumerate_space(model, cluster, o):
        per = tp * cp * dp
        layouts = stage_layouts(cluster, per, pp)
        if not layouts:
            continue
        for mbs in mbs_opts:
            if o.global_batch_size % (mbs * dp):
                continue
            m = o.global_batch_size // (mbs * dp)
            for vpp in vpp_opts:
                if vpp > 1 and (pp < 2 or m % pp or "interleaved" not in o.schedules
                                or (model.num_layers // pp) % vpp):
                    continue
                sched = "interleaved" if vpp > 1 else "1f1b"
                for rec in rec_opts:
                    for z in zero_opts:
                        for groups in layouts:
                            n += 1
                            if n > MAX_CANDIDATES:
                                raise PlannerError(f"search space exceeds {MAX_CANDIDATES} candidates; "
                                                   "fix some degrees with --fix (e.g. --fix tp=8)")
                            s = Strategy(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp,
                                         micro_batch_size=mbs, global_batch_size=o.global_batch_size,
                                         seq_length=o.seq_length, recompute=rec, sequence_parallel=tp > 1,
                                         zero_stage=z, precision=o.precision, schedule=sched,
                                         stage_node_groups=groups if cluster.is_heterogeneous else None,
                                         overlap_grad_reduce=True, overlap_param_gather=z >= 1)
                            if cluster.is_heterogeneous and len(set(groups)) > 1:
                                s = replace(s, layers_per_stage=_proportional_split(model, s, cluster, groups))
                            elif model.num_layers % pp and vpp == 1:
                                s = replace(s, layers_per_stage=_layer_split_even(model.num_layers, pp))
                            elif model.num_layers % pp:
                                continue
                            try:
                                check_structure(s, model)
                            except InvalidStrategy:
                                continue
                            # cheap memory check on the first and last stage
                            placement = placement_of(s)
                            fits = True
                            worst = 0.0
                            for i in sorted({0, pp - 1}):
                                gpu = cluster.group(groups[i]).gpu
                                mem = stage_memory(model, s, placement, i, gpu)
                                worst = max(worst, mem.total - mem.capacity)
                                if not mem.fits:
                                    fits = False
                            if not fits:
                                res.pruned_memory += 1
                                if closest is None or worst < closest[0]:
                                    closest = (worst, s)
                                continue
                            cands.append((_lower_bound(model, cluster, s), s))
    res.candidates = n
    cands.sort(key=lambda x: x[0])
    priced: list[Estimate] = []
    best_k: list[float] = []
    for k, (lb, s) in enumerate(cands):
        if len(best_k) >= max(o.top, REFINE_TOP) and lb > sorted(best_k)[max(o.top, REFINE_TOP) - 1]:
            res.pruned_bound += len(cands) - k
            break
        if time.perf_counter() - t0 > o.time_limit_s:
            res.status = "time-limit"
            res.warnings.append(f"search stopped at its {o.time_limit_s:g} s time limit")
            res.pruned_bound += len(cands) - k
            break
        try:
            e = estimate(model, cluster, s)
        except InvalidStrategy:
            continue
        res.priced += 1
        if progress:
            progress(k + 1, len(cands))
        if e.fits:
            priced.append(e)
            best_k.append(e.step_time_s)
        elif closest is None or _short(e) < closest[0]:
            closest = (_short(e), s)
    priced.sort(key=lambda e: e.step_time_s)
    # exact stage partition for the best few
    refined = []
    seen = set()
    for e in priced[:REFINE_TOP]:
        s2, used = refine_partition(model, cluster, e.strategy, e, o.solver, res.warnings)
        res.solver = used if used != "none" else res.solver
        best = e
        if s2 is not None and s2.layers_per_stage != e.strategy.stage_layers(model):
            try:
                e2 = estimate(model, cluster, s2)
                if e2.fits and e2.step_time_s < e.step_time_s:
                    best = e2
            except InvalidStrategy:
                pass
        key = best.strategy
        if key not in seen:
            seen.add(key)
            refined.append(best)
    refined.sort(key=lambda e: e.step_time_s)
    res.plans = refined[:o.top]
    if not res.plans and closest is not None:
        s = closest[1]
        try:
            res.closest = estimate(model, cluster, s)
        except InvalidStrategy:
            res.closest = None
    if res.plans and cluster.is_heterogeneous:
        used = set(res.plans[0].stage_groups)
        for g in cluster.node_groups:
            if g.name not in used:
                res.idle_groups.append(g.name)
    res.seconds = time.perf_counter() - t0
    return res


def _short(e: Estimate) -> float:
    return max(m.total - m.capacity for m in e.memory)


def _lower_bound(model: ModelSpec, cluster: ClusterSpec, s: Strategy) -> float:
    """Seconds no plan of this strategy can beat: the critical stage's compute for m
    micro-batches (communication, bubble and optimizer only add)."""
    tk = _time_key(s)
    groups = s.stage_node_groups or tuple(cluster.node_groups[0].name for _ in range(s.pp))
    worst = 0.0
    for i, (a, b) in enumerate(s.stage_layer_ranges(model)):
        gpu = cluster.group(groups[i]).gpu
        n_moe = sum(model.is_moe_layer(k) for k in range(a, b))
        t = (b - a - n_moe) * _layer_time(model, tk, gpu, False).total
        if n_moe:
            t += n_moe * _layer_time(model, tk, gpu, True).total
        worst = max(worst, t)
    return worst * s.num_microbatches
