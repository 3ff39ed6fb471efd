"""Estimate one strategy on one cluster: per-stage memory, the communication ledger, step time
and throughput. This is the function `planner estimate` and the search call."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidStrategy
from .placement import placement_of, validate
from .specs.cluster import ClusterSpec, NodeGroup
from .specs.model import ModelSpec
from .strategy import Strategy, check_structure
from .cost import compute as C
from .cost import kernels
from .cost import parallel as P
from .cost.memory import StageMemory, fully_recomputed_layers, stage_memory, stage_params
from .cost.moe_schedule import NO_A2A
from .cost.parallel import CommEntry
from .cost.pipeline import pipeline_time


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
    peak_flops_total: float       # FLOP/s, all GPUs, dense 16-bit peak (the MFU basis)
    gemm_peak_flops_total: float  # FLOP/s, all GPUs, peak of the GEMM dtype used (fp8 for fp8)
    stage_groups: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return all(m.fits for m in self.memory)

    @property
    def memory_verdict(self) -> str:
        """fits | tight | does not fit: the worst stage's (cost/memory.py StageMemory.verdict)."""
        order = ("fits", "tight", "does not fit")
        return max((m.verdict for m in self.memory), key=order.index)

    @property
    def peak_memory(self) -> StageMemory:
        return max(self.memory, key=lambda m: m.total / m.capacity)

    @property
    def tokens_per_s(self) -> float:
        return self.strategy.global_batch_size * self.strategy.seq_length / self.step_time_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation against the dense 16-bit peak (bf16, or fp16 on GPUs without
        bf16), also for fp8 runs: the convention of published MFU figures (mfu_basis says so)."""
        return self.model_flops_per_step / (self.step_time_s * self.peak_flops_total)

    @property
    def mfu_basis(self) -> str:
        dts = {kernels.mfu_peak_dtype(g.gpu) for g in self.cluster.node_groups if g.name in
               {x for gs in self.stage_groups for x in gs.split("+")}}
        return "/".join(sorted(dts)) + " dense peak"

    @property
    def mfu_label(self) -> str:
        """'MFU 41.2% of bf16 dense peak' (+ the fraction of the fp8 peak for fp8 runs)."""
        text = f"MFU {self.mfu * 100:.1f}% of {self.mfu_basis}"
        if self.strategy.precision == "fp8":
            text += f" ({self.mfu_gemm_peak * 100:.1f}% of the fp8 peak)"
        return text

    @property
    def mfu_gemm_peak(self) -> float:
        """Model FLOPs utilisation against the peak of the GEMM dtype actually used (fp8 for fp8)."""
        return self.model_flops_per_step / (self.step_time_s * self.gemm_peak_flops_total)

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


def layer_time_of(model, s_key, gpu, moe):
    """A layer's compute time (cost/compute.py layer_time) for a time key (time_key), cached by
    the fields it reads: a dense layer's does not depend on expert parallelism or the MoE
    dispatcher, and neither kind's on the MoE schedule's overlap choices (one entry for all of
    them: the search asks for it under every EP / expert-TP degree and overlap choice)."""
    keys = _LAYER_KEYS[moe]
    key = keys.get(s_key)
    if key is None:
        if len(keys) > _LAYER_TIMES_MAX:
            keys.clear()
        key = keys[s_key] = tuple(getattr(s_key, f) for f in _COMPUTE_KEY_FIELDS[moe])
    got = _LAYER_TIMES.get((model, moe, key, gpu))
    if got is None:
        got = _LAYER_TIMES[(model, moe, key, gpu)] = C.layer_time(model, s_key, gpu, moe)
        if len(_LAYER_TIMES) > _LAYER_TIMES_MAX:
            _LAYER_TIMES.clear()
    return got


_LAYER_TIMES: dict = {}
_LAYER_KEYS: dict = {False: {}, True: {}}    # time key -> its compute key per kind (built once per time key)
_LAYER_TIMES_MAX = 65536


def _clear_layer_times() -> None:
    _LAYER_TIMES.clear()
    for keys in _LAYER_KEYS.values():
        keys.clear()


layer_time_of.cache_clear = _clear_layer_times   # as for an lru_cache (validation refits clear it)


# The Strategy fields a layer's time depends on (cost/compute.py layer_time, and for a MoE layer
# the schedule of its all-to-alls, cost/parallel.py moe_layer_floor), and those of them only a
# MoE layer reads: the cache key of layer times and of the search's per-layer bounds.
# tests/test_layer_time_key.py records every field layer_time reads and fails if one is missing.
LAYER_TIME_FIELDS = ("tp", "cp", "ep", "etp", "micro_batch_size", "seq_length", "recompute", "sequence_parallel",
                     "precision", "fused_attention", "recompute_modules", "fp8_recipe", "moe_token_dispatcher_type",
                     "moe_pad_expert_input_to_capacity", "cuda_graph_impl", "cuda_graph_scope", "tp_comm_overlap",
                     "moe_flex_dispatcher_num_sms", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
                     "moe_shared_expert_overlap")
MOE_ONLY_LAYER_TIME_FIELDS = frozenset({"ep", "etp", "moe_token_dispatcher_type", "moe_pad_expert_input_to_capacity",
                                        "moe_flex_dispatcher_num_sms", "overlap_moe_expert_parallel_comm",
                                        "delay_wgrad_compute", "moe_shared_expert_overlap"})
# Fields of the key only the MoE schedule reads (cost/parallel.py moe_layer_floor), not layer_time
SCHEDULE_ONLY_LAYER_TIME_FIELDS = frozenset({"overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
                                            "moe_shared_expert_overlap"})
# the fields layer_time reads, per kind (dense, MoE): its cache key in layer_time_of
_COMPUTE_KEY_FIELDS = {moe: tuple(f for f in LAYER_TIME_FIELDS if f not in SCHEDULE_ONLY_LAYER_TIME_FIELDS
                                  and (moe or f not in MOE_ONLY_LAYER_TIME_FIELDS)) for moe in (False, True)}


def time_key(s: Strategy) -> Strategy:
    """The fields a layer's compute time depends on (for caching across the search)."""
    return Strategy(**{f: getattr(s, f) for f in LAYER_TIME_FIELDS})


