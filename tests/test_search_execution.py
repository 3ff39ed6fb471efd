"""Execution settings the search plans with (search/space.py execution_of): a MoE model with a
shared expert overlaps it with the dispatcher's all-to-alls (--moe-shared-expert-overlap, as
NVIDIA's DeepSeek-V3 recipes do), which the model never prices slower, and the launch carries
it where Megatron accepts it."""

from dataclasses import replace

import pytest

from planner.estimate import estimate
from planner.library import load_cluster_ref, load_model_ref
from planner.megatron.emit import megatron_args
from planner.megatron.launch import parse_words
from planner.megatron.rules import megatron_violations
from planner.search.space import SearchOptions, execution_of
from planner.strategy import Strategy

H800 = load_cluster_ref("h800-x256")
DEEPSEEK = load_model_ref("deepseek-v3")


def test_shared_expert_overlap_only_for_models_with_a_shared_expert():
    o = SearchOptions(global_batch_size=1024, seq_length=4096)
    assert execution_of(DEEPSEEK, o, H800)["moe_shared_expert_overlap"] is True
    assert execution_of(load_model_ref("mixtral-8x7b"), o, H800)["moe_shared_expert_overlap"] is False
    assert execution_of(load_model_ref("llama3-8b"), o, H800)["moe_shared_expert_overlap"] is False


@pytest.mark.parametrize("ep,mbs", [(8, 1), (64, 1), (8, 2)])
def test_overlapping_the_shared_expert_never_lengthens_the_step(ep, mbs):
    """The shared expert beside the all-to-all (slowed by its SM share) instead of after it."""
    s = Strategy(tp=1, pp=16, dp=128, ep=ep, micro_batch_size=mbs, global_batch_size=2048, seq_length=4096,
                 recompute="full", precision="fp8", fp8_recipe="tensorwise", overlap_grad_reduce=True,
                 layers_per_stage=(4,) * 15 + (1,))
    plain = estimate(DEEPSEEK, H800, s).step_time_s
    overlapped = estimate(DEEPSEEK, H800, replace(s, moe_shared_expert_overlap=True)).step_time_s
    assert overlapped < plain


def test_the_launch_carries_it_and_megatron_rules_accept_it_only_with_alltoall_or_flex():
    s = Strategy(tp=1, pp=16, dp=16, ep=8, micro_batch_size=1, global_batch_size=1024, seq_length=4096,
                 recompute="full", moe_shared_expert_overlap=True, layers_per_stage=(4,) * 15 + (1,))
    args = megatron_args(DEEPSEEK, s)
    assert "--moe-shared-expert-overlap" in args
    assert megatron_violations(parse_words(args, "emitted", world_size=s.world_size)) == []
    gathered = megatron_args(DEEPSEEK, replace(s, moe_token_dispatcher_type="allgather"))
    rules = {v.rule for v in megatron_violations(parse_words(gathered, "emitted", world_size=s.world_size))}
    assert "shared-expert-overlap" in rules
