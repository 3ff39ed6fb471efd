"""Per-GPU memory on every pipeline stage, from the placement table.

bytes(state, group) = full_bytes(state, group on this stage) x placement.shard_factor(state, group)

Bytes per parameter come from the launch's dtypes (bytes_per_param): 16-bit weights 2, fp32
main gradients 4 (Megatron's default with --bf16: gradients accumulate and reduce in fp32 unless
--grad-reduce-in-bf16; Megatron-FSDP, ZeRO-2/3 here, keeps them in the model's dtype: 2), fp32 master weights + Adam moments 12, i.e. 18 per parameter, 6 + 12/d
with the distributed optimizer over d = DP x CP ranks (docs/user-guide/features/
dist_optimizer.md). DeepSpeed's convention is 2 + 2 + 12 (Rajbhandari et al. 2019, sec. 3.1).

Beyond the tensors the model allocates, a GPU loses memory to things no formula of the model
sees: the CUDA context and its loaded kernels, NCCL's buffers for each communicator, cuBLAS and
Transformer Engine workspaces, and the caching allocator's fragmentation. Each is a profile field
or a named constant below with its source; `StageMemory.capacity` is what is left of the device's
reported memory for the model's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..placement import Placement
from ..specs.hardware import GPUProfile
from ..specs.model import ModelSpec
from ..strategy import Strategy
from . import activations as act

MIB = 2**20
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
# Megatron DDP bucket size: max(40M, 1M x DP) parameters (megatron/core/distributed/
# distributed_data_parallel.py); a bucket in flight is kept in fp32 for sharded gradients.
DDP_BUCKET_MIN_PARAMS = 40_000_000
DDP_BUCKET_PARAMS_PER_DP_RANK = 1_000_000
STATES_AT_REST = ("parameters", "gradients", "optimizer")   # the states counted per parameter
# ZeRO-3 / FSDP keep the current and the prefetched layer gathered (2 layers of full weights).
ZERO3_GATHERED_LAYERS = 2
# Megatron-FSDP (what ZeRO stage 2 / 3 launches: --use-megatron-fsdp --data-parallel-sharding-strategy
# optim_grads / optim_grads_params) accumulates its main gradients and reduce-scatters them in
# --megatron-fsdp-main-grads-dtype / --megatron-fsdp-grad-comm-dtype, both 'auto' by default, i.e. the
# model's compute dtype, bf16 for fp8 / fp4 parameters: 2 bytes. NVIDIA/Megatron-LM d98e8a64:
# megatron/training/arguments.py:3691-3698 (defaults 'auto' -> None, :1092-1093),
# megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:139-143 (MixedPrecisionPolicy from those two
# only), fsdp/src/megatron_fsdp/mixed_precision.py:389-406 (None: the model's gradient dtype; comm
# None: the main-grads dtype), param_and_grad_buffer.py:2313-2320 (_resolve_group_grad_dtype).
# --grad-reduce-in-bf16 / --accumulate-allreduce-grads-in-fp32 / --main-grads-dtype no longer reach
# it: the adapter's fp32 override from grad_reduce_in_fp32 went in adfe9e11d9 (2026-07-02; before,
# e.g. the custom FSDP of 1e057005, 2025-05, reduced in fp32 under --bf16). An explicit
# --megatron-fsdp-*-dtype is reported as not priced (flags_megatron.json: unmodelled).
MEGATRON_FSDP_GRAD_BYTES = 2
# cuBLAS workspaces: PyTorch allocates 32 MiB per (handle, stream) on sm90+ (aten/src/ATen/cuda/
# CublasHandlePool.cpp), Transformer Engine 32 MiB + 1 KiB per compute stream on sm90+ (4 MiB
# before), x3 streams for --tp-comm-overlap userbuffers and x4 for grouped GEMMs
# (transformer_engine/pytorch/cpp_extensions/gemm.py).
CUBLAS_WORKSPACE_BYTES = {True: 32 * MIB, False: 4 * MIB}   # keyed by compute capability >= 9
TE_GEMM_STREAMS_TP_OVERLAP = 3
TE_GEMM_STREAMS_GROUPED = 4
# TE userbuffers for --tp-comm-overlap: one registered [s*b/cp, h] buffer per GEMM site, about 10
# sites (qkv/proj/fc1/fc2 x fprop/dgrad/wgrad; megatron/training/initialize.py, TE base.py).
TP_OVERLAP_BUFFER_SITES = 10
# DeepEP (flex dispatcher) keeps persistent NVLink and RDMA buffers sized from its hints
# (deepseek-ai/DeepEP csrc/config.hpp): hundreds of MiB; a planner estimate, to be measured.
DEEPEP_BUFFER_BYTES = 1024 * MIB


# The memory model's stated uncertainty, from its errors against measured allocator peaks
# (python validation/memory.py: Megatron-LM's CI runs, last-stage max allocated): dense models
# within 3% (the 7B-class runs within 2.2%), MoE models under by up to 12.8% (dropless routing is
# not balanced and its peak drifts upward during training, +3.8% over 36 steps in one CI run;
# the model assumes balanced routing). A plan whose peak plus this margin exceeds the device is
# TIGHT: it may still run out of memory. Small models also err by a near-constant amount (the
# small buffers the model does not list: RNG states, Megatron's global buffers, fp8 metadata):
# up to 0.4 GiB on the CI's h=512 models, hence the absolute term.
MEMORY_UNCERTAINTY = {"dense": 0.03, "moe": 0.13}
MEMORY_UNCERTAINTY_BYTES = 256 * MIB
# PyTorch's default caching allocator splits cached segments and cannot merge them again, so the
# memory it reserves beyond what is allocated depends on the order of allocations, not only on
# their sizes: GMLake (Guo et al., ASPLOS 2024) measured its fragmentation 15% higher on average
# (up to 33%) than an allocator built on CUDA's virtual memory mapping (the mechanism of
# expandable_segments, pytorch PR 96995) over eight LLM trainings on A100-80GB. As a share of the
# allocated bytes: 0.15 / (1 - 0.15). Without expandable segments the verdict's margin widens by
# this much (the expected fragmentation stays the profile's fragmentation_fraction): Megatron-
# Bridge's Llama-3-70B SFT ran out of memory in 30-60% of runs with the default allocator and
# passed with expandable segments, the same launch (validation/memory.py).
GMLAKE_FRAGMENTATION_REDUCTION = 0.15
DEFAULT_ALLOCATOR_FRAGMENTATION_SPREAD = GMLAKE_FRAGMENTATION_REDUCTION / (1 - GMLAKE_FRAGMENTATION_REDUCTION)


def memory_uncertainty(model: ModelSpec) -> float:
    return MEMORY_UNCERTAINTY["moe" if model.is_moe else "dense"]


def bytes_per_param(s: Strategy) -> dict:
    """GPU bytes per parameter of each training state before sharding, from the launch's dtypes
    (megatron/core/optimizer/optimizer_config.py, param_and_grad_buffer.py; TE FusedAdam):
    - parameters: 2 (bf16/fp16), 1 with fp8 primary weights (--fp8-param-gather), with NVFP4
      primary weights (--fp4-param-gather) the packed row-wise NVFP4 data and its block scales
      in the parameter buffer, act.NVFP4_BYTES_PER_ELEMENT (megatron/core/fp4_utils.py
      get_nvfp4_rowwise_packed_shape: last dim // 2);
    - gradients: the grad buffer, fp32 (4) unless --grad-reduce-in-bf16 or main_grads_dtype bf16;
      under Megatron-FSDP (ZeRO-2/3) the model's dtype, MEGATRON_FSDP_GRAD_BYTES (2), both its
      sharded buffer and what it reduce-scatters;
    - optimizer: master weights + exp_avg + exp_avg_sq. Default fp32 (4 + 4 + 4). With
      --use-precision-aware-optimizer each takes its dtype, and when TE's FusedAdam holds the
      master weights of bf16 parameters (main_params_dtype not fp32, or no fp8 / delayed fp8, or
      CPU offload) it stores only the fp32 master's low 16 bits beside the bf16 weight (2 bytes,
      store_param_remainders)."""
    if s.optimizer_convention == "deepspeed":
        return {"parameters": 2, "gradients": 2, "optimizer": 12}
    params = 1 if (s.precision == "fp8" and s.fp8_param_gather) else 2
    if s.precision == "nvfp4" and s.fp4_param_gather:
        params = act.NVFP4_BYTES_PER_ELEMENT
    grads = 2 if (s.grad_reduce_in_bf16 or s.main_grads_dtype == "bf16") else 4
    if s.zero_stage >= 2:
        grads = MEGATRON_FSDP_GRAD_BYTES
    if s.use_precision_aware_optimizer:
        master = DTYPE_BYTES[s.main_params_dtype]
        te_holds_master = (s.main_params_dtype != "fp32" or s.precision != "fp8" or s.fp8_recipe == "delayed"
                           or s.offload_optimizer)
        if te_holds_master and s.precision != "fp16" and params == 2:
            master = 2
        opt = master + DTYPE_BYTES[s.exp_avg_dtype] + DTYPE_BYTES[s.exp_avg_sq_dtype]
    else:
        opt = 12
    return {"parameters": params, "gradients": grads, "optimizer": opt}


def optimizer_gradient_bytes(s: Strategy) -> int:
    """Bytes per parameter of the gradient shard the optimizer step reads. Megatron-FSDP without
    --use-precision-aware-optimizer hands the optimizer its gradient cast to the main weights'
    dtype (fp32): `optimizer_grad.to(param.dtype)` in update_main_grads (Megatron-LM d98e8a64,
    megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py:3377-3381; the
    precision-aware path installs the buffer's own dtype as decoupled_grad, :3404-3407, with
    megatron_fsdp_use_decoupled_grad = --use-precision-aware-optimizer, training.py:2649-2650).
    The cast copy is freed at zero_grad (:3206-3214), so it is not part of the memory at rest;
    the cast's own pass over the shard (2 bytes read, 4 written) is not priced. Otherwise the
    grad buffer's dtype."""
    if s.zero_stage >= 2 and s.optimizer_convention != "deepspeed" and not s.use_precision_aware_optimizer:
        return DTYPE_BYTES["fp32"]
    return bytes_per_param(s)["gradients"]


