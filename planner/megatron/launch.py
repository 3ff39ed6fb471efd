"""A Megatron-LM launch -> ModelSpec + Strategy.

The words come from planner.bash (a script, read without running it) or from a flags
file; the launcher in front of the training script (torchrun, `python -m torch.distributed.run`,
srun, ...) gives the world size; the flags after it are read with Megatron's own argument table
(planner.megatron.flags) and mapped onto the planner's model and strategy with Megatron's
defaults. What the planner cannot price is listed (`unpriced`), what it assumed is said
(`notes`), and flags that do not change the estimate are kept (`no_cost`).

This module reads a launch end to end and is where other code imports from; its parts live in
`launcher.py` (finding the launch in a script, the world size), `model_from_flags.py` (the
model and its vocabulary), `strategy_from_flags.py` (the strategy) and `launch_errors.py`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from ..bash import flag_words, is_flags_text
from ..errors import SpecError
from ..specs.model import ModelSpec
from ..strategy import Strategy
from .flags import ParsedFlags, parse_flags, table
from .launch_errors import InvalidLaunch, clean_unknown_name, unknown_value_error
from .launcher import GPT_ENTRIES, find_launch, refuse_other_family
from .model_from_flags import model_from_flags, unknown_holders
from .strategy_from_flags import strategy_from_flags

MAX_LAUNCH_BYTES = 1_000_000
# The caching allocator's settings; PyTorch reads PYTORCH_ALLOC_CONF first, then the older name
# (c10/core/AllocatorConfig.cpp). "expandable_segments:True" maps memory into growing segments.
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def v_has(pf: ParsedFlags, *dests: str) -> bool:
    return any(d in pf.values and pf.values[d] for d in dests)


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


# ---- flags -> model + strategy -------------------------------------------------------------

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
            raise unknown_value_error(source, given[dest], tuple(clean_unknown_name(n) for n in names))
    v = pf.values

    def val(dest, default=None):
        if dest in v:
            return v[dest]
        d = t.by_dest[dest].default
        return default if d is None else d

    model = model_from_flags(pf, val, source, name, notes, vocab_model, holders or {}, search_dirs)
    strategy, more_notes, unpriced_values = strategy_from_flags(v, val, model, world or default_world_size, source)
    notes.extend(more_notes)
    unpriced = [(given[d], t.by_dest[d].why) for d in given if t.by_dest[d].cost == "unmodelled"]
    unpriced.extend(unpriced_values)
    unpriced.extend(own_args)
    no_cost = tuple(given[d] for d in given if t.by_dest[d].cost == "no-cost")
    unknown_values = tuple((given[d], tuple(clean_unknown_name(n) for n in names)) for d, names in pf.unknown.items())
    if pf.passthrough:
        notes.append('the script passes its own arguments ("$@") to the launch: read as none')
    notes.extend(pf.notes)
    return MegatronLaunch(model=model, strategy=strategy, raw=dict(v), given=dict(given), world_size=world,
                          world_from=world_from, source=source, script_env=tuple(script_env), entry=entry,
                          notes=tuple(notes), unpriced=tuple(unpriced), no_cost=no_cost, unknown_values=unknown_values)



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
                            holders=unknown_holders(res.variables), search_dirs=search_dirs)
    else:
        refuse_other_family(found.entry_path, source)
        notes.extend(found.notes)
        # a NAME=value prefix on the launch command is the training process's environment too
        cmd_env = {k: x for k, x in found.env.items() if k in ("CUDA_DEVICE_MAX_CONNECTIONS",) and k not in script_env}
        script_env.update(cmd_env)
        script_env.update({k: x for k, x in found.prefix_env.items() if k in ALLOC_CONF_VARS})
        pf = parse_flags(found.args)
        launch = from_flags(pf, source, name, world=found.world, world_from=found.world_from,
                            default_world_size=default_world_size, vocab_model=vocab_model, notes=notes,
                            entry=found.entry, script_env=tuple(sorted(script_env.items())),
                            holders=unknown_holders(res.variables), search_dirs=search_dirs)
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
