"""Hardware profiles: one YAML per accelerator in hardware_profiles/.

Datasheet figures come from ../shared/reference/gpus.yaml (vendor datasheets). Efficiency
knobs of the cost model live in the profile (documented there), never in code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..bundled import bundled_profile_names, find
from ..errors import SpecError
from ..inputs import printable
from ..hashing import hash_once, state_without_hash
from ..units import UnitError, parse_bandwidth, parse_size, parse_time
from ..yamlio import check_fields, get_float, get_int, get_str, load_file, suggest

# fp4: the dense NVFP4 (E2M1 with E4M3 block scales) tensor peak of Blackwell GPUs
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")


@dataclass(frozen=True)
class Efficiency:
    """Fractions of datasheet peaks that real kernels reach, and fixed per-kernel costs."""
    matmul: float                 # large dense GEMM throughput / peak tensor throughput
    memory_bandwidth: float       # streaming elementwise kernels / peak HBM bandwidth
    kernel_overhead_s: float      # launch + tail cost per kernel (makes small GEMMs slow)
    scale_up: float               # NCCL bus bandwidth / scale-up link rate (per direction)
    network: float                # NCCL bus bandwidth / NIC line rate
    flash_attention: float        # fused attention throughput / peak (relative to GEMMs)
    matmul_fp8: float | None = None   # large fp8 GEMM throughput / fp8 peak (None: as matmul)
    # large NVFP4 GEMM throughput / fp4 peak (None: as matmul_fp8, then matmul; no published
    # training-shape measurement to take it from, so profiles carry matmul_fp8, marked uncertain)
    matmul_fp4: float | None = None
    # GEMM shape terms (cost/compute.py gemm_efficiency): output tiles of gemm_tile x gemm_tile
    # elements (work on a partial tile is wasted), and a fixed pipeline fill + epilogue per tile
    # worth gemm_k_fill elements of the K loop
    gemm_tile: int = 128
    gemm_k_fill: int = 0
    # host CPU seconds to issue one kernel from eager PyTorch (Python, dispatcher, launch): the
    # GPU waits on the host when its kernels are shorter than this (small, fine-grained MoE)
    host_launch_overhead_s: float = 0.0


@dataclass(frozen=True)
class GPUProfile:
    # the cost caches key on it: hash the fields once (planner/hashing.py)
    __hash__ = hash_once
    __getstate__ = state_without_hash

    name: str
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    peak_flops_per_s: tuple         # ((dtype, FLOP/s dense), ...)
    scale_up_bandwidth_bytes_per_s: float   # per GPU, per direction
    scale_up_latency_s: float
    pcie_bandwidth_bytes_per_s: float       # per direction
    cuda_context_bytes: float       # CUDA context + loaded kernels of PyTorch, TE, cuDNN, NCCL
    nccl_bytes_per_communicator: float   # NCCL buffers of one communicator (channels x peers)
    fragmentation_fraction: float   # caching allocator: reserved beyond allocated / allocated
    efficiency: Efficiency
    source: str = ""
    uncertain: tuple[str, ...] = ()
    compute_capability: float = 9.0    # CUDA compute capability (sm); decides fp8 and workspace layouts
    # measured / modelled compute seconds, fitted by `planner calibrate` from a cluster's own
    # training logs (1.0: the profile as written); multiplies every compute kernel's time
    compute_time_scale: float = 1.0
    # streaming multiprocessors (AMD: compute units), from the datasheet or architecture paper;
    # None: not known, and then the SMs communication kernels take from GEMMs are not charged
    # (cost/compute.py comm_sm_share)
    sm_count: int | None = None

    def peak(self, dtype: str) -> float:
        for d, v in self.peak_flops_per_s:
            if d == dtype:
                return v
        raise SpecError(self.name, "peak_tflops", f"no {dtype} peak in this profile")

    def supports(self, dtype: str) -> bool:
        return any(d == dtype for d, _ in self.peak_flops_per_s)


PROFILE_FIELDS = {"name", "vendor", "memory", "memory_bandwidth", "peak_tflops", "scale_up_bandwidth",
                  "scale_up_latency", "pcie_bandwidth", "cuda_context", "nccl_memory_per_communicator",
                  "fragmentation_fraction", "compute_capability", "sm_count", "efficiency", "source", "uncertain",
                  "notes"}
PROFILE_REQUIRED_FIELDS = {"name", "memory", "memory_bandwidth", "peak_tflops", "scale_up_bandwidth",
                           "pcie_bandwidth", "cuda_context", "nccl_memory_per_communicator",
                           "fragmentation_fraction", "compute_capability", "efficiency"}
EFF_FIELDS = {"matmul", "memory_bandwidth", "kernel_overhead", "scale_up", "network", "flash_attention",
              "matmul_fp8", "matmul_fp4", "gemm_tile", "gemm_k_fill", "host_launch_overhead"}
EFF_REQUIRED_FIELDS = {"matmul", "memory_bandwidth", "kernel_overhead", "scale_up", "network", "flash_attention"}


def _unit(fn, data: dict, key: str, source: str, prefix: str = ""):
    try:
        return fn(data[key])
    except UnitError as exc:
        raise SpecError(source, f"{prefix}{key}", str(exc)) from None


def profile_from_dict(data: Any, source: str) -> GPUProfile:
    check_fields(data, source, "", PROFILE_FIELDS, PROFILE_REQUIRED_FIELDS)
    peaks = data["peak_tflops"]
    check_fields(peaks, source, "peak_tflops", set(DTYPES), set())
    peak_flops = {}
    for k, v in peaks.items():
        if v is None:
            continue
        peak_flops[k] = get_float(peaks, k, source, "peak_tflops", minimum=0.1, maximum=1e6) * 1e12
    # The cost model prices 16-bit GEMMs with the bf16 peak (cost/compute.py gemm_dtype,
    # mfu_peak_dtype), fp16 runs with the fp16 peak, and the attention of fp8 runs with bf16's.
    if not ({"bf16", "fp16"} & set(peak_flops)):
        raise SpecError(source, "peak_tflops.bf16", "no bf16 peak (and no fp16 peak); expected the dense bf16 "
                        "tensor peak, which 16-bit training is priced with, or for a GPU without bf16 (V100) "
                        "its fp16 peak alone, which then prices bf16 runs too")
    if "fp8" in peak_flops and "bf16" not in peak_flops:
        raise SpecError(source, "peak_tflops.bf16", "an fp8 peak without a bf16 peak; expected a bf16 peak too "
                        "(every fp8 GPU has one, and fp8 runs price attention with it)")
    if "fp4" in peak_flops and "fp8" not in peak_flops:
        raise SpecError(source, "peak_tflops.fp8", "an fp4 peak without an fp8 peak; expected an fp8 peak too "
                        "(every GPU with NVFP4 tensor cores has fp8 ones, Blackwell and later)")
    uncertain_extra: list[str] = []
    if "fp16" not in peak_flops:
        # tensor cores run fp16 at the bf16 rate on every GPU that has both (A100, H100, MI300X, ...)
        peak_flops["fp16"] = peak_flops["bf16"]
        uncertain_extra.append("peak_tflops.fp16 (taken as the bf16 peak)")
    eff = data["efficiency"]
    check_fields(eff, source, "efficiency", EFF_FIELDS, EFF_REQUIRED_FIELDS)
    efficiency = Efficiency(
        matmul=get_float(eff, "matmul", source, "efficiency", minimum=0.01, maximum=1.0),
        memory_bandwidth=get_float(eff, "memory_bandwidth", source, "efficiency", minimum=0.01, maximum=1.0),
        kernel_overhead_s=_unit(parse_time, eff, "kernel_overhead", source, "efficiency."),
        scale_up=get_float(eff, "scale_up", source, "efficiency", minimum=0.01, maximum=1.0),
        network=get_float(eff, "network", source, "efficiency", minimum=0.01, maximum=1.0),
        flash_attention=get_float(eff, "flash_attention", source, "efficiency", minimum=0.01, maximum=1.0),
        matmul_fp8=get_float(eff, "matmul_fp8", source, "efficiency", minimum=0.01, maximum=1.0),
        matmul_fp4=get_float(eff, "matmul_fp4", source, "efficiency", minimum=0.01, maximum=1.0),
        gemm_tile=get_int(eff, "gemm_tile", source, "efficiency", default=128, minimum=1, maximum=1024),
        gemm_k_fill=get_int(eff, "gemm_k_fill", source, "efficiency", default=0, minimum=0, maximum=100_000),
        host_launch_overhead_s=(_unit(parse_time, eff, "host_launch_overhead", source, "efficiency.")
                                if eff.get("host_launch_overhead") is not None else 0.0),
    )
    uncertain = data.get("uncertain") or []
    if not isinstance(uncertain, list) or not all(isinstance(u, str) for u in uncertain):
        raise SpecError(source, "uncertain", "expected a list of field names")
    prof = GPUProfile(
        name=get_str(data, "name", source),
        memory_bytes=_unit(parse_size, data, "memory", source),
        memory_bandwidth_bytes_per_s=_unit(parse_bandwidth, data, "memory_bandwidth", source),
        peak_flops_per_s=tuple(sorted(peak_flops.items())),
        scale_up_bandwidth_bytes_per_s=_unit(parse_bandwidth, data, "scale_up_bandwidth", source),
        scale_up_latency_s=_unit(parse_time, data, "scale_up_latency", source) if "scale_up_latency" in data else 3e-6,
        pcie_bandwidth_bytes_per_s=_unit(parse_bandwidth, data, "pcie_bandwidth", source),
        cuda_context_bytes=_unit(parse_size, data, "cuda_context", source),
        nccl_bytes_per_communicator=_unit(parse_size, data, "nccl_memory_per_communicator", source),
        fragmentation_fraction=get_float(data, "fragmentation_fraction", source, maximum=0.5),
        compute_capability=get_float(data, "compute_capability", source, minimum=1.0, maximum=20.0),
        sm_count=get_int(data, "sm_count", source, default=None, minimum=1, maximum=100_000),
        efficiency=efficiency,
        source=get_str(data, "source", source, default="") or "",
        uncertain=tuple(uncertain) + tuple(uncertain_extra),
    )
    if prof.cuda_context_bytes + prof.nccl_bytes_per_communicator >= prof.memory_bytes:
        raise SpecError(source, "cuda_context", "the CUDA context and one NCCL communicator leave no memory")
    return prof


def load_profile(path: str | Path) -> GPUProfile:
    return profile_from_dict(load_file(path), str(path))


def load_bundled_profile(name: str) -> GPUProfile:
    """The GPU profile `name` (a cluster YAML names its GPUs so), the user's before the bundled."""
    path = find("profile", name)
    if path is None:
        names = bundled_profile_names()
        raise SpecError(printable(name), None, f"no GPU profile of that name{suggest(name, names)}; "
                        f"expected one of: {', '.join(names)}")
    return _load_profile_cached(path)


@lru_cache(maxsize=None)
def _load_profile_cached(path: Path) -> GPUProfile:
    """Cached by path, not name: a user's profile of a bundled name is a different file."""
    return load_profile(path)