def gradient_comm_bytes(s: Strategy) -> int:
    """Bytes per parameter the data-parallel gradient reduction moves: the grad buffer's dtype."""
    return bytes_per_param(s)["gradients"]


def param_gather_bytes(s: Strategy) -> int:
    """Bytes per parameter the distributed optimizer's parameter all-gather moves: the model
    weights' dtype (fp8 primary weights with --fp8-param-gather, NVFP4 with --fp4-param-gather)."""
    return bytes_per_param(s)["parameters"]


def fp8_weight_cache_bytes(s: Strategy, gpu: GPUProfile) -> float:
    """Bytes per TE-linear parameter of the quantized weight copies Transformer Engine caches
    across micro-batches under fp8 (transformer_engine/pytorch/module/linear.py, weight workspace;
    float8_tensor_storage.py): on Hopper per-tensor fp8 a row-wise copy and its transpose (2),
    MXFP8 both with scales (2 x (1 + 1/32)), Blackwell per-tensor one copy (1). With fp8 primary
    weights (--fp8-param-gather) the weight is already fp8 and only Hopper's transpose remains.
    NVFP4 (TE NVFP4BlockScaling, nvfp4_tensor.py): a row-wise (fprop) and a column-wise
    (dgrad) NVFP4 copy, 2 x act.NVFP4_BYTES_PER_ELEMENT (the 16x16 weight blocks make one the
    other's transpose, but TE stores both); with --fp4-param-gather the parameter is the
    row-wise copy and only the column-wise one is cached."""
    if s.precision == "nvfp4":
        if not gpu.supports("fp4"):
            return 0.0
        return act.NVFP4_BYTES_PER_ELEMENT * (1 if s.fp4_param_gather else 2)
    if s.precision != "fp8" or not gpu.supports("fp8"):
        return 0.0
    hopper = gpu.compute_capability < 10.0
    if s.fp8_param_gather:
        return 1.0 if hopper else 0.0
    if s.fp8_recipe == "mxfp8":
        return 2.0 * (1.0 + act.FP8_SCALE_BYTES_PER_ELEMENT["mxfp8"])
    return 2.0 if hopper else 1.0


