"""One parallel configuration (a 'strategy'): degrees, batch, recompute, sharding, schedule,
and where the pipeline stages live. Megatron-LM names where one exists."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

from .errors import InvalidStrategy
from .hashing import hash_once, state_without_hash
from .specs.model import ModelSpec

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "interleaved", "zb-h1")
# GEMM precision: bf16 / fp16, fp8 (Transformer Engine, recipe in fp8_recipe) or nvfp4 (Megatron's
# --fp4-format e2m1 --fp4-recipe nvfp4: TE's NVFP4BlockScaling, Blackwell and later)
PRECISIONS = ("bf16", "fp16", "fp8", "nvfp4")
# Transformer Engine fp8 recipes as Megatron names them (--fp8-recipe)
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
OPTIMIZER_CONVENTIONS = ("megatron", "deepspeed")


@dataclass(frozen=True)
class Strategy:
    tp: int = 1                     # tensor_model_parallel_size
    pp: int = 1                     # pipeline_model_parallel_size
    dp: int = 1                     # data_parallel_size (world / (tp * pp * cp))
    cp: int = 1                     # context_parallel_size
    ep: int = 1                     # expert_model_parallel_size
    etp: int | None = None          # expert_tensor_parallel_size; None = tp (Megatron's default)
    vpp: int = 1                    # num_virtual_stages_per_pipeline_rank
    # interleaved schedule: micro-batches run back to back on a virtual stage
    # (--microbatch-group-size-per-virtual-pipeline-stage); None = pp, Megatron's default
    microbatch_group_size_per_vp_stage: int | None = None
    micro_batch_size: int = 1
    global_batch_size: int = 1
    seq_length: int = 2048
    recompute: str = "selective"    # none | selective | full
    recompute_num_layers: int | None = None  # full recompute of only this many layers per stage
    sequence_parallel: bool = True
    zero_stage: int = 1             # 0 DDP, 1 distributed optimizer, 2 +grads, 3 +params (FSDP)
    precision: str = "bf16"
    schedule: str = "1f1b"          # 1f1b | interleaved | zb-h1
    layers_per_stage: tuple[int, ...] | None = None   # per pipeline rank; None = even split
    stage_node_groups: tuple[str, ...] | None = None  # node group hosting each pipeline rank
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    tp_comm_overlap: bool = False
    # backward TP collectives of column-parallel linears run asynchronously under their wgrad /
    # dgrad GEMMs (Megatron's async_tensor_model_parallel_allreduce, on by default since late
    # 2021 and always on in Megatron-Core; False models the SC'21-era code)
    async_tensor_model_parallel_allreduce: bool = True
    # pipeline p2p without SP: scatter the activation over the TP ranks before the send and
    # all-gather it after the receive (Narayanan et al. 2021 sec. 4.1; the legacy
    # --scatter-gather-tensors-in-pipeline, removed from Megatron-Core in 2023, which sends the
    # whole tensor from every TP rank)
    scatter_gather_tensors_in_pipeline: bool = False
    fused_attention: bool = True    # flash/cuDNN fused attention (no s^2 activations)
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the planner's launch scripts export it; a
    # Megatron launch read without it runs PyTorch's default caching allocator, whose fragmentation
    # widens the memory verdict's margin: cost/memory.py DEFAULT_ALLOCATOR_FRAGMENTATION_SPREAD)
    expandable_segments: bool = True
    offload_optimizer: bool = False
    optimizer_convention: str = "megatron"
    # ---- training-state dtypes (Megatron: --grad-reduce-in-bf16, --use-precision-aware-optimizer
    # with --main-grads-dtype / --main-params-dtype / --exp-avg-dtype / --exp-avg-sq-dtype)
    grad_reduce_in_bf16: bool = False
    main_grads_dtype: str = "fp32"          # fp32 | bf16
    main_params_dtype: str = "fp32"         # fp32 | fp16
    exp_avg_dtype: str = "fp32"             # fp32 | fp16 | bf16 | fp8
    exp_avg_sq_dtype: str = "fp32"          # fp32 | fp16 | bf16 | fp8
    optimizer_offload_fraction: float = 1.0  # with offload_optimizer: share kept on the host
    # ---- recompute and activation offloading
    recompute_modules: tuple[str, ...] = ("core_attn",)   # --recompute-modules (selective)
    cpu_offloading_num_layers: int = 0      # --cpu-offloading --cpu-offloading-num-layers
    # ---- fp8 (Transformer Engine)
    fp8_recipe: str = "delayed"             # delayed | tensorwise | mxfp8 | blockwise
    fp8_param_gather: bool = False
    # ---- fp4 (Transformer Engine NVFP4BlockScaling; precision == "nvfp4")
    fp4_param_gather: bool = False          # --fp4-param-gather: NVFP4 primary weights, gathered in fp4
    # ---- MoE execution
    moe_token_dispatcher_type: str = "alltoall"   # allgather | alltoall | flex
    # SMs of the flex dispatcher's dispatch / combine kernels (--moe-flex-dispatcher-num-sms, or
    # the deprecated --moe-deepep-num-sms / --moe-hybridep-num-sms); None: DeepEP's 20, as
    # Megatron sets it (cost/compute.py comm_sm_share)
    moe_flex_dispatcher_num_sms: int | None = None
    moe_grouped_gemm: bool = True
    moe_pad_expert_input_to_capacity: bool = False
    use_precision_aware_optimizer: bool = False
    # ---- CUDA graphs (--cuda-graph-impl none | local | transformer_engine, --cuda-graph-scope)
    cuda_graph_impl: str = "none"
    cuda_graph_scope: tuple[str, ...] = ()
    moe_router_dtype: str = "bf16"          # --moe-router-dtype (fp32 | fp64 | unset = params dtype)
    moe_permute_fusion: bool = False        # --moe-permute-fusion (TE fused permute: a larger map)
    overlap_moe_expert_parallel_comm: bool = False
    moe_shared_expert_overlap: bool = False
    delay_wgrad_compute: bool = False
    # ---- uneven virtual stages: decoder layers per layout segment in Megatron's order
    # (segment k is virtual chunk k // pp of pipeline rank k % pp); None = even chunks
    chunk_layers: tuple[int, ...] | None = None

    def __post_init__(self):
        # more than one virtual stage per rank means Megatron's interleaved 1F1B schedule
        if isinstance(self.vpp, int) and self.vpp > 1 and self.schedule == "1f1b":
            object.__setattr__(self, "schedule", "interleaved")

    # the search hashes strategies as cache keys many times: hash the fields once
    __hash__ = hash_once
    __getstate__ = state_without_hash   # a hash is per process (planner/hashing.py)

    # ---- derived ---------------------------------------------------------------------
    @property
    def microbatch_group_size(self) -> int:
        """Micro-batches a virtual stage runs back to back in the interleaved schedule."""
        return self.microbatch_group_size_per_vp_stage or self.pp

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    @property
    def expert_dp(self) -> int:
        """Megatron: expert data-parallel size = world / (etp * ep * pp)."""
        return self.world_size // (self.expert_tp * self.ep * self.pp)

    @property
    def sp(self) -> bool:
        """Megatron silently disables sequence parallelism at TP = 1 (arguments.py)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def gpus_per_stage(self) -> int:
        return self.tp * self.cp * self.dp

    def stage_layers(self, model: ModelSpec) -> tuple[int, ...]:
        if self.layers_per_stage is not None:
            return self.layers_per_stage
        base, extra = divmod(model.num_layers, self.pp)
        return tuple(base + (1 if i < extra else 0) for i in range(self.pp))

    def stage_chunk_layers(self, model: ModelSpec, stage: int) -> tuple[int, ...] | None:
        """Decoder layers of each virtual chunk of pipeline rank `stage` (chunk c is layout
        segment c * pp + stage), or None when the rank's chunks are even."""
        if self.chunk_layers is None:
            return None
        return tuple(self.chunk_layers[c * self.pp + stage] for c in range(self.vpp))

    def stage_layer_ranges(self, model: ModelSpec) -> tuple[tuple[int, int], ...]:
        """[start, end) layer indices per pipeline rank (all its virtual chunks together)."""
        return _ranges(self.stage_layers(model))

    @property
    def recompute_label(self) -> str:
        """'none' | 'selective' | 'selective <modules>' (other than Megatron's default core_attn) |
        'full' | 'full k/chunk' (block method on k layers per chunk)."""
        if self.recompute == "full" and self.recompute_num_layers is not None:
            return f"full {self.recompute_num_layers}/chunk"
        if self.recompute == "selective" and tuple(self.recompute_modules) != ("core_attn",):
            return "selective " + " ".join(self.recompute_modules)   # as --recompute-modules lists them
        return self.recompute

    @property
    def moe_overlap_label(self) -> str:
        """The MoE communication overlap it runs: 'a2a 1F1B' (--overlap-moe-expert-parallel-comm,
        '+wgrad' with --delay-wgrad-compute), 'shared' (--moe-shared-expert-overlap) or '-'."""
        if self.overlap_moe_expert_parallel_comm:
            return "a2a 1F1B" + (" +wgrad" if self.delay_wgrad_compute else "")
        return "shared" if self.moe_shared_expert_overlap else "-"

    def with_(self, **kw) -> "Strategy":
        """dataclasses.replace(self, **kw), without running __init__ over every field (the
        search builds 10^4-10^5 strategies this way): the same field values, then
        __post_init__; the cached hash is not carried over."""
        unknown = kw.keys() - _FIELD_SET
        if unknown:
            raise TypeError(f"Strategy has no field(s) {sorted(unknown)}")
        new = object.__new__(Strategy)
        state = new.__dict__
        state.update(self.__dict__)
        state.pop("_hash", None)
        state.update(kw)
        new.__post_init__()
        return new


