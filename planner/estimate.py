"""Estimate one strategy on one cluster: per-stage memory, the communication ledger, step time
and throughput. This is the function `planner estimate` and the search call."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from .errors import InvalidStrategy
from .placement import data_collectives, placement_of, validate
from .specs.cluster import ClusterSpec, NodeGroup
from .specs.model import ModelSpec
from .strategy import Strategy, check_structure
from .cost import compute as C
from .cost.activations import BYTES_16BIT, expert_tokens_per_rank
from .cost.comm import collective_time, group_link, p2p_link
from .cost.memory import BYTES_PER_PARAM, StageMemory, fully_recomputed_layers, stage_memory, stage_params
from .cost.pipeline import pipeline_time

# Host-side Adam for an offloaded optimizer streams the same 34 bytes/parameter through host
# DRAM; a dual-socket server sustains ~200 GB/s (e.g. 2 x 8-channel DDR5-4800 = 614 GB/s peak,
# STREAM ~ 1/3 of that), shared by the node's GPUs. Planner assumption.
HOST_ADAM_BANDWIDTH_BYTES_PER_S = 200e9


@dataclass(frozen=True)
class CommEntry:
    axis: str            # tp | cp | ep | pp | dp | edp | embedding
    kind: str
    bytes: float         # message size per collective, bytes
    group_size: int
    count_per_step: float
    time_s: float        # per step, all occurrences
    exposed_s: float     # per step, not hidden under compute
    link: str
    stage: int

    def as_dict(self) -> dict:
        return {"axis": self.axis, "kind": self.kind, "bytes": self.bytes, "group_size": self.group_size,
                "count_per_step": self.count_per_step, "time_s": self.time_s, "exposed_s": self.exposed_s,
                "link": self.link, "stage": self.stage}


@dataclass(frozen=True)
class StageTime:
    stage: int
    node_group: str
    gpu: str
    layers: int
    forward_s: float           # per micro-batch, compute
    backward_s: float          # per micro-batch, compute (incl. recompute)
    weight_grad_s: float       # part of backward_s that is weight-gradient work
    exposed_comm_s: float      # per micro-batch: TP, CP, EP, PP, per-microbatch DP
    exposed_by_axis: tuple     # ((axis, seconds per micro-batch), ...)
    after_step_s: float        # once per step: exposed DP sync + optimizer + tied-embedding
    optimizer_s: float
    dp_exposed_s: float

    @property
    def per_microbatch_s(self) -> float:
        return self.forward_s + self.backward_s + self.exposed_comm_s


@dataclass(frozen=True)
class Estimate:
    model: ModelSpec
    cluster: ClusterSpec
    strategy: Strategy
    memory: tuple[StageMemory, ...]
    stage_times: tuple[StageTime, ...]
    communication: tuple[CommEntry, ...]
    step_time_s: float
    breakdown: dict
    model_flops_per_step: float
    hardware_flops_per_step: float
    peak_flops_total: float
    stage_groups: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return all(m.fits for m in self.memory)

    @property
    def peak_memory(self) -> StageMemory:
        return max(self.memory, key=lambda m: m.total / m.capacity)

    @property
    def tokens_per_s(self) -> float:
        return self.strategy.global_batch_size * self.strategy.seq_length / self.step_time_s

    @property
    def mfu(self) -> float:
        return self.model_flops_per_step / (self.step_time_s * self.peak_flops_total)

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops_per_step / self.step_time_s / self.strategy.world_size / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        return self.hardware_flops_per_step / self.step_time_s / self.strategy.world_size / 1e12


def assign_stage_groups(cluster: ClusterSpec, s: Strategy) -> list[list[NodeGroup]]:
    """Node groups spanned by each pipeline stage. With `stage_node_groups` set, stage i takes
    the next free nodes of that group; otherwise stages fill the cluster in its listed order."""
    need = s.gpus_per_stage
    if s.world_size > cluster.num_gpus:
        raise InvalidStrategy("world-size", f"tp x cp x dp x pp = {s.world_size} GPUs, the cluster has "
                              f"{cluster.num_gpus}")
    if s.stage_node_groups is not None:
        used = {g.name: 0 for g in cluster.node_groups}
        out = []
        for i, name in enumerate(s.stage_node_groups):
            try:
                g = cluster.group(name)
            except KeyError:
                raise InvalidStrategy("stage-node-groups", f"stage {i}: unknown node group {name!r}") from None
            used[name] += need
            if used[name] > g.num_gpus:
                raise InvalidStrategy("stage-node-groups",
                                      f"node group {name} has {g.num_gpus} GPUs, its stages need {used[name]}")
            out.append([g])
        return out
    out = []
    groups = list(cluster.node_groups)
    gi, offset = 0, 0
    for _ in range(s.pp):
        spanned = []
        left = need
        while left > 0:
            g = groups[gi]
            take = min(left, g.num_gpus - offset)
            if g not in spanned:
                spanned.append(g)
            left -= take
            offset += take
            if offset >= g.num_gpus:
                gi, offset = gi + 1, 0
        out.append(spanned)
    return out


def stages_share_node(s: Strategy, i: int, j: int, groups_i: list[NodeGroup], groups_j: list[NodeGroup]) -> bool:
    """Whether pipeline stages i and j sit on one node: torchrun puts global rank r on node
    r // G, and stage k holds ranks [k * per, (k + 1) * per) (Megatron's rank order)."""
    if len(groups_i) != 1 or groups_i != groups_j:
        return False
    G, per = groups_i[0].gpus_per_node, s.gpus_per_stage
    lo, hi = min(i, j) * per, (max(i, j) + 1) * per - 1
    return lo // G == hi // G


