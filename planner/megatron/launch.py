"""Read a Megatron-LM command line or argument file into a ModelSpec and a Strategy.

A leading `torchrun ... pretrain_gpt.py` (or `python pretrain_gpt.py`) gives the world size;
`--flag=value` and `--flag value`. Flags that change memory or time are understood; others are
kept and reported as ignored. Shell words come from planner.megatron.shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import SpecError
from ..specs.model import ModelSpec, model_from_dict
from ..strategy import Strategy
from .layout import layout_stage_layers
from .shell import _tokenize, tokenize  # noqa: F401 (tokenize: part of the reader's API)

# flag -> (kind, model field or strategy field). kinds: int, float, str, true, false
MODEL_FLAGS = {
    "--num-layers": ("int", "num_layers"),
    "--hidden-size": ("int", "hidden_size"),
    "--num-attention-heads": ("int", "num_attention_heads"),
    "--num-query-groups": ("int", "num_query_groups"),
    "--kv-channels": ("int", "kv_channels"),
    "--ffn-hidden-size": ("int", "ffn_hidden_size"),
    "--vocab-size": ("int", "vocab_size"),
    "--max-position-embeddings": ("int", "max_position_embeddings"),
    "--swiglu": ("true", "swiglu"),
    "--normalization": ("str", "normalization"),
    "--untie-embeddings-and-output-weights": ("true", "untie_embeddings_and_output_weights"),
    "--position-embedding-type": ("str", "position_embedding_type"),
    "--disable-bias-linear": ("false", "add_bias_linear"),
    "--add-qkv-bias": ("true", "add_qkv_bias"),
    "--qk-layernorm": ("true", "qk_layernorm"),
    "--attention-dropout": ("float", "attention_dropout"),
    "--hidden-dropout": ("float", "hidden_dropout"),
    "--num-experts": ("int", "num_experts"),
    "--moe-router-topk": ("int", "moe_router_topk"),
    "--moe-ffn-hidden-size": ("int", "moe_ffn_hidden_size"),
    "--moe-shared-expert-intermediate-size": ("int", "moe_shared_expert_intermediate_size"),
    "--moe-layer-freq": ("freq", "moe_layer_freq"),
    "--moe-expert-capacity-factor": ("float", "moe_capacity_factor"),
    "--multi-latent-attention": ("true", "multi_latent_attention"),
    "--q-lora-rank": ("int", "q_lora_rank"),
    "--kv-lora-rank": ("int", "kv_lora_rank"),
    "--qk-head-dim": ("int", "qk_head_dim"),
    "--qk-pos-emb-head-dim": ("int", "qk_pos_emb_head_dim"),
    "--v-head-dim": ("int", "v_head_dim"),
}
STRATEGY_FLAGS = {
    "--tensor-model-parallel-size": ("int", "tp"),
    "--pipeline-model-parallel-size": ("int", "pp"),
    "--context-parallel-size": ("int", "cp"),
    "--expert-model-parallel-size": ("int", "ep"),
    "--expert-tensor-parallel-size": ("int", "etp"),
    "--num-virtual-stages-per-pipeline-rank": ("int", "vpp"),
    "--num-layers-per-virtual-pipeline-stage": ("int", "layers_per_virtual_stage"),
    "--micro-batch-size": ("int", "micro_batch_size"),
    "--global-batch-size": ("int", "global_batch_size"),
    "--seq-length": ("int", "seq_length"),
    "--recompute-granularity": ("str", "recompute_granularity"),
    "--recompute-method": ("str", "recompute_method"),
    "--recompute-num-layers": ("int", "recompute_num_layers"),
    "--recompute-activations": ("true", "recompute_activations"),
    "--sequence-parallel": ("true", "sequence_parallel"),
    "--use-distributed-optimizer": ("true", "use_distributed_optimizer"),
    "--overlap-grad-reduce": ("true", "overlap_grad_reduce"),
    "--overlap-param-gather": ("true", "overlap_param_gather"),
    "--tp-comm-overlap": ("true", "tp_comm_overlap"),
    "--bf16": ("true", "bf16"),
    "--fp16": ("true", "fp16"),
    "--fp8-format": ("str", "fp8_format"),
    "--decoder-first-pipeline-num-layers": ("int", "first_stage_layers"),
    "--decoder-last-pipeline-num-layers": ("int", "last_stage_layers"),
    "--pipeline-model-parallel-layout": ("str", "layout"),
    "--account-for-embedding-in-pipeline-split": ("true", "account_for_embedding"),
    "--account-for-loss-in-pipeline-split": ("true", "account_for_loss"),
    "--use-flash-attn": ("true", "use_flash_attn"),
    "--attention-backend": ("str", "attention_backend"),
    "--group-query-attention": ("true", "group_query_attention"),
    "--no-overlap-p2p-communication": ("true", "no_overlap_p2p"),
    "--optimizer-cpu-offload": ("true", "optimizer_cpu_offload"),
    "--use-megatron-fsdp": ("true", "use_megatron_fsdp"),
    "--data-parallel-sharding-strategy": ("str", "dp_sharding"),
    "--ckpt-format": ("str", "ckpt_format"),
    "--world-size": ("int", "world_size"),
}


@dataclass(frozen=True)
class MegatronLaunch:
    model: ModelSpec
    strategy: Strategy
    raw: dict                    # every understood flag -> value (Megatron's dest names)
    ignored: tuple[str, ...]     # flags kept but not modelled
    world_size: int | None       # from torchrun --nnodes x --nproc-per-node, if present
    source: str
    script_env: tuple = ()       # (name, value) the script itself sets before launching


def _strip_launcher(words: list[str]) -> tuple[list[str], int | None]:
    """Drop everything up to the training script; read torchrun's world size if given."""
    world = None
    idx = None
    for i, w in enumerate(words):
        if w.endswith(".py"):
            idx = i
    if idx is None:
        return words, None
    launcher = words[:idx]
    nnodes = nproc = None
    for i, w in enumerate(launcher):
        key, _, val = w.partition("=")
        if key in ("--nnodes", "--nproc-per-node", "--nproc_per_node") and not val and i + 1 < len(launcher):
            val = launcher[i + 1]
        if key == "--nnodes" and val.isdigit():
            nnodes = int(val)
        if key in ("--nproc-per-node", "--nproc_per_node") and val.isdigit():
            nproc = int(val)
    if nnodes and nproc:
        world = nnodes * nproc
    return words[idx + 1:], world


