"""The kernels a layer is made of, on one GPU: a GEMM (its roofline at the tile- and K-fill-
adjusted efficiency), a memory-bound pass, a quantization pass under the strategy's recipe, and
the dtypes a strategy's GEMMs run in on a GPU. Seconds; cost/compute.py composes them into a
layer.

Time: a GEMM takes max(FLOPs / (peak x eff.matmul), bytes / (HBM bw x eff.memory_bandwidth))
+ eff.kernel_overhead; elementwise kernels are priced by the bytes they stream.
"""

from __future__ import annotations

import math

from ..errors import InvalidStrategy
from ..specs.hardware import GPUProfile
from ..strategy import Strategy
from .activations import BYTES_16BIT, NVFP4_BYTES_PER_ELEMENT

# MXFP8 GEMMs need Blackwell tensor cores (sm100): Transformer Engine refuses the MXFP8 recipe
# below it (transformer_engine/pytorch/quantization.py check_mxfp8_support: "MXFP8 ... only
# supported on Blackwell"); NVFP4 likewise (check_nvfp4_support, sm100+) - a profile says so by
# its fp4 peak.
MXFP8_MIN_COMPUTE_CAPABILITY = 10.0
# Quantization passes (TE cast kernels, memory-bound), bytes per element of a 16-bit input:
# - fp8 cast: read 2, write 1; current scaling (tensorwise, blockwise) first reads the tensor for
#   its amax (+2, one more kernel). MXFP8 needs no amax pass (each 32-element block's E8M0 scale
#   comes from the block itself) but writes a row-wise and a column-wise copy with their scales
#   (2 x (1 + 1/32); transformer_engine/common/cast/mxfp8).
# - NVFP4 (NVFP4BlockScaling): one pass computes the amax of the tensor and of its random Hadamard
#   transform (nvte_hadamard_transform_amax: read 2), the cast then reads it again and writes the
#   row-wise copy and the Hadamard-transformed column-wise copy for wgrad (stochastic rounding
#   for gradients, in the same kernel): 2 + 2 + 2 x NVFP4_BYTES_PER_ELEMENT, 2 kernels.
FP8_CAST_BYTES = 2 + 1
AMAX_PASS_BYTES = 2
MXFP8_CAST_BYTES = 2 + 2 * (1 + 1 / 32)
NVFP4_CAST_BYTES = AMAX_PASS_BYTES + 2 + 2 * NVFP4_BYTES_PER_ELEMENT


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
    eff_max = matmul_efficiency(gpu, dtype)
    T = e.gemm_tile
    q = (m * n) / (math.ceil(m / T) * T * math.ceil(n / T) * T) if m > 0 and n > 0 else 1.0
    fill = k / (k + e.gemm_k_fill) if k > 0 else 1.0
    return eff_max * q * fill


def matmul_efficiency(gpu: GPUProfile, dtype: str) -> float:
    """A large GEMM's sustained throughput / the dtype's peak: the profile's `matmul`, or
    `matmul_fp8` for fp8, `matmul_fp4` for NVFP4 (falling back to matmul_fp8, then matmul)."""
    e = gpu.efficiency
    if dtype == "fp4":
        return e.matmul_fp4 or e.matmul_fp8 or e.matmul
    if dtype == "fp8":
        return e.matmul_fp8 or e.matmul
    return e.matmul


# bytes per element of a GEMM's input operands by GEMM dtype (fp4: NVFP4 values + block scales)
GEMM_INPUT_BYTES = {"fp8": 1, "fp4": NVFP4_BYTES_PER_ELEMENT}


def gemm_time(gpu: GPUProfile, dtype: str, m: float, n: float, k: float, batch: float = 1) -> float:
    """Seconds for `batch` independent (m x k) @ (k x n) GEMMs in one kernel (a batched or
    grouped GEMM): the roofline of their FLOPs at gemm_efficiency and of the bytes they move
    (2-byte operands, 1-byte for fp8 inputs, NVFP4_BYTES_PER_ELEMENT for fp4), plus one fixed
    per-kernel cost."""
    flops = 2.0 * m * n * k * batch
    in_bytes = GEMM_INPUT_BYTES.get(dtype, BYTES_16BIT)
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


