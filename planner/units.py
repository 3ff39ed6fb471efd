"""Parsing of quantities with units. Units are required: a bare number is refused.

Conventions: SI prefixes are powers of 10 (1 GB = 1e9 bytes, 1 Gb/s = 1e9 bits/s);
binary prefixes (KiB, MiB, GiB, TiB) are powers of 2.
"""

from __future__ import annotations

import math
import re

_NUM = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"

# bytes per second per unit: lowercase b = bits, uppercase B = bytes
_BITS = {"": 1, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6, "g": 1e9, "G": 1e9, "t": 1e12, "T": 1e12}
_BANDWIDTH_UNITS = {
    **{f"{p}b/s": f / 8 for p, f in _BITS.items()},
    **{f"{p}bps": f / 8 for p, f in _BITS.items() if p.isupper()},
    "B/s": 1.0, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12, "GBps": 1e9,
    "KiB/s": 2**10, "MiB/s": 2**20, "GiB/s": 2**30, "TiB/s": 2**40,
}
# seconds per unit
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
# bytes per unit
_SIZE_UNITS = {
    "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}


# Sane ranges: a quantity outside is refused as a unit slip or a typo (and inf / nan always:
# '1e400 Gb/s' parses to inf, '1e-300 Gb/s' would make a step of 1e52 s).
# Bandwidth: from 1 Mb/s (below the slowest Ethernet still in use, 10 Mb/s; no collective of a
# training job runs on less) to 1 PB/s (over 100x the fastest memory shipped, B200 HBM3e 8 TB/s).
MIN_BANDWIDTH_BYTES_PER_S = 1e6 / 8
MAX_BANDWIDTH_BYTES_PER_S = 1e15
# Time (link latencies, per-kernel overheads): from 0 to 1 s (ten times a round trip around the
# earth through fibre, about 0.1 s).
MAX_TIME_S = 1.0
# Size (device, host memory, reserves): from 1 MB (less than any GPU's or host's memory has
# been for decades) to 1 PB (over 1000x the largest GPU or node memory of today).
MIN_SIZE_BYTES = 1e6
MAX_SIZE_BYTES = 1e15


class UnitError(ValueError):
    pass


def _bounded(x: float, text: object, kind: str, lo: float, hi: float, lo_text: str, hi_text: str) -> float:
    if not math.isfinite(x):
        raise UnitError(f"found {text!r}, not a finite {kind}")
    if not lo <= x <= hi:
        raise UnitError(f"found {text!r}, expected a {kind} from {lo_text} to {hi_text}")
    return x


def _split(text: object, kind: str, examples: str) -> tuple[float, str]:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise UnitError(f"found {text!r}, expected a {kind} with units, e.g. {examples}")
    if isinstance(text, (int, float)):
        raise UnitError(f"found bare number {text!r}, expected a {kind} with units, e.g. {examples}")
    m = re.fullmatch(r"\s*" + _NUM + r"\s*([A-Za-zµ/]+)\s*", text)
    if not m:
        raise UnitError(f"found {text!r}, expected a {kind} with units, e.g. {examples}")
    return float(m.group(1)), m.group(2)


def parse_bandwidth(text: object) -> float:
    """'400 Gb/s' -> 5e10 bytes/s. Bits are lowercase b, bytes uppercase B."""
    value, unit = _split(text, "bandwidth", "'400 Gb/s', '50 GB/s', '100 Mb/s'")
    if unit not in _BANDWIDTH_UNITS:
        raise UnitError(f"unknown bandwidth unit {unit!r} in {text!r}; expected one of "
                        "Gb/s, GB/s, Mb/s, MB/s, Tb/s, TB/s")
    return _bounded(value * _BANDWIDTH_UNITS[unit], text, "bandwidth", MIN_BANDWIDTH_BYTES_PER_S,
                    MAX_BANDWIDTH_BYTES_PER_S, "1 Mb/s", "1 PB/s")


def parse_time(text: object) -> float:
    """'5 us' -> 5e-6 seconds."""
    value, unit = _split(text, "time", "'5 us', '2 ms'")
    if unit not in _TIME_UNITS:
        raise UnitError(f"unknown time unit {unit!r} in {text!r}; expected one of ns, us, ms, s")
    return _bounded(value * _TIME_UNITS[unit], text, "time", 0.0, MAX_TIME_S, "0", "1 s")


def parse_size(text: object) -> float:
    """'80 GB' -> 8e10 bytes; '512 GiB' -> 512 * 2**30 bytes."""
    value, unit = _split(text, "size", "'80 GB', '512 GiB'")
    if unit not in _SIZE_UNITS:
        raise UnitError(f"unknown size unit {unit!r} in {text!r}; expected one of B, KB, MB, GB, "
                        "TB, KiB, MiB, GiB, TiB")
    return _bounded(value * _SIZE_UNITS[unit], text, "size", MIN_SIZE_BYTES, MAX_SIZE_BYTES, "1 MB", "1 PB")


GIB = 2**30
MIB = 2**20
