"""The search space of `planner plan`: its options (SearchOptions), what a search returns
(SearchResult) and reports while it runs (SearchProgress), the constants that bound the space,
the degrees it enumerates (enumerate_space), the ways to put pipeline stages on node groups
(stage_layouts, one stage order per symmetry class of the cluster) and the families of
candidates they make (degrees x micro-batch x recompute)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from ..cost.kernels import MXFP8_MIN_COMPUTE_CAPABILITY
from ..estimate import Estimate
from ..hashing import hash_once, state_without_hash
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import RECIPE_FIELDS, Strategy
from .objective import MIN_GPU_FRACTION, GpuBudget

# The space searched. These bound it; the top plan is the optimum of this space under the cost
# model, not of every conceivable configuration.
MAX_PP = 128
MAX_CP = 32
# micro-batch sizes: powers of two while they divide the batch a data-parallel rank gets (memory
# rules the large ones out where activations do not fit)
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
VPP_CHOICES = (1, 2, 3, 4, 5, 6, 8)
# Context parallelism is only tried at long sequences: below CP_MIN_SEQ_LENGTH tokens no CP; below
# CP_FULL_RANGE_SEQ_LENGTH at most CP_SHORT_MAX. Under 8k tokens attention is a small share of a
# layer's FLOPs (s/6h in Narayanan's count) while CP adds a K/V ring exchange per layer.
CP_MIN_SEQ_LENGTH = 8192
CP_FULL_RANGE_SEQ_LENGTH = 16384
CP_SHORT_MAX = 2
# The GPU budget (objective.GpuBudget, MIN_GPU_FRACTION the default of --min-gpu-fraction):
# plans use more than a fraction of the GPUs available to them. On a heterogeneous cluster
# whole node groups may stay idle: a plan on the fast GPUs alone is in the space, so the search
# says when the slow ones cannot help.
# Seconds between two calls of the progress callback (the live line on a terminal).
PROGRESS_INTERVAL_S = 0.1


@dataclass(frozen=True)
class SearchOptions:
    global_batch_size: int
    seq_length: int
    top: int = 3
    fixed: tuple = ()                 # (("tp", 8), ...)
    precision: str = "bf16"
    # the fp8 recipe of fp8 plans (delayed | tensorwise | blockwise | mxfp8); None: the one
    # NVIDIA's Megatron-Bridge recipes train with on the cluster's GPUs (fp8_recipe_of)
    fp8_recipe: str | None = None
    recompute: tuple[str, ...] = ("none", "selective", "full")
    # selective recompute: the --recompute-modules sets tried; None: selective_module_sets(model)
    recompute_module_sets: tuple[tuple[str, ...], ...] | None = None
    # MoE families with EP > 1 also run --overlap-moe-expert-parallel-comm --delay-wgrad-compute
    moe_ep_overlap: bool = True
    zero_stages: tuple[int, ...] = (0, 1)
    schedules: tuple[str, ...] = ("1f1b", "interleaved")
    solver: str = "dp"                # dp | ilp | ilp-highs
    # with "full" in recompute: also full recompute of only the first k layers of each chunk
    # (Megatron's --recompute-method block --recompute-num-layers k)
    partial_recompute: bool = True
    allow_tp_across_nodes: bool = False
    time_limit_s: float = 60.0
    # a pipeline rank's layers need not divide by vpp: its virtual chunks differ by one layer
    # (Megatron's --pipeline-model-parallel-layout, as Llama 3 405B ran 126 layers on PP16 x
    # VPP2); the first and last stages can then carry fewer layers for the embedding and loss.
    # The launch emitter, the launch reader and plan JSON carry Strategy.chunk_layers; off by
    # default while the top K with uneven chunks is not yet exact (tests/test_search.py).
    uneven_chunks: bool = False
    # GPU budget: exactly `gpus` of the cluster's GPUs, or at most `max_gpus`; plans use more
    # than min_gpu_fraction of the GPUs available to them (not applied with `gpus`)
    gpus: int | None = None
    max_gpus: int | None = None
    min_gpu_fraction: float = MIN_GPU_FRACTION
    # what plans are ranked by (objective.OBJECTIVES); cost charges the GPUs a plan uses, or
    # every GPU of the cluster with charge_idle
    objective: str = "throughput"
    charge_idle: bool = False
    # keep plans another plan dominates on every reported figure (step time, peak memory per
    # GPU, GPUs used, and $ when priced); plans equal up to a symmetry of the cluster are one
    # plan either way
    keep_dominated: bool = False
    # rank plans that fit only within the memory model's stated margin (TIGHT) with the others;
    # by default they come after every plan that fits with margin
    allow_tight: bool = False
    # processes the search may use (best_first.py): with 2 or more, a second process prices
    # candidates ahead of the search; the plans and counts are the same as with 1 (serial)
    jobs: int = 1
    # Strategy fields every plan carries as a launch sets them (recipe_settings: with
    # --compare-with, the compared launch's training-recipe settings), (field, value) pairs
    settings: tuple[tuple[str, object], ...] = ()

    @property
    def budget(self) -> "GpuBudget":
        return GpuBudget(self.gpus, self.max_gpus, self.min_gpu_fraction)


def fp8_recipe_of(o: SearchOptions, cluster: ClusterSpec) -> str:
    """The fp8 recipe the search plans with: o.fp8_recipe, or by default the one NVIDIA's
    Megatron-Bridge performance recipes use, MXFP8 where every GPU is Blackwell (the recipes'
    fp8_mx on B200 / GB200 / GB300) and tensorwise current scaling elsewhere (fp8_cs on H100),
    one recipe for the whole launch (Transformer Engine refuses MXFP8 below Blackwell)."""
    if o.fp8_recipe is not None:
        return o.fp8_recipe
    blackwell = all(g.gpu.compute_capability >= MXFP8_MIN_COMPUTE_CAPABILITY for g in cluster.node_groups)
    return "mxfp8" if blackwell else "tensorwise"


# settings that need the distributed optimizer (or Megatron-FSDP): no ZeRO-0 plan carries them
# (megatron/rules.py fp8-param-gather-needs-dist-opt, precision-aware-needs-dist-opt)
NEED_SHARDED_OPTIMIZER = ("fp8_param_gather", "use_precision_aware_optimizer")


def recipe_settings(s: Strategy, precision: str) -> tuple[tuple[str, object], ...]:
    """The RECIPE_FIELDS of a launch's strategy s that differ from Strategy's defaults, as
    SearchOptions.settings: the fp8 (fp4) parameter all-gather only when the plans are fp8
    (nvfp4) too."""
    default = Strategy()
    out = []
    for f in RECIPE_FIELDS:
        v = getattr(s, f)
        if v == getattr(default, f):
            continue
        if (f == "fp8_param_gather" and precision != "fp8") or (f == "fp4_param_gather" and precision != "nvfp4"):
            continue
        out.append((f, v))
    return tuple(out)


def execution_of(model: ModelSpec, o: SearchOptions, cluster: ClusterSpec) -> dict:
    """Execution settings every strategy of the search carries (Strategy fields): o.settings
    (recipe_settings), the fp8 recipe (fp8_recipe_of), and for a MoE model with a shared expert
    its overlap with the dispatcher's all-to-alls (--moe-shared-expert-overlap, as NVIDIA's
    DeepSeek-V3 recipes set it; a family with the EP overlap drops it): in the model it never
    lengthens a layer (the shared expert's compute, slowed by the all-to-all's SM share, runs
    beside the all-to-all instead of after it: d + c min(d / (1 - c), a) <= d + a), and Megatron
    accepts it with the alltoall dispatcher the search plans with."""
    return {**dict(o.settings), "fp8_recipe": fp8_recipe_of(o, cluster),
            "moe_shared_expert_overlap": bool(model.is_moe and model.moe_shared_expert_intermediate_size)}


# Selective recompute module sets (--recompute-modules) the search tries beyond Megatron's default
# core_attn, from NVIDIA's MoE recipes: moe_act (Megatron-Bridge Qwen3 GB200 recipes),
# layernorm + moe_act (Megatron-Core MoE Model Zoo, Qwen3-235B), mla_up_proj (Megatron-Bridge
# DeepSeek-V3 B200 / GB200 recipes) and the three together on MLA MoE models. Each rebuilds
# cheap tensors in backward (an activation, a norm, the MLA up-projections) for much of a layer's
# activation memory; activations.py prices what each keeps, compute.py what it re-runs.
MOE_SELECTIVE_SETS = (("moe_act",), ("layernorm", "moe_act"))
MLA_SELECTIVE_SETS = (("mla_up_proj",),)
MLA_MOE_SELECTIVE_SETS = (("mla_up_proj", "layernorm", "moe_act"),)


def selective_module_sets(model: ModelSpec) -> tuple[tuple[str, ...], ...]:
    """The --recompute-modules sets a selective family of `model` may use."""
    sets = [("core_attn",)]
    if model.is_moe:
        sets += MOE_SELECTIVE_SETS
    if model.multi_latent_attention:
        sets += MLA_SELECTIVE_SETS
        if model.is_moe:
            sets += MLA_MOE_SELECTIVE_SETS
    return tuple(sets)


@dataclass(frozen=True)
class LayerExecution:
    """How a family's layers run beyond its degrees and micro-batch: its recompute and the MoE
    execution choice that changes a layer's time and memory. A block family (full recompute of
    k layers per chunk) is bounded and screened as its time class, 'none'."""
    recompute: str = "none"                              # none | selective | full
    recompute_modules: tuple[str, ...] = ("core_attn",)  # with selective
    # --overlap-moe-expert-parallel-comm with --delay-wgrad-compute (Megatron's 1F1B all-to-all
    # overlap: a micro-batch's forward beside another's backward; it excludes the shared-expert
    # overlap)
    ep_overlap: bool = False
    block: bool = False

    # the search keys 10^5-10^6 families by it: hash the fields once (planner/hashing.py)
    __hash__ = hash_once
    __getstate__ = state_without_hash

    @property
    def time_class(self) -> "LayerExecution":
        """What the family's bounds and screens price: a block family as recompute 'none'."""
        return _NO_RECOMPUTE if self.block else self

    @property
    def floor(self) -> "LayerExecution":
        """Its time class without recompute: recompute only adds to a layer's time (cost/
        compute.py layer_time's recompute term, the TP forward collectives it repeats), so a
        bound of this class bounds this class too (the search queues a family under it and
        computes its own only when it is reached)."""
        tc = self.time_class
        return tc if tc.recompute == "none" else LayerExecution(ep_overlap=tc.ep_overlap)

    def fields(self, shared_overlap: bool) -> dict:
        """The Strategy fields it sets (shared_overlap: the search's --moe-shared-expert-overlap)."""
        return {"recompute": self.recompute,
                "recompute_modules": self.recompute_modules if self.recompute == "selective" else ("core_attn",),
                "overlap_moe_expert_parallel_comm": self.ep_overlap, "delay_wgrad_compute": self.ep_overlap,
                "moe_shared_expert_overlap": shared_overlap and not self.ep_overlap}


