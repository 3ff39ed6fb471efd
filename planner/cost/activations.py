"""Activation memory of one transformer layer for one micro-batch on one rank, in bytes.

The tensors each module of a Megatron-Core layer with Transformer Engine saves for backward
(megatron/core/models/gpt/gpt_layer_specs.py, TE layernorm_linear.py / linear.py /
dot_product_attention backends, Megatron fused_bias_swiglu.py and fused_bias_dropout.py; read at
Megatron-LM d98e8a6 and TransformerEngine d0067d0), listed by name below. With Korthikanti et al.
2022's assumptions (4h GELU MLP, multi-head attention, unfused softmax with dropout) the h-terms
are exactly their Table 2 (34 s b h + 5 a s^2 b); the model adds what Korthikanti leaves out (the
fp32 norm statistics, 4-8 bytes per token and norm) and what later kernels change:
- fused / flash attention keeps only the fp32 log-sum-exp (4 a s b / t), not the s x s scores;
- GQA shrinks K and V to the query groups; gated MLPs (SwiGLU, GeGLU) keep 2f at the activation input;
- fp8 (TE): the GEMM inputs kept for wgrad (the two norm outputs, the fc2 input) are stored in
  fp8, 1 byte (+1/32 for MXFP8 and blockwise scales), under nvfp4 in NVFP4 (1/2 + 1/16 byte);
  Q, K, V, O and the residuals stay 16-bit;
  delayed scaling keeps an extra fp8 copy of the out-projection input;
- selective recompute (--recompute-modules) frees, per module, what it will rebuild.
Element sizes: 16-bit activations 2 bytes, dropout masks 1 byte, norm statistics and softmax
statistics 4 bytes (fp32).
"""

from __future__ import annotations

from dataclasses import replace

from ..specs.hardware import GPUProfile
from ..specs.model import ModelSpec
from ..strategy import Strategy

BYTES_16BIT = 2
BYTES_MASK = 1
BYTES_FP32 = 4
BYTES_INT64 = 8
BYTES_INT32 = 4
# MXFP8 and blockwise fp8 add scales: one E8M0 byte per 32 elements (MXFP8), one fp32 per 128
# (blockwise 1x128) = 1/32 byte per element either way (TE float8 blockwise / mxfp8 storage)
FP8_SCALE_BYTES_PER_ELEMENT = {"mxfp8": 1 / 32, "blockwise": 4 / 128}
# NVFP4 (TE NVFP4BlockScaling, transformer_engine/common/recipe/__init__.py; Megatron
# --fp4-format e2m1 --fp4-recipe nvfp4): a 4-bit E2M1 value (1/2 byte) and one E4M3 scale byte
# per 16 elements (16x16 blocks for weights, stored in the same per-16 layout), plus one fp32
# scale per tensor (negligible): 1/2 + 1/16 bytes per element in each direction TE stores
NVFP4_VALUE_BYTES = 0.5
NVFP4_BLOCK_ELEMENTS = 16
NVFP4_SCALE_BYTES = 1          # E4M3
NVFP4_BYTES_PER_ELEMENT = NVFP4_VALUE_BYTES + NVFP4_SCALE_BYTES / NVFP4_BLOCK_ELEMENTS
# Fused attention kernels need sm80 or newer: FlashAttention-2 builds for compute capability 8.0+
# (its README: Ampere, Ada, Hopper), TE's cuDNN FusedAttention requires sm_arch >= 80
# (transformer_engine/common/fused_attn/fused_attn.cpp, nvte_get_fused_attn_backend). On older
# GPUs (V100, sm70) --attention-backend auto falls back to the unfused softmax path.
FUSED_ATTENTION_MIN_COMPUTE_CAPABILITY = 8.0


def attention_on_gpu(s: Strategy, gpu: GPUProfile) -> Strategy:
    """The strategy as it runs on `gpu`: fused attention only where the GPU has the kernels."""
    if s.fused_attention and gpu.compute_capability < FUSED_ATTENTION_MIN_COMPUTE_CAPABILITY:
        return replace(s, fused_attention=False)
    return s