@dataclass(frozen=True)
class StageParams:
    """Parameters of one pipeline stage by placement group, before any sharding: the placement
    table's shard factors (tp, ep, etp, data axes) turn them into per-rank counts."""
    dense: float      # split over TP (attention, dense MLP, shared experts, embedding, output)
    norms: float      # replicated over TP (norms, router, learned position embedding)
    experts: float    # split over EP x expert-TP

    @property
    def total(self) -> float:
        return self.dense + self.norms + self.experts


def stage_params(model: ModelSpec, s: Strategy, stage: int) -> StageParams:
    """Parameter counts of pipeline rank `stage` (all of its virtual chunks), unsharded."""
    start, end = s.stage_layer_ranges(model)[stage]
    return layer_range_params(model, s, start, end, stage == 0, stage == s.pp - 1)


def one_layer_params(model: ModelSpec, moe: bool) -> StageParams:
    """Parameters of one decoder layer of a kind (dense or MoE), unsharded."""
    if moe:
        return StageParams(dense=model.attention_params + model.shared_expert_params,
                           norms=model.layer_norm_params + model.router_params,
                           experts=model.num_experts * model.expert_params)
    return StageParams(dense=model.attention_params + model.dense_mlp_params, norms=model.layer_norm_params,
                       experts=0.0)


def mtp_params(model: ModelSpec) -> StageParams:
    """Multi-token-prediction modules (--mtp-num-layers, on the last stage): each is a decoder
    layer of the model's last layer kind, two input norms and a 2h -> h projection; the output
    layer is shared with the main model (Megatron multi_token_prediction.py; DeepSeek-V3 sec. 2.2)."""
    if not model.mtp_num_layers:
        return StageParams(0.0, 0.0, 0.0)
    layer = one_layer_params(model, model.is_moe_layer(model.num_layers - 1))
    k, h = model.mtp_num_layers, model.hidden_size
    return StageParams(dense=k * (layer.dense + 2 * h * h), norms=k * (layer.norms + 3 * model.norm_params),
                       experts=k * layer.experts)


