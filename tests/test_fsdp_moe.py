"""Megatron-FSDP (ZeRO-3, --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params)
collectives of MoE expert weights against hand arithmetic from Megatron-LM's behaviour (d98e8a64):

- expert parameters are sharded over the expert-data-parallel group, EDP = world / (ETP x EP x PP)
  ranks (mcore_fsdp_adapter.py:371 expt_dp_group; parallel_state.py:887-895, order tp-ep-dp-pp:
  an EDP group's ranks are ETP x EP apart);
- per micro-batch each FSDP unit (a TransformerLayer) is all-gathered for its forward and again
  for its backward, once for recompute and backward together (megatron_fsdp.py:128-130 and
  :794-811 forward, :918-929 backward; released after the forward, :977-1000);
- gradients are reduce-scattered after every backward, i.e. once per micro-batch
  (megatron_fsdp.py:761-779, grad_reduce_every_bprop for optim_grads / optim_grads_params);
- parameters move in the model's dtype (bf16: 2 bytes), gradients in the main-grads dtype, which
  defaults to the model's dtype too (arguments.py:3691-3698 'auto'; mixed_precision.py:389-406).
"""

from __future__ import annotations

import pytest

from planner.cost.compute import adam_step_bytes_per_param
from planner.cost.memory import bytes_per_param, gradient_comm_bytes
from planner.estimate import estimate
from planner.library import load_model_ref
from planner.megatron.launch import parse_text
from planner.specs.cluster import cluster_from_dict
from planner.strategy import Strategy

BF16_BYTES = 2


def _dgx_h100(nodes: int):
    return cluster_from_dict({"name": f"dgx-h100-x{nodes}", "node_groups": [
        {"name": "dgx-h100", "nodes": nodes, "gpus_per_node": 8, "gpu": "h100-sxm-80g",
         "nics_per_node": 8, "nic_bandwidth": "400 Gb/s"}]}, "tests/test_fsdp_moe.py")


def _edp_rows(e):
    return [r for r in e.communication if r.axis == "edp"]


def test_mixtral_fsdp_expert_collectives_by_hand():
    # Mixtral 8x7B on 4 DGX nodes (32 GPUs): TP 2, EP 4, ETP 1, DP 16, GBS 64, MBS 1
    m = load_model_ref("mixtral-8x7b")
    s = Strategy(tp=2, dp=16, ep=4, etp=1, zero_stage=3, seq_length=4096, micro_batch_size=1,
                 global_batch_size=64, recompute="full")
    e = estimate(m, _dgx_h100(4), s)
    microbatches = 64 // (1 * 16)                        # 4 per step
    edp = 32 // (1 * 4 * 1)                              # world / (ETP x EP x PP) = 8
    # 8 experts / EP 4 = 2 per rank, 32 layers, SwiGLU fc1 (2 x 14336 x 4096) + fc2 (14336 x 4096)
    expert_params_per_rank = 2 * 32 * 3 * 4096 * 14336  # 11,274,289,152
    rows = _edp_rows(e)
    ag = [r for r in rows if r.kind == "all-gather"]
    rs = [r for r in rows if r.kind == "reduce-scatter"]
    assert sum(r.count_per_step for r in ag) == 2 * microbatches   # forward + backward, each micro-batch
    assert sum(r.count_per_step for r in rs) == microbatches       # after every backward
    assert all(r.group_size == edp for r in rows)
    assert all(r.when == "per-microbatch" for r in rows)
    assert all(r.bytes == expert_params_per_rank * BF16_BYTES for r in rows)   # 22,548,578,304
    # EDP ranks are EP x ETP = 4 apart: 2 per node over 4 nodes, so the NICs bound them
    assert all(r.link.startswith("NICs") for r in rows)
    # same bytes, group and link: a reduce-scatter takes the time of an all-gather
    assert rs[0].time_s / rs[0].count_per_step == pytest.approx(ag[0].time_s / ag[0].count_per_step, rel=1e-12)


def test_qwen3_235b_modelzoo_fsdp_row_expert_collectives():
    # the Model Zoo's FSDP row (validation/data/moe_ranking.yaml tp2-pp1-ep8-fsdp-mbs4-deepep):
    # 256 H100, TP 2, EP 8, ETP 1, MBS 4, GBS 2048
    m = load_model_ref("qwen3-235b-a22b")
    s = Strategy(tp=2, dp=128, ep=8, etp=1, zero_stage=3, seq_length=4096, micro_batch_size=4,
                 global_batch_size=2048, recompute="full")
    e = estimate(m, _dgx_h100(32), s)
    microbatches = 2048 // (4 * 128)                      # 4
    # 128 experts / EP 8 = 16 per rank, 94 layers, fc1 2 x 1536 x 4096 + fc2 1536 x 4096
    expert_bytes = 16 * 94 * 3 * 4096 * 1536 * BF16_BYTES  # 56,774,492,160 (54,144 MiB)
    rows = _edp_rows(e)
    assert sum(r.count_per_step for r in rows if r.kind == "all-gather") == 8
    assert sum(r.count_per_step for r in rows if r.kind == "reduce-scatter") == microbatches
    assert {r.group_size for r in rows} == {256 // 8}     # EDP 32: one rank on each node
    assert {r.bytes for r in rows} == {expert_bytes}      # gradients in bf16 as the parameters


def test_megatron_fsdp_gradients_move_in_the_model_dtype():
    # Megatron-FSDP ignores --grad-reduce-in-bf16 / fp32 accumulation: its main grads take the
    # model's dtype; the distributed optimizer (ZeRO-1) keeps fp32 gradients under --bf16
    base = Strategy(tp=1, dp=8, zero_stage=1)
    assert gradient_comm_bytes(base) == 4
    for z in (2, 3):
        fsdp = base.with_(zero_stage=z)
        assert gradient_comm_bytes(fsdp) == BF16_BYTES
        assert bytes_per_param(fsdp)["gradients"] == BF16_BYTES
        assert gradient_comm_bytes(fsdp.with_(grad_reduce_in_bf16=True)) == BF16_BYTES
    # the optimizer step reads the shard cast to fp32 (param_and_grad_buffer.py:3377-3381):
    # 2 x 4 (gradient) + 2 x 12 (master, moments) + 2 (bf16 weight) = 34, as ZeRO-1
    assert adam_step_bytes_per_param(base.with_(zero_stage=3)) == 2 * 4 + 2 * 12 + 2
    assert adam_step_bytes_per_param(base) == 2 * 4 + 2 * 12 + 2


def test_fsdp_memory_holds_bf16_gradient_shards():
    # ZeRO-3: gradients and parameters are both sharded and both 2 bytes, so equal per rank
    m = load_model_ref("mixtral-8x7b")
    s = Strategy(tp=2, dp=16, ep=4, etp=1, zero_stage=3, seq_length=4096, micro_batch_size=1,
                 global_batch_size=64, recompute="full")
    mem = estimate(m, _dgx_h100(4), s).memory[0]
    assert mem.gradients == pytest.approx(mem.parameters, rel=1e-12)


def test_launch_with_megatron_fsdp_dtype_flags_reports_them_unpriced():
    text = ("torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 1024 "
            "--num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 "
            "--micro-batch-size 1 --global-batch-size 64 --bf16 --use-megatron-fsdp "
            "--data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor "
            "--megatron-fsdp-grad-comm-dtype fp32\n")
    launch = parse_text(text, "fsdp.sh", env={}, default_world_size=32)
    assert launch.strategy.zero_stage == 3
    assert any("--megatron-fsdp-grad-comm-dtype" in flag for flag, _ in launch.unpriced)
