"""NVFP4 (Megatron --fp4-format e2m1 --fp4-recipe nvfp4, TE NVFP4BlockScaling) and MXFP8 as
precisions: the fp4 GEMM against a hand computation from the profile's figures, the GEMMs
Megatron keeps out of TE's quantized linears priced at bf16, NVFP4 weight bytes by hand, the
refusals on GPUs without fp4 / MXFP8, and emitted launches read back to the same numbers.
Expected values are worked out from the profiles' written figures (gb200-186g: fp4 10000
TFLOP/s dense, fp8 5000, matmul_fp4 0.5, kernel_overhead 5 us) and the NVFP4 format (4-bit
values, one E4M3 byte per 16 elements), not produced by the code under test."""

from __future__ import annotations

import pytest

from planner.cost import activations as act
from planner.cost.compute import layer_time, output_layer_time
from planner.cost.kernels import gemm_time
from planner.cost.memory import bytes_per_param, fp8_weight_cache_bytes
from planner.errors import InvalidStrategy
from planner.estimate import estimate
from planner.library import load_bundled_profile, load_cluster_ref, load_model_ref
from planner.megatron.emit import checked_args
from planner.megatron.launch import parse_words
from planner.megatron.rules import megatron_violations
from planner.strategy import Strategy

from _cli import run

GB200 = load_bundled_profile("gb200-186g")
B200 = load_bundled_profile("b200-sxm-180g")
H100 = load_bundled_profile("h100-sxm-80g")
LLAMA70 = load_model_ref("llama3-70b")
MIXTRAL = load_model_ref("mixtral-8x7b")
NVFP4_BYTES = 0.5 + 1 / 16      # 4 bits + one E4M3 byte per 16 elements


def test_fp4_gemm_time_by_hand():
    # 8192^3: whole 128-tiles, compute-bound; 2 m n k FLOPs at 10000 TFLOP/s x 0.5, + 5 us
    n = 8192
    expected = 2 * n**3 / (10000e12 * 0.5) + 5e-6
    assert gemm_time(GB200, "fp4", n, n, n) == pytest.approx(expected, rel=1e-9)
    # the same GEMM in fp8: 5000 TFLOP/s x matmul_fp8 0.5
    assert gemm_time(GB200, "fp8", n, n, n) == pytest.approx(2 * n**3 / (5000e12 * 0.5) + 5e-6, rel=1e-9)


def test_fp4_gemm_memory_bound_reads_nvfp4_operands():
    # m = 1: the bytes bound. Operands (1 x k) and (k x n) in NVFP4, 16-bit output, at
    # 8000 GB/s x memory_bandwidth 0.85, + 5 us
    k = n = 8192
    nbytes = NVFP4_BYTES * (k + k * n) + 2 * n
    assert gemm_time(GB200, "fp4", 1, n, k) == pytest.approx(nbytes / (8000e9 * 0.85) + 5e-6, rel=1e-9)


def _parts(lt):
    return dict(lt.parts_forward)


def test_layers_outside_te_quantized_linears_are_priced_at_bf16():
    base = Strategy(tp=2, dp=1, micro_batch_size=1, global_batch_size=8, seq_length=8192, recompute="none")
    bf16, fp4 = base, base.with_(precision="nvfp4")
    # the output layer (a Megatron ColumnParallelLinear, not a TE module)
    assert output_layer_time(LLAMA70, fp4, GB200) == output_layer_time(LLAMA70, bf16, GB200)
    # attention's core (NVFP4BlockScaling: fp8_dpa off) and the MoE router (a plain linear)
    d16, d4 = _parts(layer_time(MIXTRAL, bf16, GB200, True)), _parts(layer_time(MIXTRAL, fp4, GB200, True))
    assert d4["core_attn"] == d16["core_attn"]
    assert d4["router"] == d16["router"]
    # the quantized linears run faster than bf16 even with their quantization passes
    l16, l4 = _parts(layer_time(LLAMA70, bf16, GB200, False)), _parts(layer_time(LLAMA70, fp4, GB200, False))
    assert l4["fc1"] < l16["fc1"] / 2


def test_nvfp4_quantization_passes_are_priced():
    # qkv: TE's norm does not emit NVFP4 (normalization.cpp Impl::UNFUSED with Hadamard
    # transforms), so the qkv part holds the cast of the norm output: M h elements at
    # 2 (amax) + 2 (read) + 2 x 0.5625 (row- and column-wise NVFP4) bytes, 2 kernels
    s = Strategy(tp=1, dp=1, micro_batch_size=1, global_batch_size=8, seq_length=4096, recompute="none",
                 precision="nvfp4")
    M, h = 4096, LLAMA70.hidden_size
    cast = M * h * (2 + 2 + 2 * NVFP4_BYTES) / (8000e9 * 0.85) + 2 * 5e-6
    a, g, d = LLAMA70.num_attention_heads, LLAMA70.num_query_groups, LLAMA70.kv_channels
    qkv_gemm = gemm_time(GB200, "fp4", M, (a + 2 * g) * d, h)
    # the TE linear's host-issued bookkeeping kernels beyond the GEMM (te_linear_fp8: 6, 1 in the GEMM)
    bookkeeping = 5 * 5e-6
    assert _parts(layer_time(LLAMA70, s, GB200, False))["qkv"] == pytest.approx(cast + qkv_gemm + bookkeeping,
                                                                                rel=1e-9)


