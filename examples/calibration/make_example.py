"""Writes the SYNTHETIC example inputs of `planner calibrate` in this folder (a Megatron-LM log
and two nccl-tests outputs, in the exact formats those tools print; see README.md here). They
are made-up numbers chosen to look like a real DGX H100 cluster, not measurements.

    python examples/calibration/make_example.py
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from calibration_formats import SYNTHETIC, megatron_run, memory_line, nccl_output, write  # noqa: E402

from planner.cost.compute import model_flops_per_step  # noqa: E402
from planner.megatron.check import load_launch  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.library import load_cluster_ref  # noqa: E402

LAUNCH = HERE / "llama3-70b-tp8-pp4.sh"
STEADY_MS = 41_800.0        # the "measured" steady iteration (the planner says ~35 s)
GAP_GIB = (2.3, 2.1, 2.2, 2.0)   # max allocated above the planner's predicted peak, per stage
FRAGMENTATION = (0.041, 0.052, 0.047, 0.060)   # (reserved - allocated) / reserved, per stage, as written into the log
OUTSIDE_PYTORCH_MIB = 2450.0   # CUDA context + NCCL buffers: device used - reserved
MIB = 2**20


def jitter(k: int, seed: float) -> float:
    return 1 + 0.006 * math.sin(2.3 * k + seed) * math.cos(0.7 * k)


def main() -> None:
    cluster = load_cluster_ref("dgx-h100-x16")
    ld = load_launch(str(LAUNCH), cluster, None)
    model, s = ld.model, ld.strategy
    pred = estimate(model, cluster, s)
    # Megatron's count halves the causal attention (2025 and later): the planner's full count less
    # half its attention term, per GPU, in TFLOP
    full = model_flops_per_step(model, s)
    attn = 2 * (full - 2 * model_flops_per_step(model, replace(s, seq_length=s.seq_length // 2)))
    tflop_per_gpu = (full - attn / 2) / s.world_size / 1e12
    args = {"num_layers": 80, "hidden_size": 8192, "ffn_hidden_size": 28672, "num_attention_heads": 64,
            "num_query_groups": 8, "seq_length": 8192, "micro_batch_size": 1, "expert_model_parallel_size": 1,
            "num_experts": None, "bf16": True, "use_distributed_optimizer": True, "log_interval": 10,
            "train_iters": 5000}
    lines = [f"# {SYNTHETIC}", "srun: job 4242 queued and waiting for resources", "srun: job 4242 has been allocated resources"]
    for run, (n, start, seed) in enumerate(((15, datetime(2026, 4, 27, 21, 4, 11), 0.0),
                                            (12, datetime(2026, 4, 28, 8, 15, 40), 1.3))):
        times = [STEADY_MS * jitter(k, seed) * (1.005 if run else 1.0) for k in range(n)]
        if run == 0:
            times[8] *= 1.18    # a straggler interval
        nan = {10} if run == 1 else set()   # one step skipped on an inf/nan gradient norm
        body = megatron_run(times, gbs=s.global_batch_size, world=s.world_size, tp=s.tp, pp=s.pp, args=args,
                            first_ms=96_400.0, tflops_per_s=tflop_per_gpu, start=start, nan=nan,
                            lr=lambda it: 1.5e-4 * min(1.0, it / 200))   # --lr 1.5e-4, 200 warm-up iterations
        # the first logged interval averages iteration 1 (start-up) in: Megatron does not reset
        # its accumulators after the first-iteration line
        k = next(i for i, x in enumerate(body) if " iteration       10/" in x)
        body[k] = body[k].replace(f"elapsed time per iteration (ms): {times[0]:.1f}",
                                  f"elapsed time per iteration (ms): {(96_400.0 + 9 * times[0]) / 10:.1f}")
        out = []
        for x in body:
            is_iter = " iteration " in x and "elapsed time" in x
            out.append(("15: [default7]:" if is_iter else "0: [default0]:") + x)
            if " iteration       10/" in x:
                for stage in range(s.pp):
                    for t in range(s.tp):
                        rank = stage * s.gpus_per_stage + t   # dp rank 0 of each (tp, pp) rank prints
                        peak = pred.memory[stage].total / MIB + GAP_GIB[stage] * 1024 + 3.0 * t
                        reserved = peak / (1 - FRAGMENTATION[stage])
                        node, local = divmod(rank, 8)
                        out.append(f"{node}: [default{local}]:" + memory_line(
                            rank, 10, peak - 1830.0, peak, reserved - 1310.0, reserved,
                            reserved - 1310.0 + OUTSIDE_PYTORCH_MIB))
        lines += out
        if run == 0:
            lines += ["15: [default7]:[rank127]: RuntimeError: NCCL communicator was aborted on rank 127 (watchdog timeout)",
                      "srun: error: node-013: task 12: Exited with exit code 1",
                      "srun: Job step aborted: Waiting up to 32 seconds for job step to finish."]
    write(HERE / "llama3-70b-tp8-pp4.log", lines)
    write(HERE / "all_reduce_perf-1node.txt",
          nccl_output("all_reduce", 1, 8, 478.0, 19.5, one_process_per_gpu=False, hosts=["dgx-h100-001"]))
    write(HERE / "all_reduce_perf-2nodes.txt",
          nccl_output("all_reduce", 2, 8, 342.0, 41.0, hosts=["dgx-h100-001", "dgx-h100-002"]))
    print(f"planner predicts {pred.step_time_s:.2f} s per iteration; the example log says {STEADY_MS / 1e3:.2f} s")


if __name__ == "__main__":
    main()
