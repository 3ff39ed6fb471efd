"""`planner plan`: enumerate degrees, micro-batch, recompute, ZeRO stage, virtual stages and the
placement of stages on node groups; prune by memory, then by a compute lower bound; price the
survivors with the full estimate; re-partition the layers of the best ones exactly (DP, or
ILP), and return the top K plans that fit."""

from __future__ import annotations

import gc
import heapq
import itertools
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import InvalidStrategy, PlannerError
from ..estimate import Estimate, _layer_time, _time_key, estimate
from ..cost.moe_schedule import NO_A2A
from ..cost.parallel import (cp_layer_exposed_s, cp_ring_step, ep_a2a, ep_layer_collectives, moe_layer_floor,
                             moe_recomputed, pp_gather_s, pp_message_bytes, tp_layer_collectives, tp_layer_exposed_s)
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy, check_structure
from ..cost import compute as C
from ..cost.comm import collective_time, group_link, p2p_link
from ..cost.memory import (allocatable_bytes, gradient_comm_bytes, in_flight_microbatches, layer_kept_activation_bytes,
                           layer_memory_bytes, layer_range_params, layer_state_bytes, one_layer_params,
                           param_gather_bytes, stage_fixed_bytes_parts, stage_memory)
from ..placement import data_collectives, placement_of
from .objective import (MIN_GPU_FRACTION, GpuBudget, check_objective, dominates, figures, memory_figure,
                        usd_per_hour, usd_per_million_tokens)
from .family_screen import FamilyScreen
from .partition import PartitionProblem, partition_dp, partition_ilp

# The space searched. These bound it; the top plan is the optimum of this space under the cost
# model, not of every conceivable configuration.
MAX_PP = 128
MAX_CP = 32
# micro-batch sizes: powers of two while they divide the batch a data-parallel rank gets (memory
# rules the large ones out where activations do not fit)
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
VPP_CHOICES = (1, 2, 3, 4, 5, 6, 8)
# Context parallelism is only tried at long sequences: below CP_MIN_SEQ_LENGTH tokens no CP; below
# CP_FULL_RANGE_SEQ_LENGTH at most CP_SHORT_MAX. Under 8k tokens attention is a small share of a
# layer's FLOPs (s/6h in Narayanan's count) while CP adds a K/V ring exchange per layer.
CP_MIN_SEQ_LENGTH = 8192
CP_FULL_RANGE_SEQ_LENGTH = 16384
CP_SHORT_MAX = 2
# The GPU budget (objective.GpuBudget, MIN_GPU_FRACTION the default of --min-gpu-fraction):
# plans use more than a fraction of the GPUs available to them. On a heterogeneous cluster
# whole node groups may stay idle: a plan on the fast GPUs alone is in the space, so the search
# says when the slow ones cannot help.
# Seconds between two calls of the progress callback (the live line on a terminal).
PROGRESS_INTERVAL_S = 0.1


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
    # with "full" in recompute: also full recompute of only the first k layers of each chunk
    # (Megatron's --recompute-method block --recompute-num-layers k)
    partial_recompute: bool = True
    allow_tp_across_nodes: bool = False
    time_limit_s: float = 60.0
    # a pipeline rank's layers need not divide by vpp: its virtual chunks differ by one layer
    # (Megatron's --pipeline-model-parallel-layout, as Llama 3 405B ran 126 layers on PP16 x
    # VPP2); the first and last stages can then carry fewer layers for the embedding and loss.
    # The launch emitter, the launch reader and plan JSON carry Strategy.chunk_layers; off by
    # default while the top K with uneven chunks is not yet exact (tests/test_search.py).
    uneven_chunks: bool = False
    # GPU budget: exactly `gpus` of the cluster's GPUs, or at most `max_gpus`; plans use more
    # than min_gpu_fraction of the GPUs available to them (not applied with `gpus`)
    gpus: int | None = None
    max_gpus: int | None = None
    min_gpu_fraction: float = MIN_GPU_FRACTION
    # what plans are ranked by (objective.OBJECTIVES); cost charges the GPUs a plan uses, or
    # every GPU of the cluster with charge_idle
    objective: str = "throughput"
    charge_idle: bool = False
    # keep plans another plan dominates on every reported figure (step time, peak memory per
    # GPU, GPUs used, and $ when priced); plans equal up to a symmetry of the cluster are one
    # plan either way
    keep_dominated: bool = False
    # rank plans that fit only within the memory model's stated margin (TIGHT) with the others;
    # by default they come after every plan that fits with margin
    allow_tight: bool = False

    @property
    def budget(self) -> "GpuBudget":
        return GpuBudget(self.gpus, self.max_gpus, self.min_gpu_fraction)


@dataclass
class SearchResult:
    plans: list
    candidates: int = 0
    pruned_memory: int = 0
    pruned_bound: int = 0
    priced: int = 0
    invalid: int = 0              # candidates the structure rules refused (none by construction)
    seconds: float = 0.0
    solver: str = "dp"
    status: str = "optimal"
    optimality_gap: float = 0.0
    warnings: list = field(default_factory=list)
    closest: Estimate | None = None
    idle_groups: list = field(default_factory=list)
    priced_estimates: list = field(default_factory=list)   # every estimate made (for the scatter plot)
    pruned_dominated: int = 0     # candidates whose every plan a found plan dominates
    hidden_dominated: int = 0     # priced plans within the top K's range that were dominated
    objective: str = "throughput"
    plan_figures: list = field(default_factory=list)       # objective.Figures of each plan
    # safe by default: the best TIGHT plan when it beats #1 on the objective (not in `plans`
    # unless fewer than K plans fit with margin), and how many TIGHT plans close `plans`
    fastest_tight: Estimate | None = None
    tight_listed: int = 0


@dataclass(frozen=True)
class SearchProgress:
    """What the search has done so far (the progress callback's argument)."""
    candidates: int              # in the space
    reached: int                 # candidates built and screened
    priced: int
    best: float | None           # objective of the best plan so far (seconds, or $ per M tokens)
    best_step_s: float | None
    bound: float | None          # the lowest bound still queued: no unpriced plan is better
    seconds: float

    @property
    def gap(self) -> float | None:
        """How much better than the best so far an unpriced plan could still be (fraction)."""
        if self.best is None or self.bound is None:
            return None
        return max(0.0, (self.best - self.bound) / self.best) if self.best > 0 else 0.0


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pow2_upto(n: int) -> list[int]:
    out, x = [], 1
    while x <= n:
        out.append(x)
        x *= 2
    return out


