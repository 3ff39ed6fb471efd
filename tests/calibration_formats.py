"""Writers of synthetic measurement files in the exact formats the tools print, for the tests of
`planner calibrate` (and the bundled example in examples/calibration/).

- Megatron-LM: the line `training_log` builds (megatron/training/training.py: timestamp, then
  ' iteration {:8d}/{:8d} |', ' consumed samples: {:12d} |', ' elapsed time per iteration (ms):
  {:.1f} |', ' throughput per GPU (TFLOP/s/GPU): {:.1f} |', ' learning rate: {:.6E} |',
  ' global batch size: {:5d} |', ' lm loss: {:.6E} |', ' loss scale: {:.1f} |', ' grad norm:
  {:.3f} |', ' number of skipped iterations: {:3d} |', ' number of nan iterations: {:3d} |'),
  report_memory's '[Rank r] (after N iterations) memory (MB) | allocated: {:.2f} | ...', the
  start-up 'using world size: ...' line and the sorted '  name ..... value' arguments dump.
- nccl-tests: src/util.cu's device report ('#  Rank %2d Group %2d Pid %6d on %10s device %2d
  [%04x:%02x:%02x] %s'), result header, rows ('%12li  %12li  %8s  %6s  %6s' then per half
  '  %7s  %6s  %6s  %6g' with getFloatStr's 2/1/0-decimal fallback) and footer.

These are written from the format strings, not copied from either project's code.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

SYNTHETIC = "SYNTHETIC EXAMPLE written for planner's tests and docs: not a measurement"


# ------------------------------------------------------------------ Megatron-LM

def world_line(world, dp, cp, tp, pp) -> str:
    return (f"using world size: {world}, data-parallel size: {dp}, context-parallel size: {cp}, "
            f"hierarchical context-parallel sizes: None, tensor-model-parallel size: {tp}, "
            f"pipeline-model-parallel size: {pp}")


def arguments_dump(args: dict) -> list[str]:
    out = ["------------------------ arguments ------------------------"]
    rows = [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in args.items()]
    out += sorted(rows, key=lambda x: x.lower())
    out.append("-------------------- end of arguments ---------------------")
    return out


def iteration_line(when: datetime, iteration, train_iters, consumed, ms, gbs, tflops=None, skipped=0, nan=0,
                   lr=3.0e-4, loss=2.5, micro=True) -> str:
    s = f" [{when.strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    s += " iteration {:8d}/{:8d} |".format(iteration, train_iters)
    s += " consumed samples: {:12d} |".format(consumed)
    s += " elapsed time per iteration (ms): {:.1f} |".format(ms)
    if tflops is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    s += f" learning rate: {lr:.6E} |"
    s += f" global batch size: {gbs:5d} |"
    s += " lm loss: {:.6E} |".format(loss)
    s += f" loss scale: {1.0:.1f} |"
    s += f" grad norm: {0.912:.3f} |"
    s += " number of skipped iterations: {:3d} |".format(skipped)
    s += " number of nan iterations: {:3d} |".format(nan)
    return s


def memory_line(rank, iteration, alloc_mib, max_alloc_mib, res_mib, max_res_mib, device_used_mib=None) -> str:
    s = f"(after {iteration} iterations) memory (MB)"
    s += f" | allocated: {alloc_mib:.2f}"
    s += f" | max allocated: {max_alloc_mib:.2f}"
    s += f" | reserved: {res_mib:.2f}"
    s += f" | max reserved: {max_res_mib:.2f}"
    if device_used_mib is not None:
        s += f" | total device memory used: {device_used_mib:.2f}"
    return "[Rank {}] {}".format(rank, s)


def megatron_run(times_ms, *, gbs, world, tp=1, pp=1, cp=1, args=None, start_iteration=0, log_interval=10,
                 train_iters=5000, first_ms=None, tflops_per_s=None, start=datetime(2026, 4, 28, 10, 0, 0),
                 skipped=(), nan=(), batch_sizes=None, memory=(), header=True, lr=lambda it: 3.0e-4,
                 loss=lambda it: 2.0 + 8.0 / math.sqrt(it)) -> list[str]:
    """One run: start-up lines, the first-iteration line, then one line per log interval with
    times_ms[k]. tflops_per_s: FLOPs per iteration per GPU / 1e12 (the throughput is that / time).
    memory: (rank, alloc, max alloc, reserved, max reserved[, device used]) MiB, printed after the
    first logged interval. An interval in `nan` had an inf/nan loss: that step was skipped too."""
    dp = world // (tp * pp * cp)
    lines = []
    if header:
        lines += ["> initializing torch distributed ...", world_line(world, dp, cp, tp, pp)]
        if args is not None:
            lines += arguments_dump({"world_size": world, "data_parallel_size": dp, "tensor_model_parallel_size": tp,
                                     "pipeline_model_parallel_size": pp, "context_parallel_size": cp,
                                     "global_batch_size": gbs, **args})
        lines += ["> building GPT model ...", "[after model, optimizer, and learning rate scheduler are built] "
                  f"datetime: {start.strftime('%Y-%m-%d %H:%M:%S')} ", "training ..."]
    t = start
    it = start_iteration + 1
    consumed = start_iteration * gbs
    first = first_ms if first_ms is not None else 4 * times_ms[0]
    consumed += gbs
    t += timedelta(milliseconds=first)
    lines.append(iteration_line(t, it, train_iters, consumed, first, gbs,
                                tflops=tflops_per_s * 1e3 / first if tflops_per_s else None, lr=lr(it), loss=loss(it)))
    for k, ms in enumerate(times_ms):
        prev, it = it, (it // log_interval + 1) * log_interval
        bs = batch_sizes[k] if batch_sizes else gbs
        consumed += bs * (it - prev)
        t += timedelta(milliseconds=ms * (it - prev))
        lines.append(iteration_line(t, it, train_iters, consumed, ms, bs,
                                    tflops=tflops_per_s * 1e3 / ms if tflops_per_s else None,
                                    skipped=1 if k in skipped or k in nan else 0, nan=1 if k in nan else 0,
                                    lr=lr(it), loss=loss(it)))
        if k == 0:
            for m in memory:
                lines.append(memory_line(m[0], it, *m[1:]))
    return lines


def prefixed(lines, prefix) -> list[str]:
    return [prefix + x for x in lines]


# ------------------------------------------------------------------ nccl-tests

def float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: 2 decimals if they fit the width, else 1, else 0, else e-notation."""
    for fmt in (f"%{width}.2f", f"%{width}.1f", f"%{width}.0f"):
        s = fmt % value
        if len(s) <= width:
            return s
    return (f"%{width}.1e" if width >= 7 else f"%{width}.0e") % value


FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n, "sendrecv": lambda n: 1.0}
REDOP = {"all_reduce": "sum", "reduce_scatter": "sum", "all_gather": "none", "alltoall": "none", "sendrecv": "sum"}


def _geometry(coll: str, nbytes: int, n: int) -> tuple[int, int]:
    """(size column, count column) for a requested size, as setupArgs/getCollByteCount give."""
    count = nbytes // 4
    if coll in ("all_gather", "reduce_scatter", "alltoall"):
        base = (count // n) & ~3   # aligned to 16 bytes of float
        return base * n * 4, base
    return count * 4, count


def nccl_output(coll: str, nodes: int, gpus_per_node: int, busbw_gbps: float, latency_us: float, *,
                min_bytes=8, max_bytes=8 * 2**30, new_format=True, wrong=None, check=True, per_iter=False,
                one_process_per_gpu=True, hosts=None, device="NVIDIA H100 80GB HBM3", inplace_factor=1.012,
                comment=True) -> list[str]:
    """nccl-tests stdout for a collective whose time is latency + size x factor / busbw (so its
    large-message bus bandwidth is busbw_gbps). wrong: {size: count} of wrong elements."""
    n = nodes * gpus_per_node
    hosts = hosts or [f"node-{i + 1:03d}" for i in range(nodes)]
    lines = [f"# {SYNTHETIC}"] if comment else []
    if new_format:
        lines += ["# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807",
                  f"# Collective test starting: {coll}_perf"]
    ngpus = 1 if one_process_per_gpu else gpus_per_node
    tail = " unalign: 0" if new_format else ""
    lines.append(f"# nThread 1 nGpus {ngpus} minBytes {min_bytes} maxBytes {max_bytes} step: 2(factor) "
                 f"warmup iters: 5 iters: 20 agg iters: 1 validation: {1 if check else 0} graph: 0{tail}")
    if per_iter:
        lines.append("# Per-Iteration Report: CUDA event timing; i_* uses max over process rows ")
    lines += ["#", "# Using devices"]
    for r in range(n):
        node, dev = divmod(r, gpus_per_node)
        pid = 41000 + (r if one_process_per_gpu else node)
        bus = "[%04x:%02x:%02x]" % (0, 0x18 + 0x10 * dev, 0) if new_format else "[0x%02x]" % (0x18 + 0x10 * dev)
        lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d %s %s" % (r, 0, pid, hosts[node], dev, bus, device))
    lines.append("#")
    if per_iter:
        lines.append("# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                in-place (+ per-iteration)" % ("", "", "", "", ""))
        cols = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99",
                "i_cv%", "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%")
        lines.append(("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  "
                      "%7s  %7s  %7s  %7s %*s") % (*cols, 0, ""))
    else:
        lines.append("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          " % ("", "", "", "", ""))
        lines.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s" % (
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
            "#wrong", 0, ""))
        lines.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s" % (
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", 0, ""))
    f = FACTOR[coll](n)
    bus_sum, rows = 0.0, 0
    size = min_bytes
    while size <= max_bytes:
        nbytes, count = _geometry(coll, size, n)
        row = "%12li  %12li  %8s  %6s  %6s" % (nbytes, count, "float", REDOP[coll], "%6i" % -1)
        for half, scale in (("oop", 1.0), ("ip", inplace_factor)):
            t_us = (latency_us + nbytes * f / (busbw_gbps * 1e9) * 1e6) * scale
            alg = nbytes / 1e9 / (t_us * 1e-6)
            bus = alg * f
            if half == "oop":
                bus_sum, rows = bus_sum + bus, rows + 1
            w = (wrong or {}).get(nbytes, 0) if half == "oop" else 0
            if check:
                row += "  %7s  %6s  %6s  %6g" % (float_str(t_us, 7), float_str(alg, 6), float_str(bus, 6), w)
            else:
                row += "  %7s  %6s  %6s    N/A" % (float_str(t_us, 7), float_str(alg, 6), float_str(bus, 6))
            if per_iter:
                row += "  %7s  %7s  %7s  %7s" % (float_str(t_us * 0.97, 7), float_str(t_us * 1.05, 7),
                                                 float_str(t_us * 1.04, 7), float_str(1.3, 7))
        lines.append(row)
        size *= 2
    errors = sum((wrong or {}).values())
    lines.append("# %-20s : %d %s" % ("Out of bounds values", errors, "FAILED" if errors else "OK"))
    lines.append("# %-20s : %g %s" % ("Avg bus bandwidth", bus_sum / rows, ""))
    lines.append("#")
    if new_format:
        lines.append(f"# Collective test concluded: {coll}_perf")
    return lines


def write(path, lines) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)