def _convert(kind: str, flag: str, value: str, source: str):
    try:
        if kind == "int":
            v = int(value)
            if v < 0:
                raise ValueError
            return v
        if kind == "float":
            return float(value)
    except ValueError:
        raise SpecError(source, flag, f"found {value!r}, expected a {'non-negative integer' if kind == 'int' else 'number'}") from None
    return value


def parse_words(words: list[str], source: str, name: str = "megatron-launch",
                default_world_size: int | None = None) -> MegatronLaunch:
    """`default_world_size`: the world when neither torchrun sizes nor --world-size are given."""
    words, world = _strip_launcher(words)
    raw: dict = {}
    ignored: list[str] = []
    i = 0
    table = {**MODEL_FLAGS, **STRATEGY_FLAGS}
    while i < len(words):
        w = words[i]
        if w in ("$@", "$*"):   # the script's own arguments (data paths, tokenizer), passed through
            i += 1
            continue
        if not w.startswith("--"):
            raise SpecError(source, w, "expected a --flag (stray word)")
        flag, eq, inline = w.partition("=")
        if flag in table:
            kind, dest = table[flag]
            if kind in ("true", "false"):
                if eq:
                    raise SpecError(source, flag, "is a switch and takes no value")
                raw[dest] = kind == "true"
                i += 1
                continue
            if eq:
                value = inline
                i += 1
            else:
                if i + 1 >= len(words) or (words[i + 1].startswith("--") and kind != "float"):
                    raise SpecError(source, flag, "expects a value")
                value = words[i + 1]
                i += 2
            raw[dest] = value if kind in ("str", "freq") else _convert(kind, flag, value, source)
            continue
        # unknown flag: keep it, with its values
        ignored.append(flag)
        i += 1
        if not eq:
            while i < len(words) and not words[i].startswith("--"):
                i += 1
    return _build(raw, tuple(ignored), world, source, name, default_world_size)


_STAGE_GROUPS = re.compile(r"^#\s*planner: stage-node-groups=([A-Za-z0-9._,-]+)\s*$", re.M)


def parse_text(text: str, source: str, env: dict | None = None, default_world_size: int | None = None) -> MegatronLaunch:
    """A launch; a `# planner: stage-node-groups=a,b,...` header line (written by
    `plan --emit`) sets which node group hosts each pipeline stage."""
    words, assigned = _tokenize(text, source, env)
    launch = parse_words(words, source, name=Path(source).stem or "launch", default_world_size=default_world_size)
    launch = replace(launch, script_env=tuple(sorted(assigned.items(), key=lambda kv: kv[0])))
    m = _STAGE_GROUPS.search(text)
    if m:
        groups = tuple(m.group(1).split(","))
        if len(groups) != launch.strategy.pp:
            raise SpecError(source, "stage-node-groups", f"names {len(groups)} groups, the launch has "
                            f"pipeline_model_parallel_size {launch.strategy.pp}")
        launch = replace(launch, strategy=replace(launch.strategy, stage_node_groups=groups))
    return launch


def parse_file(path: str | Path, env: dict | None = None, default_world_size: int | None = None) -> MegatronLaunch:
    p = Path(path)
    if not p.is_file():
        raise SpecError(str(path), None, "file not found")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(path), None, f"cannot read as UTF-8 text: {exc}") from None
    if len(text) > 1_000_000:
        raise SpecError(str(path), None, "larger than 1 MB; not a launch file")
    return parse_text(text, str(path), env, default_world_size)