def layer_range_params(model: ModelSpec, s: Strategy, start: int, end: int, first: bool, last: bool) -> StageParams:
    """Parameters of layers [start, end), plus the embedding if `first` and the final norm,
    output layer and MTP modules if `last`. With first = last = True over all layers: the sum
    over all stages."""
    n_moe = model.num_moe_layers_in(start, end)
    return layer_count_params(model, s, end - start - n_moe, n_moe, first, last)


def layer_count_params(model: ModelSpec, s: Strategy, n_dense: int, n_moe: int, first: bool, last: bool) -> StageParams:
    """Parameters of n_dense dense and n_moe MoE layers (+ the ends of `first` and `last`, as in
    layer_range_params): a stage's parameters depend on its layers through these counts only."""
    d = one_layer_params(model, False)
    e = one_layer_params(model, True) if n_moe else StageParams(0.0, 0.0, 0.0)
    dense = n_dense * d.dense + n_moe * e.dense
    norms = n_dense * d.norms + n_moe * e.norms
    experts = n_moe * e.experts
    emb = model.embedding_params(s.tp)   # padded vocabulary x h, split over TP (vocab-parallel)
    if first:
        dense += emb
        norms += model.position_embedding_params   # learned positions are replicated over TP
    if last:
        norms += model.norm_params
        if model.untie_embeddings_and_output_weights or s.pp > 1:
            dense += emb   # untied output layer, or the tied copy Megatron keeps on the last stage
        mtp = mtp_params(model)
        dense, norms, experts = dense + mtp.dense, norms + mtp.norms, experts + mtp.experts
    return StageParams(dense=dense, norms=norms, experts=experts)


def layer_linear_params(model: ModelSpec, placement: Placement, moe: bool) -> float:
    """Parameters of one layer's Transformer Engine linears (attention, MLP or experts and shared
    expert; not norms or the router) that one rank computes with."""
    tp_f = placement.model_shard_factor("dense")
    if not moe:
        return (model.attention_params + model.dense_mlp_params) * tp_f
    return ((model.attention_params + model.shared_expert_params) * tp_f
            + model.num_experts * model.expert_params * placement.model_shard_factor("experts"))


def linear_params_per_rank(model: ModelSpec, placement: Placement, start: int, end: int, last: bool) -> float:
    """TE-linear parameters one rank computes with in layers [start, end) (+ MTP if last)."""
    n_moe = model.num_moe_layers_in(start, end)
    out = (end - start - n_moe) * layer_linear_params(model, placement, False)
    if n_moe:
        out += n_moe * layer_linear_params(model, placement, True)
    if last and model.mtp_num_layers:
        out += model.mtp_num_layers * layer_linear_params(model, placement, model.is_moe_layer(model.num_layers - 1))
    return out


def warmup_microbatches(s: Strategy, stage: int) -> int:
    """Forward passes pipeline rank `stage` runs before its first backward (Megatron
    get_pp_rank_microbatches, megatron/core/pipeline_parallel/schedules.py): p - r - 1 for 1F1B,
    2 (p - r - 1) + (v - 1) N for interleaved 1F1B with N = microbatch_group_size_per_vp_stage
    (default p), +1 with --overlap-moe-expert-parallel-comm; at most v m."""
    p, m, v = s.pp, s.num_microbatches, s.vpp
    if v > 1:
        w = 2 * (p - stage - 1) + (v - 1) * s.microbatch_group_size
    else:
        w = p - stage - 1
    if s.overlap_moe_expert_parallel_comm:
        w += 1
    return min(w, v * m)


def in_flight_microbatches(s: Strategy, stage: int) -> float:
    """Micro-batches of activations a pipeline rank holds at its peak, in units of the rank's
    whole layer set (all virtual chunks): a forward runs before each steady-state backward, so
    min(warm-up + 1, v m) virtual micro-batches, a chunk being 1/v of the rank's layers. With
    one stage: 1 micro-batch, 2 when --overlap-moe-expert-parallel-comm co-schedules the forward
    of the next with the backward of the current (combined_1f1b.py)."""
    if s.pp == 1:
        return 2.0 if (s.overlap_moe_expert_parallel_comm and s.num_microbatches > 1) else 1.0
    return min(warmup_microbatches(s, stage) + 1, s.vpp * s.num_microbatches) / s.vpp


@lru_cache(maxsize=4096)
def peak_live_chunks(p: int, v: int, m: int, stage: int, warmup: int, chunk_bytes: tuple) -> float:
    """Peak bytes of stored activations on one rank under interleaved 1F1B when its chunks differ
    in size: Megatron's order (get_schedule_table: groups of p micro-batches, chunks 0..v-1 in
    each group; backward in the same order with the chunk reversed), `warmup` forwards, then one
    forward before each backward. The peak by bytes can fall elsewhere than the peak by count."""
    group = p
    fwd = []
    for g0 in range(0, m, group):
        size = min(group, m - g0)
        for c in range(v):
            fwd.extend([c] * size)
    bwd = [v - 1 - c for c in fwd]
    live = [0] * v
    f = 0
    for _ in range(warmup):
        live[fwd[f]] += 1
        f += 1
    peak = 0.0
    for b in range(len(fwd)):
        if f < len(fwd):
            live[fwd[f]] += 1
            f += 1
        peak = max(peak, sum(n * x for n, x in zip(live, chunk_bytes)))
        live[bwd[b]] -= 1
    return peak


