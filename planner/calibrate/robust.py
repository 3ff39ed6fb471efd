"""Robust location and outlier rule for measured series (iteration times, bus bandwidths).

Outliers follow Iglewicz & Hoaglin (1993, "How to Detect and Handle Outliers"): the modified
z-score M = 0.6745 (x - median) / MAD, |M| > 3.5 flags an outlier. 0.6745 is the 0.75 quantile
of the standard normal, which makes MAD / 0.6745 a consistent estimate of the standard deviation.
"""

from __future__ import annotations

import math
from statistics import median

MAD_TO_SIGMA = 0.6745
OUTLIER_Z = 3.5


def mad(xs: list[float]) -> float:
    m = median(xs)
    return median(abs(x - m) for x in xs)


def modified_z(x: float, center: float, spread: float) -> float:
    """Iglewicz-Hoaglin modified z-score; `spread` is the MAD (with any floor already applied)."""
    return MAD_TO_SIGMA * (x - center) / spread if spread > 0 else 0.0


def median_standard_error(xs: list[float]) -> float:
    """Standard error of the median of n samples, relative to the median: sqrt(pi/2) sigma /
    sqrt(n) for normal noise, with sigma estimated as MAD / 0.6745."""
    if len(xs) < 2:
        return 0.0
    m = median(xs)
    return math.sqrt(math.pi / 2) * (mad(xs) / MAD_TO_SIGMA) / math.sqrt(len(xs)) / m if m else 0.0


def geometric_mean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))
