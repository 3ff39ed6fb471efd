"""`planner check`: the CI gate over a Megatron launch (or a plan JSON)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..units import GIB
from ..errors import InvalidStrategy, SpecError
from ..strategy import FP8_RECIPES, PLAN_JSON_FIELDS, Strategy
from .flags import table
from .rules import RECOMPUTE_MODULES

if TYPE_CHECKING:
    from .launch import MegatronLaunch



def _annotate(kind: str, msg: str, file: str | None) -> None:
    if os.environ.get("GITHUB_ACTIONS") == "true":
        loc = f" file={file}" if file else ""
        print(f"::{kind}{loc}::{msg}")


# field -> default (None: required; "none": optional, null allowed)
_PLAN_INTS = {"tensor_model_parallel_size": None, "pipeline_model_parallel_size": None, "data_parallel_size": None,
              "context_parallel_size": 1, "expert_model_parallel_size": 1, "expert_tensor_parallel_size": "none",
              "virtual_pipeline_model_parallel_size": 1, "micro_batch_size": None, "global_batch_size": None,
              "seq_length": None, "recompute_num_layers": "none", "zero_stage": 1}
_PLAN_BOOLS = {"sequence_parallel": False, "overlap_grad_reduce": True, "overlap_param_gather": True,
               "offload_optimizer": False}
_PLAN_STRS = {"recompute": "none", "precision": "bf16", "schedule": "1f1b"}
# the plan JSON execution fields whose values are checked against Megatron's choices for their
# flag (flags_megatron.json); the fp8 recipe against those the cost model prices (no 'custom')
_PLAN_CHOICE_FIELDS = ("moe_token_dispatcher_type", "main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                       "exp_avg_sq_dtype", "moe_router_dtype")


def _plan_choices(key: str) -> tuple:
    """The values plan.<key> may take: Strategy's default (the flag unset) and the flag's choices."""
    if key == "fp8_recipe":
        return FP8_RECIPES
    return tuple(dict.fromkeys((getattr(Strategy(), key),) + table().by_dest[key].choices))
# plan JSON values are bounded like spec values: no degree or batch beyond this
_PLAN_MAX_INT = 10**8


def strategy_from_plan_json(path: str) -> Strategy:
    """The strategy of a plan JSON (`planner plan --json`, or plan.json from --emit); every
    field type-checked, so that a hand-edited file fails with the field's name (exit 2)."""
    from ..yamlio import load_file
    doc = load_file(path)
    if isinstance(doc, dict) and "plans" in doc:
        if not isinstance(doc["plans"], list) or not doc["plans"]:
            raise SpecError(path, "plans", "empty or not a list: no plan to check")
        doc = doc["plans"][0]
    if not isinstance(doc, dict) or not isinstance(doc.get("plan"), dict):
        raise SpecError(path, "plan", "expected a plan object as written by `planner plan --json`")
    p = doc["plan"]
    v: dict = {}
    for key, default in _PLAN_INTS.items():
        x = p.get(key, default)
        if default == "none" and x in (None, "none"):   # optional: null means unset
            v[key] = None
            continue
        if x is None:
            raise SpecError(path, f"plan.{key}", "required field is missing")
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= _PLAN_MAX_INT:
            raise SpecError(path, f"plan.{key}", f"found {x!r}, expected an integer in [0, {_PLAN_MAX_INT}]")
        v[key] = x
    for key, default in _PLAN_BOOLS.items():
        x = p.get(key, default)
        if not isinstance(x, bool):
            raise SpecError(path, f"plan.{key}", f"found {x!r}, expected true or false")
        v[key] = x
    for key, default in _PLAN_STRS.items():
        x = p.get(key, default)
        if not isinstance(x, str):
            raise SpecError(path, f"plan.{key}", f"found {x!r}, expected a string")
        v[key] = x
    stages = p.get("stages") or []
    if not isinstance(stages, list) or not all(isinstance(x, dict) for x in stages):
        raise SpecError(path, "plan.stages", "expected a list of stage objects")
    layers = None
    if stages:
        layers = tuple(x.get("layers") for x in stages)
        if not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= _PLAN_MAX_INT for n in layers):
            raise SpecError(path, "plan.stages[].layers", f"found {list(layers)!r}, expected positive integers")
    groups = None
    if stages and all(isinstance(x.get("node_group"), str) and "+" not in x["node_group"] for x in stages):
        groups = tuple(x["node_group"] for x in stages)
    execution = _plan_execution(path, p)
    chunks = p.get("chunk_layers")
    if chunks is not None:
        if not isinstance(chunks, list) or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= _PLAN_MAX_INT
                                                   for n in chunks):
            raise SpecError(path, "plan.chunk_layers", f"found {chunks!r}, expected a list of layer counts or null")
        chunks = tuple(chunks)
    return Strategy(
        tp=v["tensor_model_parallel_size"], pp=v["pipeline_model_parallel_size"], dp=v["data_parallel_size"],
        cp=v["context_parallel_size"], ep=v["expert_model_parallel_size"], etp=v["expert_tensor_parallel_size"],
        vpp=v["virtual_pipeline_model_parallel_size"], micro_batch_size=v["micro_batch_size"],
        global_batch_size=v["global_batch_size"], seq_length=v["seq_length"], recompute=v["recompute"],
        recompute_num_layers=v["recompute_num_layers"], sequence_parallel=v["sequence_parallel"],
        zero_stage=v["zero_stage"], precision=v["precision"], schedule=v["schedule"], layers_per_stage=layers,
        stage_node_groups=groups, overlap_grad_reduce=v["overlap_grad_reduce"],
        overlap_param_gather=v["overlap_param_gather"], offload_optimizer=v["offload_optimizer"], chunk_layers=chunks,
        **execution)


