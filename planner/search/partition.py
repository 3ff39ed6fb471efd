"""Stage partition: how many consecutive layers each pipeline stage carries.

Given per-layer costs on each stage's GPU (seconds per micro-batch; bytes of memory per layer
with that stage's in-flight micro-batches) plus fixed extras per stage (embedding on the first,
output layer and loss on the last), find the contiguous split that minimises the pipeline time
  T = (m - 1/v) max_i t_i + (1/v) sum_i t_i
subject to each stage's memory <= its usable capacity; with after-step terms (`after`: what
each stage adds once per step after the pipeline drains, for each interval of layers it may
hold) the split that minimises the step, T + max_i a_i (`_partition_after`: the pipeline
problem in rounds, under a falling cap on the after-step).

Two exact solvers of the pipeline problem:
- `partition_dp`: dynamic programming. For a bound B on stage time it computes, over layers x
  stages, the least sum of stage times with every stage <= B and in memory (O(p L^2), vectorised
  over the split point). B runs over the candidate stage times in increasing order, starting at
  the min-max value; it stops once (m - 1/v) B alone exceeds the best objective found, so the
  optimum is exact.
- `partition_ilp`: the pipeline problem as an integer program in PuLP (CBC, or HiGHS if
  installed): binary x[i,k] = layer k on stage i with a monotone (contiguous) assignment. It
  leaves out the after-step terms (--solver ilp re-solves the top plans' splits and keeps one
  only where it is faster).
tests/test_partition.py checks both against brute force.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PartitionProblem:
    layer_time: np.ndarray      # [p, L] seconds per micro-batch of layer k if on stage i
    layer_mem: np.ndarray       # [p, L] bytes of layer k if on stage i (incl. in-flight factor)
    extra_time: np.ndarray      # [p]
    extra_mem: np.ndarray       # [p]
    capacity: np.ndarray        # [p] usable bytes
    m: int
    v: int = 1
    # most layers each stage can hold, when the caller knows it exactly (memory that is not
    # additive in the layers, e.g. uneven virtual chunks); None: layer_mem alone decides
    max_layers: np.ndarray | None = None
    # seconds stage i adds once per step after the pipeline drains (DP collectives its
    # backward does not hide, optimizer step; the step pays the largest), [p, L + 1, L + 1]
    # for it holding layers [j, k), or [p, L + 1] for it holding n layers where only the count
    # matters (a model of one layer kind: L^2 numbers would be 8 MB a stage at 1,000 layers).
    # None: the pipeline alone
    after: np.ndarray | None = None

    @property
    def p(self) -> int:
        return self.layer_time.shape[0]

    @property
    def L(self) -> int:
        return self.layer_time.shape[1]

    def objective(self, times, afters=()) -> float:
        """Step seconds of a split: its pipeline time and the largest after-step term."""
        return (self.m - 1.0 / self.v) * max(times) + sum(times) / self.v + max(afters, default=0.0)

    def stage_afters(self, split: tuple[int, ...]) -> list[float]:
        if self.after is None:
            return []
        if self.after.ndim == 2:
            return [float(self.after[i, n]) for i, n in enumerate(split)]
        bounds = np.concatenate([[0], np.cumsum(split)])
        return [float(self.after[i, bounds[i], bounds[i + 1]]) for i in range(len(split))]

    def step_time(self, split: tuple[int, ...]) -> float:
        return self.objective(self.stage_costs(split)[0], self.stage_afters(split))

    def stage_costs(self, split: tuple[int, ...]):
        times, mems, start = [], [], 0
        for i, n in enumerate(split):
            times.append(float(self.layer_time[i, start:start + n].sum() + self.extra_time[i]))
            mems.append(float(self.layer_mem[i, start:start + n].sum() + self.extra_mem[i]))
            start += n
        return times, mems

    def feasible(self, split) -> bool:
        if self.max_layers is not None and any(n > k for n, k in zip(split, self.max_layers)):
            return False
        _, mems = self.stage_costs(split)
        return all(mm <= c for mm, c in zip(mems, self.capacity))


@dataclass(frozen=True)
class PartitionResult:
    layers: tuple[int, ...] | None
    objective: float
    solver: str
    status: str           # optimal | infeasible | time-limit
    gap: float = 0.0


# Relative tolerance for comparing stage times with a bound (cumulative sums of equal layers
# differ in the last bits).
_REL_TOL = 1e-12


def _stage_matrices(P_t, P_m, prob: PartitionProblem, i: int, multiple: int, least: int):
    """t[j, k], mem[j, k]: time and memory of stage i holding layers [j, k); valid[j, k] where
    the count is at least `least` and a multiple of `multiple`."""
    t = P_t[i][None, :] - P_t[i][:, None] + prob.extra_time[i]
    mem = P_m[i][None, :] - P_m[i][:, None] + prob.extra_mem[i]
    n = np.arange(prob.L + 1)
    cnt = n[None, :] - n[:, None]
    valid = (cnt >= max(least, 1)) & (cnt % multiple == 0) & (mem <= prob.capacity[i])
    if prob.max_layers is not None:
        valid &= cnt <= prob.max_layers[i]
    return t, valid


# Keep the per-stage (start, end) matrices across the DP's passes while they take less than
# this many entries in all (~9 bytes each); beyond it they are rebuilt per pass.
_MATRIX_CACHE_ENTRIES = 8_000_000


class _Matrices:
    """The per-stage matrices of one problem, built once per pass or kept between passes;
    `allowed` ([p, L + 1, L + 1] or None) further limits the (start, end) pairs a stage takes."""

    def __init__(self, P_t, P_m, prob: PartitionProblem, multiple: int, least: int, allowed=None):
        self.args = (P_t, P_m, prob, multiple, least)
        self.keep = prob.p * (prob.L + 1) ** 2 <= _MATRIX_CACHE_ENTRIES
        self.cache: dict = {}
        self.allowed = allowed

    def __call__(self, i: int):
        P_t, P_m, prob, multiple, least = self.args
        if not self.keep:
            t, valid = _stage_matrices(P_t, P_m, prob, i, multiple, least)
        else:
            if i not in self.cache:
                self.cache[i] = _stage_matrices(P_t, P_m, prob, i, multiple, least)
            t, valid = self.cache[i]
        return (t, valid) if self.allowed is None else (t, valid & self.allowed[i])


def _dp_min_sum(mats: _Matrices, prob: PartitionProblem, bound: float):
    """Least sum of stage times with every stage <= bound and in memory; returns (sum, split).
    One vectorised pass per stage over all (start, end) pairs: O(p L^2) numbers."""
    p, L = prob.p, prob.L
    INF = np.inf
    best = np.full(L + 1, INF)
    best[0] = 0.0
    choice = np.zeros((p, L + 1), dtype=np.int64)
    cols = np.arange(L + 1)
    for i in range(p):
        t, valid = mats(i)
        ok = valid & (t <= bound * (1 + _REL_TOL))
        cand = np.where(ok, best[:, None] + t, INF)
        a = np.argmin(cand, axis=0)
        best = cand[a, cols]
        choice[i] = a
    if not np.isfinite(best[L]):
        return INF, None
    split, k = [], L
    for i in range(p - 1, -1, -1):
        j = int(choice[i, k])
        split.append(k - j)
        k = j
    return float(best[L]), tuple(reversed(split))


def _candidate_bounds(mats: _Matrices, prob: PartitionProblem) -> np.ndarray:
    """Every stage time a feasible stage can have, sorted, near-equal values merged (the larger
    kept, so that a bound admits all of its cluster)."""
    vals = []
    for i in range(prob.p):
        t, valid = mats(i)
        vals.append(np.unique(t[valid]))
    v = np.unique(np.concatenate(vals)) if vals else np.zeros(0)
    if len(v) > 1:
        keep = np.append(v[1:] - v[:-1] > _REL_TOL * np.abs(v[1:]), True)
        v = v[keep]
    return v


class _Uniform:
    """Every layer costs the same on a stage (a model of one layer kind): stage i with n layers
    takes c_i n + e_i seconds and k_i n + f_i bytes, so any layer counts form a contiguous
    split and the least sum under a bound is greedy: every stage starts at `least` layers,
    the rest go to the cheapest stages first, each up to what the bound and its memory allow
    (costs are linear in the counts, so the exchange argument makes greedy exact)."""

    def __init__(self, prob: PartitionProblem, multiple: int, least: int, count_range=None):
        self.prob, self.q = prob, multiple
        self.c = prob.layer_time[:, 0]
        k = prob.layer_mem[:, 0]
        mem_room = np.floor((prob.capacity - prob.extra_mem) / k + _REL_TOL)
        room = np.maximum(mem_room, 0)
        if prob.max_layers is not None:
            room = np.asarray(prob.max_layers, dtype=float)   # exact, from the caller
        self.n_mem = (room // multiple * multiple).astype(np.int64)
        # the fewest layers each stage takes; count_range ([p] lows, [p] highs): a further
        # range of counts per stage (the after-step's, _count_ranges)
        self.n_low = np.full(prob.p, least, dtype=np.int64)
        if count_range is not None:
            lo, hi = count_range
            self.n_low = np.maximum(self.n_low, -(-lo // multiple) * multiple)
            self.n_mem = np.minimum(self.n_mem, hi // multiple * multiple)

    def bounds(self) -> np.ndarray:
        p = self.prob
        vals = [self.c[i] * np.arange(self.n_low[i], int(min(self.n_mem[i], p.L)) + 1, self.q) + p.extra_time[i]
                for i in range(p.p)]
        v = np.unique(np.concatenate(vals)) if vals else np.zeros(0)
        if len(v) > 1:
            v = v[np.append(v[1:] - v[:-1] > _REL_TOL * np.abs(v[1:]), True)]
        return v

    def __call__(self, bound: float):
        prob, q = self.prob, self.q
        by_time = np.floor((bound * (1 + _REL_TOL) - prob.extra_time) / self.c + _REL_TOL)
        upper = np.minimum(self.n_mem, np.maximum(by_time, 0) // q * q).astype(np.int64)
        if (upper < self.n_low).any() or upper.sum() < prob.L or self.n_low.sum() > prob.L:
            return np.inf, None
        n = self.n_low.copy()
        left = prob.L - n.sum()
        for i in np.argsort(self.c, kind="stable"):
            add = min(left, upper[i] - n[i])
            n[i] += add
            left -= add
        split = tuple(int(x) for x in n)
        return float((self.c * n + prob.extra_time).sum()), split


def _is_uniform(prob: PartitionProblem) -> bool:
    return bool(np.all(prob.layer_time == prob.layer_time[:, :1])
                and np.all(prob.layer_mem == prob.layer_mem[:, :1]))


def partition_dp(prob: PartitionProblem, multiple: int = 1, max_bounds: int = 64, least: int | None = None,
                 max_uniform_bounds: int = 1_000_000) -> PartitionResult:
    """Exact DP (see module doc). `multiple`: each stage's layer count must be a multiple of it
    (even virtual chunks need layers divisible by v); `least`: each stage holds at least this
    many layers (one per virtual chunk; default `multiple`). Models of one layer kind take the
    greedy path of `_Uniform` (O(p log p) per bound instead of O(p L^2)), whose work cap
    `max_uniform_bounds` is far above the p x L bounds it can have, so it always ends proven.
    With after-step terms (prob.after) the step's split (_partition_after)."""
    least = multiple if least is None else least
    if prob.L % multiple or least % multiple:
        return PartitionResult(None, float("inf"), "dp", "infeasible")
    if prob.after is not None:
        return _partition_after(prob, multiple, max_bounds, least, max_uniform_bounds)
    return _partition_pipe(prob, multiple, max_bounds, least, max_uniform_bounds)