_time_key = time_key   # the former private name (tests use it)


@dataclass(frozen=True)
class StageCompute:
    """Compute seconds of one pipeline rank per micro-batch, on the GPU that sets its pace."""
    forward_s: float
    backward_s: float          # incl. recompute
    weight_grad_s: float       # part of backward_s that is weight-gradient work
    core_attention_forward_s: float
    group: NodeGroup           # the slowest node group the stage spans
    recompute_skipped: tuple[int, int]   # (dense, MoE) layers a block-recompute stage does not re-run
    recomputed_layers: int


def stage_compute(model: ModelSpec, s: Strategy, i: int, start: int, end: int, groups: list[NodeGroup]) -> StageCompute:
    """Per micro-batch compute of layers [start, end) (+ embedding on the first rank, output layer
    and loss on the last): the sum of their layer times on each spanned GPU, the slowest wins."""
    n_moe = model.num_moe_layers_in(start, end)
    n_dense = (end - start) - n_moe
    # layers that skip the recompute under --recompute-num-layers (block method)
    full_set = fully_recomputed_layers(s, start, end)
    n_moe_full = sum(1 for k in full_set if model.is_moe_layer(k))
    skip_dense, skip_moe = ((n_dense - (len(full_set) - n_moe_full), n_moe - n_moe_full)
                            if s.recompute == "full" else (0, 0))
    tk = time_key(s)
    share = P.moe_alone_share(s, i)
    best = None
    for g in groups:
        lt_d = layer_time_of(model, tk, g.gpu, False)
        lt_m = layer_time_of(model, tk, g.gpu, True) if model.is_moe else lt_d
        f, bwd = kind_pass_s(lt_d, s, False, n_dense, skip_dense, share)
        if n_moe:
            mf, mb = kind_pass_s(lt_m, s, True, n_moe, skip_moe, share)
            f, bwd = f + mf, bwd + mb
        w = n_dense * lt_d.backward_weight + n_moe * lt_m.backward_weight
        core = n_dense * lt_d.core_attention_forward + n_moe * lt_m.core_attention_forward
        ef, eb = stage_ends_s(model, s, i, g.gpu, tk)
        f, bwd = f + ef, bwd + eb
        if best is None or f + bwd > best.forward_s + best.backward_s:
            best = StageCompute(f, bwd, w, core, g, (skip_dense, skip_moe), len(full_set))
    return best


