"""The min-max solvers of the search's bounds (bounds.py): the least slowest-stage time T at
which a model's layers fit the stages of a pipeline, over real splits (relaxed_minmax) and
whole layers (integer_minmax, count_floor_rows per stage order, count_floor_groups per cell,
mixed_count_minmax with dense and MoE layers), and the floor of the slowest stage of a model
with both kinds (mixed_floor). Each returns a value no plan of its stages beats."""

from __future__ import annotations

import heapq

import numpy as np


# Relative slack when comparing summed work units (sums of the same floats in another order).
UNITS_TOL = 1e-9


def relaxed_minmax(stages: dict[tuple, int], units: float, n_min: int) -> float:
    """Least T such that the layers fit under it with at least n_min per stage, over real
    (fractional) layer splits. A stage (r seconds per work unit, f least seconds of one layer,
    e fixed seconds, cap most units its memory holds) takes >= r u + e for u <= cap work units,
    and >= n_min f + e as it holds n_min layers; `stages` maps each to how many stages share it.
    So T >= max(n_min f + e), and sum min(cap, (T - e)/r) >= units, whose left side is
    increasing and piecewise linear in T: solved exactly piece by piece."""
    items = [(r, e, cap, k) for (r, _, e, cap, _), k in stages.items()]
    floor = max(n_min * f + e for (_, f, e, _, _) in stages)
    need_units = units * (1 - UNITS_TOL)   # caps that exactly hold the model are enough

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