# Rounds of _partition_after (pipeline solves, each under a lower cap on the after-step) before
# it reports the gap left; a round moves the stage that sets the after-step, and few do.
_AFTER_ROUNDS_MAX = 32


def _partition_after(prob: PartitionProblem, multiple: int, max_bounds: int, least: int,
                     max_uniform_bounds: int) -> PartitionResult:
    """The split of least step time: pipeline + the largest stage's after-step term. Round r
    solves the pipeline exactly with every stage's after-step <= cap_r (cap_0 = inf): its split
    S_r beats every split whose after-step lies in [A(S_r), cap_r] (no faster pipeline, no
    smaller after-step), so cap_{r+1} is the next value below A(S_r), until no split is left
    or the pipeline of round r plus the least after-step any split can have is no better than
    the best found (each round's pipeline is at least the last's)."""
    n = np.arange(prob.L + 1)
    cnt = n if prob.after.ndim == 2 else n[None, :] - n[:, None]
    shape_ok = (cnt >= max(least, 1)) & (cnt % multiple == 0)
    per_stage = np.where(shape_ok[None], prob.after, np.inf)
    a_floor = float(per_stage.reshape(prob.p, -1).min(axis=1).max())
    values = np.unique(per_stage[np.isfinite(per_stage)])
    best, best_obj, lb, cap = None, float("inf"), float("inf"), float("inf")
    for _ in range(_AFTER_ROUNDS_MAX):
        allowed = None if cap == float("inf") else prob.after <= cap
        res = _partition_pipe(prob, multiple, max_bounds, least, max_uniform_bounds, allowed)
        if res.layers is None:
            lb = min(lb, best_obj)   # no split is left under the cap
            break
        a_split = max(prob.stage_afters(res.layers))
        obj = res.objective + a_split
        if obj < best_obj - 1e-15:
            best, best_obj = res, obj
        pipe_lb = res.objective * (1 - res.gap)
        lb = min(lb, pipe_lb + a_split)   # the splits this round covers
        below = values[values < a_split]
        if pipe_lb + a_floor >= best_obj or len(below) == 0:
            lb = min(lb, best_obj)
            break
        cap = float(below[-1])
    else:
        lb = min(lb, pipe_lb + a_floor)   # rounds left: what the splits not covered can reach
    if best is None:
        return PartitionResult(None, float("inf"), "dp", "infeasible")
    gap = max(0.0, (best_obj - lb) / best_obj)
    return PartitionResult(best.layers, best_obj, "dp", "optimal" if gap == 0.0 else "bound-limit", gap)