_FIELD_SET = frozenset(f.name for f in fields(Strategy))

# Strategy fields that are a launch's training recipe rather than its layout: numerics (fp8 / fp4
# parameter all-gathers, the precision-aware optimizer's state dtypes, bf16 gradient reduction, the
# router's dtype) and the MoE kernels (fused permutation, padding to capacity). The search
# chooses none of them; with --compare-with a launch it plans with the launch's values
# (search/space.py recipe_settings), so #1 and the launch differ only in what the search chooses
# (the token dispatcher is not carried: the search plans the alltoall one, whose overlaps it prices).
RECIPE_FIELDS = ("fp8_param_gather", "fp4_param_gather", "use_precision_aware_optimizer", "main_grads_dtype",
                 "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "grad_reduce_in_bf16", "moe_router_dtype",
                 "moe_permute_fusion", "moe_pad_expert_input_to_capacity")
# The MoE communication overlaps a plan runs (the search chooses them: search/space.py LayerExecution)
MOE_OVERLAP_FIELDS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "moe_shared_expert_overlap")
# Fields a plan JSON carries under their own names (emit/report.py writes them, megatron/check.py
# reads them back), each a bool or a string like its default; recompute_modules, fp8_recipe and
# the token dispatcher are written apart (null where unused).
PLAN_JSON_FIELDS = RECIPE_FIELDS + MOE_OVERLAP_FIELDS


