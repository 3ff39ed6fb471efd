"""`planner plan`: enumerate degrees, micro-batch, recompute, ZeRO stage, virtual stages and the
placement of stages on node groups; prune by memory, then by a compute lower bound; price the
survivors with the full estimate; re-partition the layers of the best ones exactly (DP, or
ILP), and return the top K plans that fit."""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import InvalidStrategy, PlannerError
from ..estimate import Estimate, _layer_time, _time_key, estimate
from ..cost.parallel import (ep_layer_collectives, ep_layer_exposed_s, pp_gather_s, pp_message_bytes, tp_layer_collectives,
                             tp_layer_exposed_s)
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy, check_structure
from ..cost import compute as C
from ..cost.activations import BYTES_16BIT
from ..cost.comm import collective_time, group_link, p2p_link
from ..cost.memory import (allocatable_bytes, gradient_comm_bytes, layer_memory_bytes, layer_range_params,
                           one_layer_params, param_gather_bytes,
                           stage_fixed_bytes_lower_bound, stage_memory)
from ..placement import data_collectives, placement_of
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
# Plans use more than this fraction of the GPUs of the node groups they run on (a plan on fewer
# leaves the rest idle). On a heterogeneous cluster whole node groups may stay idle: a plan on
# the fast GPUs alone is in the space, so the search says when the slow ones cannot help.
MIN_GPU_FRACTION = 0.5
# Refuse a space of more cells than this (bounded time and memory: every cell is bounded
# up front; its candidates are only built when the cell's bound is reached).
MAX_CELLS = 200_000


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
    priced_estimates: list = field(default_factory=list)   # every estimate made (for the scatter plot)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pow2_upto(n: int) -> list[int]:
    out, x = [], 1
    while x <= n:
        out.append(x)
        x *= 2
    return out


