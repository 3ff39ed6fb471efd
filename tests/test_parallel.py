"""Communication of each parallel axis (planner/cost/parallel.py) against Megatron-LM's own
message sizes and counts and hand arithmetic. The FSDP / ZeRO-3 terms of dp_cost are left to
their own tests.

Link figures used below, from the bundled files: dgx-h100-x8 (examples/clusters) is 8 nodes of
8 H100 with 8 x 400 Gb/s NICs per node and the default 5 us NIC latency; the H100 profile
(hardware_profiles/h100-sxm-80g.yaml) has NVLink at 450 GB/s per GPU per direction, 3 us, and
NCCL efficiencies of 0.8 on the scale-up fabric and 0.92 on the network."""

import dataclasses
from types import SimpleNamespace

import pytest

from planner.cost import parallel as P
from planner.library import load_cluster_ref, load_model_ref
from planner.placement import placement_of
from planner.strategy import Strategy

# dgx-h100-x8 (examples/clusters/dgx-h100-x8.yaml) with hardware_profiles/h100-sxm-80g.yaml
NVLINK_BYTES_PER_S = 450e9 * 0.8            # 360 GB/s: NVLink 4 x scale-up efficiency
NVLINK_LATENCY_S = 3e-6
NIC_BYTES_PER_S_PER_GPU = 8 * 50e9 * 0.92 / 8   # 46 GB/s: a node's 8 x 400 Gb/s NICs shared by its 8 GPUs
NIC_LATENCY_S = 5e-6
# NCCL's all-to-all on one NVLink fabric runs at 74 / 80 of the ring's bandwidth with 0.82 us per
# peer (cost/comm.py ALL_TO_ALL_SCALE_UP_SHARE, ALL_TO_ALL_LATENCY_PER_PEER_S, tests/test_comm.py)
A2A_SHARE = 0.925
A2A_LATENCY_PER_PEER_S = 0.82e-6
# FlashAttention-2 backward: 5 matmuls to the forward's 2 (Dao 2023, sec. 3.1)
FLASH_BWD = 2.5

LLAMA = load_model_ref("llama3-8b")          # h 4096, 32 layers, 8 KV groups of 128, vocab 128256
MIXTRAL = load_model_ref("mixtral-8x7b")     # h 4096, 8 experts, top-2, no shared expert
DSV3 = load_model_ref("deepseek-v3")         # 256 experts top-8, 8 groups top-4, a shared expert
DGX = load_cluster_ref("dgx-h100-x8")
H100 = DGX.node_groups[0]


def _ring_ag_s(msg, n, bw, lat):
    """Ring all-gather / reduce-scatter: (n - 1)/n of the full tensor over the bus bandwidth,
    n - 1 latencies (NCCL ring; formulas.md)."""
    return (n - 1) / n * msg / bw + (n - 1) * lat


def _ring_ar_s(msg, n, bw, lat):
    """Ring all-reduce: 2 (n - 1)/n of the tensor, 2 (n - 1) latencies."""
    return 2 * (n - 1) / n * msg / bw + 2 * (n - 1) * lat


def _work(**kw):
    base = dict(stage=0, layers=8, moe_layers=0, forward_s=0.0, backward_s=0.0, core_attention_forward_s=0.0,
                recompute_skipped_layers=0, microbatches=1, layer_counts={}, layer_times={})
    base.update(kw)
    return P.StageWork(**base)


# ---- TP ---------------------------------------------------------------------------------------

