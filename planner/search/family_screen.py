"""The family memory screen: whether any candidate of a family (degrees x micro-batch x
recompute; every stage placement, vpp and ZeRO stage) can fit, and a lower bound on the peak
bytes per GPU of all of its candidates, for many families at once.

Stage i holds at most the layers that fit on the roomiest GPU of the family's node groups
under each ZeRO stage (every rank of a candidate runs the same one: a family may fit under
some and not others, and the search builds candidates only under those) at vpp 1 (virtual
stages only keep more micro-batches in flight; an uneven rank of n layers holds at least the
activations of the even v floor(n / v) below it, hence a slack of v - 1 layers), with the
lower bounds of cost/memory.py: a rank holds >= fixed + per-layer x layers bytes, fixed =
stage_fixed_bytes_parts (bytes + bytes per micro-batch x in flight), per-layer =
layer_memory_bytes (states + kept activations x in flight). Under 1F1B a later middle stage
keeps no more micro-batches than an earlier one (p - i - 1 warm-up forwards), so its room is
no smaller and its per-layer bytes no larger: the middle stages are evaluated at SCREEN_POINTS
points, each standing for the stages before it. With dense and MoE layers, a rank holds at
most (room - fixed) / (an MoE layer's bytes) MoE layers whatever dense layers it also holds,
so the MoE layers must fit in those rooms too. A block-recompute family is screened as full
recompute of every layer but one per rank (its candidates recompute at most all but one layer
of each chunk, and keep more).

The terms are tables shared by many families, each keyed by what it depends on: the states
(degrees, data-parallel size, ZeRO stage, pp > 1), the activations (the time class: degrees,
micro-batch, recompute; pp > 1), the bytes a GPU can allocate (the time class up to its
recompute, and the NCCL communicators a rank opens), the in-flight micro-batches (depth,
micro-batch count, EP-overlap schedule). A search screens its 10^5 families in one pass of
numpy over families x ZeRO stages x node groups x layer kinds x points, so the families that
cannot fit are never bounded in time.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..cost.memory import (in_flight_microbatches, layer_kept_activation_bytes, layer_state_bytes, nccl_communicators,
                           stage_fixed_activation_parts, stage_fixed_state_bytes, usable_bytes)
from ..placement import placement_of
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy
from .screen import most_layers

# Middle pipeline ranks evaluated (besides the first and the last): each bounds the ranks up to it.
SCREEN_POINTS = 8
_POINTS = SCREEN_POINTS + 2
# The layer-kind axis of the tables: dense, MoE (model.is_moe_layer's values).
_KINDS = (False, True)
_MOE = _KINDS.index(True)
# End shapes of a rank, the columns of the fixed-bytes tables: (first, last).
_SHAPES = ((True, False), (False, True), (False, False), (True, True))
_FIRST, _LAST, _MIDDLE, _ALONE = range(4)
# The columns of the allocatable-bytes table: without and with the memory model's margin.
_NO_MARGIN, _MARGIN = 0, 1
# Families screened per numpy pass (bounds the temporaries: families x ZeRO x groups x kinds x points).
_CHUNK = 2048


def screen_points(p: int) -> tuple[list, list]:
    """The pipeline ranks the screen evaluates (the ends and SCREEN_POINTS middle ranks) and how
    many ranks each stands for (a middle point: itself and the ranks back to the previous point)."""
    middle = list(range(1, p - 1))
    step = max(1, -(-len(middle) // SCREEN_POINTS))
    points = sorted({0, p - 1} | set(middle[step - 1::step]) | ({middle[-1]} if middle else set()))
    mult, prev = [], 0
    for i in points:
        mult.append(1 if i in (0, p - 1) else i - prev)
        if i not in (0, p - 1):
            prev = i
    return points, mult


class _Table:
    """Rows of one term, appended once per key; `index` returns a row's index."""

    def __init__(self):
        self.rows: list = []
        self.at: dict = {}
        self._array = None

    def index(self, key, build, *args) -> int:
        """The row of `key`, built as build(*args) the first time."""
        i = self.at.get(key)
        if i is None:
            i = self.at[key] = len(self.rows)
            self.rows.append(build(*args))
            self._array = None
        return i

    def array(self, part: int) -> np.ndarray:
        if self._array is None:
            self._array = [np.array(col) for col in zip(*self.rows)] if self.rows else []
        return self._array[part]


