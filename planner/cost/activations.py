"""Activation memory of one transformer layer for one micro-batch on one rank, in bytes.

Generalises Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", arXiv 2205.05198, sec. 4 and Table 2), which assumes a 4h GELU MLP, multi-head attention,
unfused softmax and dropout everywhere: with those assumptions these functions reproduce its
rows exactly (tests/test_activations.py). Each tensor kept for backward is listed by name.
16-bit activations take 2 bytes per element, dropout masks 1 byte, softmax statistics 4 bytes.
"""

from __future__ import annotations

from ..specs.model import ModelSpec
from ..strategy import Strategy

BYTES_16BIT = 2
BYTES_MASK = 1
BYTES_FP32 = 4


def _dims(model: ModelSpec, s: Strategy):
    """Per-rank token count and TP split factors."""
    tokens = (s.seq_length // s.cp) * s.micro_batch_size      # s*b on this rank (CP splits s)
    t = s.tp
    rep = 1.0 / t if s.sp else 1.0                             # TP-replicated parts, split by SP
    return tokens, t, rep


def attention_bytes(model: ModelSpec, s: Strategy, keep_core: bool) -> float:
    """Self-attention block incl. its input norm and the dropout after it.
    keep_core=False drops what selective recompute rebuilds (the core-attention internals)."""
    sb, t, rep = _dims(model, s)
    h, a = model.hidden_size, model.num_attention_heads
    out = 0.0
    out += BYTES_16BIT * sb * h * rep                    # input of the norm
    out += BYTES_16BIT * sb * h * rep                    # norm output = input of the QKV projection
    if model.multi_latent_attention:
        qk, rope, v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        if model.q_lora_rank:
            out += 2 * BYTES_16BIT * sb * model.q_lora_rank        # q latent, input of q-norm and q-up
        out += 2 * BYTES_16BIT * sb * (model.kv_lora_rank + rope)  # kv latent, input of kv-norm and kv-up
        q_elems = a * (qk + rope) / t
        k_elems = a * (qk + rope) / t
        v_elems = a * v / t
        o_elems = a * v / t
    else:
        d, g = model.kv_channels, model.num_query_groups
        g_local = max(g / t, 1.0)                         # with tp > groups, each rank keeps one group
        q_elems = a * d / t
        k_elems = v_elems = g_local * d
        o_elems = a * d / t
    out += BYTES_16BIT * sb * (q_elems + k_elems + v_elems)   # Q, K, V (inputs of QK^T and AV)
    out += BYTES_16BIT * sb * o_elems                     # attention output = input of out-projection
    s_q = s.seq_length // s.cp
    heads_local = a / t
    if keep_core:
        if s.fused_attention:
            out += BYTES_FP32 * sb * heads_local          # softmax log-sum-exp per (token, head)
        else:
            # Unfused: softmax output (2 a s^2 b), dropout mask (a s^2 b), dropout output (2 a s^2 b)
            sq = s_q * s.seq_length * s.micro_batch_size * heads_local
            out += BYTES_16BIT * sq
            if model.attention_dropout > 0:
                out += BYTES_MASK * sq + BYTES_16BIT * sq
    if model.hidden_dropout > 0:
        out += BYTES_MASK * sb * h * rep                  # dropout mask after the out-projection
    return out


def mlp_bytes(model: ModelSpec, s: Strategy, ffn: int, tp_split: int | None = None,
              tokens: float | None = None) -> float:
    """A (gated) MLP without its norm: fc1 input, activation input, fc2 input."""
    sb, t, rep = _dims(model, s)
    t = tp_split or t
    n = tokens if tokens is not None else sb
    h = model.hidden_size
    act_in = ffn * (2 if model.swiglu else 1) / t      # SwiGLU keeps gate and up outputs
    fc1_in = BYTES_16BIT * n * h * (rep if tokens is None else 1.0)
    return fc1_in + BYTES_16BIT * n * act_in + BYTES_16BIT * n * ffn / t


def expert_tokens_per_rank(model: ModelSpec, s: Strategy) -> float:
    """Routed token copies one rank computes per micro-batch: s*b*k, split by TP/SP, gathered over
    expert-TP; times the capacity factor when tokens are padded to capacity (dropless: 1)."""
    sb, t, _ = _dims(model, s)
    cf = model.moe_capacity_factor or 1.0
    return sb * model.moe_router_topk / t * s.expert_tp * max(cf, 1.0)


def mlp_block_bytes(model: ModelSpec, s: Strategy, moe: bool) -> float:
    """MLP block incl. its input norm and the dropout after it; MoE layers add the router, the
    permuted token copies and the expert MLPs (and a shared expert if any)."""
    sb, t, rep = _dims(model, s)
    h = model.hidden_size
    out = BYTES_16BIT * sb * h * rep                     # input of the norm
    if not moe:
        out += mlp_bytes(model, s, model.ffn_hidden_size)
    else:
        out += BYTES_16BIT * sb * h * rep                # norm output = router/dispatch input
        out += BYTES_FP32 * sb * rep * model.num_experts  # router logits/probabilities (fp32)
        T = expert_tokens_per_rank(model, s)
        out += mlp_bytes(model, s, model.moe_ffn_hidden_size, tp_split=s.expert_tp, tokens=T)
        out += BYTES_16BIT * T * h                        # expert outputs kept for the weighted combine
        if model.moe_shared_expert_intermediate_size:
            out += mlp_bytes(model, s, model.moe_shared_expert_intermediate_size)
    if model.hidden_dropout > 0:
        out += BYTES_MASK * sb * h * rep
    return out


def layer_bytes(model: ModelSpec, s: Strategy, moe: bool, recompute: str) -> float:
    """Bytes kept between forward and backward for one layer and one micro-batch."""
    sb, t, rep = _dims(model, s)
    if recompute == "full":
        return BYTES_16BIT * sb * model.hidden_size * rep   # only the layer input is kept
    keep_core = recompute == "none"
    return attention_bytes(model, s, keep_core) + mlp_block_bytes(model, s, moe)


def embedding_bytes(model: ModelSpec, s: Strategy) -> float:
    """First stage, per in-flight micro-batch: embedding-output dropout mask (Megatron's
    theoretical_memory_usage.py counts this and the int64 token ids)."""
    sb, t, rep = _dims(model, s)
    out = 8.0 * sb                                            # token ids, int64
    if model.hidden_dropout > 0:
        out += BYTES_MASK * sb * model.hidden_size * rep
    return out


def output_layer_bytes(model: ModelSpec, s: Strategy) -> float:
    """Last stage, for the one micro-batch whose loss is being computed: final-norm input,
    output-layer input (gathered over TP), bf16 logits and the fp32 softmax kept by the
    vocab-parallel cross entropy."""
    sb, t, rep = _dims(model, s)
    h = model.hidden_size
    v_local = model.padded_vocab_size(s.tp) / s.tp
    return (BYTES_16BIT * sb * h * rep + BYTES_16BIT * sb * h
            + BYTES_16BIT * sb * v_local + BYTES_FP32 * sb * v_local)
