"""What-if sweeps (planner/search/sweep.py): the --nodes grammar, the options a sweep runs
(each cluster at each combination of node counts), and that each cell's best plan is the #1
of `planner.search` run alone on that cell."""

import dataclasses

import pytest

from planner.errors import SpecError
from planner.library import load_cluster_ref, load_model_ref
from planner.search.planner import search
from planner.search.space import SearchOptions
from planner.search.sweep import MAX_OPTIONS, parse_nodes, run_sweep, sweep_options

LLAMA = load_model_ref("llama3-8b")
DGX = load_cluster_ref("dgx-h100-x8")          # one group, h100: 8 nodes of 8
LAB = load_cluster_ref("h100-a100-lab")        # h100: 4 nodes, a100: 4 nodes
SMALL = SearchOptions(global_batch_size=32, seq_length=2048, top=3)


def test_parse_nodes_every_group_or_one_group():
    assert parse_nodes(["16,32,64"]) == ((16, 32, 64), {})
    assert parse_nodes(["h100=8,16"]) == (None, {"h100": (8, 16)})
    assert parse_nodes(["1,2", "a100=4"]) == ((1, 2), {"a100": (4,)})
    assert parse_nodes(None) == (None, {})


@pytest.mark.parametrize("values,says", [
    (["0,2"], "expected node counts in [1, 100000]"),
    (["two"], "found 'two'"),
    (["h100="], "found 'h100='"),
    (["=4"], "found '=4'"),
    (["1,2", "4"], "give the counts for every group once"),
    (["h100=1", "h100=2"], "given twice"),
])
def test_parse_nodes_refuses_bad_values_in_one_line(values, says):
    with pytest.raises(SpecError) as exc:
        parse_nodes(values)
    assert "--nodes" in str(exc.value) and says in str(exc.value) and "\n" not in str(exc.value)


def test_options_one_group_at_each_count():
    opts = sweep_options([DGX], (1, 2), {})
    assert [o.label for o in opts] == ["h100=1", "h100=2"]
    assert [o.cluster.num_gpus for o in opts] == [8, 16]
    assert {o.base for o in opts} == {"dgx-h100-x8"}


def test_options_every_combination_of_named_groups():
    """h100 at 1, 2 and a100 at 1, 2: four clusters, h100 the outer loop (the file's group order)."""
    opts = sweep_options([LAB], None, {"h100": (1, 2), "a100": (1, 2)})
    assert [o.nodes for o in opts] == [(("h100", 1), ("a100", 1)), (("h100", 1), ("a100", 2)),
                                       (("h100", 2), ("a100", 1)), (("h100", 2), ("a100", 2))]
    assert [o.cluster.num_gpus for o in opts] == [16, 24, 24, 32]
    # a group not named keeps the file's nodes (a100: 4)
    kept = sweep_options([LAB], None, {"h100": (1, 2)})
    assert [o.label for o in kept] == ["h100=1 a100=4", "h100=2 a100=4"]
    # counts for every group move the groups not named together
    every = sweep_options([LAB], (1, 3), {"h100": (2,)})
    assert [o.label for o in every] == ["h100=2 a100=1", "h100=2 a100=3"]


def test_options_refuse_an_unknown_group_and_too_many_options():
    with pytest.raises(SpecError, match="no cluster has a node group of that name"):
        sweep_options([DGX], None, {"a100": (1,)})
    too_many = tuple(range(1, 18))   # 17 x 17 = 289 combinations
    assert len(too_many) ** 2 > MAX_OPTIONS
    with pytest.raises(SpecError, match=f"expected at most {MAX_OPTIONS}"):
        sweep_options([LAB], None, {"h100": too_many, "a100": too_many})


def test_each_cell_is_the_searchs_own_number_one():
    """Two cells (llama3-8b on 1 and 2 DGX H100 nodes, global batch 32, seq 2048), one process:
    each cell's plan is the #1 of search() on that cluster alone (top 3), and its status and
    counts are those of search() with top 1, which is what the sweep runs (run_sweep)."""
    opts = sweep_options([DGX], (1, 2), {})
    done = []
    out = run_sweep(LLAMA, opts, SMALL, jobs=1, on_done=lambda k, n: done.append((k, n)))
    assert done == [(1, 2), (2, 2)]
    for option, cell in zip(opts, out):
        alone = search(LLAMA, option.cluster, SMALL)
        top1 = search(LLAMA, option.cluster, dataclasses.replace(SMALL, top=1))
        assert cell.option is option and cell.error is None
        assert cell.plan.strategy == alone.plans[0].strategy
        assert cell.plan.step_time_s == alone.plans[0].step_time_s
        assert top1.plans[0].strategy == alone.plans[0].strategy
        assert (cell.status, cell.gap, cell.candidates, cell.priced) == \
            (top1.status, top1.optimality_gap, top1.candidates, top1.priced)
        assert cell.figures.step_time_s == alone.plans[0].step_time_s
        assert cell.figures.gpus_used == alone.plans[0].strategy.world_size
        assert cell.figures.tokens_per_step == 32 * 2048


def test_a_cell_where_nothing_fits_says_so():
    """Llama 3 70B on one DGX (8 x 80 GB): its bf16 weights, fp32 gradients and Adam states
    (18 bytes x 70e9 = 1.26 TB) exceed the node's 640 GB under ZeRO 0 / 1, so every candidate
    is pruned by memory."""
    one = dataclasses.replace(DGX, node_groups=(dataclasses.replace(DGX.node_groups[0], nodes=1),))
    opts = sweep_options([one], None, {})
    [cell] = run_sweep(load_model_ref("llama3-70b"), opts, SearchOptions(global_batch_size=16, seq_length=2048),
                       jobs=1)
    assert (cell.status, cell.plan, cell.figures) == ("no-plan", None, None)
    assert cell.error == "nothing priced fits in memory" and cell.candidates > 0
