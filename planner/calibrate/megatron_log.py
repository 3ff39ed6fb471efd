"""Read a Megatron-LM training log: the iteration lines of `training_log`, the memory report,
the startup lines that state the world size and the arguments, split into runs.

Formats (megatron/training/training.py `training_log`, megatron/training/utils `report_memory`,
megatron/training/arguments.py):

  [2026-04-28 10:01:02.123456] iteration      120/    5000 | consumed samples: ... |
      elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 401.2 | ...
      | global batch size:   512 | lm loss: ... | number of skipped iterations:   0 |
      number of nan iterations:   0 |
  [Rank 3] (after 10 iterations) memory (MB) | allocated: ... | max allocated: ... |
      reserved: ... | max reserved: ...[ | total device memory used: ...]
  using world size: 64, data-parallel size: 8, context-parallel size: 1, ...
  ------------------------ arguments ------------------------
    num_layers ...................................... 32

`elapsed time per iteration` is the mean over the log interval (Megatron's interval timer); the
first line of a run covers its first iteration alone. training_log does not print the world
size; arguments.py does at start-up, and `throughput per GPU` divides by it. Lines may carry
launcher prefixes (srun --label `0: `, torchrun `[default0]:`, timestamps): fields are found
anywhere in a line. Megatron's MB are MiB (report_memory divides by 1024 x 1024).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..errors import SpecError
from ..inputs import read_regular_file

MAX_LOG_BYTES = 512 * 2**20   # a long run's stdout is tens of MB; refuse what cannot be a log
MIB = 2**20

_ITER = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")
_STAMP = re.compile(r"\[(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})(?:\.\d+)?\]\s*iteration\b")
_WORLD = re.compile(r"using world size: (\d+)")
_SIZES = {"data_parallel_size": re.compile(r"\bdata-parallel size: (\d+)"),
          "context_parallel_size": re.compile(r"(?<!hierarchical )context-parallel size: (\d+)"),
          "tensor_model_parallel_size": re.compile(r"tensor-model-parallel size: (\d+)"),
          "pipeline_model_parallel_size": re.compile(r"pipeline-model-parallel size: (\d+)")}
_ARGS_START = re.compile(r"-{8,} arguments -{8,}")
_ARGS_END = re.compile(r"-{8,} end of arguments -{8,}")
_ARG = re.compile(r"(?:^|\s)([a-z_][a-z0-9_]*) \.{2,} (.*?)\s*$")
_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_MEMORY = re.compile(r"(?:\[Rank (\d+)\]\s*)?(?:\(([^)]*)\)\s*)?memory \(MB\)\s*\|\s*allocated:\s*" + _NUM
                     + r"\s*\|\s*max allocated:\s*" + _NUM + r"\s*\|\s*reserved:\s*" + _NUM
                     + r"\s*\|\s*max reserved:\s*" + _NUM
                     + r"(?:\s*\|\s*total device memory used:\s*" + _NUM + ")?")


@dataclass(frozen=True)
class IterationLine:
    line: int                      # 1-based line number in the file
    iteration: int
    train_iters: int
    elapsed_s: float               # mean seconds per iteration over the log interval
    tflops_per_gpu: float | None
    global_batch_size: int | None
    skipped: int                   # iterations of the interval whose optimizer step was skipped
    nan: int
    date: str | None               # YYYY-MM-DD from Megatron's own timestamp


@dataclass(frozen=True)
class MemoryLine:
    line: int
    rank: int | None
    when: str                      # e.g. "after 10 iterations"
    allocated: float               # bytes (torch.cuda.memory_allocated)
    max_allocated: float
    reserved: float
    max_reserved: float
    device_used: float | None      # bytes, nvml's view (--log-device-memory-used)


@dataclass
class Run:
    first_line: int
    world: dict = field(default_factory=dict)      # name -> (int, line) from "using world size"
    args: dict = field(default_factory=dict)       # name -> (text, line) from the arguments dump
    iterations: list = field(default_factory=list)
    memory: list = field(default_factory=list)


@dataclass(frozen=True)
class MegatronLog:
    path: str
    runs: tuple[Run, ...]
    sha256: str
    modified: str                  # file modification date, YYYY-MM-DD (UTC)

    @property
    def iterations(self) -> list[IterationLine]:
        return [it for r in self.runs for it in r.iterations]

    @property
    def memory(self) -> list[MemoryLine]:
        return [m for r in self.runs for m in r.memory]


def read_text(path: str, limit: int = MAX_LOG_BYTES) -> tuple[str, str, str]:
    """(text, sha256 prefix, modification date) of a measurement file; errors name the file."""
    p = Path(path)
    # a folder, a FIFO or a device is named for what it is (a FIFO is never opened)
    data = read_regular_file(p, limit, "a training log or nccl-tests output")
    text = data.decode("utf-8", errors="replace")
    mdate = datetime.fromtimestamp(p.stat().st_mtime, tz=timezone.utc).strftime("%Y-%m-%d")
    return text, hashlib.sha256(data).hexdigest()[:16], mdate


def _fields(rest: str) -> dict[str, str]:
    out = {}
    for part in rest.split("|"):
        k, sep, v = part.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


_LEADING = re.compile(r"[-+]?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?")


def _number(d: dict, key: str, path: str, line: int, kind=float):
    """A field's number; Megatron-Bridge prints 'this interval/running mean' (1234.5/1230.1):
    the first is the interval's."""
    v = d.get(key)
    if v is None:
        return None
    m = _LEADING.match(v)
    if not m:
        raise SpecError(path, f"line {line}", f"{key}: found {v!r}, expected a number")
    return float(m.group(0)) if kind is float else int(float(m.group(0)))


