import itertools

import numpy as np
import pytest

from planner.search.partition import PartitionProblem, partition_dp, partition_ilp


def brute(prob, multiple=1):
    best = (float("inf"), None)
    L, p = prob.L, prob.p
    for cuts in itertools.combinations(range(1, L), p - 1):
        bounds = (0,) + cuts + (L,)
        split = tuple(bounds[i + 1] - bounds[i] for i in range(p))
        if any(n % multiple for n in split) or not prob.feasible(split):
            continue
        t, _ = prob.stage_costs(split)
        best = min(best, (prob.objective(t), split))
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