_NO_RECOMPUTE = LayerExecution()


def layer_executions(model: ModelSpec, o: SearchOptions, ep: int) -> list[LayerExecution]:
    """The LayerExecutions of families with expert-parallel size ep: o's recompute kinds (each
    selective module set of o.recompute_module_sets or selective_module_sets), a block kind
    with "full" (o.partial_recompute), and each kind but full recompute with the EP overlap
    where Megatron allows it (EP > 1, at most one MTP layer: transformer_config.py)."""
    fixed = dict(o.fixed)
    recs = [fixed["recompute"]] if "recompute" in fixed else list(o.recompute)
    sets = o.recompute_module_sets or selective_module_sets(model)
    out = []
    for rec in recs:
        out += [LayerExecution("selective", m) for m in sets] if rec == "selective" else [LayerExecution(rec)]
    if "full" in recs and o.partial_recompute and "recompute" not in fixed:
        out.append(LayerExecution("full", block=True))
    if o.moe_ep_overlap and model.is_moe and ep > 1 and (model.mtp_num_layers or 0) <= 1:
        out += [replace(k, ep_overlap=True) for k in out if k.recompute != "full"]
    return out


@dataclass
class SearchResult:
    plans: list
    candidates: int = 0
    pruned_memory: int = 0
    pruned_bound: int = 0
    priced: int = 0
    invalid: int = 0              # candidates the structure rules refused (none by construction)
    seconds: float = 0.0
    solver: str = "dp"
    status: str = "optimal"
    optimality_gap: float = 0.0
    warnings: list = field(default_factory=list)
    closest: Estimate | None = None
    idle_groups: list = field(default_factory=list)
    priced_estimates: list = field(default_factory=list)   # every estimate made (for the scatter plot)
    pruned_dominated: int = 0     # candidates whose every plan a found plan dominates
    hidden_dominated: int = 0     # priced plans within the top K's range that were dominated
    objective: str = "throughput"
    plan_figures: list = field(default_factory=list)       # objective.Figures of each plan
    # safe by default: the best TIGHT plan when it beats #1 on the objective (not in `plans`
    # unless fewer than K plans fit with margin), and how many TIGHT plans close `plans`
    fastest_tight: Estimate | None = None
    tight_listed: int = 0