@lru_cache(maxsize=65536)
def _layer_time(model, s_key, gpu, moe):
    return C.layer_time(model, s_key, gpu, moe)


def _time_key(s: Strategy) -> Strategy:
    """The fields a layer's compute time depends on (for caching across the search)."""
    return Strategy(tp=s.tp, cp=s.cp, ep=s.ep, etp=s.etp, micro_batch_size=s.micro_batch_size,
                    seq_length=s.seq_length, recompute=s.recompute, sequence_parallel=s.sequence_parallel,
                    precision=s.precision, fused_attention=s.fused_attention)


def tp_layer_collectives(model: ModelSpec, s: Strategy, groups: list[NodeGroup], cluster: ClusterSpec):
    """TP collectives of one layer and one micro-batch (Korthikanti et al. 2022, sec. 4.2.2):
    with SP 2 all-gathers + 2 reduce-scatters forward and the same backward, else 2 all-reduces
    each way; full recompute repeats the forward ones. Returns ([(kind, count, seconds each)],
    message bytes (the full [s/cp, b, h] bf16 tensor), link)."""
    link = group_link(groups, s.tp, 1, cluster)
    msg = BYTES_16BIT * s.seq_length / s.cp * s.micro_batch_size * model.hidden_size
    passes = 2.0 + (1.0 if s.recompute == "full" else 0.0)   # fwd, bwd, re-run fwd
    kinds = [("all-gather", 2), ("reduce-scatter", 2)] if s.sp else [("all-reduce", 2)]
    return [(kind, cnt * passes, collective_time(kind, msg, s.tp, link)) for kind, cnt in kinds], msg, link


def ep_layer_collective(model: ModelSpec, s: Strategy, groups: list[NodeGroup], cluster: ClusterSpec):
    """EP all-to-alls of one MoE layer and one micro-batch: dispatch + combine, forward and
    backward (and the re-run forward under full recompute). Returns (count, seconds each,
    bytes each rank sends, link)."""
    link = group_link(groups, s.ep, s.expert_tp, cluster)
    msg = BYTES_16BIT * expert_tokens_per_rank(model, s) * model.hidden_size / s.expert_tp
    count = 2 * (2 + (1 if s.recompute == "full" else 0))
    return count, collective_time("all-to-all", msg, s.ep, link), msg, link


