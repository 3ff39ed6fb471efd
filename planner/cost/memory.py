"""Per-GPU memory on every pipeline stage, from the placement table.

bytes(state, group) = full_bytes(state, group on this stage) x placement.shard_factor(state, group)

Bytes per parameter (dtype conventions):
- megatron: bf16/fp16 weights 2, fp32 main gradients 4, fp32 master weights + Adam moments 12
  = 18 per parameter, 6 + 12/DP with the distributed optimizer
  (megatron/training/theoretical_memory_usage.py, docs/user-guide/features/dist_optimizer.md).
- deepspeed: 2 + 2 + 12 = 16 (Rajbhandari et al. 2019, ZeRO, sec. 3.1).
fp8 training (Transformer Engine) keeps bf16 weights and fp32 main grads; the fp8 copies are
transient per layer, so the convention is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..placement import Mode, Placement
from ..specs.hardware import GPUProfile
from ..specs.model import ModelSpec
from ..strategy import Strategy
from . import activations as act

BYTES_PER_PARAM = {
    "megatron": {"parameters": 2, "gradients": 4, "optimizer": 12},
    "deepspeed": {"parameters": 2, "gradients": 2, "optimizer": 12},
}
# Megatron DDP bucket size: max(40M, 1M x DP) parameters (megatron/core/distributed/
# distributed_data_parallel.py); a bucket in flight is kept in fp32 for sharded gradients.
DDP_BUCKET_MIN_PARAMS = 40_000_000
DDP_BUCKET_PARAMS_PER_DP_RANK = 1_000_000
STATES_AT_REST = ("parameters", "gradients", "optimizer")   # the states counted per parameter
# ZeRO-3 / FSDP keep the current and the prefetched layer gathered (2 layers of full weights).
ZERO3_GATHERED_LAYERS = 2


@dataclass(frozen=True)
class StageParams:
    """Parameters of one pipeline stage by placement group, before any sharding: the placement
    table's shard factors (tp, ep, etp, data axes) turn them into per-rank counts."""
    dense: float      # split over TP (attention, dense MLP, shared experts, embedding, output)
    norms: float      # replicated over TP (norms, router, learned position embedding)
    experts: float    # split over EP x expert-TP

    @property
    def total(self) -> float:
        return self.dense + self.norms + self.experts


def stage_params(model: ModelSpec, s: Strategy, stage: int) -> StageParams:
    """Parameter counts of pipeline rank `stage` (all of its virtual chunks), unsharded."""
    start, end = s.stage_layer_ranges(model)[stage]
    return layer_range_params(model, s, start, end, stage == 0, stage == s.pp - 1)


def one_layer_params(model: ModelSpec, moe: bool) -> StageParams:
    """Parameters of one decoder layer of a kind (dense or MoE), unsharded."""
    if moe:
        return StageParams(dense=model.attention_params + model.shared_expert_params,
                           norms=model.layer_norm_params + model.router_params,
                           experts=model.num_experts * model.expert_params)
    return StageParams(dense=model.attention_params + model.dense_mlp_params, norms=model.layer_norm_params,
                       experts=0.0)


def layer_range_params(model: ModelSpec, s: Strategy, start: int, end: int, first: bool, last: bool) -> StageParams:
    """Parameters of layers [start, end), plus the embedding if `first` and the final norm and
    output layer if `last`. With first = last = True over all layers: the sum over all stages."""
    n_moe = model.num_moe_layers_in(start, end)
    n_dense = end - start - n_moe
    d = one_layer_params(model, False)
    e = one_layer_params(model, True) if n_moe else StageParams(0.0, 0.0, 0.0)
    dense = n_dense * d.dense + n_moe * e.dense
    norms = n_dense * d.norms + n_moe * e.norms
    experts = n_moe * e.experts
    emb = model.embedding_params(s.tp)   # padded vocabulary x h, split over TP (vocab-parallel)
    if first:
        dense += emb
        norms += model.position_embedding_params   # learned positions are replicated over TP
    if last:
        norms += model.norm_params
        if model.untie_embeddings_and_output_weights or s.pp > 1:
            dense += emb   # untied output layer, or the tied copy Megatron keeps on the last stage
    return StageParams(dense=dense, norms=norms, experts=experts)


