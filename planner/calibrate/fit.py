"""Fit a cluster's calibration parameters (planner/specs/calibration.py) to its own measurements.

The cost model is a black box here: every parameter is fitted by re-running the planner's own
model on the cluster with that parameter changed, through the same apply_calibration the
loader uses, so the fit stays right when the model changes.

- nccl-tests: per table, the link level it exercises (one node: scale-up of its node group;
  N nodes of one group: that group's scale-out; two groups: their interconnect). Per large
  message (>= LARGE_MESSAGE_BYTES) the attained bandwidth at which the model's time for that
  collective equals the measured one (1-D root finding); a table's value is the median, a level's
  the geometric mean of its tables (least squares in log space). Latency likewise from the
  small messages, where the bandwidth term is under a tenth of the measured time.
- Megatron logs: per log the steady-state iteration time (steady.py); the parameters are those
  the logs determine: least squares in log space of predicted / measured iteration time, each
  log weighted by its uncertainty (its median's standard error and the model's own error), a
  parameter kept only while its standard error stays under MAX_REL_STDERR. Compute scales (per
  GPU kind) come first, then link bandwidths that no nccl-tests measured.
- Memory: the report_memory lines give the allocator's overhead (reserved vs allocated) and the
  gap between the measured max allocated and the planner's predicted peak, per GPU kind.

The fits live in fit_nccl.py, fit_logs.py and fit_memory.py, the pieces they share in
fit_model.py; this module runs them together.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..specs.calibration import Calibration, Key, Source, Value, all_keys, format_value, parse_value
from .fit_logs import LogInput, fit_logs, log_case, log_date, step_time
from .fit_memory import fit_memory
from .fit_model import LEVEL_ORDER, cluster_with
from .fit_nccl import NcclInput, fit_nccl, model_busbw, nccl_cases


@dataclass
class Result:
    """A calibration fitted, the cluster before and after it, the cases it was fitted to, warnings."""
    calibration: Calibration
    before: object            # ClusterSpec as given (its old calibration, if any, applied)
    after: object             # ClusterSpec with the new calibration
    logs: list
    nccl: list
    warnings: list


# ---------------------------------------------------------------- all together

def calibrate(base, prior: Calibration | None, logs: list[LogInput], nccl: list[NcclInput], created: str) -> Result:
    """Fit what the inputs determine; every other parameter keeps its prior calibrated value (and
    source) or its profile value (with the reason)."""
    prior = prior or Calibration()
    values: dict = prior.as_dict()
    before = cluster_with(base, values)
    sources: dict = {}
    reasons: dict = {}
    warnings: list = []
    fresh: set = set()
    ncases = [c for inp in nccl for c in nccl_cases(inp, base)]
    lcases = [log_case(inp, before) for inp in logs]
    for k in {c.bw_key for c in ncases} | {c.lat_key for c in ncases}:
        values.pop(k, None)
    fit_nccl(ncases, base, values, sources, reasons, warnings)
    fresh.update(sources)
    fixed = set(fresh) | {k for k in values if k.field in LEVEL_ORDER}
    for c in lcases:
        c.before_s = step_time(c, before)
    fit_memory(lcases, base, before, values, sources, reasons)
    if lcases:
        chosen = fit_logs(lcases, base, values, fixed, reasons)
        after_tmp = cluster_with(base, values)
        for k in chosen:
            sens = [c for c in lcases if abs(step_time(c, cluster_with(base, {**values, k: Value(values[k].value * 1.01)}))
                                             / step_time(c, after_tmp) - 1) > 1e-6]
            sources[k] = [Source(file=c.inp.log, lines=c.steady.lines, date=log_date(c), sha256=c.log.sha256,
                                 what=f"median of {len(c.steady.used)} steady-state iteration lines "
                                      f"({len(c.steady.warmup)} warm-up, {len(c.steady.outliers)} outlier(s), "
                                      f"{len(c.steady.excluded)} excluded) of launch {c.inp.launch}")
                          for c in sens]
    final = {}
    for k, v in values.items():
        # to the precision the file is written with, so that the report, the JSON and the
        # written cluster agree exactly
        v = Value(parse_value(k.field, format_value(k.field, v.value), "calibration", str(k)), v.sources)
        final[k] = Value(v.value, tuple(sources[k])) if k in sources else v
    left = []
    for k in all_keys(base):
        if k in final:
            continue
        left.append((k, reasons.get(k) or _default_reason(k)))
    cal = Calibration(values=tuple((k, final[k]) for k in all_keys(base) if k in final),
                      left_at_profile=tuple(left), created=created)
    for c in lcases:
        if c.steady.slow_runs:
            shown = ", ".join(f"run {i + 1}: {c.steady.per_run_s[i]:.4g} s" for i in c.steady.slow_runs)
            warnings.append(f"{c.inp.log}: runs differ beyond their jitter ({shown}; all: {c.steady.measured_s:.4g} s); "
                            "the median of all is used")
        if c.fits_before is False:
            warnings.append(f"{c.inp.log}: the planner says launch {c.inp.launch} does not fit in memory, yet the log "
                            "shows it ran: its memory model over-predicts this launch")
    return Result(calibration=cal, before=before, after=None, logs=lcases, nccl=ncases, warnings=warnings)


def _default_reason(k: Key) -> str:
    if k.field == "compute_time_scale":
        return "no Megatron log"
    if k.field in ("cuda_context", "fragmentation_fraction"):
        return "no memory (MB) report lines in any log of this GPU kind"
    if k.field == "scale_up_bus_bandwidth":
        return "no single-node nccl-tests of this node group, and the logs do not determine it"
    if k.field == "scale_out_bus_bandwidth":
        return "no multi-node nccl-tests of this node group, and the logs do not determine it"
    if k.field == "bus_bandwidth":
        return "no nccl-tests across these node groups, and the logs do not determine it"
    return "no nccl-tests of this link with small messages"


def finish(result: Result, after) -> None:
    """Predictions on the calibrated cluster as the written file gives it."""
    from ..estimate import estimate
    result.after = after
    for c in result.logs:
        e = estimate(c.model, after, c.strategy)
        c.after_s = e.step_time_s
        if c.memory:
            c.fits_after = e.fits
            if not e.fits and c.fits_before is not False:
                worst = max(e.memory, key=lambda m: m.total - m.capacity)
                result.warnings.append(
                    f"{c.inp.log}: with the calibrated memory overheads the planner says {c.inp.launch} does not fit "
                    f"(stage {worst.stage}: {worst.total / 2**30:.1f} of {worst.capacity / 2**30:.1f} GiB), yet it ran: "
                    "the predicted peak errs by a different amount on each stage, which one reserve per GPU "
                    "kind cannot follow (it takes the largest)")
    for c in result.nccl:
        c.calibrated_busbw = model_busbw(after, c)
