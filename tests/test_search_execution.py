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


QWEN3 = load_model_ref("qwen3-235b-a22b")


@pytest.mark.parametrize("modules,ep_overlap", [(("layernorm", "moe_act"), True), (("moe_act",), False),
                                                (("core_attn",), True)])
def test_execution_choices_emit_a_launch_megatron_accepts_and_read_back_to_the_same_numbers(modules, ep_overlap):
    """What a family of the search sets (search/space.py LayerExecution) is emitted, passes
    Megatron's rules, and the launch read back prices the same step and memory."""
    from planner.search.space import LayerExecution
    kind = LayerExecution("selective", modules, ep_overlap=ep_overlap)
    s = Strategy(tp=2, pp=8, dp=16, ep=32, etp=1, vpp=2, micro_batch_size=1, global_batch_size=2048, seq_length=4096,
                 precision="fp8", fp8_recipe="tensorwise", overlap_grad_reduce=True, layers_per_stage=(12,) * 7 + (10,),
                 **kind.fields(shared_overlap=True))
    cluster = H800
    args = megatron_args(QWEN3, s)
    assert ("--overlap-moe-expert-parallel-comm" in args) == ep_overlap
    assert ("--delay-wgrad-compute" in args) == ep_overlap
    if modules != ("core_attn",):
        i = args.index("--recompute-modules")
        assert tuple(args[i + 1:i + 1 + len(modules)]) == modules
    launch = parse_words(args, "emitted", world_size=s.world_size)
    assert megatron_violations(launch, QWEN3) == []
    back = launch.strategy
    assert (back.recompute, back.recompute_modules, back.overlap_moe_expert_parallel_comm,
            back.delay_wgrad_compute) == ("selective", modules, ep_overlap, ep_overlap)
    a, b = estimate(QWEN3, cluster, s), estimate(QWEN3, cluster, back.with_(stage_node_groups=s.stage_node_groups))
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-12)
    assert b.peak_memory.total == pytest.approx(a.peak_memory.total, rel=1e-12)


def test_the_ep_overlap_is_offered_only_where_megatron_accepts_it():
    """EP > 1, no full or block recompute, at most one MTP layer; never with the shared-expert
    overlap; with pp > 1 only at vpp > 1 (search/space.py family_groups)."""
    from planner.search.space import layer_executions
    o = SearchOptions(global_batch_size=1024, seq_length=4096)
    assert not any(k.ep_overlap for k in layer_executions(QWEN3, o, 1))
    kinds = layer_executions(QWEN3, o, 8)
    assert {k.recompute for k in kinds if k.ep_overlap} == {"none", "selective"}
    assert all(not k.fields(True)["moe_shared_expert_overlap"] for k in kinds if k.ep_overlap)
    assert not any(k.ep_overlap for k in layer_executions(QWEN3, replace(o, moe_ep_overlap=False), 8))
    mtp2 = replace(DEEPSEEK, mtp_num_layers=2)
    assert not any(k.ep_overlap for k in layer_executions(mtp2, o, 8))


RECIPE_FLAGS = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
                "--group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 8192 "
                "--swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --position-embedding-type rope "
                "--disable-bias-linear --vocab-size 128256 --bf16 --use-distributed-optimizer "
                "--tensor-model-parallel-size 4 --micro-batch-size 1 --global-batch-size 128 "
                "--fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather --use-precision-aware-optimizer "
                "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --grad-reduce-in-bf16")


