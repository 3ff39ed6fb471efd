"""The launch rules of Megatron-LM that matter for a plan, implemented here and tested against
vectors produced by Megatron's own validator (../shared/reference/megatron_vectors.yaml).

Sources (NVIDIA/Megatron-LM, main, Aug 2026):
- megatron/training/arguments.py, validate_args: world size vs tp*pp*cp, layers vs pp, batch
  divisibility, virtual pipeline, uneven-split flags exclusivity, CP sequence length,
  recompute granularity/method, fp16 vs bf16, overlap-param-gather, tp-comm-overlap,
  max_position_embeddings >= seq_length.
- megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__: heads vs tp,
  query groups vs tp, uneven first/last stage layer counts, pipeline layout, experts vs ep.
- megatron/core/parallel_state.py, initialize_model_parallel: world size vs etp*ep*pp.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidStrategy
from ..specs.model import ModelSpec
from .launch import MegatronLaunch
from .layout import layout_stage_layers

SOURCE_ARGS = "megatron/training/arguments.py"
SOURCE_TC = "megatron/core/transformer/transformer_config.py"
SOURCE_PS = "megatron/core/parallel_state.py"


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    source: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message} ({self.source})"


def megatron_violations(launch: MegatronLaunch, model: ModelSpec | None = None) -> list[Violation]:
    r = launch.raw
    m = model or launch.model
    out: list[Violation] = []

    def bad(rule, msg, src=SOURCE_ARGS):
        out.append(Violation(rule, msg, src))

    ws = launch.world_size
    tp, pp, cp = r.get("tp", 1), r.get("pp", 1), r.get("cp", 1)
    # --- environment the launch script sets (a bare flags file sets none)
    script_env = dict(launch.script_env)
    if r.get("use_megatron_fsdp") and r.get("ckpt_format", "torch_dist") != "fsdp_dtensor":
        bad("fsdp-ckpt-format", "Megatron-FSDP requires --ckpt-format fsdp_dtensor "
            f"(found {r.get('ckpt_format', 'torch_dist (the default)')})")
    if r.get("use_megatron_fsdp") and script_env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        bad("fsdp-cuda-connections", "Megatron-FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset; "
            "the script exports 1")
    if min(tp, pp, cp) < 1:
        bad("positive-degrees", "parallel sizes must be >= 1")
        return out
    model_size = tp * pp * cp
    if ws % model_size:
        bad("world-divisible", f"world size ({ws}) is not divisible by tp x pp x cp ({model_size})")
        return out
    dp = ws // model_size
    if r.get("bf16") and r.get("fp16"):
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
    seq = r.get("seq_length")
    if seq is None:
        bad("seq-length", "--seq-length is required")
        seq = 0
    # Megatron checks the launch's own --max-position-embeddings (default: the parsed model's)
    max_pos = launch.model.max_position_embeddings
    if seq and max_pos < seq:
        bad("max-positions", f"max_position_embeddings ({max_pos}) must be >= seq_length ({seq})")
    if cp > 1 and seq % (2 * cp):
        bad("seq-divisible-by-2cp", f"seq_length ({seq}) must be a multiple of 2 x context-parallel-size ({2 * cp})")
    # --- pipeline layout flags
    L = m.num_layers
    n_vpp_flags = sum(r.get(k) is not None for k in ("vpp", "layers_per_virtual_stage", "layout"))
    if n_vpp_flags > 1:
        bad("one-vpp-flag", "only one of --num-layers-per-virtual-pipeline-stage, "
            "--num-virtual-stages-per-pipeline-rank, --pipeline-model-parallel-layout may be set")
    first, last = r.get("first_stage_layers"), r.get("last_stage_layers")
    acc = bool(r.get("account_for_embedding")) + bool(r.get("account_for_loss"))
    vpp = None
    if r.get("layout") is not None:
        if first is not None or last is not None or acc:
            bad("layout-exclusive", "pipeline_model_parallel_layout cannot be set with other pipeline "
                "layout arguments", SOURCE_TC)
        try:
            per_rank, v = layout_stage_layers(r["layout"], pp, "layout")
            vpp = v if v > 1 else None
            if sum(per_rank) != L:
                bad("layout-layer-count", f"the layout places {sum(per_rank)} decoder layers, num_layers is {L}", SOURCE_TC)
            segs = r["layout"].split("|")
            if "E" not in segs[0] or any("E" in x for x in segs[1:]):
                bad("layout-embedding", "the embedding (E) must be in the first layout segment only", SOURCE_TC)
            if "L" not in segs[-1] or any("L" in x for x in segs[:-1]):
                bad("layout-loss", "the loss (L) must be in the last layout segment only", SOURCE_TC)
        except Exception as exc:  # layout syntax
            bad("layout-syntax", str(exc), SOURCE_TC)
    else:
        if r.get("vpp") is not None:
            vpp = r["vpp"] if r["vpp"] > 1 else None
        elif r.get("layers_per_virtual_stage") is not None:
            if first is not None or last is not None:
                bad("vpp-uneven", "use --num-virtual-stages-per-pipeline-rank with uneven pipeline stages")
            n = L + acc
            if n % pp:
                bad("layers-divisible-by-pp", "number of layers of the model must be divisible by pipeline size")
            elif (n // pp) % r["layers_per_virtual_stage"]:
                bad("vpp-layers", "layers per pipeline stage must be divisible by layers per virtual stage")
            else:
                v = (n // pp) // r["layers_per_virtual_stage"]
                vpp = v if v > 1 else None
        if first is not None or last is not None:
            if acc:
                bad("uneven-exclusive", "first/last stage layer counts cannot be set with "
                    "account_for_embedding/loss_in_pipeline_split", SOURCE_TC)
            rest, mid = L, pp
            for name, k in (("first", first), ("last", last)):
                if k is None:
                    continue
                if k <= 0:
                    bad("uneven-positive", f"num_layers_in_{name}_pipeline_stage must be larger than 0", SOURCE_TC)
                if vpp and k % vpp:
                    bad("uneven-vpp", f"layers at {name} stage ({k}) must be divisible by vpp ({vpp})", SOURCE_TC)
                rest -= k
                mid -= 1
            if bool(rest) != bool(mid):
                bad("uneven-middle", f"{rest} middle layers remaining but {mid} middle PP stages", SOURCE_TC)
            elif mid and rest % mid:
                bad("uneven-middle", f"number of layers at middle stage: {rest} must be divisible by the "
                    f"middle pipeline model parallel size {mid}", SOURCE_TC)
            elif mid and vpp and (rest // mid) % vpp:
                bad("uneven-vpp", f"layers on each middle rank ({rest // mid}) must be divisible by vpp ({vpp})", SOURCE_TC)
        elif r.get("layers_per_virtual_stage") is None:
            n = L + acc
            if n % pp:
                bad("layers-divisible-by-pp", f"Number of layers ({n}) should be divisible by the "
                    f"pipeline-model-parallel size ({pp})")
            elif vpp and (n // pp) % vpp:
                bad("vpp-layers", f"layers per pipeline rank ({n // pp}) must be divisible by vpp ({vpp})", SOURCE_TC)
    if vpp:
        if r.get("no_overlap_p2p") and pp <= 2:
            bad("vpp-needs-pp", "interleaved schedule without p2p overlap needs pipeline size > 2")
        elif pp <= 1:
            bad("vpp-needs-pp", "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1")
    # --- recompute
    gran, method = r.get("recompute_granularity"), r.get("recompute_method")
    if gran == "full" and method not in ("uniform", "block"):
        bad("full-recompute-method", 'recompute_granularity full needs --recompute-method "block" or "uniform"', SOURCE_TC)
    if gran == "selective" and method is not None:
        bad("selective-no-method", "recompute method is not supported with selective granularity")
    if gran is not None and gran not in ("full", "selective"):
        bad("recompute-granularity", f"unknown recompute granularity {gran!r}")
    # --- optimizer / overlap
    if r.get("overlap_param_gather"):
        if not (r.get("use_distributed_optimizer") or r.get("use_megatron_fsdp")):
            bad("overlap-param-gather-needs-dist-opt", "--overlap-param-gather only supported with distributed optimizer")
        if not r.get("overlap_grad_reduce"):
            bad("overlap-param-gather-needs-grad-reduce", "Must use --overlap-param-gather with --overlap-grad-reduce")
    if r.get("tp_comm_overlap") and not (r.get("sequence_parallel") and tp > 1):
        bad("tp-comm-overlap-needs-sp", "Tensor parallel communication/GEMM overlap needs sequence parallelism")
    # --- MoE
    ep = r.get("ep", 1)
    etp = r.get("etp") or tp
    if ep > 1 and not m.is_moe:
        bad("ep-needs-experts", "num_moe_experts must be non None to use expert-parallel", SOURCE_TC)
    if m.is_moe and m.num_experts % ep:
        bad("experts-divisible-by-ep", f"Number of experts ({m.num_experts}) should be a multiple of expert "
            f"model parallel_size ({ep})", SOURCE_TC)
    if ws % (etp * ep * pp):
        bad("world-divisible-expert", f"world_size ({ws}) is not divisible by etp x ep x pp ({etp * ep * pp})", SOURCE_PS)
    return out


def check_megatron(launch: MegatronLaunch, model: ModelSpec | None = None) -> None:
    v = megatron_violations(launch, model)
    if v:
        raise InvalidStrategy(v[0].rule, f"{v[0].message} ({v[0].source})")
