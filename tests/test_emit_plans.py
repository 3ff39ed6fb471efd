"""`planner plan` output (planner/emit/plans.py): the JSON document of a search has the keys
docs/json.md lists, its figures follow from the plan's own numbers, the small texts (GPU use per
node group, token counts, layout, optimality), and the message when nothing fits carries the
shortfall of the closest plan."""

import dataclasses

import pytest

from planner.library import load_cluster_ref, load_model_ref
from planner.emit.plans import (MODEL_STATE_BYTES_PER_PARAM, MODEL_STATE_SHARE, group_use_text, layout_text,
                                no_fit_document, optimality_text, plan_document, search_info, tokens_text)
from planner.search.objective import Figures, GroupUse
from planner.search.planner import search
from planner.search.space import SearchOptions
from planner.strategy import Strategy

GIB = 2**30
SECONDS_PER_DAY = 86_400
LLAMA = load_model_ref("llama3-8b")
DGX = load_cluster_ref("dgx-h100-x8")   # 64 H100, no prices
OPTS = SearchOptions(global_batch_size=64, seq_length=2048, top=2)


@pytest.fixture(scope="module")
def result():
    return search(LLAMA, DGX, OPTS)


# the keys docs/json.md lists for `planner plan --json`
TOP_KEYS = {"status", "gap", "objective", "train_tokens", "plans", "search", "idle_node_groups"}
SEARCH_KEYS = {"candidates", "pruned", "pruned_memory", "pruned_bound", "pruned_dominated", "priced", "seconds",
               "solver", "status", "optimality_gap", "objective", "gpus", "max_gpus", "min_gpu_fraction",
               "charge_idle", "all"}
PLAN_KEYS = {"model", "plan", "memory", "time", "throughput", "communication", "gpus_used", "gpus_idle",
             "node_groups", "cost"}
MEMORY_KEYS = {"peak_bytes_per_gpu", "capacity_bytes_per_gpu", "fits", "verdict", "uncertainty_fraction",
               "most_loaded_stage", "breakdown", "per_stage"}
COST_KEYS = {"tokens_per_s", "usd_per_hour", "usd_per_million_tokens", "train_tokens", "days_to_train", "usd_total",
             "idle_gpus_charged"}
COMM_KEYS = {"axis", "kind", "bytes", "group_size", "count_per_step", "time_s", "exposed_s", "link", "stage"}


def test_plan_document_has_the_documented_keys(result):
    doc = plan_document(result, search_info(result, OPTS), OPTS, 2e12, model_file="llama3-8b.yaml")
    assert TOP_KEYS <= set(doc)
    assert SEARCH_KEYS <= set(doc["search"])
    assert (doc["status"], doc["gap"], doc["objective"], doc["train_tokens"]) == ("optimal", 0.0, "throughput", 2e12)
    assert len(doc["plans"]) == 2
    for p in doc["plans"]:
        assert PLAN_KEYS <= set(p)
        assert set(p["model"]) == {"name", "parameters", "active_parameters", "file"}
        assert p["model"]["file"] == "llama3-8b.yaml"
        assert MEMORY_KEYS <= set(p["memory"])
        assert set(p["memory"]["breakdown"]) >= {"parameters", "gradients", "optimizer", "activations", "buffers"}
        assert {"step_s", "breakdown"} <= set(p["time"])
        assert {"compute", "exposed_communication", "bubble", "optimizer",
                "exposed_communication_by_axis"} <= set(p["time"]["breakdown"])
        assert {"tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "mfu_basis",
                "mfu_of_gemm_dtype_peak"} <= set(p["throughput"])
        assert all(COMM_KEYS <= set(row) for row in p["communication"])
        assert [set(g) for g in p["node_groups"]] == [{"name", "gpu", "gpus", "used", "idle", "price_per_gpu_hour"}]
        assert set(p["cost"]) == COST_KEYS
    # pruned is the sum of its three parts
    s = doc["search"]
    assert s["pruned"] == s["pruned_memory"] + s["pruned_bound"] + s["pruned_dominated"]


def test_plan_entry_figures_follow_from_the_plan():
    """At most 32 of the 64 GPUs (--max-gpus 32): GPUs used tp x pp x dp x cp of #1, the rest of
    the 64 idle; tokens/s = 64 x 2048 tokens a step over the step time; days to 2e12 tokens =
    2e12 / tokens/s / 86400; no prices in the cluster file, so dollars are null."""
    o = dataclasses.replace(OPTS, max_gpus=32)
    result = search(LLAMA, DGX, o)
    doc = plan_document(result, search_info(result, o), o, 2e12)
    p, e = doc["plans"][0], result.plans[0]
    s = e.strategy
    used = s.tp * s.pp * s.dp * s.cp
    assert 16 <= used <= 32 and doc["search"]["max_gpus"] == 32
    assert (p["gpus_used"], p["gpus_idle"]) == (used, 64 - used)
    assert p["node_groups"] == [{"name": "h100", "gpu": "h100-sxm-80g", "gpus": 64, "used": used, "idle": 64 - used,
                                 "price_per_gpu_hour": None}]
    tokens_per_s = 64 * 2048 / e.step_time_s
    assert p["cost"]["tokens_per_s"] == pytest.approx(tokens_per_s)
    assert p["cost"]["days_to_train"] == pytest.approx(2e12 / tokens_per_s / SECONDS_PER_DAY)
    assert p["cost"]["usd_per_hour"] is None and p["cost"]["usd_total"] is None
    assert "model" in p and "file" not in p["model"]
    # no token budget: no days
    assert plan_document(result, search_info(result, o), o, None)["plans"][0]["cost"]["days_to_train"] is None


