"""`planner check`: the CI gate over a Megatron launch (or a plan JSON)."""

from __future__ import annotations

import json
import os

from ..errors import InvalidStrategy, SpecError
from ..strategy import Strategy

GIB = 2**30


def _annotate(kind: str, msg: str, file: str | None) -> None:
    if os.environ.get("GITHUB_ACTIONS") == "true":
        loc = f" file={file}" if file else ""
        print(f"::{kind}{loc}::{msg}")


def strategy_from_plan_json(path: str) -> Strategy:
    from ..yamlio import load_file
    doc = load_file(path)
    if isinstance(doc, dict) and "plans" in doc:
        if not doc["plans"]:
            raise SpecError(path, "plans", "empty: no plan to check")
        doc = doc["plans"][0]
    if not isinstance(doc, dict) or not isinstance(doc.get("plan"), dict):
        raise SpecError(path, "plan", "expected a plan object as written by `planner plan --json`")
    p = doc["plan"]
    try:
        stages = p.get("stages") or []
        return Strategy(
            tp=p["tensor_model_parallel_size"], pp=p["pipeline_model_parallel_size"],
            dp=p["data_parallel_size"], cp=p.get("context_parallel_size", 1),
            ep=p.get("expert_model_parallel_size", 1), etp=p.get("expert_tensor_parallel_size"),
            vpp=p.get("virtual_pipeline_model_parallel_size", 1), micro_batch_size=p["micro_batch_size"],
            global_batch_size=p["global_batch_size"], seq_length=p["seq_length"],
            recompute=p.get("recompute", "none"), recompute_num_layers=p.get("recompute_num_layers"),
            sequence_parallel=p.get("sequence_parallel", False), zero_stage=p.get("zero_stage", 1),
            precision=p.get("precision", "bf16"), schedule=p.get("schedule", "1f1b"),
            layers_per_stage=tuple(x["layers"] for x in stages) if stages else None,
            stage_node_groups=tuple(x["node_group"] for x in stages) if stages and all(
                "node_group" in x and "+" not in x["node_group"] for x in stages) else None,
            overlap_grad_reduce=p.get("overlap_grad_reduce", True),
            overlap_param_gather=p.get("overlap_param_gather", True),
            offload_optimizer=p.get("offload_optimizer", False))
    except KeyError as exc:
        raise SpecError(path, f"plan.{exc.args[0]}", "required field is missing") from None
    except TypeError as exc:
        raise SpecError(path, "plan", f"malformed: {exc}") from None


def run_check(cluster_ref, megatron_args, plan_file, model_ref, world_size, as_json, console, err_console) -> int:
    from ..estimate import estimate
    from ..library import load_cluster_ref, load_model_ref
    from .megatron_parse import parse_file
    from .megatron_rules import megatron_violations

    if bool(megatron_args) == bool(plan_file):
        raise SpecError("planner check", None, "give exactly one of --megatron-args or --plan")
    cluster = load_cluster_ref(cluster_ref)
    src = megatron_args or plan_file
    result = {"file": src, "valid": True, "fits": None, "violations": [], "stages": []}
    if megatron_args:
        env = dict(os.environ)
        launch = parse_file(megatron_args, env)
        if launch.world_size is None or world_size:
            from dataclasses import replace
            launch = replace(launch, world_size=world_size or cluster.num_gpus)
            ws = launch.world_size
            tp, pp, cp = launch.raw.get("tp", 1), launch.raw.get("pp", 1), launch.raw.get("cp", 1)
            if ws % (tp * pp * cp) == 0:
                launch = replace(launch, strategy=replace(launch.strategy, dp=ws // (tp * pp * cp)))
        model = load_model_ref(model_ref) if model_ref else launch.model
        viol = megatron_violations(launch, model)
        result["ignored_flags"] = list(launch.ignored)
        strategy = launch.strategy
    else:
        if not model_ref:
            raise SpecError("--model", None, "required with --plan")
        model = load_model_ref(model_ref)
        strategy = strategy_from_plan_json(plan_file)
        viol = []
        from .megatron import megatron_args as build
        from .megatron_parse import parse_words
        try:
            args = build(model, strategy)
            viol = megatron_violations(parse_words(args + ["--world-size", str(strategy.world_size)], src), model)
        except InvalidStrategy as exc:
            viol = [exc]
    if viol:
        result["valid"] = False
        result["violations"] = [str(v) for v in viol]
        for v in viol:
            _annotate("error", f"Megatron would reject this launch: {v}", src)
        if as_json:
            print(json.dumps(result, indent=2, sort_keys=True))
        else:
            for v in viol:
                err_console.print(f"INVALID {src}: {v}", markup=False)
        return 1
    try:
        e = estimate(model, cluster, strategy)
    except InvalidStrategy as exc:
        result["valid"] = False
        result["violations"] = [str(exc)]
        _annotate("error", str(exc), src)
        if as_json:
            print(json.dumps(result, indent=2, sort_keys=True))
        else:
            err_console.print(f"INVALID {src}: {exc}", markup=False)
        return 1
    result["fits"] = e.fits
    result["step_time_s"] = e.step_time_s
    result["mfu"] = e.mfu
    for m in e.memory:
        result["stages"].append({"stage": m.stage, "node_group": m.node_group, "needed_bytes": m.total,
                                 "usable_bytes": m.capacity, "headroom_bytes": m.headroom, "fits": m.fits})
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    if not e.fits:
        for m in e.memory:
            if not m.fits:
                msg = (f"stage {m.stage} ({m.node_group}) needs {m.total / GIB:.1f} GiB, "
                       f"{m.capacity / GIB:.1f} GiB usable ({(m.total - m.capacity) / GIB:.1f} GiB short)")
                _annotate("error", f"does not fit: {msg}", src)
                if not as_json:
                    err_console.print(f"DOES NOT FIT {src}: {msg}", markup=False)
        return 1
    worst = min(e.memory, key=lambda m: m.headroom)
    if worst.headroom < 0.05 * worst.capacity:
        _annotate("warning", f"stage {worst.stage} has only {worst.headroom / GIB:.1f} GiB headroom", src)
    if not as_json:
        heads = ", ".join(f"stage {m.stage}: {m.headroom / GIB:.1f} GiB" for m in e.memory)
        console.print(f"OK {src}: valid and fits; headroom per stage: {heads}; "
                      f"step {e.step_time_s:.3f} s, MFU {e.mfu * 100:.1f}%")
    return 0