def stage_layouts(cluster: ClusterSpec, per_stage: int, pp: int,
                  budget: GpuBudget = GpuBudget()) -> dict[tuple[int, ...], list[tuple[str, ...]]]:
    """Ways to put pp stages of `per_stage` GPUs on node groups, keyed by how many stages each
    group hosts. Stages of one group are contiguous, groups come in every order (the first
    stages hold the most activations). Each group used hosts as many stages as it can hold,
    except at most one partly used group (leaving GPUs of two groups idle at once is never
    needed to use the fast ones fully, and it keeps the space small on many-group clusters),
    each group's stages fill whole nodes, and the GPU budget allows the stages' GPUs on the
    used groups. Of orders that a symmetry of the cluster maps onto each other (interchangeable
    node groups, distinct_orders) only the first is kept: they are one plan."""
    groups = cluster.node_groups
    caps = []
    for g in groups:
        ok = per_stage % g.gpus_per_node == 0 or g.gpus_per_node % per_stage == 0
        caps.append(min(g.num_gpus // per_stage, pp) if ok else 0)
    counts_set = set()
    n = len(groups)
    for used in itertools.product((0, 1), repeat=n):
        idx = [i for i in range(n) if used[i] and caps[i] > 0]
        if len(idx) != sum(used):
            continue
        for partial in idx:
            counts = [caps[i] if i in idx else 0 for i in range(n)]
            counts[partial] = pp - sum(caps[i] for i in idx if i != partial)
            used_gpus = sum(groups[i].num_gpus for i in idx)
            # each group's stages fill whole nodes (torchrun starts the same number of ranks on
            # every node; a node cannot host stages of two groups)
            whole = all(counts[i] * per_stage % groups[i].gpus_per_node == 0 for i in idx)
            if whole and 1 <= counts[partial] <= caps[partial] and budget.allows(pp * per_stage, used_gpus):
                counts_set.add(tuple(counts))
    out = {}
    for counts in sorted(counts_set):
        used = [i for i, c in enumerate(counts) if c]
        seqs = set()
        for order in itertools.permutations(used):
            seq = []
            for i in order:
                seq += [groups[i].name] * counts[i]
            seqs.add(tuple(seq))
        out[counts] = sorted(seqs)
    return distinct_orders(cluster, out)


def _group_signature(g) -> object:
    """A node group without its name (and its profile without name and provenance): groups
    with equal signatures price every stage alike."""
    return replace(g, name="", gpu=replace(g.gpu, name="", source="", uncertain=()))


def order_key(cluster: ClusterSpec, seq: tuple[str, ...]) -> tuple:
    """The stage order up to a renaming of node groups: groups labelled by first appearance,
    with each label's group signature and the interconnect between every two labels. Orders
    with equal keys are priced alike by the cost model, which sees a group only through its
    fields and the links between the groups a plan uses (cost/comm.py), and so are one plan:
    on two identical sites, sites a then b is b then a."""
    label: dict = {}
    for name in seq:
        label.setdefault(name, len(label))
    names = list(label)
    links = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            ic = cluster.interconnect(names[i], names[j])
            links.append(None if ic is None else (ic.bandwidth_bytes_per_s, ic.latency_s))
    return (tuple(label[n] for n in seq), tuple(_group_signature(cluster.group(n)) for n in names), tuple(links))


def distinct_orders(cluster: ClusterSpec, layouts: dict) -> dict:
    """layouts with one stage order of each symmetry class (order_key), the first in the order
    of the node groups as listed (most stages on the first group)."""
    sigs = [_group_signature(g) for g in cluster.node_groups]
    if len(set(sigs)) == len(sigs):
        return layouts   # no two groups are interchangeable
    seen: set = set()
    keep: dict = {}
    for counts in sorted(layouts, reverse=True):
        kept = []
        for seq in layouts[counts]:
            key = order_key(cluster, seq)
            if key not in seen:
                seen.add(key)
                kept.append(seq)
        if kept:
            keep[counts] = kept
    return {c: keep[c] for c in layouts if c in keep}


def enumerate_space(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions):
    fixed = dict(o.fixed)
    max_gpn = max(g.gpus_per_node for g in cluster.node_groups)
    N = cluster.num_gpus
    n_min = min(g.num_gpus for g in cluster.node_groups)   # a plan may run on one node group
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
    # expert-TP within a node (like TP), dividing the expert FFN (each rank a slice of fc1/fc2)
    etp_opts = [e for e in _pow2_upto(max_gpn) if model.is_moe and model.moe_ffn_hidden_size % e == 0]
    for key, vals in (("tp", tps), ("cp", cps), ("ep", eps), ("pp", pps)):
        if key in fixed:
            vals[:] = [fixed[key]]
    batch_divisors = _divisors(o.global_batch_size)
    budget = o.budget
    # a plan's world size, as the budget allows it on some set of node groups (the smallest
    # group alone is the least any plan has available); stage_layouts applies the exact rule
    lo = budget.min_fraction * budget.cap(n_min) if budget.gpus is None else budget.gpus - 1
    hi = budget.cap(N) if budget.gpus is None else budget.gpus
    for tp in tps:
        for cp in cps:
            if tp > 1 and o.seq_length % (cp * tp):
                continue   # sequence parallelism (on whenever tp > 1) would break: check_structure
            for pp in pps:
                base = tp * cp * pp
                if base > hi:
                    break
                dps = [d for d in batch_divisors if lo < base * d <= hi]
                if "dp" in fixed:
                    dps = [fixed["dp"]]
                for dp in dps:
                    per = tp * cp * dp
                    for ep in eps:
                        # MoE parallel folding (Megatron-Core): expert-TP independent of the
                        # dense TP, and EP x expert-TP folded over any of the stage's
                        # tp x cp x dp ranks; parallel_state.py only needs the expert grid
                        # (etp x ep x expert-dp) to cover the stage's ranks exactly
                        etps = etp_opts if model.is_moe else [None]
                        if "etp" in fixed and model.is_moe:
                            etps = [fixed["etp"]]
                        for etp in etps:
                            if model.is_moe and per % (etp * ep):
                                continue
                            yield tp, cp, pp, dp, ep, etp


def _layer_split_even(L: int, pp: int) -> tuple[int, ...]:
    b, e = divmod(L, pp)
    return tuple(b + (1 if i < e else 0) for i in range(pp))


def _proportional_split(model: ModelSpec, s: Strategy, cluster: ClusterSpec, groups: tuple[str, ...],
                        multiple: int) -> tuple[int, ...]:
    """Layers in proportion to each stage GPU's speed (a starting point before the exact DP):
    each stage at least vpp layers, in multiples of `multiple`."""
    tk = _time_key(s)
    rate = {name: 1.0 / _layer_time(model, tk, cluster.group(name).gpu, False).total for name in set(groups)}
    speed = [rate[name] for name in groups]
    L, v, q = model.num_layers, s.vpp, multiple
    tot = sum(speed)
    raw = [L * x / tot for x in speed]
    split = [max(v, int(round(r / q)) * q) for r in raw]
    while sum(split) > L:
        i = max(range(len(split)), key=lambda k: split[k] - raw[k])
        if split[i] - q < v:
            break
        split[i] -= q
    while sum(split) < L:
        i = min(range(len(split)), key=lambda k: split[k] - raw[k])
        split[i] += q
    if sum(split) != L or min(split) < v:
        return tuple(q * n for n in _layer_split_even(L // q, s.pp))
    return tuple(split)


def partition_problem(model: ModelSpec, cluster: ClusterSpec, s: Strategy, e: Estimate,
                      safe: bool = False) -> PartitionProblem:
    """Per-layer stage costs consistent with `estimate`: compute + exposed TP/CP/EP per layer on
    each stage's GPU; memory per layer with that stage's in-flight micro-batches; the rest of
    each stage (embedding, output layer, PP traffic) as fixed extras. Layers of one kind (dense
    or MoE) cost the same, so each row is filled from two values. `safe`: each stage's room is
    what fits with the memory model's margin (StageMemory.safe_capacity), not all it can use."""
    p, L = s.pp, model.num_layers
    tk = _time_key(s)
    placement = placement_of(s)
    moe_mask = np.array([model.is_moe_layer(k) for k in range(L)], dtype=bool)
    lt = np.zeros((p, L))
    lm = np.zeros((p, L))
    et = np.zeros(p)
    em = np.zeros(p)
    cap = np.zeros(p)
    for i, (a, b) in enumerate(s.stage_layer_ranges(model)):
        gpu = cluster.group(e.stage_groups[i].split("+")[0]).gpu
        st, mem = e.stage_times[i], e.memory[i]
        n_moe = model.num_moe_layers_in(a, b)
        exp = dict(st.exposed_by_axis)
        per_layer_comm = (exp.get("tp", 0.0) + exp.get("cp", 0.0) + exp.get("dp", 0.0)) / max(b - a, 1)
        ep_per_moe = exp.get("ep", 0.0) / max(n_moe, 1)
        lt[i] = _layer_time(model, tk, gpu, False).total + per_layer_comm
        lm[i] = layer_memory_bytes(model, s, placement, i, False, gpu)
        if model.is_moe:
            lt[i, moe_mask] = _layer_time(model, tk, gpu, True).total + per_layer_comm + ep_per_moe
            lm[i, moe_mask] = layer_memory_bytes(model, s, placement, i, True, gpu)
        et[i] = st.per_microbatch_s - lt[i, a:b].sum()
        em[i] = mem.total - lm[i, a:b].sum()
        cap[i] = mem.safe_capacity if safe else mem.capacity
    return PartitionProblem(lt, lm, et, em, cap, s.num_microbatches, s.vpp)


def refine_partition(model, cluster, s: Strategy, e: Estimate, solver: str, warnings: list, gaps=None,
                     uneven: bool = True, safe: bool = False):
    """The best contiguous layer split for this strategy's stages, in memory (DP or ILP): each
    stage at least vpp layers, any count with `uneven` (balanced_chunks), else multiples of
    vpp. `gaps` collects the DP's optimality gap (0 unless its work cap stopped it)."""
    gaps = [] if gaps is None else gaps
    if s.pp == 1 or (s.recompute_num_layers is not None):
        return None, "none"
    prob = partition_problem(model, cluster, s, e, safe)
    q = 1 if uneven else s.vpp
    if len(model.layer_kinds) == 1:
        prob = replace(prob, max_layers=_exact_max_layers(model, cluster, s, prob, q, safe))
    res = None
    used = "dp"
    if solver.startswith("ilp"):
        try:
            res = partition_ilp(prob, multiple=q, least=s.vpp, solver="highs" if solver == "ilp-highs" else "cbc")
            used = res.solver
            if res.status == "time-limit":
                _warn(warnings, "ILP hit its time limit; its partition may not be optimal")
        except Exception as exc:  # a missing or crashing solver falls back to the DP
            _warn(warnings, f"ILP solver failed ({type(exc).__name__}: {exc}); fell back to dynamic programming")
            res = None
    if res is None:
        res = partition_dp(prob, multiple=q, least=s.vpp)
        used = "dp"
        gaps.append(res.gap)
        if res.status == "bound-limit":
            _warn(warnings, f"stage-partition DP stopped at its work cap; its split is within "
                            f"{res.gap * 100:.2f}% of optimal")
    if res.layers is None:
        return None, used
    return with_split(s, res.layers), used


def _exact_max_layers(model: ModelSpec, cluster: ClusterSpec, s: Strategy, prob: PartitionProblem, q: int,
                      safe: bool = False):
    """Most layers each stage can hold, by stage_memory itself, for a model of one layer kind
    (where a stage's memory depends on its count alone): the additive per-layer model of the
    partition problem is exact only for even chunks and split-independent buffers (uneven
    chunks keep fewer activations; ZeRO-2/3 buffers follow the stage's parameters). Memory
    grows with the count, so a walk from the additive estimate finds the exact limit."""
    placement = placement_of(s)
    L, v = model.num_layers, s.vpp
    out = np.zeros(s.pp, dtype=np.int64)

    def fits(i, n, gpu):
        # the other stages at vpp layers keep stage i's range inside the model
        split = [v] * s.pp
        split[i] = n
        sn = replace(s, layers_per_stage=tuple(split), chunk_layers=balanced_chunks(tuple(split), v))
        mem = stage_memory(model, sn, placement, i, gpu)
        return mem.verdict == "fits" if safe else mem.fits

    for i in range(s.pp):
        gpu = _stage_gpu(cluster, s, i)
        hi = L - (s.pp - 1) * v          # the most a stage can take with the others at vpp
        k = prob.layer_mem[i, 0]
        n = int(np.floor((prob.capacity[i] - prob.extra_mem[i]) / k)) if k > 0 else hi
        n = min(max(n // q * q, v), hi // q * q)
        if fits(i, n, gpu):
            while n + q <= hi and fits(i, n + q, gpu):
                n += q
        else:
            while n - q >= v and not fits(i, n - q, gpu):
                n -= q
            n = n - q if n - q >= v else 0
        out[i] = n
    return out


def _warn(warnings: list, msg: str) -> None:
    if msg not in warnings:
        warnings.append(msg)


# ---- lower bounds --------------------------------------------------------------------------
# A bound is seconds that no plan of a candidate can beat, whatever its layer split: the search
# prices candidates in increasing bound order and stops when the next bound is no better than
# the K-th best plan found, so the top K are exact under the cost model.

class _Bounds:
    """Per-layer and per-stage costs shared by many candidates (cached by time key and group)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec):
        self.model, self.cluster = model, cluster
        self._layer: dict = {}
        self._extra: dict = {}
        self._pp: dict = {}
        self._after: dict = {}
        self._after_groups: dict = {}
        self._work: dict = {}
        self._fam: dict = {}
        self._hop_min: dict = {}
        self._dense: dict = {}

    def layer_costs(self, s: Strategy, tk: Strategy, group_name: str) -> tuple[float, float]:
        """(dense, MoE) seconds per layer and micro-batch on this group: compute + TP (+ EP);
        exactly what `estimate` charges per layer for these terms, the CP ring's exposure
        included (it is additive in layers; DP only adds).
        `tk` is s's time key (`_time_key(s)`), passed in because building it is not free."""
        key = (tk, group_name)
        v = self._layer.get(key)
        if v is None:
            model, g = self.model, self.cluster.group(group_name)

            def tp(lt, moe=False):
                if s.tp <= 1:
                    return 0.0
                phases, _, _ = tp_layer_collectives(model, s, [g], self.cluster, moe)
                return tp_layer_exposed_s(phases, lt, s.recompute == "full", s.tp_comm_overlap,
                                          s.async_tensor_model_parallel_allreduce)

            t_cp = cp_ring_step(model, s, [g], self.cluster)[1] if s.cp > 1 else 0.0

            def cp(lt):   # the ring's exposure, as estimate's cp_cost charges it per layer
                return cp_layer_exposed_s(s, t_cp, lt.core_attention_forward) if s.cp > 1 else 0.0

            lt_d = _layer_time(model, tk, g.gpu, False)
            dense = lt_d.total + tp(lt_d) + cp(lt_d)
            moe = dense
            if model.is_moe:
                lt_m = _layer_time(model, tk, g.gpu, True)
                a2a = ep_a2a(ep_layer_collectives(model, s, [g], self.cluster)[0]) if s.ep > 1 else NO_A2A
                # the MoE layer as its schedule places it, all-to-alls included, at the least
                # warm-up share any stage has
                moe = moe_layer_floor(lt_m, s, a2a, moe_recomputed(s)) + tp(lt_m, True) + cp(lt_m)
            v = self._layer[key] = (dense, moe)
        return v

    def _kinds(self):
        """Layer kinds present: (index into layer_costs, how many layers)."""
        return [(int(moe), self.model.num_moe_layers if moe else self.model.num_dense_layers)
                for moe in self.model.layer_kinds]

    def work(self, s: Strategy, tk: Strategy, names) -> tuple[dict, float]:
        """Layers in work units (seconds on names[0]'s GPUs, summed over the model's layers),
        each group's seconds per unit r_g (a layer of kind k costs >= r_g w_k there), and the
        least sum of all layer times over any placement (each layer on its cheapest group)."""
        key = (tk, tuple(names))
        v = self._work.get(key)
        if v is None:
            v = self._work[key] = self._compute_work(s, tk, names)
        return v

    def _compute_work(self, s: Strategy, tk: Strategy, names) -> tuple[dict, float]:
        kinds = self._kinds()
        ref = self.layer_costs(s, tk, names[0])
        units = sum(n * ref[k] for k, n in kinds)
        costs = {g: self.layer_costs(s, tk, g) for g in names}
        rate = {g: min(costs[g][k] / ref[k] for k, _ in kinds) for g in names}
        least = sum(n * min(costs[g][k] for g in names) for k, n in kinds)
        floor = {g: min(costs[g][k] for k, _ in kinds) for g in names}
        unit_max = max(ref[k] for k, _ in kinds)   # the most units one layer can carry
        return {"units": units, "rate": rate, "floor": floor, "unit_max": unit_max,
                "moe": {g: costs[g][1] for g in names},
                "dense_saves": {g: max(0.0, costs[g][1] - costs[g][0]) for g in names}}, least

    def ends(self, s: Strategy, tk: Strategy, group_name: str) -> tuple[float, float]:
        """(embedding, output layer) forward + backward seconds per micro-batch on this group."""
        key = (tk, group_name)
        v = self._extra.get(key)
        if v is None:
            gpu = self.cluster.group(group_name).gpu
            v = self._extra[key] = (sum(C.embedding_time(self.model, s, gpu)),
                                    sum(C.output_layer_time(self.model, s, gpu)))
        return v

    def pp_hop(self, s: Strategy, a: str, b: str, same_node: bool = False) -> float:
        """One activation send between stages on groups a and b, as `estimate` prices it."""
        key = (s.seq_length, s.cp, s.micro_batch_size, s.tp, s.sp, a, b, same_node)
        v = self._pp.get(key)
        if v is None:
            link = p2p_link(self.cluster.group(a), self.cluster.group(b), same_node, self.cluster)
            v = self._pp[key] = (collective_time("send-recv", pp_message_bytes(self.model, s), 2, link)
                                 + min(pp_gather_s(self.model, s, [self.cluster.group(x)], self.cluster)
                                       for x in (a, b)))
        return v

    def least_hop(self, s: Strategy, a: str, b: str, per: int | None = None) -> float:
        """The cheaper of the two ways two stages (of `per` GPUs, default s's) on groups a and b
        can talk (on one node only when a stage is smaller than a node of one group)."""
        hop = self.pp_hop(s, a, b)
        per = s.gpus_per_stage if per is None else per
        if a == b and per < self.cluster.group(a).gpus_per_node:
            hop = min(hop, self.pp_hop(s, a, b, True))
        return hop

    def stage_caps(self, per: int, pp: int, layouts: dict) -> dict:
        """Most stages any placement puts on each node group (from stage_layouts' counts)."""
        names = [g.name for g in self.cluster.node_groups]
        return {g: max(c[i] for c in layouts) for i, g in enumerate(names)} if layouts else {}

    def family(self, s: Strategy, tk: Strategy, p: int, m: int, per: int, caps: dict, vmax: int,
               names: tuple | None = None) -> float:
        """Bound for every stage placement, vpp and ZeRO stage of p stages of `per` GPUs and m
        micro-batches with s's time class (TP, CP, EP, expert-TP, micro-batch, recompute): the
        cell bound (below) relaxed to the fastest GPUs the pipeline can use (speeds summed over
        its p fastest stage slots), the cheapest end stages and hop, and the bubble at the most
        virtual stages. `caps`: most stages per group; `names`: the groups with caps > 0, sorted
        (computed here when not given; the search passes them, it bounds 10^5 families)."""
        if names is None:
            names = tuple(sorted(g for g, c in caps.items() if c > 0))
        st = self._family_static(s, tk, names)
        units, speeds, f_min, emb, out, e_single, least = st
        S, left = 0.0, p
        for speed, g in speeds:
            take = min(caps[g], left)
            S += take * speed
            left -= take
            if left == 0:
                break
        if left > 0:
            return float("inf")
        if p == 1:
            return m * max(f_min + e_single, units / S + e_single)
        hk = (tk, per, names)
        hop = self._hop_min.get(hk)
        if hop is None:
            hop = self._hop_min[hk] = 2 * min(self.least_hop(s, x, y, per) for x in names for y in names)
        T = max(f_min + hop, units / S + hop)
        W = least + emb + out + p * hop
        return m * T + min(W - T, (W - T) / vmax)     # the bubble at vpp 1 or at the most virtual stages

    def _family_static(self, s: Strategy, tk: Strategy, names: tuple) -> tuple:
        """What a family bound needs of its time class on these groups (cached)."""
        key = (tk, names)
        v = self._fam.get(key)
        if v is None:
            w, least = self.work(s, tk, names)
            speeds = sorted(((1.0 / w["rate"][g], g) for g in names), reverse=True)
            ends = [self.ends(s, tk, g) for g in names]
            v = self._fam[key] = (w["units"] * (1 - _UNITS_TOL), speeds, min(w["floor"][g] for g in names),
                                  min(e[0] for e in ends), min(e[1] for e in ends), min(a + b for a, b in ends), least)
        return v

    def cell(self, s: Strategy, tk: Strategy, groups: tuple[str, ...], vpps=(1,), zeros=None) -> float:
        """Bound for every vpp, ZeRO stage and stage order of a multiset of stage groups:
        (m - 1/v) T + W / v + the after-step term, minimised over the cell's vpp and ZeRO
        stages, with T the least slowest-stage time and W the least sum of stage times when
        every stage pays only the cheapest PP hop and the end stages the cheapest group's
        embedding / output layer (see `candidate`). zeros None: s's own ZeRO stage."""
        p, m = s.pp, s.num_microbatches
        names = tuple(sorted(set(groups)))
        w, least = self.work(s, tk, names)
        zeros = (s.zero_stage,) if zeros is None else zeros
        after = min(self.after_step(s, names, z) for z in zeros)
        S = sum(1.0 / w["rate"][g] for g in groups)
        units = w["units"] * (1 - _UNITS_TOL)
        f_max = max(w["floor"][g] for g in names)
        ends = [self.ends(s, tk, g) for g in names]
        if p == 1:
            e = min(a + b for a, b in ends)
            return m * max(f_max + e, units / S + e) + after
        emb, out = min(e[0] for e in ends), min(e[1] for e in ends)
        hop = 2 * min(self.least_hop(s, x, y) for x in names for y in names)
        best = float("inf")
        mixed = self._n_dense_mixed()
        for v in vpps:
            e = v * hop
            T = max(v * f_max + e, units / S + e)
            if mixed is not None:
                T = max(T, _mixed_floor([v * w["moe"][g] + e for g in groups],
                                        [w["dense_saves"][g] for g in groups], mixed, v))
            best = min(best, (m - 1.0 / v) * T + (least + emb + out + p * e) / v)
        return best + after

    def _n_dense_mixed(self) -> int | None:
        """The model's dense layers when it has both kinds (the mixed floor applies), else None."""
        return self.model.num_dense_layers if len(self.model.layer_kinds) > 1 else None

    def dense_ranks(self, p: int, v: int) -> frozenset | None:
        """Pipeline ranks that can hold a dense layer of a model with both kinds (None: one
        kind). Every virtual stage holds >= 1 layer (balanced_chunks), in Megatron's order
        (virtual stage k p + r is chunk k of rank r), so layer j sits in a virtual stage between
        j - (L - p v) and j: DeepSeek-V3's three dense layers first can only be on ranks 0-2."""
        if self._n_dense_mixed() is None:
            return None
        key = (p, v)
        got = self._dense.get(key)
        if got is None:
            L, V = self.model.num_layers, p * v
            ranks = set()
            for j in range(L):
                if not self.model.is_moe_layer(j):
                    ranks.update(vs % p for vs in range(max(0, j - (L - V)), min(j, V - 1) + 1))
                    if len(ranks) == p:
                        break
            got = self._dense[key] = frozenset(ranks)
        return got

    def children(self, s: Strategy, tk: Strategy, orders, vpps, zeros):
        """The bounds of every candidate of a cell, (bound, vpp, ZeRO stage, order) each: the
        closed form of `candidate` (no memory caps) over numpy arrays of the stages, one row
        per vpp. Stage i pays e_i = its end (embedding / output layer) + 2 v H_i, H_i its
        slower hop; the relaxed min-max is then T = max(max_i(v f_i + e_i), (U + sum e_i / r_i)
        / sum 1 / r_i) (every stage below its floor is impossible, above it the layers fill
        the stages in proportion to speed), W = least + sum e_i."""
        p, m = s.pp, s.num_microbatches
        names = tuple(sorted(set(orders[0])))
        w, least = self.work(s, tk, names)
        units = w["units"] * (1 - _UNITS_TOL)
        after = {z: self.after_step(s, names, z) for z in zeros}
        v = np.array(vpps, dtype=float)[:, None]
        idx = {g: k for k, g in enumerate(names)}
        floor = np.array([w["floor"][g] for g in names])
        rinv = np.array([1.0 / w["rate"][g] for g in names])
        mixed = self._n_dense_mixed()
        moe = np.array([w["moe"][g] for g in names])
        saves = np.array([w["dense_saves"][g] for g in names])
        if mixed is not None:   # per vpp row, the ranks no dense layer can reach
            moe_only_mask = np.array([[r not in self.dense_ranks(p, int(x)) for r in range(p)] for x in vpps])
        ends = np.array([self.ends(s, tk, g) for g in names])
        per = s.gpus_per_stage
        # hop[a, b, same node]: one send between stages on groups a and b (on one node only
        # within a group), and each group's GPUs per node, for _same_node over whole orders
        hop = np.array([[[self.pp_hop(s, x, y, same and x == y) for same in (False, True)] for y in names]
                        for x in names])
        gpn = np.array([self.cluster.group(g).gpus_per_node for g in names])
        rank = np.arange(p - 1)
        # every stage order of the cell at once: (orders, stages), then (orders, vpps, stages)
        gi = np.array([[idx[g] for g in groups] for groups in orders])
        n_orders, n_v = len(orders), len(vpps)
        end = np.zeros((n_orders, p))
        end[:, 0] += ends[gi[:, 0], 0]
        end[:, -1] += ends[gi[:, -1], 1]
        H = np.zeros((n_orders, p))
        if p > 1:
            a, b = gi[:, :-1], gi[:, 1:]
            same = (a == b) & ((rank * per) // gpn[a] == ((rank + 2) * per - 1) // gpn[a])
            h = hop[a, b, same.astype(int)]
            H[:, :-1] = h
            H[:, 1:] = np.maximum(H[:, 1:], h)
        F, R = floor[gi], rinv[gi]
        S = R.sum(axis=1)
        e = end[:, None, :] + 2 * v[None] * H[:, None, :]
        T = np.maximum((v[None] * F[:, None, :] + e).max(axis=2), (units + (e * R[:, None, :]).sum(axis=2)) / S[:, None])
        if mixed is not None:   # one row per order and vpp
            rows = (v[None] * moe[gi][:, None, :] + e).reshape(n_orders * n_v, p)
            T = np.maximum(T, _mixed_floor_rows(rows, np.repeat(saves[gi], n_v, axis=0), mixed,
                                                np.tile(v, (n_orders, 1)), np.tile(moe_only_mask, (n_orders, 1)))
                           .reshape(n_orders, n_v))
        W = least + e.sum(axis=2)
        vv = v[:, 0]
        pipe = (m * T if p == 1 else (m - 1.0 / vv) * T + W / vv).tolist()
        out = []
        for o, groups in enumerate(orders):
            for k, vpp in enumerate(vpps):
                for z in zeros:
                    out.append((pipe[o][k] + after[z], vpp, z, groups))
        return out

    def _same_node(self, groups, i: int, per: int) -> bool:
        """Whether stages i and i + 1 share a node (estimate's stages_share_node)."""
        a = groups[i]
        if a != groups[i + 1]:
            return False
        gpn = self.cluster.group(a).gpus_per_node
        return (i * per) // gpn == ((i + 2) * per - 1) // gpn

    def candidate(self, s: Strategy, tk: Strategy, groups: tuple[str, ...], max_layers=None, extra_s=None) -> float:
        """Bound for one concrete candidate (its vpp, ZeRO stage and stage order):
        (m - 1/v) T + W / v + the optimizer step, with T the least slowest-stage time and W the
        least sum of stage times over all layer splits (pipeline.py: T_pipe = (m - 1/v) max t_i
        + sum t_i / v; after the pipeline every stage runs its optimizer step, and the slowest
        takes at least the mean shard on the fastest GPU; DP sync only adds).
        `max_layers`: the most layers each stage can hold in memory, if known; `extra_s`: seconds
        per micro-batch each stage adds on top of s's layer costs (recompute of k layers)."""
        p, v, m = s.pp, s.vpp, s.num_microbatches
        L = self.model.num_layers
        names = sorted(set(groups))
        w, least = self.work(s, tk, names)
        # hop[i]: stage i to stage i + 1, on one node or across (estimate's stages_share_node)
        per = s.gpus_per_stage
        seen: dict = {}
        hop = []
        for i in range(p - 1):
            a, b = groups[i], groups[i + 1]
            key = (a, b, self._same_node(groups, i, per))
            if key not in seen:
                seen[key] = 2 * v * self.pp_hop(s, *key)
            hop.append(seen[key])
        stages: dict = {}
        moe_stages: dict = {}   # for the mixed count bound: (an MoE layer's seconds, fixed, most layers)
        W = least
        B, saves = [], []     # for the mixed floor: stage cost at v MoE layers, a dense layer's saving
        for i, g in enumerate(groups):
            e = 0.0
            if i == 0:
                e += self.ends(s, tk, g)[0]
            if i == p - 1:
                e += self.ends(s, tk, g)[1]
            if p > 1:
                e += max(hop[i - 1] if i > 0 else 0.0, hop[i] if i < p - 1 else 0.0)
            if extra_s is not None:
                e += extra_s[i]
            n_cap = L if max_layers is None else max_layers[i]
            cap = float("inf") if max_layers is None else n_cap * w["unit_max"]
            key = (w["rate"][g], w["floor"][g], e, cap, n_cap)
            stages[key] = stages.get(key, 0) + 1
            mkey = (w["moe"][g], e, n_cap)
            moe_stages[mkey] = moe_stages.get(mkey, 0) + 1
            W += e
            B.append(v * w["moe"][g] + e)
            saves.append(w["dense_saves"][g])
        T = max(_relaxed_minmax(stages, w["units"], v), _integer_minmax(stages, L, v))
        mixed = self._n_dense_mixed()
        if mixed is not None:
            reach = self.dense_ranks(p, v)
            T = max(T, _mixed_floor(B, saves, mixed, v, [r not in reach for r in range(p)]))
            if max_layers is not None:
                T = max(T, _mixed_count_minmax(moe_stages, L, mixed, T))
        pipe = m * T if p == 1 else (m - 1.0 / v) * T + W / v
        return pipe + self.after_step(s, names)

    def recompute_extra(self, s: Strategy, groups: tuple[str, ...]) -> list[float]:
        """Per stage, the least seconds a micro-batch spends re-running the forward of its
        fully recomputed layers (recompute_num_layers k: k per chunk, on s's own split), the
        lighter layer kind on the stage's group."""
        tk = _time_key(replace(s, recompute_num_layers=None))
        per = {g: min(_layer_time(self.model, tk, self.cluster.group(g).gpu, moe).recompute
                      for moe in self.model.layer_kinds)
               for g in set(groups)}
        return [s.vpp * min(s.recompute_num_layers, (b - a) // s.vpp) * per[groups[i]]
                for i, (a, b) in enumerate(s.stage_layer_ranges(self.model))]

    def block_candidate(self, s: Strategy, groups: tuple[str, ...], max_layers=None, tk=None) -> float:
        """Bound of a block-recompute candidate: its costs without recompute plus the re-run
        forward of its k layers per chunk. `tk`: the plain strategy's time key, if at hand."""
        plain = replace(s, recompute="none", recompute_num_layers=None)
        return self.candidate(plain, tk or _time_key(plain), groups, max_layers, extra_s=self.recompute_extra(s, groups))

    def after_step(self, s: Strategy, names, zero: int | None = None) -> float:
        """Least seconds after the pipeline drains (estimate's after-step term, max over
        stages): the optimizer step of the slowest stage takes at least the mean shard on the
        fastest GPU (Adam is memory-bound, affine in its bytes), and every stage exposes at
        least its last layer's per-step DP collectives (estimate: t_dp / n_layers, and t_dp is
        affine in the bytes, so t_dp / n >= the bandwidth term of one layer's share)."""
        z = s.zero_stage if zero is None else zero
        key = (s.tp, s.pp, s.dp, s.cp, s.ep, s.etp, z, s.offload_optimizer, tuple(names))
        v = self._after.get(key)
        if v is None:
            params, step_bytes, dp = self._after_terms(s, z)
            least_opt = 0.0 if s.offload_optimizer else min(
                C.optimizer_time(params / s.pp, self.cluster.group(g).gpu, step_bytes) for g in names)
            # every group hosts a stage; the stage with the largest optimizer shard pays at
            # least the smallest DP term
            v = self._after[key] = max(max(dp[g] for g in names), least_opt + min(dp[g] for g in names))
        return v

    def _after_terms(self, s: Strategy, z: int) -> tuple[float, float, dict]:
        """after_step's terms under ZeRO stage z: the optimizer-state parameters of the whole
        model one data-parallel rank holds (a stage holds 1/pp of them at the mean), Adam's
        bytes per parameter, and per node group one layer's share of the per-step DP
        collectives. They depend on the pipeline depth only through pp > 1 (the tied output
        layer's copy; placement's model axes are tp, ep and etp: pp splits by layers), so they
        are cached across depths and groups."""
        key = (s.tp, s.dp, s.cp, s.ep, s.etp, z, s.offload_optimizer, s.pp > 1)
        v = self._after_groups.get(key)
        if v is not None:
            return v
        if z != s.zero_stage:
            s = replace(s, zero_stage=z, overlap_param_gather=z >= 1)
        model = self.model
        placement = placement_of(s)
        all_stages = layer_range_params(model, s, 0, model.num_layers, True, True)
        params = placement.state_params("optimizer", all_stages)
        groups = self.cluster.node_groups
        # one layer's parameters per rank by group, the lighter layer kind present
        per_layer = {g: min(getattr(one_layer_params(model, moe), g) for moe in model.layer_kinds)
                     * placement.model_shard_factor(g) for g in ("dense", "norms", "experts")}
        dp = {}
        for g in groups:
            t = 0.0
            for dc in data_collectives(placement):
                if dc.when != "per-step":
                    continue
                if dc.group == "experts":
                    n, stride = s.expert_dp, s.expert_tp * s.ep
                else:
                    n, stride = s.dp * s.cp, s.tp
                msg = per_layer[dc.group] * (gradient_comm_bytes(s) if dc.tensor == "gradients"
                                             else param_gather_bytes(s))
                if n <= 1 or msg <= 0:
                    continue
                link = group_link([g], n, stride, self.cluster)
                t += collective_time(dc.kind, 2 * msg, n, link) - collective_time(dc.kind, msg, n, link)
            dp[g.name] = t
        v = self._after_groups[key] = (params, C.adam_step_bytes_per_param(s), dp)
        return v


# Relative slack when comparing summed work units (sums of the same floats in another order).
_UNITS_TOL = 1e-9
# A screened candidate goes back in the queue only when its bound rose by more than rounding.
_REQUEUE_SLACK = 1e-9


def _relaxed_minmax(stages: dict[tuple, int], units: float, n_min: int) -> float:
    """Least T such that the layers fit under it with at least n_min per stage, over real
    (fractional) layer splits. A stage (r seconds per work unit, f least seconds of one layer,
    e fixed seconds, cap most units its memory holds) takes >= r u + e for u <= cap work units,
    and >= n_min f + e as it holds n_min layers; `stages` maps each to how many stages share it.
    So T >= max(n_min f + e), and sum min(cap, (T - e)/r) >= units, whose left side is
    increasing and piecewise linear in T: solved exactly piece by piece."""
    items = [(r, e, cap, k) for (r, _, e, cap, _), k in stages.items()]
    floor = max(n_min * f + e for (_, f, e, _, _) in stages)
    need_units = units * (1 - _UNITS_TOL)   # caps that exactly hold the model are enough

    def held(T):
        return sum(k * min(cap, (T - e) / r) for r, e, cap, k in items)

    if held(floor) >= need_units:
        return floor
    T = floor
    # breakpoints where a stage fills its memory; between them the slope is the sum of 1/r
    # over the stages still filling
    for x in sorted(e + r * cap for r, e, cap, _ in items if e + r * cap > floor) + [float("inf")]:
        slope = sum(k / r for r, e, cap, k in items if e + r * cap > T)
        if slope <= 0:
            return T if held(T) >= need_units else float("inf")   # every stage is full
        need = (need_units - held(T)) / slope
        if T + need <= x:
            return T + need
        T = x
    return float("inf")


# Relative slack on a layer count computed from a time (floors of float quotients).
_COUNT_TOL = 1e-9


def _integer_minmax(stages: dict[tuple, int], n_layers: int, n_min: int) -> float:
    """Least T such that whole layers fit under it: a stage (f least seconds of one layer, e
    fixed seconds, at most n_cap layers in memory) holds at most min(n_cap, floor((T - e) / f))
    layers and at least n_min, and the stages must hold all n_layers. With a few layers per
    stage this is well above the fractional bound of _relaxed_minmax (61 layers on 24 stages
    need a stage of 3). The low end of the step is kept, where the layers do not fit, so the
    value returned never exceeds the true least T."""
    items = [(f, e, n_cap, k) for (_, f, e, _, n_cap), k in stages.items()]

    def held(T):
        return sum(k * min(n_cap, int((T - e) / f * (1 + _COUNT_TOL))) for f, e, n_cap, k in items)

    lo = max(n_min * f + e for f, e, _, _ in items)
    if held(lo) >= n_layers:
        return lo
    hi = max(max(n_cap, n_min) * f + e for f, e, n_cap, _ in items)
    if held(hi) < n_layers:
        return float("inf")
    return _step_low(held, n_layers, items, lo)


def _step_low(held, n_layers: int, items, lo: float) -> float:
    """The low end of the least T >= lo with held(T) >= n_layers (held(lo) < n_layers <=
    held(T) for some T): a T at which the layers still do not fit, the float just below the
    step where they do. held counts, for each of `items` (f seconds a layer, e fixed seconds,
    n_cap most layers, k stages alike), the j <= n_cap with e + j f / (1 + _COUNT_TOL) <= T:
    so that step is where the weighted count of those times above lo reaches what lo lacks.
    Rounding is settled against held itself, one float at a time."""
    f, e, cap, k = (np.array(x) for x in zip(*items))
    cap = cap.astype(np.int64)
    owner = np.repeat(np.arange(len(cap)), cap)
    j = np.arange(1, owner.size + 1) - np.repeat(np.cumsum(cap) - cap, cap)
    times = e[owner] + j * (f[owner] / (1 + _COUNT_TOL))
    above = times > lo
    times, weight = times[above], k[owner][above]
    order = np.argsort(times, kind="stable")
    reached = held(lo) + np.cumsum(weight[order])
    T = float(times[order][np.searchsorted(reached, n_layers)])
    while held(T) < n_layers:
        T = float(np.nextafter(T, np.inf))
    while T > lo and held(T) >= n_layers:
        T = float(np.nextafter(T, -np.inf))
    return max(T, lo)


def _mixed_count_minmax(stages: dict[tuple, int], n_layers: int, n_dense: int, lo: float) -> float:
    """Least T (>= lo, a T known not to exceed the optimum) at which whole layers of a model with
    n_dense dense and n_layers - n_dense MoE layers can fit: a stage (a MoE layer costs it a
    seconds, e fixed seconds, at most n_cap layers in memory) holding k MoE and d dense layers
    under T has k <= floor((T - e) / a) (dense layers cost >= 0) and k + d <= n_cap, and the
    d's sum to at most n_dense, so all stages hold at most
    sum min(n_cap, floor((T - e) / a)) + n_dense layers. Where memory forces many layers onto
    slow stages this is far above _integer_minmax, which prices every layer as the cheaper kind
    (DeepSeek-V3: 3 dense layers of 61). The low end is kept, as _integer_minmax does."""
    items = [(a, e, n_cap, k) for (a, e, n_cap), k in stages.items()]

    def held(T):
        return n_dense + sum(k * min(n_cap, max(0, int((T - e) / a * (1 + _COUNT_TOL)))) for a, e, n_cap, k in items)

    if held(lo) >= n_layers:
        return lo
    hi = max(lo, max(n_cap * a + e for a, e, n_cap, _ in items))   # every stage full
    if held(hi) < n_layers:
        return float("inf")
    return _step_low(held, n_layers, items, lo)


def _mixed_floor_rows(B, saves, n_dense: int, v, moe_only=None):
    """A lower bound on the slowest stage of a model with dense and MoE layers, per row of
    B (rows x stages; v: each row's vpp, an int or a rows x 1 array): stage i holds at least v
    layers, costing B[i] (its v MoE layers, ends and hops) if all are MoE, and each dense layer
    among them saves at most saves[i]. The model has only n_dense dense layers, so at most
    n_dense stages hold any (some stage outside them keeps its B: the (n_dense + 1)-th largest),
    and no stage saves on more than min(v, n_dense) layers; `moe_only` (rows x stages): stages no
    dense layer can reach (_Bounds.dense_ranks), which keep their B. (The floor of every layer at
    the cheaper kind, all a single-kind bound knows, is B - v saves.)"""
    B = np.asarray(B, dtype=float)
    low = (B - np.minimum(v, n_dense) * np.asarray(saves, dtype=float)).max(axis=1)
    p = B.shape[1]
    if p > n_dense:
        low = np.maximum(low, np.sort(B, axis=1)[:, p - 1 - n_dense])
    if moe_only is not None:
        low = np.maximum(low, np.where(moe_only, B, -np.inf).max(axis=1))
    return low


def _mixed_floor(B, saves, n_dense: int, v: int, moe_only=None) -> float:
    """_mixed_floor_rows of one row of stages."""
    return float(_mixed_floor_rows([B], saves, n_dense, v, None if moe_only is None else [moe_only])[0])


# ---- the search ------------------------------------------------------------------------------

def balanced_chunks(layers_per_stage: tuple[int, ...], vpp: int) -> tuple[int, ...] | None:
    """chunk_layers for a split whose ranks need not hold a multiple of vpp layers: each rank's
    chunks differ by at most one layer, the larger ones last (Megatron's layout order: segment
    k is chunk k // pp of rank k % pp). Later chunks hold no more micro-batches than earlier
    ones at any point of the interleaved schedule (forwards run chunk 0 first, backwards the
    last chunk first), so this arrangement has the least activation peak of the balanced ones.
    None when every rank's chunks are even (Megatron's --num-virtual-stages-per-pipeline-rank)."""
    if vpp == 1 or all(n % vpp == 0 for n in layers_per_stage):
        return None
    p = len(layers_per_stage)
    out = [0] * (p * vpp)
    for r, n in enumerate(layers_per_stage):
        base, extra = divmod(n, vpp)
        for c in range(vpp):
            out[c * p + r] = base + (1 if c >= vpp - extra else 0)
    return tuple(out)


def with_split(s: Strategy, split: tuple[int, ...] | None) -> Strategy:
    """s on layer split `split` (None: the default even split), with its chunk layout."""
    return s.with_(layers_per_stage=split, chunk_layers=None if split is None else balanced_chunks(split, s.vpp))


def _initial_split(model: ModelSpec, cluster: ClusterSpec, s: Strategy, groups: tuple[str, ...],
                   uneven: bool = True):
    """(valid, split): a starting split before the exact partition. Across node groups, layers
    in proportion to GPU speed; else even (split None: the default even split). With `uneven`
    a rank's layers need not divide by vpp (its chunks differ by one layer, balanced_chunks);
    else every rank holds a multiple of vpp. valid is False when no split is possible."""
    L, p, v = model.num_layers, s.pp, s.vpp
    if L < p * v or (not uneven and L % v):
        return False, None
    if cluster.is_heterogeneous and len(set(groups)) > 1:
        return True, _proportional_split(model, s, cluster, groups, 1 if uneven else v)
    if L % p == 0 and (uneven or (L // p) % v == 0):
        return True, None
    if uneven:
        # the extra layers go to the last stages, which hold fewer in-flight activations
        base, extra = divmod(L, p)
        return True, tuple(base + (1 if i >= p - extra else 0) for i in range(p))
    base, extra = divmod(L // v, p)
    return True, tuple(v * (base + (1 if i >= p - extra else 0)) for i in range(p))


# heap entry kinds
_FAMILY, _CELL, _CAND, _REQUEUED, _BLOCK, _DEFERRED = 0, 1, 2, 3, 4, 5


@dataclass
class _Family:
    """Degrees x micro-batch x recompute: every stage placement, vpp, ZeRO stage and order."""
    base: Strategy                 # vpp 1, no placement; recompute 'none' for a block family
    tk: Strategy
    block: bool
    vpps: tuple[int, ...]
    layouts: dict                  # stage counts per group -> stage orders
    count: int                     # candidates it stands for
    peak_lb: float = 0.0           # peak bytes per GPU no candidate of it goes below
    names: tuple | None = None     # the groups its layouts use, sorted (None: read from layouts)


@dataclass
class _Cell:
    family: _Family
    orders: tuple
    count: int
    step_lb: float                 # seconds no candidate of the cell beats
    usd_hour: float | None         # USD an hour of the GPUs its candidates are charged for


def _entry_count(kind: int, payload) -> int:
    """Candidates a queued entry stands for."""
    if kind == _FAMILY:
        return payload[6]
    if kind == _CELL:
        return payload.count
    if kind == _DEFERRED:
        return sum(n for _, _, _, n in payload)
    return 1


class _Plans:
    """The plans found so far: with `keep_dominated`, the best distinct ones; else the front of
    those no other found plan dominates (objective.dominates on Figures.point). `kth` is the
    K-th best objective among them: no plan worse than it can enter the top K. It may rise when
    a new plan dominates several (which is why entries above it are deferred, not dropped)."""

    def __init__(self, o: SearchOptions, tiered: bool | None = None):
        self.o = o
        self.top = max(o.top, 1)
        self.items: list = []         # (objective, point, order, Estimate, Figures), best first
        self.dominated_objs: list = []
        self._order = itertools.count()
        # safe by default: plans that fit only within the memory model's margin (TIGHT) are kept
        # apart, so the K-th best, the stop and dominance count only plans that fit with margin
        tiered = not o.allow_tight if tiered is None else tiered
        self.tight = _Plans(o, tiered=False) if tiered else None

    def offer(self, estimates: list[Estimate]) -> list[Estimate]:
        """Add the best of a candidate's fitting estimates (its splits): the fastest, or with
        tiers the fastest that fits with margin and the fastest TIGHT one when faster still.
        Returns those added."""
        if not estimates:
            return []
        key = (lambda x: x.step_time_s)
        if self.tight is None:
            picked = [min(estimates, key=key)]
        else:
            safe = [x for x in estimates if x.memory_verdict == "fits"]
            tight = [x for x in estimates if x.memory_verdict == "tight"]
            picked = [min(safe, key=key)] if safe else []
            if tight and (not picked or min(tight, key=key).step_time_s < picked[0].step_time_s):
                picked.append(min(tight, key=key))
        for e in picked:
            fig = figures(e, charge_idle=self.o.charge_idle)
            if self.tight is not None and e.memory_verdict == "tight":
                self.tight.add(e, fig)
            else:
                self.add(e, fig)
        return picked

    def kth(self) -> float:
        return self.items[self.top - 1][0] if len(self.items) >= self.top else float("inf")

    def best(self):
        return self.items[0] if self.items else None

    def add(self, e: Estimate, fig) -> None:
        obj, pt = fig.objective(self.o.objective), fig.point
        item = (obj, pt, next(self._order), e, fig)
        if self.o.keep_dominated:
            self.items.append(item)
            self.items.sort(key=lambda x: x[:3])
            del self.items[self.top:]
            return
        if any(dominates(x[1], pt) for x in self.items):
            self.dominated_objs.append(obj)
            return
        self.dominated_objs.extend(x[0] for x in self.items if dominates(pt, x[1]))
        self.items = [x for x in self.items if not dominates(pt, x[1])] + [item]
        self.items.sort(key=lambda x: x[:3])

    def dominate(self, step_lb: float, gpus: int, usd_step_lb: float, peak_lb) -> bool:
        """Whether a found plan dominates every plan of an entry whose plans take at least
        step_lb seconds, exactly `gpus` GPUs, at least usd_step_lb dollars a step and at least
        peak_lb bytes on some GPU (peak_lb may be a function: it is called only when a found
        plan already matches the other figures)."""
        if self.o.keep_dominated:
            return False
        near = [x[1] for x in self.items if x[1][0] <= step_lb and x[1][2] <= gpus and x[1][3] <= usd_step_lb]
        if not near:
            return False
        peak = memory_figure(peak_lb() if callable(peak_lb) else peak_lb)
        return any(p[1] <= peak for p in near)


def _zero_options(o: SearchOptions) -> list[int]:
    fixed = dict(o.fixed)
    return [fixed["zero"]] if "zero" in fixed else list(o.zero_stages)


def _family_specs(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, layouts_of):
    """Every family of the space: (tp, cp, pp, dp, ep, etp, mbs, micro-batches, recompute,
    block, vpps, candidates). `layouts_of(per_stage, pp)` gives the stage orders a pipeline of
    that shape has under o's GPU budget (0: none)."""
    fixed = dict(o.fixed)
    L = model.num_layers
    mbs_opts = [fixed["mbs"]] if "mbs" in fixed else list(MICRO_BATCHES)
    rec_opts = [fixed["recompute"]] if "recompute" in fixed else list(o.recompute)
    n_zero = len(_zero_options(o))
    vpp_opts = [fixed["vpp"]] if "vpp" in fixed else list(VPP_CHOICES)
    block_ok = "full" in rec_opts and o.partial_recompute and "recompute" not in fixed
    for tp, cp, pp, dp, ep, etp in enumerate_space(model, cluster, o):
        n_orders = layouts_of(tp * cp * dp, pp)
        if not n_orders:
            continue
        for mbs in mbs_opts:
            if o.global_batch_size % (mbs * dp):
                continue
            m = o.global_batch_size // (mbs * dp)
            vpps = [v for v in vpp_opts
                    if v == 1 or (pp >= 2 and m % pp == 0 and "interleaved" in o.schedules
                                  and L >= pp * v and (o.uneven_chunks or L % v == 0))]
            for rec in rec_opts + (["block"] if block_ok else []):
                block = rec == "block"
                # a block family is bounded as if nothing were recomputed (its candidates add the
                # recompute of their k layers per chunk); its chunks stay even
                vh = tuple(v for v in vpps if L % v == 0 and L // pp // v >= 2) if block else tuple(vpps)
                count = n_orders * len(vh) * n_zero
                if count:
                    yield tp, cp, pp, dp, ep, etp, mbs, m, rec, block, vh, count


def space_worlds(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions) -> dict[int, int]:
    """World size -> candidates of that size in the space (empty: no plan can be built)."""
    cache: dict = {}

    def layouts_of(per, pp):
        if (per, pp) not in cache:
            cache[per, pp] = sum(len(v) for v in stage_layouts(cluster, per, pp, o.budget).values())
        return cache[per, pp]

    out: dict = {}
    for tp, cp, pp, dp, *_, count in _family_specs(model, cluster, o, layouts_of):
        out[tp * cp * pp * dp] = out.get(tp * cp * pp * dp, 0) + count
    return out


def search(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, progress=None) -> SearchResult:
    """The top o.top plans of the space under the cost model, best first by o.objective: with
    o.keep_dominated the best distinct plans, else the best of those no plan of the space
    dominates. `progress`, if given, is called with a SearchProgress every
    PROGRESS_INTERVAL_S seconds."""
    # The search keeps 10^5-10^6 small tuples alive (families, queue entries, cache keys), and
    # every cyclic garbage collection walks them all: 30% of DeepSeek-V3's search on mixed-512
    # (14.5 s -> 10.3 s without it, measured side by side). It makes no reference cycles that
    # must be freed while it runs, so collection waits until it returns.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _search(model, cluster, o, progress)
    finally:
        if was_enabled:
            gc.enable()


def _search(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, progress) -> SearchResult:
    t0 = time.perf_counter()
    if model.position_embedding_type == "learned_absolute" and o.seq_length > model.max_position_embeddings:
        raise PlannerError(f"--seq-length {o.seq_length} exceeds the learned position table of {model.name} "
                           f"(max_position_embeddings {model.max_position_embeddings}); no plan can run it")
    check_objective(cluster, o.objective, o.charge_idle)
    res = SearchResult(plans=[], solver=o.solver, objective=o.objective)
    if o.seq_length > model.max_position_embeddings:
        # rotary models run any length, but past the one they were built for they need their
        # positions rescaled or long-context training: say so rather than emit it silently
        _warn(res.warnings, f"--seq-length {o.seq_length} exceeds {model.name}'s max_position_embeddings "
                            f"({model.max_position_embeddings}); launches set --max-position-embeddings "
                            f"{o.seq_length}. Past its trained length a RoPE model needs rope scaling "
                            "(--use-rope-scaling --rope-scaling-factor) or a long-context stage")
    bounds = _Bounds(model, cluster)
    zero_opts = _zero_options(o)
    heap: list = []   # (objective bound, tie, kind, payload)
    tie = itertools.count()
    layouts_cache: dict = {}
    plans = _Plans(o)
    kth_best = plans.kth
    tokens_per_step = o.global_batch_size * o.seq_length
    priced_cluster = cluster.is_priced

    def usd_hour(counts: tuple, per: int) -> float | None:
        used = {g.name: c * per for g, c in zip(cluster.node_groups, counts)}
        return usd_per_hour(cluster, used, o.charge_idle)

    def objective_lb(step_lb: float, usd_h) -> float:
        """A bound on the objective from a bound on step time and the GPUs charged: the cost
        per token is the charged USD per hour times the step time over the tokens per step."""
        if o.objective == "cost":
            return usd_per_million_tokens(usd_h, step_lb, tokens_per_step)
        return step_lb

    def usd_step(step_lb: float, usd_h) -> float:
        return usd_h * step_lb if priced_cluster and usd_h is not None else 0.0

    def push_or_defer(items: list, deferred: list) -> None:
        """Queue each (objective bound, kind, payload, count) that can still enter the top K;
        keep the others as one deferred entry (the K-th best can rise, see _Plans)."""
        kth = kth_best()
        for it in items:
            if it[0] <= kth:
                heapq.heappush(heap, (it[0], next(tie), it[1], it[2]))
            else:
                deferred.append(it)

    def defer(deferred: list) -> None:
        if deferred:
            heapq.heappush(heap, (min(it[0] for it in deferred), next(tie), _DEFERRED, deferred))

    # 1. families: degrees x micro-batch x recompute, screened by memory all at once
    # (family_screen.py), and those that may fit bounded over all their stage placements.
    # A family is a tuple until it is reached; its Strategy is built from its time class's.
    classes: dict = {}

    def layouts_of(per: int, pp: int) -> int:
        lkey = (per, pp)
        if lkey not in layouts_cache:
            lay = stage_layouts(cluster, per, pp, o.budget)
            usd = {counts: usd_hour(counts, per) for counts in lay}
            known = [u for u in usd.values() if u is not None]
            caps = bounds.stage_caps(per, pp, lay)
            layouts_cache[lkey] = (lay, sum(len(v) for v in lay.values()), caps,
                                   usd, min(known) if known and len(known) == len(usd) else None,
                                   tuple(sorted(g for g, c in caps.items() if c > 0)))
        return layouts_cache[lkey][1]

    screen = FamilyScreen(model, cluster, zero_opts, o.uneven_chunks)
    specs = []
    for tp, cp, pp, dp, ep, etp, mbs, m, rec, block, vh, count in _family_specs(model, cluster, o, layouts_of):
        lkey = (tp * cp * dp, pp)
        ckey = (tp, cp, ep, etp, mbs, "none" if block else rec)
        cls = classes.get(ckey)
        if cls is None:
            ts = Strategy(tp=tp, cp=cp, ep=ep, etp=etp, micro_batch_size=mbs,
                          global_batch_size=o.global_batch_size, seq_length=o.seq_length,
                          recompute=ckey[5], sequence_parallel=tp > 1, precision=o.precision,
                          overlap_grad_reduce=True)
            cls = classes[ckey] = (ts, _time_key(ts))
        res.candidates += count
        screen.add(cls[0], ckey, pp, dp, m, block, max(vh), layouts_cache[lkey][5])
        specs.append((cls, pp, dp, block, vh, lkey, count, m))
    may_fit, peak_lbs = screen.run()
    for i in np.flatnonzero(may_fit):
        cls, pp, dp, block, vh, lkey, count, m = specs[i]
        _, _, caps, _, usd_min, cap_names = layouts_cache[lkey]
        lb = bounds.family(cls[0], cls[1], pp, m, lkey[0], caps, max(vh), cap_names)
        heapq.heappush(heap, (objective_lb(lb, usd_min), next(tie), _FAMILY,
                              (cls, pp, dp, block, vh, lkey, count, lb, float(peak_lbs[i]))))
    unfit = np.flatnonzero(~may_fit)
    res.pruned_memory += sum(specs[i][6] for i in unfit)
    # 2. best first: families -> cells -> candidates -> priced plans, until the K-th best plan
    # is better than every bound left
    seen: set = set()
    rank_fits: dict = {}    # _fits_exactly's verdicts per rank, shared by block candidates
    screen_terms: dict = {}  # _memory_screen's terms per family and ZeRO stage
    screened_out: list = []  # candidates the memory screen ruled out before any plan was found
    closest = None
    done = 0
    last_report = t0

    while heap:
        lb, _, kind, payload = heap[0]
        kth = kth_best()
        if lb > kth:
            break
        now = time.perf_counter()
        if now - t0 > o.time_limit_s:
            res.status = "time-limit"
            # nothing left in the queue can beat its lowest bound: the optimum is >= min(top, lb)
            best = plans.best()
            res.optimality_gap = (max(res.optimality_gap, (best[0] - lb) / best[0] if best[0] > 0 else 0.0, 0.0)
                                  if best else 1.0)
            _warn(res.warnings, f"search stopped at its {o.time_limit_s:g} s time limit; "
                                f"the plans are the best of those priced")
            break
        if progress is not None and now - last_report >= PROGRESS_INTERVAL_S:
            last_report = now
            best = plans.best()
            progress(SearchProgress(candidates=res.candidates, reached=done, priced=res.priced,
                                    best=best[0] if best else None, best_step_s=best[3].step_time_s if best else None,
                                    bound=lb, seconds=now - t0))
        heapq.heappop(heap)
        if kind == _DEFERRED:
            # the K-th best rose since these were set aside: queue those that can now enter
            deferred: list = []
            push_or_defer(payload, deferred)
            defer(deferred)
            continue
        if kind == _FAMILY:
            (ts, tk), pp, dp, block, vh, lkey, count, step_lb, peak_lb = payload
            layouts, _, _, usd, usd_min, cap_names = layouts_cache[lkey]
            # a group has stages in some layout exactly when its cap is > 0
            fam = _Family(ts.with_(pp=pp, dp=dp), tk, block, vh, layouts, count, peak_lb, names=cap_names)
            if plans.dominate(step_lb, fam.base.world_size, usd_step(step_lb, usd_min), fam.peak_lb):
                res.pruned_dominated += fam.count
                continue
            items = []
            for counts, orders in fam.layouts.items():
                n = len(orders) * len(fam.vpps) * len(zero_opts)
                cb = bounds.cell(fam.base, fam.tk, orders[0], fam.vpps, zero_opts)
                cell = _Cell(fam, tuple(orders), n, cb, usd[counts])
                items.append((objective_lb(cb, usd[counts]), _CELL, cell, n))
            deferred = []
            push_or_defer(items, deferred)
            defer(deferred)
            continue
        if kind == _CELL:
            cell = payload
            fam = cell.family
            if plans.dominate(cell.step_lb, fam.base.world_size, usd_step(cell.step_lb, cell.usd_hour), fam.peak_lb):
                res.pruned_dominated += cell.count
                continue
            child = _BLOCK if fam.block else _CAND
            items = [(objective_lb(b, cell.usd_hour), child, (fam, vpp, z, groups, b, cell.usd_hour), 1)
                     for b, vpp, z, groups in bounds.children(fam.base, fam.tk, cell.orders, fam.vpps, zero_opts)]
            deferred = []
            push_or_defer(items, deferred)
            defer(deferred)
            continue
        if kind in (_BLOCK, _CAND):
            fam, _, _, _, step_lb, usd_h = payload
            if plans.dominate(step_lb, fam.base.world_size, usd_step(step_lb, usd_h), fam.peak_lb):
                res.pruned_dominated += 1
                continue
        if kind == _BLOCK:
            # a block-recompute child: on its starting split (the partition assumes every layer
            # recomputed alike, so it is not re-solved), more recomputed layers only cost time
            # and save memory, so the smallest k that fits dominates every larger k
            c, groups = _child(payload, cluster, uneven=False)
            valid, split = _initial_split(model, cluster, c, groups, uneven=False)
            per_chunk = min(split or c.stage_layers(model)) // c.vpp
            ck = _least_block_recompute(model, cluster, c.with_(recompute="full", layers_per_stage=split),
                                        per_chunk - 1, rank_fits)
            if ck is None:
                res.pruned_memory += 1
                continue
            b = bounds.block_candidate(ck, groups, tk=payload[0].tk)
            heapq.heappush(heap, (objective_lb(b, usd_h), next(tie), _REQUEUED, (ck, b, usd_h, fam.peak_lb)))
            continue
        if kind == _CAND:
            c, groups = _child(payload, cluster, uneven=o.uneven_chunks)
            valid, split = _initial_split(model, cluster, c, groups, o.uneven_chunks)
            c = with_split(c, split)
            done += 1
            may_fit, n_max, peak_lb = _memory_screen(model, cluster, c, uneven=o.uneven_chunks,
                                                     dense_reach=bounds.dense_ranks(c.pp, c.vpp),
                                                     terms=screen_terms.setdefault((fam.base, c.zero_stage), {}))
            if not may_fit:
                res.pruned_memory += 1
                if not plans.items:
                    screened_out.append(c)
                continue
            # with the layers each stage can hold, the bound may rise: queue it again
            b2 = bounds.candidate(c, payload[0].tk, groups, n_max)
            if plans.dominate(b2, c.world_size, usd_step(b2, usd_h), peak_lb):
                res.pruned_dominated += 1
                continue
            lb2 = objective_lb(b2, usd_h)
            if lb2 > lb * (1 + _REQUEUE_SLACK):
                heapq.heappush(heap, (lb2, next(tie), _REQUEUED, (c, b2, usd_h, peak_lb)))
                continue
        else:   # _REQUEUED
            c, step_lb, usd_h, peak_lb = payload
            if plans.dominate(step_lb, c.world_size, usd_step(step_lb, usd_h), peak_lb):
                res.pruned_dominated += 1
                continue
            if c.recompute_num_layers is not None:
                done += 1
                if not _fits_exactly(model, cluster, c, rank_fits):
                    res.pruned_memory += 1
                    continue
        fitting, short = _price(model, cluster, c, "dp", res, o.uneven_chunks, safe_split=not o.allow_tight)
        if c.recompute_num_layers is not None and not o.allow_tight:
            fitting += _safe_block_variant(model, cluster, c, fitting, rank_fits, res)
        if not fitting:
            if short is not None and (closest is None or short[0] < closest[0]):
                closest = short
            continue
        seen.update(x.strategy for x in plans.offer([x for x in fitting if x.strategy not in seen]))
    res.pruned_bound += sum(_entry_count(k, p) for _, _, k, p in heap)
    found = [x[3] for x in plans.items[:o.top]]
    if o.solver.startswith("ilp"):
        found = _ilp_cross_check(model, cluster, found, o.solver, res, o.uneven_chunks, safe=not o.allow_tight)
        again = _Plans(o, tiered=False)
        for e in found:
            again.add(e, figures(e, charge_idle=o.charge_idle))
        plans.items = again.items
    res.plans = [x[3] for x in plans.items[:o.top]]
    res.plan_figures = [x[4] for x in plans.items[:o.top]]
    if res.plans:
        last = plans.items[min(o.top, len(plans.items)) - 1][0]
        res.hidden_dominated = sum(1 for x in plans.dominated_objs if x <= last)
    if plans.tight is not None and plans.tight.items:
        tight = plans.tight.items
        if not plans.items or tight[0][0] < plans.items[0][0]:
            res.fastest_tight = tight[0][3]
        # fewer than K plans fit with margin: the best TIGHT ones close the list
        fill = tight[:max(o.top - len(res.plans), 0)]
        res.tight_listed = len(fill)
        res.plans += [x[3] for x in fill]
        res.plan_figures += [x[4] for x in fill]
    if not res.plans:
        # the closest-plan report: the exact shortfall of each candidate the screen ruled out
        # (computed only now, as most searches find a plan)
        for c in screened_out:
            short = max(m.total - m.capacity for m in _stage_memories(model, cluster, c))
            if closest is None or short < closest[0]:
                closest = (short, c)
    if not res.plans and closest is None:
        # the families memory ruled out with the least peak bytes, their candidates tried
        near = unfit[np.argsort(screen.peaks(unfit), kind="stable")[:_CLOSEST_FAMILIES]]
        closest = _closest_of(model, cluster, [_spec_family(specs[i], layouts_cache) for i in near], zero_opts)
    if not res.plans and closest is not None:
        try:
            res.closest = closest[1] if isinstance(closest[1], Estimate) else estimate(model, cluster, closest[1])
        except InvalidStrategy:
            res.closest = None   # the nearest miss breaks a structure rule: no plan to show
    if res.plans and cluster.is_heterogeneous:
        used = set(res.plans[0].stage_groups)
        res.idle_groups = [g.name for g in cluster.node_groups if g.name not in used]
    res.seconds = time.perf_counter() - t0
    return res


# Families ruled out by memory whose smallest candidate is tried for the closest-plan report.
_CLOSEST_FAMILIES = 32


def _spec_family(spec: tuple, layouts_cache: dict) -> _Family:
    """The _Family of one of search's family tuples."""
    (ts, tk), pp, dp, block, vh, lkey, count, _ = spec
    layouts, *_, cap_names = layouts_cache[lkey]
    return _Family(ts.with_(pp=pp, dp=dp), tk, block, vh, layouts, count, names=cap_names)


def _closest_of(model, cluster, families: list, zeros) -> tuple | None:
    """(bytes short, strategy) of the family candidate closest to fitting: each family's first
    placement at vpp 1 under each ZeRO stage, on its starting split."""
    best = None
    for fam in families:
        orders = next(iter(fam.layouts.values()))
        for z in zeros:
            c, groups = _child((fam, 1, z, orders[0]), cluster, uneven=False)
            if fam.block:
                c = replace(c, recompute="full")
            valid, split = _initial_split(model, cluster, c, groups, uneven=False)
            if not valid:
                continue
            c = with_split(c, split)
            short = max(m.total - m.capacity for m in _stage_memories(model, cluster, c))
            if best is None or short < best[0]:
                best = (short, c)
    return best


def _child(payload, cluster: ClusterSpec, uneven: bool) -> tuple[Strategy, tuple[str, ...]]:
    """The Strategy of a queued candidate (built only when it is reached)."""
    fam, vpp, z, groups = payload[:4]
    c = fam.base.with_(vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b", zero_stage=z,
                       overlap_param_gather=z >= 1, stage_node_groups=groups if cluster.is_heterogeneous else None)
    return c, groups


def peak_bytes_lower_bound(fixed, per, mult, n_layers: int, least: int, slack: int) -> float:
    """Bytes that some stage of any layer split holds at least. Stage i (`mult[i]` stages alike)
    holds >= fixed[i] + e per[i] bytes with e = its layers less `slack` (an uneven rank of n
    layers keeps at least its even v floor(n / v) >= n - (v - 1): slack v - 1), each stage at
    least `least` layers, all stages n_layers. If every stage held less than T, the effective
    layers would sum below sum (T - fixed) / per, so max_i >= the T at which that sum is
    n_layers - (stages x slack); and each stage >= fixed + (least - slack) per."""
    n_stages = sum(mult)
    inv = sum(k / q for k, q in zip(mult, per))
    spread = (n_layers - n_stages * slack + sum(k * f / q for k, f, q in zip(mult, fixed, per))) / inv
    floor = max(f + max(least - slack, 0) * q for f, q in zip(fixed, per))
    return max(spread, floor, max(fixed))


def _stage_gpu(cluster: ClusterSpec, s: Strategy, i: int):
    """The GPU of pipeline stage i (search candidates sit on one node group per stage)."""
    return cluster.group(s.stage_node_groups[i]).gpu if s.stage_node_groups else cluster.node_groups[0].gpu


def _stage_memories(model, cluster, s: Strategy) -> list:
    placement = placement_of(s)
    return [stage_memory(model, s, placement, i, _stage_gpu(cluster, s, i)) for i in range(s.pp)]


def _fits_exactly(model, cluster, s: Strategy, rank_fits: dict | None = None, safe: bool = False) -> bool:
    """Whether every pipeline rank fits (with `safe`, with the memory model's margin), the first
    rank first (it keeps the most micro-batches in flight), stopping at a miss. `rank_fits`
    caches each rank's verdict: a rank's memory is set by the strategy but for the split and
    placement (kept when the chunks are uneven), its GPU and its own layers, so candidates
    that differ only in the other ranks share it."""
    ok = ("fits",) if safe else ("fits", "tight")
    placement = placement_of(s)
    ranges = s.stage_layer_ranges(model)
    base = None
    for i in range(s.pp):
        gpu = _stage_gpu(cluster, s, i)
        if rank_fits is None:
            verdict = stage_memory(model, s, placement, i, gpu).verdict
        else:
            if base is None:
                base = s.with_(stage_node_groups=None,
                               layers_per_stage=None if s.chunk_layers is None else s.layers_per_stage)
            key = (base, i, gpu.name, ranges[i])
            verdict = rank_fits.get(key)
            if verdict is None:
                verdict = rank_fits[key] = stage_memory(model, s, placement, i, gpu).verdict
        if verdict not in ok:
            return False
    return True


def _least_block_recompute(model, cluster, s: Strategy, k_max: int, rank_fits: dict | None = None,
                           safe: bool = False):
    """The strategy with the fewest fully recomputed layers per chunk (1..k_max) that fits (with
    `safe`, with the memory model's margin), or None. Memory falls and time rises with k, so
    this k is the only one worth pricing. `rank_fits`: _fits_exactly's cache."""
    if k_max < 1:
        return None
    c = s.with_(recompute_num_layers=k_max)
    try:
        check_structure(c, model)
    except InvalidStrategy:
        return None
    if not _fits_exactly(model, cluster, c, rank_fits, safe):
        return None
    lo, hi = 1, k_max
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits_exactly(model, cluster, s.with_(recompute_num_layers=mid), rank_fits, safe):
            hi = mid
        else:
            lo = mid + 1
    return s.with_(recompute_num_layers=lo)


def _safe_block_variant(model, cluster, c: Strategy, fitting: list, rank_fits: dict, res: SearchResult) -> list:
    """Safe by default, for a block-recompute candidate whose least k fits only TIGHT: the least
    k that fits with margin (more recomputed layers per chunk), as another plan of the same
    candidate ([] when there is none or it is not needed)."""
    if not fitting or any(x.memory_verdict == "fits" for x in fitting):
        return []
    k_max = min(c.stage_layers(model)) // c.vpp - 1
    safe = _least_block_recompute(model, cluster, c, k_max, rank_fits, safe=True)
    if safe is None or safe == c:
        return []
    e = estimate(model, cluster, safe)
    res.priced_estimates.append(e)
    return [e] if e.fits else []


def _memory_screen(model: ModelSpec, cluster: ClusterSpec, s: Strategy, uneven: bool = True,
                   dense_reach: frozenset | None = None, terms: dict | None = None):
    """(may fit, most layers each stage can hold, a lower bound on the peak bytes per GPU of
    any split). Stage i holds at most n_i = (capacity - fixed) / per-layer layers (a
    multiple of vpp), with the lower bounds of cost/memory.py, so a split can only fit if every
    n_i >= vpp and the n_i reach the model's layers. Per-layer bytes are the lighter layer
    kind's, but on ranks no dense layer can reach (`dense_reach`, _Bounds.dense_ranks: the
    ranks that can) a MoE layer's. `uneven`: splits whose ranks need not hold a multiple of vpp layers
    are searched (the peak bound allows for them). `terms`: a cache of the per-GPU and per-end
    terms, shared by candidates that differ only in vpp, split and stage placement (none of
    these terms depends on them)."""
    if s.recompute_num_layers is not None:
        # block recompute is priced on its own split: its memory is known exactly
        mems = _stage_memories(model, cluster, s)
        return all(m.fits for m in mems), list(s.stage_layers(model)), max(m.total for m in mems)
    p, v, kinds = s.pp, s.vpp, model.layer_kinds
    # the terms of layer_memory_bytes, stage_fixed_bytes_parts and allocatable_bytes that do not
    # depend on the rank, once per layer kind, end shape and GPU; then every rank at once
    if s.stage_node_groups:   # each rank's GPU, as _stage_gpu gives it
        order = list(dict.fromkeys(s.stage_node_groups))
    else:
        order = [cluster.node_groups[0].name]
    gi = np.array([order.index(g) for g in s.stage_node_groups]) if s.stage_node_groups else np.zeros(p, int)
    terms = {} if terms is None else terms
    if "parts" not in terms:
        placement = terms["placement"] = placement_of(s)
        shapes = [(True, p == 1)] + ([(False, False)] if p > 2 else []) + ([(False, True)] if p > 1 else [])
        terms["parts"] = np.array([stage_fixed_bytes_parts(model, s, placement, *e) for e in shapes])
        terms["kept"] = np.array([layer_kept_activation_bytes(model, s, k) for k in kinds])
    for g in order:
        if g not in terms:
            gpu = cluster.group(g).gpu
            terms[g] = (allocatable_bytes(model, s, gpu),
                        [layer_state_bytes(model, s, terms["placement"], k, gpu) for k in kinds])
    alloc = np.array([terms[g][0] for g in order])[gi]
    states = np.array([terms[g][1] for g in order])[gi]
    kept, parts = terms["kept"], terms["parts"]
    shape = np.full(p, len(parts) - 2 if p > 2 else 0)
    shape[0], shape[-1] = 0, len(parts) - 1
    flight = np.array([in_flight_microbatches(s, i) for i in range(p)])
    per_kind = states + kept[None, :] * flight[:, None]                # (ranks, kinds)
    per = per_kind.min(axis=1)
    fixed = parts[shape, 0] + parts[shape, 1] * flight
    free = alloc - fixed
    room_per = per
    mixed = len(kinds) > 1
    if mixed:
        moe_per = per_kind[:, kinds.index(True)]
        # MoE layers all ranks together can hold (whatever dense layers they hold)
        moe_rooms = int(np.maximum(free // moe_per, 0).sum()) + p * (v - 1)
        if dense_reach is not None:
            room_per = np.where([i in dense_reach for i in range(p)], per, moe_per)
    room = np.maximum(free // room_per, 0).astype(np.int64) // v * v
    # a rank of n layers, n not a multiple of vpp, keeps at least the activations of the even
    # vpp floor(n / vpp) layers below it (its chunks only grow)
    room = np.where(room >= v, room + v - 1, room)
    n_max = room.tolist()
    may_fit = bool((room >= v).all()) and sum(n_max) >= model.num_layers and \
        (not mixed or moe_rooms >= model.num_moe_layers)
    peak = peak_bytes_lower_bound(fixed.tolist(), per.tolist(), [1] * s.pp, model.num_layers, s.vpp,
                                  s.vpp - 1 if uneven else 0)
    return may_fit, n_max, peak


def _price(model, cluster, s: Strategy, solver: str, res: SearchResult, uneven: bool = True,
           safe_split: bool = False):
    """Estimate one candidate and re-split its layers exactly. Returns (the estimates that fit,
    (bytes short, estimate) when none does). With `safe_split`, when the fastest split is
    TIGHT the layers are split again within each stage's room with the memory model's margin
    (the plan that fits safely may be another split of the same candidate)."""
    try:
        e = estimate(model, cluster, s)
    except InvalidStrategy:
        res.invalid += 1
        return [], None
    res.priced += 1
    res.priced_estimates.append(e)
    fitting = [e] if e.fits else []
    for safe in (False, True):
        if safe and (not safe_split or not fitting
                     or min(fitting, key=lambda x: x.step_time_s).memory_verdict != "tight"):
            break
        gaps: list = []
        s2, used = refine_partition(model, cluster, s, e, solver, res.warnings, gaps, uneven, safe)
        if used != "none":
            res.solver = used
        res.optimality_gap = max([res.optimality_gap] + gaps)
        e2 = _estimate_split(model, cluster, s, s2)
        if e2 is not None:
            res.priced_estimates.append(e2)
            if e2.fits:
                fitting.append(e2)
    if fitting:
        return fitting, None
    return [], (_short(e), e)


def _estimate_split(model, cluster, s: Strategy, s2):
    """The estimate of a re-split strategy s2, or None if there is none or it is s's own split."""
    if s2 is None or s2.layers_per_stage == s.stage_layers(model):
        return None
    try:
        return estimate(model, cluster, s2)
    except InvalidStrategy:
        return None


def _ilp_cross_check(model, cluster, plans: list[Estimate], solver: str, res: SearchResult,
                     uneven: bool = True, safe: bool = False) -> list[Estimate]:
    """--solver ilp: the search prices with the exact DP (milliseconds a candidate); the top
    plans' splits are then solved again as an ILP, which agrees unless a solver limit hit.
    `safe`: a plan that fits with margin is replaced only by a split that does too."""
    out = []
    for e in plans:
        keep_safe = safe and e.memory_verdict == "fits"
        s2, used = refine_partition(model, cluster, e.strategy, e, solver, res.warnings, uneven=uneven,
                                    safe=keep_safe)
        if used.startswith("ilp"):
            res.solver = f"dp, checked by {used}"
        e2 = _estimate_split(model, cluster, e.strategy, s2)
        ok = e2 is not None and (e2.memory_verdict == "fits" if keep_safe else e2.fits)
        out.append(e2 if ok and e2.step_time_s < e.step_time_s else e)
    return sorted(out, key=lambda x: x.step_time_s)


def _short(e: Estimate) -> float:
    return max(m.total - m.capacity for m in e.memory)