class Screened(NamedTuple):
    """FamilyScreen.run's verdicts on F families, in the order added (Z: the zeros screened)."""
    may_fit: np.ndarray            # (F,) some ZeRO stage may fit (every rank of a candidate runs one)
    zero_fit: np.ndarray           # (F, Z) may fit under each ZeRO stage
    peak: np.ndarray               # (F,) peak bytes per GPU no candidate goes below (see run)
    # a screen made with the memory model's margin: its verdict without it too (F, Z), which the
    # search's TIGHT candidates need; else None
    tight_zero_fit: np.ndarray | None


class FamilyScreen:
    """Families are `add`ed one by one (cheap: table lookups), then `run` screens those added
    since the last run at once."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, zeros, uneven: bool, with_margin: bool = False):
        self.model, self.cluster, self.zeros, self.uneven = model, cluster, tuple(zeros), uneven
        # screen against the room that leaves the memory model's margin (no TIGHT plan wanted)
        self.with_margin = with_margin
        self.groups = tuple(g.name for g in cluster.node_groups)
        self._degrees, self._state, self._act, self._alloc = _Table(), _Table(), _Table(), _Table()
        self._points, self._flight, self._names = _Table(), _Table(), _Table()
        # per key of add_group's families: activation rows and slacks, allocatable-bytes rows (by
        # communicators), in-flight rows (by depth and micro-batches)
        self._kinds: dict = {}
        self._group_alloc: dict = {}
        self._group_flight: dict = {}
        self._pending: list = []
        self._ran: tuple = _family_rows([], len(self.zeros))

    # -- tables --------------------------------------------------------------------------------
    def _state_row(self, s: Strategy, z: int) -> tuple:
        """(fixed state bytes per end shape, each group's layer states per kind) under ZeRO z."""
        s = s.with_(zero_stage=z, overlap_param_gather=z >= 1)
        placement = placement_of(s)
        shapes = range(3) if s.pp > 1 else (_ALONE,)
        fixed = [np.nan] * len(_SHAPES)
        for k in shapes:
            fixed[k] = stage_fixed_state_bytes(self.model, s, placement, *_SHAPES[k])
        kinds = self.model.layer_kinds
        states = [[layer_state_bytes(self.model, s, placement, k, g.gpu) if k in kinds else np.inf for k in _KINDS]
                  for g in self.cluster.node_groups]
        return fixed, states

    def _degrees_row(self, ts: Strategy, pp: int, dp: int) -> tuple:
        """What a family's degrees, data-parallel size and pp > 1 decide: its state rows (one
        per ZeRO stage) and the NCCL communicators a rank opens."""
        s = ts.with_(pp=pp, dp=dp)
        states = tuple(self._state.index((s.tp, s.cp, s.ep, s.etp, s.dp, s.pp > 1, z), self._state_row, s, z)
                       for z in self.zeros)
        return states, nccl_communicators(self.model, s)

    def _points_row(self, p: int) -> tuple:
        points, mult = screen_points(p)
        pad = _POINTS - len(points)
        shape = [_ALONE] if p == 1 else [_FIRST if i == 0 else _LAST if i == p - 1 else _MIDDLE for i in points]
        # padding repeats the first point (any real shape) with no ranks behind it
        return (shape + shape[:1] * pad, [float(x) for x in mult] + [0.0] * pad, [True] * len(points) + [False] * pad,
                len(points) - 1)

    def _act_row(self, s: Strategy, block: bool) -> tuple:
        """(fixed activation bytes, per micro-batch in flight, per end shape; kept bytes per layer
        kind; the bytes a block family keeps beyond full recompute)."""
        model = self.model
        screened = s.with_(recompute="full") if block else s
        parts = [stage_fixed_activation_parts(model, screened, *shape) for shape in _SHAPES]
        kept = [layer_kept_activation_bytes(model, screened, k) if k in model.layer_kinds else np.inf for k in _KINDS]
        # a block family recomputes at most all but one layer of each chunk: every rank keeps one
        # layer's activations whole (the lighter kind's, beyond what full recompute keeps of it)
        block_kept = (min(layer_kept_activation_bytes(model, s, k) - layer_kept_activation_bytes(model, screened, k)
                          for k in model.layer_kinds) if block else 0.0)
        return [a for a, _ in parts], [b for _, b in parts], kept, block_kept

    def _flight_row(self, ts: Strategy, pp: int, dp: int) -> tuple:
        s = ts.with_(pp=pp, dp=dp)
        points, _ = screen_points(pp)
        return ([in_flight_microbatches(s, i) for i in points] + [1.0] * (_POINTS - len(points)),)

    def _alloc_row(self, ts: Strategy, pp: int, dp: int) -> tuple:
        """The bytes each group's GPUs can allocate, without and with the memory model's margin
        (columns _NO_MARGIN, _MARGIN: a search safe by default screens with it, and its search
        for TIGHT plans without it, over the same families)."""
        s = ts.with_(pp=pp, dp=dp)
        return tuple([usable_bytes(self.model, s, g.gpu, margin) for g in self.cluster.node_groups]
                     for margin in (False, True))

    def _names_row(self, names: tuple) -> tuple:
        return ([g in names for g in self.groups],)

    # -- families ------------------------------------------------------------------------------
    def add(self, ts: Strategy, cls_key, pp: int, dp: int, m: int, block: bool, vmax: int, names: tuple) -> None:
        """One family: `ts` its time class's strategy (any pp and dp; recompute 'none' for a block
        family), `cls_key` a key of that class, m its micro-batches, vmax its most virtual stages,
        names its node groups."""
        self.add_group(pp, dp, m, names, [(ts, cls_key, cls_key, block, vmax)])

    def add_group(self, pp: int, dp: int, m: int, names: tuple, families, key=None) -> None:
        """Families of one degrees, depth, data-parallel size, micro-batch count and node groups,
        in order: (ts, cls_key, alloc_key, block, vmax) each, as `add` takes them, alloc_key a key
        of the class up to its recompute (the bytes a GPU can allocate do not depend on it).
        `key`, if given, names `families` (the same key, the same families): a search adds
        10^5-10^6 families in 10^4-10^5 groups that share a few hundred such tuples, and their
        table rows are looked up once per tuple (and depth, data-parallel size, micro-batches)."""
        ts = families[0][0]
        states, ncomm = self._degrees.rows[self._degrees.index((ts.tp, ts.cp, ts.ep, ts.etp, dp, pp > 1),
                                                               self._degrees_row, ts, pp, dp)]
        pi = self._points.index(pp, self._points_row, pp)
        ni = self._names.index(names, self._names_row, names)
        kinds = self._kinds.get(key) if key is not None else None
        if kinds is None:
            kinds = self._kinds_row(families)
            if key is not None:
                self._kinds[key] = kinds
        ai, slack, overlaps, with_overlap = kinds
        li = self._group_alloc.get((key, ncomm)) if key is not None else None
        if li is None:
            # the bytes a GPU can allocate depend on neither the depth nor the data-parallel
            # size beyond the NCCL communicators a rank opens
            li = np.array([self._alloc.index((alloc_key, ncomm), self._alloc_row, f_ts, pp, dp)
                           for f_ts, _, alloc_key, _, _ in families])
            if key is not None:
                self._group_alloc[key, ncomm] = li
        # the micro-batches in flight depend on the depth, micro-batches and the EP overlap only:
        # the rows without and with it (-1: no family of the group runs it)
        flight = [-1, -1]
        for on, f_ts in with_overlap:
            flight[on] = self._flight.index((pp, m, on), self._flight_row, f_ts, pp, dp)
        self._pending.append((states, pi, ni, ai, li, overlaps, *flight, slack))

    def _kinds_row(self, families) -> tuple:
        """What a group's families need beyond its depth and data-parallel size: their
        activation rows, each one's slack of uneven virtual stages, whether each runs the EP
        overlap, and ((overlap, a family's strategy) for each value present)."""
        ai = [self._act.index((cls_key, block), self._act_row, f_ts, block) for f_ts, cls_key, _, block, _ in families]
        slack = [vmax - 1 if (self.uneven and not block) else 0 for *_, block, vmax in families]
        overlaps = [f_ts.overlap_moe_expert_parallel_comm for f_ts, *_ in families]
        present = {on: families[overlaps.index(on)][0] for on in (False, True) if on in overlaps}
        return np.array(ai), np.array(slack), np.array(overlaps, dtype=bool), tuple(present.items())

    def run(self, every_peak: bool = False) -> "Screened":
        """The verdicts of every family added since the last run, in order (Screened). The peak
        bound is computed for the families that may fit, with or without the margin (the search
        prunes dominated ones with it), nan for the others unless every_peak (see `peaks`)."""
        groups, self._pending = self._pending, []
        self._ran = _family_rows(groups, len(self.zeros))
        return self._run(self._ran, every_peak)

    def peaks(self, index) -> np.ndarray:
        """The peak-bytes lower bounds of the families at `index` of the last run (the search
        asks for those of families that cannot fit only when no plan fits)."""
        return self._run(tuple(col[index] for col in self._ran), True).peak

    def _run(self, rows: tuple, every_peak: bool) -> "Screened":
        margins = (True, False) if self.with_margin else (False,)
        n = len(rows[0])
        fits = [np.zeros((n, len(self.zeros)), bool) for _ in margins]
        peak = np.full(n, np.nan)
        for lo in range(0, n, _CHUNK):
            got, peak[lo:lo + _CHUNK] = self._screen(*(col[lo:lo + _CHUNK] for col in rows), every_peak=every_peak,
                                                     margins=margins)
            for fit, g in zip(fits, got):
                fit[lo:lo + _CHUNK] = g
        return Screened(fits[0].any(axis=1), fits[0], peak, fits[1] if self.with_margin else None)

    def _screen(self, si, ai, li, pi, fi, ni, slack, every_peak: bool, margins: tuple):
        """The screen over F families (si: F x Z state rows; the others F row indices): the
        verdict per ZeRO stage (F, Z) for each of `margins` (with the memory model's margin or
        not), and the peak bound."""
        L = self.model.num_layers
        st_fixed, st_layer = self._state.array(0), self._state.array(1)          # (S, 4), (S, G, K)
        a_fixed, a_per, kept, block_kept = (self._act.array(k) for k in range(4))  # (A, 4) x2, (A, K), (A,)
        shape, mult, valid, last = (self._points.array(k)[pi] for k in range(4))  # (F, P) x3, (F,)
        flight = self._flight.array(0)[fi]                                       # (F, P)
        groups = self._names.array(0)[ni]                                        # (F, G)
        # a rank's fixed bytes at each point: (F, Z, P)
        fixed = (st_fixed[si[:, :, None], shape[:, None, :]]
                 + (a_fixed[ai[:, None], shape] + (a_per[ai[:, None], shape] + block_kept[ai][:, None]) * flight)[:, None, :])
        # one layer's bytes per kind: (F, Z, G, K, P)
        per_kind = st_layer[si][..., None] + (kept[ai][:, :, None] * flight[:, None, :])[:, None, None]
        per = np.minimum(per_kind[:, :, :, 0], per_kind[:, :, :, 1])             # (F, Z, G, P)
        def alloc(margin):   # a group the family does not use has no room (-inf bytes)
            return np.where(groups, self._alloc.array(_MARGIN if margin else _NO_MARGIN)[li], -np.inf)

        # without the margin first: with it, only the families that may fit without it can
        # (its room is the smaller), a tenth of them
        loose = self._fit(alloc(False), fixed, per_kind, per, mult, slack, last)
        fits = {False: loose}
        if True in margins:
            w = loose.any(axis=1)
            strict = np.zeros_like(loose)
            strict[w] = self._fit(alloc(True)[w], fixed[w], per_kind[w], per[w], mult[w], slack[w], last[w])
            fits[True] = strict
        fits = [fits[m] for m in margins]
        # peak: screen.peak_bytes_lower_bound with each point's least per-layer bytes over the
        # family's groups (at least one layer a rank), the least over the ZeRO stages
        peak = np.full(len(si), np.nan)
        w = slice(None) if every_peak else np.any([f.any(axis=1) for f in fits], axis=0)
        groups, per, fixed, mult, slack, valid = groups[w], per[w], fixed[w], mult[w], slack[w], valid[w]
        least = np.where(groups[:, None, :, None], per, np.inf).min(axis=2)      # (F, Z, P)
        m3, sl3 = mult[:, None, :], slack[:, None]
        spread = (L - mult.sum(axis=1)[:, None] * sl3 + (m3 * fixed / least).sum(axis=2)) / (m3 / least).sum(axis=2)
        v3 = valid[:, None, :]
        floor = np.where(v3, fixed + np.maximum(1 - sl3, 0)[..., None] * least, -np.inf).max(axis=2)
        top = np.where(v3, fixed, -np.inf).max(axis=2)
        peak[w] = np.maximum(np.maximum(spread, floor), top).min(axis=1)
        return fits, peak

    def _fit(self, alloc, fixed, per_kind, per, mult, slack, last) -> np.ndarray:
        """Whether each family may fit under each ZeRO stage (F, Z) with `alloc` bytes to
        allocate on each of its groups (F, G; -inf on groups it does not use)."""
        L = self.model.num_layers
        free = alloc[:, None, :, None] - fixed[:, :, None, :]
        # the most layers a rank holds on its roomiest group under each ZeRO stage: of the
        # lighter kind, but of a model with both kinds at most its n_dense dense layers, MoE
        # layers in the rest (screen.py most_layers); floor(max) = max(floor), and a rounded
        # quotient only errs up (the screen stays safe)
        if len(self.model.layer_kinds) > 1:
            most = most_layers(free, per_kind[:, :, :, 0], per_kind[:, :, :, _MOE], self.model.num_dense_layers)
            room = np.maximum(most.max(axis=2), 0)                               # (F, Z, P)
        else:
            room = np.maximum(np.floor((free / per).max(axis=2)), 0)            # (F, Z, P)
        sl, m3 = slack[:, None, None], mult[:, None, :]
        fit = ((m3 * np.minimum(room + sl, L)).sum(axis=2) >= L) & (room[:, :, 0] >= 1) & \
            (room[np.arange(len(last)), :, last] >= 1)                            # (F, Z)
        if len(self.model.layer_kinds) > 1:
            n_moe = self.model.num_moe_layers
            moe_room = np.maximum(np.floor((free / per_kind[:, :, :, _MOE]).max(axis=2)), 0)
            fit &= (m3 * np.minimum(moe_room + sl, n_moe)).sum(axis=2) >= n_moe
        return fit


def _family_rows(groups: list, n_zeros: int) -> tuple:
    """add_group's records as the screen's columns, one row per family: (si (F, Z), ai, li, pi,
    fi, ni, slack)."""
    if not groups:
        none = np.zeros(0, np.int64)
        return np.zeros((0, n_zeros), np.int64), none, none, none, none, none, none
    sizes = [len(g[3]) for g in groups]

    def each(k):
        return np.repeat(np.array([g[k] for g in groups], dtype=np.int64), sizes, axis=0)

    def joined(k, dtype=np.int64):
        return np.concatenate([g[k] for g in groups]).astype(dtype)

    si = each(0).reshape(sum(sizes), n_zeros)
    fi = np.where(joined(5, bool), each(7), each(6))
    return si, joined(3), joined(4), each(1), fi, each(2), joined(8)


def run_indices(runs) -> np.ndarray:
    """The family indices of (first index, count) runs, in order."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    first, count = np.array(runs).T
    return np.repeat(first - np.concatenate(([0], np.cumsum(count)[:-1])), count) + np.arange(count.sum())