def kind_pass_s(lt, s: Strategy, moe: bool, n: int, skipped: int, share: float) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of n layers of one kind (LayerTime lt on the
    stage's GPU), `skipped` of which a block-recompute stage does not re-run; `share`: the
    stage's share of chunk steps run alone under the EP-overlap schedule (moe_alone_share).
    Dense layers take the longer of the GPU's and the host's time (host_bound); MoE layers as
    their schedule places them (GPU and host), split forward / backward in proportion to their
    GPU work. Linear in n with skipped = 0: the bounds price a layer of each kind with it."""
    if not moe:
        f = n * lt.forward
        bwd = n * (lt.backward_input + lt.backward_weight + lt.recompute) - skipped * lt.recompute
        return host_bound(f, bwd, n * lt.host_forward, n * lt.host_backward)
    full = n - skipped if s.recompute == "full" else 0   # MoE layers re-run in backward
    moe_s = (full * P.moe_layer_costs(lt, s, NO_A2A, share, True)[0]
             + (n - full) * P.moe_layer_costs(lt, s, NO_A2A, share, False)[0])
    gpu_f = n * lt.forward
    gpu_b = n * (lt.backward_input + lt.backward_weight) + full * lt.recompute
    return moe_s * gpu_f / (gpu_f + gpu_b), moe_s * gpu_b / (gpu_f + gpu_b)


def stage_ends_s(model: ModelSpec, s: Strategy, i: int, gpu, tk: Strategy) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch of what rank i runs beside its layers: the
    embedding on the first, the output layer and loss (and the MTP modules) on the last."""
    f = bwd = 0.0
    if i == 0:
        ef, eb = C.embedding_time(model, s, gpu)
        f, bwd = f + ef, bwd + eb
    if i == s.pp - 1:
        of, ob = C.output_layer_time(model, s, gpu)
        f, bwd = f + of, bwd + ob
        if model.mtp_num_layers:
            mf, mb = C.mtp_time(model, s, gpu, layer_time_of(model, tk, gpu, model.is_moe_layer(model.num_layers - 1)))
            f, bwd = f + mf, bwd + mb
    return f, bwd


def host_bound(forward_s: float, backward_s: float, host_forward_s: float, host_backward_s: float) -> tuple[float, float]:
    """Per micro-batch forward and backward seconds of a stage's dense layers once the host's
    kernel launches are counted: the host runs ahead of the GPU, so each pass takes the longer of
    the GPU's time and the host's time to issue it. (MoE layers, whose dropless routing makes
    the host wait for the GPU, are placed by cost/moe_schedule.py.)"""
    return max(forward_s, host_forward_s), max(backward_s, host_backward_s)


def _layer_counts(n_dense: int, n_moe: int, full: bool, skip_dense: int, skip_moe: int) -> dict:
    """(MoE?, fully recomputed?) -> layers: under full recompute all but the skipped layers of
    the block method are re-run."""
    if not full:
        return {(False, False): n_dense, (True, False): n_moe}
    return {(False, True): n_dense - skip_dense, (True, True): n_moe - skip_moe,
            (False, False): skip_dense, (True, False): skip_moe}


def estimate(model: ModelSpec, cluster: ClusterSpec, s: Strategy) -> Estimate:
    """Memory, communication and step time of strategy `s`: per stage, its compute (the slowest
    GPU it spans), each axis's exposed communication (cost/parallel.py), its optimizer step;
    then the pipeline schedule over the per-stage times (cost/pipeline.py)."""
    check_structure(s, model)
    stage_groups = assign_stage_groups(cluster, s)
    placement = placement_of(s)
    validate(placement)
    m = s.num_microbatches
    ranges = s.stage_layer_ranges(model)
    memory, times, ledger = [], [], []
    recomputed = 0   # fully recomputed layers over all stages
    for i, groups in enumerate(stage_groups):
        # the slowest GPU spanned sets the pace; the smallest memory sets the capacity
        mems = [stage_memory(model, s, placement, i, g.gpu, "+".join(x.name for x in groups)) for g in groups]
        memory.append(min(mems, key=lambda x: x.capacity))
        start, end = ranges[i]
        comp = stage_compute(model, s, i, start, end, groups)
        recomputed += comp.recomputed_layers
        slow = comp.group
        n_moe = model.num_moe_layers_in(start, end)
        skip_dense, skip_moe = comp.recompute_skipped
        full = s.recompute == "full"
        tk = time_key(s)
        work = P.StageWork(stage=i, layers=end - start, moe_layers=n_moe,
                           forward_s=comp.forward_s, backward_s=comp.backward_s,
                           core_attention_forward_s=comp.core_attention_forward_s,
                           recompute_skipped_layers=skip_dense + skip_moe, microbatches=m,
                           layer_counts=_layer_counts(end - start - n_moe, n_moe, full, skip_dense, skip_moe),
                           layer_times={moe: layer_time_of(model, tk, slow.gpu, moe) for moe in model.layer_kinds})
        sp_counts = stage_params(model, s, i)
        per_rank = {g: getattr(sp_counts, g) * placement.model_shard_factor(g) for g in ("dense", "norms", "experts")}
        costs = [P.tp_cost(model, s, groups, cluster, work),
                 P.cp_cost(model, s, groups, cluster, work),
                 P.ep_cost(model, s, groups, cluster, work, comp.recompute_skipped[1]),
                 P.pp_cost(model, s, stage_groups, i, slow, cluster, work),
                 P.dp_cost(model, s, placement, groups, cluster, work, per_rank),
                 P.tied_embedding_cost(model, s, stage_groups, i, slow, cluster)]
        for c in costs:
            ledger.extend(c.entries)
        opt = C.optimizer_step_time(s, placement, sp_counts, per_rank, slow)
        exposed = {c.axis: c.per_microbatch_s for c in costs if c.per_microbatch_s}
        dp_after = sum(c.after_step_s for c in costs)
        times.append(StageTime(
            stage=i, node_group="+".join(g.name for g in groups), gpu=slow.gpu.name, layers=end - start,
            forward_s=comp.forward_s, backward_s=comp.backward_s, weight_grad_s=comp.weight_grad_s,
            exposed_comm_s=sum(exposed.values()), exposed_by_axis=tuple(sorted(exposed.items())),
            after_step_s=dp_after + opt, optimizer_s=opt, dp_exposed_s=dp_after))
    pipe = pipeline_time([t.forward_s for t in times], [t.backward_s for t in times],
                         [t.weight_grad_s for t in times], [t.exposed_comm_s for t in times],
                         m, s.vpp, s.schedule)
    step = pipe.total_s + max(t.after_step_s for t in times)
    breakdown = _breakdown(times, m, step)
    mf = C.model_flops_per_step(model, s)
    hf = C.hardware_flops_per_step(model, s, mf, recomputed)
    # MFU is quoted against the dense 16-bit peak even for fp8 runs (the convention of
    # published figures, e.g. Megatron-Bridge's performance tables); the GEMM-dtype peak too
    peak_total = sum(min(g.gpu.peak(kernels.mfu_peak_dtype(g.gpu)) for g in groups) * s.gpus_per_stage
                     for groups in stage_groups)
    gemm_peak = sum(min(g.gpu.peak(kernels.gemm_dtype(s, g.gpu)) for g in groups) * s.gpus_per_stage
                    for groups in stage_groups)
    return Estimate(model=model, cluster=cluster, strategy=s, memory=tuple(memory), stage_times=tuple(times),
                    communication=tuple(ledger), step_time_s=step, breakdown=breakdown,
                    model_flops_per_step=mf, hardware_flops_per_step=hf, peak_flops_total=peak_total,
                    gemm_peak_flops_total=gemm_peak,
                    stage_groups=tuple("+".join(g.name for g in gs) for gs in stage_groups))


def _breakdown(times: list[StageTime], m: int, step: float) -> dict:
    """Step time by part: compute and exposed communication of the critical stage (the one with
    the longest micro-batch) over m micro-batches, the after-step terms of the slowest stage,
    the rest is pipeline bubble."""
    slowest = max(times, key=lambda t: t.after_step_s)
    crit = max(times, key=lambda t: t.per_microbatch_s)
    by_axis: dict[str, float] = {}
    for axis, v in crit.exposed_by_axis:
        by_axis[axis] = by_axis.get(axis, 0.0) + v * m
    by_axis["dp"] = by_axis.get("dp", 0.0) + slowest.dp_exposed_s
    compute_s = m * (crit.forward_s + crit.backward_s)
    return {
        "compute": compute_s,
        "exposed_communication": sum(by_axis.values()),
        "bubble": max(0.0, step - compute_s - sum(by_axis.values()) - slowest.optimizer_s),
        "optimizer": slowest.optimizer_s,
        "exposed_communication_by_axis": dict(sorted(by_axis.items())),
        "critical_stage": crit.stage,
        "after_step_stage": slowest.stage,
    }