def test_tp_with_sp_two_all_gathers_and_two_reduce_scatters_forward():
    """Megatron with SP (tensor_parallel/layers.py, mappings.py): forward an all-gather before
    QKV and fc1, a reduce-scatter after out-proj and fc2; backward the all-gather of the
    row-parallel output gradients, the reduce-scatter of the column-parallel input gradients
    (under wgrad) and the re-gather of their inputs (under dgrad). The message is the full
    [s/cp, b, h] bf16 tensor: 2 x 4096 x 1 x 4096 = 33,554,432 bytes; TP 8 inside one node."""
    s = Strategy(tp=8, dp=8, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    phases, msg, link = P.tp_layer_collectives(LLAMA, s, [H100], DGX)
    assert msg == 33_554_432
    ag = _ring_ag_s(33_554_432, 8, NVLINK_BYTES_PER_S, NVLINK_LATENCY_S)
    assert link.bandwidth_bytes_per_s == pytest.approx(NVLINK_BYTES_PER_S)
    assert [(k, c) for k, c, _ in phases["forward"]] == [("all-gather", 2), ("reduce-scatter", 2)]
    assert [(k, c) for k, c, _ in phases["backward"]] == [("all-gather", 2)]
    assert [(k, c) for k, c, _ in phases["under-wgrad"]] == [("reduce-scatter", 2)]
    assert [(k, c) for k, c, _ in phases["under-dgrad"]] == [("all-gather", 2)]
    for rows in phases.values():
        for _, _, t1 in rows:
            assert t1 == pytest.approx(ag, rel=1e-9)   # all-gather and reduce-scatter cost the same


def test_tp_without_sp_one_all_reduce_per_linear_pair_each_way():
    """Without SP (mappings.py reduce_from_ / copy_to_tensor_model_parallel_region): an all-reduce
    after each row-parallel linear forward, one of each column-parallel input gradient backward
    (asynchronous under wgrad); no all-gather. 2 (n-1)/n x 33.5 MB over NVLink."""
    s = Strategy(tp=8, dp=8, micro_batch_size=1, global_batch_size=64, seq_length=4096, sequence_parallel=False)
    phases, msg, _ = P.tp_layer_collectives(LLAMA, s, [H100], DGX)
    ar = _ring_ar_s(33_554_432, 8, NVLINK_BYTES_PER_S, NVLINK_LATENCY_S)
    assert phases["forward"] == [("all-reduce", 2, pytest.approx(ar, rel=1e-9))]
    assert phases["under-wgrad"] == [("all-reduce", 2, pytest.approx(ar, rel=1e-9))]
    assert phases["backward"] == [] and phases["under-dgrad"] == []


def test_tp_message_is_the_cp_rank_share_of_the_sequence():
    """With CP 2 each rank holds s/cp = 2048 tokens: 2 x 2048 x 2 x 4096 = 33,554,432 bytes at
    micro-batch 2."""
    s = Strategy(tp=4, cp=2, dp=8, micro_batch_size=2, global_batch_size=64, seq_length=4096)
    _, msg, _ = P.tp_layer_collectives(LLAMA, s, [H100], DGX)
    assert msg == 2 * 2048 * 2 * 4096 == 33_554_432


@pytest.mark.parametrize("model,pairs", [(MIXTRAL, 1), (DSV3, 2)])
def test_tp_of_a_moe_layer_is_its_attention_and_shared_expert(model, pairs):
    """A MoE layer under SP: the routed experts add no TP collective (each TP rank routes its own
    s/tp tokens, moe_layer.py); attention has one pair, a shared expert (DeepSeek-V3) another."""
    s = Strategy(tp=8, dp=8, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    phases, _, _ = P.tp_layer_collectives(model, s, [H100], DGX, moe=True)
    assert [(k, c) for k, c, _ in phases["forward"]] == [("all-gather", pairs), ("reduce-scatter", pairs)]


SP_PHASES = {"forward": [("all-gather", 2, 1e-3), ("reduce-scatter", 2, 1e-3)],
             "backward": [("all-gather", 2, 1e-3)], "under-wgrad": [("reduce-scatter", 2, 1e-3)],
             "under-dgrad": [("all-gather", 2, 1e-3)]}


def test_tp_exposed_forward_and_backward_and_what_the_column_gemms_do_not_hide():
    """1 ms per collective: forward 4 ms, exposed backward all-gathers 2 ms, and the 2 ms under
    wgrad and 2 ms under dgrad each less the 0.5 ms column-parallel GEMM they hide under:
    4 + 2 + 1.5 + 1.5 = 9 ms."""
    lt = SimpleNamespace(column_parallel_gemm_forward=0.5e-3, tp_overlap_gemms=())
    assert P.tp_layer_exposed_s(SP_PHASES, lt, False, False) == pytest.approx(9e-3)
    # recomputed: the forward collectives run twice, 8 + 2 + 1.5 + 1.5 = 13 ms
    assert P.tp_layer_exposed_s(SP_PHASES, lt, True, False) == pytest.approx(13e-3)
    # GEMMs longer than the asynchronous collectives hide them: 4 + 2 = 6 ms
    long_gemm = SimpleNamespace(column_parallel_gemm_forward=5e-3, tp_overlap_gemms=())
    assert P.tp_layer_exposed_s(SP_PHASES, long_gemm, False, False) == pytest.approx(6e-3)
    # without the asynchronous backward (SC'21-era code) nothing hides: 4 + 2 + 2 + 2 = 10 ms
    assert P.tp_layer_exposed_s(SP_PHASES, long_gemm, False, False, async_backward=False) == pytest.approx(10e-3)
    # --tp-comm-overlap with no GEMM to pipeline with falls back to the plain schedule
    assert P.tp_layer_exposed_s(SP_PHASES, lt, False, True) == pytest.approx(9e-3)


def _overlap_phases(ag_s, rs_s):
    return {"forward": [("all-gather", 2, ag_s), ("reduce-scatter", 2, rs_s)],
            "backward": [("all-gather", 2, ag_s)], "under-wgrad": [("reduce-scatter", 2, rs_s)],
            "under-dgrad": [("all-gather", 2, ag_s)]}


def _overlap_lt(gemm_s, chunked_s, tp=2):
    """QKV, out-proj, fc1, fc2 (column, row, column, row), each `gemm_s` whole and `chunked_s`
    when split in tp chunks."""
    return SimpleNamespace(column_parallel_gemm_forward=2 * gemm_s, tp_degree=tp,
                           tp_overlap_gemms=((gemm_s, chunked_s),) * 4)


def test_tp_comm_overlap_when_the_ring_is_slower_than_the_gemm():
    """--tp-comm-overlap, TP 2, 1 ms GEMMs (0.5 ms a chunk), 2 ms collectives (TE userbuffers):
    one 2 ms ring step and the one chunk GEMM that cannot overlap it: 2.5 ms, 1.5 ms beyond the
    GEMM, for each of the 4 forward GEMMs and the 2 row-parallel dgrads; the column-parallel
    re-gather and reduce-scatter exceed their 1 ms dgrad / wgrad by 1 ms each (2 x 2 ms).
    6 + 3 + 4 = 13 ms; recomputed, the forward twice: 19 ms."""
    lt = _overlap_lt(1e-3, 1e-3)
    phases = _overlap_phases(2e-3, 2e-3)
    assert P.tp_layer_exposed_s(phases, lt, False, True) == pytest.approx(13e-3)
    assert P.tp_layer_exposed_s(phases, lt, True, True) == pytest.approx(19e-3)


def test_tp_comm_overlap_compute_bound_all_gather_ring_exposes_only_the_chunking_loss():
    """TP 2, 1 ms GEMMs that take 1.2 ms in two 0.6 ms chunks, 0.4 ms all-gathers (a free
    reduce-scatter, to look at the all-gathers alone). All-gather + GEMM: the local chunk's
    0.6 ms covers the 0.4 ms exchange, then the received chunk: 1.2 ms, 0.2 ms beyond the GEMM
    (QKV and fc1 forward, out-proj and fc2 dgrad); the out-proj and fc2 forward GEMMs lose their
    0.2 ms to chunking too; the bulk re-gather (0.4 ms) hides under its 1 ms dgrad.
    6 x 0.2 = 1.2 ms."""
    assert P.tp_layer_exposed_s(_overlap_phases(0.4e-3, 0.0), _overlap_lt(1e-3, 1.2e-3), False, True) == \
        pytest.approx(6 * 0.2e-3)


# ---- CP ---------------------------------------------------------------------------------------

def test_cp_ring_step_sends_the_local_k_and_v_blocks():
    """TE context parallel (p2p): each step sends K and V of the rank's s/cp tokens, its
    num_query_groups / tp KV heads of kv_channels each, in bf16. Llama 3 8B at seq 8192, CP 2,
    TP 1: 2 x 2 x 4096 x 8 x 128 = 16,777,216 bytes; the two ranks share a node (NVLink)."""
    s = Strategy(tp=1, cp=2, dp=4, micro_batch_size=1, global_batch_size=64, seq_length=8192)
    kv, t_step, link = P.cp_ring_step(LLAMA, s, [H100], DGX)
    assert kv == 16_777_216
    assert t_step == pytest.approx(16_777_216 / NVLINK_BYTES_PER_S + NVLINK_LATENCY_S, rel=1e-9)
    # TP 8: one KV group per rank; the CP peers (rank stride 8) sit on two nodes: 46 GB/s NIC share
    s8 = Strategy(tp=8, cp=2, dp=4, micro_batch_size=1, global_batch_size=64, seq_length=8192)
    kv8, t8, _ = P.cp_ring_step(LLAMA, s8, [H100], DGX)
    assert kv8 == 2 * 2 * 4096 * 1 * 128 == 2_097_152
    assert t8 == pytest.approx(2_097_152 / NIC_BYTES_PER_S_PER_GPU + NIC_LATENCY_S, rel=1e-9)


def test_cp_exposed_is_the_ring_beyond_attention():
    """cp - 1 = 3 K,V exchanges of 1 ms forward against 1 ms of core attention: 2 ms exposed;
    backward sends K,V and their gradients (6 ms) under FlashAttention's 2.5 ms backward:
    3.5 ms. A 4 ms core attention hides both (3 < 4, 6 < 10)."""
    s = Strategy(tp=1, cp=4, dp=2, micro_batch_size=1, global_batch_size=64, seq_length=8192)
    assert P.cp_layer_exposed_s(s, 1e-3, 1e-3) == pytest.approx(2e-3 + (6e-3 - FLASH_BWD * 1e-3))
    assert P.cp_layer_exposed_s(s, 1e-3, 4e-3) == 0.0
    assert P.cp_layer_exposed_s(Strategy(tp=1, cp=1, dp=8, global_batch_size=64), 1e-3, 0.0) == 0.0


# ---- EP ---------------------------------------------------------------------------------------

def test_remote_nodes_top2_of_8_experts_on_two_nodes():
    """Mixtral (8 experts, top-2) over 2 nodes, 4 experts each: the other node is hit unless
    both picks are on this one, 1 - C(4,2)/C(8,2) = 1 - 6/28 = 11/14."""
    assert P.remote_nodes_per_token(MIXTRAL, 2) == pytest.approx(11 / 14)
    assert P.remote_nodes_per_token(MIXTRAL, 1) == 0.0


@pytest.mark.parametrize("nodes,expected", [
    # 8 groups on 8 nodes, one each: each of the 7 other nodes is one of the 4 groups picked with
    # probability 4/8 (DeepSeek-V3 report sec. 2.1.2: a token reaches at most M = 4 nodes)
    (8, 7 * 4 / 8),
    # 2 groups a node on 4 nodes: another node missed when all 4 picks are among the 6 groups
    # elsewhere, 1 - C(6,4)/C(8,4) = 1 - 15/70 = 11/14; 3 other nodes
    (4, 3 * 11 / 14),
    # 16 nodes, each group spread over 2: 4 groups reach 8 nodes, own node among them 8/16 of the time
    (16, 8 - 8 / 16),
])
def test_remote_nodes_under_node_limited_routing(nodes, expected):
    assert P.remote_nodes_per_token(DSV3, nodes) == pytest.approx(expected)


def _a2a_one_node_s(msg, n):
    """All-to-all of `msg` bytes per rank among n ranks of one node: (n-1)/n over NVLink at
    NCCL's all-to-all share, 2 latencies and 0.82 us per peer."""
    return ((n - 1) / n * msg / (NVLINK_BYTES_PER_S * A2A_SHARE) + 2 * NVLINK_LATENCY_S
            + (n - 1) * A2A_LATENCY_PER_PEER_S)


def test_alltoall_dispatcher_sends_every_token_copy_and_its_probability():
    """token_dispatcher.py MoEAlltoAllTokenDispatcher: n = s b / tp = 4096 tokens, top-2, so
    8192 copies of h = 4096 bf16 values and a bf16 router probability each:
    8192 x (8192 + 2) = 67,125,248 bytes per all-to-all; dispatch and combine forward, their
    transposes backward. EP 8 on one node."""
    s = Strategy(tp=1, ep=8, dp=8, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    phases, link = P.ep_layer_collectives(MIXTRAL, s, [H100], DGX)
    msg = 8192 * (2 * 4096 + 2)
    assert msg == 67_125_248
    hidden = 8192 * 2 * 4096       # the combine: expert outputs alone
    for phase in ("forward", "backward"):
        assert [(k, c, b) for k, c, _, b in phases[phase]] == [("all-to-all", 1, msg), ("all-to-all", 1, hidden)]
        assert phases[phase][0][2] == pytest.approx(_a2a_one_node_s(msg, 8), rel=1e-9)
        assert phases[phase][1][2] == pytest.approx(_a2a_one_node_s(hidden, 8), rel=1e-9)


def test_alltoall_combine_carries_no_router_probabilities():
    """fp32 router (--moe-router-dtype fp32): dispatch 8192 x (8192 + 4) bytes, combine
    8192 x 8192 bytes."""
    s = Strategy(tp=1, ep=8, dp=8, micro_batch_size=1, global_batch_size=64, seq_length=4096,
                 moe_router_dtype="fp32")
    phases, _ = P.ep_layer_collectives(MIXTRAL, s, [H100], DGX)
    forward_bytes = sum(c * b for _, c, _, b in phases["forward"])
    assert forward_bytes == pytest.approx(8192 * (8192 + 4) + 8192 * 8192, rel=1e-9)


def test_expert_tp_gathers_the_received_tokens():
    """Expert-TP 2 (dispatch_postprocess's gather_from_sequence_parallel_region over the expert-TP
    group, the reduce-scatter back in combine): TP 2 leaves n = 2048 tokens a rank, 4096 copies
    received per rank, gathered over 2 ranks: 2 x 4096 x 2 x 4096 = 67,108,864 bytes."""
    s = Strategy(tp=2, ep=4, etp=2, dp=4, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    phases, _ = P.ep_layer_collectives(MIXTRAL, s, [H100], DGX)
    recv = 67_108_864
    gathered = _ring_ag_s(recv, 2, NVLINK_BYTES_PER_S, NVLINK_LATENCY_S)
    for phase in ("forward", "backward"):
        rows = [(k, c, b) for k, c, _, b in phases[phase]]
        assert rows == [("all-to-all", 1, 4096 * (2 * 4096 + 2)), ("all-to-all", 1, 4096 * 2 * 4096),
                        ("all-gather", 1, recv), ("reduce-scatter", 1, recv)]
        assert phases[phase][2][2] == pytest.approx(gathered, rel=1e-9)


# ---- PP ---------------------------------------------------------------------------------------

def test_stages_share_a_node_by_torchrun_rank_order():
    """Rank r on node r // 8; stage k holds ranks [k per, (k + 1) per). 2 GPUs a stage: stages 0
    and 1 are ranks 0-3 (node 0), stages 3 and 4 ranks 6-9 (nodes 0 and 1)."""
    s = Strategy(tp=2, pp=8, dp=1, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    assert P.stages_share_node(s, 0, 1, [H100], [H100])
    assert P.stages_share_node(s, 2, 3, [H100], [H100])
    assert not P.stages_share_node(s, 3, 4, [H100], [H100])
    # a stage of 8 or more GPUs fills its node
    s16 = Strategy(tp=8, pp=4, dp=2, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    assert not P.stages_share_node(s16, 0, 1, [H100], [H100])


def test_stages_share_an_nvl72_rack_and_never_two_node_groups():
    """gb200-nvl72-x4: 4-GPU trays, 64 GPUs on one NVLink domain. 4 GPUs a stage: stages 14 and
    15 are ranks 56-63 (rack 0), 15 and 16 ranks 60-67 (racks 0 and 1). Stages on different node
    groups (h100-a100-lab) never share a node."""
    nvl = load_cluster_ref("gb200-nvl72-x4").node_groups[0]
    s = Strategy(tp=4, pp=64, dp=1, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    assert P.stages_share_node(s, 14, 15, [nvl], [nvl])
    assert not P.stages_share_node(s, 15, 16, [nvl], [nvl])
    lab = load_cluster_ref("h100-a100-lab").node_groups
    s2 = Strategy(tp=2, pp=4, dp=1, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    assert not P.stages_share_node(s2, 0, 1, [lab[0]], [lab[1]])


@pytest.mark.parametrize("kw,expected", [
    (dict(tp=4), 2 * 4096 * 1 * 4096 // 4),                       # SP: s / tp
    (dict(tp=4, sequence_parallel=False), 2 * 4096 * 1 * 4096),   # every TP rank sends the whole tensor
    (dict(tp=4, cp=2), 2 * 4096 // 2 * 1 * 4096 // 4),            # s / cp / tp
    (dict(tp=4, sequence_parallel=False, scatter_gather_tensors_in_pipeline=True), 2 * 4096 * 4096 // 4),
    (dict(tp=1, micro_batch_size=2), 2 * 4096 * 2 * 4096),
])
def test_pp_message_is_megatrons_p2p_tensor_shape(kw, expected):
    """p2p_communication.py / schedules.py: tensor_shape = (seq_length / cp / (tp if SP), mbs, h)
    in the params dtype (bf16, 2 bytes)."""
    s = Strategy(pp=4, dp=1, global_batch_size=64, seq_length=4096, **kw)
    assert P.pp_message_bytes(LLAMA, s) == expected


def test_pp_cost_across_nodes_two_hops_per_microbatch():
    """TP 8 PP 4 DP 2: 16 GPUs a stage, so every boundary leaves the node (46 GB/s per GPU). The
    message is 2 x 4096 x 4096 / 8 = 4,194,304 bytes. A middle stage talks to both neighbours,
    each 2 transfers (activation, gradient) per micro-batch: 64 over 32 micro-batches; a
    micro-batch waits 2 hops."""
    s = Strategy(tp=8, pp=4, dp=2, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    t1 = 4_194_304 / NIC_BYTES_PER_S_PER_GPU + NIC_LATENCY_S
    c = P.pp_cost(LLAMA, s, [[H100]] * 4, 1, H100, DGX, _work(stage=1, microbatches=32))
    assert c.per_microbatch_s == pytest.approx(2 * t1, rel=1e-9)
    assert [(e.bytes, e.count_per_step) for e in c.entries] == [(4_194_304, 64), (4_194_304, 64)]
    assert sum(e.time_s for e in c.entries) == pytest.approx(128 * t1, rel=1e-9)
    assert sum(e.exposed_s for e in c.entries) == pytest.approx(32 * 2 * t1, rel=1e-9)
    first = P.pp_cost(LLAMA, s, [[H100]] * 4, 0, H100, DGX, _work(stage=0, microbatches=32))
    assert len(first.entries) == 1


def test_pp_cost_inside_a_node_per_virtual_chunk():
    """TP 2 PP 4: all four stages on one node, NVLink. 2 x 4096 x 4096 / 2 = 16,777,216 bytes a
    hop; with 2 virtual chunks a micro-batch crosses each boundary twice as often: 4 hops."""
    s = Strategy(tp=2, pp=4, dp=1, vpp=2, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    t1 = 16_777_216 / NVLINK_BYTES_PER_S + NVLINK_LATENCY_S
    c = P.pp_cost(LLAMA, s, [[H100]] * 4, 0, H100, DGX, _work(microbatches=64))
    assert c.per_microbatch_s == pytest.approx(4 * t1, rel=1e-9)
    assert c.entries[0].count_per_step == 2 * 2 * 64
    assert P.pp_cost(LLAMA, s.with_(pp=1, vpp=1, schedule="1f1b", dp=4), [[H100]], 0, H100, DGX,
                     _work()).entries == ()


# ---- DP ---------------------------------------------------------------------------------------

PER_RANK = {"dense": 1e9, "norms": 0.0, "experts": 0.0}   # 1e9 parameters on each rank


def test_dp_zero0_all_reduces_fp32_gradients_once_per_step():
    """DDP (megatron/core/distributed/param_and_grad_buffer.py): one all-reduce of the fp32 grad
    buffer over DP, 4 x 1e9 bytes. TP 8 DP 8: the DP peers (stride 8) are on 8 nodes, 46 GB/s
    each. Without overlap all of it is exposed after the step."""
    s = Strategy(tp=8, dp=8, micro_batch_size=1, global_batch_size=64, seq_length=4096, zero_stage=0,
                 overlap_grad_reduce=False, overlap_param_gather=False)
    ar = _ring_ar_s(4e9, 8, NIC_BYTES_PER_S_PER_GPU, NIC_LATENCY_S)
    c = P.dp_cost(LLAMA, s, placement_of(s), [H100], DGX, _work(layers=32), PER_RANK)
    assert c.after_step_s == pytest.approx(ar, rel=1e-9) and c.per_microbatch_s == 0.0
    assert [(e.axis, e.kind, e.bytes, e.group_size, e.count_per_step, e.when) for e in c.entries] == \
        [("dp", "all-reduce", 4e9, 8, 1, "per-step")]
    assert c.entries[0].exposed_s == pytest.approx(ar, rel=1e-9)
    # overlapped under a long backward: only the last bucket (one of 32 layers) shows
    so = s.with_(overlap_grad_reduce=True)
    c2 = P.dp_cost(LLAMA, so, placement_of(so), [H100], DGX, _work(layers=32, backward_s=10.0), PER_RANK)
    assert c2.after_step_s == pytest.approx(ar / 32, rel=1e-9)


def test_dp_zero1_reduce_scatters_gradients_and_all_gathers_bf16_parameters():
    """Distributed optimizer (megatron/core/distributed/, dist_optimizer.md): reduce-scatter of
    the fp32 gradients (4e9 bytes) and all-gather of the bf16 parameters (2e9 bytes), per step."""
    s = Strategy(tp=8, dp=8, micro_batch_size=1, global_batch_size=64, seq_length=4096, zero_stage=1,
                 overlap_grad_reduce=False, overlap_param_gather=False)
    rs = _ring_ag_s(4e9, 8, NIC_BYTES_PER_S_PER_GPU, NIC_LATENCY_S)
    ag = _ring_ag_s(2e9, 8, NIC_BYTES_PER_S_PER_GPU, NIC_LATENCY_S)
    c = P.dp_cost(LLAMA, s, placement_of(s), [H100], DGX, _work(layers=32), PER_RANK)
    assert sorted((e.kind, e.bytes, e.when) for e in c.entries) == \
        [("all-gather", 2e9, "per-step"), ("reduce-scatter", 4e9, "per-step")]
    assert c.after_step_s == pytest.approx(rs + ag, rel=1e-9)
    assert sum(e.exposed_s for e in c.entries) == pytest.approx(rs + ag, rel=1e-9)
    # overlapped with nothing to hide under: all of it plus the last bucket of each
    so = s.with_(overlap_grad_reduce=True, overlap_param_gather=True)
    c2 = P.dp_cost(LLAMA, so, placement_of(so), [H100], DGX, _work(layers=32), PER_RANK)
    assert c2.after_step_s == pytest.approx((rs + ag) * (1 + 1 / 32), rel=1e-9)


def test_dp_group_includes_the_cp_ranks():
    """parallel_state.get_data_parallel_group(with_context_parallel=True): TP 4 CP 2 DP 8 reduces
    over 16 ranks, 2 of them on each node (stride 4), so 2/8 of the node's NICs: 92 GB/s."""
    s = Strategy(tp=4, cp=2, dp=8, micro_batch_size=1, global_batch_size=64, seq_length=4096, zero_stage=0,
                 overlap_grad_reduce=False)
    c = P.dp_cost(LLAMA, s, placement_of(s), [H100], DGX, _work(layers=32), PER_RANK)
    assert c.entries[0].group_size == 16
    assert c.after_step_s == pytest.approx(_ring_ar_s(4e9, 16, 8 * 50e9 * 0.92 * 2 / 8, NIC_LATENCY_S), rel=1e-9)


# ---- tied embeddings --------------------------------------------------------------------------

def test_tied_embedding_gradient_all_reduce_between_first_and_last_stage():
    """finalize_model_grads.py _allreduce_word_embedding_grads: the fp32 main_grad of the word
    embedding, the TP rank's share of the padded vocabulary (128256 -> 129024, a multiple of
    128 x 8) x 4096 / 8 x 4 bytes = 264,241,152 bytes, all-reduced by the two stages over the
    NICs (n = 2: M / B + 2 latencies). Untied models and middle stages send nothing."""
    tied = dataclasses.replace(LLAMA, untie_embeddings_and_output_weights=False)
    s = Strategy(tp=8, pp=4, dp=2, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    msg = 129024 * 4096 // 8 * 4
    assert msg == 264_241_152
    t = msg / NIC_BYTES_PER_S_PER_GPU + 2 * NIC_LATENCY_S
    for stage in (0, 3):
        c = P.tied_embedding_cost(tied, s, [[H100]] * 4, stage, H100, DGX)
        assert c.after_step_s == pytest.approx(t, rel=1e-9)
        assert [(e.kind, e.bytes, e.group_size, e.when) for e in c.entries] == [("all-reduce", msg, 2, "per-step")]
    assert P.tied_embedding_cost(tied, s, [[H100]] * 4, 1, H100, DGX).entries == ()
    assert P.tied_embedding_cost(LLAMA, s, [[H100]] * 4, 0, H100, DGX).entries == ()