@lru_cache(maxsize=65536)
def _ranges(layers: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    out, start = [], 0
    for n in layers:
        out.append((start, start + n))
        start += n
    return tuple(out)


def check_structure(s: Strategy, model: ModelSpec) -> None:
    """Rules any launcher needs (not Megatron-specific): positive degrees, batch arithmetic,
    layer split, MoE degrees. Megatron's own rules live in planner/megatron/rules.py."""
    _check_values(s)
    _check_shapes(s, model)
    layers = _check_layer_split(s, model)
    _check_placement_moe_and_recompute(s, model, layers)


def _check_values(s: Strategy) -> None:
    """Degrees are positive integers, the expert grid divides the world, names are known."""
    for name in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "global_batch_size", "seq_length"):
        v = getattr(s, name)
        if not isinstance(v, int) or v < 1:
            raise InvalidStrategy("positive-degrees", f"{name} = {v!r}, expected an integer >= 1")
    if s.etp is not None and (not isinstance(s.etp, int) or s.etp < 1):
        raise InvalidStrategy("positive-degrees", f"etp = {s.etp!r}, expected an integer >= 1")
    if s.world_size % (s.expert_tp * s.ep * s.pp) != 0:
        # megatron/core/parallel_state.py builds the expert grid for every model
        raise InvalidStrategy("expert-grid-world",
                              f"world size {s.world_size} must be divisible by etp x ep x pp "
                              f"({s.expert_tp} x {s.ep} x {s.pp})")
    if s.recompute not in RECOMPUTE:
        raise InvalidStrategy("recompute", f"recompute = {s.recompute!r}, expected one of {RECOMPUTE}")
    if s.schedule not in SCHEDULES:
        raise InvalidStrategy("schedule", f"schedule = {s.schedule!r}, expected one of {SCHEDULES}")
    if s.precision not in PRECISIONS:
        raise InvalidStrategy("precision", f"precision = {s.precision!r}, expected one of {PRECISIONS}")
    if s.zero_stage not in (0, 1, 2, 3):
        raise InvalidStrategy("zero-stage", f"zero_stage = {s.zero_stage!r}, expected 0, 1, 2 or 3")


