"""The pipeline timeline behind `--plot`: list-scheduled blocks agree with pipeline.py's closed
forms for equal stages, respect their dependencies and never overlap on a rank."""

import random

import pytest

from planner.cost.pipeline import pipeline_time
from planner.cost.timeline import makespan, simulate


@pytest.mark.parametrize("p,m,v,schedule", [(4, 8, 1, "1f1b"), (8, 8, 1, "1f1b"), (4, 8, 2, "interleaved"),
                                            (4, 16, 4, "interleaved"), (8, 16, 2, "interleaved"), (1, 4, 1, "1f1b")])
def test_equal_stages_match_the_closed_form(p, m, v, schedule):
    f, b, w, c = [1.0] * p, [2.0] * p, [0.8] * p, [0.1] * p
    blocks = simulate(f, b, w, c, m, v, schedule)
    assert makespan(blocks) == pytest.approx(pipeline_time(f, b, w, c, m, v, schedule).total_s, rel=1e-12)
    assert len(blocks) == 2 * p * m * (v if schedule == "interleaved" else 1)


def test_zero_bubble_never_slower_than_1f1b_on_equal_stages():
    f, b, w, c = [1.0] * 4, [2.0] * 4, [0.8] * 4, [0.0] * 4
    zb = makespan(simulate(f, b, w, c, 8, 1, "zb-h1"))
    assert zb < makespan(simulate(f, b, w, c, 8, 1, "1f1b"))


@pytest.mark.parametrize("seed", range(20))
def test_blocks_respect_dependencies_and_do_not_overlap(seed):
    rng = random.Random(seed)
    p, v = rng.randint(2, 6), rng.choice([1, 2, 3])
    m = p * rng.randint(1, 3)
    schedule = rng.choice(["1f1b", "interleaved", "zb-h1"])
    f = [rng.uniform(0.5, 2) for _ in range(p)]
    b = [2 * x for x in f]
    blocks = simulate(f, b, [0.3 * x for x in b], [rng.uniform(0, 0.2) for _ in range(p)], m, v, schedule)
    end = {(x.kind, x.stage, x.chunk, x.microbatch): x.end_s for x in blocks}
    vv = v if schedule == "interleaved" else 1
    for x in blocks:
        if x.kind == "F" and x.stage > 0:
            assert x.start_s >= end[("F", x.stage - 1, x.chunk, x.microbatch)] - 1e-12
        if x.kind == "B":
            assert x.start_s >= end[("F", x.stage, x.chunk, x.microbatch)] - 1e-12
            if x.stage < p - 1:
                assert x.start_s >= end[("B", x.stage + 1, x.chunk, x.microbatch)] - 1e-12
        if x.kind == "W":
            assert x.start_s >= end[("B", x.stage, x.chunk, x.microbatch)] - 1e-12
    for i in range(p):
        mine = sorted((x for x in blocks if x.stage == i), key=lambda x: x.start_s)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(mine, mine[1:]))
        assert sum(x.kind == "F" for x in mine) == m * vv
