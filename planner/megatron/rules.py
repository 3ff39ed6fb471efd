"""The launch rules of Megatron-LM that matter for a plan, implemented here and tested against
vectors produced by Megatron's own validator (validation/data/megatron_vectors.yaml).

Sources (NVIDIA/Megatron-LM at the commit of flags_megatron.json):
- megatron/training/arguments.py, validate_args: world size vs tp*pp*cp, layers vs pp, batch
  divisibility, virtual pipeline, uneven-split flags exclusivity, CP sequence length,
  recompute granularity/method, fp16 vs bf16, overlap-param-gather, tp-comm-overlap,
  max_position_embeddings >= seq_length, required arguments, optimizer CPU offload, MTP
  position embeddings, --no-position-embedding, --attention-backend local.
- megatron/training/argument_utils.py, core_transformer_config_from_args: --squared-relu and
  --quick-geglu exclude --swiglu.
- megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__: heads vs tp,
  query groups vs tp, uneven first/last stage layer counts, pipeline layout, experts vs ep,
  recompute modules.
- megatron/core/transformer/pipeline_parallel_layer_layout.py: the layout's checks.
- megatron/core/optimizer/optimizer_config.py: training-state dtypes need the precision-aware
  optimizer, which needs Adam.
- megatron/core/tensor_parallel/mappings.py (_split_along_first_dim): with sequence parallelism
  the sequence on a rank (seq_length / cp) is split over TP and must divide evenly.
- megatron/core/parallel_state.py, initialize_model_parallel: world size vs etp*ep*pp.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidStrategy
from ..specs.model import ModelSpec
from .launch import MegatronLaunch
from .layout import LayoutError, layout_problems, parse_layout, split_chunk_layers

SOURCE_ARGS = "megatron/training/arguments.py"
SOURCE_ARGU = "megatron/training/argument_utils.py"
SOURCE_TC = "megatron/core/transformer/transformer_config.py"
SOURCE_LAYOUT = "megatron/core/transformer/pipeline_parallel_layer_layout.py"
SOURCE_OPT = "megatron/core/optimizer/optimizer_config.py"
SOURCE_OPT_BUILD = "megatron/core/optimizer/__init__.py"
SOURCE_MAP = "megatron/core/tensor_parallel/mappings.py"
SOURCE_PS = "megatron/core/parallel_state.py"
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                     "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    source: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message} ({self.source})"


@dataclass(frozen=True)
class _Launch:
    """What every rule group reads: the flags as given (`raw`), with Megatron's defaults
    (`val`), the model, and where violations go (`bad`)."""
    launch: MegatronLaunch
    model: ModelSpec
    out: list

    @property
    def raw(self) -> dict:
        return self.launch.raw

    def val(self, dest: str):
        return self.launch.value(dest)

    def bad(self, rule: str, msg: str, src: str = SOURCE_ARGS) -> None:
        self.out.append(Violation(rule, msg, src))


def megatron_violations(launch: MegatronLaunch, model: ModelSpec | None = None) -> list[Violation]:
    """Every rule of Megatron-LM's the launch breaks, in the order Megatron checks them."""
    c = _Launch(launch, model or launch.model, [])
    _environment_rules(c)
    degrees = _degree_rules(c)
    if degrees is None:    # no world size or degrees to check the rest against
        return c.out
    tp, pp, cp, dp = degrees
    _shape_and_batch_rules(c, tp, cp, dp)
    _model_rules(c)
    vpp = _pipeline_rules(c, pp)
    gran, method = _recompute_rules(c)
    _optimizer_and_precision_rules(c, tp)
    ep = _moe_rules(c, tp, pp)
    _ep_overlap_rules(c, pp, vpp, ep, gran, method)
    return c.out


def _environment_rules(c: _Launch):
    """The environment the launch script sets (a bare flags file sets none)."""
    r, val, bad = c.raw, c.val, c.bad
    script_env = dict(c.launch.script_env)
    if val("use_megatron_fsdp") and val("ckpt_format") != "fsdp_dtensor":
        bad("fsdp-ckpt-format", "Megatron-FSDP requires --ckpt-format fsdp_dtensor "
            f"(found {r.get('ckpt_format', 'torch_dist (the default)')})")
    if val("use_megatron_fsdp") and script_env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        bad("fsdp-cuda-connections", "Megatron-FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset; "
            "the script exports 1")