@dataclass(frozen=True)
class StageMemory:
    stage: int
    layers: int
    node_group: str
    parameters: float     # bytes (incl. fp8 weight copies)
    gradients: float
    optimizer: float
    activations: float
    buffers: float        # transient: rebuilt layer, output layer and loss, ZeRO gathers, buckets
    capacity: float       # bytes left for the model's tensors on this stage's GPU
    host_bytes: float     # bytes offloaded to host memory per GPU
    in_flight: float
    device_bytes: float = 0.0      # the device's memory as it reports it (nvidia-smi)
    overhead_bytes: float = 0.0    # CUDA context + NCCL buffers + cuBLAS/TE workspaces
    fragmentation_fraction: float = 0.0   # caching allocator: reserved beyond allocated / allocated
    uncertainty: float = 0.0       # the model's stated relative error on `total` (MEMORY_UNCERTAINTY)
    allocator_spread: float = 0.0  # default caching allocator: its fragmentation's spread, a share of `total`

    @property
    def total(self) -> float:
        """Bytes of tensors allocated at the peak (what torch.cuda.max_memory_allocated reports)."""
        return self.parameters + self.gradients + self.optimizer + self.activations + self.buffers

    @property
    def device_total(self) -> float:
        """What the device would show in use: the tensors, the allocator's fragmentation on top,
        and the fixed overheads (about nvidia-smi's figure)."""
        return self.total * (1.0 + self.fragmentation_fraction) + self.overhead_bytes

    @property
    def headroom(self) -> float:
        return self.capacity - self.total

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def margin_bytes(self) -> float:
        """How far the model may be off on this stage, bytes: its stated uncertainty, plus the
        default caching allocator's fragmentation spread when expandable segments are off."""
        return self.total * (self.uncertainty + self.allocator_spread) + MEMORY_UNCERTAINTY_BYTES

    @property
    def safe_capacity(self) -> float:
        """The most bytes `total` may take and still fit with margin_bytes to spare: solves
        total + margin_bytes(total) = capacity (margin_bytes is linear in total). The search
        splits layers against it unless TIGHT plans are allowed."""
        return room_with_margin_bytes(self.capacity, self.uncertainty, self.allocator_spread)

    @property
    def verdict(self) -> str:
        """fits (with the model's margin), tight (fits, but not by the margin), does not fit."""
        if self.total + self.margin_bytes <= self.capacity:
            return "fits"
        return "tight" if self.fits else "does not fit"


def fully_recomputed_layers(s: Strategy, start: int, end: int):
    """Layer indices of [start, end) that are fully recomputed: all of them under full
    recompute, or with Megatron's 'block' method (--recompute-num-layers k) the first k layers
    of each virtual chunk; the others keep everything (or all but core attention)."""
    if s.recompute != "full":
        return set()
    if s.recompute_num_layers is None:
        return range(start, end)
    per_chunk = (end - start) // s.vpp
    return {start + c * per_chunk + j for c in range(s.vpp) for j in range(min(s.recompute_num_layers, per_chunk))}


def _layer_mode(s: Strategy, full_set, i: int) -> str:
    if i in full_set:
        return "full"
    return "selective" if s.recompute == "selective" else "none"


def cpu_offloaded_activation_bytes(model: ModelSpec, s: Strategy, start: int, end: int, full_set=()) -> float:
    """Bytes of kept activations per micro-batch that --cpu-offloading-num-layers N takes off the
    GPU at the stage's peak: all of the first N layers' (of [start, end)).

    Megatron (NVIDIA/Megatron-LM d98e8a64): N > 0 turns --cpu-offloading on
    (megatron/training/arguments.py:1950-1951) with activations offloaded, weights not, no double
    buffering (megatron/core/model_parallel_config.py:471-477); the block wraps each layer in TE's
    get_cpu_offload_context(enabled, N, num_layers, ...) and commits after it
    (megatron/core/transformer/transformer_block.py:304-313, 739-742); N < num_layers, no pipeline
    parallelism, no recompute (transformer_config.py:1884-1896).
    Transformer Engine (NVIDIA/TransformerEngine d0067d0, transformer_engine/pytorch/cpu_offload.py
    DefaultOffloadSynchronizer._init_offload_synchronization_dicts, :602-626): layers 0..N-1 are
    offloaded; layer i's GPU copies are released before the forward of layer L - N + i and
    reloaded before the backward of layer L - 1 - N + i, so at most L - N layers' activations
    are on the GPU at once (its docstring: peak (num_layers - num_offloaded_layers) x T). Every
    saved tensor of an offloaded layer goes, except those under 256 Ki elements (:454-470: a
    norm's per-token statistics when s*b < 256 Ki, a few KiB per layer; neglected).
    TE before 2.10 (cpu_offload_v1.py, NVTE_CPU_OFFLOAD_V1=1 at d0067d0; what Megatron-Bridge
    25.11 ran, TE release_v2.9) frees the last offloaded layer only at the last layer's commit
    and reloads it before the last layer's backward (layer_window_map, cpu_offload_v1.py:358):
    L - N + 1 layers at those two moments, L - N while the output layer and loss run."""
    n = min(s.cpu_offloading_num_layers, end - start)
    return sum(act.layer_bytes(model, s, model.is_moe_layer(i), _layer_mode(s, full_set, i))
               for i in range(start, start + n))


