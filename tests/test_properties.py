"""Property-based tests: loaders and the Megatron parser never crash on random input (they
either load or raise SpecError), and cost-model invariants hold."""

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from planner.emit.megatron_parse import parse_text
from planner.emit.report import estimate_to_dict
from planner.errors import PlannerError, SpecError
from planner.estimate import _layer_time, _time_key, estimate
from planner.library import load_cluster_ref, load_model_ref
from planner.specs.model import model_from_dict
from planner.strategy import Strategy
from planner.yamlio import load_text

LLAMA = load_model_ref("llama3-8b")
CLUSTER = load_cluster_ref("dgx-h100-x8")
FLAGS = ["--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--vocab-size",
         "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
         "--global-batch-size", "--swiglu", "--bf16", "--fp16", "--recompute-granularity", "--foo"]


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_yaml_loader_never_crashes(text):
    try:
        data = load_text(text, "x.yaml")
        model_from_dict(data, "x.yaml")
    except SpecError:
        pass


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(FLAGS), st.integers(-3, 5000).map(str), st.text(max_size=8)), max_size=30))
def test_megatron_parser_never_crashes(words):
    try:
        parse_text(" ".join(words) + " --world-size 16", "launch.sh", env={})
    except PlannerError:
        pass


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), mbs=st.sampled_from([1, 2]),
       rec=st.sampled_from(["none", "selective", "full"]), z=st.sampled_from([0, 1, 2, 3]))
def test_step_time_never_beats_compute_and_json_is_deterministic(tp, pp, mbs, rec, z):
    dp = 64 // (tp * pp)
    s = Strategy(tp=tp, pp=pp, dp=dp, micro_batch_size=mbs, global_batch_size=dp * mbs * 8,
                 seq_length=2048, recompute=rec, zero_stage=z)
    e = estimate(LLAMA, CLUSTER, s)
    gpu = CLUSTER.node_groups[0].gpu
    per_layer = _layer_time(LLAMA, _time_key(s), gpu, False).total
    bound = per_layer * (LLAMA.num_layers / pp) * s.num_microbatches
    assert e.step_time_s >= bound * (1 - 1e-9)
    a = json.dumps(estimate_to_dict(e), sort_keys=True)
    b = json.dumps(estimate_to_dict(estimate(LLAMA, CLUSTER, s)), sort_keys=True)
    assert a == b