def _plan_execution(path: str, p: dict) -> dict:
    """The execution and recipe fields of a plan JSON's plan block (strategy.PLAN_JSON_FIELDS,
    recompute_modules, fp8_recipe, the token dispatcher), each type-checked; absent or null:
    Strategy's default (files written before they were)."""
    default = Strategy()
    out: dict = {}
    for key in PLAN_JSON_FIELDS:
        want = getattr(default, key)
        x = p.get(key, want)
        if type(x) is not type(want):
            raise SpecError(path, f"plan.{key}", f"found {x!r}, expected " +
                            ("true or false" if isinstance(want, bool) else "a string"))
        out[key] = x
    for key in ("fp8_recipe", "moe_token_dispatcher_type"):
        x = p.get(key)
        if x is not None:
            out[key] = x
    for key in ("fp8_recipe",) + _PLAN_CHOICE_FIELDS:
        allowed = _plan_choices(key)
        if key in out and out[key] not in allowed:
            raise SpecError(path, f"plan.{key}", f"found {out[key]!r}, expected one of {', '.join(allowed)}")
    mods = p.get("recompute_modules")
    if mods is not None:
        if not isinstance(mods, list) or not mods or not all(m in RECOMPUTE_MODULES for m in mods):
            raise SpecError(path, "plan.recompute_modules",
                            f"found {mods!r}, expected a list of {', '.join(RECOMPUTE_MODULES)} or null")
        out["recompute_modules"] = tuple(mods)
    return out


def parse_settings(items) -> dict:
    """--set NAME=VALUE (NAME a shell variable, or a digit for a script argument)."""
    import re
    out = {}
    for it in items or []:
        k, eq, v = it.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|[1-9][0-9]*", k):
            raise SpecError("--set", it, "expected NAME=VALUE (NAME a shell variable, or 1, 2, ... for the script's arguments)")
        out[k] = v
    return out


@dataclass(frozen=True)
class LoadedLaunch:
    launch: "MegatronLaunch"
    model: object
    strategy: Strategy
    placement: str          # which placement is priced, in words (empty: the one the launch names)


