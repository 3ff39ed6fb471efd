"""Read nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf,
sendrecv_perf): the device report, the result table, the footer.

Format (nccl-tests src/common.cu and src/util.cu):

  # nccl-tests version 2.17.6 nccl-headers=22803 nccl-library=22803     (2025 and later)
  # Collective test starting: all_reduce_perf                           (2025 and later)
  # nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 ...
  #  Rank  0 Group  0 Pid  12345 on   node-001 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
  #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
  #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
       8388608       2097152     float     sum      -1    98.12   85.49  149.61      0    97.10   86.39  151.18      0
  # Out of bounds values : 0 OK
  # Avg bus bandwidth    : 120.5

Columns: out-of-place then in-place, each time (us), algbw = size / time (GB/s, 1e9 bytes),
busbw = algbw x the collective's factor (doc/PERFORMANCE.md: all-reduce 2(n-1)/n, all-gather,
reduce-scatter, all-to-all (n-1)/n, send/recv 1), #wrong (N/A without -c). With -I 1 each half
gains i_min i_max i_p99 i_cv%; with a timestamp column the line ends with a date and time.
The `size` column is the reduced buffer (all-reduce), the gathered / scattered total (all-gather,
reduce-scatter), the total each rank sends (all-to-all), the message (send/recv).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecError
from .megatron_log import read_text

MAX_FILE_BYTES = 16 * 2**20
# nccl-tests binary -> the planner's collective kind (planner/cost/comm.py KINDS)
COLLECTIVES = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
               "alltoall": "all-to-all", "sendrecv": "send-recv"}
UNSUPPORTED = ("broadcast", "reduce", "gather", "scatter", "hypercube", "alltoallv")
TYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
         "f8e4m3", "f8e5m2", "char", "int")

_VERSION = re.compile(r"#\s*nccl-tests version (\S+)")
_PROGRAM = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_CONCLUDED = re.compile(r"#\s*Collective test concluded:\s*(\S+)")
_NTHREAD = re.compile(r"#\s*nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+)")
_RANK = re.compile(r"#\s+Rank\s+(\d+) Group\s+(\d+) Pid\s+(\d+) on\s+(\S+) device\s+(\d+) \[[^\]]*\] (.*?)\s*$")
_HEADER = re.compile(r"#\s+size\s+count\s+type\s+redop\s+root\s+(time|cputime)\s+algbw\s+busbw\s+#wrong(.*)$")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_ROW = re.compile(r"(?:^|[\s:>\]])(\d+)\s+(\d+)\s+(" + "|".join(TYPES) + r")\s+(\w+)\s+(-?\d+)\s+(.+?)\s*$")
_FLOAT = re.compile(r"^[0-9.]+(?:[eE][+-]?[0-9]+)?$|^inf$|^nan$")


@dataclass(frozen=True)
class Half:
    """One of the two measurements of a row (out-of-place or in-place)."""
    time_s: float
    algbw: float          # bytes/s
    busbw: float          # bytes/s
    wrong: int | None     # None: not validated (N/A)


@dataclass(frozen=True)
class Row:
    line: int
    size: int             # bytes, the `size` column
    count: int
    dtype: str
    redop: str
    out_of_place: Half | None
    in_place: Half | None

    @property
    def halves(self) -> list[tuple[str, Half]]:
        return [(n, h) for n, h in (("out-of-place", self.out_of_place), ("in-place", self.in_place)) if h]


@dataclass
class Table:
    first_line: int
    program: str | None = None
    version: str | None = None
    nthread: int | None = None
    ngpus: int | None = None
    ranks: list = field(default_factory=list)      # (rank, host, device name)
    time_kind: str = "time"
    per_iter: bool = False
    rows: list = field(default_factory=list)
    out_of_bounds: tuple[int, int] | None = None   # (count, line)
    avg_busbw: tuple[float, int] | None = None     # (bytes/s, line)

    @property
    def hosts(self) -> list[str]:
        seen = []
        for _, h, _ in self.ranks:
            if h not in seen:
                seen.append(h)
        return seen


@dataclass(frozen=True)
class NcclFile:
    path: str
    tables: tuple[Table, ...]
    sha256: str
    modified: str


def _half(tokens: list[str], path: str, line: int) -> Half:
    t, alg, bus, wrong = tokens
    for tok in (t, alg, bus):
        if not _FLOAT.match(tok):
            raise SpecError(path, f"line {line}", f"found {tok!r} in a result row, expected a number")
    if wrong == "N/A":
        w = None
    else:
        try:
            w = int(float(wrong))
        except ValueError:
            raise SpecError(path, f"line {line}", f"#wrong: found {wrong!r}, expected a count or N/A") from None
    return Half(time_s=float(t) * 1e-6, algbw=float(alg) * 1e9, busbw=float(bus) * 1e9, wrong=w)


def _row(m: re.Match, table: Table, path: str, line: int) -> Row:
    rest = m.group(6).split()
    width = 8 if table.per_iter else 4   # time algbw busbw #wrong (+ i_min i_max i_p99 i_cv%)
    halves = []
    # out-of-place then in-place; trace replay prints in-place only (a blank out-of-place)
    while len(rest) >= 4 and _FLOAT.match(rest[0]):
        chunk, rest = rest[:width], rest[width:]
        halves.append(_half(chunk[:4], path, line))
        if len(halves) == 2:
            break
    if not halves:
        raise SpecError(path, f"line {line}", "result row without time, algbw, busbw, #wrong")
    oop, ip = (halves[0], halves[1]) if len(halves) == 2 else (None, halves[0])
    return Row(line=line, size=int(m.group(1)), count=int(m.group(2)), dtype=m.group(3), redop=m.group(4),
               out_of_place=oop, in_place=ip)


def parse_nccl(path: str) -> NcclFile:
    text, digest, mdate = read_text(path, MAX_FILE_BYTES)
    tables: list[Table] = []
    cur: Table | None = None

    def table(n: int, starting: bool = False) -> Table:
        nonlocal cur
        if cur is None or (starting and (cur.rows or cur.nthread is not None)):
            cur = Table(first_line=n)
            tables.append(cur)
        return cur

    pending_version = None
    for n, raw in enumerate(text.splitlines(), 1):
        if "#" in raw:
            m = _VERSION.search(raw)
            if m:
                pending_version = m.group(1)
                continue
            m = _PROGRAM.search(raw)
            if m:
                t = table(n, starting=True)
                t.program, t.version = m.group(1), pending_version
                continue
            m = _CONCLUDED.search(raw)
            if m:
                if cur is not None and cur.program is None:
                    cur.program = m.group(1)   # a pasted table without its start-up lines
                continue
            m = _NTHREAD.search(raw)
            if m:
                t = table(n, starting=True)
                t.nthread, t.ngpus = int(m.group(1)), int(m.group(2))
                t.version = t.version or pending_version
                continue
            m = _RANK.search(raw)
            if m:
                table(n).ranks.append((int(m.group(1)), m.group(4), m.group(6)))
                continue
            m = _HEADER.search(raw)
            if m:
                t = table(n)
                t.time_kind = m.group(1)
                t.per_iter = "i_min" in m.group(2)
                continue
            m = _OOB.search(raw)
            if m:
                table(n).out_of_bounds = (int(m.group(1)), n)
                continue
            m = _AVG.search(raw)
            if m:
                table(n).avg_busbw = (float(m.group(1)) * 1e9, n)
                continue
            continue   # any other comment ('# Reducing maxBytes ...'): result rows never hold a '#'
        m = _ROW.search(raw)
        if m:
            t = table(n)
            t.rows.append(_row(m, t, path, n))
    tables = [t for t in tables if t.rows]
    if not tables:
        raise SpecError(path, None, "no nccl-tests result rows (size count type redop root time algbw busbw #wrong ...)")
    return NcclFile(path=path, tables=tuple(tables), sha256=digest, modified=mdate)


def collective_of(table: Table, path: str) -> str:
    """The nccl-tests binary a table came from (all_reduce, ...): printed since 2025, else from
    the file name."""
    names = sorted(list(COLLECTIVES) + list(UNSUPPORTED), key=len, reverse=True)
    if table.program:
        prog = Path(table.program).name
        for name in names:
            if prog.startswith(name + "_perf") or prog == name:
                return name
        raise SpecError(path, f"line {table.first_line}", f"unknown nccl-tests program {table.program!r}")
    stem = Path(path).name.lower().replace("-", "_")
    squashed = stem.replace("_", "")
    for name in names:
        if name in stem or name.replace("_", "") in squashed:
            return name
    raise SpecError(path, f"line {table.first_line}", "cannot tell which collective this table measures "
                    "(nccl-tests before mid-2025 does not print it): name the file after the binary, "
                    "e.g. all_reduce_perf.txt")