def stage_activation_bytes(model: ModelSpec, s: Strategy, stage: int) -> tuple[float, float]:
    """(kept activations, transient working set) in bytes for pipeline rank `stage`."""
    start, end = s.stage_layer_ranges(model)[stage]
    full_set = fully_recomputed_layers(s, start, end)
    other = "selective" if s.recompute == "selective" else "none"
    worst_layer = 0.0
    if full_set:
        worst_layer = max(act.layer_bytes(model, s, moe, "none") for moe in model.layer_kinds)
    offloaded = min(s.cpu_offloading_num_layers, end - start)
    chunks = s.stage_chunk_layers(model, stage)
    if chunks is not None and len(set(chunks)) > 1:
        # uneven virtual chunks: bytes per chunk, the schedule's live counts at its byte peak
        per_chunk, k = [], start
        for c, n in enumerate(chunks):
            b = sum(act.layer_bytes(model, s, model.is_moe_layer(i), _layer_mode(s, full_set, i))
                    for i in range(k, k + n))
            if stage == 0 and c == 0:
                b += act.embedding_bytes(model, s)
            per_chunk.append(b)
            k += n
        kept = peak_live_chunks(s.pp, s.vpp, s.num_microbatches, stage, warmup_microbatches(s, stage),
                                 tuple(per_chunk))
    else:
        # layers of one kind and mode are identical: count them
        n_moe = model.num_moe_layers_in(start, end)
        n_moe_full = (n_moe if isinstance(full_set, range)
                      else sum(1 for i in full_set if model.is_moe_layer(i)))
        counts = {(False, "full"): len(full_set) - n_moe_full, (True, "full"): n_moe_full,
                  (False, other): (end - start - n_moe) - (len(full_set) - n_moe_full),
                  (True, other): n_moe - n_moe_full}
        per_mb = sum(n * act.layer_bytes(model, s, moe, mode) for (moe, mode), n in counts.items() if n > 0)
        if stage == 0:
            per_mb += act.embedding_bytes(model, s)
        kept = per_mb * in_flight_microbatches(s, stage)
    if offloaded:
        kept -= cpu_offloaded_activation_bytes(model, s, start, end, full_set) * in_flight_microbatches(s, stage)
    transient = worst_layer  # one layer rebuilt at a time during backward
    if stage == s.pp - 1:
        transient += act.output_layer_bytes(model, s) * (1 + model.mtp_num_layers)
        if model.mtp_num_layers:
            # MTP layers' kept activations for the one micro-batch in flight at the last stage
            moe = model.is_moe_layer(model.num_layers - 1)
            kept += model.mtp_num_layers * (act.layer_bytes(model, s, moe, other) + act.mtp_input_bytes(model, s))
    return kept, transient


def layer_memory_bytes(model: ModelSpec, s: Strategy, placement: Placement, stage: int, moe: bool,
                       gpu: GPUProfile | None = None) -> float:
    """Bytes one more decoder layer adds to pipeline rank `stage`: its parameters, gradients
    and optimizer state after sharding (and fp8 weight copies on `gpu`), plus its kept
    activations for the rank's in-flight micro-batches. Exact when every layer is recomputed
    alike and chunks are even; with recompute_num_layers it counts every layer as fully
    recomputed (a lower bound)."""
    return (layer_state_bytes(model, s, placement, moe, gpu)
            + layer_kept_activation_bytes(model, s, moe) * in_flight_microbatches(s, stage))


def layer_state_bytes(model: ModelSpec, s: Strategy, placement: Placement, moe: bool,
                      gpu: GPUProfile | None = None) -> float:
    """Bytes of one decoder layer's parameters, gradients and optimizer state after sharding,
    plus its fp8 weight copies on `gpu`: the part of layer_memory_bytes that is the same on
    every pipeline rank."""
    bpp = bytes_per_param(s)
    lp = one_layer_params(model, moe)
    states = sum(placement.state_params(state, lp) * bpp[state] for state in STATES_AT_REST)
    if gpu is not None:
        states += fp8_weight_cache_bytes(s, gpu) * layer_linear_params(model, placement, moe)
    return states