def _check_shapes(s: Strategy, model: ModelSpec) -> None:
    """Batch arithmetic, heads and query groups against TP, the sequence against positions, CP, SP."""
    if s.global_batch_size % (s.micro_batch_size * s.dp) != 0:
        raise InvalidStrategy("batch-divisibility",
                              f"global batch {s.global_batch_size} is not divisible by micro batch "
                              f"{s.micro_batch_size} x data-parallel {s.dp}")
    if model.num_attention_heads % s.tp != 0:
        raise InvalidStrategy("heads-divisible-by-tp",
                              f"num_attention_heads ({model.num_attention_heads}) must be a multiple of tp ({s.tp})")
    g = model.num_query_groups
    if g % s.tp != 0 and s.tp % g != 0:
        raise InvalidStrategy("query-groups-vs-tp",
                              f"num_query_groups ({g}) must be a multiple or divisor of tp ({s.tp})")
    if model.position_embedding_type == "learned_absolute" and s.seq_length > model.max_position_embeddings:
        raise InvalidStrategy("max-positions",
                              f"seq_length {s.seq_length} exceeds the learned position table of {model.name} "
                              f"({model.max_position_embeddings} positions)")
    if s.cp > 1 and s.seq_length % (2 * s.cp) != 0:
        raise InvalidStrategy("seq-divisible-by-2cp",
                              f"seq_length {s.seq_length} must be a multiple of 2 x cp ({2 * s.cp})")
    if s.sp and s.seq_length % (s.cp * s.tp) != 0:
        # sequence parallelism scatters each rank's seq_length / cp tokens over the TP group:
        # megatron/core/tensor_parallel/mappings.py (_split_along_first_dim, reduce-scatter)
        # asserts the first dimension divisible by the TP size, in the first step
        raise InvalidStrategy("sp-seq-divisible-by-tp",
                              f"sequence parallelism needs seq_length / cp ({s.seq_length} / {s.cp}) to be a multiple "
                              f"of tp ({s.tp}); use a sequence length divisible by {s.cp * s.tp}, or no sequence "
                              "parallelism")