def test_a_compared_launchs_recipe_settings_are_planned_with():
    """With --compare-with a launch, every plan carries the launch's training-recipe settings
    (search/space.py recipe_settings): no ZeRO-0 plan (they need the distributed optimizer),
    and the emitted launches pass Megatron's rules."""
    from planner.megatron.emit import checked_args
    from planner.search.planner import search
    from planner.search.space import recipe_settings
    launch = parse_words(RECIPE_FLAGS.split(), "today", world_size=8)
    settings = dict(recipe_settings(launch.strategy, "fp8"))
    assert settings == {"fp8_param_gather": True, "use_precision_aware_optimizer": True, "exp_avg_dtype": "bf16",
                        "exp_avg_sq_dtype": "bf16", "grad_reduce_in_bf16": True}
    assert "fp8_param_gather" not in dict(recipe_settings(launch.strategy, "bf16"))   # bf16 plans: no fp8 copies
    model, cluster = load_model_ref("llama3-8b"), load_cluster_ref("dgx-h100-x8")
    o = SearchOptions(global_batch_size=128, seq_length=4096, top=3, precision="fp8", zero_stages=(0, 1),
                      settings=tuple(settings.items()))
    r = search(model, cluster, o)
    assert r.plans
    for e in r.plans:
        s = e.strategy
        assert all(getattr(s, k) == v for k, v in settings.items()) and s.zero_stage >= 1
        args = checked_args(model, s)
        assert "--fp8-param-gather" in args and "--use-precision-aware-optimizer" in args
        assert megatron_violations(parse_words(args, "emitted", world_size=s.world_size), model) == []
    # they are priced: the same plan without them keeps fp32 moments
    s0 = r.plans[0].strategy
    without = estimate(model, cluster, s0.with_(**{k: getattr(Strategy(), k) for k in settings}))
    assert without.peak_memory.optimizer > r.plans[0].peak_memory.optimizer


def test_a_flag_with_several_values_is_written_whole(tmp_path, monkeypatch):
    """launch.sh and megatron.args keep every value of a multi-value flag (--recompute-modules
    mla_up_proj layernorm moe_act): the launch read back recomputes the same modules."""
    from planner.emit import writer
    from planner.megatron.launch import parse_file
    from planner.search.space import LayerExecution
    modules = ("mla_up_proj", "layernorm", "moe_act")
    s = Strategy(tp=1, pp=16, dp=16, ep=8, micro_batch_size=1, global_batch_size=1024, seq_length=4096,
                 precision="fp8", fp8_recipe="tensorwise", overlap_grad_reduce=True, layers_per_stage=(4,) * 15 + (1,),
                 **LayerExecution("selective", modules).fields(shared_overlap=True))
    e = estimate(DEEPSEEK, H800, s)
    monkeypatch.chdir(tmp_path)
    writer.write_plans([e], "plans", force=False)
    back = parse_file(tmp_path / "plans" / "plan-1" / "launch.sh", env={})
    assert back.strategy.recompute_modules == modules
    assert "--recompute-modules mla_up_proj layernorm moe_act" in (tmp_path / "plans" / "plan-1" / "megatron.args").read_text()


def test_every_recipe_setting_a_plan_carries_is_emitted_and_read_back():
    """The launch of a plan carrying a compared launch's settings sets each of them: read
    back, the strategy has the same RECIPE_FIELDS (the precision-aware optimizer with fp32
    states, fused permutation and the fp32 router included)."""
    from planner.strategy import RECIPE_FIELDS
    settings = {"fp8_param_gather": True, "use_precision_aware_optimizer": True, "grad_reduce_in_bf16": True,
                "moe_router_dtype": "fp32", "moe_permute_fusion": True}
    s = Strategy(tp=1, pp=16, dp=16, ep=8, micro_batch_size=1, global_batch_size=1024, seq_length=4096,
                 recompute="full", precision="fp8", fp8_recipe="tensorwise", overlap_grad_reduce=True,
                 layers_per_stage=(4,) * 15 + (1,), **settings)
    args = megatron_args(DEEPSEEK, s)
    back = parse_words(args, "emitted", world_size=s.world_size)
    assert megatron_violations(back, DEEPSEEK) == []
    assert {f: getattr(back.strategy, f) for f in RECIPE_FIELDS} == {f: getattr(s, f) for f in RECIPE_FIELDS}


def test_a_plan_json_carries_the_execution_choices_back_to_check(tmp_path):
    """planner check --plan reads what plan --json wrote: the recompute modules, the MoE overlaps,
    the fp8 recipe and every recipe setting (strategy.PLAN_JSON_FIELDS); a bad value is named."""
    import json
    from planner.emit.report import estimate_to_dict
    from planner.errors import SpecError
    from planner.megatron.check import strategy_from_plan_json
    from planner.search.space import LayerExecution
    from planner.strategy import PLAN_JSON_FIELDS
    s = Strategy(tp=1, pp=16, dp=16, ep=8, vpp=1, micro_batch_size=1, global_batch_size=1024, seq_length=4096,
                 precision="fp8", fp8_recipe="tensorwise", overlap_grad_reduce=True, layers_per_stage=(4,) * 15 + (1,),
                 fp8_param_gather=True, use_precision_aware_optimizer=True, exp_avg_dtype="bf16",
                 moe_permute_fusion=True, moe_router_dtype="fp32",
                 **LayerExecution("selective", ("mla_up_proj", "layernorm", "moe_act")).fields(shared_overlap=True))
    f = tmp_path / "plan.json"
    f.write_text(json.dumps({"plans": [estimate_to_dict(estimate(DEEPSEEK, H800, s))]}))
    back = strategy_from_plan_json(str(f))
    for name in PLAN_JSON_FIELDS + ("recompute", "recompute_modules", "fp8_recipe", "moe_token_dispatcher_type"):
        assert getattr(back, name) == getattr(s, name), name
    doc = json.loads(f.read_text())
    doc["plans"][0]["plan"]["recompute_modules"] = ["moe_act", "bogus"]
    f.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="plan.recompute_modules"):
        strategy_from_plan_json(str(f))


