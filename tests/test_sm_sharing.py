"""The SMs that the MoE dispatcher's communication kernels take from the GEMMs they overlap
(cost/moe_schedule.py sm_shared_s, cost/compute.py comm_sm_share), against schedules worked by
hand and the SM counts the sources give (NCCL's 32 p2p channels, Megatron's DeepEP default of
20, the profiles' sm_count)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.compute import comm_sm_share
from planner.cost.moe_schedule import (A2A, NO_A2A, MoENodes, ScheduleNode, layer_period_s, moe_layer_floor_s,
                                        moe_layer_s, moe_layer_seconds, sm_shared_s)
from planner.errors import InvalidStrategy
from planner.megatron.launch import parse_text
from planner.megatron.launch_errors import InvalidLaunch
from planner.specs.hardware import load_bundled_profile
from planner.strategy import Strategy

# the units of tests/test_moe_schedule.py: pre-dispatch forward 1, input grads 2, weight grads 1;
# experts 2, 2, 2; post-combine 0.5, 1, 0; each all-to-all 1 s
PRE = ScheduleNode(1.0, 2.0, 1.0, 0.0, 0.0)
EXP = ScheduleNode(2.0, 2.0, 2.0, 0.0, 0.0)
POST = ScheduleNode(0.5, 1.0, 0.0, 0.0, 0.0)
A2A_1 = A2A(forward_s=2.0, backward_s=2.0)
# a quarter of the SMs (e.g. 33 of an H100's 132)
QUARTER = MoENodes(PRE, EXP, POST, host_a2a_s=0.0, synced=True, comm_sm_share=0.25)
FREE = replace(QUARTER, comm_sm_share=0.0)


def test_a_unit_beside_an_all_to_all_runs_at_the_sms_left():
    """d + min(d, a (1 - c)) c / (1 - c): a unit that outlasts the all-to-all loses c x a (3 s
    beside 1 s on a quarter of the SMs: 3.25 s); one that ends first runs at 3/4 speed
    throughout (0.3 s -> 0.4 s); no all-to-all or no SMs taken, no charge."""
    assert sm_shared_s(3.0, 1.0, 0.25) == pytest.approx(3.25)
    assert sm_shared_s(0.3, 1.0, 0.25) == pytest.approx(0.4)
    assert sm_shared_s(0.75, 1.0, 0.25) == pytest.approx(1.0)      # ends with it: both branches agree
    assert sm_shared_s(3.0, 0.0, 0.25) == 3.0
    assert sm_shared_s(3.0, 1.0, 0.0) == 3.0


def test_ep_overlap_pair_charges_each_partner():
    """One merged pair, worked by hand (comm | comp), each compute unit beside its all-to-all
    (1 s) charged 0.25 s (it outlasts it): combine_b 0-2 | pre_f 0-1.25; experts_b with its
    weight gradients (4 s + 0.25) after combine_b 2-6.25; dispatch_f 2-3; dispatch_b 6.25-7.25;
    experts_f (2 + 0.25) 6.25-8.5; combine_f (1 + post 0.5) 8.5-10; pre_b with its weight
    gradients (3 + 0.25) 8.5-11.75. The next pair starts both streams at 11.75: 11.75 s a pair,
    against 11 s with the SMs free (tests/test_moe_schedule.py)."""
    assert layer_period_s(FREE, A2A_1, True, True, True, False) == pytest.approx(11.0)
    assert layer_period_s(QUARTER, A2A_1, True, True, True, False) == pytest.approx(11.75)


def test_ep_overlap_pair_with_delayed_weight_gradients():
    """--delay-wgrad-compute: dispatch_b runs beside the experts' weight gradients (2 s) and then
    experts_f (2 s), combine_f beside pre_b (2 s) and its weight gradients (1 s): each group is
    charged 0.25 s once, on its first unit. By hand: the first pair ends its compute stream at
    11.75 (pre_f 1.25, experts_b 2.25 from 2, weights 2.25, experts_f 2 from 6.5, pre_b 2.25 from
    8.5, its weights 1); from the second on the compute stream runs without a gap, its 10 s of
    work and four charges of 0.25 s: 11 s a pair."""
    assert layer_period_s(QUARTER, A2A_1, True, True, True, True) == pytest.approx(11.0)


def test_nothing_overlaps_in_the_plain_schedule():
    """The plain schedule runs every all-to-all between its compute units (one stream), the EP
    overlap's warm-up forwards and cool-down backwards likewise: the SMs they take cost nothing
    (3.5 + 2 s forward, 8 + 2 s backward, as with the SMs free)."""
    for overlap in (False, True):
        assert layer_period_s(QUARTER, A2A_1, True, False, overlap, False) == pytest.approx(5.5)
        assert layer_period_s(QUARTER, A2A_1, False, True, overlap, False) == pytest.approx(10.0)
    assert moe_layer_s(QUARTER, A2A_1, False, False, 0.0) == pytest.approx(15.5)
    # with the EP overlap: the pairs are charged (11.75), the warm-up (15.5) is not
    assert moe_layer_s(QUARTER, A2A_1, True, False, 0.5) == pytest.approx(0.5 * 11.75 + 0.5 * 15.5)


def test_the_charge_is_exposed_all_to_all_time_not_compute():
    """Without all-to-alls nothing runs beside the compute: the compute part of a layer is the
    same with the SMs taken or free, the charge shows in what the all-to-alls add."""
    free = moe_layer_seconds(FREE, A2A_1, True, False, 0.0)
    quarter = moe_layer_seconds(QUARTER, A2A_1, True, False, 0.0)
    assert quarter[0] == pytest.approx(free[0]) == pytest.approx(10.0)
    assert quarter[1] == pytest.approx(1.75) and free[1] == pytest.approx(1.0)


def test_shared_expert_overlap_is_charged_beside_the_forward_all_to_alls():
    """--moe-shared-expert-overlap (plain schedule): fc1 (half of 2.4 s of shared-expert GEMMs)
    beside the dispatch (1 s) runs 1.2 + 0.25 x 1 = 1.45 s, fc2 likewise beside the combine: a
    forward of 0.6 + 1.45 + 2 + 1.45 + 0.5 = 6.0 s, against 5.5 s with the SMs free."""
    pre = ScheduleNode(3.0, 2.0, 1.0, 0.0, 0.0)
    n = replace(QUARTER, pre=pre, shared_forward_s=2.4)
    assert layer_period_s(n, A2A_1, True, False, False, False, True) == pytest.approx(6.0)
    assert layer_period_s(replace(n, comm_sm_share=0.0), A2A_1, True, False, False, False, True) == pytest.approx(5.5)
    assert layer_period_s(n, NO_A2A, True, False, False, False, True) == pytest.approx(3.0 + 2.0 + 0.5)


def test_dispatcher_sm_counts_from_their_sources():
    """NCCL's all-to-all: 32 CTAs (p2p channels) of an H100's 132 SMs; DeepEP under Megatron: 20
    unless set; the allgather dispatcher is never overlapped; a profile without sm_count is not
    charged; a count that leaves no SM is refused."""
    h100 = load_bundled_profile("h100-sxm-80g")
    b200 = load_bundled_profile("b200-sxm-180g")
    assert h100.sm_count == 132 and b200.sm_count == 148
    s = Strategy(tp=1, pp=1, dp=8, ep=8)
    assert comm_sm_share(s, h100) == pytest.approx(32 / 132)
    assert comm_sm_share(s.with_(moe_token_dispatcher_type="flex"), h100) == pytest.approx(20 / 132)
    assert comm_sm_share(s.with_(moe_token_dispatcher_type="flex", moe_flex_dispatcher_num_sms=24), b200) \
        == pytest.approx(24 / 148)
    assert comm_sm_share(s.with_(moe_token_dispatcher_type="allgather"), h100) == 0.0
    assert comm_sm_share(s, replace(h100, sm_count=None)) == 0.0
    with pytest.raises(InvalidStrategy, match="moe_flex_dispatcher_num_sms 132"):
        comm_sm_share(s.with_(moe_token_dispatcher_type="flex", moe_flex_dispatcher_num_sms=132), h100)


QWEN = ("torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py --num-layers 48 --hidden-size 2048 "
        "--ffn-hidden-size 6144 --num-attention-heads 32 --group-query-attention --num-query-groups 4 "
        "--kv-channels 128 --vocab-size 151936 --swiglu --normalization RMSNorm --position-embedding-type rope "
        "--disable-bias-linear --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 --moe-grouped-gemm "
        "--expert-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 256 --seq-length 4096 "
        "--max-position-embeddings 4096 --bf16 --use-distributed-optimizer ")


def _strategy(extra: str) -> Strategy:
    return parse_text(QWEN + extra, "t.sh", env={}, default_world_size=32).strategy


def test_flex_dispatcher_sms_are_read_from_the_flags():
    """--moe-flex-dispatcher-num-sms, or a deprecated per-backend flag routed to it as
    TransformerConfig.__post_init__ does; unset: None (DeepEP's 20); NCCL's dispatcher has none."""
    flex = "--moe-token-dispatcher-type flex --moe-enable-deepep "
    assert _strategy(flex).moe_flex_dispatcher_num_sms is None
    assert _strategy(flex + "--moe-deepep-num-sms 24").moe_flex_dispatcher_num_sms == 24
    assert _strategy(flex + "--moe-hybridep-num-sms 16").moe_flex_dispatcher_num_sms == 16
    assert _strategy(flex + "--moe-flex-dispatcher-num-sms 8 --moe-deepep-num-sms 24").moe_flex_dispatcher_num_sms == 8
    assert _strategy("--moe-token-dispatcher-type alltoall --moe-deepep-num-sms 24").moe_flex_dispatcher_num_sms is None
    with pytest.raises(InvalidLaunch, match="differ"):
        _strategy(flex + "--moe-deepep-num-sms 24 --moe-hybridep-num-sms 16")


_node = st.builds(ScheduleNode, *[st.floats(0.0, 5.0)] * 5)


@settings(max_examples=100, deadline=None)
@given(pre=_node, exp=_node, post=_node, h=st.floats(0.0, 1.0), synced=st.booleans(), a2a_f=st.floats(0.0, 5.0),
       a2a_b=st.floats(0.0, 5.0), share=st.floats(0.0, 0.5), more=st.floats(0.0, 0.4), delay=st.booleans(),
       overlap=st.booleans(), shared=st.booleans(), extra=st.floats(0.01, 3.0), which=st.integers(0, 2))
def test_sm_sharing_keeps_the_layer_monotone(pre, exp, post, h, synced, a2a_f, a2a_b, share, more, delay, overlap,
                                             shared, extra, which):
    """More SMs taken, longer all-to-alls or longer compute never shorten a layer (every period
    stays a max-plus cycle mean growing with each weight), and the search's floor is still the
    least layer over warm-up shares (moe_layer_floor_s, as tests/test_moe_schedule.py)."""
    base = MoENodes(pre, exp, post, h, synced, shared_forward_s=pre.forward_s / 2, comm_sm_share=share)
    a2a = A2A(a2a_f, a2a_b)
    more_sms = replace(base, comm_sm_share=share + more)
    field = ("forward_s", "backward_s", "weight_s")[which]
    longer = replace(base, experts=replace(exp, **{field: getattr(exp, field) + extra}))
    for f, b in ((True, False), (False, True), (True, True)):
        before = layer_period_s(base, a2a, f, b, overlap, delay, shared)
        assert layer_period_s(more_sms, a2a, f, b, overlap, delay, shared) >= before - 1e-9
        assert layer_period_s(longer, a2a, f, b, overlap, delay, shared) >= before - 1e-9
        assert layer_period_s(base, A2A(a2a_f + extra, a2a_b), f, b, overlap, delay, shared) >= before - 1e-9
    floor = moe_layer_floor_s(base, a2a, overlap, delay, False, False, shared)
    at = [sum(moe_layer_seconds(base, a2a, overlap, delay, s, False, False, shared)) for s in (0.0, 0.4, 1.0)]
    assert floor == pytest.approx(min(at), rel=1e-9, abs=1e-12)