def _by_interval(allowed: np.ndarray) -> np.ndarray:
    """An allowed mask by layer count ([p, L + 1]) as one by interval ([p, L + 1, L + 1])."""
    n = np.arange(allowed.shape[1])
    cnt = n[None, :] - n[:, None]
    return allowed[:, np.clip(cnt, 0, None)] & (cnt > 0)[None]


def _count_ranges(prob: PartitionProblem, allowed):
    """For a model of one layer kind (stage costs depend on counts only): the layer counts
    `allowed` (by count, or by interval) leaves each stage as ([p] lows, [p] highs), or None
    when a stage's are not one range (the DP then takes them as they are)."""
    if allowed.ndim == 2:
        ok = allowed
    else:
        ok = allowed[:, 0, :]   # stage i holding layers [0, n): a count n
        n = np.arange(prob.L + 1)
        cnt = n[None, :] - n[:, None]
        pairs = cnt > 0
        if not all(np.array_equal(allowed[i][pairs], ok[i][cnt[pairs]]) for i in range(prob.p)):
            return None   # not a function of the count alone
    lo, hi = np.zeros(prob.p, dtype=np.int64), np.zeros(prob.p, dtype=np.int64)
    for i in range(prob.p):
        idx = np.flatnonzero(ok[i, 1:]) + 1
        if len(idx) == 0:
            lo[i], hi[i] = prob.L + 1, 0
            continue
        if not ok[i, idx[0]:idx[-1] + 1].all():
            return None
        lo[i], hi[i] = idx[0], idx[-1]
    return lo, hi


