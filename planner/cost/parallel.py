"""Communication of each parallel axis, one function per axis: what it sends, on which link,
and how much of it the step sees (the rest hides under compute).

Every function returns an AxisCost: seconds added to each micro-batch of its pipeline stage
(`per_microbatch_s`), seconds exposed once per step after the pipeline drains
(`after_step_s`), and ledger rows (CommEntry) whose `exposed_s` add up to exactly what the step
time charges for that stage, so `--explain`'s collective ledger and its step-time breakdown
agree. Sizes are bytes, times seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..placement import DataCollective, Placement, data_collectives
from ..specs.cluster import ClusterSpec, NodeGroup
from ..specs.model import ModelSpec
from ..strategy import Strategy
from .activations import BYTES_16BIT
from .comm import Link, collective_time, group_link, hierarchical_all_to_all_time, p2p_link
from .compute import FLASH_BACKWARD_FACTOR
from .memory import gradient_comm_bytes, param_gather_bytes, warmup_microbatches
from .moe_schedule import A2A, moe_layer_floor_s, moe_layer_seconds


@dataclass(frozen=True)
class CommEntry:
    axis: str            # tp | cp | ep | pp | dp | edp | embedding
    kind: str
    bytes: float         # message size per collective, bytes
    group_size: int
    count_per_step: float
    time_s: float        # per step, all occurrences, on this stage
    exposed_s: float     # per step, what this stage's timeline pays (not hidden under compute)
    link: str
    stage: int
    when: str = "per-microbatch"   # per-microbatch (inside the pipeline) | per-step (after it drains)

    def as_dict(self) -> dict:
        return {"axis": self.axis, "kind": self.kind, "bytes": self.bytes, "group_size": self.group_size,
                "count_per_step": self.count_per_step, "time_s": self.time_s, "exposed_s": self.exposed_s,
                "link": self.link, "stage": self.stage, "when": self.when}


@dataclass(frozen=True)
class AxisCost:
    axis: str
    per_microbatch_s: float = 0.0   # exposed seconds per micro-batch on this stage
    after_step_s: float = 0.0       # exposed seconds once per step (DP sync, tied embeddings)
    entries: tuple[CommEntry, ...] = ()


@dataclass(frozen=True)
class StageWork:
    """What the communication of one stage can hide under, per micro-batch (seconds)."""
    stage: int
    layers: int
    moe_layers: int
    forward_s: float
    backward_s: float
    core_attention_forward_s: float
    recompute_skipped_layers: int   # layers of a block-recompute stage that are not re-run
    microbatches: int
    layer_counts: dict              # (MoE?, fully recomputed?) -> layers of the stage
    layer_times: dict               # MoE? -> LayerTime on the GPU that sets the stage's pace


# ---- TP ---------------------------------------------------------------------------------------

def tp_layer_collectives(model: ModelSpec, s: Strategy, groups: list[NodeGroup], cluster: ClusterSpec,
                         moe: bool = False):
    """TP collectives of one layer and one micro-batch by when they run (Korthikanti et al. 2022,
    sec. 4.2.2; megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsync-
    Communication, and Transformer Engine's Linear, which overlap the same way):
    - forward: with SP an all-gather before each column-parallel linear (QKV, fc1) and a
      reduce-scatter after each row-parallel one (out-proj, fc2); without SP an all-reduce after
      each row-parallel linear. On the critical path.
    - backward, exposed: with SP the all-gather of the output gradient before a row-parallel
      linear's dgrad.
    - backward, under wgrad: the input-gradient reduce-scatter (SP) or all-reduce (no SP) of a
      column-parallel linear runs asynchronously while its weight gradient is computed.
    - backward, under dgrad: with SP the re-gather of the column-parallel input for its wgrad runs
      while its dgrad is computed.
    A dense layer has two such pairs (attention, MLP). A MoE layer has the attention's and its
    shared expert's, if any: with SP each TP rank routes its own s/tp tokens to the experts, so
    the routed experts add no TP collective (megatron/core/transformer/moe/moe_layer.py).
    Returns ({phase: [(kind, count, seconds each)]}, message bytes (the full [s/cp, b, h] bf16
    tensor), link)."""
    link = group_link(groups, s.tp, 1, cluster)
    msg = BYTES_16BIT * s.seq_length / s.cp * s.micro_batch_size * model.hidden_size
    ag, rs, ar = (collective_time(k, msg, s.tp, link) for k in ("all-gather", "reduce-scatter", "all-reduce"))
    pairs = 2 if not moe else 1 + (1 if model.moe_shared_expert_intermediate_size else 0)
    if s.sp:
        phases = {"forward": [("all-gather", pairs, ag), ("reduce-scatter", pairs, rs)],
                  "backward": [("all-gather", pairs, ag)],
                  "under-wgrad": [("reduce-scatter", pairs, rs)],
                  "under-dgrad": [("all-gather", pairs, ag)]}
    else:
        phases = {"forward": [("all-reduce", pairs, ar)], "backward": [], "under-wgrad": [("all-reduce", pairs, ar)],
                  "under-dgrad": []}
    return phases, msg, link


def _phase_s(rows) -> float:
    return sum(cnt * t1 for _, cnt, t1 in rows)


def tp_layer_exposed_s(phases: dict, lt, recomputed: bool, tp_comm_overlap: bool, async_backward: bool = True) -> float:
    """Seconds one layer's TP collectives add to a micro-batch, given its compute (LayerTime):
    the forward ones (twice when the layer is recomputed), the exposed backward ones, and what
    the asynchronous ones do not hide under the column-parallel GEMMs (wgrad and dgrad each take
    about the forward GEMM's time). With --tp-comm-overlap (Transformer Engine userbuffers)
    every collective is split into chunks pipelined with the neighbouring GEMMs, forward and
    backward: only what exceeds the layer's GEMM time shows."""
    fwd = _phase_s(phases["forward"]) * (2 if recomputed else 1)
    if tp_comm_overlap and lt.tp_overlap_gemms:
        return tp_overlap_exposed_s(phases, lt, recomputed)
    col = lt.column_parallel_gemm_forward if async_backward else 0.0
    return (fwd + _phase_s(phases["backward"]) + max(0.0, _phase_s(phases["under-wgrad"]) - col)
            + max(0.0, _phase_s(phases["under-dgrad"]) - col))


def _ring_pair_s(gemm_s: float, chunked_s: float, comm_s: float, tp: int) -> float:
    """A GEMM and its collective pipelined over tp chunks (Transformer Engine userbuffers' ring
    exchange, CommOverlapP2PBase::split_overlap_ag in comm_gemm_overlap.cpp): the first chunk
    is local and computed during the first of tp - 1 steps that each move 1/tp of the tensor,
    each later chunk once it arrived: max(tp chunks, one chunk + tp - 1 steps). Seconds beyond
    the GEMM's own time (the chunking loss when compute-bound)."""
    g_c, c_step = chunked_s / tp, comm_s / max(tp - 1, 1)
    return max(tp * g_c, g_c + (tp - 1) * c_step) - gemm_s


def tp_overlap_exposed_s(phases: dict, lt, recomputed: bool) -> float:
    """TP communication left exposed under --tp-comm-overlap (TE userbuffers, Megatron's default
    config): forward all-gathers and reduce-scatters run as ring exchanges with their GEMMs
    (fprop of QKV / out-projection / fc1 / fc2), backward the output-gradient all-gathers with
    the row-parallel dgrads; the column-parallel input re-gather and dgrad reduce-scatter are
    bulk overlaps under that linear's dgrad and wgrad. Chunking costs GEMM efficiency (m / tp
    rows per chunk), counted here as exposed TP time."""
    rows = {kind: t1 for kind, _, t1 in phases["forward"]}
    ag, rs = rows.get("all-gather", 0.0), rows.get("reduce-scatter", 0.0)
    tp = lt.tp_degree
    fwd = 0.0
    for i, (g, gc) in enumerate(lt.tp_overlap_gemms):
        fwd += _ring_pair_s(g, gc, ag if i % 2 == 0 else rs, tp)   # column-parallel: AG; row: RS
    bwd = 0.0
    for i, (g, gc) in enumerate(lt.tp_overlap_gemms):
        if i % 2 == 1:   # row-parallel dgrad with the all-gather of its output gradient
            bwd += _ring_pair_s(g, gc, ag, tp)
        else:            # column-parallel: bulk re-gather under dgrad, reduce-scatter under wgrad
            bwd += max(0.0, ag - g) + max(0.0, rs - g)
    return fwd * (2 if recomputed else 1) + bwd


def tp_cost(model: ModelSpec, s: Strategy, groups: list[NodeGroup], cluster: ClusterSpec, w: StageWork) -> AxisCost:
    if s.tp <= 1:
        return AxisCost("tp")
    # layers by (kind, recomputed?): layers of one kind cost the same
    exposed = 0.0
    counts: dict = {}
    for (moe, recomputed), n in w.layer_counts.items():
        if n <= 0:
            continue
        phases, msg, link = tp_layer_collectives(model, s, groups, cluster, moe)
        exposed += n * tp_layer_exposed_s(phases, w.layer_times[moe], recomputed, s.tp_comm_overlap,
                                          s.async_tensor_model_parallel_allreduce)
        for phase, rows in phases.items():
            for kind, cnt, t1 in rows:
                k = cnt * n * (2 if (phase == "forward" and recomputed) else 1)
                counts[kind] = (counts.get(kind, (0.0, t1))[0] + k, t1)
    raw = sum(c * t1 for c, t1 in counts.values())
    share = exposed / raw if raw > 0 else 0.0
    m = w.microbatches
    rows = tuple(CommEntry("tp", kind, msg, s.tp, c * m, t1 * c * m, t1 * c * m * share, link.bound_by, w.stage)
                 for kind, (c, t1) in counts.items())
    return AxisCost("tp", per_microbatch_s=exposed, entries=rows)


# ---- CP ---------------------------------------------------------------------------------------



def cp_ring_step(model: ModelSpec, s: Strategy, groups: list[NodeGroup], cluster: ClusterSpec):
    """(bytes of one K,V block, seconds of one ring step, link) of Megatron CP's p2p ring."""
    link = group_link(groups, s.cp, s.tp, cluster)
    g_loc = max(model.num_query_groups / s.tp, 1.0)
    tokens = s.seq_length / s.cp * s.micro_batch_size
    kv = 2 * BYTES_16BIT * tokens * g_loc * model.kv_channels   # K and V blocks
    return kv, collective_time("send-recv", kv, 2, link), link


def cp_layer_exposed_s(s: Strategy, t_step: float, core_forward_s: float) -> float:
    """Seconds one layer's ring adds to a micro-batch: the forward's cp - 1 K,V sends beyond
    its core attention, the backward's (K,V and their gradients) beyond flash attention's longer
    backward. Additive in layers: a stage's exposure is this times its layers."""
    comm_f = (s.cp - 1) * t_step
    return max(0.0, comm_f - core_forward_s) + max(0.0, 2 * comm_f - FLASH_BACKWARD_FACTOR * core_forward_s)


def cp_cost(model: ModelSpec, s: Strategy, groups: list[NodeGroup], cluster: ClusterSpec, w: StageWork) -> AxisCost:
    """Ring attention (Megatron CP, p2p): each of the cp - 1 steps sends a K,V block to the next
    rank while attention runs on the current one; backward passes K,V and their gradients."""
    if s.cp <= 1:
        return AxisCost("cp")
    kv, t_step, link = cp_ring_step(model, s, groups, cluster)
    comm_f = (s.cp - 1) * t_step * w.layers
    comm_b = 2 * comm_f
    # every layer runs the same core attention, so the stage's exposure is its layers' sum
    exposed = w.layers * cp_layer_exposed_s(s, t_step, w.core_attention_forward_s / max(w.layers, 1))
    m = w.microbatches
    return AxisCost("cp", per_microbatch_s=exposed,
                    entries=(CommEntry("cp", "send-recv", kv, s.cp, 3 * (s.cp - 1) * w.layers * m,
                                       (comm_f + comm_b) * m, exposed * m, link.bound_by, w.stage),))


# ---- EP ---------------------------------------------------------------------------------------

def remote_nodes_per_token(model: ModelSpec, ep_nodes: int) -> float:
    """Expected number of other nodes a token's top-k experts live on, when the EP group spans
    `ep_nodes` nodes with the experts spread evenly and routing balanced. Node-limited routing
    (--moe-router-num-groups G --moe-router-group-topk M, megatron/core/transformer/moe/
    moe_utils.py group-limited top-k) picks M of G expert groups first: with groups laid on nodes
    that is the units drawn; otherwise the k experts are. Distinct nodes hit by u draws without
    replacement from U units spread over N nodes: N (1 - C(U - U/N, u) / C(U, u)); a node is its
    own with probability 1/N."""
    N = ep_nodes
    if N <= 1:
        return 0.0
    if model.moe_router_num_groups and model.moe_router_group_topk:
        units, draws = model.moe_router_num_groups, model.moe_router_group_topk
    else:
        units, draws = model.num_experts, model.moe_router_topk
    per_node = units / N
    if per_node < 1:          # a unit spans several nodes: each draw reaches N / units of them
        hit = min(N, draws * N / units)
    else:
        miss = 1.0
        for i in range(int(draws)):   # C(U - U/N, u) / C(U, u) as a product
            miss *= max(0.0, (units - per_node - i) / (units - i))
        hit = N * (1.0 - miss)
    return hit * (1.0 - 1.0 / N)


def ep_layer_collectives(model: ModelSpec, s: Strategy, groups: list[NodeGroup], cluster: ClusterSpec):
    """Expert-parallel communication of one MoE layer and one micro-batch, by phase
    (megatron/core/transformer/moe/token_dispatcher.py). Per rank n = s*b/tp tokens enter the
    layer; each is routed to k experts.
    - alltoall dispatcher: an all-to-all of n*k token copies (h bf16 each, + their router
      probabilities) to the experts' ranks, one copy per (token, expert), no de-duplication;
      combine sends the expert outputs back (no probabilities); backward runs the two
      transposed (same volumes again).
    - flex dispatcher (DeepEP): a token crosses to each other node once, then fans out over
      NVLink (DeepEP README, "asymmetric-domain bandwidth forwarding"); node-limited routing
      bounds the nodes it reaches; the forward dispatch goes in fp8 under fp8 training.
    - allgather dispatcher: all-gather of the layer input over TP x EP, reduce-scatter back.
    - expert-TP > 1 adds an all-gather (dispatch) and reduce-scatter (combine) of the received
      tokens over the expert-TP group.
    Returns ({"forward": [(kind, count, seconds each, bytes)], "backward": [...]}, link)."""
    link = group_link(groups, s.ep, s.expert_tp, cluster)
    h, k = model.hidden_size, model.moe_router_topk
    n = s.seq_length / s.cp * s.micro_batch_size / s.tp
    r_dt = 4 if s.moe_router_dtype == "fp32" else BYTES_16BIT
    cf = max(model.moe_capacity_factor or 1.0, 1.0) if s.moe_pad_expert_input_to_capacity else 1.0
    copies = n * k * cf
    fwd, bwd = [], []
    if s.moe_token_dispatcher_type == "allgather":
        gathered = BYTES_16BIT * n * s.tp * s.ep * h
        glink = group_link(groups, s.tp * s.ep, 1, cluster)
        ag, rs = collective_time("all-gather", gathered, s.tp * s.ep, glink), collective_time(
            "reduce-scatter", gathered, s.tp * s.ep, glink)
        fwd += [("all-gather", 1, ag, gathered), ("reduce-scatter", 1, rs, gathered)]
        bwd += [("all-gather", 1, ag, gathered), ("reduce-scatter", 1, rs, gathered)]
        return {"forward": fwd, "backward": bwd}, glink
    if s.moe_token_dispatcher_type == "flex":
        remote = remote_nodes_per_token(model, link.nodes)
        on_frac = (link.ranks_per_node - 1) / max(link.ranks_per_node, 1)
        for phase, dispatch_bytes in (("forward", 1.0 if s.precision == "fp8" else BYTES_16BIT),
                                      ("backward", BYTES_16BIT)):
            out = fwd if phase == "forward" else bwd
            for kind, el in (("dispatch", dispatch_bytes), ("combine", BYTES_16BIT)):
                off = n * remote * h * el
                on = copies * h * el * on_frac
                out.append(("all-to-all", 1, hierarchical_all_to_all_time(on, off, link), off + on))
    else:
        # dispatch sends each token copy with its router probability (a second all-to-all of
        # permuted_probs, folded in here), combine the expert outputs alone
        # (MoEAlltoAllTokenDispatcher.token_dispatch / token_combine); backward the transposes:
        # the combine's carries the outputs' gradients, the dispatch's the inputs' and the
        # probabilities' gradients
        with_probs, hidden = copies * (h * BYTES_16BIT + r_dt), copies * h * BYTES_16BIT
        for out in (fwd, bwd):
            for msg in (with_probs, hidden):
                out.append(("all-to-all", 1, collective_time("all-to-all", msg, s.ep, link), msg))
    if s.expert_tp > 1:
        recv = BYTES_16BIT * copies * s.expert_tp * h
        elink = group_link(groups, s.expert_tp, 1, cluster)
        for out in (fwd, bwd):
            out += [("all-gather", 1, collective_time("all-gather", recv, s.expert_tp, elink), recv),
                    ("reduce-scatter", 1, collective_time("reduce-scatter", recv, s.expert_tp, elink), recv)]
    return {"forward": fwd, "backward": bwd}, link


def ep_a2a(phases: dict) -> A2A:
    """One MoE layer's EP collectives per micro-batch (ep_layer_collectives) as the schedule's
    forward and backward all-to-all seconds."""
    return A2A(sum(c * t1 for _, c, t1, _ in phases["forward"]), sum(c * t1 for _, c, t1, _ in phases["backward"]))


def ep_overlapped(s: Strategy) -> bool:
    """Whether the EP-overlap schedule runs (Megatron asserts expert parallelism for it)."""
    return s.overlap_moe_expert_parallel_comm and s.ep > 1


def moe_recomputed(s: Strategy) -> bool:
    return s.recompute == "full" or (s.recompute == "selective" and "moe" in s.recompute_modules)


def moe_alone_share(s: Strategy, stage: int) -> float:
    """Share of a stage's chunk steps that run a forward or a backward alone under the EP-overlap
    schedule: its warm-up forwards (and as many cool-down backwards), which include the one
    extra forward that keeps each merged forward and backward independent (one forward alone
    without pipelining, combined_1f1b.py); 0 without it."""
    if not ep_overlapped(s):
        return 0.0
    return warmup_microbatches(s, stage) / (s.num_microbatches * s.vpp)


def _schedule_flags(s: Strategy, recomputed: bool) -> dict:
    """The launch's choices a MoE layer's schedule depends on (cost/moe_schedule.py)."""
    return {"overlap": ep_overlapped(s), "delay_wgrad": s.delay_wgrad_compute, "rerun": recomputed,
            "full_recompute": recomputed and s.recompute == "full", "shared_overlap": s.moe_shared_expert_overlap}


def moe_layer_costs(lt, s: Strategy, a2a: A2A, alone_share: float, recomputed: bool) -> tuple[float, float]:
    """(compute, exposed EP) seconds of one MoE layer per micro-batch (cost/moe_schedule.py),
    `recomputed`: the layer is fully recomputed (or its MoE block re-run)."""
    return moe_layer_seconds(lt.moe_nodes, a2a, alone_share=alone_share, **_schedule_flags(s, recomputed))


def moe_layer_floor(lt, s: Strategy, a2a: A2A, recomputed: bool) -> float:
    """The least compute + exposed EP seconds of one MoE layer over every stage's warm-up share."""
    return moe_layer_floor_s(lt.moe_nodes, a2a, **_schedule_flags(s, recomputed))


def ep_cost(model: ModelSpec, s: Strategy, groups: list[NodeGroup], cluster: ClusterSpec, w: StageWork,
            moe_skipped: int) -> AxisCost:
    """What the token all-to-alls add to a stage's micro-batch beyond its MoE layers' compute:
    the layers placed with and without them by the schedule that runs (cost/moe_schedule.py)."""
    if not (model.is_moe and s.ep > 1 and w.moe_layers):
        return AxisCost("ep")
    phases, link = ep_layer_collectives(model, s, groups, cluster)
    a2a = ep_a2a(phases)
    lt = w.layer_times[True]
    recomputed_n = (w.moe_layers - moe_skipped) if moe_recomputed(s) else 0
    plain_n = w.moe_layers - recomputed_n
    share = moe_alone_share(s, w.stage)
    exposed = (recomputed_n * moe_layer_costs(lt, s, a2a, share, True)[1]
               + plain_n * moe_layer_costs(lt, s, a2a, share, False)[1])
    rows: dict = {}
    for phase, items in phases.items():
        for kind, cnt, t1, msg in items:
            times = cnt * (w.moe_layers + (recomputed_n if phase == "forward" else 0))
            key = (kind, msg)
            c0, _ = rows.get(key, (0.0, t1))
            rows[key] = (c0 + times, t1)
    raw = sum(c * t1 for c, t1 in rows.values())
    frac = exposed / raw if raw > 0 else 0.0
    m = w.microbatches
    return AxisCost("ep", per_microbatch_s=exposed,
                    entries=tuple(CommEntry("ep", kind, msg, s.ep, c * m, t1 * c * m, t1 * c * m * frac,
                                            link.bound_by, w.stage) for (kind, msg), (c, t1) in rows.items()))


# ---- PP ---------------------------------------------------------------------------------------

def stages_share_node(s: Strategy, i: int, j: int, groups_i: list[NodeGroup], groups_j: list[NodeGroup]) -> bool:
    """Whether pipeline stages i and j sit on one scale-up domain (a node, or the group's
    scale_up_domain_gpus of consecutive nodes): torchrun puts global rank r on node r // G, so
    on domain r // D, and stage k holds ranks [k * per, (k + 1) * per) (Megatron's rank order)."""
    if len(groups_i) != 1 or groups_i != groups_j:
        return False
    G, per = groups_i[0].domain_gpus, s.gpus_per_stage
    lo, hi = min(i, j) * per, (max(i, j) + 1) * per - 1
    return lo // G == hi // G


def pp_message_bytes(model: ModelSpec, s: Strategy) -> float:
    """Bytes one rank sends per pipeline hop. Megatron-Core sends the [s/cp, b, h] activation in
    the params dtype from every TP rank, split along s over TP only under SP
    (megatron/core/pipeline_parallel/p2p_communication.py, schedules.py); the legacy scatter /
    gather (Strategy.scatter_gather_tensors_in_pipeline) sent each rank's 1/tp slice."""
    full = BYTES_16BIT * s.seq_length / s.cp * s.micro_batch_size * model.hidden_size
    return full / s.tp if (s.sp or s.scatter_gather_tensors_in_pipeline) else full


def pp_gather_s(model: ModelSpec, s: Strategy, groups: list[NodeGroup], cluster: ClusterSpec) -> float:
    """With the legacy scatter / gather and no SP: the all-gather over the TP group that rebuilds
    a received activation (the scatter side is a local slice). Zero otherwise."""
    if s.tp <= 1 or s.sp or not s.scatter_gather_tensors_in_pipeline:
        return 0.0
    full = BYTES_16BIT * s.seq_length / s.cp * s.micro_batch_size * model.hidden_size
    return collective_time("all-gather", full, s.tp, group_link(groups, s.tp, 1, cluster))


def pp_cost(model: ModelSpec, s: Strategy, stage_groups: list[list[NodeGroup]], i: int, slow: NodeGroup,
            cluster: ClusterSpec, w: StageWork) -> AxisCost:
    """Activations forward and gradients backward, per boundary and virtual chunk; a stage waits
    for its slower neighbour link."""
    if s.pp <= 1:
        return AxisCost("pp")
    msg = pp_message_bytes(model, s)
    groups = stage_groups[i]
    t_pp = 0.0
    rows = []
    m = w.microbatches
    for nb in ([i - 1] if i > 0 else []) + ([i + 1] if i < s.pp - 1 else []):
        same = stages_share_node(s, i, nb, groups, stage_groups[nb])
        link = p2p_link(slow, stage_groups[nb][0], same, cluster)
        t1 = collective_time("send-recv", msg, 2, link)
        t_pp = max(t_pp, t1)
        n_p2p = 2 * s.vpp * m   # per neighbour and chunk: one activation and one gradient transfer
        rows.append((msg, n_p2p, n_p2p * t1, link.bound_by))
    # sends to one neighbour overlap receives from the other (batched isend/irecv): a
    # micro-batch waits 2 hops per chunk on its slower boundary (each followed by the TP
    # all-gather that rebuilds the tensor under the legacy scatter / gather)
    exposed = 2 * s.vpp * (t_pp + pp_gather_s(model, s, groups, cluster))
    total = sum(r[2] for r in rows)
    share = exposed * m / total if total > 0 else 0.0
    return AxisCost("pp", per_microbatch_s=exposed,
                    entries=tuple(CommEntry("pp", "send-recv", b, 2, n, t, t * share, why, i) for b, n, t, why in rows))


# ---- DP ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageDataCollective:
    """One data-parallel collective of a stage (placement.data_collectives) on its ranks: the
    DP x CP group for dense parameters, the expert-data-parallel group for experts."""
    collective: DataCollective
    ranks: int
    axis: str               # dp | edp
    link: Link
    bytes_per_param: float  # bytes sent per parameter (gradient or gathered parameter dtype)


def dp_collectives(s: Strategy, placement: Placement, groups: list[NodeGroup],
                   cluster: ClusterSpec) -> list[StageDataCollective]:
    """The stage's data-parallel collectives over more than one rank."""
    out = []
    for dc in data_collectives(placement):
        if dc.group == "experts":
            n, stride, axis = s.expert_dp, s.expert_tp * s.ep, "edp"
        else:
            n, stride, axis = s.dp * s.cp, s.tp, "dp"
        if n <= 1:
            continue
        el = gradient_comm_bytes(s) if dc.tensor == "gradients" else param_gather_bytes(s)
        out.append(StageDataCollective(dc, n, axis, group_link(groups, n, stride, cluster), el))
    return out


def dp_step_exposed_s(comm_s, hide_s, n_layers, overlapped: bool):
    """Seconds of a stage's per-step DP collectives (comm_s) the step sees after the pipeline
    drains: with overlap they run bucket by bucket under the last micro-batch's backward
    (gradients; the first forward for parameter gathers: hide_s), all but the last bucket (one
    layer's worth) hidden up to hide_s; without, all of it. Works on numpy arrays (the bounds
    price a stage at every layer count at once)."""
    if not overlapped:
        return comm_s
    return np.maximum(comm_s - hide_s, 0.0) + comm_s / n_layers


def dp_cost(model: ModelSpec, s: Strategy, placement: Placement, groups: list[NodeGroup], cluster: ClusterSpec,
            w: StageWork, per_rank: dict) -> AxisCost:
    """Data-parallel (and expert-data-parallel) collectives from the placement table: per step
    (gradient reduce, parameter gather) or per micro-batch (ZeRO-3 gathers and reduces). With
    overlap, per-step traffic hides under the last micro-batch's backward (gradients) and the
    first one's forward (parameters), except the last bucket (one layer's worth).

    ZeRO-2/3 is Megatron-FSDP (NVIDIA/Megatron-LM d98e8a64, megatron/core/distributed/fsdp/):
    - groups: dense parameters shard over DP x CP, expert parameters over the expert-data-
      parallel group, EDP = world / (ETP x EP x PP) ranks ETP x EP apart (mcore_fsdp_adapter.py:
      366-371; parallel_state.py:887-895, expert order tp-ep-dp-pp), each group its own collective
      (param_and_grad_buffer.py:2590-2626, buffers per (FSDP unit, expert?) group);
    - ZeRO-3 all-gathers a layer (the FSDP unit) before its forward and again before its
      backward, once for a full recompute and the backward together, every micro-batch
      (src/megatron_fsdp/megatron_fsdp.py:128-130, :794-811, :918-929; released after the
      forward, :977-1000), prefetching the next unit on a side stream, so within a pass the
      gathers hide under compute except the first unit's;
    - ZeRO-2/3 reduce-scatter the gradients after every backward, not only the last
      micro-batch's (megatron_fsdp.py:761-779 grad_reduce_every_bprop), into the sharded buffer;
    - bytes: parameters in the model's dtype (param_gather_bytes), gradients in Megatron-FSDP's
      main-grads dtype, the model's dtype by default (memory.MEGATRON_FSDP_GRAD_BYTES)."""
    m = w.microbatches
    n_layers = max(w.layers, 1)
    step = {"grad": 0.0, "param": 0.0}
    mb = {"fwd": 0.0, "bwd": 0.0}
    raw = []   # (axis, kind, bytes, n, count, seconds each, bucket)
    for c in dp_collectives(s, placement, groups, cluster):
        dc = c.collective
        if per_rank[dc.group] <= 0:
            continue
        msg = per_rank[dc.group] * c.bytes_per_param
        t1 = collective_time(dc.kind, msg, c.ranks, c.link)
        if dc.when == "per-step":
            bucket = "grad" if dc.tensor == "gradients" else "param"
            step[bucket] += t1
            cnt = 1
        else:
            bucket = "fwd" if dc.when.endswith("forward") else "bwd"
            mb[bucket] += t1
            cnt = m
        raw.append((c.axis, dc.kind, msg, c.ranks, cnt, t1, bucket, c.link.bound_by))
    per_mb = 0.0
    if mb["fwd"] or mb["bwd"]:
        per_mb = (max(0.0, mb["fwd"] - w.forward_s) + max(0.0, mb["bwd"] - w.backward_s)
                  + (mb["fwd"] + mb["bwd"]) / n_layers)
    exposed = {"grad": float(dp_step_exposed_s(step["grad"], w.backward_s, n_layers, s.overlap_grad_reduce)),
               "param": float(dp_step_exposed_s(step["param"], w.forward_s, n_layers, s.overlap_param_gather))}
    after = exposed["grad"] + exposed["param"]
    # each row's exposed share: its bucket's exposed time in proportion to its own time
    exposed_of = {"grad": 0.0, "param": 0.0, "fwd": 0.0, "bwd": 0.0}
    for bucket in ("grad", "param"):
        if step[bucket]:
            exposed_of[bucket] = exposed[bucket] / step[bucket]
    if mb["fwd"] or mb["bwd"]:
        share = per_mb / (mb["fwd"] + mb["bwd"])
        exposed_of["fwd"] = exposed_of["bwd"] = share
    rows = tuple(CommEntry(axis, kind, msg, n, cnt, t1 * cnt, t1 * cnt * exposed_of[bucket], why, w.stage,
                           "per-step" if bucket in ("grad", "param") else "per-microbatch")
                 for axis, kind, msg, n, cnt, t1, bucket, why in raw)
    return AxisCost("dp", per_microbatch_s=per_mb, after_step_s=after, entries=rows)


def tied_embedding_cost(model: ModelSpec, s: Strategy, stage_groups: list[list[NodeGroup]], i: int,
                        slow: NodeGroup, cluster: ClusterSpec) -> AxisCost:
    """Tied input/output embeddings on the first and last stage: an all-reduce of the embedding
    gradient between the two once per step (Megatron's embedding group)."""
    if not (s.pp > 1 and not model.untie_embeddings_and_output_weights and i in (0, s.pp - 1)):
        return AxisCost("embedding")
    other = stage_groups[s.pp - 1 if i == 0 else 0][0]
    link = p2p_link(slow, other, False, cluster)
    msg = model.embedding_params(s.tp) / s.tp * gradient_comm_bytes(s)
    t = collective_time("all-reduce", msg, 2, link)
    return AxisCost("embedding", after_step_s=t,
                    entries=(CommEntry("embedding", "all-reduce", msg, 2, 1, t, t, link.bound_by, i, "per-step"),))
