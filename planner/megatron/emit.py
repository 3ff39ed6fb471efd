"""Megatron-LM launch arguments and launch scripts for a plan.

Only pretrain_gpt.py flags that follow from the plan; data and tokenizer flags stay the user's
(the script passes "$@" through). Every emitted launch is parsed back and checked against
planner.megatron.rules before it is written.
"""

from __future__ import annotations

import shlex

from ..errors import InvalidStrategy
from ..specs.model import ModelSpec
from ..strategy import Strategy
from . import layout
from .launch import parse_words
from .rules import megatron_violations


def stage_chunk_layers(model: ModelSpec, s: Strategy) -> tuple[int, ...]:
    """Decoder layers per layout segment in Megatron's order (segment k: chunk k // pp of rank
    k % pp): the strategy's own chunks, else each rank's layers spread over its vpp chunks."""
    if s.chunk_layers is not None:
        return tuple(s.chunk_layers)
    v = s.vpp
    segs = [[0] * s.pp for _ in range(v)]
    for r, n in enumerate(s.stage_layers(model)):
        base, extra = divmod(n, v)
        for c in range(v):
            segs[c][r] = base + (1 if c < extra else 0)
    return tuple(segs[c][r] for c in range(v) for r in range(s.pp))


def layout_string(model: ModelSpec, s: Strategy) -> str:
    """--pipeline-model-parallel-layout for uneven stages: pp x vpp segments, 'E' on the first,
    MTP layers and 'L' on the last; rank r's chunks are segments r, r + pp, ... (Megatron's order)."""
    return layout.layout_string(stage_chunk_layers(model, s), model.mtp_num_layers)


def megatron_args(model: ModelSpec, s: Strategy) -> list[str]:
    """The Megatron-LM flags of a plan: the model, its MoE, the parallel layout, recompute,
    training-state sharding and offload, precision."""
    words: list[str] = []

    def add(flag, *values):
        words.append(flag)
        words.extend(str(v) for v in values if v is not None)

    for part in (_model_shape_args, _moe_args, _model_extras_args, _parallel_args, _recompute_args,
                 _state_args, _precision_args):
        part(add, model, s)
    return words


