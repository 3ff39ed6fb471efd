"""Megatron-LM's flags -> the planner's ModelSpec, with Megatron's defaults.

The shape flags (--num-layers, --hidden-size, --num-attention-heads) are required; the rest map
onto ModelSpec's fields (Megatron's own names). The vocabulary is --vocab-size, else --model's,
else the tokenizer's (planner.megatron.tokenizers), else a bundled model named like the
tokenizer; a tokenizer named by a value the script cannot know is asked for with its --set.
"""

from __future__ import annotations

import re

from ..bash import Partial, Unknown
from ..errors import SpecError
from ..specs.model import ModelSpec, model_from_dict
from .flags import ParsedFlags
from .launch_errors import InvalidLaunch
from .tokenizers import SENTENCEPIECE_TYPES, vocab_flag, vocab_of

# the end of shell.py's note on a `source FILE` whose path depends on a value not known
UNREAD_SOURCE = "the path cannot be known without running it; not read"


def _require_shape_flags(pf: ParsedFlags, source: str, notes: list) -> None:
    """--num-layers, --hidden-size and --num-attention-heads are required: missing, they are
    asked for with what may hold them (a word not known, the script's own arguments, a `source`
    not read)."""
    v = pf.values
    problems: list[tuple[str, str]] = []
    unknown_words = [n for n in pf.notes]
    for req in ("num_layers", "hidden_size", "num_attention_heads"):
        if req not in v:
            opt = "--" + req.replace("_", "-")
            # a `source` whose path needs a value not given (conf/$1.sh) may hold the flags
            unread = [n for n in notes if n.endswith(UNREAD_SOURCE)]
            if unknown_words or pf.passthrough:
                raise SpecError(source, opt, "required, and not among the words read" +
                                (f"; {unknown_words[0]}: --set it" if unknown_words else "") +
                                ("; the script passes its own arguments (\"$@\"): --set 1=... or write the flags" if pf.passthrough and not unknown_words else "") +
                                (f"; {unread[0]} (--set what its path needs)" if unread else ""))
            problems.append(("required-args", f"{opt} is required"))
    if problems:
        raise InvalidLaunch(problems, source)