def warn(warnings: list, msg: str) -> None:
    """Add msg to a list of warnings (SearchResult.warnings) unless it is there already."""
    if msg not in warnings:
        warnings.append(msg)


@dataclass(frozen=True)
class SearchProgress:
    """What the search has done so far (the progress callback's argument)."""
    candidates: int              # in the space
    reached: int                 # candidates built and screened
    priced: int
    best: float | None           # objective of the best plan so far (seconds, or $ per M tokens)
    best_step_s: float | None
    bound: float | None          # the lowest bound still queued: no unpriced plan is better
    seconds: float

    @property
    def gap(self) -> float | None:
        """How much better than the best so far an unpriced plan could still be (fraction)."""
        if self.best is None or self.bound is None:
            return None
        return max(0.0, (self.best - self.bound) / self.best) if self.best > 0 else 0.0


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pow2_upto(n: int) -> list[int]:
    out, x = [], 1
    while x <= n:
        out.append(x)
        x *= 2
    return out


def stage_layouts(cluster: ClusterSpec, per_stage: int, pp: int,
                  budget: GpuBudget = GpuBudget()) -> dict[tuple[int, ...], list[tuple[str, ...]]]:
    """Ways to put pp stages of `per_stage` GPUs on node groups, keyed by how many stages each
    group hosts. Stages of one group are contiguous, groups come in every order (the first
    stages hold the most activations). Each group used hosts as many stages as it can hold,
    except at most one partly used group (leaving GPUs of two groups idle at once is never
    needed to use the fast ones fully, and it keeps the space small on many-group clusters),
    each group's stages fill whole nodes, and the GPU budget allows the stages' GPUs on the
    used groups. Of orders that a symmetry of the cluster maps onto each other (interchangeable
    node groups, distinct_orders) only the first is kept: they are one plan."""
    groups = cluster.node_groups
    caps = []
    for g in groups:
        ok = per_stage % g.gpus_per_node == 0 or g.gpus_per_node % per_stage == 0
        caps.append(min(g.num_gpus // per_stage, pp) if ok else 0)
    counts_set = set()
    n = len(groups)
    for used in itertools.product((0, 1), repeat=n):
        idx = [i for i in range(n) if used[i] and caps[i] > 0]
        if len(idx) != sum(used):
            continue
        for partial in idx:
            counts = [caps[i] if i in idx else 0 for i in range(n)]
            counts[partial] = pp - sum(caps[i] for i in idx if i != partial)
            used_gpus = sum(groups[i].num_gpus for i in idx)
            # each group's stages fill whole nodes (torchrun starts the same number of ranks on
            # every node; a node cannot host stages of two groups)
            whole = all(counts[i] * per_stage % groups[i].gpus_per_node == 0 for i in idx)
            if whole and 1 <= counts[partial] <= caps[partial] and budget.allows(pp * per_stage, used_gpus):
                counts_set.add(tuple(counts))
    out = {}
    for counts in sorted(counts_set):
        used = [i for i, c in enumerate(counts) if c]
        seqs = set()
        for order in itertools.permutations(used):
            seq = []
            for i in order:
                seq += [groups[i].name] * counts[i]
            seqs.add(tuple(seq))
        out[counts] = sorted(seqs)
    return distinct_orders(cluster, out)


def _group_signature(g) -> object:
    """A node group without its name (and its profile without name and provenance): groups
    with equal signatures price every stage alike."""
    return replace(g, name="", gpu=replace(g.gpu, name="", source="", uncertain=()))


def order_key(cluster: ClusterSpec, seq: tuple[str, ...]) -> tuple:
    """The stage order up to a renaming of node groups: groups labelled by first appearance,
    with each label's group signature and the interconnect between every two labels. Orders
    with equal keys are priced alike by the cost model, which sees a group only through its
    fields and the links between the groups a plan uses (cost/comm.py), and so are one plan:
    on two identical sites, sites a then b is b then a."""
    label: dict = {}
    for name in seq:
        label.setdefault(name, len(label))
    names = list(label)
    links = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            ic = cluster.interconnect(names[i], names[j])
            links.append(None if ic is None else (ic.bandwidth_bytes_per_s, ic.latency_s))
    return (tuple(label[n] for n in seq), tuple(_group_signature(cluster.group(n)) for n in names), tuple(links))


def distinct_orders(cluster: ClusterSpec, layouts: dict) -> dict:
    """layouts with one stage order of each symmetry class (order_key), the first in the order
    of the node groups as listed (most stages on the first group)."""
    sigs = [_group_signature(g) for g in cluster.node_groups]
    if len(set(sigs)) == len(sigs):
        return layouts   # no two groups are interchangeable
    seen: set = set()
    keep: dict = {}
    for counts in sorted(layouts, reverse=True):
        kept = []
        for seq in layouts[counts]:
            key = order_key(cluster, seq)
            if key not in seen:
                seen.add(key)
                kept.append(seq)
        if kept:
            keep[counts] = kept
    return {c: keep[c] for c in layouts if c in keep}


def enumerate_space(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions):
    fixed = dict(o.fixed)
    # TP and expert-TP stay within a scale-up domain: a node, or a rack's NVLink domain of trays
    # (scale_up_domain_gpus) where one is declared
    max_domain = max(g.domain_gpus for g in cluster.node_groups)
    N = cluster.num_gpus
    n_min = min(g.num_gpus for g in cluster.node_groups)   # a plan may run on one node group
    a, g = model.num_attention_heads, model.num_query_groups
    tps = [t for t in _pow2_upto(max_domain if not o.allow_tp_across_nodes else max(64, max_domain))
           if a % t == 0 and (g % t == 0 or t % g == 0)]
    cps = [c for c in _pow2_upto(MAX_CP) if o.seq_length % (2 * c) == 0 or c == 1]
    if o.seq_length < CP_MIN_SEQ_LENGTH:
        cps = [1]
    elif o.seq_length < CP_FULL_RANGE_SEQ_LENGTH:
        cps = [c for c in cps if c <= CP_SHORT_MAX]
    eps = [1]
    if model.is_moe:
        eps = [e for e in _pow2_upto(min(model.num_experts, 256)) if model.num_experts % e == 0]
    pps = list(range(1, min(model.num_layers, MAX_PP) + 1))
    # expert-TP within a domain (like TP), dividing the expert FFN (each rank a slice of fc1/fc2);
    # EP is not bounded by the domain (groups spanning domains go hierarchical, cost/comm.py)
    etp_opts = [e for e in _pow2_upto(max_domain) if model.is_moe and model.moe_ffn_hidden_size % e == 0]
    for key, vals in (("tp", tps), ("cp", cps), ("ep", eps), ("pp", pps)):
        if key in fixed:
            vals[:] = [fixed[key]]
    batch_divisors = _divisors(o.global_batch_size)
    budget = o.budget
    # a plan's world size, as the budget allows it on some set of node groups (the smallest
    # group alone is the least any plan has available); stage_layouts applies the exact rule
    lo = budget.min_fraction * budget.cap(n_min) if budget.gpus is None else budget.gpus - 1
    hi = budget.cap(N) if budget.gpus is None else budget.gpus
    for tp in tps:
        for cp in cps:
            if tp > 1 and o.seq_length % (cp * tp):
                continue   # sequence parallelism (on whenever tp > 1) would break: check_structure
            for pp in pps:
                base = tp * cp * pp
                if base > hi:
                    break
                dps = [d for d in batch_divisors if lo < base * d <= hi]
                if "dp" in fixed:
                    dps = [fixed["dp"]]
                for dp in dps:
                    per = tp * cp * dp
                    for ep in eps:
                        # MoE parallel folding (Megatron-Core): expert-TP independent of the
                        # dense TP, and EP x expert-TP folded over any of the stage's
                        # tp x cp x dp ranks; parallel_state.py only needs the expert grid
                        # (etp x ep x expert-dp) to cover the stage's ranks exactly
                        etps = etp_opts if model.is_moe else [None]
                        if "etp" in fixed and model.is_moe:
                            etps = [fixed["etp"]]
                        for etp in etps:
                            if model.is_moe and per % (etp * ep):
                                continue
                            yield tp, cp, pp, dp, ep, etp


def zero_options(o: SearchOptions) -> list[int]:
    """The ZeRO stages searched: a pinned one, or o.zero_stages less ZeRO 0 when a setting needs
    the distributed optimizer."""
    fixed = dict(o.fixed)
    zeros = [fixed["zero"]] if "zero" in fixed else list(o.zero_stages)
    settings = dict(o.settings)
    if any(settings.get(f) for f in NEED_SHARDED_OPTIMIZER):
        zeros = [z for z in zeros if z >= 1]
    return zeros


def family_groups(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, layouts_of):
    """Every family of the space, grouped by what they share: (tp, cp, pp, dp, ep, etp, mbs,
    micro-batches, stage orders, fams, fams_id), one entry per degrees and micro-batch, fams its
    layer executions [(i, LayerExecution, vpps, candidates per stage order), ...], i each one's
    place in layer_executions(model, o, ep), fams_id an int naming fams (the same int, the same
    tuple: 10^5-10^6 families in 10^4-10^5 groups share a few hundred, and the search handles
    a group's families together). `layouts_of(per_stage, pp)` gives the stage orders a pipeline
    of that shape has under o's GPU budget (0: none)."""
    fixed = dict(o.fixed)
    L = model.num_layers
    mbs_opts = [fixed["mbs"]] if "mbs" in fixed else list(MICRO_BATCHES)
    n_zero = len(zero_options(o))
    vpp_opts = [fixed["vpp"]] if "vpp" in fixed else list(VPP_CHOICES)
    kinds_of: dict = {}
    # (pp, m % pp == 0) -> the vpps of a group's families, and of its block families
    vpps_of: dict = {}
    # (ep, vpps, block vpps, pp > 1) -> (fams, fams_id): what a group's layer executions depend on
    templates: dict = {}

    def vpps_for(pp: int, m: int) -> tuple:
        vpps = tuple(v for v in vpp_opts
                     if v == 1 or (pp >= 2 and m % pp == 0 and "interleaved" in o.schedules
                                   and L >= pp * v and (o.uneven_chunks or L % v == 0)))
        # a block family is bounded as if nothing were recomputed (its candidates add the
        # recompute of their k layers per chunk); its chunks stay even
        return vpps, tuple(v for v in vpps if L % v == 0 and L // pp // v >= 2)

    def template(ep: int, vpps: tuple, block_vpps: tuple, piped: bool) -> tuple:
        kinds = kinds_of.get(ep)
        if kinds is None:
            kinds = kinds_of[ep] = layer_executions(model, o, ep)
        fams = []
        for i, kind in enumerate(kinds):
            vh = vpps
            if kind.block:
                vh = block_vpps
            elif kind.ep_overlap and piped:
                vh = tuple(v for v in vpps if v > 1)   # Megatron: a virtual pipeline when pp > 1
            if vh:
                fams.append((i, kind, vh, len(vh) * n_zero))
        return tuple(fams), len(templates)

    for tp, cp, pp, dp, ep, etp in enumerate_space(model, cluster, o):
        n_orders = layouts_of(tp * cp * dp, pp)
        if not n_orders:
            continue
        for mbs in mbs_opts:
            if o.global_batch_size % (mbs * dp):
                continue
            m = o.global_batch_size // (mbs * dp)
            vkey = (pp, m % pp == 0)
            vh = vpps_of.get(vkey)
            if vh is None:
                vh = vpps_of[vkey] = vpps_for(pp, m)
            tkey = (ep, *vh, pp > 1)
            got = templates.get(tkey)
            if got is None:
                got = templates[tkey] = template(ep, *vh, pp > 1)
            if got[0] and n_zero:
                yield tp, cp, pp, dp, ep, etp, mbs, m, n_orders, *got


def space_worlds(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions) -> dict[int, int]:
    """World size -> candidates of that size in the space (empty: no plan can be built)."""
    cache: dict = {}

    def layouts_of(per, pp):
        if (per, pp) not in cache:
            cache[per, pp] = sum(len(v) for v in stage_layouts(cluster, per, pp, o.budget).values())
        return cache[per, pp]

    out: dict = {}
    for tp, cp, pp, dp, *_, n_orders, fams, _ in family_groups(model, cluster, o, layouts_of):
        world = tp * cp * pp * dp
        out[world] = out.get(world, 0) + n_orders * sum(per_order for *_, per_order in fams)
    return out
