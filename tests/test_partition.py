import itertools

import numpy as np
import pytest

from planner.search.partition import PartitionProblem, partition_dp, partition_ilp


def brute(prob, multiple=1):
    """The least objective over every split (the step: pipeline + the largest after-step term
    where prob.after is set, else the pipeline)."""
    best = (float("inf"), None)
    L, p = prob.L, prob.p
    for cuts in itertools.combinations(range(1, L), p - 1):
        bounds = (0,) + cuts + (L,)
        split = tuple(bounds[i + 1] - bounds[i] for i in range(p))
        if any(n % multiple for n in split) or not prob.feasible(split):
            continue
        best = min(best, (prob.step_time(split), split))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_dp_and_ilp_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    p, L = int(rng.integers(2, 4)), int(rng.integers(6, 11))
    speed = rng.uniform(0.5, 2.0, size=(p, 1))             # heterogeneous GPUs per stage
    layer = rng.uniform(0.8, 1.2, size=(1, L))              # dense vs MoE-like layers
    lt = speed * layer
    lm = rng.uniform(1.0, 2.0, size=(p, L)) * np.linspace(1.5, 1.0, p)[:, None]
    prob = PartitionProblem(lt, lm, rng.uniform(0, 1, p), rng.uniform(0, 2, p),
                            np.full(p, float(rng.uniform(6, 12))), m=int(rng.integers(2, 16)), v=1)
    obj, split = brute(prob)
    dp = partition_dp(prob)
    if split is None:
        assert dp.layers is None
        return
    assert dp.objective == pytest.approx(obj, rel=1e-9)
    ilp = partition_ilp(prob)
    assert ilp.objective == pytest.approx(obj, rel=1e-6)


@pytest.mark.parametrize("seed", range(16))
def test_uniform_layers_greedy_path_matches_brute_force(seed):
    """A model of one layer kind takes partition_dp's greedy path; it must agree with brute
    force too, with virtual-stage multiples and memory that binds."""
    rng = np.random.default_rng(100 + seed)
    p, multiple = int(rng.integers(2, 5)), int(rng.choice([1, 2]))
    L = multiple * int(rng.integers(p, 12 // multiple + p))
    speed = rng.uniform(0.5, 2.0, size=(p, 1))
    lt = np.repeat(speed, L, axis=1)
    lm = np.repeat(rng.uniform(1.0, 2.0, size=(p, 1)), L, axis=1)
    cap = np.full(p, float(rng.uniform(L / p * 1.5, L / p * 3.0)))
    prob = PartitionProblem(lt, lm, rng.uniform(0, 1, p), rng.uniform(0, 2, p), cap,
                            m=int(rng.integers(2, 16)), v=multiple)
    obj, split = brute(prob, multiple)
    dp = partition_dp(prob, multiple=multiple)
    if split is None:
        assert dp.layers is None and partition_ilp(prob, multiple=multiple).layers is None
        return
    assert dp.objective == pytest.approx(obj, rel=1e-9)
    assert sum(dp.layers) == L and all(n % multiple == 0 for n in dp.layers) and prob.feasible(dp.layers)
    ilp = partition_ilp(prob, multiple=multiple)   # the layer-count ILP of uniform layers
    assert ilp.objective == pytest.approx(obj, rel=1e-6)


def _after_by_count(rng, p, L, convex, by_interval):
    """After-step seconds that depend on a stage's layer count only: convex in it (DP traffic
    past the backward grows with the layers, one layer's share shrinks), or any; [p, L + 1] by
    count, or [p, L + 1, L + 1] by interval."""
    n = np.arange(L + 1)
    if convex:
        grow, share = rng.uniform(0.0, 1.5, size=(p, 1)), rng.uniform(0.0, 2.0, size=(p, 1))
        row = grow * np.maximum(n - rng.integers(0, L, size=(p, 1)), 0) + share / np.maximum(n, 1)
    else:
        row = rng.uniform(0.0, 4.0, size=(p, L + 1))
    row[:, 0] = np.inf
    if not by_interval:
        return row
    cnt = np.clip(n[None, :] - n[:, None], 0, L)
    return row[:, cnt]


@pytest.mark.parametrize("seed", range(24))
def test_dp_with_after_step_matches_brute_force(seed):
    """With after-step terms the DP minimises the step, not the pipeline alone: models of one
    layer kind (terms by count or by interval; the greedy path when each stage's allowed counts
    form one range, else the DP) and of two kinds (terms that depend on where the stage's
    layers start), against brute force."""
    rng = np.random.default_rng(300 + seed)
    p, multiple = int(rng.integers(2, 4)), int(rng.choice([1, 2]))
    L = multiple * int(rng.integers(p, 10 // multiple + p))
    speed = rng.uniform(0.5, 2.0, size=(p, 1))
    uniform = seed % 3 != 2
    lt = np.repeat(speed, L, axis=1) if uniform else speed * rng.uniform(0.8, 1.2, size=(1, L))
    lm = np.repeat(rng.uniform(1.0, 2.0, size=(p, 1)), L, axis=1)
    after = (_after_by_count(rng, p, L, convex=seed % 3 == 0, by_interval=seed % 2 == 0) if uniform
             else rng.uniform(0.0, 4.0, size=(p, L + 1, L + 1)))
    cap = np.full(p, float(rng.uniform(L / p * 1.5, L / p * 3.0)))
    prob = PartitionProblem(lt, lm, rng.uniform(0, 1, p), rng.uniform(0, 2, p), cap,
                            m=int(rng.integers(2, 8)), v=multiple, after=after)
    obj, split = brute(prob, multiple)
    dp = partition_dp(prob, multiple=multiple)
    if split is None:
        assert dp.layers is None
        return
    assert dp.status == "optimal"
    assert dp.objective == pytest.approx(obj, rel=1e-9)
    assert prob.step_time(dp.layers) == pytest.approx(obj, rel=1e-9)


def test_after_step_moves_layers_off_the_stage_it_binds():
    """Two equal stages, 1 s a layer, 4 layers, m = 4: the pipeline (m - 1) max t + sum t alone
    splits 2 / 2 (3 x 2 + 4 = 10 s; 1 / 3 takes 13). Stage 0's after-step grows 4 s a layer
    (its DP traffic outlasts its backward), stage 1's is 0.5 s: 2 / 2 steps 10 + 8 = 18 s,
    1 / 3 steps 13 + 4 = 17 s, 3 / 1 13 + 12 = 25 s: the step's split is 1 / 3."""
    rows = np.array([[np.inf, 4.0, 8.0, 12.0, 16.0], [np.inf, 0.5, 0.5, 0.5, 0.5]])
    n = np.arange(5)
    after = rows[:, np.clip(n[None, :] - n[:, None], 0, 4)]
    ones = np.ones((2, 4))
    prob = PartitionProblem(ones, ones, np.zeros(2), np.zeros(2), np.full(2, 100.0), m=4, v=1)
    assert partition_dp(prob).layers == (2, 2)
    with_after = partition_dp(PartitionProblem(ones, ones, np.zeros(2), np.zeros(2), np.full(2, 100.0), m=4, v=1,
                                               after=after))
    assert with_after.layers == (1, 3) and with_after.objective == 17.0