def _degree_rules(c: _Launch):
    """Required arguments and the degrees: (tp, pp, cp, dp), or None when the world size or a
    degree leaves nothing to check the rest against."""
    r, val, bad = c.raw, c.val, c.bad
    ws = c.launch.world_size
    tp, pp, cp = val("tensor_model_parallel_size"), val("pipeline_model_parallel_size"), val("context_parallel_size")
    # required arguments (validate_args: _check_arg_is_not_none; seq_length via encoder_seq_length)
    for dest in ("max_position_embeddings", "seq_length"):
        if dest not in r:
            bad("required-args", f"--{dest.replace('_', '-')} is required")
    if min(tp, pp, cp) < 1 or ws is None:
        if ws is None:
            bad("world-size", "world size unknown")
        else:
            bad("positive-degrees", "parallel sizes must be >= 1")
        return None
    model_size = tp * pp * cp
    if ws % model_size:
        bad("world-divisible", f"world size ({ws}) is not divisible by tp x pp x cp ({model_size})")
        return None
    dp = ws // model_size
    return tp, pp, cp, dp


def _shape_and_batch_rules(c: _Launch, tp: int, cp: int, dp: int):
    """Heads and query groups against TP, batch divisibility, sequence against positions, CP and SP."""
    r, val, bad, m = c.raw, c.val, c.bad, c.model
    if val("bf16") and val("fp16"):
        bad("fp16-xor-bf16", "--fp16 and --bf16 cannot both be set")
    if m.num_attention_heads % tp:
        bad("heads-divisible-by-tp", f"num_attention_heads ({m.num_attention_heads}) must be a multiple of "
            f"tensor_model_parallel_size ({tp})", SOURCE_TC)
    g = m.num_query_groups
    if g % tp and tp % g:
        bad("query-groups-vs-tp", f"num_query_groups ({g}) must be a multiple or divisor of "
            f"tensor_model_parallel_size ({tp})", SOURCE_TC)
    if r.get("kv_channels") is None and not m.multi_latent_attention and m.hidden_size % m.num_attention_heads:
        bad("hidden-divisible-by-heads", "hidden_size must be divisible by num_attention_heads without --kv-channels")
    mbs = r.get("micro_batch_size", 1)
    gbs = r.get("global_batch_size") or mbs * dp
    if mbs < 1 or gbs < 1:
        bad("batch-positive", "micro and global batch sizes must be > 0")
    elif gbs % (mbs * dp):
        bad("batch-divisibility", f"global_batch_size ({gbs}) must be divisible by micro_batch_size ({mbs}) "
            f"x data_parallel_size ({dp})")
    seq = r.get("seq_length") or 0
    # Megatron checks the launch's own --max-position-embeddings (default: the parsed model's)
    max_pos = c.launch.model.max_position_embeddings
    if seq and max_pos < seq:
        bad("max-positions", f"max_position_embeddings ({max_pos}) must be >= seq_length ({seq})")
    if cp > 1 and seq % (2 * cp):
        bad("seq-divisible-by-2cp", f"seq_length ({seq}) must be a multiple of 2 x context-parallel-size ({2 * cp})")
    if val("sequence_parallel") and tp > 1 and seq and (seq % cp or (seq // cp) % tp):
        bad("sp-seq-divisible-by-tp", f"with --sequence-parallel the sequence on a rank (seq_length / cp = "
            f"{seq}/{cp}) must be divisible by tensor_model_parallel_size ({tp})", SOURCE_MAP)


def _model_rules(c: _Launch):
    """Model arguments Megatron refuses together."""
    val, bad = c.val, c.bad
    if val("swiglu") and (val("squared_relu") or val("quick_geglu")):
        bad("mlp-activation", "--swiglu cannot be combined with --squared-relu or --quick-geglu", SOURCE_ARGU)
    if not val("add_position_embedding") and val("position_embedding_type") != "rope" \
            and not val("use_rotary_position_embeddings"):
        bad("no-position-embedding", "--no-position-embedding is deprecated, use --position-embedding-type")
    if val("mtp_num_layers") and (("rope" if val("use_rotary_position_embeddings") else val("position_embedding_type"))
                                  not in ("rope", "none")):
        bad("mtp-position-embedding", "Multi-Token Prediction needs --position-embedding-type rope or none")
    if val("attention_backend") == "local" and (val("spec") or [None])[0] != "local":
        bad("attention-backend-local", "--attention-backend local is only supported with --spec local")


def _pipeline_rules(c: _Launch, pp: int):
    """The pipeline layout flags; the virtual pipeline size they give (None without one)."""
    r, val, bad, m = c.raw, c.val, c.bad, c.model
    L = m.num_layers
    n_vpp_flags = sum(r.get(k) is not None for k in ("num_virtual_stages_per_pipeline_rank",
                                                     "num_layers_per_virtual_pipeline_stage",
                                                     "pipeline_model_parallel_layout"))
    if n_vpp_flags > 1:
        bad("one-vpp-flag", "only one of --num-layers-per-virtual-pipeline-stage, "
            "--num-virtual-stages-per-pipeline-rank, --pipeline-model-parallel-layout may be set")
    first, last = r.get("decoder_first_pipeline_num_layers"), r.get("decoder_last_pipeline_num_layers")
    acc_e, acc_l = bool(val("account_for_embedding_in_pipeline_split")), bool(val("account_for_loss_in_pipeline_split"))
    acc = acc_e + acc_l
    vpp = None
    if r.get("pipeline_model_parallel_layout") is not None:
        if first is not None or last is not None or acc:
            bad("layout-exclusive", "pipeline_model_parallel_layout cannot be set with other pipeline "
                "layout arguments", SOURCE_TC)
        try:
            lay = parse_layout(r["pipeline_model_parallel_layout"], pp)
            vpp = lay.vpp if lay.vpp > 1 else None
            for msg in layout_problems(lay, L, m.mtp_num_layers):
                bad("layout", msg, SOURCE_LAYOUT)
        except LayoutError as exc:
            bad("layout-syntax", str(exc), SOURCE_LAYOUT)
    else:
        if r.get("num_virtual_stages_per_pipeline_rank") is not None:
            k = r["num_virtual_stages_per_pipeline_rank"]
            vpp = k if k > 1 else None
        elif r.get("num_layers_per_virtual_pipeline_stage") is not None:
            if first is not None or last is not None:
                bad("vpp-uneven", "use --num-virtual-stages-per-pipeline-rank with uneven pipeline stages")
            n = L + acc
            if n % pp:
                bad("layers-divisible-by-pp", "number of layers of the model must be divisible by pipeline size")
            elif (n // pp) % r["num_layers_per_virtual_pipeline_stage"]:
                bad("vpp-layers", "layers per pipeline stage must be divisible by layers per virtual stage")
            else:
                v = (n // pp) // r["num_layers_per_virtual_pipeline_stage"]
                vpp = v if v > 1 else None
        if first is not None or last is not None:
            for name, k in (("first", first), ("last", last)):
                if k is not None and k <= 0:
                    bad("uneven-positive", f"num_layers_in_{name}_pipeline_stage must be larger than 0", SOURCE_TC)
                if k is not None and vpp and k % vpp:
                    bad("uneven-vpp", f"layers at {name} stage ({k}) must be divisible by vpp ({vpp})", SOURCE_TC)
            if acc:
                bad("uneven-exclusive", "first/last stage layer counts cannot be set with "
                    "account_for_embedding/loss_in_pipeline_split", SOURCE_TC)
            else:
                _, problems = split_chunk_layers(L, pp, vpp or 1, first, last, False, False)
                for p in problems:
                    bad("uneven-middle", p, SOURCE_TC)
        elif r.get("num_layers_per_virtual_pipeline_stage") is None:
            n = L + acc
            if n % pp:
                bad("layers-divisible-by-pp", f"Number of layers ({n}) should be divisible by the "
                    f"pipeline-model-parallel size ({pp})")
            elif vpp and (n // pp) % vpp:
                bad("vpp-layers", f"layers per pipeline rank ({n // pp}) must be divisible by vpp ({vpp})", SOURCE_TC)
            elif acc:
                _, problems = split_chunk_layers(L, pp, vpp or 1, None, None, acc_e, acc_l)
                for p in problems:
                    bad("account-split", p, SOURCE_TC)
    if vpp:
        if not val("overlap_p2p_comm") and pp <= 2:
            bad("vpp-needs-pp", "interleaved schedule without p2p overlap needs pipeline size > 2")
        elif pp <= 1:
            bad("vpp-needs-pp", "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1")
    return vpp


def _recompute_rules(c: _Launch):
    """Recompute granularity, method and modules; (granularity, method) as Megatron reads them."""
    r, val, bad, m = c.raw, c.val, c.bad, c.model
    gran, method = r.get("recompute_granularity"), r.get("recompute_method")
    if r.get("recompute_activations"):
        gran = "selective"
    if gran == "full" and method not in ("uniform", "block"):
        bad("full-recompute-method", 'recompute_granularity full needs --recompute-method "block" or "uniform"', SOURCE_TC)
    if gran == "selective" and method is not None:
        bad("selective-no-method", "recompute method is not supported with selective granularity")
    if gran == "selective":
        mods = list(val("recompute_modules") or ["core_attn"])
        wrong = sorted(set(mods) - set(RECOMPUTE_MODULES))
        if wrong:
            bad("recompute-modules", f"invalid --recompute-modules {', '.join(wrong)}; allowed: "
                f"{', '.join(RECOMPUTE_MODULES)}", SOURCE_TC)
        if "moe_act" in mods and not val("moe_grouped_gemm"):
            bad("recompute-modules", "moe_act in --recompute-modules needs --moe-grouped-gemm", SOURCE_TC)
        if "mla_up_proj" in mods and not m.multi_latent_attention:
            bad("recompute-modules", "mla_up_proj in --recompute-modules needs --multi-latent-attention", SOURCE_TC)
        if "shared_experts" in mods and m.moe_shared_expert_intermediate_size and val("moe_shared_expert_overlap"):
            bad("recompute-modules", "shared_experts recompute cannot work with --moe-shared-expert-overlap", SOURCE_TC)
        if val("fp8") and val("fp8_recipe") == "delayed" and ("moe_act" in mods or "layernorm" in mods):
            bad("recompute-modules", "delayed fp8 scaling does not support moe_act and layernorm recompute", SOURCE_TC)
    return gran, method


def _optimizer_and_precision_rules(c: _Launch, tp: int):
    """Overlaps, optimizer offload and state dtypes, fp4."""
    val, bad = c.val, c.bad
    if val("overlap_param_gather"):
        if not (val("use_distributed_optimizer") or val("use_megatron_fsdp") or val("optimizer") == "dist_muon"):
            bad("overlap-param-gather-needs-dist-opt", "--overlap-param-gather only supported with distributed optimizer")
        if not val("overlap_grad_reduce"):
            bad("overlap-param-gather-needs-grad-reduce", "Must use --overlap-param-gather with --overlap-grad-reduce")
    if val("tp_comm_overlap") and not (val("sequence_parallel") and tp > 1):
        bad("tp-comm-overlap-needs-sp", "Tensor parallel communication/GEMM overlap needs sequence parallelism")
    if val("optimizer_cpu_offload"):
        if not val("use_precision_aware_optimizer"):
            bad("cpu-offload-needs-precision-aware", "--optimizer-cpu-offload must be used with "
                "--use-precision-aware-optimizer")
        if val("fp8_param_gather") and val("fp8_recipe") != "delayed":
            bad("cpu-offload-fp8-recipe", "--optimizer-cpu-offload with --fp8-param-gather needs --fp8-recipe delayed")
    # fp4 (validate_args and TransformerConfig.__post_init__; Megatron also needs Transformer
    # Engine >= 2.7.0.dev0 for --fp4-format, which a launch script does not show)
    if val("fp4") is not None and val("fp8") is not None:
        bad("fp4-with-fp8", "--fp4-format and --fp8-format cannot be used simultaneously")
    if val("fp4_param_gather") and val("fp4") is None:
        bad("fp4-param-gather-needs-fp4", "--fp4-param-gather must be used together with --fp4-format")
    if val("fp4") is not None and val("fp4_recipe") == "custom" and not val("fp4_quantizer_factory"):
        bad("fp4-custom-needs-factory", "--fp4-recipe custom needs --fp4-quantizer-factory", SOURCE_TC)
    if val("fp8_param_gather") and not (val("use_distributed_optimizer") or val("use_megatron_fsdp")
                                        or val("use_torch_fsdp2")):
        bad("fp8-param-gather-needs-dist-opt", "--fp8-param-gather only supported with distributed optimizer, "
            "torch fsdp2 or megatron fsdp")
    if val("use_precision_aware_optimizer"):
        if val("optimizer") != "adam":
            bad("precision-aware-needs-adam", "--use-precision-aware-optimizer only supported with adam", SOURCE_OPT)
        if not (val("use_distributed_optimizer") or val("use_megatron_fsdp")):
            # get_megatron_optimizer (megatron/core/optimizer/__init__.py); Megatron-FSDP (v1,
            # the default) turns the distributed optimizer on itself (arguments.py)
            bad("precision-aware-needs-dist-opt", "--use-precision-aware-optimizer only supported with distributed "
                "optimizer", SOURCE_OPT_BUILD)
    else:
        for dest in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            if val(dest) != "fp32":
                bad("dtype-needs-precision-aware", f"--{dest.replace('_', '-')} {val(dest)}: can only be fp32 "
                    "without --use-precision-aware-optimizer", SOURCE_OPT)
    if val("bf16") and val("accumulate_allreduce_grads_in_fp32") and val("main_grads_dtype") != "fp32":
        bad("main-grads-fp32", "--main-grads-dtype can only be fp32 with --accumulate-allreduce-grads-in-fp32")


def _moe_rules(c: _Launch, tp: int, pp: int):
    """Experts against EP, the world against the expert grid; the EP degree."""
    r, val, bad, m = c.raw, c.val, c.bad, c.model
    ws = c.launch.world_size
    ep = val("expert_model_parallel_size")
    etp = r.get("expert_tensor_parallel_size") or tp
    if ep > 1 and not m.is_moe:
        bad("ep-needs-experts", "num_moe_experts must be non None to use expert-parallel", SOURCE_TC)
    if m.is_moe and m.num_experts % ep:
        bad("experts-divisible-by-ep", f"Number of experts ({m.num_experts}) should be a multiple of expert "
            f"model parallel_size ({ep})", SOURCE_TC)
    if ws % (etp * ep * pp):
        bad("world-divisible-expert", f"world_size ({ws}) is not divisible by etp x ep x pp ({etp * ep * pp})", SOURCE_PS)
    if (m.is_moe and m.moe_shared_expert_intermediate_size and val("moe_shared_expert_overlap")
            and val("moe_token_dispatcher_type") not in ("alltoall", "flex")):
        bad("shared-expert-overlap", "moe_shared_expert_overlap only works with alltoall or flex token dispatcher",
            SOURCE_TC)
    return ep


def _ep_overlap_rules(c: _Launch, pp: int, vpp, ep: int, gran, method):
    """What --overlap-moe-expert-parallel-comm needs (TransformerConfig.__post_init__)."""
    r, val, bad = c.raw, c.val, c.bad
    if val("overlap_moe_expert_parallel_comm"):
        def ep_overlap(msg):
            bad("ep-overlap", f"--overlap-moe-expert-parallel-comm {msg}", SOURCE_TC)
        if pp > 1 and not vpp:
            ep_overlap("needs a virtual pipeline (--num-virtual-stages-per-pipeline-rank) when pipeline size > 1")
        if ep <= 1:
            ep_overlap("needs expert model parallelism (--expert-model-parallel-size > 1)")
        if val("moe_token_dispatcher_type") not in ("alltoall", "flex"):
            ep_overlap("needs the alltoall or flex token dispatcher")
        if gran == "full" or method is not None or r.get("recompute_num_layers") is not None:
            ep_overlap("cannot run with full recomputation (--recompute-granularity full, "
                       "--recompute-method, --recompute-num-layers)")
        if gran == "selective" and "moe" in (val("recompute_modules") or []):
            ep_overlap("cannot run with moe in --recompute-modules")
        if not (val("bf16") or val("fp16")):
            ep_overlap("needs a bf16 or fp16 model (--bf16 / --fp16)")
        if val("moe_shared_expert_overlap"):
            ep_overlap("cannot run with --moe-shared-expert-overlap")
        if (val("mtp_num_layers") or 0) > 1:
            ep_overlap("supports at most one MTP layer (--mtp-num-layers)")
    if val("delay_wgrad_compute") and not val("overlap_moe_expert_parallel_comm"):
        bad("delay-wgrad", "--delay-wgrad-compute needs --overlap-moe-expert-parallel-comm", SOURCE_TC)


def check_megatron(launch: MegatronLaunch, model: ModelSpec | None = None) -> None:
    v = megatron_violations(launch, model)
    if v:
        raise InvalidStrategy(v[0].rule, f"{v[0].message} ({v[0].source})")
