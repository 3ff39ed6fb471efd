"""Pipeline schedules -> time of the forward/backward part of a step, from per-stage times.

With per-micro-batch stage times t_i = f_i + b_i + c_i (compute + exposed communication):
- 1F1B (PipeDream-Flush): T = sum_i t_i + (m - 1) max_i t_i (formulas.md; for equal stages
  this is (m + p - 1) t, bubble fraction (p - 1)/m).
- Interleaved with v chunks per rank: each chunk takes t_i / v, and the fill/drain runs over
  chunks: T = (m - 1/v) max_i t_i + (1/v) sum_i t_i, i.e. bubble (p - 1)/(v m) for equal stages
  (Narayanan et al. 2021, sec. 2.2).
- ZB-H1 (Qi et al. 2023): weight-gradient work W fills the bubble; the fill/drain shrinks from
  (p - 1)(F + B + W) to (p - 1)(F + B - W); applied to the real per-stage sum.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineTime:
    total_s: float
    steady_s: float     # m x the slowest stage
    bubble_s: float


def pipeline_time(fwd: list[float], bwd: list[float], wgrad: list[float], comm: list[float],
                  m: int, v: int = 1, schedule: str = "1f1b") -> PipelineTime:
    t = [f + b + c for f, b, c in zip(fwd, bwd, comm)]
    p = len(t)
    tmax = max(t)
    if p == 1:
        return PipelineTime(m * tmax, m * tmax, 0.0)
    steady = m * tmax
    fill = sum(t) - tmax          # 1F1B fill + drain beyond the steady state
    if schedule == "interleaved" and v > 1:
        fill = (sum(t) - tmax) / v
    elif schedule == "zb-h1":
        # fraction of the fill that remains once W moves into the bubble: (F + B - W)/(F + B + W)
        ratio = []
        for f, b, w, c in zip(fwd, bwd, wgrad, comm):
            full = f + b + c
            ratio.append(max(0.0, full - 2 * w) / full if full > 0 else 0.0)
        fill *= sum(ratio) / len(ratio)
    return PipelineTime(steady + fill, steady, fill)