def _dims(model: ModelSpec, s: Strategy):
    """Per-rank token count and TP split factors."""
    tokens = (s.seq_length // s.cp) * s.micro_batch_size      # s*b on this rank (CP splits s)
    t = s.tp
    rep = 1.0 / t if s.sp else 1.0                             # TP-replicated parts, split by SP
    return tokens, t, rep


def gemm_input_bytes(s: Strategy) -> float:
    """Bytes per element of a GEMM input kept for the weight gradient: 2 in bf16/fp16; 1 in fp8
    (TE saves the quantized column-wise copy only), plus the scales of MXFP8 / blockwise; under
    nvfp4 the column-wise NVFP4 copy (Hadamard-transformed for wgrad), NVFP4_BYTES_PER_ELEMENT."""
    if s.precision == "nvfp4":
        return NVFP4_BYTES_PER_ELEMENT
    if s.precision != "fp8":
        return BYTES_16BIT
    return 1.0 + FP8_SCALE_BYTES_PER_ELEMENT.get(s.fp8_recipe, 0.0)


def norm_stat_bytes(model: ModelSpec) -> int:
    """fp32 statistics a norm keeps per token: rsigma (RMSNorm), mu and rsigma (LayerNorm)."""
    return BYTES_FP32 * (1 if model.normalization == "RMSNorm" else 2)


def _selective(s: Strategy, module: str) -> bool:
    return s.recompute == "selective" and module in s.recompute_modules


def attention_bytes(model: ModelSpec, s: Strategy, keep_core: bool) -> float:
    """Self-attention block incl. its input norm and the dropout after it.
    keep_core=False drops what recomputing core attention rebuilds (the softmax statistics of
    fused attention, the s x s scores of unfused attention)."""
    sb, t, rep = _dims(model, s)
    h, a = model.hidden_size, model.num_attention_heads
    e_in = gemm_input_bytes(s)
    out = 0.0
    out += BYTES_16BIT * sb * h * rep                    # norm input (the layer input / residual)
    out += norm_stat_bytes(model) * sb * rep              # norm statistics
    if model.multi_latent_attention:
        qk, rope, v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        # MLA: a separate input norm, down-projections, latent norms, up-projections
        out += e_in * sb * h * rep                                 # norm output = down-proj input
        if model.q_lora_rank:
            out += (BYTES_16BIT + e_in) * sb * model.q_lora_rank   # q latent (norm input, up-proj input)
        out += (BYTES_16BIT + e_in) * sb * (model.kv_lora_rank + rope)   # kv latent
        q_elems = k_elems = a * (qk + rope) / t
        v_elems = o_elems = a * v / t
        if _selective(s, "mla_up_proj"):
            q_elems = k_elems = v_elems = 0.0   # post-up-projection q, k, v rebuilt in backward
    else:
        d, g = model.kv_channels, model.num_query_groups
        g_local = max(g / t, 1.0)                         # with tp > groups, each rank keeps one group
        out += e_in * sb * h * rep                        # norm output = QKV input (TE saves the local shard)
        q_elems = a * d / t
        k_elems = v_elems = g_local * d
        o_elems = a * d / t
        if model.qk_layernorm:
            out += BYTES_16BIT * sb * (q_elems + k_elems)  # q/k norm inputs
    out += BYTES_16BIT * sb * (q_elems + k_elems + v_elems)   # Q, K, V (inputs of QK^T and AV)
    out += BYTES_16BIT * sb * o_elems                     # attention output = out-projection input
    if s.precision == "fp8" and s.fp8_recipe == "delayed":
        out += e_in * sb * o_elems                        # delayed scaling: an extra fp8 copy of it
    s_q = s.seq_length // s.cp
    heads_local = a / t
    if keep_core:
        if s.fused_attention:
            out += BYTES_FP32 * sb * heads_local          # softmax log-sum-exp per (token, head)
        else:
            # Unfused: softmax output (2 a s^2 b), dropout mask (a s^2 b), dropout output (2 a s^2 b)
            keys = min(s.seq_length, model.window_size + 1) if model.window_size else s.seq_length
            sq = s_q * keys * s.micro_batch_size * heads_local
            out += BYTES_16BIT * sq
            if model.attention_dropout > 0:
                out += BYTES_MASK * sq + BYTES_16BIT * sq
    if model.hidden_dropout > 0:
        out += BYTES_MASK * sb * h * rep                  # dropout mask after the out-projection
    return out


def _mlp_bytes(model: ModelSpec, s: Strategy, ffn: float, tokens: float, split: int) -> float:
    """A (gated) MLP's kept tensors after its input: activation input (fc1 output, 2f elements
    when gated) and fc2 input (a GEMM input, fp8 under fp8)."""
    act_in = ffn * (2 if model.swiglu else 1) / split
    return BYTES_16BIT * tokens * act_in + gemm_input_bytes(s) * tokens * ffn / split


def expert_tokens_per_rank(model: ModelSpec, s: Strategy) -> float:
    """Routed token copies one rank computes per micro-batch, T_e: s*b*k, split by TP/SP, gathered
    over expert-TP (balanced dropless routing); with a capacity factor and padding to capacity,
    exactly ceil(n k cf / E) per expert and source rank (megatron/core/transformer/moe/
    moe_utils.py); with a capacity factor alone, at most that."""
    sb, t, _ = _dims(model, s)
    cf = (model.moe_capacity_factor or 1.0) if s.moe_pad_expert_input_to_capacity else 1.0
    return sb * model.moe_router_topk / t * s.expert_tp * max(cf, 1.0)


def moe_mlp_bytes(model: ModelSpec, s: Strategy) -> float:
    """The MoE block after its input: the separate pre-MLP norm's output, router logits /
    probabilities / routing map, the permutation map, each expert's saved tensors and the shared
    expert (megatron/core/transformer/moe/: router.py, moe_utils.py permute, experts.py
    TEGroupedMLP, shared_experts.py)."""
    sb, t, rep = _dims(model, s)
    h, E = model.hidden_size, model.num_experts
    n = sb * rep                                          # tokens entering the MoE layer on this rank
    r_dt = BYTES_FP32 if s.moe_router_dtype == "fp32" else BYTES_16BIT
    out = 0.0
    if not _selective(s, "layernorm"):
        out += BYTES_16BIT * n * h                        # pre-MLP norm output (router and experts' input)
    out += 2 * r_dt * n * E + n * E                       # router logits, probabilities; bool routing map
    k = model.moe_router_topk
    out += BYTES_INT32 * n * (2 * E + 1) if s.moe_permute_fusion else BYTES_INT64 * n * k   # permutation map
    T = expert_tokens_per_rank(model, s)
    f = model.moe_ffn_hidden_size / s.expert_tp
    e_in = gemm_input_bytes(s)
    out += T * (e_in * h + BYTES_FP32)                    # permuted tokens (fc1 input) + their probs
    out += BYTES_16BIT * T * f * (2 if model.swiglu else 1)   # fc1 output = activation input
    if not _selective(s, "moe_act"):
        out += e_in * T * f                               # activation output = fc2 input
    fs = model.moe_shared_expert_intermediate_size
    if fs and not _selective(s, "shared_experts"):
        out += _mlp_bytes(model, s, fs, n, t)
    return out


def mlp_block_bytes(model: ModelSpec, s: Strategy, moe: bool) -> float:
    """MLP block incl. its input norm and the dropout after it."""
    sb, t, rep = _dims(model, s)
    h = model.hidden_size
    out = BYTES_16BIT * sb * h * rep + norm_stat_bytes(model) * sb * rep   # norm input + statistics
    if moe:
        out += moe_mlp_bytes(model, s)
    elif not _selective(s, "mlp"):
        out += gemm_input_bytes(s) * sb * h * rep          # norm output = fc1 input (TE-fused norm)
        out += _mlp_bytes(model, s, model.ffn_hidden_size, sb, t)
    if model.hidden_dropout > 0:
        out += BYTES_MASK * sb * h * rep
    return out


def layer_bytes(model: ModelSpec, s: Strategy, moe: bool, recompute: str) -> float:
    """Bytes kept between forward and backward for one layer and one micro-batch. `recompute`
    is the layer's own mode: full (only the layer input is kept), selective (the modules of
    s.recompute_modules are rebuilt), none."""
    sb, t, rep = _dims(model, s)
    if recompute == "full":
        return BYTES_16BIT * sb * model.hidden_size * rep   # only the layer input is kept
    keep_core = not (recompute == "selective" and "core_attn" in s.recompute_modules)
    return attention_bytes(model, s, keep_core) + mlp_block_bytes(model, s, moe)


def mtp_input_bytes(model: ModelSpec, s: Strategy) -> float:
    """An MTP module's own inputs kept for backward beyond its decoder layer: the inputs of its
    two norms (the hidden state and the next token's embedding) and of the 2h -> h projection."""
    sb, t, rep = _dims(model, s)
    h = model.hidden_size
    return 2 * BYTES_16BIT * sb * h * rep + gemm_input_bytes(s) * sb * 2 * h


def embedding_bytes(model: ModelSpec, s: Strategy) -> float:
    """First stage, per in-flight micro-batch: embedding-output dropout mask (Megatron's
    theoretical_memory_usage.py counts this and the int64 token ids)."""
    sb, t, rep = _dims(model, s)
    out = float(BYTES_INT64) * sb                             # token ids, int64
    if model.hidden_dropout > 0:
        out += BYTES_MASK * sb * model.hidden_size * rep
    return out


def output_layer_bytes(model: ModelSpec, s: Strategy) -> float:
    """Last stage, for the one micro-batch whose loss is being computed: final-norm input,
    output-layer input (the local shard) and, under SP, Megatron's persistent buffer for its
    all-gathered copy (megatron/core/tensor_parallel/layers.py), the 16-bit logits and the fp32
    [s, b, V/t] tensor every cross-entropy implementation keeps for backward
    (megatron/core/tensor_parallel/cross_entropy.py, fused_cross_entropy.py, TE's triton kernel)."""
    sb, t, rep = _dims(model, s)
    h = model.hidden_size
    v_local = model.padded_vocab_size(s.tp) / s.tp
    gathered = BYTES_16BIT * sb * h if s.sp else 0.0
    return (BYTES_16BIT * sb * h * rep + BYTES_16BIT * sb * h * rep + gathered
            + BYTES_16BIT * sb * v_local + BYTES_FP32 * sb * v_local)