def load_launch(path: str, cluster, model_ref, world_size=None, settings: dict | None = None) -> LoadedLaunch:
    """A Megatron launch file -> what `check` and `estimate` price, the same for both. The world
    is --world-size if given, else the launcher's (torchrun, Slurm), else the whole cluster; dp
    follows. The placement priced is said, never chosen silently."""
    from ..library import load_model_ref
    from .launch import parse_file

    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise SpecError("--world-size", None, f"found {world_size!r}, expected an integer >= 1")
    given_model = load_model_ref(model_ref) if model_ref else None
    launch = parse_file(path, dict(os.environ), default_world_size=world_size or cluster.num_gpus,
                        settings=settings, vocab_model=given_model)
    notes = list(launch.notes)
    if world_size or launch.world_size is None:
        ws = world_size or cluster.num_gpus
        why = "--world-size" if world_size else f"the cluster's {cluster.num_gpus} GPUs"
        if launch.world_size is not None and world_size and world_size != launch.world_size:
            notes.append(f"world size {world_size} from --world-size (the launcher says {launch.world_size})")
        elif launch.world_size is None:
            notes.append(f"world size {ws} from {why} (the launch does not say)")
        s = launch.strategy
        if ws % (s.tp * s.pp * s.cp) == 0:
            s = replace(s, dp=ws // (s.tp * s.pp * s.cp))
            if "global_batch_size" not in launch.raw:
                s = replace(s, global_batch_size=s.micro_batch_size * s.dp)
        launch = replace(launch, world_size=ws, world_from=why, strategy=s)
    groups = launch.strategy.stage_node_groups
    names = [g.name for g in cluster.node_groups]
    placement = ""
    if groups and not all(g in names for g in groups):
        missing = sorted({g for g in groups if g not in names})
        placement = (f"the launch's stage-node-groups header names {', '.join(missing)}, which {cluster.name} does not "
                     f"have: priced with the stages filling {cluster.name}'s node groups in order ({', '.join(names)})")
        launch = replace(launch, strategy=replace(launch.strategy, stage_node_groups=None))
    elif not groups and cluster.is_heterogeneous:
        placement = (f"{cluster.name} has node groups {', '.join(names)} and the launch does not say which hosts each "
                     f"stage (no '# planner: stage-node-groups=' header): priced with the stages filling them in "
                     "that order")
    if launch.strategy.fused_attention:
        # the GPUs where the cost model prices this launch's attention unfused (one rule, there)
        from ..cost.activations import FUSED_ATTENTION_MIN_COMPUTE_CAPABILITY as sm_min, attention_on_gpu
        old = sorted({g.gpu.name for g in cluster.node_groups
                      if not attention_on_gpu(launch.strategy, g.gpu).fused_attention})
        if old:
            notes.append(f"attention on {', '.join(old)}: no fused attention kernels below sm{sm_min * 10:.0f} "
                         "(FlashAttention-2, cuDNN): priced unfused, the s x s scores kept"
                         + ("; an explicit --attention-backend " + launch.raw["attention_backend"]
                            + " fails there at run time" if launch.raw.get("attention_backend") in ("flash", "fused")
                            else ""))
    launch = replace(launch, notes=tuple(notes))
    model = given_model or launch.model
    return LoadedLaunch(launch, model, launch.strategy, placement)


def is_plan_json(path: str) -> bool:
    """Whether a file given as a plan or a launch is a plan JSON (it starts with '{')."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(4096).lstrip().startswith("{")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, None, f"cannot read: {exc}") from None


def load_plan_or_launch(path: str, cluster, model_ref):
    """`planner compare` inputs: a plan JSON (plan --json output, or plan.json from --emit) or
    a Megatron launch file -> (model, strategy)."""
    from ..library import load_model_ref

    if is_plan_json(path):
        return load_model_ref(model_ref or plan_model_ref(path)), strategy_from_plan_json(path)
    ld = load_launch(path, cluster, model_ref)
    return ld.model, ld.strategy


def plan_model_ref(path: str) -> str:
    """The model a plan JSON names (`plan --json`: plans[0].model, plan.json from --emit:
    model): its file when it was read from one that still exists, else its name (bundled)."""
    from ..yamlio import load_file
    doc = load_file(path)
    entry = doc["plans"][0] if isinstance(doc, dict) and isinstance(doc.get("plans"), list) and doc["plans"] else doc
    block = entry.get("model") if isinstance(entry, dict) else None
    if isinstance(block, dict):
        f, name = block.get("file"), block.get("name")
        if isinstance(f, str) and os.path.isfile(f):
            return f
        if isinstance(name, str) and name:
            return name
    raise SpecError("--model", None, f"required: {path} does not name its model")


def launch_report(ld: LoadedLaunch, verbose: bool) -> list[str]:
    """What `check` and `estimate` say about a launch besides the verdict: the placement priced,
    what was assumed, every flag not priced, and (verbose) the flags that change nothing."""
    L = ld.launch
    lines = []
    if ld.placement:
        lines.append(f"placement: {ld.placement}")
    for flag, why in L.unpriced:
        lines.append(f"not priced: {flag} ({why})")
    for n in L.notes:
        lines.append(f"assumed: {n}")
    if L.world_from:
        lines.append(f"world size {L.world_size}: {L.world_from}")
    if verbose:
        if L.no_cost:
            lines.append("read, no effect on memory or step time: " + " ".join(L.no_cost))
        for flag, names in L.unknown_values:
            lines.append(f"value not known (no effect on the estimate): {flag} depends on {', '.join(names)}")
    return lines


def launch_json(ld: LoadedLaunch) -> dict:
    L = ld.launch
    return {"world_size": L.world_size, "world_from": L.world_from, "placement": ld.placement or None,
            "unpriced_flags": [{"flag": f, "why": w} for f, w in L.unpriced], "notes": list(L.notes),
            "no_cost_flags": list(L.no_cost), "entry": L.entry or None,
            "megatron_lm_commit": _table_commit()}


def _table_commit() -> str:
    from .flags import table
    return table().commit


def run_check(cluster_ref, megatron_args, plan_file, model_ref, world_size, as_json, console,
              settings: dict | None = None, verbose: bool = False) -> int:
    from ..estimate import estimate
    from ..library import load_cluster_ref, load_model_ref
    from .launch import InvalidLaunch
    from .rules import megatron_violations

    if bool(megatron_args) == bool(plan_file):
        raise SpecError("planner check", None, "give exactly one of --megatron-args or --plan")
    cluster = load_cluster_ref(cluster_ref)
    src = megatron_args or plan_file
    result = {"file": src, "valid": True, "fits": None, "violations": [], "stages": []}
    extra: list[str] = []
    if megatron_args:
        try:
            ld = load_launch(megatron_args, cluster, model_ref, world_size, settings)
        except InvalidLaunch as exc:
            return _invalid(result, [f"[{r}] {m}" for r, m in exc.problems], src, as_json, console)
        model, strategy = ld.model, ld.strategy
        viol = megatron_violations(ld.launch, model)
        result.update(launch_json(ld))
        extra = launch_report(ld, verbose)
    else:
        model = load_model_ref(model_ref or plan_model_ref(plan_file))
        strategy = strategy_from_plan_json(plan_file)
        viol = []
        from .emit import megatron_args as build
        from .launch import parse_words
        try:
            args = build(model, strategy)
            viol = megatron_violations(parse_words(args, src, world_size=strategy.world_size), model)
        except InvalidStrategy as exc:
            viol = [exc]
    if viol:
        return _invalid(result, [str(v) for v in viol], src, as_json, console, extra)
    try:
        e = estimate(model, cluster, strategy)
    except InvalidStrategy as exc:
        return _invalid(result, [str(exc)], src, as_json, console, extra)
    result["fits"] = e.fits
    result["verdict"] = e.memory_verdict
    result["step_time_s"] = e.step_time_s
    result["mfu"] = e.mfu
    result["mfu_basis"] = e.mfu_basis
    result["model_tflops_per_gpu"] = e.model_tflops_per_gpu
    result["memory_uncertainty_fraction"] = e.memory[0].uncertainty
    result["expandable_segments"] = strategy.expandable_segments
    result["allocator_fragmentation_spread_fraction"] = e.memory[0].allocator_spread
    for m in e.memory:
        result["stages"].append({"stage": m.stage, "node_group": m.node_group, "needed_bytes": m.total,
                                 "usable_bytes": m.capacity, "headroom_bytes": m.headroom, "fits": m.fits,
                                 "verdict": m.verdict, "margin_bytes": m.margin_bytes,
                                 "device_bytes": m.device_bytes, "device_total_bytes": m.device_total})
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    unc = f"the model's uncertainty is {e.memory[0].uncertainty * 100:.0f}% ({'MoE' if model.is_moe else 'dense'})"
    if not e.fits:
        for m in e.memory:
            if not m.fits:
                msg = (f"stage {m.stage} ({m.node_group}) needs {m.total / GIB:.1f} GiB, "
                       f"{m.capacity / GIB:.1f} GiB usable ({(m.total - m.capacity) / GIB:.1f} GiB short; "
                       f"{m.device_total / GIB:.1f} of the device's {m.device_bytes / GIB:.1f} GiB with "
                       f"context, NCCL and fragmentation; {unc})")
                _annotate("error", f"does not fit: {msg}", src)
                if not as_json:
                    console.print(f"DOES NOT FIT {src}: {msg}", markup=False)
        _print_extra(extra, as_json, console)
        return 1
    worst = min(e.memory, key=lambda m: m.headroom - m.margin_bytes)
    heads = ", ".join(f"stage {m.stage}: {m.headroom / GIB:.1f} GiB" for m in e.memory)
    tail = (f"step {e.step_time_s:.3f} s, {e.model_tflops_per_gpu:.0f} model TFLOP/s/GPU, {e.mfu_label}")
    if e.memory_verdict == "tight":
        allocator = (f", and {worst.allocator_spread * 100:.0f}% for the default caching allocator's fragmentation: "
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True removes that part" if worst.allocator_spread else "")
        msg = (f"stage {worst.stage} fits by {worst.headroom / GIB:.1f} GiB, less than the model's margin of "
               f"{worst.margin_bytes / GIB:.1f} GiB ({unc}{allocator}): it may run out of memory")
        _annotate("warning", f"tight: {msg}", src)
        if not as_json:
            console.print(f"TIGHT {src}: valid; {msg}; headroom per stage: {heads}; {tail}", markup=False)
    elif not as_json:
        console.print(f"FITS {src}: valid, and fits with the model's margin ({unc}); headroom per stage: "
                      f"{heads}; {tail}", markup=False)
    _print_extra(extra, as_json, console)
    return 0


def _print_extra(lines, as_json, console) -> None:
    if not as_json:
        for ln in lines:
            console.print(f"  {ln}", markup=False, highlight=False)


def _invalid(result, messages, src, as_json, console, extra=()) -> int:
    """The INVALID verdict: on stdout with the others (the exit code is the machine signal)."""
    result["valid"] = False
    result["violations"] = list(messages)
    for v in messages:
        _annotate("error", f"Megatron would reject this launch: {v}", src)
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        for v in messages:
            console.print(f"INVALID {src}: {v}", markup=False, highlight=False)
        _print_extra(extra, False, console)
    return 1