def in_flight_microbatches(s: Strategy, stage: int) -> float:
    """Micro-batches of activations a pipeline rank holds at its peak, in units of the rank's
    whole layer set (all virtual chunks).
    1F1B / ZB-H1: min(p - i, m) (Narayanan et al. 2021; ZB-H1 keeps 1F1B's memory, Qi et al. 2023).
    Interleaved: Megatron warms up (p - i - 1) * 2 + (v - 1) * p chunks, then one more is in
    flight (megatron/core/pipeline_parallel/schedules.py); a chunk is 1/v of the rank's layers."""
    p, m, v = s.pp, s.num_microbatches, s.vpp
    if p == 1:
        return 1.0
    if v > 1:
        chunks = min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)
        return chunks / v
    return float(min(p - stage, m))


@dataclass(frozen=True)
class StageMemory:
    stage: int
    layers: int
    node_group: str
    parameters: float     # bytes
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    capacity: float       # usable bytes on this stage's GPU
    host_bytes: float     # bytes offloaded to host memory per GPU
    in_flight: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.buffers

    @property
    def headroom(self) -> float:
        return self.capacity - self.total

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


def fully_recomputed_layers(s: Strategy, start: int, end: int):
    """Layer indices of [start, end) that are fully recomputed: all of them under full
    recompute, or with Megatron's 'block' method (--recompute-num-layers k) the first k layers
    of each virtual chunk; the others keep everything (or all but core attention)."""
    if s.recompute != "full":
        return set()
    if s.recompute_num_layers is None:
        return range(start, end)
    per_chunk = (end - start) // s.vpp
    return {start + c * per_chunk + j for c in range(s.vpp) for j in range(min(s.recompute_num_layers, per_chunk))}


def stage_activation_bytes(model: ModelSpec, s: Strategy, stage: int) -> tuple[float, float]:
    """(kept activations, transient working set) in bytes for pipeline rank `stage`."""
    start, end = s.stage_layer_ranges(model)[stage]
    full_set = fully_recomputed_layers(s, start, end)
    other = "selective" if s.recompute == "selective" else "none"
    # count layers by (MoE?, mode): layers of one kind are identical
    n_moe = model.num_moe_layers_in(start, end)
    n_moe_full = (n_moe if isinstance(full_set, range)
                  else sum(1 for i in full_set if model.is_moe_layer(i)))
    counts = {(False, "full"): len(full_set) - n_moe_full, (True, "full"): n_moe_full,
              (False, other): (end - start - n_moe) - (len(full_set) - n_moe_full),
              (True, other): n_moe - n_moe_full}
    per_mb = 0.0
    worst_layer = 0.0
    for (moe, mode), n in counts.items():
        if n <= 0:
            continue
        per_mb += n * act.layer_bytes(model, s, moe, mode)
        if mode == "full":
            worst_layer = max(worst_layer, act.layer_bytes(model, s, moe, "none"))
    if stage == 0:
        per_mb += act.embedding_bytes(model, s)
    kept = per_mb * in_flight_microbatches(s, stage)
    transient = worst_layer  # one layer rebuilt at a time during backward
    if stage == s.pp - 1:
        transient += act.output_layer_bytes(model, s)
    return kept, transient


