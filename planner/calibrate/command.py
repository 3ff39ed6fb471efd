"""`planner calibrate`: inputs checked, the fit run, the calibrated cluster written, the fit
reported (text or --json)."""

from __future__ import annotations

import json
from pathlib import Path
from datetime import datetime, timezone

from ..errors import SpecError
from ..specs.calibration import current_value, format_value
from .fit import LogInput, NcclInput, Result, calibrate, finish


def _pair(name_a: str, a: list, name_b: str, b: list, optional: bool = False) -> None:
    if optional and not b:
        return
    if len(a) != len(b):
        what = "once per" if not optional else "never, or once per"
        raise SpecError(name_b, None, f"given {len(b)} time(s) for {len(a)} {name_a}: expected {what} {name_a}, in the same order")


def inputs(megatron_log, megatron_args, nccl_tests, nccl_nodes, nccl_gpus_per_node, nccl_group):
    logs, launches = list(megatron_log or []), list(megatron_args or [])
    files, nodes = list(nccl_tests or []), list(nccl_nodes or [])
    gpn, groups = list(nccl_gpus_per_node or []), list(nccl_group or [])
    _pair("--megatron-log", logs, "--megatron-args", launches)
    _pair("--nccl-tests", files, "--nccl-nodes", nodes)
    _pair("--nccl-tests", files, "--nccl-gpus-per-node", gpn, optional=True)
    _pair("--nccl-tests", files, "--nccl-group", groups, optional=True)
    if not logs and not files:
        raise SpecError("planner calibrate", None, "nothing to learn from: give --megatron-log/--megatron-args "
                        "pairs and/or --nccl-tests/--nccl-nodes pairs")
    for flag, vals in (("--nccl-nodes", nodes), ("--nccl-gpus-per-node", gpn)):
        for v in vals:
            if not 1 <= v <= 100_000:
                raise SpecError(flag, None, f"found {v}, expected an integer in [1, 100000]")
    out_n = []
    for i, f in enumerate(files):
        g = tuple(x for x in groups[i].split(",") if x) if groups else None
        out_n.append(NcclInput(path=f, nodes=nodes[i], gpus_per_node=gpn[i] if gpn else None, groups=g))
    return [LogInput(log=a, launch=b) for a, b in zip(logs, launches)], out_n


def run_calibrate(cluster_ref, megatron_log, megatron_args, nccl_tests, nccl_nodes, nccl_gpus_per_node,
                  nccl_group, out, as_json, console, force: bool = False) -> int:
    from ..library import resolve_cluster_ref
    from ..specs.calibration import parse_calibration
    from ..specs.cluster import base_cluster_from_dict, cluster_from_dict
    from ..yamlio import load_file, load_text
    from .write import check_out_path, document, render, write_atomic

    logs, nccl = inputs(megatron_log, megatron_args, nccl_tests, nccl_nodes, nccl_gpus_per_node, nccl_group)
    cfile = resolve_cluster_ref(cluster_ref)
    data = load_file(cfile)
    base = base_cluster_from_dict(data, str(cfile))
    prior = parse_calibration(data["calibration"], str(cfile), base) if data.get("calibration") else None
    out_path = check_out_path(out, cfile, data, force)
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = calibrate(base, prior, logs, nccl, created)
    text = render(document(data, result.calibration, base), cfile, created)
    # the file as written is the calibration: predictions after are on the cluster it loads to
    after = cluster_from_dict(load_text(text, str(out_path)), str(out_path))
    finish(result, after)
    write_atomic(out_path, text)
    if as_json:
        print(json.dumps(to_json(result, base, str(out_path)), indent=2, sort_keys=True))
    else:
        render_text(result, base, str(out_path), console)
    return 0


def _err(pred: float, meas: float) -> float:
    return pred / meas - 1