def _check_layer_split(s: Strategy, model: ModelSpec) -> tuple[int, ...]:
    """The layers per stage, their virtual chunks and the interleaved schedule's micro-batch
    groups; the layers per stage."""
    layers = s.stage_layers(model)
    # an explicit layout (chunk_layers) may leave a virtual stage, or a whole rank, without decoder
    # layers (E|t*8|...|L): Megatron-LM's PipelineParallelLayerLayout (megatron/core/transformer/
    # pipeline_parallel_layer_layout.py) allows empty stages; its own checks are in
    # megatron/layout.py layout_problems. Checked once here: counts >= 0 that sum per rank.
    least = 0 if s.chunk_layers is not None else 1
    if len(layers) != s.pp or sum(layers) != model.num_layers or min(layers) < least:
        raise InvalidStrategy("layer-split",
                              f"layers per stage {list(layers)} must be {s.pp} positive counts summing to "
                              f"{model.num_layers}")
    if s.chunk_layers is not None:
        c = s.chunk_layers
        if (len(c) != s.pp * s.vpp or not all(isinstance(x, int) and x >= 0 for x in c)
                or tuple(sum(c[r::s.pp]) for r in range(s.pp)) != tuple(layers)):
            raise InvalidStrategy("chunk-layers",
                                  f"chunk_layers {list(c)} must be pp x vpp = {s.pp * s.vpp} counts whose sums per "
                                  f"rank (segments r, r + pp, ...) are the layers per stage {list(layers)}")
    if s.vpp > 1:
        if s.pp < 2:
            raise InvalidStrategy("vpp-needs-pp", "virtual stages need pipeline parallel size > 1")
        if s.chunk_layers is None and any(n % s.vpp for n in layers):
            raise InvalidStrategy("vpp-layers",
                                  f"layers per stage {list(layers)} must each be divisible by vpp {s.vpp} "
                                  "(or give chunk_layers, a pipeline layout)")
        # megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving:
        # the group N lies in [pp, M], and the last group M mod N is 0 or at least pp
        n, m = s.microbatch_group_size, s.num_microbatches
        if not s.pp <= n <= m:
            raise InvalidStrategy("interleaved-microbatches",
                                  f"interleaved schedule: micro-batches per virtual-stage group ({n}) must lie in "
                                  f"[pp, micro-batches] = [{s.pp}, {m}]")
        if 0 < m % n < s.pp:
            if s.microbatch_group_size_per_vp_stage is None:
                need = (f"a multiple of pp ({s.pp}) (or --microbatch-group-size-per-virtual-pipeline-stage N "
                        "with M mod N = 0)")
            else:
                need = f"a multiple of the group size {n}, or leave a last group of at least pp ({s.pp})"
            raise InvalidStrategy("interleaved-microbatches",
                                  f"interleaved schedule needs micro-batches ({m}) to be {need}")
    return layers


def _check_placement_moe_and_recompute(s: Strategy, model: ModelSpec, layers: tuple[int, ...]) -> None:
    """Stage placement, experts against EP and the expert grid, block recompute's layer count."""
    if s.stage_node_groups is not None and len(s.stage_node_groups) != s.pp:
        raise InvalidStrategy("stage-node-groups", f"{len(s.stage_node_groups)} node groups for {s.pp} stages")
    if model.is_moe:
        if model.num_experts % s.ep != 0:
            raise InvalidStrategy("experts-divisible-by-ep",
                                  f"num_experts ({model.num_experts}) must be a multiple of ep ({s.ep})")
        if (s.tp * s.cp * s.dp) % (s.expert_tp * s.ep) != 0:
            raise InvalidStrategy("expert-grid",
                                  f"etp x ep ({s.expert_tp} x {s.ep}) must divide tp x cp x dp "
                                  f"({s.tp * s.cp * s.dp})")
    elif s.ep != 1:
        raise InvalidStrategy("ep-needs-moe", f"ep = {s.ep} but the model has no experts")
    if s.recompute_num_layers is not None:
        if s.recompute != "full":
            raise InvalidStrategy("recompute-num-layers", "recompute_num_layers needs recompute = full")
        if not (1 <= s.recompute_num_layers <= min(layers) // s.vpp):
            raise InvalidStrategy("recompute-num-layers",
                                  f"recompute_num_layers {s.recompute_num_layers} must be in [1, {min(layers) // s.vpp}]")
