"""Megatron-LM's flags -> the planner's Strategy, with Megatron's defaults.

Degrees and batch (refusing what Megatron accepts in argparse and fails on once training
starts), recompute, precision, sharding (distributed optimizer, Megatron-FSDP), attention
backend, the pipeline split (--pipeline-model-parallel-layout, uneven first / last stages,
virtual stages), MoE options and CUDA graphs. What the planner does not price is returned as
(flag, why), what it assumed as notes.
"""

from __future__ import annotations

from ..specs.model import ModelSpec
from ..strategy import Strategy
from .launch_errors import InvalidLaunch
from .layout import LayoutError, parse_layout, rank_sums, split_chunk_layers

# Megatron's defaults that differ from the planner's own Strategy defaults (arguments.py /
# transformer_config.py at the table's commit): read from the table, named here for clarity
ATTENTION_BACKEND_FUSED = {"flash": True, "fused": True, "auto": True, "unfused": False, "local": False}
FSDP_ZERO_STAGE = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


def strategy_from_flags(v: dict, val, model: ModelSpec, world: int | None, source: str):
    """(Strategy, notes, unpriced) of the flags `v` (`val(dest)`: the flag's value, else
    Megatron's default) for `model` on `world` GPUs (None: not known)."""
    notes: list[str] = []
    unpriced: list[tuple[str, str]] = []
    tp, pp, cp, ep = _checked_sizes(v, val, source)
    dp = world // (tp * pp * cp) if world and world % (tp * pp * cp) == 0 else 0
    mbs = val("micro_batch_size", 1)
    gbs = val("global_batch_size") or mbs * max(dp, 1)
    recompute = _recompute(val, unpriced)
    numerics = _precision_sharding_attention(v, val, notes, unpriced)
    vpp, layers_per_stage, chunk_layers = _pipeline_split(v, val, model.num_layers, pp, source)
    moe_kw = _moe_options(val, source) if model.is_moe else {}
    graph_impl, scope_words = _cuda_graphs(val)
    s = Strategy(
        tp=tp, pp=pp, dp=max(dp, 1), cp=cp, ep=ep, etp=val("expert_tensor_parallel_size"), vpp=vpp,
        microbatch_group_size_per_vp_stage=val("microbatch_group_size_per_vp_stage") if vpp > 1 else None,
        micro_batch_size=mbs, global_batch_size=gbs,
        seq_length=val("seq_length") or model.max_position_embeddings,
        **recompute,
        sequence_parallel=bool(val("sequence_parallel")), **numerics,
        schedule="interleaved" if vpp > 1 else "1f1b", layers_per_stage=layers_per_stage,
        overlap_grad_reduce=bool(val("overlap_grad_reduce")), overlap_param_gather=bool(val("overlap_param_gather")),
        tp_comm_overlap=bool(val("tp_comm_overlap")),
        offload_optimizer=bool(val("optimizer_cpu_offload")),
        optimizer_offload_fraction=float(val("optimizer_offload_fraction")),
        grad_reduce_in_bf16=bool(val("grad_reduce_in_bf16")),
        **_state_dtypes(val),
        cpu_offloading_num_layers=val("cpu_offloading_num_layers"),
        fp8_recipe=val("fp8_recipe"), fp8_param_gather=bool(val("fp8_param_gather")),
        fp4_param_gather=bool(val("fp4_param_gather")),
        delay_wgrad_compute=bool(val("delay_wgrad_compute")), chunk_layers=chunk_layers,
        use_precision_aware_optimizer=bool(val("use_precision_aware_optimizer")),
        cuda_graph_impl=graph_impl, cuda_graph_scope=tuple(scope_words), **moe_kw)
    return s, notes, unpriced


def _checked_sizes(v: dict, val, source: str) -> tuple[int, int, int, int]:
    """(tp, pp, cp, ep); a degree, sequence length or batch size below 1 is refused."""
    tp, pp, cp = val("tensor_model_parallel_size"), val("pipeline_model_parallel_size"), val("context_parallel_size")
    ep = val("expert_model_parallel_size")
    for opt, x in (("--tensor-model-parallel-size", tp), ("--pipeline-model-parallel-size", pp),
                   ("--context-parallel-size", cp), ("--expert-model-parallel-size", ep)):
        if x < 1:
            raise InvalidLaunch([("positive-degrees", f"{opt}: found {x}, expected >= 1")], source)
    # argparse (type=int) and validate_args let 0 through (0 % (2 x cp) == 0, max positions >= 0),
    # then megatron/core/datasets/gpt_dataset.py divides the tokens by the sequence length and the
    # microbatch calculator asserts 'number of microbatches should be at least 1': invalid, as
    # --num-layers 0 is (a given 0 must not fall back to a default)
    for opt, dest in (("--seq-length", "seq_length"), ("--micro-batch-size", "micro_batch_size"),
                      ("--global-batch-size", "global_batch_size")):
        x = v.get(dest)
        if x is not None and x < 1:
            raise InvalidLaunch([("positive-degrees", f"{opt}: found {x}, expected an integer >= 1 (Megatron-LM "
                                  "accepts it in argparse and fails once training starts)")], source)
    return tp, pp, cp, ep