def precision_problem(s: Strategy, gpu: GPUProfile) -> str | None:
    """Why `gpu` cannot run the strategy's precision (None: it can): nvfp4 needs the GPU's fp4
    tensor peak (Blackwell), MXFP8 Blackwell's compute capability, as Transformer Engine
    checks at start-up."""
    if s.precision == "nvfp4" and not gpu.supports("fp4"):
        return (f"nvfp4 needs fp4 tensor cores (a peak_tflops.fp4 in the GPU profile: Blackwell, e.g. b200-sxm-180g, "
                f"gb200-186g, gb300-288g, b300-sxm-288g); {gpu.name} has none")
    if (s.precision == "fp8" and s.fp8_recipe == "mxfp8" and gpu.supports("fp8")
            and gpu.compute_capability < MXFP8_MIN_COMPUTE_CAPABILITY):
        return (f"--fp8-recipe mxfp8 needs Blackwell (compute capability >= {MXFP8_MIN_COMPUTE_CAPABILITY:g}); "
                f"{gpu.name} has {gpu.compute_capability:g} (Transformer Engine refuses it; expected tensorwise, "
                "delayed or blockwise)")
    return None


def gemm_dtype(s: Strategy, gpu: GPUProfile) -> str:
    """The dtype a transformer layer's TE GEMMs run in. Refuses a precision the GPU lacks
    (precision_problem); fp8 on a GPU without fp8 runs 16-bit, as before."""
    problem = precision_problem(s, gpu)
    if problem:
        raise InvalidStrategy("precision", problem)
    if s.precision == "nvfp4":
        return "fp4"
    if s.precision == "fp8" and gpu.supports("fp8"):
        return "fp8"
    if s.precision == "fp16" or not gpu.supports("bf16"):
        return "fp16"
    return "bf16"


def high_precision_dtype(s: Strategy, gpu: GPUProfile) -> str:
    """The dtype of the GEMMs Megatron runs outside Transformer Engine's quantized linears under
    nvfp4: the output layer (tensor_parallel.ColumnParallelLinear), the MoE router (a plain
    linear in --moe-router-dtype or the params' dtype), attention's core (NVFP4BlockScaling has
    fp8_dpa off) - bf16, or fp16 with --fp16. Under fp8 the planner keeps pricing them as before
    (gemm_dtype)."""
    dt = gemm_dtype(s, gpu)
    if dt == "fp4":
        return mfu_peak_dtype(gpu)
    return dt


def mfu_peak_dtype(gpu: GPUProfile) -> str:
    """The dense peak MFU is quoted against: bf16, or fp16 on GPUs without bf16 (V100)."""
    return "bf16" if gpu.supports("bf16") else "fp16"


def quantization_pass(s: Strategy, dtype: str) -> tuple[float, int]:
    """(bytes per element, kernels) of one quantization of a 16-bit GEMM input under the
    strategy's recipe (constants above): fp8 delayed scaling a cast (3 B, 1 kernel); tensorwise
    and blockwise current scaling an amax pass and a cast (5 B, 2); MXFP8 one cast writing both
    directions with scales (~6.06 B, 1); NVFP4 the amax pass and a cast writing both directions
    (~5.13 B, 2). (0, 0) when nothing is quantized."""
    if dtype == "fp4":
        return NVFP4_CAST_BYTES, 2
    if dtype != "fp8":
        return 0.0, 0
    if s.fp8_recipe == "mxfp8":
        return MXFP8_CAST_BYTES, 1
    if s.fp8_recipe == "delayed":
        return FP8_CAST_BYTES, 1
    return FP8_CAST_BYTES + AMAX_PASS_BYTES, 2