def integer_minmax(stages: dict[tuple, int], n_layers: int, n_min: int) -> float:
    """Least T such that whole layers fit under it: a stage (f least seconds of one layer, e
    fixed seconds, at most n_cap layers in memory) holds at most min(n_cap, floor((T - e) / f))
    layers and at least n_min, and the stages must hold all n_layers. With a few layers per
    stage this is well above the fractional bound of relaxed_minmax (61 layers on 24 stages
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


def count_floor_rows(a, e, caps, need: int):
    """Per row of stages (rows x stages: a_i seconds a layer, e_i fixed seconds, at most caps_i
    layers in memory), the least T at which they hold `need` whole layers: stage i holds
    min(caps_i, floor((T - e_i) / a_i)), so T is the need-th smallest of e_i + j a_i over
    j = 1..caps_i (each time rounded down as integer_minmax's counts round up); inf where the
    caps hold fewer. integer_minmax (a the lighter kind's seconds, need all layers) and
    mixed_count_minmax (a the MoE layer's, need the MoE layers) over many stage orders at once,
    without their floors: take the max with those."""
    a, e, caps = np.asarray(a, dtype=float), np.asarray(e, dtype=float), np.asarray(caps)
    if need <= 0:
        return np.full(len(a), -np.inf)
    j = np.arange(1, int(min(caps.max(initial=0), need)) + 1)
    if not j.size:
        return np.full(len(a), np.inf)
    times = e[..., None] + j * (a[..., None] / (1 + _COUNT_TOL))
    times = np.where(j <= caps[..., None], times, np.inf).reshape(len(a), -1)
    if times.shape[1] < need:
        return np.full(len(a), np.inf)
    return np.partition(times, need - 1, axis=1)[:, need - 1]


def count_floor_groups(a, e: float, counts, held, need: int) -> float:
    """The least T at which stages on node groups hold `need` whole layers, when a layer
    costs a[g] seconds on group g, every stage e fixed seconds, c_g = counts[g] stages are on
    group g and held[g, t - 1] ranks could hold t layers there: under T the stages on g hold
    at most sum_t min(c_g, held[g, t - 1]) over t with e + t a[g] <= T (each rank's t-th layer
    counted once, on its c_g roomiest ranks), so T is the need-th smallest of those times
    (rounded down as integer_minmax's counts round up; count_floor_rows does this per stage
    order). inf: they hold fewer whatever T."""
    if need <= 0:
        return -np.inf
    held = np.asarray(held)
    t = np.arange(1, held.shape[1] + 1)
    times = (e + t[None, :] * (np.asarray(a, dtype=float)[:, None] / (1 + _COUNT_TOL))).ravel()
    weight = np.minimum(np.asarray(counts)[:, None], held).ravel()
    order = np.argsort(times, kind="stable")
    reached = np.cumsum(weight[order])
    k = int(np.searchsorted(reached, need))
    return float(times[order][k]) if k < len(reached) else np.inf


def count_floor_even(a_min: float, e: float, p: int, need: int) -> float:
    """A cheaper floor under count_floor_unlimited: p stages, none holding a layer in under
    a_min seconds, e fixed seconds each, hold `need` whole layers only if one holds
    ceil(need / p), so T >= e + ceil(need / p) a_min (rounded as count_floor_groups does: never
    above count_floor_unlimited for the same slots). O(1): the search orders 10^5 family groups
    by it (Families.group_bound)."""
    if need <= 0:
        return -np.inf
    return e + -(-need // p) * (a_min / (1 + _COUNT_TOL))


def count_floor_unlimited(a, e: float, counts, need: int) -> float:
    """count_floor_groups when memory holds any number of layers on every rank (time alone):
    the least T at which c_g = counts[g] stages on groups costing a[g] seconds a layer, e fixed
    seconds each, hold `need` whole layers, i.e. the need-th smallest of e + t a[g] over t >= 1
    counted c_g times (rounded as count_floor_groups does, the same float). The family and cell
    bounds add it to their fractional relaxation: 61 layers on 27 stages need a stage of 3."""
    if need <= 0:
        return -np.inf
    step = [(x / (1 + _COUNT_TOL), c) for x, c in zip(a, counts) if c > 0]
    if len(step) <= 1:
        if not step:
            return np.inf
        x, c = step[0]
        return e + -(-need // c) * x     # one kind of stage: ceil(need / c) layers on one of them
    # below the fractional T every group's count is under need: start each one a step lower
    frac = need / sum(c / x for x, c in step)
    t0 = [max(0, int(frac / x) - 1) for x, _ in step]
    held = sum(c * t for (_, c), t in zip(step, t0))
    nxt = [(e + (t + 1) * x, k) for k, ((x, _), t) in enumerate(zip(step, t0))]
    heapq.heapify(nxt)
    while True:
        T, k = heapq.heappop(nxt)
        x, c = step[k]
        held += c
        if held >= need:
            return T
        t0[k] += 1
        heapq.heappush(nxt, (e + (t0[k] + 1) * x, k))


def mixed_count_minmax(stages: dict[tuple, int], n_layers: int, n_dense: int, lo: float) -> float:
    """Least T (>= lo, a T known not to exceed the optimum) at which whole layers of a model with
    n_dense dense and n_layers - n_dense MoE layers can fit: a stage (a MoE layer costs it a
    seconds, e fixed seconds, at most n_cap layers in memory) holding k MoE and d dense layers
    under T has k <= floor((T - e) / a) (dense layers cost >= 0) and k + d <= n_cap, and the
    d's sum to at most n_dense, so all stages hold at most
    sum min(n_cap, floor((T - e) / a)) + n_dense layers. Where memory forces many layers onto
    slow stages this is far above integer_minmax, which prices every layer as the cheaper kind
    (DeepSeek-V3: 3 dense layers of 61). The low end is kept, as integer_minmax does."""
    items = [(a, e, n_cap, k) for (a, e, n_cap), k in stages.items()]

    def held(T):
        return n_dense + sum(k * min(n_cap, max(0, int((T - e) / a * (1 + _COUNT_TOL)))) for a, e, n_cap, k in items)

    if held(lo) >= n_layers:
        return lo
    hi = max(lo, max(n_cap * a + e for a, e, n_cap, _ in items))   # every stage full
    if held(hi) < n_layers:
        return float("inf")
    return _step_low(held, n_layers, items, lo)


def mixed_floor_rows(B, saves, n_dense: int, v, moe_only=None):
    """A lower bound on the slowest stage of a model with dense and MoE layers, per row of
    B (rows x stages; v: each row's vpp, an int or a rows x 1 array): stage i holds at least v
    layers, costing B[i] (its v MoE layers, ends and hops) if all are MoE, and each dense layer
    among them saves at most saves[i]. The model has only n_dense dense layers, so at most
    n_dense stages hold any (some stage outside them keeps its B: the (n_dense + 1)-th largest),
    and no stage saves on more than min(v, n_dense) layers; `moe_only` (rows x stages): stages no
    dense layer can reach (Bounds.dense_ranks), which keep their B. (The floor of every layer at
    the cheaper kind, all a single-kind bound knows, is B - v saves.)"""
    B = np.asarray(B, dtype=float)
    low = (B - np.minimum(v, n_dense) * np.asarray(saves, dtype=float)).max(axis=1)
    p = B.shape[1]
    if p > n_dense:
        low = np.maximum(low, np.sort(B, axis=1)[:, p - 1 - n_dense])
    if moe_only is not None:
        low = np.maximum(low, np.where(moe_only, B, -np.inf).max(axis=1))
    return low


def mixed_floor_counts(b, saves, counts, n_dense: int, v: int) -> float:
    """mixed_floor of stages given as kinds: counts[k] stages alike with b[k] and saves[k] (a
    cell's stages per node group), the same floats."""
    low = max(x - min(v, n_dense) * y for x, y, c in zip(b, saves, counts) if c)
    p = sum(counts)
    if p > n_dense:
        k, seen = p - 1 - n_dense, 0     # the (n_dense + 1)-th largest b
        for x, c in sorted(zip(b, counts)):
            seen += c
            if seen > k:
                return max(low, x)
    return low


def mixed_floor(B, saves, n_dense: int, v: int, moe_only=None) -> float:
    """mixed_floor_rows of one row of stages."""
    return float(mixed_floor_rows([B], saves, n_dense, v, None if moe_only is None else [moe_only])[0])
