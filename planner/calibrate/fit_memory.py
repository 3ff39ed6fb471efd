"""Fitting the memory overheads per GPU kind to Megatron-LM's report_memory lines.

The last report per rank (max allocated / max reserved are peaks since start) gives the
allocator's fragmentation (reserved vs allocated, worst rank) and, against the planner's
predicted peak of the rank's pipeline stage, the CUDA context and what the model does not
count (memory outside PyTorch less the communicators and workspaces the model charges, plus the
measured max allocated above the predicted peak).
"""

from __future__ import annotations

from dataclasses import replace

from ..cost.memory import fixed_overhead_bytes
from ..errors import SpecError
from ..specs.calibration import Key, Source, Value, base_gpu_name, memory_overheads
from .fit_logs import LogCase, log_date


def _stage_of(rank: int, s, ignored: tuple) -> int:
    """Pipeline stage of a global rank: Megatron's default order 'tp-cp-ep-dp-pp' (PP outermost);
    with --use-tp-pp-dp-mapping the order is tp-pp-dp."""
    if "--use-tp-pp-dp-mapping" in ignored:
        return (rank // s.tp) % s.pp
    return rank // s.gpus_per_stage


def fit_memory(cases: list[LogCase], base, before, values: dict, sources: dict, reasons: dict) -> None:
    """fragmentation_fraction and cuda_context per GPU kind into `values` (with their sources),
    from the logs' report_memory lines against the predictions on `before`; the rows compared
    go to each case's `memory`."""
    from ..estimate import estimate
    per_kind: dict = {}
    for c in cases:
        lines = c.log.memory
        if not lines:
            continue
        e = estimate(c.model, before, c.strategy)
        c.fits_before = e.fits
        latest: dict = {}
        for m in lines:   # max allocated / max reserved are peaks since start: the last report per rank
            key = m.rank if m.rank is not None else f"line {m.line}"
            if key not in latest or m.max_allocated >= latest[key].max_allocated:
                latest[key] = m
        for key, m in sorted(latest.items(), key=lambda kv: str(kv[0])):
            stage = _stage_of(m.rank, c.strategy, c.ignored_flags) if m.rank is not None else None
            if stage is not None and not 0 <= stage < c.strategy.pp:
                raise SpecError(c.inp.log, f"line {m.line}", f"[Rank {m.rank}] is outside launch {c.inp.launch}'s "
                                f"{c.strategy.world_size} ranks: not the log of this launch")
            pred = e.memory[stage] if stage is not None else None
            kinds = ({base_gpu_name(before.group(g).gpu) for g in pred.node_group.split("+")} if pred else
                     {base_gpu_name(g.gpu) for g in before.node_groups} if len(before.node_groups) == 1 else set())
            row = {"line": m.line, "rank": m.rank, "stage": stage, "max_allocated_bytes": m.max_allocated,
                   "max_reserved_bytes": m.max_reserved, "predicted_bytes": pred.total if pred else None,
                   "gap_bytes": m.max_allocated - pred.total if pred else None,
                   "outside_pytorch_bytes": m.device_used - m.reserved if m.device_used is not None else None}
            c.memory.append(row)
            if len(kinds) != 1:
                continue
            d = per_kind.setdefault(kinds.pop(), {"frag": [], "gap": [], "outside": [], "src": {}})
            if m.max_allocated > 0:
                d["frag"].append((m.max_reserved - m.max_allocated) / m.max_allocated)
            if row["gap_bytes"] is not None:
                d["gap"].append(row["gap_bytes"])
            if row["outside_pytorch_bytes"] is not None:
                # memory outside the allocator less what the model charges per communicator and
                # workspace for this launch: the rest is the GPU's fixed context
                gpu = before.group(pred.node_group.split("+")[0]).gpu if pred else before.node_groups[0].gpu
                per_launch = fixed_overhead_bytes(c.model, c.strategy, gpu) - memory_overheads(gpu)[0]
                d["outside"].append(max(0.0, row["outside_pytorch_bytes"] - per_launch))
            d["src"].setdefault(c.inp.log, (c, []))[1].append(m.line)
    for kind, d in per_kind.items():
        fk, rk = Key("gpus", kind, "fragmentation_fraction"), Key("gpus", kind, "cuda_context")
        srcs = [Source(file=p, lines=f"{min(ls)}-{max(ls)}", date=log_date(c), sha256=c.log.sha256,
                       what=f"{len(ls)} report_memory line(s), the last per rank")
                for p, (c, ls) in d["src"].items()]
        if d["frag"]:
            # the worst rank decides whether a plan fits: the largest share of the allocator's pool
            # that is not in tensors
            values[fk] = Value(min(max(d["frag"]), 0.5))
            sources[fk] = [replace(s, what=s.what + ": (max reserved - max allocated) / max allocated, worst rank")
                           for s in srcs]
        reserve0 = memory_overheads(next(g.gpu for g in base.node_groups if base_gpu_name(g.gpu) == kind))[0]
        outside = max(d["outside"]) if d["outside"] else None
        gap = max(d["gap"]) if d["gap"] else None
        if outside is None and (gap is None or gap <= 0):
            why = "no [Rank r] memory lines to compare with the predicted peak" if gap is None else (
                f"the predicted peak is above the measured max allocated on every stage (by >= {-gap / 2**30:.2f} GiB, "
                "not credited); the log does not show memory outside PyTorch (--log-device-memory-used)")
            reasons.setdefault(rk, why)
            continue
        base_part = outside if outside is not None else reserve0
        values[rk] = Value(base_part + max(0.0, gap or 0.0))
        parts = (f"outside PyTorch, less NCCL/workspaces, {base_part / 2**30:.2f} GiB (measured)" if outside is not None
                 else f"profile context {reserve0 / 2**30:.2f} GiB (memory outside PyTorch not in the log)")
        sources[rk] = [replace(s, what=s.what + f": {parts} + max allocated above the predicted peak "
                               f"{max(0.0, gap or 0.0) / 2**30:.2f} GiB") for s in srcs]
