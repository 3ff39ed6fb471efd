"""`--explain` for MoE models: one MoE layer of the critical stage, per micro-batch, term by term.

The step time prices a MoE layer as its schedule places it (cost/moe_schedule.py): its GPU work
by part, the host issuing its kernels (and waiting for the token counts under dropless
routing), the token all-to-alls and what overlap hides of them. This breaks that one number
apart so a user can see which of them sets it. Seconds are per layer and micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.moe_schedule import NO_A2A
from ..cost.parallel import ep_a2a, ep_layer_collectives, moe_alone_share, moe_layer_costs, moe_recomputed
from ..estimate import Estimate, layer_time_of, time_key

MS = 1e3

# parts as --explain names them, in the order a layer runs them
PART_LABELS = {
    "norm_attn": "attention norm", "qkv": "QKV GEMM", "mla_up": "MLA up-projections", "qk_norm": "QK norm",
    "rope": "RoPE", "core_attn": "core attention", "proj": "output projection", "residual_attn": "residual",
    "norm_mlp": "MLP norm", "router": "router", "permute": "permute (token dispatch prep)",
    "experts_fc1": "expert fc1 (grouped GEMM)", "moe_act": "expert activation",
    "experts_fc2": "expert fc2 (grouped GEMM)", "unpermute": "unpermute", "shared": "shared expert",
    "residual_mlp": "residual",
}


@dataclass(frozen=True)
class MoELayerTerms:
    stage: int
    gpu: str
    parts_forward_s: tuple[tuple[str, float], ...]   # GPU seconds of the forward by part
    gpu_forward_s: float
    gpu_backward_s: float      # input gradients (and recomputed parts)
    gpu_weight_s: float        # weight gradients
    host_s: float              # host seconds to issue the layer's kernels (forward + backward)
    synced: bool               # dropless: the host waits for the token counts each forward
    all_to_all_forward_s: float   # dispatch + combine
    all_to_all_backward_s: float
    scheduled_s: float         # compute as the schedule places it (the all-to-alls taking no time)
    exposed_all_to_all_s: float   # what the all-to-alls add to it
    overlap: bool              # --overlap-moe-expert-parallel-comm
    rerun: bool                # the backward re-runs the forward, all-to-alls included (recompute)

    @property
    def gpu_s(self) -> float:
        return self.gpu_forward_s + self.gpu_backward_s + self.gpu_weight_s

    @property
    def host_wait_s(self) -> float:
        """Seconds the GPU idles on the host (issue, token-count syncs) beyond its own work."""
        return max(self.scheduled_s - self.gpu_s, 0.0)

    @property
    def hidden_all_to_all_s(self) -> float:
        raw = self.all_to_all_forward_s * (2 if self.rerun else 1) + self.all_to_all_backward_s
        return max(raw - self.exposed_all_to_all_s, 0.0)


def moe_layer_terms(e: Estimate) -> MoELayerTerms | None:
    """One MoE layer of the critical stage (None for a dense model or a stage without MoE
    layers), from the same cost functions the step time uses."""
    model, s, cluster = e.model, e.strategy, e.cluster
    stage = e.breakdown["critical_stage"]
    start, end = s.stage_layer_ranges(model)[stage]
    if not model.is_moe or model.num_moe_layers_in(start, end) == 0:
        return None
    groups = [cluster.group(name) for name in e.stage_groups[stage].split("+")]
    gpu = groups[0].gpu
    lt = layer_time_of(model, time_key(s), gpu, True)   # the estimate's own (cached) layer time
    a2a = ep_a2a(ep_layer_collectives(model, s, groups, cluster)[0]) if s.ep > 1 else NO_A2A
    scheduled, exposed = moe_layer_costs(lt, s, a2a, moe_alone_share(s, stage), moe_recomputed(s))
    n = lt.moe_nodes
    units = (n.pre, n.experts, n.post)
    return MoELayerTerms(
        stage=stage, gpu=gpu.name, parts_forward_s=lt.parts_forward,
        gpu_forward_s=sum(u.forward_s for u in units), gpu_backward_s=sum(u.backward_s for u in units),
        gpu_weight_s=sum(u.weight_s for u in units),
        host_s=sum(u.host_forward_s + u.host_backward_s for u in units) + 4 * n.host_a2a_s, synced=n.synced,
        all_to_all_forward_s=a2a.forward_s, all_to_all_backward_s=a2a.backward_s, scheduled_s=scheduled,
        exposed_all_to_all_s=exposed, overlap=s.overlap_moe_expert_parallel_comm and s.ep > 1,
        rerun=moe_recomputed(s))


def render_moe_layer(e: Estimate, console) -> None:
    """The MoE layer table of --explain (nothing for a dense model)."""
    from rich.table import Table

    t = moe_layer_terms(e)
    if t is None:
        return
    table = Table(title=f"One MoE layer of stage {t.stage} ({t.gpu}), per micro-batch")
    table.add_column("term")
    table.add_column("ms", justify="right")
    for part, sec in t.parts_forward_s:
        table.add_row(f"forward: {PART_LABELS.get(part, part)}", f"{sec * MS:.3f}")
    rows = [("GPU forward", t.gpu_forward_s), ("GPU backward (input gradients, recompute)", t.gpu_backward_s),
            ("GPU weight gradients", t.gpu_weight_s),
            ("host issuing its kernels" + (" (waits for token counts each forward)" if t.synced else ""), t.host_s),
            ("layer as scheduled, all-to-alls aside", t.scheduled_s),
            ("  of which the GPU waits on the host", t.host_wait_s),
            ("token all-to-alls, forward (dispatch + combine)", t.all_to_all_forward_s),
            ("token all-to-alls, backward" + (" (and the forward's again: recompute)" if t.rerun else ""),
             t.all_to_all_backward_s),
            ("  exposed", t.exposed_all_to_all_s),
            ("  hidden" + (" (EP overlap schedule)" if t.overlap else ""), t.hidden_all_to_all_s)]
    for label, sec in rows:
        table.add_row(label, f"{sec * MS:.3f}")
    console.print(table)