@pytest.mark.parametrize("model_name", ["deepseek-v3", "qwen3-235b-a22b", "mixtral-8x22b", "llama3-70b"])
def test_no_layer_execution_is_faster_than_its_floor(model_name):
    """The search queues a recomputing family under the bound of its class without recompute
    (LayerExecution.floor, best_first._floor_lb): on bundled models and every GPU of a mixed
    cluster, each execution's per-layer costs and family bound are at least its floor's."""
    from planner.estimate import time_key
    from planner.search.bounds import Bounds
    from planner.search.space import layer_executions, stage_layouts
    model, cluster = load_model_ref(model_name), load_cluster_ref("mixed-512")
    o = SearchOptions(global_batch_size=1024, seq_length=4096, recompute=("none", "selective", "full"))
    bounds = Bounds(model, cluster)
    names = tuple(g.name for g in cluster.node_groups)
    checked = 0
    for tp, ep, etp, mbs, pp, dp in ((1, 1, 1, 1, 8, 64), (4, 8, 1, 2, 8, 16), (8, 8, 2, 1, 16, 4)):
        if not model.is_moe:
            ep = etp = 1
        per = tp * dp
        caps = bounds.stage_caps(per, pp, stage_layouts(cluster, per, pp))
        for kind in layer_executions(model, o, ep):
            def strategy(k):
                return Strategy(tp=tp, ep=ep, etp=etp, pp=pp, dp=dp, vpp=1, micro_batch_size=mbs,
                                global_batch_size=1024, seq_length=4096, sequence_parallel=tp > 1,
                                **k.fields(False))
            s, f = strategy(kind.time_class), strategy(kind.floor)
            for g in names:
                own, low = bounds.layer_costs(s, time_key(s), g), bounds.layer_costs(f, time_key(f), g)
                assert own[0] >= low[0] and own[1] >= low[1], (kind, g)
            assert (bounds.family(s, time_key(s), pp, s.num_microbatches, per, caps, 1)
                    >= bounds.family(f, time_key(f), pp, f.num_microbatches, per, caps, 1)), kind
            checked += kind.floor != kind.time_class
    assert checked >= 3


@pytest.mark.parametrize("model_name", ["deepseek-v3", "llama3-70b"])
def test_the_bytes_a_gpu_can_allocate_do_not_depend_on_recompute(model_name):
    """The family screen keys the bytes a GPU can allocate by the time class up to its recompute
    (family_screen.py add_group's alloc_key): recompute and its modules change none of them,
    with or without the memory model's margin; TP comm overlap (userbuffers) does."""
    from planner.cost.memory import usable_bytes
    from planner.search.space import layer_executions

    model, cluster = load_model_ref(model_name), load_cluster_ref("mixed-512")
    o = SearchOptions(global_batch_size=1024, seq_length=4096, recompute=("none", "selective", "full"))
    ep = 8 if model.is_moe else 1
    base = Strategy(tp=4, ep=ep, pp=8, dp=16, micro_batch_size=2, global_batch_size=1024, seq_length=4096,
                    sequence_parallel=True)
    for g in cluster.node_groups:
        for margin in (False, True):
            got = {usable_bytes(model, base.with_(**kind.fields(False)), g.gpu, margin)
                   for kind in layer_executions(model, o, ep) if not kind.ep_overlap}
            assert len(got) == 1, (g.name, margin, got)
            assert usable_bytes(model, base.with_(tp_comm_overlap=True), g.gpu, margin) not in got
