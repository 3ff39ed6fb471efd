"""The steady-state iteration time of a Megatron log: warm-up left out, intervals that are not
steady training left out, outliers reported, the median of the rest.

- The first iteration line of every run is warm-up: it times iteration 1 alone (CUDA context,
  NCCL communicators, allocator growth, kernel autotuning), or an interval that contains it.
- Lines after it that are still above the steady band (modified z > 3.5, robust.py) before the
  first line inside it are warm-up too (JIT fusions, data-loader prefetch filling; Megatron's
  first interval line also averages iteration 1 in, as it does not reset after logging it).
- The band is the run's own (median, MAD) when it has MIN_LINES_OWN_BAND lines or more (a
  restart on other nodes may run at another speed), else that of all runs of the file.
- Intervals with skipped or nan iterations (fp16 loss-scale overflow: no optimizer step) and
  intervals at another global batch size (--rampup-batch-size) are not the launch's steady step.
- Any other line outside the band is an outlier (a straggler, a GC pause): reported, not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from .megatron_log import IterationLine, MegatronLog
from .robust import OUTLIER_Z, mad, median_standard_error, modified_z

# Run-to-run jitter below this fraction of the median is not an outlier, however tight the rest
# of the series is (a series of identical intervals has MAD 0).
MAD_FLOOR_FRACTION = 0.005
# Megatron prints milliseconds with one decimal: differences below one step are print rounding.
PRINT_RESOLUTION_S = 1e-4
# Fewer lines than this give a MAD that is the jitter of two or three of them: such a short run is
# judged against the band of the whole file.
MIN_LINES_OWN_BAND = 5


@dataclass(frozen=True)
class SteadyState:
    measured_s: float
    used: tuple[IterationLine, ...]
    warmup: tuple[IterationLine, ...]
    outliers: tuple[IterationLine, ...]
    excluded: tuple[tuple[IterationLine, str], ...]   # (line, why)
    per_run_s: tuple[float | None, ...]               # median of each run's used lines
    relative_error: float                             # standard error of the median / median
    slow_runs: tuple[int, ...] = ()                   # runs whose median is away from the file's

    @property
    def lines(self) -> str:
        return f"{self.used[0].line}-{self.used[-1].line}"

    @property
    def dates(self) -> str:
        ds = sorted({it.date for it in self.used if it.date})
        if not ds:
            return ""
        return ds[0] if ds[0] == ds[-1] else f"{ds[0]}..{ds[-1]}"


def steady_state(log: MegatronLog, global_batch_size: int) -> SteadyState | None:
    """None when no line is left (the caller says why, naming the file)."""
    excluded: list = []
    candidates: list[list[IterationLine]] = []
    warmup: list[IterationLine] = []
    for run in log.runs:
        keep = []
        for k, it in enumerate(run.iterations):
            if k == 0:
                warmup.append(it)
            elif it.skipped or it.nan:
                excluded.append((it, f"{it.skipped} skipped, {it.nan} nan iterations in the interval"))
            elif it.global_batch_size is not None and it.global_batch_size != global_batch_size:
                excluded.append((it, f"global batch size {it.global_batch_size}, the launch's is {global_batch_size}"))
            else:
                keep.append(it)
        candidates.append(keep)
    pooled = [it.elapsed_s for run in candidates for it in run]
    if not pooled:
        return None

    def band(xs):
        c = median(xs)
        return c, max(mad(xs), MAD_FLOOR_FRACTION * c, PRINT_RESOLUTION_S)

    file_band = band(pooled)
    used_runs, outliers = [], []
    for run in candidates:
        center, spread = band([it.elapsed_s for it in run]) if len(run) >= MIN_LINES_OWN_BAND else file_band
        used = []
        leading = True
        for it in run:
            z = modified_z(it.elapsed_s, center, spread)
            if leading and z > OUTLIER_Z:
                warmup.append(it)
                continue
            leading = False
            if abs(z) > OUTLIER_Z:
                outliers.append(it)
            else:
                used.append(it)
        used_runs.append(used)
    used_all = sorted((it for run in used_runs for it in run), key=lambda it: it.line)
    if not used_all:
        return None
    times = [it.elapsed_s for it in used_all]
    # runs that disagree: a run's median away from the file's by more than the outlier rule allows
    # for the jitter within runs
    runs = [[it.elapsed_s for it in run] for run in used_runs]
    within = median([band(r)[1] for r in runs if r])
    slow = tuple(i for i, r in enumerate(runs) if r and abs(modified_z(median(r), median(times), within)) > OUTLIER_Z)
    return SteadyState(
        measured_s=median(times), used=tuple(used_all), warmup=tuple(sorted(warmup, key=lambda it: it.line)),
        outliers=tuple(outliers), excluded=tuple(excluded),
        per_run_s=tuple(median([it.elapsed_s for it in run]) if run else None for run in used_runs),
        relative_error=median_standard_error(times), slow_runs=slow if len([r for r in runs if r]) > 1 else ())
