"""Hand-worked activation bytes of a Llama-3-70B layer under Transformer Engine fp8 current
scaling (Megatron --fp8-recipe tensorwise), and what --cpu-offloading-num-layers leaves on the GPU.

Per token of one layer at TP1 (h 8192, 64 heads of 128, 8 query groups, SwiGLU ffn 28672,
RMSNorm, fused attention, no dropout), bytes, from what each module saves for backward
(TE d0067d0 / Megatron-LM d98e8a64):
  attention block
    RMSNorm input (bf16, LayerNormLinear `inputmat`)        2 x 8192  = 16384
    rsigma (fp32)                                           4         =     4
    norm output = QKV GEMM input (fp8, ln_out columnwise)   1 x 8192  =  8192
    Q after RoPE (bf16)                                     2 x 8192  = 16384
    K, V (bf16, 8 groups x 128)                             2 x 2048  =  4096
    attention output O (bf16, saved by fused attention;
      linear_proj saves the original input under current
      scaling: megatron/core/transformer/attention.py)      2 x 8192  = 16384
    softmax log-sum-exp (fp32, 64 heads)                    4 x 64    =   256
                                                                        -----
                                                                        61700
  MLP block
    RMSNorm input (bf16)                                    2 x 8192  = 16384
    rsigma (fp32)                                                     =     4
    norm output = fc1 GEMM input (fp8)                      1 x 8192  =  8192
    SwiGLU input = fc1 output (bf16, 2 x 28672)             2 x 57344 = 114688
    SwiGLU output = fc2 GEMM input (fp8)                    1 x 28672 = 28672
                                                                        ------
                                                                        167940
  layer: 229640 bytes per token; s*b = 8192 x 2 = 16384 tokens -> 3,762,421,760 bytes.
"""

import pytest

from planner.cost import activations as act
from planner.cost.memory import cpu_offloaded_activation_bytes, stage_activation_bytes
from planner.specs.model import model_from_dict
from planner.strategy import Strategy

LLAMA3_70B = model_from_dict({
    "name": "llama3-70b", "num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
    "num_query_groups": 8, "ffn_hidden_size": 28672, "vocab_size": 128256,
    "max_position_embeddings": 8192, "swiglu": True, "normalization": "RMSNorm",
    "untie_embeddings_and_output_weights": True, "add_bias_linear": False,
    "attention_dropout": 0.0, "hidden_dropout": 0.0}, "test")

TOKENS = 8192 * 2
ATTENTION_BYTES_PER_TOKEN = 16384 + 4 + 8192 + 16384 + 4096 + 16384 + 256      # 61700
MLP_BYTES_PER_TOKEN = 16384 + 4 + 8192 + 114688 + 28672                          # 167940
LAYER_BYTES = 3_762_421_760                                                      # 229640 x 16384
EMBEDDING_BYTES = 8 * TOKENS            # int64 token ids on the first stage (no dropout mask)


def fp8_cs(**kw) -> Strategy:
    base = dict(tp=1, pp=1, dp=64, micro_batch_size=2, global_batch_size=128, seq_length=8192,
                precision="fp8", fp8_recipe="tensorwise", fused_attention=True, recompute="none")
    base.update(kw)
    return Strategy(**base)


def test_hand_worked_sums():
    assert ATTENTION_BYTES_PER_TOKEN == 61700
    assert MLP_BYTES_PER_TOKEN == 167940
    assert (ATTENTION_BYTES_PER_TOKEN + MLP_BYTES_PER_TOKEN) * TOKENS == LAYER_BYTES


def test_llama3_70b_fp8_current_scaling_layer_bytes():
    s = fp8_cs()
    assert act.attention_bytes(LLAMA3_70B, s, keep_core=True) == ATTENTION_BYTES_PER_TOKEN * TOKENS
    assert act.mlp_block_bytes(LLAMA3_70B, s, moe=False) == MLP_BYTES_PER_TOKEN * TOKENS
    assert act.layer_bytes(LLAMA3_70B, s, False, "none") == LAYER_BYTES
    assert s.recompute == "none"    # as the launch (no --recompute-granularity; offloading forbids it)


def test_delayed_scaling_adds_the_fp8_copy_of_the_out_projection_input():
    # delayed scaling: linear_proj also saves its quantized input, 1 byte x 8192 per token
    delayed = act.layer_bytes(LLAMA3_70B, fp8_cs(fp8_recipe="delayed"), False, "none")
    assert delayed == LAYER_BYTES + 8192 * TOKENS


def test_cpu_offloading_leaves_num_layers_minus_n_layers_on_the_gpu():
    # TE's default synchronizer: at most L - N = 80 - 40 layers on the GPU at once
    s = fp8_cs(cpu_offloading_num_layers=40)
    assert cpu_offloaded_activation_bytes(LLAMA3_70B, s, 0, 80) == 40 * LAYER_BYTES
    kept, _ = stage_activation_bytes(LLAMA3_70B, s, 0)
    assert kept == 40 * LAYER_BYTES + EMBEDDING_BYTES          # 150,496,870,400 + 131,072 bytes
    assert kept == 150_497_001_472


def test_cpu_offloading_one_layer_frees_one_layer():
    none, _ = stage_activation_bytes(LLAMA3_70B, fp8_cs(), 0)
    one, _ = stage_activation_bytes(LLAMA3_70B, fp8_cs(cpu_offloading_num_layers=1), 0)
    assert none == 80 * LAYER_BYTES + EMBEDDING_BYTES
    assert none - one == LAYER_BYTES