def _fig(*groups):
    return Figures(step_time_s=1.0, tokens_per_step=1, peak_bytes=0.0, groups=tuple(groups), idle_charged=False,
                   usd_per_hour=None, train_tokens=None)


def test_group_use_text_one_group_is_a_number():
    f = _fig(GroupUse("h100", "h100-80g", 64, 48, None))
    assert group_use_text(f, idle=False) == "48"
    assert group_use_text(f, idle=True) == "16"
    assert group_use_text(_fig(GroupUse("h100", "h100-80g", 64, 64, None)), idle=True) == "0"


def test_group_use_text_several_groups_names_those_with_any():
    """h100 32 of 32 used, a100 16 of 32: used 'h100 32 a100 16', idle only 'a100 16'; none idle: '0'."""
    f = _fig(GroupUse("h100", "h100-80g", 32, 32, None), GroupUse("a100", "a100-80g", 32, 16, None))
    assert group_use_text(f, idle=False) == "h100 32 a100 16"
    assert group_use_text(f, idle=True) == "a100 16"
    full = _fig(GroupUse("h100", "h100-80g", 32, 32, None), GroupUse("a100", "a100-80g", 32, 32, None))
    assert group_use_text(full, idle=True) == "0"


@pytest.mark.parametrize("n,text", [(2e12, "2T"), (1.5e12, "1.5T"), (15e9, "15B"), (1e6, "1M"),
                                    (123_456, "123.5K"), (999, "999"), (0, "0")])
def test_tokens_text(n, text):
    assert tokens_text(n) == text


def test_layout_text_lists_the_degrees_above_one_in_megatrons_order():
    assert layout_text(Strategy(tp=4, pp=4, vpp=5, dp=32)) == "tp4 pp4 vpp5 dp32"
    assert layout_text(Strategy(tp=2, cp=2, ep=8, pp=2, dp=4)) == "tp2 cp2 ep8 pp2 dp4"
    assert layout_text(Strategy()) == "dp1"


def test_the_recompute_and_moe_overlap_cells_name_the_execution_choices():
    assert Strategy(recompute="selective").recompute_label == "selective"            # Megatron's default core_attn
    assert Strategy(recompute="selective", recompute_modules=("layernorm", "moe_act")).recompute_label == \
        "selective layernorm moe_act"
    assert Strategy(recompute="full", recompute_num_layers=2).recompute_label == "full 2/chunk"
    assert Strategy(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True).moe_overlap_label == \
        "a2a 1F1B +wgrad"
    assert Strategy(moe_shared_expert_overlap=True).moe_overlap_label == "shared"
    assert Strategy().moe_overlap_label == "-"


def test_optimality_text_by_how_the_search_ended():
    assert "within 2.5% of the optimum: the search stopped at its time limit" in optimality_text(
        {"status": "time-limit", "optimality_gap": 0.025})
    assert "within 0.50% of the optimum: a stage-partition DP hit its work cap" in optimality_text(
        {"status": "optimal", "optimality_gap": 0.005})
    optimal = optimality_text({"status": "optimal", "optimality_gap": 0.0})
    assert optimal.startswith("#1 is optimal under the cost model")


def test_nothing_fits_message_carries_the_shortfall():
    """Llama 3 70B on one DGX H100 node: nothing fits. The error names the closest plan, its most
    loaded stage's need and usable memory in GiB and the difference between them; the "closest"
    block gives the same in bytes. The GPUs hint: 18 bytes a parameter (bf16 weight, fp32
    gradient, fp32 main weight and two Adam moments) over 80% of a GPU's usable memory."""
    one = dataclasses.replace(DGX, node_groups=(dataclasses.replace(DGX.node_groups[0], nodes=1),))
    m = load_model_ref("llama3-70b")
    o = SearchOptions(global_batch_size=16, seq_length=2048, top=1)
    r = search(m, one, o)
    assert r.plans == [] and r.closest is not None
    doc = no_fit_document(r, m, one, search_info(r, o), o)
    assert (doc["status"], doc["gap"], doc["plans"]) == ("no-plan", None, [])
    c = doc["closest"]
    assert c["short_bytes"] == pytest.approx(c["needed_bytes"] - c["usable_bytes"])
    assert c["short_bytes"] > 0
    worst = r.closest.memory[c["stage"]]
    assert (c["needed_bytes"], c["usable_bytes"]) == (worst.total, worst.capacity)
    short_text = f"({(worst.total - worst.capacity) / GIB:.1f} GiB short)"
    assert short_text in doc["error"]
    assert f"needs {worst.total / GIB:.1f} GiB of {worst.capacity / GIB:.1f} GiB usable" in doc["error"]
    s = r.closest.strategy
    assert f"Closest: tp={s.tp} pp={s.pp} dp={s.dp}" in doc["error"]
    assert doc["error"].startswith("no plan fits in memory") and "\n" not in doc["error"]
    assert MODEL_STATE_BYTES_PER_PARAM == 2 + 4 + 4 + 4 + 4 and MODEL_STATE_SHARE == 0.8
    gpus = m.parameters * 18 / (worst.capacity * 0.8)
    assert f"more GPUs (model states alone need about {gpus:,.0f} GPUs" in doc["error"]
    # the search already tried full recompute: not suggested again
    assert "full recompute" not in doc["error"]