def to_json(r: Result, base, out: str) -> dict:
    logs = []
    for c in r.logs:
        st = c.steady
        logs.append({
            "log": c.inp.log, "launch": c.inp.launch, "runs": len(c.log.runs), "lines": st.lines,
            "iteration_lines": len(c.log.iterations), "steady_lines": len(st.used),
            "measured_s": st.measured_s, "predicted_before_s": c.before_s, "predicted_after_s": c.after_s,
            "error_before": _err(c.before_s, st.measured_s), "error_after": _err(c.after_s, st.measured_s),
            "per_run_s": list(st.per_run_s), "relative_standard_error": st.relative_error,
            "warmup": [{"line": it.line, "iteration": it.iteration, "elapsed_s": it.elapsed_s} for it in st.warmup],
            "outliers": [{"line": it.line, "iteration": it.iteration, "elapsed_s": it.elapsed_s} for it in st.outliers],
            "excluded": [{"line": it.line, "iteration": it.iteration, "elapsed_s": it.elapsed_s, "why": why}
                         for it, why in st.excluded],
            "memory": c.memory, "fits_before": c.fits_before, "fits_after": c.fits_after})
    nccl = []
    for c in r.nccl:
        nccl.append({
            "file": c.inp.path, "line": c.table.first_line, "collective": c.collective, "level": c.level,
            "nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "ranks": c.ranks,
            "rows": f"{c.bw_rows[0].line}-{c.bw_rows[-1].line}" if c.bw_rows else None,
            "measured_busbw_bytes_per_s": c.measured_busbw, "profile_busbw_bytes_per_s": c.profile_busbw,
            "calibrated_busbw_bytes_per_s": c.calibrated_busbw, "fitted_latency_s": c.fitted_latency,
            "validated": all(h.wrong is not None for row in c.table.rows for _, h in row.halves)})
    fitted = [{"value": str(k), "profile": current_value(base, k), "calibrated": v.value,
               "profile_text": format_value(k.field, current_value(base, k)),
               "calibrated_text": format_value(k.field, v.value),
               "from": [{"file": s.file, "lines": s.lines, "date": s.date, "what": s.what} for s in v.sources]}
              for k, v in r.calibration.values]
    left = [{"value": str(k), "why": why} for k, why in r.calibration.left_at_profile]
    return {"cluster": base.name, "out": out, "logs": logs, "nccl_tests": nccl, "fitted": fitted,
            "left_at_profile": left, "warnings": list(r.warnings)}


def render_text(r: Result, base, out: str, console) -> None:
    from rich.markup import escape
    from rich.table import Table
    if r.logs:
        t = Table(title="Megatron-LM logs: steady-state seconds per iteration")
        for col in ("log", "launch", "steady lines", "measured s", "before s", "error", "after s", "error "):
            t.add_column(col, justify="left" if col in ("log", "launch") else "right")
        for c in r.logs:
            st = c.steady
            t.add_row(escape(Path(c.inp.log).name), escape(Path(c.inp.launch).name),
                      f"{len(st.used)}/{len(c.log.iterations)} ({len(st.warmup)} warm-up, {len(st.outliers)} outl.)",
                      f"{st.measured_s:.3f}", f"{c.before_s:.3f}", f"{_err(c.before_s, st.measured_s):+.1%}",
                      f"{c.after_s:.3f}", f"{_err(c.after_s, st.measured_s):+.1%}")
        console.print(t)
    if r.nccl:
        t = Table(title="nccl-tests: bus bandwidth at large messages (GB/s)")
        for col in ("file", "collective", "level", "ranks", "measured", "profile", "calibrated", "latency"):
            t.add_column(col, justify="left" if col in ("file", "collective", "level") else "right")
        for c in r.nccl:
            t.add_row(escape(Path(c.inp.path).name), c.collective, escape(c.level), f"{c.nodes}x{c.gpus_per_node}", f"{c.measured_busbw / 1e9:.1f}",
                      f"{c.profile_busbw / 1e9:.1f}", f"{c.calibrated_busbw / 1e9:.1f}",
                      f"{c.fitted_latency * 1e6:.2f} us" if c.fitted_latency else "-")
        console.print(t)
    t = Table(title=f"Calibrated values ({out})")
    for col in ("value", "profile", "calibrated", "from"):
        t.add_column(col)
    for k, v in r.calibration.values:
        t.add_row(escape(str(k)), str(format_value(k.field, current_value(base, k))),
                  str(format_value(k.field, v.value)),
                  escape("; ".join(f"{Path(s.file).name}:{s.lines}" for s in v.sources)))
    console.print(t)
    if r.calibration.left_at_profile:
        console.print("Left at the profile value:")
        for k, why in r.calibration.left_at_profile:
            console.print(f"  {k}: {why}", markup=False, highlight=False)
    for w in r.warnings:
        console.print(f"warning: {w}", markup=False, highlight=False)
    console.print(f"wrote {out}", markup=False, highlight=False)