def layer_kept_activation_bytes(model: ModelSpec, s: Strategy, moe: bool) -> float:
    """Bytes one decoder layer keeps for backward per micro-batch in flight (its recompute mode)."""
    mode = s.recompute if s.recompute in ("full", "selective") else "none"
    return act.layer_bytes(model, s, moe, mode)


def nccl_communicators(model: ModelSpec, s: Strategy) -> int:
    """NCCL communicators a rank of this strategy uses (each keeps its own buffers): TP, CP,
    data-parallel with CP, the pipeline's p2p group, the tied-embedding group, and for MoE the
    expert all-to-all, expert data-parallel and expert-TP groups (megatron/core/parallel_state.py
    builds these; NCCL allocates a communicator's buffers on its first collective)."""
    n = sum((s.tp > 1, s.cp > 1, s.dp * s.cp > 1, s.pp > 1,
             s.pp > 1 and not model.untie_embeddings_and_output_weights))
    if model.is_moe:
        n += sum((s.ep > 1, s.expert_dp > 1 and s.expert_dp != s.dp * s.cp, s.expert_tp > 1 and s.expert_tp != s.tp))
    return n


def gemm_workspace_bytes(model: ModelSpec, s: Strategy, gpu: GPUProfile) -> float:
    """cuBLAS / Transformer Engine GEMM workspaces, allocated through PyTorch's caching allocator
    (so inside torch.cuda.max_memory_allocated): PyTorch's and TE's compute streams, TE's
    userbuffer streams with --tp-comm-overlap, its grouped-GEMM streams for MoE experts."""
    ws = CUBLAS_WORKSPACE_BYTES[gpu.compute_capability >= 9.0]
    streams = 2
    if s.tp_comm_overlap:
        streams += TE_GEMM_STREAMS_TP_OVERLAP
    if model.is_moe and s.moe_grouped_gemm:
        streams += TE_GEMM_STREAMS_GROUPED
    return streams * ws


def fixed_overhead_bytes(model: ModelSpec, s: Strategy, gpu: GPUProfile) -> float:
    """Device memory outside PyTorch's allocator: the CUDA context with its loaded kernels
    (profile `cuda_context`), NCCL's buffers per communicator (profile
    `nccl_memory_per_communicator`), TE's userbuffers for --tp-comm-overlap (registered outside
    the allocator) and DeepEP's buffers for the flex dispatcher."""
    out = gpu.cuda_context_bytes + nccl_communicators(model, s) * gpu.nccl_bytes_per_communicator
    if s.tp_comm_overlap and s.sp:
        tokens = s.seq_length / s.cp * s.micro_batch_size
        out += TP_OVERLAP_BUFFER_SITES * tokens * model.hidden_size * act.BYTES_16BIT
    if model.is_moe and s.moe_token_dispatcher_type == "flex":
        out += DEEPEP_BUFFER_BYTES
    return out


def allocatable_bytes(model: ModelSpec, s: Strategy, gpu: GPUProfile) -> float:
    """Bytes the model's tensors may take on `gpu`: the device's reported memory less the fixed
    overheads, less the caching allocator's fragmentation (reserved beyond allocated, a
    fraction of what is allocated)."""
    return (gpu.memory_bytes - fixed_overhead_bytes(model, s, gpu)) / (1.0 + gpu.fragmentation_fraction)


def room_with_margin_bytes(capacity: float, uncertainty: float, allocator_spread: float) -> float:
    """The most bytes a stage's tensors may take on a device with `capacity` usable bytes and
    still leave the verdict's margin (StageMemory.margin_bytes, linear in those bytes): solves
    total x (1 + uncertainty + allocator_spread) + MEMORY_UNCERTAINTY_BYTES = capacity."""
    return (capacity - MEMORY_UNCERTAINTY_BYTES) / (1.0 + uncertainty + allocator_spread)


def usable_bytes(model: ModelSpec, s: Strategy, gpu: GPUProfile, with_margin: bool = False) -> float:
    """allocatable_bytes, or with `with_margin` the part of it a plan may use and still fit with
    the memory model's margin (a plan above it is TIGHT): what the search screens against when
    TIGHT plans are not allowed."""
    cap = allocatable_bytes(model, s, gpu)
    if not with_margin:
        return cap
    spread = 0.0 if s.expandable_segments else DEFAULT_ALLOCATOR_FRAGMENTATION_SPREAD
    return room_with_margin_bytes(cap, memory_uncertainty(model), spread)