def model_from_flags(pf: ParsedFlags, val, source: str, name: str, notes: list, vocab_model: ModelSpec | None,
                     holders: dict, search_dirs: tuple) -> ModelSpec:
    """The model the flags describe (`val(dest)`: the flag's value, else Megatron's default);
    what was assumed is appended to `notes`."""
    _require_shape_flags(pf, source, notes)
    v = pf.values
    h, L, a = v["hidden_size"], v["num_layers"], v["num_attention_heads"]
    # gated MLPs (three h x ffn matrices): --swiglu, --quick-geglu; --squared-relu is not gated
    # (core_transformer_config_from_args; with --swiglu a rule refuses the launch)
    gated = bool(val("swiglu") or (val("quick_geglu") and not val("squared_relu")))
    m: dict = {"name": name, "num_layers": L, "hidden_size": h, "num_attention_heads": a,
               "swiglu": gated, "normalization": val("normalization"),
               "untie_embeddings_and_output_weights": bool(val("untie_embeddings_and_output_weights")),
               "add_bias_linear": bool(val("add_bias_linear")), "add_qkv_bias": bool(val("add_qkv_bias")),
               "qk_layernorm": bool(val("qk_layernorm")), "attention_dropout": val("attention_dropout"),
               "hidden_dropout": val("hidden_dropout"),
               "make_vocab_size_divisible_by": val("make_vocab_size_divisible_by")}
    if "ffn_hidden_size" in v:
        m["ffn_hidden_size"] = v["ffn_hidden_size"]
    elif val("quick_geglu"):
        m["ffn_hidden_size"] = 4 * h   # validate_args sizes the default from --swiglu only
    if "kv_channels" in v:
        m["kv_channels"] = v["kv_channels"]
    if val("group_query_attention"):
        m["num_query_groups"] = val("num_query_groups")
    if "max_position_embeddings" in v:
        m["max_position_embeddings"] = v["max_position_embeddings"]
    pos = "rope" if val("use_rotary_position_embeddings") else val("position_embedding_type")
    if pos in ("yarn", "mrope"):
        notes.append(f"--position-embedding-type {pos}: priced as rope (no parameters, same activations)")
        pos = "rope"
    elif pos == "relative":
        pos = "none"
    m["position_embedding_type"] = pos
    m["vocab_size"], vocab_note = _vocabulary(pf, val, source, vocab_model, holders, search_dirs)
    if vocab_note:
        notes.append(vocab_note)
    if val("num_experts") is not None:
        m["num_experts"] = val("num_experts")
        m["moe_router_topk"] = val("moe_router_topk")
        for dst, src in (("moe_ffn_hidden_size", "moe_ffn_hidden_size"),
                         ("moe_shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"),
                         ("moe_capacity_factor", "moe_expert_capacity_factor"),
                         ("moe_router_num_groups", "moe_router_num_groups"),
                         ("moe_router_group_topk", "moe_router_group_topk")):
            if v.get(src) is not None:
                m[dst] = v[src]
        m["moe_layer_freq"] = val("moe_layer_freq")
    if val("multi_latent_attention"):
        m["multi_latent_attention"] = True
        for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            if val(k) is not None:
                m[k] = val(k)
    if val("mtp_num_layers"):
        m["mtp_num_layers"] = val("mtp_num_layers")
    ws_flag = val("window_size")
    if ws_flag is not None:
        left = ws_flag[0] if ws_flag else -1
        if left >= 0:
            m["window_size"] = left
        if len(ws_flag) > 1 and ws_flag[1] not in (0, -1):
            notes.append(f"--window-size {','.join(map(str, ws_flag))}: keys after the query are not priced")
        if val("window_attn_skip_freq") is not None:
            m["window_attn_skip_freq"] = val("window_attn_skip_freq")
    try:
        model = model_from_dict(m, source)
    except SpecError as exc:
        raise InvalidLaunch([("model-args", f"{_flag_of(exc.field)}: {exc.message}")], source) from None
    return model


_MODEL_FIELD_FLAG = {"moe_capacity_factor": "--moe-expert-capacity-factor", "swiglu": "--swiglu",
                     "moe_layer_freq": "--moe-layer-freq"}


def _flag_of(model_field: str | None) -> str:
    if not model_field:
        return "model"
    return _MODEL_FIELD_FLAG.get(model_field, "--" + model_field.replace("_", "-"))


# what the flag that names the tokenizer's vocabulary should be given, in an error's fix
_VOCAB_SOURCE_WANTED = {"--vocab-file": ("PATH", "the GPT-2 vocab.json"),
                        "--tokenizer-model": ("ID_OR_PATH", "a Hugging Face id or tokenizer folder"),
                        "--tokenizer-type": ("TYPE", "a tokenizer type")}


