"""The memory model against measured runs: Megatron-LM's own CI peaks and public run reports.

Usage: python validation/memory.py [--json]

validation/data/megatron_memory_runs.yaml holds public runs with a measured allocator peak or a
reported out-of-memory, each with its full launch (sources per run):
- Megatron-LM's CI functional tests: the committed model_config.yaml (the launch) and the golden
  values of a real CI run, `torch.cuda.max_memory_allocated` logged on global rank world-1, the
  last pipeline stage. The planner's estimate of that stage's allocated tensors
  (StageMemory.total) is compared with it. Where the CI reads a GPT-2 BPE vocabulary from its data
  mount, the stock 50,257-token file is assumed (the run's `complete_given_assumption`).
- Runs that trained (must be judged to fit) and runs that ran out of memory (must not be).
Prints per run the measured and predicted bytes and the error, then the error's spread: the
model's stated uncertainty for `planner check`'s TIGHT verdict comes from this table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.estimate import estimate  # noqa: E402
from planner.megatron.tokenizers import GPT2_BPE_VOCAB_SIZE  # noqa: E402
from planner.specs.cluster import cluster_from_dict  # noqa: E402

DATA = ROOT / "validation" / "data"
GIB = 2**30
GPUS = {"H100": "h100-sxm-80g", "A100": "a100-sxm-80g", "V100": "v100-sxm2-32g"}


def _cluster(name: str, world: int, gpus_per_node: int, gpu: str):
    """`world` GPUs of one kind, gpus_per_node to a node (fewer if the run is smaller), with
    8 x 400 Gb/s NICs per node (DGX-class; memory verdicts do not depend on the links)."""
    gpn = min(gpus_per_node, world)
    return cluster_from_dict({"name": name, "node_groups": [
        {"name": "n", "nodes": max(1, world // gpn), "gpus_per_node": gpn, "gpu": gpu, "nics_per_node": 8,
         "nic_bandwidth": "400 Gb/s"}]}, "validation/memory.py")


def _gpu(text: str) -> str | None:
    for key, profile in GPUS.items():
        if key in text:
            return profile
    return None


def launch_text(run: dict) -> str:
    """The run's pretrain_gpt.py flags as a command line (the committed config, verbatim)."""
    words = ["torchrun", "--nnodes", str(run.get("nodes") or 1), "--nproc-per-node",
             str(run.get("gpus_per_node") or run["world_size"]), "pretrain_gpt.py"]
    for flag, value in run["model_args_verbatim"].items():
        if value is True:
            words.append(flag)
        elif value is False or value is None:
            continue
        else:
            words += [flag, str(value)]
    if "--vocab-size" not in run["model_args_verbatim"] and run.get("complete_given_assumption"):
        words += ["--vocab-size", str(GPT2_BPE_VOCAB_SIZE)]
    return " ".join(shlex.quote(w) for w in words)


def measured_peak(run: dict) -> float | None:
    m = run.get("measured") or {}
    peak = m.get("max_allocated_bytes_peak")
    if isinstance(peak, dict):
        return float(peak["bytes"])
    if isinstance(peak, (int, float)):
        return float(peak)
    gb = m.get("peak_mem_gb")
    return float(gb) * 1e9 if isinstance(gb, (int, float)) else None


def rows() -> list[dict]:
    from planner.megatron.launch import parse_text
    out = []
    for run in yaml.safe_load(open(DATA / "megatron_memory_runs.yaml")):
        usable = run.get("complete") or run.get("complete_given_assumption")
        gpu = _gpu(str(run.get("gpu")))
        if not usable or gpu is None or not run.get("model_args_verbatim") or not isinstance(run.get("world_size"), int):
            continue
        world = run["world_size"]
        cluster = _cluster(run["id"], world, 8, gpu)
        rec = {"id": run["id"], "outcome": run.get("outcome", ""), "measured_bytes": measured_peak(run)}
        try:
            launch = parse_text(launch_text(run), run["id"], env={}, default_world_size=world)
            e = estimate(launch.model, cluster, launch.strategy)
        except Exception as exc:   # reported, not hidden
            rec["error"] = f"{type(exc).__name__}: {exc}"
            out.append(rec)
            continue
        last = e.memory[-1]   # CI and Bridge (before its PR #3645) log the last rank = last stage
        rec.update(predicted_last_stage_bytes=last.total, fits=e.fits,
                   most_loaded_device_bytes=max(m.device_total for m in e.memory), device_bytes=last.device_bytes)
        if rec["measured_bytes"]:
            rec["error_pct"] = 100 * (last.total - rec["measured_bytes"]) / rec["measured_bytes"]
        out.append(rec)
    return out