def test_mxfp8_and_tensorwise_quantization_differ():
    s = Strategy(tp=1, dp=1, micro_batch_size=1, global_batch_size=8, seq_length=4096, recompute="none",
                 precision="fp8")
    tw = layer_time(LLAMA70, s.with_(fp8_recipe="tensorwise"), B200, False)
    mx = layer_time(LLAMA70, s.with_(fp8_recipe="mxfp8"), B200, False)
    # proj input M x (a d): tensorwise amax + cast (2 + 3 bytes, 2 kernels), MXFP8 one cast
    # writing both directions with E8M0 scales per 32 (2 + 2 x (1 + 1/32) bytes, 1 kernel)
    e = 4096 * LLAMA70.num_attention_heads * LLAMA70.kv_channels
    diff = (e * 5 / (7700e9 * 0.85) + 2 * 5e-6) - (e * (2 + 2 * (1 + 1 / 32)) / (7700e9 * 0.85) + 5e-6)
    assert _parts(tw)["proj"] - _parts(mx)["proj"] == pytest.approx(diff, rel=1e-6)


def test_nvfp4_weight_memory_by_hand():
    s = Strategy(precision="nvfp4")
    # TE caches a row-wise and a column-wise NVFP4 copy beside the bf16 weight
    assert fp8_weight_cache_bytes(s, GB200) == pytest.approx(2 * NVFP4_BYTES)
    assert bytes_per_param(s)["parameters"] == 2
    # --fp4-param-gather: the parameter is the row-wise NVFP4 copy, the column-wise one cached
    g = s.with_(fp4_param_gather=True)
    assert bytes_per_param(g)["parameters"] == pytest.approx(NVFP4_BYTES)
    assert fp8_weight_cache_bytes(g, GB200) == pytest.approx(NVFP4_BYTES)
    # GEMM inputs kept for wgrad: the column-wise NVFP4 copy
    assert act.gemm_input_bytes(s) == pytest.approx(NVFP4_BYTES)


def test_nvfp4_refused_on_h100_in_one_line():
    r = run(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "256",
             "--seq-length", "8192", "--precision", "nvfp4"])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "--precision" in lines[0] and "h100-sxm-80g" in lines[0] and "fp4" in lines[0]
    with pytest.raises(InvalidStrategy, match="h100-sxm-80g"):
        layer_time(LLAMA70, Strategy(precision="nvfp4"), H100, False)


def test_mxfp8_refused_on_hopper():
    with pytest.raises(InvalidStrategy, match="mxfp8 needs Blackwell"):
        layer_time(LLAMA70, Strategy(precision="fp8", fp8_recipe="mxfp8"), H100, False)


def test_emitted_nvfp4_launch_reads_back_to_the_same_numbers():
    c = load_cluster_ref("gb200-nvl72-x4")
    s = Strategy(tp=2, pp=4, dp=32, vpp=5, micro_batch_size=1, global_batch_size=256, seq_length=8192,
                 recompute="none", zero_stage=1, precision="nvfp4", fp4_param_gather=True)
    args = checked_args(LLAMA70, s)
    text = " ".join(args)
    assert "--fp4-format e2m1" in text and "--fp4-recipe nvfp4" in text and "--fp4-param-gather" in text
    assert "--fp8-format" not in text
    back = parse_words(args, "emitted", world_size=s.world_size)
    assert not megatron_violations(back, LLAMA70)
    assert (back.strategy.precision, back.strategy.fp4_param_gather) == ("nvfp4", True)
    assert not [u for u in back.unpriced if "fp4" in u[0]]
    e1 = estimate(LLAMA70, c, s)
    e2 = estimate(back.model, c, back.strategy.with_(stage_node_groups=None))
    assert e2.step_time_s == pytest.approx(e1.step_time_s, rel=1e-9)
    assert max(x.total for x in e2.memory) == pytest.approx(max(x.total for x in e1.memory), rel=1e-9)


def test_megatron_fp4_rules():
    base = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
            "--max-position-embeddings 2048 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 64 --bf16")
    both = parse_words((base + " --fp4-format e2m1 --fp8-format hybrid").split(), "t", world_size=8)
    assert "fp4-with-fp8" in [v.rule for v in megatron_violations(both)]
    alone = parse_words((base + " --fp4-param-gather").split(), "t", world_size=8)
    assert "fp4-param-gather-needs-fp4" in [v.rule for v in megatron_violations(alone)]


@pytest.mark.parametrize("model, kw", [
    ("llama3-8b", dict(tp=2, pp=2, dp=64, vpp=2, micro_batch_size=1, recompute="selective", zero_stage=1)),
    ("llama3-70b", dict(tp=4, pp=4, dp=16, micro_batch_size=1, recompute="none", zero_stage=1)),
    ("mixtral-8x7b", dict(tp=2, pp=2, dp=64, ep=8, etp=1, micro_batch_size=1, recompute="full", zero_stage=1)),
])
def test_search_bounds_hold_under_nvfp4(model, kw):
    # the search's step-time and peak-memory bounds price nvfp4 with the same cost functions as
    # estimate(): every bound stays <= the estimate (tests/test_search.py's brute-force checks)
    from test_search import assert_bounds, assert_peak_bounds
    from planner.search.bounds import Bounds
    from planner.search.planner import GpuBudget
    m, c = load_model_ref(model), load_cluster_ref("gb200-nvl72-x4")
    s = Strategy(global_batch_size=512, seq_length=4096, sequence_parallel=True, precision="nvfp4",
                 schedule="interleaved" if kw.get("vpp", 1) > 1 else "1f1b", overlap_grad_reduce=True, **kw)
    e = estimate(m, c, s)
    assert_bounds(Bounds(m, c), c, s, s, e, budget=GpuBudget())
    assert_peak_bounds(m, c, s, e, False, GpuBudget())