def _partition_pipe(prob: PartitionProblem, multiple: int, max_bounds: int, least: int, max_uniform_bounds: int,
                    allowed=None) -> PartitionResult:
    """The split of least pipeline time (module doc), each stage taking only the (start, end)
    pairs `allowed` permits ([p, L + 1, L + 1], None: all)."""
    uniform_costs = _is_uniform(prob)
    ranges = None if allowed is None or not uniform_costs else _count_ranges(prob, allowed)
    if allowed is not None and allowed.ndim == 2 and ranges is None:
        allowed = _by_interval(allowed)
    if uniform_costs and (allowed is None or ranges is not None):
        uniform = _Uniform(prob, multiple, least, ranges)
        bounds = uniform.bounds()
        min_sum = uniform
        max_bounds = max_uniform_bounds
    else:
        P_t = np.concatenate([np.zeros((prob.p, 1)), np.cumsum(prob.layer_time, axis=1)], axis=1)
        P_m = np.concatenate([np.zeros((prob.p, 1)), np.cumsum(prob.layer_mem, axis=1)], axis=1)
        mats = _Matrices(P_t, P_m, prob, multiple, least, allowed)
        bounds = _candidate_bounds(mats, prob)

        def min_sum(bound):
            return _dp_min_sum(mats, prob, bound)
    if len(bounds) == 0:
        return PartitionResult(None, float("inf"), "dp", "infeasible")
    # min-max by binary search over the bounds (feasibility is monotone in the bound)
    lo, hi = 0, len(bounds) - 1
    s_hi, _ = min_sum(bounds[hi])
    if not np.isfinite(s_hi):
        return PartitionResult(None, float("inf"), "dp", "infeasible")
    while lo < hi:
        mid = (lo + hi) // 2
        s, _ = min_sum(bounds[mid])
        if np.isfinite(s):
            hi = mid
        else:
            lo = mid + 1
    best_obj, best_split = float("inf"), None
    a = (prob.m - 1.0 / prob.v)
    proven = False
    for count, k in enumerate(range(lo, len(bounds))):
        B = bounds[k]
        if a * B >= best_obj:
            proven = True   # no larger bound can win: the optimum is exact
            break
        if count >= max_bounds and best_split is not None:
            break           # work cap reached before the proof
        s, split = min_sum(B)
        if split is None:
            continue
        times, _ = prob.stage_costs(split)
        obj = prob.objective(times)
        if obj < best_obj - 1e-15:
            best_obj, best_split = obj, split
    else:
        proven = True       # every candidate bound was tried
    if best_split is None:
        return PartitionResult(None, float("inf"), "dp", "infeasible")
    if proven:
        return PartitionResult(best_split, best_obj, "dp", "optimal")
    # lower bound on what an untried bound could reach: a*B plus nothing for the sum term
    gap = max(0.0, (best_obj - a * bounds[k]) / best_obj)
    return PartitionResult(best_split, best_obj, "dp", "bound-limit", gap)


