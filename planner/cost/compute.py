"""Compute time of one layer for one micro-batch on one GPU, from its operations.

FLOPs: a GEMM of (M x K) @ (K x N) costs 2 M N K FLOPs (forward); backward costs twice that
(input gradient + weight gradient). Attention scores and AV cost 4 s_q s_k b a d (forward);
the causal mask halves the work of fused (flash) kernels, which skip masked blocks; unfused
kernels compute all of it. These reproduce Narayanan et al. 2021 eq. 3 (tests/test_flops.py).

Time: a GEMM takes max(FLOPs / (peak x eff.matmul), bytes / (HBM bw x eff.memory_bandwidth))
+ eff.kernel_overhead; elementwise kernels (norms, activations, residual/dropout, softmax, RoPE,
MoE permutation) are priced by the bytes they stream. Small per-GPU GEMMs at high TP thus run
below peak, and GPUs with a high FLOP/byte ratio (H100 vs A100) lose more to memory-bound ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..specs.hardware import GPUProfile
from ..specs.model import ModelSpec
from ..strategy import Strategy
from .activations import expert_tokens_per_rank

BYTES_16BIT = 2
# Flash-attention backward does 5 matmuls to the forward's 2 (it recomputes P): 2.5x forward FLOPs
# (Dao 2023, FlashAttention-2, sec. 3.1). Unfused attention backward is 2x forward, like GEMMs.
FLASH_BACKWARD_FACTOR = 2.5


@dataclass(frozen=True)
class LayerTime:
    """Seconds for one layer, one micro-batch, on one GPU (compute only, no communication)."""
    forward: float
    backward_input: float     # input-gradient part (B of zero-bubble schedules)
    backward_weight: float    # weight-gradient part (W)
    recompute: float          # extra forward work in backward under recomputation
    core_attention_forward: float  # the part selective recompute repeats
    column_parallel_gemm_forward: float  # forward GEMMs of the column-parallel linears (QKV, fc1):
    # their backward TP collectives overlap their own wgrad/dgrad GEMMs (cost/parallel.py)
    flops_forward: float      # hardware FLOPs of the forward pass

    @property
    def total(self) -> float:
        return self.forward + self.backward_input + self.backward_weight + self.recompute


def gemm_efficiency(gpu: GPUProfile, dtype: str, m: float, n: float, k: float) -> float:
    """Achieved / peak tensor throughput of one (m x k) @ (k x n) GEMM:
    eff_max(dtype) x tile quantization x K-loop fill.
    - eff_max: a large GEMM's sustained throughput / datasheet peak (profile `matmul`, or
      `matmul_fp8` for fp8), at training clocks.
    - tile quantization: the output is computed in gemm_tile x gemm_tile tiles; a partial tile
      costs a whole one (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication
      Background": tile quantization), so m*n / (ceil(m/T) T ceil(n/T) T).
    - K-loop fill: each tile pays a fixed prologue (filling the multistage copy pipeline) and
      epilogue worth gemm_k_fill elements of its K loop, so k / (k + k_fill): thin K shards
      (out-projection and fc2 at high TP, attention's QK^T over a head dimension) run slower.
    Big GEMMs reach eff_max; thin TP shards and small hidden sizes fall below it."""
    e = gpu.efficiency
    eff_max = (e.matmul_fp8 or e.matmul) if dtype == "fp8" else e.matmul
    T = e.gemm_tile
    q = (m * n) / (math.ceil(m / T) * T * math.ceil(n / T) * T) if m > 0 and n > 0 else 1.0
    fill = k / (k + e.gemm_k_fill) if k > 0 else 1.0
    return eff_max * q * fill


def gemm_time(gpu: GPUProfile, dtype: str, m: float, n: float, k: float, batch: float = 1) -> float:
    """Seconds for `batch` independent (m x k) @ (k x n) GEMMs in one kernel (a batched or
    grouped GEMM): the roofline of their FLOPs at gemm_efficiency and of the bytes they move
    (2-byte operands, 1-byte for fp8 inputs), plus one fixed per-kernel cost."""
    flops = 2.0 * m * n * k * batch
    in_bytes = 1 if dtype == "fp8" else BYTES_16BIT
    bytes_moved = batch * (in_bytes * (m * k + k * n) + BYTES_16BIT * m * n)
    e = gpu.efficiency
    return gpu.compute_time_scale * (max(flops / (gpu.peak(dtype) * gemm_efficiency(gpu, dtype, m, n, k)),
                                         bytes_moved / (gpu.memory_bandwidth_bytes_per_s * e.memory_bandwidth))
                                     + e.kernel_overhead_s)


def stream_time(gpu: GPUProfile, bytes_moved: float, kernels: int = 1) -> float:
    """Seconds for memory-bound kernels streaming `bytes_moved` bytes."""
    e = gpu.efficiency
    return gpu.compute_time_scale * (bytes_moved / (gpu.memory_bandwidth_bytes_per_s * e.memory_bandwidth)
                                     + kernels * e.kernel_overhead_s)


def gemm_dtype(s: Strategy, gpu: GPUProfile) -> str:
    if s.precision == "fp8" and gpu.supports("fp8"):
        return "fp8"
    if s.precision == "fp16" or not gpu.supports("bf16"):
        return "fp16"
    return "bf16"


def mfu_peak_dtype(gpu: GPUProfile) -> str:
    """The dense peak MFU is quoted against: bf16, or fp16 on GPUs without bf16 (V100)."""
    return "bf16" if gpu.supports("bf16") else "fp16"


def attention_head_dims(model: ModelSpec):
    if model.multi_latent_attention:
        return model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
    return model.kv_channels, model.kv_channels


def layer_time(model: ModelSpec, s: Strategy, gpu: GPUProfile, moe: bool) -> LayerTime:
    dt = gemm_dtype(s, gpu)
    t = s.tp
    b = s.micro_batch_size
    s_q = s.seq_length / s.cp
    M = s_q * b                          # tokens through TP-sharded GEMMs on this rank
    M_sp = M / t if s.sp else M          # tokens through norms/dropout (SP splits them)
    h, a = model.hidden_size, model.num_attention_heads
    dqk, dv = attention_head_dims(model)
    a_loc = a / t
    fwd = 0.0
    flops = 0.0
    col = 0.0

    def g(m, n, k, column_parallel=False, batch=1):
        nonlocal fwd, flops, col
        dt_ = gemm_time(gpu, dt, m, n, k, batch)
        fwd += dt_
        flops += 2.0 * m * n * k * batch
        if column_parallel:
            col += dt_

    # --- attention projections
    if model.multi_latent_attention:
        if model.q_lora_rank:
            g(M, model.q_lora_rank, h)
            g(M, a_loc * dqk, model.q_lora_rank, True)
        else:
            g(M, a_loc * dqk, h, True)
        g(M, model.kv_lora_rank + model.qk_pos_emb_head_dim, h)
        g(M, a_loc * (model.qk_head_dim + dv), model.kv_lora_rank, True)
        g(M, h, a_loc * dv)
    else:
        g_loc = max(model.num_query_groups / t, 1.0)
        g(M, (a_loc + 2 * g_loc) * model.kv_channels, h, True)
        g(M, h, a_loc * model.kv_channels)
    # --- core attention (per rank: s/cp queries against all s keys; CP load-balances causality)
    attn_flops = 4.0 * s_q * s.seq_length * b * a_loc * (dqk + dv) / 2
    if s.fused_attention:
        attn_flops *= 0.5   # causal: fused kernels skip fully masked blocks
        core = gpu.compute_time_scale * (attn_flops / (gpu.peak(dt if dt != "fp8" else "bf16")
                                                       * gpu.efficiency.flash_attention)
                                         + gpu.efficiency.kernel_overhead_s)
        core_bwd = core * FLASH_BACKWARD_FACTOR
    else:
        # two batched GEMMs per (micro-batch, local head): QK^T (s_q x d) @ (d x s_k) and
        # AV (s_q x s_k) @ (s_k x d_v), + fused scale-mask-softmax (+ dropout) over the scores
        heads = b * a_loc
        core = (gemm_time(gpu, dt, s_q, s.seq_length, dqk, batch=heads)
                + gemm_time(gpu, dt, s_q, dv, s.seq_length, batch=heads))
        score_elems = s_q * s.seq_length * b * a_loc
        bytes_sm = BYTES_16BIT * 2 * score_elems + (5 * score_elems if model.attention_dropout > 0 else 0)
        core += stream_time(gpu, bytes_sm, kernels=2)
        core_bwd = 2 * core
    flops += attn_flops
    fwd += core
    # --- MLP
    if not moe:
        f = model.ffn_hidden_size
        g(M, f * (2 if model.swiglu else 1) / t, h, True)
        g(M, h, f / t)
        act_bytes = BYTES_16BIT * M * f / t * (3 if model.swiglu else 2)
    else:
        T = expert_tokens_per_rank(model, s)   # routed token copies on this rank
        e_loc = model.num_experts / s.ep
        f = model.moe_ffn_hidden_size
        g(M_sp, model.num_experts, h)          # router
        # grouped GEMM over the local experts: e_loc GEMMs of T / e_loc tokens in one kernel,
        # plus one kernel overhead per further expert for its tiles' setup
        g(T / e_loc, f * (2 if model.swiglu else 1) / s.expert_tp, h, batch=e_loc)
        g(T / e_loc, h, f / s.expert_tp, batch=e_loc)
        fwd += 2 * (e_loc - 1) * gpu.efficiency.kernel_overhead_s * gpu.compute_time_scale
        act_bytes = BYTES_16BIT * T * f / s.expert_tp * (3 if model.swiglu else 2)
        act_bytes += 4 * BYTES_16BIT * T * h      # permute + unpermute, read and write
        if model.moe_shared_expert_intermediate_size:
            fs = model.moe_shared_expert_intermediate_size
            g(M, fs * (2 if model.swiglu else 1) / t, h, True)
            g(M, h, fs / t)
            act_bytes += BYTES_16BIT * M * fs / t * (3 if model.swiglu else 2)
    # --- elementwise: 2 norms (read+write), 2 bias-dropout-add (read x, residual; write out,
    # mask), RoPE on Q and K, the MLP activation
    ew = 2 * 2 * BYTES_16BIT * M_sp * h
    ew += 2 * (3 * BYTES_16BIT + (1 if model.hidden_dropout > 0 else 0)) * M_sp * h
    if model.position_embedding_type == "rope":
        ew += 2 * BYTES_16BIT * M * (a_loc + max(model.num_query_groups / t, 1.0)) * dqk
    ew += act_bytes
    elementwise = stream_time(gpu, ew, kernels=7)
    fwd += elementwise
    matmul_fwd = fwd - core - elementwise
    # backward: GEMMs split evenly into input-grad and weight-grad; elementwise ~2x forward
    b_input = matmul_fwd + core_bwd + 2 * elementwise
    b_weight = matmul_fwd
    if s.recompute == "full":
        recompute = fwd
    elif s.recompute == "selective":
        recompute = core
    else:
        recompute = 0.0
    return LayerTime(forward=fwd, backward_input=b_input, backward_weight=b_weight,
                     recompute=recompute, core_attention_forward=core, flops_forward=flops,
                     column_parallel_gemm_forward=col)


def output_layer_time(model: ModelSpec, s: Strategy, gpu: GPUProfile) -> tuple[float, float]:
    """(forward, backward) seconds of final norm + output projection + cross entropy."""
    dt = gemm_dtype(s, gpu)
    M = s.seq_length / s.cp * s.micro_batch_size
    v_loc = model.padded_vocab_size(s.tp) / s.tp
    h = model.hidden_size
    f = gemm_time(gpu, dt, M, v_loc, h)
    ce = stream_time(gpu, (BYTES_16BIT + 4 + 4) * M * v_loc, kernels=3)   # upcast, softmax, loss
    return f + ce, 2 * f + ce   # backward: input-grad and weight-grad GEMMs, softmax grad


def embedding_time(model: ModelSpec, s: Strategy, gpu: GPUProfile) -> tuple[float, float]:
    """(forward, backward) seconds of the embedding lookup (gather) and its gradient (scatter)."""
    M = s.seq_length / s.cp * s.micro_batch_size
    f = stream_time(gpu, 2 * BYTES_16BIT * M * model.hidden_size, kernels=2)
    return f, 2 * f


def adam_step_bytes_per_param(s: Strategy) -> float:
    """Bytes Megatron's fused multi-tensor Adam streams per parameter of the rank's shard: read
    the main gradient twice (global-norm clip, then the step), read and write the master weight
    and both moments, write the model weight (2 x G + 2 x (M + m + v) + P; 34 with the default
    fp32 states and bf16 weights)."""
    from .memory import bytes_per_param
    b = bytes_per_param(s)
    return 2 * b["gradients"] + 2 * b["optimizer"] + b["parameters"]


def optimizer_time(params_local: float, gpu: GPUProfile, bytes_per_param: float = 34.0) -> float:
    """Seconds of the Adam step over `params_local` parameters (memory-bound)."""
    return stream_time(gpu, bytes_per_param * params_local, kernels=4)


# Host-side Adam for an offloaded optimizer streams the same bytes per parameter through host
# DRAM; a dual-socket server sustains ~200 GB/s (e.g. 2 x 8-channel DDR5-4800 = 614 GB/s peak,
# STREAM ~ 1/3 of that), shared by the node's GPUs. Planner assumption.
HOST_ADAM_BANDWIDTH_BYTES_PER_S = 200e9
# The offloaded share's gradients go down and its updated parameters come back in fp32
# (Megatron's HybridDeviceOptimizer keeps pinned fp32 copies, param_update_in_fp32).
OFFLOAD_TRANSFER_BYTES_PER_PARAM = 4 + 4


def optimizer_step_time(s: Strategy, placement, stage_params, per_rank: dict, group) -> float:
    """Seconds of the optimizer step of one rank: Adam over its optimizer shard on the GPU; with
    --optimizer-cpu-offload the offloaded share (--optimizer-offload-fraction) crosses PCIe both
    ways and runs Adam in host memory (the node's GPUs share the host's bandwidth), the rest
    steps on the GPU at the same time."""
    step_bytes = adam_step_bytes_per_param(s)
    shard = sum(getattr(stage_params, g) * placement.shard_factor("optimizer", g)
                for g in ("dense", "norms", "experts"))
    gpu_s = optimizer_time(shard, group.gpu, step_bytes)
    if not s.offload_optimizer:
        return gpu_s
    host = sum(getattr(stage_params, g) * placement.host_factor("optimizer", g) for g in ("dense", "norms", "experts"))
    host_s = (host * OFFLOAD_TRANSFER_BYTES_PER_PARAM / group.gpu.pcie_bandwidth_bytes_per_s
              + step_bytes * host * group.gpus_per_node / HOST_ADAM_BANDWIDTH_BYTES_PER_S)
    return max(gpu_s, host_s)


def hardware_flops_per_step(model: ModelSpec, s: Strategy, model_flops: float, recomputed_layers: int) -> float:
    """Hardware FLOPs (HFU numerator): model FLOPs plus the recomputed forward work."""
    if s.recompute == "full":
        return model_flops * (1 + recomputed_layers / model.num_layers / 3.0)   # a re-run forward is 1/3 of a layer
    if s.recompute == "selective":
        # selective recompute repeats the core-attention forward: 4 B s^2 a d per layer
        return model_flops + 4.0 * s.global_batch_size * s.seq_length ** 2 * model.num_attention_heads \
            * attention_head_dims(model)[0] * model.num_layers
    return model_flops


def model_flops_per_step(model: ModelSpec, s: Strategy) -> float:
    """Model FLOPs of one step (MFU numerator): 3x the forward FLOPs of every matmul, with the
    full (non-causal) s^2 attention term and no recomputation, as in Korthikanti et al. 2022
    (72 B s l h^2 (1 + s/6h + V/12lh) for GPT-3-style models) and Megatron-LM's own count."""
    B, S = s.global_batch_size, s.seq_length
    a = model.num_attention_heads
    dqk, dv = attention_head_dims(model)
    total = 0.0
    for i in range(model.num_layers):
        mm = model.attention_params
        if model.is_moe_layer(i):
            mm += model.router_params + model.shared_expert_params + model.moe_router_topk * model.expert_params
        else:
            mm += model.dense_mlp_params
        total += 2.0 * mm * B * S + 2.0 * B * S * S * a * (dqk + dv)
    total += 2.0 * model.embedding_params() * B * S     # output layer (logits)
    return 3.0 * total