def outcome_rows() -> list[dict]:
    """validation/data/megatron_memory_outcomes.yaml: each launch through the reader, Megatron's
    rules and the estimate `planner check` uses; its verdict beside the run's outcome."""
    from planner.megatron.launch import parse_text
    from planner.megatron.rules import megatron_violations
    out = []
    for run in yaml.safe_load(open(DATA / "megatron_memory_outcomes.yaml"))["runs"]:
        rec = {"id": run["id"], "outcome": run["outcome"], "gpu": run["gpu"]}
        try:
            launch = parse_text(run["launch"], run["id"], env=run.get("env") or {})
            cluster = _cluster(run["id"], launch.world_size, run["gpus_per_node"], run["gpu"])
            rec["violations"] = [str(v) for v in megatron_violations(launch, launch.model)]
            e = estimate(launch.model, cluster, launch.strategy)
        except Exception as exc:   # reported, not hidden
            rec["error"] = f"{type(exc).__name__}: {exc}"
            out.append(rec)
            continue
        worst = max(e.memory, key=lambda m: m.total - m.capacity)
        rec.update(verdict=e.memory_verdict, stage=worst.stage, needed_bytes=worst.total, usable_bytes=worst.capacity,
                   margin_bytes=worst.margin_bytes,
                   agrees=(e.memory_verdict != "fits") if run["outcome"] == "oom" else (e.memory_verdict != "does not fit"))
        out.append(rec)
    return out


def outcome_summary(ci: list[dict], outcomes: list[dict]) -> dict:
    """Runs that trained (the CI runs and the outcome runs that ran) judged not DOES NOT FIT, and
    runs that ran out of memory judged FITS (the gate would have passed them without a warning)."""
    ran = [r.get("fits") for r in ci if "error" not in r] + [r["verdict"] != "does not fit" for r in outcomes
                                                             if r["outcome"] == "ran" and "verdict" in r]
    ooms = [r for r in outcomes if r["outcome"] == "oom" and "verdict" in r]
    return {"ran": len(ran), "ran_judged_to_fit": sum(ran), "oom": len(ooms),
            "oom_judged_fits": sum(r["verdict"] == "fits" for r in ooms),
            "unpriced": sum("error" in r for r in ci + outcomes)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = rows()
    errs = sorted(r["error_pct"] for r in out if "error_pct" in r)
    summary = {"runs": len(out), "compared": len(errs),
               "mean_abs_error_pct": sum(abs(x) for x in errs) / len(errs) if errs else None,
               "worst_under_pct": errs[0] if errs else None, "worst_over_pct": errs[-1] if errs else None}
    outcomes = outcome_rows()
    summary["outcomes"] = outcome_summary(out, outcomes)
    if a.json:
        print(json.dumps({"rows": out, "outcome_rows": outcomes, "summary": summary}, indent=2))
        return
    print(f"{'run':52s} {'measured GiB':>12s} {'predicted':>10s} {'error':>7s}  verdict / outcome")
    for r in out:
        if "error" in r:
            print(f"{r['id']:52s} cannot price: {r['error']}")
            continue
        meas = f"{r['measured_bytes'] / GIB:12.2f}" if r["measured_bytes"] else f"{'-':>12s}"
        err = f"{r['error_pct']:+6.1f}%" if "error_pct" in r else f"{'':>7s}"
        print(f"{r['id']:52s} {meas} {r['predicted_last_stage_bytes'] / GIB:10.2f} {err}  "
              f"{'fits' if r['fits'] else 'DOES NOT FIT'} / {r['outcome'][:40]}")
    if errs:
        print(f"last-stage allocated peak: mean |error| {summary['mean_abs_error_pct']:.1f}% over {len(errs)} runs, "
              f"from {errs[0]:+.1f}% to {errs[-1]:+.1f}%")

    print()
    print(f"{'run (outcome known)':52s} {'outcome':>7s} {'needed GiB':>10s} {'usable':>7s}  gate verdict")
    for r in outcomes:
        if "error" in r:
            print(f"{r['id']:52s} {r['outcome']:>7s} cannot price: {r['error']}")
            continue
        rules = f"; breaks {len(r['violations'])} rule(s)" if r["violations"] else ""
        print(f"{r['id']:52s} {r['outcome']:>7s} {r['needed_bytes'] / GIB:10.1f} {r['usable_bytes'] / GIB:7.1f}  "
              f"{r['verdict'].upper()} (stage {r['stage']}, margin {r['margin_bytes'] / GIB:.1f} GiB)"
              f"{'' if r['agrees'] else '  <- disagrees with the outcome'}{rules}")
    o = summary["outcomes"]
    print(f"runs that trained judged to fit (FITS or TIGHT): {o['ran_judged_to_fit']} of {o['ran']}; "
          f"runs that ran out of memory judged FITS: {o['oom_judged_fits']} of {o['oom']}; "
          f"unpriced: {o['unpriced']} (NVIDIA's published Megatron-Bridge runs: python validation/bridge.py)")


if __name__ == "__main__":
    main()