def partition_ilp(prob: PartitionProblem, multiple: int = 1, time_limit_s: float = 20.0,
                  solver: str = "cbc", least: int | None = None) -> PartitionResult:
    """The same problem as an ILP in PuLP. Raises ImportError/RuntimeError if no solver runs."""
    import pulp

    least = multiple if least is None else least
    if _is_uniform(prob):
        return _partition_ilp_counts(prob, multiple, time_limit_s, solver, least)
    p, L = prob.p, prob.L
    lp = pulp.LpProblem("stage_partition", pulp.LpMinimize)
    # y[i][k] = 1 if layer k sits on a stage <= i (a staircase: contiguous stages)
    y = [[pulp.LpVariable(f"y_{i}_{k}", cat="Binary") for k in range(L)] for i in range(p)]
    T = pulp.LpVariable("T", lowBound=0)
    x = [[None] * L for _ in range(p)]
    for i in range(p):
        for k in range(L):
            x[i][k] = y[i][k] - (y[i - 1][k] if i > 0 else 0)
    for k in range(L):
        lp += y[p - 1][k] == 1
        for i in range(1, p):
            lp += y[i][k] >= y[i - 1][k]
    for i in range(p):
        for k in range(L - 1):
            lp += y[i][k] >= y[i][k + 1]
    times = []
    for i in range(p):
        n_i = pulp.lpSum(x[i][k] for k in range(L))
        lp += n_i >= max(least, 1)
        if prob.max_layers is not None:
            lp += n_i <= int(prob.max_layers[i])
        if multiple > 1:
            q = pulp.LpVariable(f"q_{i}", lowBound=1, cat="Integer")
            lp += n_i == multiple * q
        t_i = pulp.lpSum(float(prob.layer_time[i, k]) * x[i][k] for k in range(L)) + float(prob.extra_time[i])
        mem_i = pulp.lpSum(float(prob.layer_mem[i, k]) * x[i][k] for k in range(L)) + float(prob.extra_mem[i])
        lp += mem_i <= float(prob.capacity[i])
        lp += T >= t_i
        times.append(t_i)
    lp += (prob.m - 1.0 / prob.v) * T + pulp.lpSum(times) * (1.0 / prob.v)
    return _solve(lp, T, prob, solver, time_limit_s,
                  lambda: [int(round(sum(pulp.value(x[i][k]) for k in range(L)))) for i in range(p)])