def _build(raw: dict, ignored: tuple[str, ...], world: int | None, source: str, name: str,
           default_world_size: int | None = None) -> MegatronLaunch:
    mdict = {"name": name}
    for flag, (kind, dest) in MODEL_FLAGS.items():
        if dest in raw:
            mdict[dest] = raw[dest]
    if not raw.get("group_query_attention"):
        mdict.pop("num_query_groups", None)   # Megatron ignores it without --group-query-attention
    if mdict.get("moe_layer_freq") is not None:
        f = mdict["moe_layer_freq"]
        mdict["moe_layer_freq"] = int(f) if str(f).isdigit() else f
    for req in ("num_layers", "hidden_size", "num_attention_heads"):
        if req not in mdict:
            raise SpecError(source, "--" + req.replace("_", "-"), "required flag is missing")
    if "vocab_size" not in mdict:
        raise SpecError(source, "--vocab-size", "required: the planner needs the vocabulary size "
                        "(a tokenizer file cannot be read here)")
    model = model_from_dict(mdict, source)
    tp = raw.get("tp", 1)
    pp = raw.get("pp", 1)
    cp = raw.get("cp", 1)
    ws = raw.get("world_size") or world or default_world_size
    if ws is None:
        raise SpecError(source, "world size", "unknown: give torchrun --nnodes/--nproc-per-node in the "
                        "file, or --world-size to the planner")
    for k, v in (("--tensor-model-parallel-size", tp), ("--pipeline-model-parallel-size", pp),
                 ("--context-parallel-size", cp)):
        if v < 1:
            raise SpecError(source, k, f"found {v}, expected >= 1")
    dp = ws // (tp * pp * cp) if ws % (tp * pp * cp) == 0 else 0
    gran = raw.get("recompute_granularity")
    if raw.get("recompute_activations"):
        gran = "selective"
    recompute = {"selective": "selective", "full": "full", None: "none"}.get(gran, "none")
    if gran not in (None, "selective", "full"):
        raise SpecError(source, "--recompute-granularity", f"found {gran!r}, expected full or selective")
    precision = "fp8" if raw.get("fp8_format") else ("fp16" if raw.get("fp16") else "bf16")
    zero = 1 if raw.get("use_distributed_optimizer") else 0
    if raw.get("use_megatron_fsdp"):
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(
            raw.get("dp_sharding", "optim_grads_params"), 3)
    vpp = raw.get("vpp") or 1
    layers_per_stage = None
    L = model.num_layers
    if raw.get("layout"):
        per_rank, vpp = layout_stage_layers(raw["layout"], pp, source)
        layers_per_stage = tuple(per_rank)
    elif raw.get("first_stage_layers") or raw.get("last_stage_layers"):
        first, last = raw.get("first_stage_layers"), raw.get("last_stage_layers")
        middle_ranks = pp - (first is not None) - (last is not None)
        rest = L - (first or 0) - (last or 0)
        if middle_ranks > 0 and rest > 0 and rest % middle_ranks == 0:
            mid = [rest // middle_ranks] * middle_ranks
            layers_per_stage = tuple(([first] if first is not None else []) + mid + ([last] if last is not None else []))
    elif raw.get("layers_per_virtual_stage"):
        per = L // pp if pp else 0
        vpp = per // raw["layers_per_virtual_stage"] if raw["layers_per_virtual_stage"] else 1
    strategy = Strategy(
        tp=tp, pp=pp, dp=max(dp, 1), cp=cp, ep=raw.get("ep", 1), etp=raw.get("etp"), vpp=vpp,
        micro_batch_size=raw.get("micro_batch_size", 1),
        global_batch_size=raw.get("global_batch_size") or raw.get("micro_batch_size", 1) * max(dp, 1),
        seq_length=raw.get("seq_length", model.max_position_embeddings),
        recompute=recompute,
        recompute_num_layers=raw.get("recompute_num_layers") if recompute == "full" and raw.get("recompute_method") == "block" else None,
        sequence_parallel=bool(raw.get("sequence_parallel")),
        zero_stage=zero, precision=precision,
        schedule="interleaved" if vpp > 1 else "1f1b",
        layers_per_stage=layers_per_stage,
        overlap_grad_reduce=bool(raw.get("overlap_grad_reduce")),
        overlap_param_gather=bool(raw.get("overlap_param_gather")),
        tp_comm_overlap=bool(raw.get("tp_comm_overlap")),
        fused_attention=True,
        offload_optimizer=bool(raw.get("optimizer_cpu_offload")),
    )
    return MegatronLaunch(model=model, strategy=strategy, raw=raw, ignored=ignored,
                          world_size=ws, source=source)