def _model_shape_args(add, model: ModelSpec, s: Strategy) -> None:
    """Shape, vocabulary, positions, norm, activation, biases, dropout."""
    add("--num-layers", model.num_layers)
    add("--hidden-size", model.hidden_size)
    add("--num-attention-heads", model.num_attention_heads)
    if model.num_query_groups != model.num_attention_heads and not model.multi_latent_attention:
        add("--group-query-attention")
        add("--num-query-groups", model.num_query_groups)
    if not model.multi_latent_attention and (model.hidden_size % model.num_attention_heads
                                             or model.kv_channels != model.hidden_size // model.num_attention_heads):
        add("--kv-channels", model.kv_channels)
    add("--ffn-hidden-size", model.ffn_hidden_size)
    add("--vocab-size", model.vocab_size)
    if model.make_vocab_size_divisible_by != 128:
        add("--make-vocab-size-divisible-by", model.make_vocab_size_divisible_by)
    add("--seq-length", s.seq_length)
    add("--max-position-embeddings", max(model.max_position_embeddings, s.seq_length))
    add("--position-embedding-type", model.position_embedding_type)
    add("--normalization", model.normalization)
    if model.swiglu:
        add("--swiglu")
    if model.untie_embeddings_and_output_weights:
        add("--untie-embeddings-and-output-weights")
    if not model.add_bias_linear:
        add("--disable-bias-linear")
    if model.add_qkv_bias:
        add("--add-qkv-bias")
    if model.qk_layernorm:
        add("--qk-layernorm")
    add("--attention-dropout", model.attention_dropout)
    add("--hidden-dropout", model.hidden_dropout)


def _moe_args(add, model: ModelSpec, s: Strategy) -> None:
    """Experts, routing, the dispatcher and its overlaps, EP and expert-TP."""
    if model.is_moe:
        add("--num-experts", model.num_experts)
        add("--moe-router-topk", model.moe_router_topk)
        add("--moe-ffn-hidden-size", model.moe_ffn_hidden_size)
        if model.moe_shared_expert_intermediate_size:
            add("--moe-shared-expert-intermediate-size", model.moe_shared_expert_intermediate_size)
        pat = model.moe_layer_pattern
        if not all(pat):
            add("--moe-layer-freq", "[" + ",".join(str(x) for x in pat) + "]")
        if model.moe_capacity_factor:
            add("--moe-expert-capacity-factor", model.moe_capacity_factor)
            if s.moe_pad_expert_input_to_capacity:
                add("--moe-pad-expert-input-to-capacity")
        if model.moe_router_num_groups:
            add("--moe-router-num-groups", model.moe_router_num_groups)
            add("--moe-router-group-topk", model.moe_router_group_topk)
        if s.moe_grouped_gemm:
            add("--moe-grouped-gemm")
        if s.moe_permute_fusion:
            add("--moe-permute-fusion")
        if s.moe_router_dtype in ("fp32", "fp64"):
            add("--moe-router-dtype", s.moe_router_dtype)
        add("--moe-token-dispatcher-type", s.moe_token_dispatcher_type)
        if s.moe_token_dispatcher_type == "flex" and s.moe_flex_dispatcher_num_sms is not None:
            add("--moe-flex-dispatcher-num-sms", s.moe_flex_dispatcher_num_sms)
        if s.overlap_moe_expert_parallel_comm:
            add("--overlap-moe-expert-parallel-comm")
        if s.moe_shared_expert_overlap and model.moe_shared_expert_intermediate_size:
            add("--moe-shared-expert-overlap")
        add("--expert-model-parallel-size", s.ep)
        add("--expert-tensor-parallel-size", s.expert_tp)


def _model_extras_args(add, model: ModelSpec, s: Strategy) -> None:
    """MTP, sliding-window attention, multi-latent attention."""
    if model.mtp_num_layers:
        add("--mtp-num-layers", model.mtp_num_layers)
    if model.window_size is not None:
        add("--window-size", f"{model.window_size},0")
        if model.window_attention_pattern and not all(model.window_attention_pattern):
            add("--window-attn-skip-freq", "[" + ",".join(str(x) for x in model.window_attention_pattern) + "]")
    if model.multi_latent_attention:
        add("--multi-latent-attention")
        if model.q_lora_rank:
            add("--q-lora-rank", model.q_lora_rank)
        add("--kv-lora-rank", model.kv_lora_rank)
        add("--qk-head-dim", model.qk_head_dim)
        add("--qk-pos-emb-head-dim", model.qk_pos_emb_head_dim)
        add("--v-head-dim", model.v_head_dim)


def _parallel_args(add, model: ModelSpec, s: Strategy) -> None:
    """TP, PP (and its layout or virtual stages), CP, batch."""
    add("--tensor-model-parallel-size", s.tp)
    add("--pipeline-model-parallel-size", s.pp)
    if s.cp > 1:
        add("--context-parallel-size", s.cp)
    even = (s.layers_per_stage is None or len(set(s.stage_layers(model))) == 1) and s.chunk_layers is None
    if s.pp > 1 and not even:
        add("--pipeline-model-parallel-layout", layout_string(model, s))
    elif s.vpp > 1:
        add("--num-virtual-stages-per-pipeline-rank", s.vpp)
    add("--micro-batch-size", s.micro_batch_size)
    add("--global-batch-size", s.global_batch_size)


def _recompute_args(add, model: ModelSpec, s: Strategy) -> None:
    """Selective (with its modules) or full recompute (uniform, or block of k layers)."""
    if s.recompute == "selective":
        add("--recompute-granularity", "selective")
        if tuple(s.recompute_modules) != ("core_attn",):
            add("--recompute-modules", *s.recompute_modules)
    elif s.recompute == "full":
        add("--recompute-granularity", "full")
        if s.recompute_num_layers is None:
            add("--recompute-method", "uniform")
            add("--recompute-num-layers", 1)
        else:
            add("--recompute-method", "block")
            add("--recompute-num-layers", s.recompute_num_layers)


def _state_args(add, model: ModelSpec, s: Strategy) -> None:
    """Sequence parallelism, the distributed optimizer or Megatron-FSDP, grad/param overlaps, TP
    comm overlap, training-state dtypes, optimizer and activation offload, delayed wgrad."""
    if s.sequence_parallel:
        add("--sequence-parallel")    # Megatron switches it off by itself at TP = 1
    if s.zero_stage == 1:
        add("--use-distributed-optimizer")
    elif s.zero_stage in (2, 3):
        add("--use-megatron-fsdp")
        add("--data-parallel-sharding-strategy", "optim_grads" if s.zero_stage == 2 else "optim_grads_params")
        add("--ckpt-format", "fsdp_dtensor")   # arguments.py: Megatron-FSDP requires it
    if s.zero_stage >= 1 and s.overlap_grad_reduce:
        add("--overlap-grad-reduce")
        if s.overlap_param_gather:
            add("--overlap-param-gather")
    elif s.zero_stage == 0 and s.overlap_grad_reduce:
        add("--overlap-grad-reduce")
    if s.tp_comm_overlap and s.sp:
        add("--tp-comm-overlap")
    dtypes = (("--main-grads-dtype", s.main_grads_dtype), ("--main-params-dtype", s.main_params_dtype),
              ("--exp-avg-dtype", s.exp_avg_dtype), ("--exp-avg-sq-dtype", s.exp_avg_sq_dtype))
    if s.use_precision_aware_optimizer or s.offload_optimizer or any(d != "fp32" for _, d in dtypes):
        add("--use-precision-aware-optimizer")   # arguments.py: CPU offload needs it too
        for flag, d in dtypes:
            if d != "fp32":
                add(flag, d)
    if s.offload_optimizer:
        add("--optimizer-cpu-offload")
        if s.optimizer_offload_fraction != 1.0:
            add("--optimizer-offload-fraction", s.optimizer_offload_fraction)
    if s.grad_reduce_in_bf16:
        add("--grad-reduce-in-bf16")
    if s.cpu_offloading_num_layers:
        add("--cpu-offloading-num-layers", s.cpu_offloading_num_layers)
    if s.delay_wgrad_compute:
        add("--delay-wgrad-compute")


def _precision_args(add, model: ModelSpec, s: Strategy) -> None:
    """bf16 / fp16, fp8 and its recipe, nvfp4, the attention backend."""
    if s.precision == "fp16":
        add("--fp16")
    else:
        add("--bf16")
    if s.precision == "fp8":
        add("--fp8-format", "hybrid")
        if s.fp8_recipe != "delayed":
            add("--fp8-recipe", s.fp8_recipe)
        if s.fp8_param_gather:
            add("--fp8-param-gather")
    if s.precision == "nvfp4":
        # Megatron's fp4 training flags (arguments.py at the pinned commit): the E2M1 format and
        # TE's NVFP4BlockScaling recipe, in bf16 for everything TE does not quantize
        add("--fp4-format", "e2m1")
        add("--fp4-recipe", "nvfp4")
        if s.fp4_param_gather:
            add("--fp4-param-gather")
    add("--attention-backend", "auto" if s.fused_attention else "unfused")


def checked_args(model: ModelSpec, s: Strategy) -> list[str]:
    """The emitted flags, parsed back and validated against Megatron's rules."""
    args = megatron_args(model, s)
    launch = parse_words(args, "emitted launch", model.name, world_size=s.world_size)
    v = megatron_violations(launch, model)
    if v:
        raise InvalidStrategy(v[0].rule, f"emitted launch would be rejected by Megatron: {v[0]}")
    return args


def stage_host_map(s: Strategy, stage_groups: tuple[str, ...], gpus_per_node: dict) -> list[dict]:
    """Which nodes (by node group) host which ranks. Megatron's rank order tp-cp-ep-dp-pp makes
    stage i the ranks [i*tp*cp*dp, (i+1)*tp*cp*dp); torchrun puts rank r on node r // G. A stage
    smaller than a node shares it with the next stage of the same group."""
    per = s.gpus_per_stage
    rows = []
    group_gpu = {g: 0 for g in gpus_per_node}   # GPUs of each group used so far
    for i, g in enumerate(stage_groups):
        gpn = gpus_per_node[g]
        first, last = i * per, (i + 1) * per - 1
        off = group_gpu[g]
        rows.append({"stage": i, "node_group": g, "ranks": [first, last],
                     "node_ranks": [first // gpn, last // gpn],
                     "group_nodes": [off // gpn, (off + per - 1) // gpn]})
        group_gpu[g] += per
    return rows


# A header line that tells `planner check` which node group hosts each pipeline stage (the
# node-rank order below puts them there; Megatron's flags cannot say it).
STAGE_GROUPS_MARK = "planner: stage-node-groups="


def launch_script(args: list[str], s: Strategy, host_map: list[dict], gpus_per_node: int, plan_name: str) -> str:
    """torchrun launch script; nodes join in the order of HOSTFILE_<group> so that each pipeline
    stage lands on the node group the plan chose."""
    nnodes = host_map[-1]["node_ranks"][1] + 1 if host_map else max(1, s.world_size // gpus_per_node)
    order = "\n".join(f"#   node ranks {r['node_ranks'][0]}-{r['node_ranks'][1]}: {r['node_group']} "
                      f"nodes {r['group_nodes'][0]}-{r['group_nodes'][1]} -> pipeline stage {r['stage']} "
                      f"(ranks {r['ranks'][0]}-{r['ranks'][1]})" for r in host_map)
    flags = " \\\n  ".join(" ".join(shlex.quote(x) for x in group) for group in flag_groups(args))
    # Megatron (arguments.py): TP/CP/SP on Hopper and earlier need CUDA_DEVICE_MAX_CONNECTIONS=1
    # (one hardware queue keeps communication ahead of the GEMMs it overlaps); Megatron-FSDP
    # refuses 1.
    connections = ("unset CUDA_DEVICE_MAX_CONNECTIONS   # Megatron-FSDP requires it > 1 or unset"
                   if s.zero_stage >= 2 else "export CUDA_DEVICE_MAX_CONNECTIONS=1")
    # expandable segments keep the caching allocator's fragmentation low (pytorch PR 96995); the
    # plan's memory verdict assumes them
    allocator = ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" if s.expandable_segments
                 else "# PyTorch's default caching allocator (no expandable segments)")
    placement = (f"\n# {STAGE_GROUPS_MARK}{','.join(s.stage_node_groups)}" if s.stage_node_groups else "")
    return f"""#!/usr/bin/env bash
# {plan_name}: generated by planner. World size {s.world_size} = tp {s.tp} x cp {s.cp} x dp {s.dp} x pp {s.pp}.{placement}
# Megatron's rank order tp-cp-ep-dp-pp puts pipeline stage i on ranks [i*{s.gpus_per_stage}, (i+1)*{s.gpus_per_stage}).
# Start one copy per node with NODE_RANK set so that:
{order}
# Usage: MASTER_ADDR=host MASTER_PORT=29500 NODE_RANK=k ./launch.sh --data-path ... --tokenizer-type ...
set -euo pipefail
: "${{MASTER_ADDR:?set MASTER_ADDR}}" "${{NODE_RANK:?set NODE_RANK}}"
MASTER_PORT=${{MASTER_PORT:-29500}}
NNODES=${{NNODES:-{nnodes}}}
GPUS_PER_NODE=${{GPUS_PER_NODE:-{gpus_per_node}}}
MEGATRON=${{MEGATRON:-.}}
{connections}
{allocator}

torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "$NODE_RANK" \\
  --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \\
  "$MEGATRON/pretrain_gpt.py" \\
  {flags} \\
  "$@"
"""


def flag_groups(args: list[str]) -> list[list[str]]:
    """Each flag with all of its values (--recompute-modules layernorm moe_act takes two)."""
    groups: list[list[str]] = []
    for x in args:
        if x.startswith("--") or not groups:
            groups.append([x])
        else:
            groups[-1].append(x)
    return groups
