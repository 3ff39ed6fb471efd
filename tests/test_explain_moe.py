"""--explain's MoE layer: its terms are the step time's own (the exposed all-to-alls of every
MoE layer and micro-batch add up to the step's exposed EP), its parts add up to the layer's
forward, and the EP overlap schedule shows what it hid."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from planner.emit.moe import moe_layer_terms, render_moe_layer
from planner.estimate import estimate
from planner.library import load_cluster_ref, load_model_ref
from planner.strategy import Strategy

MIXTRAL = load_model_ref("mixtral-8x7b")
CLUSTER = load_cluster_ref("dgx-h100-x8")


def _plan(**kw):
    base = dict(tp=1, pp=1, dp=64, ep=8, global_batch_size=512, micro_batch_size=1, seq_length=4096,
                recompute="none")
    base.update(kw)
    return estimate(MIXTRAL, CLUSTER, Strategy(**base))


def test_exposed_all_to_alls_add_up_to_the_steps_exposed_ep():
    e = _plan()
    t = moe_layer_terms(e)
    per_step = t.exposed_all_to_all_s * MIXTRAL.num_layers * e.strategy.num_microbatches
    assert per_step == pytest.approx(e.breakdown["exposed_communication_by_axis"]["ep"], rel=1e-9)
    assert sum(s for _, s in t.parts_forward_s) == pytest.approx(t.gpu_forward_s, rel=1e-9)
    assert {"router", "permute", "experts_fc1", "experts_fc2", "unpermute"} <= {p for p, _ in t.parts_forward_s}


def test_ep_overlap_hides_all_to_alls_and_says_so():
    plain = moe_layer_terms(_plan(pp=2, dp=32, vpp=2))
    overlapped = moe_layer_terms(_plan(pp=2, dp=32, vpp=2, overlap_moe_expert_parallel_comm=True,
                                       delay_wgrad_compute=True))
    assert overlapped.overlap and not plain.overlap
    assert overlapped.exposed_all_to_all_s < plain.exposed_all_to_all_s
    assert overlapped.hidden_all_to_all_s > plain.hidden_all_to_all_s
    out = io.StringIO()
    render_moe_layer(_plan(pp=2, dp=32, vpp=2, overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True),
                     Console(file=out, width=140))
    assert "hidden (EP overlap schedule)" in out.getvalue() and "expert fc1 (grouped GEMM)" in out.getvalue()


def test_dense_models_have_no_moe_section():
    e = estimate(load_model_ref("llama3-8b"), CLUSTER, Strategy(tp=1, dp=64, global_batch_size=512, seq_length=4096))
    assert moe_layer_terms(e) is None
