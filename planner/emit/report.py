"""Results as JSON-ready dicts (a stable contract, see docs/json.md) and rich tables."""

from __future__ import annotations

from ..units import GIB
from ..estimate import Estimate
from ..strategy import PLAN_JSON_FIELDS, Strategy



def strategy_to_dict(s: Strategy, model=None, stage_groups=None) -> dict:
    d = {
        "tensor_model_parallel_size": s.tp, "pipeline_model_parallel_size": s.pp,
        "data_parallel_size": s.dp, "context_parallel_size": s.cp,
        "expert_model_parallel_size": s.ep, "expert_tensor_parallel_size": s.expert_tp,
        "virtual_pipeline_model_parallel_size": s.vpp, "micro_batch_size": s.micro_batch_size,
        "global_batch_size": s.global_batch_size, "seq_length": s.seq_length,
        "num_microbatches": s.num_microbatches, "recompute": s.recompute,
        "recompute_num_layers": s.recompute_num_layers, "sequence_parallel": s.sp,
        "zero_stage": s.zero_stage, "precision": s.precision, "schedule": s.schedule,
        "overlap_grad_reduce": s.overlap_grad_reduce, "overlap_param_gather": s.overlap_param_gather,
        "offload_optimizer": s.offload_optimizer, "world_size": s.world_size,
        "chunk_layers": list(s.chunk_layers) if s.chunk_layers is not None else None,
        "recompute_modules": list(s.recompute_modules) if s.recompute == "selective" else None,
        "fp8_recipe": s.fp8_recipe if s.precision == "fp8" else None,
        "moe_token_dispatcher_type": s.moe_token_dispatcher_type if s.ep > 1 else None,
        **{f: getattr(s, f) for f in PLAN_JSON_FIELDS},
    }
    if model is not None:
        stages = []
        for i, (a, b) in enumerate(s.stage_layer_ranges(model)):
            st = {"stage": i, "layers": b - a, "first_layer": a}
            if stage_groups is not None:
                st["node_group"] = stage_groups[i]
                st["gpus"] = s.gpus_per_stage
            stages.append(st)
        d["stages"] = stages
    return d


def estimate_to_dict(e: Estimate) -> dict:
    peak = e.peak_memory
    plan = strategy_to_dict(e.strategy, e.model, e.stage_groups)
    hosts = _stage_nodes(e)
    for st, t in zip(plan["stages"], e.stage_times):
        st["gpu"] = t.gpu
        if hosts is not None:
            st["nodes"] = hosts[st["stage"]]
    per_stage = []
    for m, t in zip(e.memory, e.stage_times):
        per_stage.append({
            "stage": m.stage, "node_group": m.node_group, "gpu": t.gpu, "layers": m.layers,
            "parameters": m.parameters, "gradients": m.gradients, "optimizer": m.optimizer,
            "activations": m.activations, "buffers": m.buffers, "total_bytes": m.total,
            "capacity_bytes": m.capacity, "headroom_bytes": m.headroom, "fits": m.fits,
            "in_flight_microbatches": m.in_flight, "host_bytes": m.host_bytes,
            "forward_s_per_microbatch": t.forward_s, "backward_s_per_microbatch": t.backward_s,
            "exposed_comm_s_per_microbatch": t.exposed_comm_s,
        })
    return {
        "model": {"name": e.model.name, "parameters": e.model.parameters,
                  "active_parameters": e.model.active_parameters},
        "cluster": {"name": e.cluster.name, "gpus": e.cluster.num_gpus},
        "plan": plan,
        "memory": {
            "peak_bytes_per_gpu": max(m.total for m in e.memory),
            "capacity_bytes_per_gpu": peak.capacity,
            "fits": e.fits,
            "verdict": e.memory_verdict,
            "uncertainty_fraction": peak.uncertainty,
            "most_loaded_stage": peak.stage,
            "breakdown": {"parameters": peak.parameters, "gradients": peak.gradients,
                          "optimizer": peak.optimizer, "activations": peak.activations,
                          "buffers": peak.buffers},
            "per_stage": per_stage,
        },
        "communication": [c.as_dict() for c in e.communication],
        "time": {"step_s": e.step_time_s, "breakdown": e.breakdown},
        "throughput": {"tokens_per_s": e.tokens_per_s, "model_tflops_per_gpu": e.model_tflops_per_gpu,
                       "hardware_tflops_per_gpu": e.hardware_tflops_per_gpu, "mfu": e.mfu,
                       "mfu_basis": e.mfu_basis, "mfu_of_gemm_dtype_peak": e.mfu_gemm_peak},
    }


def _stage_nodes(e: Estimate):
    """Per stage, [first, last] node of its node group that hosts it (as launch.sh places
    them), when every stage sits on one node group."""
    from ..megatron.emit import stage_host_map
    if any("+" in g for g in e.stage_groups):
        return None
    gpn = {g.name: g.gpus_per_node for g in e.cluster.node_groups}
    return [r["group_nodes"] for r in stage_host_map(e.strategy, e.stage_groups, gpn)]


def compress_runs(items) -> str:
    """'h100 h100 a100' -> 'h100x2 a100x1' (runs of equal neighbours, for narrow tables)."""
    out = []
    for g in items:
        if out and out[-1][0] == g:
            out[-1][1] += 1
        else:
            out.append([g, 1])
    return " ".join(f"{g}x{n}" for g, n in out)


def _gib(x: float) -> str:
    return f"{x / GIB:.1f}"


def render_estimate(e: Estimate, console) -> None:
    from rich.table import Table

    s = e.strategy
    console.print(f"[bold]{e.model.name}[/] on [bold]{e.cluster.name}[/]: tp={s.tp} pp={s.pp} dp={s.dp} "
                  f"cp={s.cp} ep={s.ep} vpp={s.vpp} mbs={s.micro_batch_size} gbs={s.global_batch_size} "
                  f"seq={s.seq_length} recompute={s.recompute_label} sp={s.sp} zero={s.zero_stage} {s.precision}")
    t = Table(title="Memory per GPU by pipeline stage (GiB)")
    for col in ("stage", "group", "layers", "params", "grads", "optim", "activ", "buffers", "total",
                "usable", "fits"):
        t.add_column(col, justify="right")
    for m in e.memory:
        t.add_row(str(m.stage), m.node_group, str(m.layers), _gib(m.parameters), _gib(m.gradients),
                  _gib(m.optimizer), _gib(m.activations), _gib(m.buffers), _gib(m.total), _gib(m.capacity),
                  "[green]yes[/]" if m.fits else "[red]NO[/]")
    console.print(t)
    b = e.breakdown
    t2 = Table(title="Step time")
    t2.add_column("part")
    t2.add_column("seconds", justify="right")
    t2.add_row("step", f"{e.step_time_s:.3f}")
    t2.add_row("compute (critical stage)", f"{b['compute']:.3f}")
    for axis, v in b["exposed_communication_by_axis"].items():
        t2.add_row(f"exposed comm: {axis}", f"{v:.3f}")
    t2.add_row("pipeline bubble", f"{b['bubble']:.3f}")
    t2.add_row("optimizer", f"{b['optimizer']:.3f}")
    console.print(t2)
    console.print(f"tokens/s {e.tokens_per_s:,.0f}   model TFLOP/s/GPU {e.model_tflops_per_gpu:.1f}   "
                  f"hardware TFLOP/s/GPU {e.hardware_tflops_per_gpu:.1f}   {e.mfu_label}")
