"""Memory screens of the search: whether a candidate can fit before it is priced
(memory_screen: the most layers each stage can hold, and a lower bound on the peak bytes per
GPU of any split, peak_bytes_lower_bound), whether it fits exactly, rank by rank
(fits_exactly), and the fewest fully recomputed layers per chunk that make a block-recompute
candidate fit (least_block_recompute). With `with_margin` / `safe` they screen against the room
that leaves the memory model's margin (a plan above it is TIGHT)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..cost.memory import (in_flight_microbatches, layer_kept_activation_bytes, layer_state_bytes,
                           stage_fixed_activation_parts, stage_fixed_state_bytes, stage_memory, usable_bytes)
from ..estimate import time_key
from ..errors import InvalidStrategy
from ..placement import placement_of
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy, check_structure


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


def stage_gpu(cluster: ClusterSpec, s: Strategy, i: int):
    """The GPU of pipeline stage i (search candidates sit on one node group per stage)."""
    return cluster.group(s.stage_node_groups[i]).gpu if s.stage_node_groups else cluster.node_groups[0].gpu


def stage_memories(model, cluster, s: Strategy) -> list:
    placement = placement_of(s)
    return [stage_memory(model, s, placement, i, stage_gpu(cluster, s, i)) for i in range(s.pp)]


def fits_exactly(model, cluster, s: Strategy, rank_fits: dict | None = None, safe: bool = False) -> bool:
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
        gpu = stage_gpu(cluster, s, i)
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


def least_block_recompute(model, cluster, s: Strategy, k_max: int, rank_fits: dict | None = None,
                           safe: bool = False):
    """The strategy with the fewest fully recomputed layers per chunk (1..k_max) that fits (with
    `safe`, with the memory model's margin), or None. Memory falls and time rises with k, so
    this k is the only one worth pricing. `rank_fits`: fits_exactly's cache."""
    if k_max < 1:
        return None
    c = s.with_(recompute_num_layers=k_max)
    try:
        check_structure(c, model)
    except InvalidStrategy:
        return None
    if not fits_exactly(model, cluster, c, rank_fits, safe):
        return None
    lo, hi = 1, k_max
    while lo < hi:
        mid = (lo + hi) // 2
        if fits_exactly(model, cluster, s.with_(recompute_num_layers=mid), rank_fits, safe):
            hi = mid
        else:
            lo = mid + 1
    return s.with_(recompute_num_layers=lo)


def most_layers(free, dense, moe, n_dense: int):
    """The most layers a rank with `free` bytes holds, a dense layer costing it `dense` bytes and a
    MoE layer `moe`, of a model with only n_dense dense layers: where dense layers are the lighter
    kind, d = min(n_dense, free / dense) of them and MoE layers in the rest, else MoE layers only.
    numpy arrays of any one shape; each quotient is rounded before it is floored, so it errs up
    and a screen built on it stays safe."""
    d = np.minimum(n_dense, np.maximum(np.floor(free / dense), 0))
    return np.where(dense < moe, d + np.floor(np.maximum(free - d * dense, 0) / moe),
                    np.maximum(np.floor(free / moe), 0))


def memory_screen(model: ModelSpec, cluster: ClusterSpec, s: Strategy, uneven: bool = True,
                   dense_reach: frozenset | None = None, terms: RoomTerms | None = None, with_margin: bool = False,
                   act_key=None):
    """(may fit, most layers each stage can hold, a lower bound on the peak bytes per GPU of
    any split). Stage i holds at most n_i = (capacity - fixed) / per-layer layers (a
    multiple of vpp), with the lower bounds of cost/memory.py, so a split can only fit if every
    n_i >= vpp and the n_i reach the model's layers (stage_rooms, fit_rows). `uneven`: splits
    whose ranks need not hold a multiple of vpp layers are searched (the peak bound allows for
    them). `dense_reach`, `terms`, `act_key`: as stage_rooms takes them."""
    if s.recompute_num_layers is not None:
        # block recompute is priced on its own split: its memory is known exactly
        mems = stage_memories(model, cluster, s)
        fits = all((m.verdict == "fits") if with_margin else m.fits for m in mems)
        return fits, list(s.stage_layers(model)), max(m.total for m in mems)
    p = s.pp
    # each rank's GPU, as stage_gpu gives it
    order = list(dict.fromkeys(s.stage_node_groups)) if s.stage_node_groups else [cluster.node_groups[0].name]
    gi = np.array([[order.index(g) for g in s.stage_node_groups] if s.stage_node_groups else [0] * p])
    rooms = stage_rooms(model, cluster, s, order, dense_reach, terms, with_margin, act_key)
    n_max, fits = fit_rows(model, rooms, gi, s.vpp)
    ranks = np.arange(p)
    peak = peak_bytes_lower_bound(rooms.fixed.tolist(), rooms.per[gi[0], ranks].tolist(), [1] * p, model.num_layers,
                                  s.vpp, s.vpp - 1 if uneven else 0)
    return bool(fits[0]), n_max[0].tolist(), peak


class StageRooms(NamedTuple):
    """stage_rooms: per node group (rows, in the order asked) and pipeline rank (columns)."""
    room: np.ndarray             # the most layers a rank there can hold (int64)
    moe_room: np.ndarray | None  # the most MoE layers (a model with both kinds; else None)
    per: np.ndarray              # bytes of one more layer, the lighter kind
    fixed: np.ndarray            # bytes a rank holds beside its layers (per rank, any group)


class RoomTerms:
    """stage_rooms' terms for the candidates of one search (they differ only in degrees,
    data-parallel size, depth, micro-batch, layer execution, vpp, ZeRO stage and placement),
    each cached by what it depends on, as the family screen's tables are (family_screen.py):
    the states by the degrees, data-parallel size, pp > 1 and ZeRO stage; the activations by
    the time class (`act_key`, its time key: neither depth nor data-parallel size enter); the
    bytes a GPU can use by the time class, the data-parallel size and pp > 1 (the NCCL
    communicators a rank opens) and the margin; the micro-batches in flight by the schedule."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec):
        self.model, self.cluster = model, cluster
        self._states: dict = {}
        self._acts: dict = {}
        self._alloc: dict = {}
        self._flight: dict = {}
        self._masks: dict = {}

    def states(self, s: Strategy) -> tuple:
        """(fixed state bytes per end shape, _SHAPES; each group's layer states per kind)."""
        key = (s.tp, s.cp, s.ep, s.etp, s.dp, s.pp > 1, s.zero_stage)
        got = self._states.get(key)
        if got is None:
            model, placement = self.model, placement_of(s)
            shapes = _SHAPES if s.pp > 1 else (_ALONE,)
            got = self._states[key] = (
                {e: stage_fixed_state_bytes(model, s, placement, *e) for e in shapes},
                {g.name: [layer_state_bytes(model, s, placement, k, g.gpu) for k in model.layer_kinds]
                 for g in self.cluster.node_groups})
        return got

    def activations(self, s: Strategy, act_key) -> tuple:
        """(fixed activation bytes and bytes per micro-batch in flight per end shape; kept bytes
        per layer kind)."""
        got = self._acts.get(act_key)
        if got is None:
            model = self.model
            got = self._acts[act_key] = ({e: stage_fixed_activation_parts(model, s, *e) for e in _SHAPES + (_ALONE,)},
                                         [layer_kept_activation_bytes(model, s, k) for k in model.layer_kinds])
        return got

    def alloc(self, s: Strategy, act_key, names, with_margin: bool) -> np.ndarray:
        key = (act_key, s.dp, s.pp > 1, names, with_margin)
        got = self._alloc.get(key)
        if got is None:
            got = self._alloc[key] = np.array([usable_bytes(self.model, s, self.cluster.group(g).gpu, with_margin)
                                               for g in names])
        return got

    def reach_mask(self, p: int, dense_reach: frozenset) -> np.ndarray:
        """Per rank of p, whether it is in dense_reach."""
        key = (p, dense_reach)
        got = self._masks.get(key)
        if got is None:
            got = self._masks[key] = np.array([i in dense_reach for i in range(p)])
        return got

    def flight(self, s: Strategy) -> np.ndarray:
        """in_flight_microbatches of every rank."""
        key = (s.pp, s.num_microbatches, s.vpp, s.microbatch_group_size, s.overlap_moe_expert_parallel_comm)
        got = self._flight.get(key)
        if got is None:
            got = self._flight[key] = np.array([in_flight_microbatches(s, i) for i in range(s.pp)])
        return got


# A rank's end shapes, (first, last): stage_fixed_bytes_parts' arguments.
_SHAPES = ((True, False), (False, False), (False, True))
_ALONE = (True, True)


def stage_rooms(model: ModelSpec, cluster: ClusterSpec, s: Strategy, names, dense_reach: frozenset | None = None,
                terms: RoomTerms | None = None, with_margin: bool = False, act_key=None) -> StageRooms:
    """The layers each pipeline rank of s (its degrees, vpp and ZeRO stage; any stage order)
    can hold on each node group of `names`, from the lower bounds of cost/memory.py: (capacity
    - fixed) / per-layer bytes (stage_fixed_bytes_parts, layer_memory_bytes: states + kept
    activations x micro-batches in flight), a multiple of vpp. Per-layer bytes are the lighter
    layer kind's, but on ranks no dense layer can reach (`dense_reach`, Bounds.dense_ranks: the
    ranks that can) a MoE layer's; a rank whose layers are not a multiple of vpp keeps at least
    the activations of the even vpp floor(n / vpp) layers below it (its chunks only grow), so
    it may hold vpp - 1 more. `terms`: the search's cache (RoomTerms), with `act_key` s's time
    key (time_key(s) if not given)."""
    p, v, kinds = s.pp, s.vpp, model.layer_kinds
    terms = RoomTerms(model, cluster) if terms is None else terms
    act_key = time_key(s) if act_key is None else act_key
    st_fixed, st_layer = terms.states(s)
    act_fixed, kept = terms.activations(s, act_key)
    ends = [_ALONE] if p == 1 else [_SHAPES[0]] + [_SHAPES[1]] * (p - 2) + [_SHAPES[2]]
    flight = terms.flight(s)
    # stage_fixed_bytes_parts, its state and activation parts cached apart (RoomTerms)
    fixed = np.array([st_fixed[e] + act_fixed[e][0] for e in ends]) + np.array([act_fixed[e][1] for e in ends]) * flight
    alloc = terms.alloc(s, act_key, tuple(names), with_margin)
    states = np.array([st_layer[g] for g in names])
    per_kind = states[:, None, :] + np.array(kept)[None, None, :] * flight[None, :, None]    # (groups, ranks, kinds)
    per = per_kind.min(axis=2)
    free = alloc[:, None] - fixed[None, :]
    moe_room = None
    if len(kinds) > 1:
        moe_per = per_kind[:, :, kinds.index(True)]
        moe_room = np.maximum(free // moe_per, 0)
        # a rank holds at most the model's n_dense dense layers: where they are the lighter
        # kind, its most layers are d = min(n_dense, free // dense) of them and MoE layers in
        # the rest (DeepSeek-V3: 3 dense layers of 61 cannot fill an H100 stage), and only
        # MoE layers on ranks no dense layer can reach
        with_dense = most_layers(free, per_kind[:, :, kinds.index(False)], moe_per, model.num_dense_layers)
        if dense_reach is not None:
            with_dense = np.where(terms.reach_mask(p, dense_reach), with_dense, moe_room)
        room = with_dense.astype(np.int64) // v * v
    else:
        room = np.maximum(free // per, 0).astype(np.int64) // v * v
    room = np.where(room >= v, room + v - 1, room)
    return StageRooms(room, moe_room, per, fixed)


def fit_rows(model: ModelSpec, rooms: StageRooms, gi: np.ndarray, v: int):
    """(most layers each stage can hold, whether they may fit) of stage orders at once: gi
    (orders x ranks) the row of `rooms` each rank's group has, v the vpp. They may fit only if
    every rank holds >= vpp layers, all ranks hold the model's layers, and (both kinds) its
    MoE layers."""
    p = gi.shape[1]
    ranks = np.arange(p)
    n_max = rooms.room[gi, ranks]
    fits = (n_max >= v).all(axis=1) & (n_max.sum(axis=1) >= model.num_layers)
    if rooms.moe_room is not None:
        fits &= rooms.moe_room[gi, ranks].sum(axis=1) + p * (v - 1) >= model.num_moe_layers
    return n_max, fits

