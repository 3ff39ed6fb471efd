"""The cache key of layer times (estimate.LAYER_TIME_FIELDS) holds every Strategy field that
cost/compute.py layer_time reads: layer_time runs on a Strategy that records each field it
touches (properties included, as they read fields through the same object), over models and
launch choices that take every branch of it. A field read but not in the key would let the
search reuse a stale cached time; this test fails then."""

from __future__ import annotations

import itertools
import sys
from dataclasses import fields

import pytest

from planner.cost.compute import layer_time
from planner.estimate import (LAYER_TIME_FIELDS, MOE_ONLY_LAYER_TIME_FIELDS, SCHEDULE_ONLY_LAYER_TIME_FIELDS, layer_time_of,
                             time_key)
from planner.library import load_bundled_profile, load_model_ref
from planner.strategy import Strategy

_FIELDS = frozenset(f.name for f in fields(Strategy))
_READ: set = set()


# Reads that copy or hash a strategy (dataclasses.replace, __init__ / __post_init__, with_,
# the cached hash) touch every field without depending on it: not recorded.
_COPYING = frozenset({"__init__", "__post_init__", "with_", "replace", "_replace", "hash_once", "__hash__", "__eq__"})


class _Recording(Strategy):
    """A Strategy that notes every field read from it (but by the code that copies it)."""

    def __getattribute__(self, name):
        if name in _FIELDS and sys._getframe(1).f_code.co_name not in _COPYING:
            _READ.add(name)
        return super().__getattribute__(name)


def _recording(s: Strategy) -> Strategy:
    return _Recording(**{f: getattr(s, f) for f in _FIELDS})


# launch choices that change which branches layer_time takes
_VARIANTS = [
    {},
    {"precision": "fp8", "fp8_recipe": "delayed"},
    {"precision": "fp8", "fp8_recipe": "tensorwise"},
    {"precision": "fp8", "fp8_recipe": "blockwise"},
    {"recompute": "none"},
    {"recompute": "full"},
    {"recompute": "selective", "recompute_modules": ("core_attn", "mlp", "moe_act", "layernorm", "mla_up_proj", "moe")},
    {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("attn", "moe_router")},
    {"cuda_graph_impl": "local", "cuda_graph_scope": ("full_iteration",)},
    {"tp_comm_overlap": True},
    {"cp": 2},
    {"fused_attention": False},
    {"moe_token_dispatcher_type": "allgather"},
    {"moe_token_dispatcher_type": "flex"},
    {"moe_pad_expert_input_to_capacity": True},
    {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True},
    {"moe_shared_expert_overlap": True},
]


@pytest.mark.parametrize("model_name", ["llama3-8b", "deepseek-v3", "mixtral-8x22b", "qwen3-235b-a22b"])
def test_layer_time_reads_only_fields_of_its_cache_key(model_name):
    model = load_model_ref(model_name)
    _READ.clear()
    for gpu_name, variant in itertools.product(("h100-sxm-80g", "v100-sxm2-32g"), _VARIANTS):
        base = Strategy(tp=2, ep=8 if model.is_moe else 1, micro_batch_size=2, seq_length=4096, **variant)
        for moe in model.layer_kinds:
            layer_time(model, _recording(base), load_bundled_profile(gpu_name), moe)
    assert _READ, "nothing recorded: the recording Strategy is not what layer_time reads"
    missing = _READ - set(LAYER_TIME_FIELDS)
    assert not missing, f"layer_time reads {sorted(missing)}, absent from estimate.LAYER_TIME_FIELDS"


def test_dense_layers_read_no_moe_only_field():
    """Dense layer times are cached without the MoE-only fields (estimate.layer_time_of shares one
    entry across EP degrees): a dense layer must not read them."""
    model = load_model_ref("llama3-8b")
    _READ.clear()
    for variant in _VARIANTS:
        layer_time(model, _recording(Strategy(tp=2, seq_length=4096, **variant)), load_bundled_profile("h100-sxm-80g"),
                   False)
    assert not (_READ & MOE_ONLY_LAYER_TIME_FIELDS), sorted(_READ & MOE_ONLY_LAYER_TIME_FIELDS)


@pytest.mark.parametrize("model_name", ["deepseek-v3", "qwen3-235b-a22b"])
def test_layer_time_reads_no_schedule_only_field(model_name):
    """Layer times of both kinds are cached without the MoE schedule's overlap choices
    (estimate.layer_time_of shares one entry across them; only moe_layer_floor reads them):
    layer_time must not read them, and a time key that differs in them alone gets the same
    cached times as computing each afresh."""
    model = load_model_ref(model_name)
    gpu = load_bundled_profile("h100-sxm-80g")
    _READ.clear()
    for variant in _VARIANTS:
        for moe in model.layer_kinds:
            layer_time(model, _recording(Strategy(tp=2, ep=8, micro_batch_size=2, seq_length=4096, **variant)), gpu, moe)
    assert _READ and not (_READ & SCHEDULE_ONLY_LAYER_TIME_FIELDS), sorted(_READ & SCHEDULE_ONLY_LAYER_TIME_FIELDS)
    plain = Strategy(tp=2, ep=8, micro_batch_size=2, seq_length=4096)
    overlapped = plain.with_(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True,
                             moe_shared_expert_overlap=True)
    layer_time_of.cache_clear()
    for s in (plain, overlapped):
        for moe in model.layer_kinds:
            assert layer_time_of(model, time_key(s), gpu, moe) == layer_time(model, s, gpu, moe)