def layer_memory_bytes(model: ModelSpec, s: Strategy, placement: Placement, stage: int, moe: bool) -> float:
    """Bytes one more decoder layer adds to pipeline rank `stage`: its parameters, gradients
    and optimizer state after sharding, plus its kept activations for the rank's in-flight
    micro-batches. Exact when every layer is recomputed alike; with recompute_num_layers it
    counts every layer as fully recomputed (a lower bound)."""
    bpp = BYTES_PER_PARAM[s.optimizer_convention]
    lp = one_layer_params(model, moe)
    states = sum(placement.state_params(state, lp) * bpp[state] for state in STATES_AT_REST)
    mode = s.recompute if s.recompute in ("full", "selective") else "none"
    return states + act.layer_bytes(model, s, moe, mode) * in_flight_microbatches(s, stage)


def stage_fixed_bytes_lower_bound(model: ModelSpec, s: Strategy, placement: Placement, stage: int) -> float:
    """Bytes of pipeline rank `stage` that do not scale with its layer count, at least: the
    embedding / final norm / output layer states and activations it holds, the one layer
    rebuilt at a time under full recompute (the lighter layer kind), and the ZeRO-2/3 buffers
    as small as any split makes them. For any split, stage_memory(...).total >= this +
    sum over its layers of layer_memory_bytes(...); the search prunes with it."""
    bpp = BYTES_PER_PARAM[s.optimizer_convention]
    first, last = stage == 0, stage == s.pp - 1
    fp = layer_range_params(model, s, 0, 0, first, last)
    fixed = sum(placement.state_params(st, fp) * bpp[st] for st in STATES_AT_REST)
    if first:
        fixed += act.embedding_bytes(model, s) * in_flight_microbatches(s, stage)
    if last:
        fixed += act.output_layer_bytes(model, s)
    if s.recompute == "full":
        fixed += min(act.layer_bytes(model, s, moe, "none") for moe in model.layer_kinds)
    if s.zero_stage >= 2:
        bucket = max(DDP_BUCKET_MIN_PARAMS, DDP_BUCKET_PARAMS_PER_DP_RANK * s.dp * s.cp)
        fixed += min(bucket, placement.rank_params(fp)) * bpp["gradients"]
    if s.zero_stage >= 3:
        fixed += ZERO3_GATHERED_LAYERS * bpp["parameters"] * min(
            placement.rank_params(one_layer_params(model, moe)) for moe in model.layer_kinds)
    return fixed


def stage_memory(model: ModelSpec, s: Strategy, placement: Placement, stage: int, gpu: GPUProfile,
                 node_group: str = "") -> StageMemory:
    bpp = BYTES_PER_PARAM[s.optimizer_convention]
    sp = stage_params(model, s, stage)
    states = {state: placement.state_params(state, sp) * bpp[state] for state in STATES_AT_REST}
    host = 0.0
    for state in STATES_AT_REST:
        for group in ("dense", "norms", "experts"):
            if placement.mode(state, group, "dp" if group != "experts" else "edp") is Mode.OFFLOADED:
                n_data = placement.size("dp") * placement.size("cp") if group != "experts" else placement.size("edp")
                host += getattr(sp, group) * bpp[state] / n_data
    kept, transient = stage_activation_bytes(model, s, stage)
    buffers = transient
    start, end = s.stage_layer_ranges(model)[stage]
    if s.zero_stage >= 2:
        n_data = s.dp * s.cp
        bucket = max(DDP_BUCKET_MIN_PARAMS, DDP_BUCKET_PARAMS_PER_DP_RANK * n_data)
        buffers += min(bucket, placement.rank_params(sp)) * bpp["gradients"]
    if s.zero_stage >= 3:
        n_layers = max(1, end - start)
        per_layer_params = placement.rank_params(sp) / n_layers
        buffers += ZERO3_GATHERED_LAYERS * per_layer_params * bpp["parameters"]
    return StageMemory(
        stage=stage, layers=end - start, node_group=node_group,
        parameters=states["parameters"], gradients=states["gradients"], optimizer=states["optimizer"],
        activations=kept, buffers=buffers, capacity=gpu.usable_memory_bytes, host_bytes=host,
        in_flight=in_flight_microbatches(s, stage),
    )