def estimate(model: ModelSpec, cluster: ClusterSpec, s: Strategy) -> Estimate:
    check_structure(s, model)
    stage_groups = assign_stage_groups(cluster, s)
    placement = placement_of(s)
    validate(placement)
    bpp = BYTES_PER_PARAM[s.optimizer_convention]
    m = s.num_microbatches
    tk = _time_key(s)
    ranges = s.stage_layer_ranges(model)
    M = s.seq_length / s.cp * s.micro_batch_size
    h = model.hidden_size
    memory, times, ledger = [], [], []
    recomputed = 0   # fully recomputed layers over all stages
    for i, groups in enumerate(stage_groups):
        # the slowest GPU spanned sets the pace; the smallest memory sets the capacity
        mems = [stage_memory(model, s, placement, i, g.gpu, "+".join(x.name for x in groups)) for g in groups]
        memory.append(min(mems, key=lambda x: x.capacity))
        start, end = ranges[i]
        n_moe = model.num_moe_layers_in(start, end)
        n_dense = (end - start) - n_moe
        # layers that skip the recompute under --recompute-num-layers (block method)
        full_set = fully_recomputed_layers(s, start, end)
        recomputed += len(full_set)
        n_moe_full = sum(1 for k in full_set if model.is_moe_layer(k))
        skip_dense, skip_moe = ((n_dense - (len(full_set) - n_moe_full), n_moe - n_moe_full)
                                if s.recompute == "full" else (0, 0))
        best = None
        for g in groups:
            lt_d = _layer_time(model, tk, g.gpu, False)
            lt_m = _layer_time(model, tk, g.gpu, True) if model.is_moe else lt_d
            f = n_dense * lt_d.forward + n_moe * lt_m.forward
            bwd = (n_dense * (lt_d.backward_input + lt_d.backward_weight + lt_d.recompute)
                   + n_moe * (lt_m.backward_input + lt_m.backward_weight + lt_m.recompute)
                   - skip_dense * lt_d.recompute - skip_moe * lt_m.recompute)
            w = n_dense * lt_d.backward_weight + n_moe * lt_m.backward_weight
            core = n_dense * lt_d.core_attention_forward + n_moe * lt_m.core_attention_forward
            if i == 0:
                ef, eb = C.embedding_time(model, s, g.gpu)
                f, bwd = f + ef, bwd + eb
            if i == s.pp - 1:
                of, ob = C.output_layer_time(model, s, g.gpu)
                f, bwd = f + of, bwd + ob
            if best is None or f + bwd > best[0] + best[1]:
                best = (f, bwd, w, core, g)
        f, bwd, w, core, gslow = best
        gpu_slow = gslow.gpu   # the GPU that sets this stage's pace
        n_layers = end - start
        exposed = {}
        # --- TP: per layer, fwd and bwd; recompute=full repeats the forward collectives
        if s.tp > 1:
            per_layer, msg, link = tp_layer_collectives(model, s, groups, cluster)
            entries = [(kind, cnt * n_layers, t1) for kind, cnt, t1 in per_layer]
            if skip_dense + skip_moe:   # layers not recomputed do not repeat their forward collectives
                plain, _, _ = tp_layer_collectives(model, replace(s, recompute="none"), groups, cluster)
                entries = [(kind, cnt * (n_layers - skip_dense - skip_moe) + cnt0 * (skip_dense + skip_moe), t1)
                           for (kind, cnt, t1), (_, cnt0, _) in zip(per_layer, plain)]
            raw = sum(n_coll * t1 for _, n_coll, t1 in entries)
            tot = raw
            if s.tp_comm_overlap:
                # TE userbuffers overlap the SP collectives with the neighbouring GEMMs
                tot = max(0.0, raw - (f - core))
            share = tot / raw if raw > 0 else 0.0
            for kind, n_coll, t1 in entries:
                ledger.append(CommEntry("tp", kind, msg, s.tp, n_coll * m, t1 * n_coll * m,
                                        t1 * n_coll * m * share, link.bound_by, i))
            exposed["tp"] = tot
        # --- CP: ring exchange of K,V blocks per layer, hidden under attention compute
        if s.cp > 1:
            link = group_link(groups, s.cp, s.tp, cluster)
            g_loc = max(model.num_query_groups / s.tp, 1.0)
            d = model.kv_channels
            kv = 2 * BYTES_16BIT * M * g_loc * d   # K and V blocks
            t_step = collective_time("send-recv", kv, 2, link)
            comm_f = (s.cp - 1) * t_step * n_layers
            comm_b = 2 * comm_f
            cp_exp = max(0.0, comm_f - core) + max(0.0, comm_b - C.FLASH_BACKWARD_FACTOR * core)
            exposed["cp"] = cp_exp
            ledger.append(CommEntry("cp", "send-recv", kv, s.cp, 3 * (s.cp - 1) * n_layers * m,
                                    (comm_f + comm_b) * m, cp_exp * m, link.bound_by, i))
        # --- EP: dispatch + combine all-to-all per MoE layer, fwd and bwd
        if model.is_moe and s.ep > 1 and n_moe:
            cnt, t1, msg, link = ep_layer_collective(model, s, groups, cluster)
            n_coll = cnt * n_moe
            if skip_moe:
                cnt0, _, _, _ = ep_layer_collective(model, replace(s, recompute="none"), groups, cluster)
                n_coll = cnt * (n_moe - skip_moe) + cnt0 * skip_moe
            exposed["ep"] = t1 * n_coll
            ledger.append(CommEntry("ep", "all-to-all", msg, s.ep, n_coll * m, t1 * n_coll * m,
                                    t1 * n_coll * m, link.bound_by, i))
        # --- PP: activations forward, gradients backward, per boundary and virtual chunk
        if s.pp > 1:
            msg = BYTES_16BIT * M * h / (s.tp if s.sp else 1)
            t_pp = 0.0
            for nb in ([i - 1] if i > 0 else []) + ([i + 1] if i < s.pp - 1 else []):
                same = stages_share_node(s, i, nb, groups, stage_groups[nb])
                link = p2p_link(gslow, stage_groups[nb][0], same, cluster)
                t1 = collective_time("send-recv", msg, 2, link)
                t_pp = max(t_pp, t1)
                if nb == i + 1:
                    n_p2p = 2 * s.vpp * m   # activations forward + gradients backward, per chunk
                    ledger.append(CommEntry("pp", "send-recv", msg, 2, n_p2p, n_p2p * t1, n_p2p * t1,
                                            link.bound_by, i))
            exposed["pp"] = 2 * s.vpp * t_pp
        # --- DP (and expert DP) from the placement
        sp_counts = stage_params(model, s, i)
        per_rank = {g: getattr(sp_counts, g) * placement.model_shard_factor(g) for g in ("dense", "norms", "experts")}
        dp_step = {"grad": 0.0, "param": 0.0}
        dp_mb = {"fwd": 0.0, "bwd": 0.0}
        for dc in data_collectives(placement):
            if dc.group == "experts":
                n, stride, axis = s.expert_dp, s.expert_tp * s.ep, "edp"
            else:
                n, stride, axis = s.dp * s.cp, s.tp, "dp"
            if n <= 1 or per_rank[dc.group] <= 0:
                continue
            link = group_link(groups, n, stride, cluster)
            el = bpp["gradients"] if dc.tensor == "gradients" else bpp["parameters"]
            msg = per_rank[dc.group] * el
            t1 = collective_time(dc.kind, msg, n, link)
            if dc.when == "per-step":
                dp_step["grad" if dc.tensor == "gradients" else "param"] += t1
                cnt = 1
            else:
                dp_mb["fwd" if dc.when.endswith("forward") else "bwd"] += t1
                cnt = m
            ledger.append(CommEntry(axis, dc.kind, msg, n, cnt, t1 * cnt, 0.0, link.bound_by, i))
        if dp_mb["fwd"] or dp_mb["bwd"]:
            exposed["dp"] = max(0.0, dp_mb["fwd"] - f) + max(0.0, dp_mb["bwd"] - bwd) \
                + (dp_mb["fwd"] + dp_mb["bwd"]) / max(n_layers, 1)
        # per-step DP sync: overlapped with the last micro-batch's backward (grads) and the first
        # micro-batch's forward (params) when enabled; the last bucket/layer is always exposed
        if s.overlap_grad_reduce:
            dp_exposed = max(0.0, dp_step["grad"] - bwd) + dp_step["grad"] / max(n_layers, 1)
        else:
            dp_exposed = dp_step["grad"]
        if s.overlap_param_gather:
            dp_exposed += max(0.0, dp_step["param"] - f) + dp_step["param"] / max(n_layers, 1)
        else:
            dp_exposed += dp_step["param"]
        # tied embeddings across first and last stage: all-reduce of the embedding gradient
        tied = 0.0
        if s.pp > 1 and not model.untie_embeddings_and_output_weights and i in (0, s.pp - 1):
            other = stage_groups[s.pp - 1 if i == 0 else 0][0]
            link = p2p_link(gslow, other, False, cluster)
            msg = model.embedding_params(s.tp) / s.tp * bpp["gradients"]
            tied = collective_time("all-reduce", msg, 2, link)
            ledger.append(CommEntry("embedding", "all-reduce", msg, 2, 1, tied, tied, link.bound_by, i))
        # optimizer step over this rank's shard: the stage's parameters x the optimizer's shard
        # factor (model axes and data axes alike)
        opt_params = placement.state_params("optimizer", sp_counts)
        if s.offload_optimizer:
            n_data = s.dp * s.cp
            local = sum(per_rank.values()) / n_data
            opt = (local * (bpp["gradients"] + bpp["parameters"]) / gpu_slow.pcie_bandwidth_bytes_per_s
                   + C.ADAM_BYTES_PER_PARAM * local * gslow.gpus_per_node / HOST_ADAM_BANDWIDTH_BYTES_PER_S)
        else:
            opt = C.optimizer_time(opt_params, gpu_slow)
        exposed_mb = sum(exposed.values())
        times.append(StageTime(
            stage=i, node_group="+".join(g.name for g in groups), gpu=gpu_slow.name, layers=n_layers,
            forward_s=f, backward_s=bwd, weight_grad_s=w, exposed_comm_s=exposed_mb,
            exposed_by_axis=tuple(sorted(exposed.items())), after_step_s=dp_exposed + opt + tied,
            optimizer_s=opt, dp_exposed_s=dp_exposed + tied))
    pipe = pipeline_time([t.forward_s for t in times], [t.backward_s for t in times],
                         [t.weight_grad_s for t in times], [t.exposed_comm_s for t in times],
                         m, s.vpp, s.schedule)
    after = max(t.after_step_s for t in times)
    step = pipe.total_s + after
    slowest = max(times, key=lambda t: t.after_step_s)
    by_axis: dict[str, float] = {}
    crit = max(times, key=lambda t: t.per_microbatch_s)
    for axis, v in crit.exposed_by_axis:
        by_axis[axis] = by_axis.get(axis, 0.0) + v * m
    by_axis["dp"] = by_axis.get("dp", 0.0) + slowest.dp_exposed_s
    compute_s = m * (crit.forward_s + crit.backward_s)
    breakdown = {
        "compute": compute_s,
        "exposed_communication": sum(by_axis.values()),
        "bubble": max(0.0, step - compute_s - sum(by_axis.values()) - slowest.optimizer_s),
        "optimizer": slowest.optimizer_s,
        "exposed_communication_by_axis": dict(sorted(by_axis.items())),
    }
    mf = C.model_flops_per_step(model, s)
    # hardware FLOPs add the recomputed forward work (HFU numerator)
    if s.recompute == "full":
        hf = mf * (1 + recomputed / model.num_layers / 3.0)   # a re-run forward is 1/3 of a layer
    elif s.recompute == "selective":
        # selective recompute repeats the core-attention forward: 4 B s^2 a d per layer
        attn = 4.0 * s.global_batch_size * s.seq_length ** 2 * model.num_attention_heads \
            * C.attention_head_dims(model)[0] * model.num_layers
        hf = mf + attn
    else:
        hf = mf
    peak_total = 0.0
    for groups in stage_groups:
        gp = min(g.gpu.peak(C.gemm_dtype(s, g.gpu)) for g in groups)
        peak_total += gp * s.gpus_per_stage
    # MFU is quoted against the bf16/fp16 dense peak even for fp8 runs (the common convention)
    if s.precision == "fp8":
        peak_total = sum(min(g.gpu.peak("bf16") for g in groups) * s.gpus_per_stage for groups in stage_groups)
    return Estimate(model=model, cluster=cluster, strategy=s, memory=tuple(memory), stage_times=tuple(times),
                    communication=tuple(ledger), step_time_s=step, breakdown=breakdown,
                    model_flops_per_step=mf, hardware_flops_per_step=hf, peak_flops_total=peak_total,
                    stage_groups=tuple("+".join(g.name for g in gs) for gs in stage_groups))