def _recompute(val, unpriced: list) -> dict:
    """Strategy's recompute, recompute_num_layers and recompute_modules."""
    gran = "selective" if val("recompute_activations") else val("recompute_granularity")
    recompute = {"selective": "selective", "full": "full"}.get(gran, "none")
    method, rnl = val("recompute_method"), val("recompute_num_layers")
    recompute_num_layers = rnl if recompute == "full" and method == "block" else None
    if recompute == "full" and method == "uniform" and rnl and rnl > 1:
        unpriced.append(("--recompute-num-layers", f"uniform recompute of groups of {rnl} layers keeps one "
                         "input per group; priced as one per layer"))
    modules = tuple(val("recompute_modules") or ("core_attn",))
    return dict(recompute=recompute, recompute_num_layers=recompute_num_layers, recompute_modules=modules)


def _precision_sharding_attention(v: dict, val, notes: list, unpriced: list) -> dict:
    """Strategy's precision, zero_stage and fused_attention; the optimizer and fp8 recipe the
    planner does not price."""
    # precision
    if val("fp4") is not None:
        precision = "nvfp4"
        if val("fp4_recipe") == "custom":
            unpriced.append(("--fp4-recipe custom", "a custom fp4 quantizer factory; priced as nvfp4"))
        if val("fp16"):
            unpriced.append(("--fp16", "fp4 with fp16 for the layers TE does not quantize; priced with bf16"))
    elif val("fp8") is not None:
        precision = "fp8"
    elif val("fp16"):
        precision = "fp16"
    elif val("bf16"):
        precision = "bf16"
    else:
        precision = "bf16"
        unpriced.append(("(no --bf16 / --fp16)", "Megatron trains in fp32; priced as bf16"))
    # sharding
    zero = 1 if val("use_distributed_optimizer") else 0
    if val("use_megatron_fsdp"):
        zero = FSDP_ZERO_STAGE[val("data_parallel_sharding_strategy")]
    # attention
    backend = val("attention_backend")
    fused = ATTENTION_BACKEND_FUSED[backend]
    if val("transformer_impl") == "local":
        fused = False
        notes.append("--transformer-impl local: Megatron-Core's DotProductAttention keeps the s x s scores (unfused)")
    elif "attention_backend" not in v:
        notes.append("attention backend: Megatron's default auto, priced as fused (no s x s scores) on GPUs "
                     "with fused kernels (sm80+)")
    if v.get("use_flash_attn"):
        notes.append("--use-flash-attn has no effect in Megatron-Core: --attention-backend decides")
    if val("transformer_impl") == "inference_optimized":
        unpriced.append(("--transformer-impl inference_optimized", "inference layers"))
    if val("optimizer") != "adam":
        unpriced.append((f"--optimizer {val('optimizer')}", "optimizer state priced as Adam's"))
    if val("fp8_recipe") == "custom":
        unpriced.append(("--fp8-recipe custom", "a custom fp8 recipe"))
    return dict(precision=precision, zero_stage=zero, fused_attention=fused)