def _solve(lp, T, prob: PartitionProblem, solver: str, time_limit_s: float, read_split) -> PartitionResult:
    """Run CBC or HiGHS on an ILP of the partition; `read_split()` reads layers per stage back."""
    import pulp

    engine = (pulp.HiGHS(msg=False, timeLimit=time_limit_s) if solver == "highs"
              else pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s))
    st = pulp.LpStatus[lp.solve(engine)]
    if st == "Infeasible":
        return PartitionResult(None, float("inf"), f"ilp-{solver}", "infeasible")
    if st not in ("Optimal", "Not Solved") or pulp.value(T) is None:
        raise RuntimeError(f"ILP solver returned {st}")
    split = tuple(read_split())
    times, _ = prob.stage_costs(split)
    return PartitionResult(split, prob.objective(times), f"ilp-{solver}",
                           "optimal" if st == "Optimal" else "time-limit")


def _partition_ilp_counts(prob: PartitionProblem, multiple: int, time_limit_s: float, solver: str,
                          least: int) -> PartitionResult:
    """The ILP for a model of one layer kind: one integer layer count per stage (a multiple of
    `multiple`, at least `least`) instead of p x L placement binaries; any counts form a
    contiguous split. Exact per-stage layer limits (max_layers) replace the additive memory."""
    import pulp

    p, L = prob.p, prob.L
    c, k = prob.layer_time[:, 0], prob.layer_mem[:, 0]
    lp = pulp.LpProblem("stage_partition_counts", pulp.LpMinimize)
    q = [pulp.LpVariable(f"q_{i}", lowBound=max(1, -(-least // multiple)), cat="Integer") for i in range(p)]
    T = pulp.LpVariable("T", lowBound=0)
    times = []
    for i in range(p):
        n_i = multiple * q[i]
        t_i = float(c[i]) * n_i + float(prob.extra_time[i])
        lp += T >= t_i
        if prob.max_layers is not None:
            lp += n_i <= int(prob.max_layers[i])
        else:
            lp += float(k[i]) * n_i + float(prob.extra_mem[i]) <= float(prob.capacity[i])
        times.append(t_i)
    lp += pulp.lpSum(multiple * qi for qi in q) == L
    lp += (prob.m - 1.0 / prob.v) * T + pulp.lpSum(times) * (1.0 / prob.v)
    return _solve(lp, T, prob, solver, time_limit_s, lambda: [int(round(pulp.value(qi))) * multiple for qi in q])
