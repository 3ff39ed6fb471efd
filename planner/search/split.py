"""The stage split of a candidate: a starting split before the exact partition
(initial_split: even, or in proportion to GPU speed across node groups), the partition
problem of its stages (partition_problem: per-layer time and memory consistent with
`estimate`), its exact solution in memory (refine_partition: DP or ILP, with
_exact_max_layers), and the chunk layout of a split (balanced_chunks, with_split)."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from ..cost.memory import layer_memory_bytes, stage_memory
from ..estimate import Estimate, layer_time_of, time_key
from ..placement import placement_of
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy
from .after_bound import AfterStepRows
from .partition import PartitionProblem, partition_dp, partition_ilp
from .screen import stage_gpu
from .space import warn

def _layer_split_even(L: int, pp: int) -> tuple[int, ...]:
    b, e = divmod(L, pp)
    return tuple(b + (1 if i < e else 0) for i in range(pp))


def _proportional_split(model: ModelSpec, s: Strategy, cluster: ClusterSpec, groups: tuple[str, ...],
                        multiple: int) -> tuple[int, ...]:
    """Layers in proportion to each stage GPU's speed (a starting point before the exact DP):
    each stage at least vpp layers, in multiples of `multiple`."""
    tk = time_key(s)
    rate = {name: 1.0 / layer_time_of(model, tk, cluster.group(name).gpu, False).total for name in set(groups)}
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
    tk = time_key(s)
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
        lt[i] = layer_time_of(model, tk, gpu, False).total + per_layer_comm
        lm[i] = layer_memory_bytes(model, s, placement, i, False, gpu)
        if model.is_moe:
            lt[i, moe_mask] = layer_time_of(model, tk, gpu, True).total + per_layer_comm + ep_per_moe
            lm[i, moe_mask] = layer_memory_bytes(model, s, placement, i, True, gpu)
        et[i] = st.per_microbatch_s - lt[i, a:b].sum()
        em[i] = mem.total - lm[i, a:b].sum()
        cap[i] = mem.safe_capacity if safe else mem.capacity
    return PartitionProblem(lt, lm, et, em, cap, s.num_microbatches, s.vpp, after=after_matrix(model, cluster, s, e))


# Most (stage, interval) after-step terms after_matrix builds for a model of two layer kinds
# (8 bytes each: 64 MB); beyond, as for 24 stages of 600 layers, the split minimises the
# pipeline alone.
AFTER_INTERVALS_MAX = 8_000_000


@lru_cache(maxsize=4)
def _interval_counts(model: ModelSpec) -> tuple:
    """For layers [j, k) (k > j: `held`): their dense and MoE counts ([L + 1, L + 1] each), and
    the grid of every (dense, MoE) pair: a stage's after-step depends on its layers through
    these counts only, so it is priced once per pair."""
    L = model.num_layers
    n = np.arange(L + 1)
    moe_before = np.array([model.num_moe_layers_in(0, k) for k in range(L + 1)])
    n_all = n[None, :] - n[:, None]
    held = n_all > 0
    n_moe = np.where(held, moe_before[None, :] - moe_before[:, None], 0)
    n_dense = np.where(held, n_all, 0) - n_moe
    grid = np.meshgrid(np.arange(model.num_dense_layers + 1), np.arange(model.num_moe_layers + 1), indexing="ij")
    return held, n_dense, n_moe, grid


@lru_cache(maxsize=4)
def _after_rows(model: ModelSpec, cluster: ClusterSpec) -> AfterStepRows:
    """One AfterStepRows per model and cluster, so that its per-stage terms are shared by the
    candidates priced."""
    return AfterStepRows(model, cluster)


def after_matrix(model: ModelSpec, cluster: ClusterSpec, s: Strategy, e: Estimate) -> np.ndarray | None:
    """[p, L + 1, L + 1]: the after-step seconds estimate charges stage i holding layers [j, k)
    (its DP collectives past its backward, optimizer step, tied embedding; AfterStepRows.
    stage_after, from estimate's own functions), so that the split minimises the step and not
    the pipeline alone; [p, L + 1], by layer count, for a model of one layer kind. None where a
    stage spans several node groups or the optimizer is offloaded (terms stage_after does not
    price exactly), or past AFTER_INTERVALS_MAX: the pipeline alone then."""
    if s.offload_optimizer or any("+" in g for g in e.stage_groups):
        return None
    rows = _after_rows(model, cluster)
    tk, groups = time_key(s), tuple(e.stage_groups)
    if len(model.layer_kinds) == 1:   # by layer count
        n = np.arange(model.num_layers + 1)
        out = np.stack([rows.stage_after(s, tk, groups, i, {model.layer_kinds[0]: n}) for i in range(s.pp)])
        out[:, 0] = np.inf
        return out
    if s.pp * (model.num_layers + 1) ** 2 > AFTER_INTERVALS_MAX:
        return None
    held, n_dense, n_moe, grid = _interval_counts(model)
    out = np.stack([rows.stage_after(s, tk, groups, i, {False: grid[0], True: grid[1]})[n_dense, n_moe]
                    for i in range(s.pp)])
    out[:, ~held] = np.inf
    return out


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
                warn(warnings, "ILP hit its time limit; its partition may not be optimal")
        except Exception as exc:  # a missing or crashing solver falls back to the DP
            warn(warnings, f"ILP solver failed ({type(exc).__name__}: {exc}); fell back to dynamic programming")
            res = None
    if res is None:
        res = partition_dp(prob, multiple=q, least=s.vpp)
        used = "dp"
        gaps.append(res.gap)
        if res.status == "bound-limit":
            warn(warnings, f"stage-partition DP stopped at its work cap; its split is within "
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
    L, v = model.num_layers, s.vpp
    out = np.zeros(s.pp, dtype=np.int64)
    # the candidates of a cell differ in stage order: they share each rank's verdicts
    base = replace(s, stage_node_groups=None, layers_per_stage=None, chunk_layers=None)

    def fits(i, n, gpu):
        return _rank_fits(model, base, i, n, gpu, safe)

    for i in range(s.pp):
        gpu = stage_gpu(cluster, s, i)
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


# Verdicts _rank_fits keeps (a few thousand per search; a bound on memory across searches).
_RANK_FITS_CACHED = 1 << 16


@lru_cache(maxsize=_RANK_FITS_CACHED)
def _rank_fits(model: ModelSpec, s: Strategy, i: int, n: int, gpu, safe: bool) -> bool:
    """Whether rank i of s (no split, no placement) fits n layers on `gpu`, the other ranks at
    vpp layers (they keep its range inside the model), with the margin when `safe`: a pure
    function of its arguments, cached across the candidates priced."""
    v = s.vpp
    split = [v] * s.pp
    split[i] = n
    sn = replace(s, layers_per_stage=tuple(split), chunk_layers=balanced_chunks(tuple(split), v))
    mem = stage_memory(model, sn, placement_of(sn), i, gpu)
    return mem.verdict == "fits" if safe else mem.fits


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


def initial_split(model: ModelSpec, cluster: ClusterSpec, s: Strategy, groups: tuple[str, ...],
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