def _vocabulary(pf: ParsedFlags, val, source: str, vocab_model: ModelSpec | None, holders: dict,
                search_dirs: tuple) -> tuple[int, str]:
    """(vocabulary, what was assumed) as Megatron builds it: --vocab-size, else --model's, else
    the tokenizer's (planner.megatron.tokenizers: a file here, then a table of well-known ones),
    else a bundled model named like the tokenizer. A tokenizer named by a value the script
    cannot know without running (a script argument not given) is asked for: given, its file
    could be counted."""
    if "vocab_size" in pf.values:
        return pf.values["vocab_size"], ""
    if vocab_model is not None:
        return vocab_model.vocab_size, f"vocabulary {vocab_model.vocab_size} from --model {vocab_model.name} (no --vocab-size)"
    if "tokenizer_type" in pf.unknown:
        raise _vocab_unknown(source, "--tokenizer-type", pf.unknown["tokenizer_type"], holders)
    tok, tmodel = val("tokenizer_type"), val("tokenizer_model")
    if tok in ("NullTokenizer", "NullMultimodalTokenizer"):
        # build_tokenizer.py hands --vocab-size to NullTokenizer, which takes int(vocab_size)
        raise SpecError(source, "--vocab-size", f"absent; --tokenizer-type {tok} takes its vocabulary from it: add --vocab-size N")
    flag = vocab_flag(tok, "vocab_file" in pf.given or "merge_file" in pf.given)
    dest = {"--vocab-file": "vocab_file", "--tokenizer-model": "tokenizer_model"}.get(flag)
    # Llama2Tokenizer's .model and TikTokenizer's file are not counted: their type sizes them
    if dest in pf.unknown and tok not in (*SENTENCEPIECE_TYPES, "TikTokenizer"):
        raise _vocab_unknown(source, flag, pf.unknown[dest], holders)
    found = vocab_of(tok, tmodel, val("vocab_file"), val("merge_file"), search_dirs)
    if found is not None:
        return found.size, f"vocabulary {found.size}: {found.how}; add --vocab-size if yours differs"
    bundled = _bundled_for_tokenizer(tok, tmodel)
    if bundled is not None:
        return bundled.vocab_size, (f"vocabulary {bundled.vocab_size} from bundled model {bundled.name} "
                                    f"(--tokenizer-model {tmodel}; no --vocab-size)")
    if tok is None:
        raise SpecError(source, "--vocab-size", "absent, and there is no --tokenizer-type (nor GPT-2 --vocab-file / "
                        "--merge-file) to size the vocabulary from: add --vocab-size N, or pass --model (a bundled "
                        "name or a config)")
    saw = f"--tokenizer-type {tok}" + (f" --tokenizer-model {tmodel}" if tmodel else "")
    raise SpecError(source, "--vocab-size", f"absent, and the vocabulary of {saw} is not known here (no tokenizer "
                    "file of it here to count, not in the planner's table of tokenizers): add --vocab-size N "
                    "(the tokenizer's length), or pass --model (a bundled name or a config)")


def _vocab_unknown(source: str, flag: str, names: tuple, holders: dict) -> SpecError:
    """The flag that names the vocabulary has a value the script cannot know without running:
    say what it is (the variable, the script argument that sets it) and the --set that gives it."""
    n = names[0]
    holder = holders.get(n)
    arg = re.fullmatch(r"\$\{?(\d+)\}?", n)
    if arg:
        what = (f"${holder}, set from the script's argument ${arg.group(1)}" if holder
                else f"the script's argument ${arg.group(1)}")
        key = arg.group(1)
    elif re.fullmatch(r"[A-Za-z_]\w*", n):
        what, key = f"${n}, which the script does not set", n
    else:
        what = (f"${holder}, " if holder else "") + f"the output of `{n}`, not run here"
        key = holder
    placeholder, wanted = _VOCAB_SOURCE_WANTED[flag]
    fix = f"--set {key}={placeholder} ({wanted})" if key else "write the value"
    return SpecError(source, "--vocab-size", f"absent, and {flag} is {what}: add {fix} or --vocab-size N")


def unknown_holders(variables: dict) -> dict:
    """Unknown value -> the first script variable that holds just it (VOCAB_FILE=$3: '$3' ->
    'VOCAB_FILE'), so that an error names the variable the launch line uses."""
    out: dict = {}
    for var, value in variables.items():
        if isinstance(value, Unknown):
            value = Partial((value,))
        if isinstance(value, Partial) and len(value.segments) == 1 and isinstance(value.segments[0], Unknown):
            out.setdefault(value.segments[0].name, var)
    return out


def _bundled_for_tokenizer(tok, tmodel) -> ModelSpec | None:
    """A bundled model whose name is the tokenizer's Hugging Face id (deepseek-ai/DeepSeek-V3
    -> deepseek-v3): its vocabulary."""
    if tok != "HuggingFaceTokenizer" or not tmodel:
        return None
    from ..library import bundled_model_names, load_model_ref
    key = tmodel.rstrip("/").split("/")[-1].lower()
    return load_model_ref(key) if key in bundled_model_names() else None