def parse_log(path: str) -> MegatronLog:
    text, digest, mdate = read_text(path)
    runs: list[Run] = []
    cur = Run(first_line=1)
    in_args = False

    def new_run(line: int) -> Run:
        nonlocal cur
        if cur.iterations:
            runs.append(cur)
            cur = Run(first_line=line)
        return cur

    for n, raw in enumerate(text.splitlines(), 1):
        if in_args:
            if _ARGS_END.search(raw):
                in_args = False
                continue
            m = _ARG.search(raw)
            if m:
                cur.args[m.group(1)] = (m.group(2), n)
            continue
        if _ARGS_START.search(raw):
            new_run(n)
            in_args = True
            continue
        m = _WORLD.search(raw)
        if m:
            if cur.world:   # a second start-up in the same run: a new run
                runs.append(cur)
                cur = Run(first_line=n)
            else:
                new_run(n)
            cur.world["world_size"] = (int(m.group(1)), n)
            for k, rx in _SIZES.items():
                mm = rx.search(raw)
                if mm:
                    cur.world[k] = (int(mm.group(1)), n)
            continue
        m = _ITER.search(raw)
        if m and "elapsed time per iteration" in raw:
            it = int(m.group(1))
            if cur.iterations and it <= cur.iterations[-1].iteration:
                new_run(n)   # restarted (from a checkpoint, or from scratch) without a header
            d = _fields(m.group(3))
            ms = _number(d, "elapsed time per iteration (ms)", path, n)
            if ms is None:
                continue
            if not ms > 0:
                raise SpecError(path, f"line {n}", f"elapsed time per iteration (ms): found {ms}, expected > 0")
            st = _STAMP.search(raw)
            cur.iterations.append(IterationLine(
                line=n, iteration=it, train_iters=int(m.group(2)),
                elapsed_s=ms / 1e3,
                tflops_per_gpu=_number(d, "throughput per GPU (TFLOP/s/GPU)", path, n),
                global_batch_size=_number(d, "global batch size", path, n, int),
                skipped=_number(d, "number of skipped iterations", path, n, int) or 0,
                nan=_number(d, "number of nan iterations", path, n, int) or 0,
                date=st.group(1) if st else None))
            continue
        m = _MEMORY.search(raw)
        if m:
            vals = [float(x) * MIB if x is not None else None for x in m.groups()[2:]]
            alloc, max_alloc, res, max_res, dev = vals
            if not (max_alloc <= max_res + MIB and alloc <= res + MIB):
                raise SpecError(path, f"line {n}", "memory (MB): allocated exceeds reserved; not a "
                                "report_memory line")
            cur.memory.append(MemoryLine(line=n, rank=int(m.group(1)) if m.group(1) else None,
                                         when=(m.group(2) or "").strip(), allocated=alloc,
                                         max_allocated=max_alloc, reserved=res, max_reserved=max_res,
                                         device_used=dev))
    if cur.iterations or cur.memory or cur.world or cur.args or not runs:
        runs.append(cur)
    return MegatronLog(path=path, runs=tuple(r for r in runs if r.iterations or r.memory or r.world or r.args),
                       sha256=digest, modified=mdate)
