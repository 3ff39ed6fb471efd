"""A Megatron-LM launch -> ModelSpec + Strategy.

The words come from planner.bash (a script, read without running it) or from a flags
file; the launcher in front of the training script (torchrun, `python -m torch.distributed.run`,
srun, ...) gives the world size; the flags after it are read with Megatron's own argument table
(planner.megatron.flags) and mapped onto the planner's model and strategy with Megatron's
defaults. What the planner cannot price is listed (`unpriced`), what it assumed is said
(`notes`), and flags that do not change the estimate are kept (`no_cost`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..bash import Partial, Unknown, flag_words, is_flags_text, read_script
from ..bash.slurm import sbatch_options
from ..errors import InvalidStrategy, SpecError
from ..specs.model import ModelSpec, model_from_dict
from ..strategy import Strategy
from .flags import ParsedFlags, Word, parse_flags, table
from .layout import LayoutError, parse_layout, rank_sums, split_chunk_layers
from .tokenizers import GPT2_BPE_VOCAB_SIZE, SENTENCEPIECE_TYPES, vocab_flag, vocab_of  # noqa: F401 (re-exported)

MAX_LAUNCH_BYTES = 1_000_000
# Megatron's defaults that differ from the planner's own Strategy defaults (arguments.py /
# transformer_config.py at the table's commit): read from the table, named here for clarity
ATTENTION_BACKEND_FUSED = {"flash": True, "fused": True, "auto": True, "unfused": False, "local": False}
FSDP_ZERO_STAGE = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
# launchers whose options come before the training script
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?$")
_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"}
_WRAPPERS_SCAN = {"nsys", "numactl", "uv", "env", "exec", "time", "nohup", "taskset", "stdbuf", "ncu", "apptainer",
                  "singularity", "docker", "enroot", "mpirun", "mpiexec"}
# The caching allocator's settings; PyTorch reads PYTORCH_ALLOC_CONF first, then the older name
# (c10/core/AllocatorConfig.cpp). "expandable_segments:True" maps memory into growing segments.
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
# the end of shell.py's note on a `source FILE` whose path depends on a value not known
UNREAD_SOURCE = "the path cannot be known without running it; not read"
_ENTRY_HINT = re.compile(r"^(pretrain|train|finetune)")
GPT_ENTRIES = ("pretrain_gpt.py",)
# Megatron-LM's training scripts of other model families (its root, examples/ and their older
# names), by file name or by the end of their path -> the family, named when refusing them
OTHER_FAMILIES = {
    "pretrain_t5.py": "T5 (encoder-decoder)",
    "pretrain_bert.py": "BERT (encoder-only)",
    "pretrain_retro.py": "RETRO (retrieval-augmented)",
    "pretrain_ict.py": "ICT (BERT retriever)",
    "pretrain_mamba.py": "Mamba (state-space)",
    "pretrain_hybrid.py": "hybrid Mamba-Transformer",
    "pretrain_vlm.py": "vision-language (multimodal)",
    "pretrain_vision_classify.py": "vision transformer (classifier)",
    "pretrain_vision_dino.py": "vision transformer (DINO)",
    "pretrain_vision_inpaint.py": "vision transformer (inpainting)",
    "pretrain_mimo.py": "MIMO (multimodal)",
    "examples/mimo/train.py": "MIMO (multimodal)",
    "examples/multimodal/train.py": "LLaVA-style vision-language (multimodal)",
}


def v_has(pf: ParsedFlags, *dests: str) -> bool:
    return any(d in pf.values and pf.values[d] for d in dests)


class InvalidLaunch(InvalidStrategy):
    """Launch arguments Megatron-LM's argparse or validate_args would refuse (exit 1); every
    problem found, one line each."""

    def __init__(self, problems: list[tuple[str, str]], source: str):
        self.problems = problems
        self.source = source
        rule, msg = problems[0]
        super().__init__(rule, msg + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


@dataclass(frozen=True)
class MegatronLaunch:
    model: ModelSpec
    strategy: Strategy
    raw: dict                           # dest -> value for every flag given (Megatron's dest names)
    given: dict                         # dest -> the option as written
    world_size: int | None              # from the launcher, if it says
    source: str
    world_from: str = ""                # how the world size was found
    script_env: tuple = ()              # (name, value | None): what the script exports / unsets
    entry: str = ""                     # the training script
    notes: tuple[str, ...] = ()         # what was assumed while reading
    unpriced: tuple[tuple[str, str], ...] = ()   # (flag, why): read, changes memory/time, not priced
    no_cost: tuple[str, ...] = ()       # flags read that do not change memory or step time
    unknown_values: tuple[tuple[str, tuple[str, ...]], ...] = ()   # no-cost flags whose value is unknown

    def value(self, dest: str):
        """A flag's value as Megatron sees it: given, else the table's default."""
        if dest in self.raw:
            return self.raw[dest]
        return table().by_dest[dest].default


# ---- finding the launch in a script --------------------------------------------------------

@dataclass
class _Found:
    args: list[Word]
    launcher: list[Word]
    entry: str
    line: int
    wrappers: list
    env: dict
    world: int | None = None
    world_from: str = ""
    notes: list = field(default_factory=list)
    prefix_env: dict = field(default_factory=dict)   # NAME=value words before the launch command
    entry_path: str = ""                              # the training script as written


def _basename(w: Word) -> str:
    return os.path.basename(w.text)


def _find_entry(words: list[Word]) -> int | None:
    """Index of the training script: the first word ending in .py after the launcher programs
    (python, torchrun, srun, ...) or a `-m torch.distributed.run` module."""
    for i, w in enumerate(words):
        if w.text.endswith(".py") and not w.text.startswith("-"):
            return i
    return None


def _option_value(words: list[str], names: tuple[str, ...]) -> str | None:
    val = None
    for i, w in enumerate(words):
        k, eq, v = w.partition("=")
        if k in names:
            val = v if eq else (words[i + 1] if i + 1 < len(words) else None)
    return val


def _world_from_launcher(f: _Found, sbatch: dict) -> None:
    texts = [w.text for w in f.launcher]
    unknown = {w.text: w.unknown for w in f.launcher if w.unknown}
    torchrun = any(_basename(w) == "torchrun" for w in f.launcher) or \
        any(t in ("torch.distributed.run", "torch.distributed.launch") for t in texts)
    if torchrun:
        nn = _option_value(texts, ("--nnodes",))
        npn = _option_value(texts, ("--nproc-per-node", "--nproc_per_node"))
        if nn is None:
            nn = "1"      # torchrun's default
        if npn is None:
            npn = "1"
        if nn and ":" in nn:
            f.notes.append(f"torchrun --nnodes {nn} is elastic: priced at its maximum")
            nn = nn.split(":")[-1]
        if nn in unknown or npn in unknown or not (nn.isdigit() and npn.isdigit()):
            bad = [x for x in (nn, npn) if not x.isdigit()]
            names = [n for x in bad for n in unknown.get(x, ())]
            f.notes.append("torchrun's --nnodes / --nproc-per-node " + (
                f"depend on {', '.join(names)}, not set here" if names else f"are {', '.join(bad)}") +
                ": world size from --world-size or the cluster (or --set them)")
            return
        f.world, f.world_from = int(nn) * int(npn), f"torchrun --nnodes {nn} --nproc-per-node {npn}"
        return
    # one process per Slurm task: srun python pretrain_gpt.py (here or around a bash -c)
    sruns = [w for w in f.wrappers if w.program == "srun"]
    srun_words = [x.text for w in sruns for x in w.words]
    if any(_basename(w) == "srun" for w in f.launcher):
        srun_words += texts
    if srun_words or any(w.program == "sbatch" for w in f.wrappers):
        opts = dict(sbatch)
        opts.update(sbatch_options(srun_words))
        env = f.env

        def pick(env_names, opt):
            # the job's own SLURM_* variables (or --set) first, then srun's flags, then #SBATCH
            for n in env_names:
                if str(env.get(n, "")).isdigit():
                    return env[n]
            return opts.get(opt)
        nodes = pick(("SLURM_NNODES", "SLURM_JOB_NUM_NODES"), "--nodes")
        tpn = pick(("SLURM_NTASKS_PER_NODE",), "--ntasks-per-node")
        ntasks = pick(("SLURM_NTASKS",), "--ntasks")
        if ntasks and str(ntasks).isdigit():
            f.world, f.world_from = int(ntasks), f"Slurm tasks ({ntasks})"
            return
        if nodes and tpn and str(nodes).isdigit() and str(tpn).isdigit():
            f.world, f.world_from = int(nodes) * int(tpn), f"Slurm {nodes} nodes x {tpn} tasks per node"
            return
        f.notes.append(f"Slurm job size not known (--nodes={nodes or '?'}, --ntasks-per-node={tpn or '?'}): "
                       "world size from --world-size or the cluster (or --set SLURM_NNODES=.. SLURM_NTASKS_PER_NODE=..)")
        return
    ws = f.env.get("WORLD_SIZE")
    if ws and ws.isdigit():
        f.world, f.world_from = int(ws), "WORLD_SIZE"
        return
    if f.launcher:
        f.notes.append(f"the launcher ({' '.join(texts[:3])}) does not say the world size: from --world-size or the cluster")


def find_launch(text: str, source: str, env: dict, base_dir: Path | None, args: list[str] | None = None,
                pins: dict | None = None):
    """(found launch or None, shell result)."""
    res = read_script(text, source, env, base_dir, args, pins)
    cands = []
    for c in res.commands:
        i = _find_entry(c.words)
        if i is None:
            continue
        head = c.words[:i]
        # a bare `.py` word after a non-launcher (echo x.py, cp a.py b) is not a launch
        progs = [_basename(w) for w in head]
        if head and not (any(_PYTHON.match(p) or p in ("torchrun", "srun", "uv", "deepspeed") or p in _WRAPPERS_SCAN
                             for p in progs) or head[0].unknown):
            continue
        cands.append((c, i))
    if not cands:
        return None, res
    pick = [x for x in cands if _ENTRY_HINT.match(_basename(x[0].words[x[1]]))]
    if not pick:
        names = sorted({x[0].words[x[1]].text for x in cands})
        raise SpecError(source, None, f"no Megatron-LM training launch found: it runs {', '.join(names)} "
                        "(not a pretrain_*.py / train_*.py / finetune*.py script)")
    c, i = pick[-1]
    penv = dict(env)
    penv.update({k: v for k, v in res.variables.items() if isinstance(v, str)})
    penv.update({k: v for k, v in c.env.items() if isinstance(v, str)})
    f = _Found(args=c.words[i + 1:], launcher=c.words[:i], entry=_basename(c.words[i]), line=c.line,
               wrappers=c.wrappers, env=penv, prefix_env={k: v for k, v in c.env.items() if isinstance(v, str)},
               entry_path=c.words[i].text)
    if len(cands) > 1:
        f.notes.append(f"{len(cands)} commands run a Python script; read the training launch at line {c.line}")
    _world_from_launcher(f, res.sbatch)
    if f.world is not None and f.world < 1:
        # torchrun --nnodes 0, srun --ntasks 0: no rank would start
        raise SpecError(source, "world size", f"{f.world_from} starts {f.world} processes; expected at least 1")
    return f, res


# ---- flags -> model + strategy -------------------------------------------------------------

def _unknown_msg(source: str, opt: str, names: tuple[str, ...]) -> SpecError:
    shown = ", ".join(names)
    plain = [n for n in names if re.fullmatch(r"[A-Za-z_]\w*|\d+", n)]
    how = (" ".join(f"--set {n}=VALUE" for n in plain) + (" (or export it)" if len(plain) == 1 else " (or export them)")
           if len(plain) == len(names) else "write the value, or --set the variable it is assigned to")
    return SpecError(source, opt, f"its value depends on {shown}, which cannot be known without running the script; {how}")


def _clean(name: str) -> str:
    """$TP / ${TP} / $1 -> TP / 1; a command substitution stays as written."""
    return name[1:].strip("{}") if re.fullmatch(r"\$\{?([A-Za-z_]\w*|\d+)\}?", name) else name


def from_flags(pf: ParsedFlags, source: str, name: str, world: int | None = None, world_from: str = "",
               default_world_size: int | None = None, vocab_model: ModelSpec | None = None,
               notes: list | None = None, entry: str = "", script_env: tuple = (),
               holders: dict | None = None, search_dirs: tuple = ()) -> MegatronLaunch:
    """Megatron's flags (parsed with its table) -> MegatronLaunch. `vocab_model`: the model
    whose vocabulary to use when --vocab-size is absent (--model). `entry`: the training script;
    one other than pretrain_gpt.py may add arguments of its own, so flags the table does not
    know are listed as not priced instead of refused. `holders`: unknown value -> the script
    variable holding it, to name in errors; `search_dirs`: where a tokenizer file named by a
    relative path is looked for (the script's folder)."""
    t = table()
    notes = list(notes or [])
    own_args: list[tuple[str, str]] = []
    if pf.unrecognized:
        if entry and entry not in GPT_ENTRIES:
            own_args = [(u, f"not an argument of pretrain_gpt.py: {entry}'s own?") for u, _ in pf.unrecognized
                        if u.startswith("-")]
        else:
            pf.errors[:0] = pf.unrecognized_messages()
    if pf.errors:
        raise InvalidLaunch(pf.errors, source)
    if v_has(pf, "hybrid_layer_pattern", "is_hybrid_model"):
        raise SpecError(source, "--hybrid-layer-pattern", "a hybrid Mamba-Transformer is not a decoder-only GPT "
                        "model; the planner reads pretrain_gpt.py launches")
    given = pf.given
    for dest, names in pf.unknown.items():
        f = t.by_dest[dest]
        if f.cost in ("model", "strategy"):
            raise _unknown_msg(source, given[dest], tuple(_clean(n) for n in names))
    v = pf.values

    def val(dest, default=None):
        if dest in v:
            return v[dest]
        d = t.by_dest[dest].default
        return default if d is None else d

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
    m["vocab_size"], vocab_note = _vocabulary(pf, val, source, vocab_model, holders or {}, search_dirs)
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

    strategy, more_notes, unpriced_values = _strategy(v, val, model, world or default_world_size, source)
    notes.extend(more_notes)
    unpriced = [(given[d], t.by_dest[d].why) for d in given if t.by_dest[d].cost == "unmodelled"]
    unpriced.extend(unpriced_values)
    unpriced.extend(own_args)
    no_cost = tuple(given[d] for d in given if t.by_dest[d].cost == "no-cost")
    unknown_values = tuple((given[d], tuple(_clean(n) for n in names)) for d, names in pf.unknown.items())
    if pf.passthrough:
        notes.append('the script passes its own arguments ("$@") to the launch: read as none')
    notes.extend(pf.notes)
    return MegatronLaunch(model=model, strategy=strategy, raw=dict(v), given=dict(given), world_size=world,
                          world_from=world_from, source=source, script_env=tuple(script_env), entry=entry,
                          notes=tuple(notes), unpriced=tuple(unpriced), no_cost=no_cost, unknown_values=unknown_values)


_MODEL_FIELD_FLAG = {"moe_capacity_factor": "--moe-expert-capacity-factor", "swiglu": "--swiglu",
                     "moe_layer_freq": "--moe-layer-freq"}


def _flag_of(model_field: str | None) -> str:
    if not model_field:
        return "model"
    return _MODEL_FIELD_FLAG.get(model_field, "--" + model_field.replace("_", "-"))


def _refuse_other_family(entry: str, source: str) -> None:
    """A training script of another model family (T5, BERT, Mamba, multimodal, ...) is refused
    by name: its model is not the decoder-only GPT the planner prices, and reading its flags as
    one would price something else."""
    for key, family in OTHER_FAMILIES.items():
        if os.path.basename(entry) == key or ("/" in key and (entry == key or entry.endswith("/" + key))):
            raise SpecError(source, None, f"{key}: {family} is not a decoder-only GPT model; "
                            "the planner reads pretrain_gpt.py launches")


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


def _holders(variables: dict) -> dict:
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


def _strategy(v: dict, val, model: ModelSpec, world: int | None, source: str):
    notes: list[str] = []
    unpriced: list[tuple[str, str]] = []
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
    dp = world // (tp * pp * cp) if world and world % (tp * pp * cp) == 0 else 0
    mbs = val("micro_batch_size", 1)
    gbs = val("global_batch_size") or mbs * max(dp, 1)
    # recompute
    gran = "selective" if val("recompute_activations") else val("recompute_granularity")
    recompute = {"selective": "selective", "full": "full"}.get(gran, "none")
    method, rnl = val("recompute_method"), val("recompute_num_layers")
    recompute_num_layers = rnl if recompute == "full" and method == "block" else None
    if recompute == "full" and method == "uniform" and rnl and rnl > 1:
        unpriced.append(("--recompute-num-layers", f"uniform recompute of groups of {rnl} layers keeps one "
                         "input per group; priced as one per layer"))
    modules = tuple(val("recompute_modules") or ("core_attn",))
    # precision
    if val("fp8") is not None:
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
    # pipeline split
    L = model.num_layers
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
    is_moe = model.is_moe
    moe_kw = {}
    if is_moe:
        moe_kw = dict(moe_token_dispatcher_type=val("moe_token_dispatcher_type"),
                      moe_grouped_gemm=bool(val("moe_grouped_gemm")),
                      moe_pad_expert_input_to_capacity=bool(val("moe_pad_expert_input_to_capacity")),
                      overlap_moe_expert_parallel_comm=bool(val("overlap_moe_expert_parallel_comm")),
                      moe_shared_expert_overlap=bool(val("moe_shared_expert_overlap")),
                      moe_router_dtype=val("moe_router_dtype") or "bf16",
                      moe_permute_fusion=bool(val("moe_permute_fusion")))
    # CUDA graphs: --cuda-graph-impl (or the older --enable-cuda-graph = local) over the modules
    # of --cuda-graph-modules / --cuda-graph-scope (default: whole layers)
    graph_impl = val("cuda_graph_impl") or "none"
    if val("enable_cuda_graph") and graph_impl == "none":
        graph_impl = "local"
    scope_words = []
    for x in (val("cuda_graph_modules") or val("cuda_graph_scope_deprecated") or []):
        scope_words += [w for w in str(x).replace(",", " ").split() if w]
    if graph_impl == "full_iteration":
        scope_words = ["full_iteration"]
    s = Strategy(
        tp=tp, pp=pp, dp=max(dp, 1), cp=cp, ep=ep, etp=val("expert_tensor_parallel_size"), vpp=vpp,
        microbatch_group_size_per_vp_stage=val("microbatch_group_size_per_vp_stage") if vpp > 1 else None,
        micro_batch_size=mbs, global_batch_size=gbs,
        seq_length=val("seq_length") or model.max_position_embeddings,
        recompute=recompute, recompute_num_layers=recompute_num_layers,
        sequence_parallel=bool(val("sequence_parallel")), zero_stage=zero, precision=precision,
        schedule="interleaved" if vpp > 1 else "1f1b", layers_per_stage=layers_per_stage,
        overlap_grad_reduce=bool(val("overlap_grad_reduce")), overlap_param_gather=bool(val("overlap_param_gather")),
        tp_comm_overlap=bool(val("tp_comm_overlap")), fused_attention=fused,
        offload_optimizer=bool(val("optimizer_cpu_offload")),
        optimizer_offload_fraction=float(val("optimizer_offload_fraction")),
        grad_reduce_in_bf16=bool(val("grad_reduce_in_bf16")),
        **_state_dtypes(val),
        recompute_modules=modules, cpu_offloading_num_layers=val("cpu_offloading_num_layers"),
        fp8_recipe=val("fp8_recipe"), fp8_param_gather=bool(val("fp8_param_gather")),
        delay_wgrad_compute=bool(val("delay_wgrad_compute")), chunk_layers=chunk_layers,
        use_precision_aware_optimizer=bool(val("use_precision_aware_optimizer")),
        cuda_graph_impl=graph_impl, cuda_graph_scope=tuple(scope_words), **moe_kw)
    return s, notes, unpriced


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


# ---- entry points --------------------------------------------------------------------------

_STAGE_GROUPS = re.compile(r"^#\s*planner: stage-node-groups=([A-Za-z0-9._,-]+)\s*$", re.M)


def parse_words(words, source: str, name: str = "megatron-launch", world_size: int | None = None,
                default_world_size: int | None = None, vocab_model: ModelSpec | None = None) -> MegatronLaunch:
    """Flags only (no launcher): `world_size` is the world."""
    pf = parse_flags(list(words))
    return from_flags(pf, source, name, world=world_size, world_from="--world-size" if world_size else "",
                      default_world_size=default_world_size, vocab_model=vocab_model)


def _refuse_nul(text: str, source: str) -> None:
    """A NUL byte is no part of a shell script: bash drops it from the line (so Megatron would get
    another value than the file shows), and no argument of a process can hold one."""
    i = text.find("\0")
    if i < 0:
        return
    from ..inputs import printable
    line_no = text.count("\n", 0, i) + 1
    line = text[text.rfind("\n", 0, i) + 1:].split("\n", 1)[0]
    words = line.split()
    k = next(j for j, w in enumerate(words) if "\0" in w)
    flag = next((w for w in reversed(words[:k + 1]) if w.startswith("--")), None)
    where = f", the value of {printable(flag.split('=', 1)[0])}" if flag else ""
    raise SpecError(printable(source), f"line {line_no}", f"a NUL byte (\\x00) in '{printable(words[k])}'{where}; "
                    "expected text without NUL bytes (bash drops them; no process argument can hold one)")


def parse_text(text: str, source: str, env: dict | None = None, default_world_size: int | None = None,
               base_dir: Path | None = None, settings: dict | None = None,
               vocab_model: ModelSpec | None = None) -> MegatronLaunch:
    """A launch script or a flags file. `env`: the environment the script starts with
    (os.environ when None); `settings`: --set NAME=VALUE (they win over the environment and
    over values the script cannot know; digits name script arguments). A
    `# planner: stage-node-groups=a,b,...` header (written by `plan --emit`) says which node
    group hosts each pipeline stage."""
    _refuse_nul(text, source)
    env = dict(os.environ) if env is None else dict(env)
    settings = dict(settings or {})
    args = []
    k = 1
    while str(k) in settings:
        args.append(settings.pop(str(k)))
        k += 1
    env.update(settings)
    name = Path(source).stem or "launch"
    search_dirs = (base_dir,) if base_dir else ()
    if is_flags_text(text):
        pf = parse_flags(flag_words(text, source, env))
        launch = from_flags(pf, source, name, default_world_size=default_world_size, vocab_model=vocab_model,
                            search_dirs=search_dirs)
        return _with_stage_groups(_with_allocator(launch, {}, env), text, source)
    found, res = find_launch(text, source, env, base_dir, args, settings)
    notes = list(res.notes)
    script_env = {k: (v if isinstance(v, str) else None) for k, v in res.exported.items()
                  if v is None or isinstance(v, str)}
    if found is None:
        # a flags file: every word is a flag (variables from the environment only)
        words = [w for c in res.commands for w in c.words]
        starts_with_flag = bool(words) and words[0].text.startswith("--")
        if not starts_with_flag:
            vars_set = sorted(k for k, x in res.variables.items()
                              if "--num-layers" in (x if isinstance(x, str) else getattr(x, "text", "")))
            hint = (f"; it sets {', '.join(vars_set)} (a fragment for another script to source?)" if vars_set else "")
            raise SpecError(source, None, "no Megatron-LM launch found (no torchrun / python ... pretrain_*.py "
                            "command, and not a flags file)" + hint)
        pf = parse_flags(words)
        launch = from_flags(pf, source, name, default_world_size=default_world_size, vocab_model=vocab_model,
                            notes=notes, script_env=tuple(sorted(script_env.items())),
                            holders=_holders(res.variables), search_dirs=search_dirs)
    else:
        _refuse_other_family(found.entry_path, source)
        notes.extend(found.notes)
        # a NAME=value prefix on the launch command is the training process's environment too
        cmd_env = {k: x for k, x in found.env.items() if k in ("CUDA_DEVICE_MAX_CONNECTIONS",) and k not in script_env}
        script_env.update(cmd_env)
        script_env.update({k: x for k, x in found.prefix_env.items() if k in ALLOC_CONF_VARS})
        pf = parse_flags(found.args)
        launch = from_flags(pf, source, name, world=found.world, world_from=found.world_from,
                            default_world_size=default_world_size, vocab_model=vocab_model, notes=notes,
                            entry=found.entry, script_env=tuple(sorted(script_env.items())),
                            holders=_holders(res.variables), search_dirs=search_dirs)
        if found.entry not in ("pretrain_gpt.py",):
            launch = replace(launch, notes=launch.notes + (f"entry script {found.entry}: the planner prices "
                                                           "pretrain_gpt.py's decoder-only GPT",))
    launch = _with_allocator(launch, script_env, env)
    return _with_stage_groups(launch, text, source)


def _with_allocator(launch: MegatronLaunch, script_env: dict, env: dict) -> MegatronLaunch:
    """expandable_segments from the allocator setting the training process gets: what the script
    exports (or sets on the launch command), else the environment it starts with (--set)."""
    where, conf = None, None
    for scope, d in (("the script", script_env), ("the environment", env)):
        for var in ALLOC_CONF_VARS:
            if var in d:
                where, conf = f"{var} from {scope}", d[var]
                break
        if where:
            break
    opts = dict(kv.split(":", 1) for kv in (conf or "").replace(" ", "").split(",") if ":" in kv)
    on = opts.get("expandable_segments", "").lower() == "true"
    if on:
        note = f"allocator: expandable segments ({where})"
    else:
        from ..cost.memory import DEFAULT_ALLOCATOR_FRAGMENTATION_SPREAD as spread
        note = (f"allocator: PyTorch's default caching allocator (no PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
                f"{'; ' + where + ' is ' + repr(conf) if where else ''}): the memory verdict's margin adds "
                f"{spread * 100:.0f}% for its fragmentation")
    return replace(launch, strategy=replace(launch.strategy, expandable_segments=on), notes=launch.notes + (note,))


def _with_stage_groups(launch: MegatronLaunch, text: str, source: str) -> MegatronLaunch:
    m = _STAGE_GROUPS.search(text)
    if m:
        groups = tuple(m.group(1).split(","))
        if len(groups) != launch.strategy.pp:
            raise SpecError(source, "stage-node-groups", f"names {len(groups)} groups, the launch has "
                            f"pipeline_model_parallel_size {launch.strategy.pp}")
        launch = replace(launch, strategy=replace(launch.strategy, stage_node_groups=groups))
    return launch


def parse_file(path: str | Path, env: dict | None = None, default_world_size: int | None = None,
               settings: dict | None = None, vocab_model: ModelSpec | None = None) -> MegatronLaunch:
    from ..inputs import printable, read_regular_file
    p = Path(path)
    # a folder, a FIFO or a device is named for what it is (a FIFO is never opened)
    raw = read_regular_file(p, MAX_LAUNCH_BYTES, "a Megatron-LM launch script or flags file (at most 1 MB)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(printable(path), None, f"cannot read as UTF-8 text: {exc}") from None
    return parse_text(text, str(path), env, default_world_size, base_dir=p.resolve().parent, settings=settings,
                      vocab_model=vocab_model)