def stage_fixed_state_bytes(model: ModelSpec, s: Strategy, placement: Placement, first: bool, last: bool) -> float:
    """The states part of stage_fixed_bytes_parts: the embedding / final norm / output layer
    (and MTP) parameters, gradients and optimizer state a first / last / middle rank holds,
    and the ZeRO-2/3 buffers as small as any split makes them. It depends on the degrees, the
    ZeRO stage and pp > 1, not on the micro-batch or recompute (the search shares it)."""
    bpp = bytes_per_param(s)
    fp = layer_range_params(model, s, 0, 0, first, last)
    fixed = sum(placement.state_params(st, fp) * bpp[st] for st in STATES_AT_REST)
    if s.zero_stage >= 2:
        bucket = max(DDP_BUCKET_MIN_PARAMS, DDP_BUCKET_PARAMS_PER_DP_RANK * s.dp * s.cp)
        fixed += min(bucket, placement.rank_params(fp)) * bpp["gradients"]
    if s.zero_stage >= 3:
        fixed += ZERO3_GATHERED_LAYERS * bpp["parameters"] * min(
            placement.rank_params(one_layer_params(model, moe)) for moe in model.layer_kinds)
    return fixed


def stage_fixed_activation_parts(model: ModelSpec, s: Strategy, first: bool, last: bool) -> tuple[float, float]:
    """The activations part of stage_fixed_bytes_parts, (bytes, bytes per micro-batch in
    flight): the output layer's and loss's on the last rank, the one layer rebuilt at a time
    under full recompute (the lighter layer kind), the embedding's per micro-batch on the
    first. It depends on the micro-batch, sequence, TP / CP / EP split and recompute, not on
    the data-parallel size or the ZeRO stage."""
    fixed = 0.0
    per_in_flight = act.embedding_bytes(model, s) if first else 0.0
    if last:
        fixed += act.output_layer_bytes(model, s) * (1 + model.mtp_num_layers)
    if s.recompute == "full":
        fixed += min(act.layer_bytes(model, s, moe, "none") for moe in model.layer_kinds)
    return fixed, per_in_flight


def stage_fixed_bytes_parts(model: ModelSpec, s: Strategy, placement: Placement, first: bool,
                            last: bool) -> tuple[float, float]:
    """(bytes, bytes per micro-batch in flight) of a first / last / middle pipeline rank that do
    not scale with its layer count, at least: the embedding / final norm / output layer (and
    MTP) states and activations it holds, the one layer rebuilt at a time under full recompute
    (the lighter layer kind), and the ZeRO-2/3 buffers as small as any split makes them. For
    any split with even chunks, rank i's stage_memory(...).total >= bytes + per micro-batch x
    in_flight_microbatches(s, i) + sum over its layers of layer_memory_bytes(...); the search
    prunes with it. They depend on the pipeline only through pp > 1 (the search caches them
    across pipeline depths)."""
    fixed, per_in_flight = stage_fixed_activation_parts(model, s, first, last)
    return stage_fixed_state_bytes(model, s, placement, first, last) + fixed, per_in_flight


def stage_memory(model: ModelSpec, s: Strategy, placement: Placement, stage: int, gpu: GPUProfile,
                 node_group: str = "") -> StageMemory:
    s = act.attention_on_gpu(s, gpu)
    bpp = bytes_per_param(s)
    sp = stage_params(model, s, stage)
    start, end = s.stage_layer_ranges(model)[stage]
    states = {state: placement.state_params(state, sp) * bpp[state] for state in STATES_AT_REST}
    states["parameters"] += fp8_weight_cache_bytes(s, gpu) * linear_params_per_rank(
        model, placement, start, end, stage == s.pp - 1)
    host = 0.0
    for state in STATES_AT_REST:
        for group in ("dense", "norms", "experts"):
            host += getattr(sp, group) * bpp[state] * placement.host_factor(state, group)
    kept, transient = stage_activation_bytes(model, s, stage)
    buffers = transient + gemm_workspace_bytes(model, s, gpu)
    if s.zero_stage >= 2:
        n_data = s.dp * s.cp
        bucket = max(DDP_BUCKET_MIN_PARAMS, DDP_BUCKET_PARAMS_PER_DP_RANK * n_data)
        buffers += min(bucket, placement.rank_params(sp)) * bpp["gradients"]
    if s.zero_stage >= 3:
        n_layers = max(1, end - start)
        per_layer_params = placement.rank_params(sp) / n_layers
        buffers += ZERO3_GATHERED_LAYERS * per_layer_params * bpp["parameters"]
    return StageMemory(
        stage=stage, layers=end - start, node_group=node_group,
        parameters=states["parameters"], gradients=states["gradients"], optimizer=states["optimizer"],
        activations=kept, buffers=buffers, capacity=allocatable_bytes(model, s, gpu), host_bytes=host,
        in_flight=in_flight_microbatches(s, stage), device_bytes=gpu.memory_bytes,
        overhead_bytes=fixed_overhead_bytes(model, s, gpu), fragmentation_fraction=gpu.fragmentation_fraction,
        uncertainty=memory_uncertainty(model),
        allocator_spread=0.0 if s.expandable_segments else DEFAULT_ALLOCATOR_FRAGMENTATION_SPREAD,
    )