def stage_layouts(cluster: ClusterSpec, per_stage: int, pp: int) -> dict[tuple[int, ...], list[tuple[str, ...]]]:
    """Ways to put pp stages of `per_stage` GPUs on node groups, keyed by how many stages each
    group hosts. Stages of one group are contiguous, groups come in every order (the first
    stages hold the most activations). Each group used hosts as many stages as it can hold,
    except at most one partly used group (leaving GPUs of two groups idle at once is never
    needed to use the fast ones fully, and it keeps the space small on many-group clusters),
    each group's stages fill whole nodes, and the stages use more than MIN_GPU_FRACTION of the
    used groups' GPUs."""
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
            if whole and 1 <= counts[partial] <= caps[partial] and pp * per_stage > MIN_GPU_FRACTION * used_gpus:
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
    return out


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
    for key, vals in (("tp", tps), ("cp", cps), ("ep", eps), ("pp", pps)):
        if key in fixed:
            vals[:] = [fixed[key]]
    batch_divisors = _divisors(o.global_batch_size)
    for tp in tps:
        for cp in cps:
            if tp > 1 and o.seq_length % (cp * tp):
                continue   # sequence parallelism (on whenever tp > 1) would break: check_structure
            for pp in pps:
                base = tp * cp * pp
                if base > N:
                    break
                dps = [d for d in batch_divisors if base * d <= N and base * d > MIN_GPU_FRACTION * n_min]
                if "dp" in fixed:
                    dps = [fixed["dp"]]
                for dp in dps:
                    per = tp * cp * dp
                    for ep in eps:
                        # expert-TP: 1 (experts whole, the usual choice with EP) or the dense TP
                        # (Megatron's default when --expert-tensor-parallel-size is unset)
                        etps = (([1] + ([tp] if tp > 1 else [])) if model.is_moe else [None])
                        if "etp" in fixed and model.is_moe:
                            etps = [fixed["etp"]]
                        for etp in etps:
                            if model.is_moe and (per % (etp * ep) or (pp * per) % (etp * ep * pp)):
                                continue
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
    each stage (embedding, output layer, PP traffic) as fixed extras. Layers of one kind (dense
    or MoE) cost the same, so each row is filled from two values."""
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
        cap[i] = mem.capacity
    return PartitionProblem(lt, lm, et, em, cap, s.num_microbatches, s.vpp)


def refine_partition(model, cluster, s: Strategy, e: Estimate, solver: str, warnings: list, gaps=None):
    """The best contiguous layer split for this strategy's stages, in memory (DP or ILP).
    `gaps` collects the DP's optimality gap (0 unless its work cap stopped it)."""
    gaps = [] if gaps is None else gaps
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
                _warn(warnings, "ILP hit its time limit; its partition may not be optimal")
        except Exception as exc:  # a missing or crashing solver falls back to the DP
            _warn(warnings, f"ILP solver failed ({type(exc).__name__}: {exc}); fell back to dynamic programming")
            res = None
    if res is None:
        res = partition_dp(prob, multiple=s.vpp)
        used = "dp"
        gaps.append(res.gap)
        if res.status == "bound-limit":
            _warn(warnings, f"stage-partition DP stopped at its work cap; its split is within "
                            f"{res.gap * 100:.2f}% of optimal")
    if res.layers is None:
        return None, used
    return replace(s, layers_per_stage=res.layers), used


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
        self._work: dict = {}

    def layer_costs(self, s: Strategy, tk: Strategy, group_name: str) -> tuple[float, float]:
        """(dense, MoE) seconds per layer and micro-batch on this group: compute + TP (+ EP);
        exactly what `estimate` charges per layer for these terms (CP and DP only add).
        `tk` is s's time key (`_time_key(s)`), passed in because building it is not free."""
        key = (tk, group_name)
        v = self._layer.get(key)
        if v is None:
            model, g = self.model, self.cluster.group(group_name)

            def tp(lt):
                if s.tp <= 1:
                    return 0.0
                phases, _, _ = tp_layer_collectives(model, s, [g], self.cluster)
                return tp_layer_exposed_s(phases, lt, s.recompute == "full", s.tp_comm_overlap,
                                          s.async_tensor_model_parallel_allreduce)

            lt_d = _layer_time(model, tk, g.gpu, False)
            dense = lt_d.total + tp(lt_d)
            moe = dense
            if model.is_moe:
                lt_m = _layer_time(model, tk, g.gpu, True)
                moe = lt_m.total + tp(lt_m)
                if s.ep > 1:
                    phases, _ = ep_layer_collectives(model, s, [g], self.cluster)
                    moe += ep_layer_exposed_s(phases, lt_m, s.recompute == "full", s)
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
        return {"units": units, "rate": rate, "floor": floor, "unit_max": unit_max}, least

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

    def least_hop(self, s: Strategy, a: str, b: str) -> float:
        """The cheaper of the two ways two stages on groups a and b can talk (on one node only
        when a stage is smaller than a node of one group)."""
        hop = self.pp_hop(s, a, b)
        if a == b and s.gpus_per_stage < self.cluster.group(a).gpus_per_node:
            hop = min(hop, self.pp_hop(s, a, b, True))
        return hop

    def cell(self, s: Strategy, tk: Strategy, groups: tuple[str, ...]) -> float:
        """Bound for every vpp, ZeRO stage and stage order of a multiset of stage groups:
        m x the least possible slowest-stage time (PP traffic at vpp = 1)."""
        names = sorted(set(groups))
        hop = 2 * min(self.least_hop(s, x, y) for x in names for y in names) if s.pp > 1 else 0.0
        w, _ = self.work(s, tk, names)
        stages = {}
        for g in groups:
            key = (w["rate"][g], w["floor"][g], hop, float("inf"))
            stages[key] = stages.get(key, 0) + 1
        return s.num_microbatches * _relaxed_minmax(stages, w["units"], 1)

    def candidate(self, s: Strategy, tk: Strategy, groups: tuple[str, ...], max_layers=None, extra_s=None) -> float:
        """Bound for one concrete candidate (its vpp, ZeRO stage and stage order):
        (m - 1/v) T + W / v + the optimizer step, with T the least slowest-stage time and W the
        least sum of stage times over all layer splits (pipeline.py: T_pipe = (m - 1/v) max t_i
        + sum t_i / v; after the pipeline every stage runs its optimizer step, and the slowest
        takes at least the mean shard on the fastest GPU; DP sync only adds).
        `max_layers`: the most layers each stage can hold in memory, if known; `extra_s`: seconds
        per micro-batch each stage adds on top of s's layer costs (recompute of k layers)."""
        p, v, m = s.pp, s.vpp, s.num_microbatches
        names = sorted(set(groups))
        w, least = self.work(s, tk, names)
        # hop[i]: stage i to stage i + 1, on one node or across (estimate's stages_share_node)
        per = s.gpus_per_stage
        gpn = {g: self.cluster.group(g).gpus_per_node for g in names}
        seen: dict = {}
        hop = []
        for i in range(p - 1):
            a, b = groups[i], groups[i + 1]
            same = a == b and (i * per) // gpn[a] == ((i + 2) * per - 1) // gpn[a]
            key = (a, b, same)
            if key not in seen:
                seen[key] = 2 * v * self.pp_hop(s, a, b, same)
            hop.append(seen[key])
        stages: dict = {}
        W = least
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
            cap = float("inf") if max_layers is None else max_layers[i] * w["unit_max"]
            key = (w["rate"][g], w["floor"][g], e, cap)
            stages[key] = stages.get(key, 0) + 1
            W += e
        T = _relaxed_minmax(stages, w["units"], v)
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

    def after_step(self, s: Strategy, names) -> float:
        """Least seconds after the pipeline drains (estimate's after-step term, max over
        stages): the optimizer step of the slowest stage takes at least the mean shard on the
        fastest GPU (Adam is memory-bound, affine in its bytes), and every stage exposes at
        least its last layer's per-step DP collectives (estimate: t_dp / n_layers, and t_dp is
        affine in the bytes, so t_dp / n >= the bandwidth term of one layer's share)."""
        key = (s.tp, s.pp, s.dp, s.cp, s.ep, s.etp, s.zero_stage, s.offload_optimizer, tuple(names))
        v = self._after.get(key)
        if v is None:
            model = self.model
            placement = placement_of(s)
            all_stages = layer_range_params(model, s, 0, model.num_layers, True, True)
            params = placement.state_params("optimizer", all_stages)
            opt = 0.0
            if not s.offload_optimizer:
                opt = min(C.optimizer_time(params / s.pp, self.cluster.group(g).gpu, C.adam_step_bytes_per_param(s))
                          for g in names)
            # one layer's parameters per rank by group, the lighter layer kind present
            per_layer = {g: min(getattr(one_layer_params(model, moe), g) for moe in model.layer_kinds)
                         * placement.model_shard_factor(g) for g in ("dense", "norms", "experts")}

            dp = {}
            for g in names:
                grp = [self.cluster.group(g)]
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
                    link = group_link(grp, n, stride, self.cluster)
                    t += collective_time(dc.kind, 2 * msg, n, link) - collective_time(dc.kind, msg, n, link)
                dp[g] = t
            # every group hosts a stage; the stage with the largest optimizer shard pays at
            # least the smallest DP term
            v = self._after[key] = max(max(dp.values()), opt + min(dp.values()))
        return v


