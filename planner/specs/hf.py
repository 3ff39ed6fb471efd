"""Map a Hugging Face `config.json` (Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE,
DeepSeek-V3) onto a ModelSpec. No network access: the file is read as it is."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import SpecError
from ..inputs import printable
from .model import ModelSpec, model_from_dict

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")


# the class names in config.json "architectures" (transformers' *ForCausalLM) of the supported
# model types, for a config that names its architecture but not its model_type
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
                 "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
                 "DeepseekV3ForCausalLM": "deepseek_v3"}


def is_hf_config(data: Any) -> bool:
    """A Hugging Face config: it names its model_type or architectures, or it has transformers'
    num_hidden_layers and not the planner's num_layers (then model_from_hf says what it lacks)."""
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data
                                       or ("num_hidden_layers" in data and "num_layers" not in data))


def _architectures(data: dict, source: str) -> list | None:
    """config.json's "architectures" as transformers writes it: a list naming one *ForCausalLM
    class (None when absent). A string, an empty list or two architectures in one config are
    refused: the planner cannot tell which model the file describes."""
    arch = data.get("architectures")
    if arch is None:
        return None
    expected = 'expected a list with one architecture, e.g. ["LlamaForCausalLM"]'
    if not isinstance(arch, list):
        what = f"found the text {printable(arch)!r}" if isinstance(arch, str) else f"found {printable(arch)}"
        raise SpecError(source, "architectures", f"{what}, not a list; {expected}")
    if len(arch) != 1 or not isinstance(arch[0], str):
        what = (f"{len(arch)} architectures in one config ({printable(arch)})" if len(arch) != 1
                else f"found {printable(arch)}")
        raise SpecError(source, "architectures", f"{what}; {expected}")
    return arch


def _model_type(data: dict, source: str) -> str:
    _architectures(data, source)
    mt = data.get("model_type")
    if mt is None:
        arch = data.get("architectures")
        types = {ARCHITECTURES.get(a) for a in arch} if isinstance(arch, list) and all(
            isinstance(a, str) for a in arch) else {None}
        if len(types) == 1 and None not in types:
            return types.pop()
        what = (f"its architectures {printable(arch)} name no supported model" if arch is not None else
                "it has neither model_type nor architectures")
        why = "architectures" if arch is not None else "num_hidden_layers"
        raise SpecError(source, "model_type", f"read as a Hugging Face config.json (it has {why}), but "
                        f"{what}; expected model_type one of {', '.join(SUPPORTED)} as transformers writes it, "
                        "or a planner model YAML (planner schema model)")
    if mt not in SUPPORTED:
        raise SpecError(source, "model_type", f"found {printable(mt)!r}, expected one of {', '.join(SUPPORTED)}")
    return mt


def _need(data: dict, key: str, source: str) -> Any:
    if key not in data or data[key] is None:
        raise SpecError(source, key, "required field of this Hugging Face config is missing")
    return data[key]


def model_name(data: dict, source: str, model_type: str) -> str:
    """What the model is called: the config's `_name_or_path` as transformers saved it (a hub id
    such as 'meta-llama/Meta-Llama-3-8B' as is, a local path by its last folder), else the
    folder that holds config.json (a downloaded snapshot is named after its model), else the
    file's own stem, else hf-<model_type>. In the Hugging Face hub cache
    (models--ORG--NAME/snapshots/REVISION/config.json) the name is ORG/NAME."""
    ref = data.get("_name_or_path")
    if isinstance(ref, str) and ref.strip():
        ref = ref.strip()
        if ref.startswith(("/", ".", "~")) or "\\" in ref or ":" in ref:   # a path, not a hub id
            ref = PurePosixPath(ref.replace("\\", "/")).name or ref
        return ref
    p = Path(source).resolve()
    if p.parent.parent.name == "snapshots" and p.parents[2].name.startswith("models--"):
        return p.parents[2].name[len("models--"):].replace("--", "/")
    name = p.parent.name if p.name == "config.json" else p.stem
    return name or f"hf-{model_type}"


def model_from_hf(data: dict, source: str) -> ModelSpec:
    mt = _model_type(data, source)
    act = data.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise SpecError(source, "hidden_act", f"found {act!r}, expected 'silu' (SwiGLU MLP)")
    h = _need(data, "hidden_size", source)
    a = _need(data, "num_attention_heads", source)
    L = _need(data, "num_hidden_layers", source)
    out: dict[str, Any] = {
        "name": model_name(data, source, mt),
        "num_layers": L,
        "hidden_size": h,
        "num_attention_heads": a,
        "vocab_size": _need(data, "vocab_size", source),
        "num_query_groups": data.get("num_key_value_heads") or a,
        "ffn_hidden_size": _need(data, "intermediate_size", source),
        "swiglu": True,
        "normalization": "RMSNorm",
        "untie_embeddings_and_output_weights": not data.get("tie_word_embeddings", False),
        "position_embedding_type": "rope",
        "max_position_embeddings": data.get("max_position_embeddings", 4096),
        "add_bias_linear": False,
        "attention_dropout": float(data.get("attention_dropout", 0.0) or 0.0),
        "hidden_dropout": 0.0,
        "source": f"Hugging Face config.json ({mt}) from {source}",
    }
    if data.get("head_dim"):
        out["kv_channels"] = data["head_dim"]
    if mt == "qwen2" or data.get("attention_bias"):
        out["add_qkv_bias"] = True
    if mt in ("qwen3", "qwen3_moe"):
        out["qk_layernorm"] = True
        out["add_qkv_bias"] = bool(data.get("attention_bias", False))
    if mt == "mixtral":
        out["num_experts"] = _need(data, "num_local_experts", source)
        out["moe_router_topk"] = _need(data, "num_experts_per_tok", source)
        out["moe_ffn_hidden_size"] = out["ffn_hidden_size"]
    if mt == "qwen3_moe":
        out["num_experts"] = _need(data, "num_experts", source)
        out["moe_router_topk"] = _need(data, "num_experts_per_tok", source)
        out["moe_ffn_hidden_size"] = _need(data, "moe_intermediate_size", source)
        step = data.get("decoder_sparse_step", 1) or 1
        dense = set(data.get("mlp_only_layers") or [])
        out["moe_layer_freq"] = [0 if (i in dense or (i + 1) % step != 0) else 1 for i in range(L)]
    if mt == "deepseek_v3":
        out["num_experts"] = _need(data, "n_routed_experts", source)
        out["moe_router_topk"] = _need(data, "num_experts_per_tok", source)
        out["moe_ffn_hidden_size"] = _need(data, "moe_intermediate_size", source)
        n_shared = data.get("n_shared_experts") or 0
        if n_shared:
            out["moe_shared_expert_intermediate_size"] = n_shared * out["moe_ffn_hidden_size"]
        k = data.get("first_k_dense_replace", 0) or 0
        freq = data.get("moe_layer_freq", 1) or 1
        out["moe_layer_freq"] = [1 if (i >= k and i % freq == 0) else 0 for i in range(L)]
        out["multi_latent_attention"] = True
        out["q_lora_rank"] = data.get("q_lora_rank")
        out["kv_lora_rank"] = _need(data, "kv_lora_rank", source)
        out["qk_head_dim"] = _need(data, "qk_nope_head_dim", source)
        out["qk_pos_emb_head_dim"] = _need(data, "qk_rope_head_dim", source)
        out["v_head_dim"] = _need(data, "v_head_dim", source)
        out["kv_channels"] = out["qk_head_dim"] + out["qk_pos_emb_head_dim"]
        out["num_query_groups"] = a
    return model_from_dict(out, source)