def _pipeline_split(v: dict, val, L: int, pp: int, source: str):
    """(vpp, layers_per_stage, chunk_layers) of L decoder layers over pp stages; None where
    Strategy's default (each rank's layers split evenly) says it all."""
    layers_per_stage = None
    chunk_layers = None
    vpp = 1
    if v.get("pipeline_model_parallel_layout") is not None:
        try:
            lay = parse_layout(v["pipeline_model_parallel_layout"], pp)
        except LayoutError as exc:
            raise InvalidLaunch([("layout-syntax", f"--pipeline-model-parallel-layout: {exc}")], source) from None
        vpp = lay.vpp
        layers_per_stage = lay.per_rank
        chunk_layers = lay.chunk_layers
    else:
        if v.get("num_virtual_stages_per_pipeline_rank"):
            vpp = v["num_virtual_stages_per_pipeline_rank"]
        elif v.get("num_layers_per_virtual_pipeline_stage"):
            n = L + bool(val("account_for_embedding_in_pipeline_split")) + bool(val("account_for_loss_in_pipeline_split"))
            per = n // pp
            k = v["num_layers_per_virtual_pipeline_stage"]
            vpp = per // k if k and per % k == 0 else 1
        first, last = v.get("decoder_first_pipeline_num_layers"), v.get("decoder_last_pipeline_num_layers")
        acc_e, acc_l = bool(val("account_for_embedding_in_pipeline_split")), bool(val("account_for_loss_in_pipeline_split"))
        if first is not None or last is not None or acc_e or acc_l:
            chunks, _problems = split_chunk_layers(L, pp, max(vpp, 1), first, last, acc_e, acc_l)
            if not _problems:
                chunk_layers = chunks
                layers_per_stage = rank_sums(chunks, pp)
    if vpp < 1:
        vpp = 1
    if chunk_layers is not None:
        # kept only when the per-rank counts do not say it all: uneven chunks on a rank, or a
        # rank without decoder layers (Strategy: None = each rank's layers split evenly)
        even = all(len(set(chunk_layers[r::pp])) == 1 for r in range(pp))
        if even and min(rank_sums(chunk_layers, pp)) > 0:
            chunk_layers = None
        if layers_per_stage is not None and len(set(layers_per_stage)) == 1 and sum(layers_per_stage) == L \
                and chunk_layers is None and layers_per_stage == _even(L, pp):
            layers_per_stage = None
    return vpp, layers_per_stage, chunk_layers


def _flex_num_sms(val, source: str) -> int | None:
    """The flex dispatcher's SMs: --moe-flex-dispatcher-num-sms, else the deprecated
    --moe-deepep-num-sms / --moe-hybridep-num-sms routed to it (TransformerConfig.__post_init__,
    which refuses the two set apart); None: DeepEP's default (Megatron's 20, cost/compute.py).
    The backend (--moe-flex-dispatcher-backend) is not read (its buffers are not priced): HybridEP
    left to its own default (24 SMs inside one NVLink domain, 8 across: DeepEP hybrid-ep branch,
    csrc/hybrid_ep/config.cuh) is priced at DeepEP's 20 too."""
    n = val("moe_flex_dispatcher_num_sms")
    if n is None:
        old = {v for v in (val("moe_deepep_num_sms"), val("moe_hybridep_num_sms")) if v is not None}
        if len(old) > 1:
            raise InvalidLaunch([("flex-dispatcher-sms", f"--moe-deepep-num-sms and --moe-hybridep-num-sms differ "
                                 f"({sorted(old)}); expected one --moe-flex-dispatcher-num-sms (Megatron refuses "
                                 "conflicting SM counts)")], source)
        n = old.pop() if old else None
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidLaunch([("flex-dispatcher-sms", f"--moe-flex-dispatcher-num-sms: found {n!r}, expected a "
                                                     "positive number of SMs")], source)
    return n


def _moe_options(val, source: str = "flags") -> dict:
    """Strategy's MoE fields (a MoE model only)."""
    return dict(moe_token_dispatcher_type=val("moe_token_dispatcher_type"),
                moe_flex_dispatcher_num_sms=(_flex_num_sms(val, source)
                                             if val("moe_token_dispatcher_type") == "flex" else None),
                moe_grouped_gemm=bool(val("moe_grouped_gemm")),
                moe_pad_expert_input_to_capacity=bool(val("moe_pad_expert_input_to_capacity")),
                overlap_moe_expert_parallel_comm=bool(val("overlap_moe_expert_parallel_comm")),
                moe_shared_expert_overlap=bool(val("moe_shared_expert_overlap")),
                moe_router_dtype=val("moe_router_dtype") or "bf16",
                moe_permute_fusion=bool(val("moe_permute_fusion")))


def _cuda_graphs(val) -> tuple[str, list[str]]:
    """(implementation, scope words). --cuda-graph-impl (or the older --enable-cuda-graph =
    local) over the modules of --cuda-graph-modules / --cuda-graph-scope (default: whole layers)."""
    graph_impl = val("cuda_graph_impl") or "none"
    if val("enable_cuda_graph") and graph_impl == "none":
        graph_impl = "local"
    scope_words = []
    for x in (val("cuda_graph_modules") or val("cuda_graph_scope_deprecated") or []):
        scope_words += [w for w in str(x).replace(",", " ").split() if w]
    if graph_impl == "full_iteration":
        scope_words = ["full_iteration"]
    return graph_impl, scope_words


def _state_dtypes(val) -> dict:
    """--main-grads-dtype & co. take effect with --use-precision-aware-optimizer only
    (optimizer_config.py refuses them otherwise: a rule says so)."""
    names = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
    if not val("use_precision_aware_optimizer"):
        return {n: "fp32" for n in names}
    return {n: val(n) for n in names}


def _even(L: int, pp: int) -> tuple[int, ...]:
    base, extra = divmod(L, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))