# Relative slack when comparing summed work units (sums of the same floats in another order).
_UNITS_TOL = 1e-9
# A screened candidate goes back in the queue only when its bound rose by more than rounding.
_REQUEUE_SLACK = 1e-9


def _relaxed_minmax(stages: dict[tuple[float, float, float, float], int], units: float, n_min: int) -> float:
    """Least T such that the layers fit under it with at least n_min per stage, over real
    (fractional) layer splits. A stage (r seconds per work unit, f least seconds of one layer,
    e fixed seconds, cap most units its memory holds) takes >= r u + e for u <= cap work units,
    and >= n_min f + e as it holds n_min layers; `stages` maps each to how many stages share it.
    So T >= max(n_min f + e), and sum min(cap, (T - e)/r) >= units, whose left side is
    increasing and piecewise linear in T: solved exactly piece by piece."""
    items = [(r, e, cap, k) for (r, _, e, cap), k in stages.items()]
    floor = max(n_min * f + e for (_, f, e, _) in stages)
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


# ---- the search ------------------------------------------------------------------------------

def _initial_split(model: ModelSpec, cluster: ClusterSpec, s: Strategy, groups: tuple[str, ...]):
    """(valid, split): a starting split before the exact partition. Across node groups, layers
    in proportion to GPU speed; else even, in multiples of the virtual stages (split None: the
    default even split). valid is False when no split gives every stage a multiple of vpp."""
    L, p, v = model.num_layers, s.pp, s.vpp
    if L < p * v or L % v:
        return False, None
    if cluster.is_heterogeneous and len(set(groups)) > 1:
        return True, _proportional_split(model, s, cluster, groups)
    if L % p == 0 and (L // p) % v == 0:
        return True, None
    # uneven: the extra chunks go to the last stages, which hold fewer in-flight activations
    base, extra = divmod(L // v, p)
    return True, tuple(v * (base + (1 if i >= p - extra else 0)) for i in range(p))


def search(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, progress=None) -> SearchResult:
    t0 = time.perf_counter()
    if model.position_embedding_type == "learned_absolute" and o.seq_length > model.max_position_embeddings:
        raise PlannerError(f"--seq-length {o.seq_length} exceeds the learned position table of {model.name} "
                           f"(max_position_embeddings {model.max_position_embeddings}); no plan can run it")
    fixed = dict(o.fixed)
    res = SearchResult(plans=[], solver=o.solver)
    bounds = _Bounds(model, cluster)
    mbs_opts = [fixed["mbs"]] if "mbs" in fixed else list(MICRO_BATCHES)
    rec_opts = [fixed["recompute"]] if "recompute" in fixed else list(o.recompute)
    zero_opts = [fixed["zero"]] if "zero" in fixed else list(o.zero_stages)
    vpp_opts = [fixed["vpp"]] if "vpp" in fixed else list(VPP_CHOICES)
    heap: list = []   # (bound, tie, kind, payload): kind 0 = a cell to expand, 1 = a candidate
    interned: dict = {}
    tie = itertools.count()
    # 1. cells: degrees x micro-batch x recompute x how many stages each node group hosts
    for tp, cp, pp, dp, ep, etp in enumerate_space(model, cluster, o):
        layouts = stage_layouts(cluster, tp * cp * dp, pp)
        if not layouts:
            continue
        for mbs in mbs_opts:
            if o.global_batch_size % (mbs * dp):
                continue
            m = o.global_batch_size // (mbs * dp)
            vpps = [v for v in vpp_opts
                    if v == 1 or (pp >= 2 and m % pp == 0 and "interleaved" in o.schedules
                                  and model.num_layers % v == 0 and model.num_layers >= pp * v)]
            block = "full" in rec_opts and o.partial_recompute and "recompute" not in fixed
            for rec in rec_opts + (["block"] if block else []):
                # a 'block' cell is bounded as if nothing were recomputed (its children add the
                # recompute of their k layers per chunk to the bound)
                base = Strategy(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, micro_batch_size=mbs,
                                global_batch_size=o.global_batch_size, seq_length=o.seq_length,
                                recompute="none" if rec == "block" else rec, sequence_parallel=tp > 1,
                                precision=o.precision, overlap_grad_reduce=True)
                tk = interned.setdefault(_time_key(base), _time_key(base))   # one object per key: cache hits by identity
                vpps_here = [v for v in vpps if model.num_layers // pp // v >= 2] if rec == "block" else vpps
                for orders in layouts.values():
                    n_children = len(vpps_here) * len(zero_opts) * len(orders)
                    if n_children == 0:
                        continue
                    res.candidates += n_children
                    if len(heap) >= MAX_CELLS:
                        raise PlannerError(f"search space exceeds {MAX_CELLS} cells (degrees x micro-batch x "
                                           "recompute x stage placement); fix some degrees with --fix "
                                           "(e.g. --fix tp=8 --fix pp=16)")
                    lb = bounds.cell(base, tk, orders[0])
                    heapq.heappush(heap, (lb, next(tie), 0, (base, tk, tuple(orders), tuple(vpps_here), n_children,
                                                            rec == "block")))
    # 2. best first: expand cells into candidates, price candidates, stop at the K-th best plan
    found: list[Estimate] = []
    seen: set = set()
    closest = None
    done = 0

    def kth_best() -> float:
        return found[o.top - 1].step_time_s if len(found) >= o.top else float("inf")

    while heap:
        lb, _, kind, payload = heap[0]
        if lb >= kth_best():
            break
        if time.perf_counter() - t0 > o.time_limit_s:
            res.status = "time-limit"
            # nothing left in the queue can beat its lowest bound: the optimum is >= min(top, lb)
            res.optimality_gap = (max(res.optimality_gap, (found[0].step_time_s - lb) / found[0].step_time_s, 0.0)
                                  if found else 1.0)
            _warn(res.warnings, f"search stopped at its {o.time_limit_s:g} s time limit; "
                                f"the plans are the best of those priced")
            break
        heapq.heappop(heap)
        if kind == 0:
            base, tk, orders, vpps, _, block = payload
            for vpp in vpps:
                for z in zero_opts:
                    for groups in orders:
                        c = replace(base, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b",
                                    zero_stage=z, overlap_param_gather=z >= 1,
                                    stage_node_groups=groups if cluster.is_heterogeneous else None)
                        if not block:
                            heapq.heappush(heap, (bounds.candidate(c, tk, groups), next(tie), 1, c))
                            continue
                        # full recompute of k layers per chunk: queued with the bound of k = 1
                        # (each stage re-runs at least vpp layers); k is chosen when it is popped
                        lb1 = bounds.block_candidate(replace(c, recompute="full", recompute_num_layers=1), groups, tk=tk)
                        heapq.heappush(heap, (lb1, next(tie), 3, (c, tk, groups)))
            continue
        if kind == 3:
            # a block-recompute child: on its starting split (the partition assumes every layer
            # recomputed alike, so it is not re-solved), more recomputed layers only cost time
            # and save memory, so the smallest k that fits dominates every larger k
            c, tk, groups = payload
            valid, split = _initial_split(model, cluster, c, groups)
            if not valid:
                continue
            per_chunk = min(split or c.stage_layers(model)) // c.vpp
            ck = _least_block_recompute(model, cluster, replace(c, recompute="full", layers_per_stage=split),
                                        per_chunk - 1)
            if ck is None:
                res.pruned_memory += 1
                continue
            heapq.heappush(heap, (bounds.block_candidate(ck, groups, tk=tk), next(tie), 1, ck))
            continue
        c = payload
        if kind == 1:
            if c.recompute_num_layers is None:
                valid, split = _initial_split(model, cluster, c, c.stage_node_groups or ())
                if not valid:
                    continue   # no split gives every stage a multiple of vpp layers
                c = replace(c, layers_per_stage=split)
            try:
                check_structure(c, model)
            except InvalidStrategy:
                continue
            done += 1
            if progress:
                progress(done, res.candidates)
            may_fit, short_bytes, n_max = _memory_screen(model, cluster, c, need_short=not found)
            if not may_fit:
                res.pruned_memory += 1
                if short_bytes is not None and (closest is None or short_bytes < closest[0]):
                    closest = (short_bytes, c)
                continue
            # with the layers each stage can hold, the bound may rise: queue it again
            groups = c.stage_node_groups or (cluster.node_groups[0].name,) * c.pp
            lb2 = (bounds.candidate(c, _time_key(c), groups, n_max) if c.recompute_num_layers is None
                   else bounds.block_candidate(c, groups, n_max))
            if lb2 > lb * (1 + _REQUEUE_SLACK):
                heapq.heappush(heap, (lb2, next(tie), 2, c))
                continue
        best, short = _price(model, cluster, c, "dp", res)
        if best is None:
            res.pruned_memory += 1
            if short is not None and (closest is None or short[0] < closest[0]):
                closest = short
            continue
        if best.strategy in seen:
            continue
        seen.add(best.strategy)
        found.append(best)
        found.sort(key=lambda e: e.step_time_s)
        del found[max(o.top, 1):]
    res.pruned_bound += sum(p[4] if k == 0 else 1 for _, _, k, p in heap)
    if o.solver.startswith("ilp"):
        found = _ilp_cross_check(model, cluster, found, o.solver, res)
    res.plans = found[:o.top]
    if not res.plans and closest is not None:
        res.closest = closest[1] if isinstance(closest[1], Estimate) else estimate(model, cluster, closest[1])
    if res.plans and cluster.is_heterogeneous:
        used = set(res.plans[0].stage_groups)
        res.idle_groups = [g.name for g in cluster.node_groups if g.name not in used]
    res.seconds = time.perf_counter() - t0
    return res


def _stage_gpu(cluster: ClusterSpec, s: Strategy, i: int):
    """The GPU of pipeline stage i (search candidates sit on one node group per stage)."""
    return cluster.group(s.stage_node_groups[i]).gpu if s.stage_node_groups else cluster.node_groups[0].gpu


def _stage_memories(model, cluster, s: Strategy) -> list:
    placement = placement_of(s)
    return [stage_memory(model, s, placement, i, _stage_gpu(cluster, s, i)) for i in range(s.pp)]


def _fits_exactly(model, cluster, s: Strategy) -> bool:
    return all(m.fits for m in _stage_memories(model, cluster, s))


def _least_block_recompute(model, cluster, s: Strategy, k_max: int):
    """The strategy with the fewest fully recomputed layers per chunk (1..k_max) that fits, or
    None. Memory falls and time rises with k, so this k is the only one worth pricing."""
    if k_max < 1:
        return None
    try:
        check_structure(replace(s, recompute_num_layers=k_max), model)
    except InvalidStrategy:
        return None
    if not _fits_exactly(model, cluster, replace(s, recompute_num_layers=k_max)):
        return None
    lo, hi = 1, k_max
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits_exactly(model, cluster, replace(s, recompute_num_layers=mid)):
            hi = mid
        else:
            lo = mid + 1
    return replace(s, recompute_num_layers=lo)


def _memory_screen(model: ModelSpec, cluster: ClusterSpec, s: Strategy, need_short: bool):
    """(may fit, bytes short, most layers each stage can hold). Stage i holds at most
    n_i = (capacity - fixed) / per-layer layers (a multiple of vpp), with the lower bounds of
    cost/memory.py, so a split can only fit if every n_i >= vpp and the n_i reach the model's
    layers. Bytes short (of the starting split, for the closest-plan report) only if asked."""
    if s.recompute_num_layers is not None:
        # block recompute is priced on its own split: its memory is known exactly
        mems = _stage_memories(model, cluster, s)
        return all(m.fits for m in mems), max(m.total - m.capacity for m in mems), list(s.stage_layers(model))
    placement = placement_of(s)
    n_max = []
    may_fit = True
    for i in range(s.pp):
        gpu = _stage_gpu(cluster, s, i)
        per = min(layer_memory_bytes(model, s, placement, i, k, gpu) for k in model.layer_kinds)
        room = (allocatable_bytes(model, s, gpu)
                - stage_fixed_bytes_lower_bound(model, s, placement, i)) // per
        room = int(max(room, 0)) // s.vpp * s.vpp
        if room < s.vpp:
            may_fit = False
        n_max.append(room)
    may_fit = may_fit and sum(n_max) >= model.num_layers
    short = None
    if not may_fit and need_short:
        short = max(m.total - m.capacity for m in _stage_memories(model, cluster, s))
    return may_fit, short, n_max


def _price(model, cluster, s: Strategy, solver: str, res: SearchResult):
    """Estimate one candidate and re-split its layers exactly. Returns (the best fitting
    estimate or None, (bytes short, estimate) when it does not fit)."""
    try:
        e = estimate(model, cluster, s)
    except InvalidStrategy:
        return None, None
    res.priced += 1
    res.priced_estimates.append(e)
    best = e if e.fits else None
    gaps: list = []
    s2, used = refine_partition(model, cluster, s, e, solver, res.warnings, gaps)
    if used != "none":
        res.solver = used
    res.optimality_gap = max([res.optimality_gap] + gaps)
    e2 = _estimate_split(model, cluster, s, s2)
    if e2 is not None:
        res.priced_estimates.append(e2)
        if e2.fits and (best is None or e2.step_time_s < best.step_time_s):
            best = e2
    if best is not None:
        return best, None
    return None, (_short(e), e)


def _estimate_split(model, cluster, s: Strategy, s2):
    """The estimate of a re-split strategy s2, or None if there is none or it is s's own split."""
    if s2 is None or s2.layers_per_stage == s.stage_layers(model):
        return None
    try:
        return estimate(model, cluster, s2)
    except InvalidStrategy:
        return None


def _ilp_cross_check(model, cluster, plans: list[Estimate], solver: str, res: SearchResult) -> list[Estimate]:
    """--solver ilp: the search prices with the exact DP (milliseconds a candidate); the top
    plans' splits are then solved again as an ILP, which agrees unless a solver limit hit."""
    out = []
    for e in plans:
        s2, used = refine_partition(model, cluster, e.strategy, e, solver, res.warnings)
        if used.startswith("ilp"):
            res.solver = f"dp, checked by {used}"
        e2 = _estimate_split(model, cluster, e.strategy, s2)
        out.append(e2 if e2 is not None and e2.fits and e2.step_time_s < e.step_time_s else e)
    return sorted(out, key=lambda x: x.step_time_s)


def _short(e: Estimate) -> float:
    return max(m.total - m.capacity for m in e.memory)
