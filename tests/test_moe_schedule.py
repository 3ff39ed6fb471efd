"""The MoE layer schedule (cost/moe_schedule.py) against timelines worked by hand from
Megatron-LM's order of operations (MoELayer; TransformerLayerSchedulePlan.run for
--overlap-moe-expert-parallel-comm), and the launch rules of that schedule
(TransformerConfig.__post_init__)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.moe_schedule import (A2A, NO_A2A, MoENodes, ScheduleNode, layer_period_s, moe_layer_floor_s,
                                        moe_layer_seconds)
from planner.estimate import layer_time_of, time_key
from planner.library import load_cluster_ref, load_model_ref
from planner.megatron.launch import parse_text
from planner.megatron.rules import megatron_violations
from planner.strategy import Strategy

# pre-dispatch: forward 1, input grads 2, weight grads 1; experts: 2, 2, 2; post-combine 0.5, 1, 0
PRE = ScheduleNode(1.0, 2.0, 1.0, 0.0, 0.0)
EXP = ScheduleNode(2.0, 2.0, 2.0, 0.0, 0.0)
POST = ScheduleNode(0.5, 1.0, 0.0, 0.0, 0.0)
GPU_ONLY = MoENodes(PRE, EXP, POST, host_a2a_s=0.0, synced=True)
A2A_1 = A2A(forward_s=2.0, backward_s=2.0)    # each all-to-all 1 s


def test_plain_layer_is_its_units_and_all_to_alls_in_a_row():
    assert layer_period_s(GPU_ONLY, NO_A2A, True, False, False, False) == pytest.approx(3.5)
    assert layer_period_s(GPU_ONLY, NO_A2A, False, True, False, False) == pytest.approx(8.0)
    assert layer_period_s(GPU_ONLY, A2A_1, True, False, False, False) == pytest.approx(5.5)
    assert layer_period_s(GPU_ONLY, A2A_1, False, True, False, False) == pytest.approx(10.0)


def test_ep_overlap_pair_follows_megatrons_order():
    """Worked by hand, one pair from t=0 (comm | comp):
    combine_b 0-2 | pre_f 0-1; experts_b (after combine_b) 2-6; dispatch_f 2-3;
    dispatch_b (after experts_b) 6-7; experts_f 6-8; combine_f (after experts_f) 8-9.5;
    pre_b (after dispatch_b, stream busy to 8) 8-11. The next pair starts its combine_b at 11
    (after pre_b) and its pre_f at 11 (stream): each pair takes 11 s, against 5.5 + 10 = 15.5
    with the forward and backward run apart."""
    assert layer_period_s(GPU_ONLY, A2A_1, True, True, True, False) == pytest.approx(11.0)
    # no all-to-all time: the compute stream's 10 s are the pair
    assert layer_period_s(GPU_ONLY, NO_A2A, True, True, True, False) == pytest.approx(10.0)


def test_shared_expert_overlap_hides_the_forward_all_to_alls():
    """--moe-shared-expert-overlap (plain schedule): the shared expert's fc1 runs beside the
    dispatch and its fc2 beside the combine. With pre-dispatch = 1 s of shared expert, each
    forward all-to-all 1 s: 0 + max(1, 0.5) + 2 + max(1, 0.5) + 0.5 = 4.5 s instead of 5.5 s;
    without all-to-alls the layer still takes its 3.5 s of work."""
    from dataclasses import replace
    n = replace(GPU_ONLY, shared_forward_s=1.0)
    assert layer_period_s(n, A2A_1, True, False, False, False, True) == pytest.approx(4.5)
    assert layer_period_s(n, NO_A2A, True, False, False, False, True) == pytest.approx(3.5)
    assert layer_period_s(n, A2A_1, True, False, False, False, False) == pytest.approx(5.5)


def test_delayed_weight_gradients_release_the_dispatch_backward_earlier():
    """With --delay-wgrad-compute the experts' weight gradients run after dispatch_b is issued:
    dispatch_b starts at 4 instead of 6, pre_b's input gradients (2 s) follow, its weight
    gradients (1 s) come last; the pair is never longer."""
    plain = layer_period_s(GPU_ONLY, A2A_1, True, True, True, False)
    delayed = layer_period_s(GPU_ONLY, A2A_1, True, True, True, True)
    assert delayed <= plain


def test_the_host_waits_for_the_token_counts():
    """pre-dispatch takes 3 s on the GPU and 1 s to issue; after it the host issues 2 s more
    (an all-to-all 0.5, experts 0.5, combine 0.5 + post 0.5). With dropless routing the host
    first waits for pre-dispatch to finish, so the GPU then idles while it issues: 3 + 2 = 5 s
    a layer. Without the wait the host runs ahead: max(3 s GPU, 3 s host) = 3 s."""
    pre = ScheduleNode(3.0, 0.0, 0.0, 1.0, 0.0)
    half = ScheduleNode(0.0, 0.0, 0.0, 0.5, 0.0)
    synced = MoENodes(pre, half, half, host_a2a_s=0.5, synced=True)
    free = MoENodes(pre, half, half, host_a2a_s=0.5, synced=False)
    assert layer_period_s(synced, NO_A2A, True, False, False, False) == pytest.approx(5.0)
    assert layer_period_s(free, NO_A2A, True, False, False, False) == pytest.approx(3.0)


def test_the_period_is_the_steady_state_not_a_transient():
    """A chain found by the property test below: merged pairs with delayed weight gradients, a
    busy host in the post-combine unit. Layer by layer it takes 10.25 s; with 1 s more of
    pre-dispatch weight gradients its first eight layers take 11.125 s and then 10.125 s each,
    and only from the ninth 10.25 s again. A period read off eight layers (the old chain) made
    the slower layer faster; the largest cycle mean of the layer's max-plus map is 10.25 s for
    both."""
    from dataclasses import replace
    pre = ScheduleNode(0.0, 0.0, 0.0, 0.0, 0.0)
    exp = ScheduleNode(0.0, 1.5, 1.25, 0.0, 1.75)
    post = ScheduleNode(1.5, 1.25, 4.625, 3.875, 4.5)
    nodes = MoENodes(pre, exp, post, host_a2a_s=0.0, synced=False)
    slower = replace(nodes, pre=replace(pre, weight_s=1.0))
    a2a = A2A(0.0, 0.25)
    assert layer_period_s(nodes, a2a, True, True, True, True) == pytest.approx(10.25)
    assert layer_period_s(slower, a2a, True, True, True, True) == pytest.approx(10.25)


_node = st.builds(ScheduleNode, *[st.floats(0.0, 5.0)] * 5)


@settings(max_examples=150, deadline=None)
@given(pre=_node, exp=_node, post=_node, h=st.floats(0.0, 1.0), synced=st.booleans(),
       a2a_f=st.floats(0.0, 5.0), a2a_b=st.floats(0.0, 5.0), which=st.integers(0, 9),
       extra=st.floats(0.01, 3.0), delay=st.booleans(), overlap=st.booleans())
def test_longer_work_never_shortens_a_layer(pre, exp, post, h, synced, a2a_f, a2a_b, which, extra, delay, overlap):
    """Slower kernels, a slower host or slower all-to-alls never make a layer faster, and the
    all-to-alls never make it faster than without them (the schedule is a max-plus system, and
    its largest cycle mean grows with every weight)."""
    from dataclasses import replace
    base = MoENodes(pre, exp, post, h, synced)
    a2a = A2A(a2a_f, a2a_b)
    nodes, comm = base, a2a
    fields = ("forward_s", "backward_s", "weight_s", "host_forward_s", "host_backward_s")
    if which < 5:
        nodes = replace(base, experts=replace(exp, **{fields[which]: getattr(exp, fields[which]) + extra}))
    elif which < 8:
        unit = ("pre", "post", "pre")[which - 5]
        n = getattr(base, unit)
        f = fields[which - 5]
        nodes = replace(base, **{unit: replace(n, **{f: getattr(n, f) + extra})})
    elif which == 8:
        comm = A2A(a2a_f + extra, a2a_b)
    else:
        nodes = replace(base, host_a2a_s=h + extra)
    for f, b in ((True, False), (False, True), (True, True)):
        before = layer_period_s(base, a2a, f, b, overlap, delay)
        after = layer_period_s(nodes, comm, f, b, overlap, delay)
        assert after >= before - 1e-9
        assert before >= layer_period_s(base, NO_A2A, f, b, overlap, delay) - 1e-9


def test_units_add_up_to_the_layer():
    """The pre-dispatch, experts and post-combine units of a MoE layer hold all of its GPU and
    host time (cost/compute.py layer_time; the selective recompute of core attention in their
    backward), so the plain schedule without all-to-alls and with a free host is the layer's GPU
    time. A full recompute is left out of the units and run as a forward of its own."""
    model = load_model_ref("qwen3-235b-a22b")
    gpu = load_cluster_ref("dgx-h100-x32").node_groups[0].gpu
    s = Strategy(tp=2, pp=8, dp=16, ep=32, etp=1, vpp=4, micro_batch_size=1, global_batch_size=2048,
                 seq_length=4096, sequence_parallel=True, precision="fp8")
    lt = layer_time_of(model, time_key(s), gpu, True)
    n = lt.moe_nodes
    units = (n.pre, n.experts, n.post)
    assert sum(u.forward_s for u in units) == pytest.approx(lt.forward)
    assert sum(u.backward_s + u.weight_s for u in units) == pytest.approx(lt.backward_input + lt.backward_weight
                                                                          + lt.recompute)
    assert sum(u.host_forward_s for u in units) == pytest.approx(lt.host_forward)
    assert sum(u.host_backward_s for u in units) == pytest.approx(lt.host_backward)
    free_host = MoENodes(*(ScheduleNode(u.forward_s, u.backward_s, u.weight_s, 0.0, 0.0) for u in units), 0.0, True)
    assert sum(moe_layer_seconds(free_host, NO_A2A, False, False, 0.0)) == pytest.approx(lt.total)
    full = layer_time_of(model, time_key(s.with_(recompute="full")), gpu, True)
    units = (full.moe_nodes.pre, full.moe_nodes.experts, full.moe_nodes.post)
    free_host = MoENodes(*(ScheduleNode(u.forward_s, u.backward_s, u.weight_s, 0.0, 0.0) for u in units), 0.0, True)
    assert sum(moe_layer_seconds(free_host, NO_A2A, False, False, 0.0, rerun=True, full_recompute=True)) \
        == pytest.approx(full.total)


def test_ep_overlap_pays_its_warm_up_alone():
    """The pipeline's warm-up forwards and cool-down backwards have no partner: a stage with
    more of them (the first) spends more per micro-batch on its MoE layers."""
    pair = moe_layer_seconds(GPU_ONLY, A2A_1, True, False, 0.0)
    alone = moe_layer_seconds(GPU_ONLY, A2A_1, True, False, 1.0)
    assert sum(pair) == pytest.approx(11.0) and sum(alone) == pytest.approx(15.5)
    assert sum(moe_layer_seconds(GPU_ONLY, A2A_1, True, False, 0.25)) == pytest.approx(0.75 * 11 + 0.25 * 15.5)


QWEN = ("torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py --num-layers 48 --hidden-size 2048 "
        "--ffn-hidden-size 6144 --num-attention-heads 32 --group-query-attention --num-query-groups 4 "
        "--kv-channels 128 --vocab-size 151936 --swiglu --normalization RMSNorm --position-embedding-type rope "
        "--disable-bias-linear --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 --moe-grouped-gemm "
        "--moe-token-dispatcher-type alltoall --expert-model-parallel-size 8 --micro-batch-size 1 "
        "--global-batch-size 256 --seq-length 4096 --max-position-embeddings 4096 --bf16 "
        "--use-distributed-optimizer --overlap-moe-expert-parallel-comm ")


def _rules(extra: str) -> set:
    launch = parse_text(QWEN + extra, "t.sh", env={}, default_world_size=32)
    return {v.rule for v in megatron_violations(launch)}


def test_ep_overlap_launch_rules():
    """TransformerConfig.__post_init__ asserts these for --overlap-moe-expert-parallel-comm."""
    assert "ep-overlap" not in _rules("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2")
    assert "ep-overlap" in _rules("--pipeline-model-parallel-size 2")                    # no virtual pipeline
    assert "ep-overlap" in _rules("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    assert "ep-overlap" in _rules("--recompute-activations --recompute-modules moe")
    assert "ep-overlap" in _rules("--moe-token-dispatcher-type allgather")
    assert "ep-overlap" in _rules("--expert-model-parallel-size 1")
    launch = parse_text(QWEN.replace("--overlap-moe-expert-parallel-comm ", "--delay-wgrad-compute"), "t.sh",
                        env={}, default_world_size=32)
    assert "delay-wgrad" in {v.rule for v in megatron_violations(launch)}



@pytest.mark.parametrize("precision,per_expert", [("bf16", 1), ("fp8", 3)])
def test_grouped_linear_issues_one_gemm_per_local_expert(precision, per_expert):
    """Transformer Engine's grouped linear runs one cuBLAS GEMM per local expert
    (multi_stream_cublas_gemm), and under fp8 quantizes each expert's rows apart (2 kernels):
    halving the local experts (EP 8 -> 16 over 128 experts, 16 -> 8 each) takes 8 x per_expert
    host kernels off each of the two grouped linears' forward, and nothing else changes with
    the expert count on the host (token counts are GPU work)."""
    model = load_model_ref("qwen3-235b-a22b")
    gpu = load_cluster_ref("dgx-h100-x32").node_groups[0].gpu
    base = Strategy(tp=1, pp=1, dp=16, ep=8, micro_batch_size=1, global_batch_size=256, seq_length=4096,
                    precision=precision)
    host = {ep: layer_time_of(model, time_key(base.with_(ep=ep)), gpu, True).host_forward for ep in (8, 16)}
    assert host[8] - host[16] == pytest.approx(2 * 8 * per_expert * gpu.efficiency.host_launch_overhead_s)


@settings(max_examples=150, deadline=None)
@given(pre=_node, exp=_node, post=_node, h=st.floats(0.0, 1.0), synced=st.booleans(),
       a2a_f=st.floats(0.0, 5.0), a2a_b=st.floats(0.0, 5.0), overlap=st.booleans(), delay=st.booleans(),
       rerun=st.booleans(), full=st.booleans(), shared=st.booleans())
def test_the_floor_is_the_least_layer_over_warm_up_shares(pre, exp, post, h, synced, a2a_f, a2a_b, overlap, delay,
                                                          rerun, full, shared):
    """moe_layer_floor_s (the search's bound, computed without the all-to-all-free periods it
    can do without) is the least compute + exposed moe_layer_seconds gives at any warm-up
    share; it is linear in the share, so its ends (0 and 1) hold the least."""
    n, a2a = MoENodes(pre, exp, post, h, synced, shared_forward_s=pre.forward_s / 2), A2A(a2a_f, a2a_b)
    floor = moe_layer_floor_s(n, a2a, overlap, delay, rerun, full, shared)
    at = [sum(moe_layer_seconds(n, a2a, overlap, delay, share, rerun, full, shared)) for share in (0.0, 0.3, 0.7, 1.0)]
    assert floor == pytest.approx(min(at), rel=1e-12, abs=1e-12)
