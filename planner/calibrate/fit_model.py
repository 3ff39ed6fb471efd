"""The pieces every fit of planner.calibrate.fit shares: the planner's own model run on a
cluster with some calibration parameters changed, nccl-tests' bus bandwidth factor, and the
1-D solve for the attained bandwidth that matches a measured time.
"""

from __future__ import annotations

import math

from ..specs.calibration import MAX_BUS_OVER_LINE_RATE, Calibration, Key, Value, apply_calibration, line_rate

# Lower end of the bandwidth search, as a fraction of the line rate: slower is a broken fabric.
MIN_BUS_OVER_LINE_RATE = 1e-4
# The link bandwidth levels, in the order they are fitted: scale-up before scale-out before
# interconnects (a scale-out ring is capped by the scale-up link in the model).
LEVEL_ORDER = {"scale_up_bus_bandwidth": 0, "scale_out_bus_bandwidth": 1, "bus_bandwidth": 2}


def cluster_with(base, values: dict):
    """`base` with the calibration `values` (Key -> Value) applied, as the loader applies them."""
    return apply_calibration(base, Calibration(values=tuple(values.items())))


# ---------------------------------------------------------------- the model's view of a test

def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests' bus bandwidth / algorithm bandwidth (doc/PERFORMANCE.md)."""
    if kind == "all-reduce":
        return 2 * (n - 1) / n
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n
    return 1.0


def solve_bandwidth(base, values: dict, key: Key, fn, t_meas: float) -> tuple[float | None, str]:
    """(the attained bandwidth at which fn(cluster) = t_meas, "ok"), or (None, why): "flat" when
    fn does not depend on it, "fast" / "slow" when t_meas is out of reach within its bounds
    (fn falls as bandwidth rises)."""
    lr = line_rate(base, key)
    lo, hi = MIN_BUS_OVER_LINE_RATE * lr, MAX_BUS_OVER_LINE_RATE * lr

    def t(bw):
        return fn(cluster_with(base, {**values, key: Value(bw)}))

    t_lo, t_hi = t(lo), t(hi)
    if not t_lo > t_hi * (1 + 1e-9):
        return None, "flat"
    if t_meas < t_hi:
        return t_hi, "fast"
    if t_meas > t_lo:
        return t_lo, "slow"
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):
        mid = 0.5 * (a + b)
        if t(math.exp(mid)) > t_meas:
            a = mid
        else:
            b = mid
    return math.exp(0.5 * (a + b)), "ok"

