"""The search against brute force: on small cases, pricing every strategy of the searched space
with every contiguous layer split must not find a plan better than the search's top plan, and
the search's lower bounds must never exceed what `estimate` gives."""

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner.cost.memory import stage_memory
from planner.estimate import time_key, estimate
from planner.library import load_bundled_profile, load_model_ref
from planner.placement import placement_of
from planner.errors import InvalidStrategy
from planner.search.family_screen import FamilyScreen
from planner.search.bounds import Bounds
from planner.search.minmax import mixed_count_minmax, mixed_floor
from planner.search.planner import (MICRO_BATCHES, VPP_CHOICES, GpuBudget, SearchOptions, enumerate_space, search,
                                    stage_layouts)
from planner.search.results import Plans
from planner.search.screen import RoomTerms, StageRooms, memory_screen, stage_rooms
from planner.search.space import execution_of, layer_executions
from planner.search.split import initial_split, with_split
from planner.search.sweep import run_one
from planner.specs.cluster import cluster_from_dict
from planner.specs.model import model_from_dict
from planner.strategy import Strategy, check_structure

def _model(name, layers, hidden, heads, ffn, swiglu):
    return model_from_dict({
        "name": name, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
        "num_query_groups": 8, "ffn_hidden_size": ffn, "vocab_size": 128256,
        "max_position_embeddings": 4096, "swiglu": swiglu, "normalization": "RMSNorm",
        "untie_embeddings_and_output_weights": True, "position_embedding_type": "rope",
        "add_bias_linear": False, "attention_dropout": 0.0, "hidden_dropout": 0.0}, "test")


# 8 very wide layers (15.4B parameters) on 8 GPUs: memory binds, so sharding, recompute and
# the layer split matter; small enough to price every split.
MODEL = _model("wide-8", 8, 12288, 96, 49152, False)
# 6 layers, 7.5B parameters: four H100 hold it, and slow A100s behind a 100 Gb/s link do not help.
SMALL = _model("wide-6", 6, 8192, 64, 28672, True)


def group_dict(name, gpu, nodes, nic_gbps):
    return {"name": name, "nodes": nodes, "gpus_per_node": 4, "gpu": gpu, "nics_per_node": 4,
            "nic_bandwidth": f"{nic_gbps} Gb/s"}


HOMOGENEOUS = cluster_from_dict({"name": "h100-2x4", "node_groups": [group_dict("h100", "h100-sxm-80g", 2, 400)]}, "test")
SMALL_MEMORY = cluster_from_dict({"name": "a100-2x4", "node_groups": [group_dict("a100", "a100-sxm-40g", 2, 200)]}, "test")
H100_ALONE = cluster_from_dict({"name": "h100-1x4", "node_groups": [group_dict("h100", "h100-sxm-80g", 1, 400)]}, "test")
MIXED = cluster_from_dict({
    "name": "mixed-2x4", "node_groups": [group_dict("h100", "h100-sxm-80g", 1, 400),
                                         group_dict("a100", "a100-sxm-40g", 1, 200)],
    "interconnect": [{"between": ["h100", "a100"], "bandwidth": "100 Gb/s", "latency": "20 us"}]}, "test")
# allow_tight: the exactness tests compare with every plan that fits; the default, which ranks
# TIGHT plans after those that fit with margin, has its own brute-force test
OPTIONS = SearchOptions(global_batch_size=16, seq_length=2048, top=1, recompute=("none", "full"),
                        zero_stages=(0, 1), allow_tight=True)


def _splits(L, p, v, uneven=True):
    """Every contiguous split with at least v layers a stage (one per virtual chunk); with
    uneven, any count (the chunks of a rank differ by one layer), else multiples of v."""
    for cuts in itertools.combinations(range(1, L), p - 1):
        b = (0,) + cuts + (L,)
        split = tuple(b[i + 1] - b[i] for i in range(p))
        if min(split) >= v and (uneven or all(n % v == 0 for n in split)):
            yield split


def _space(model, cluster, o):
    """Every strategy of the searched space, with every contiguous layer split."""
    for tp, cp, pp, dp, ep, etp in enumerate_space(model, cluster, o):
        for orders in stage_layouts(cluster, tp * cp * dp, pp, o.budget).values():
            for groups in orders:
                for mbs in MICRO_BATCHES:
                    if o.global_batch_size % (mbs * dp):
                        continue
                    m = o.global_batch_size // (mbs * dp)
                    for vpp in VPP_CHOICES:
                        if vpp > 1 and (pp < 2 or m % pp or not o.uneven_chunks and model.num_layers % vpp):
                            continue
                        for kind in layer_executions(model, o, ep):
                            if kind.ep_overlap and pp > 1 and vpp == 1:
                                continue   # Megatron: the EP overlap needs a virtual pipeline
                            for z in o.zero_stages:
                                s = Strategy(
                                    tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp,
                                    micro_batch_size=mbs, global_batch_size=o.global_batch_size,
                                    seq_length=o.seq_length, sequence_parallel=tp > 1,
                                    zero_stage=z, precision=o.precision, **_execution(model, o, cluster, kind),
                                    schedule="interleaved" if vpp > 1 else "1f1b",
                                    stage_node_groups=groups if cluster.is_heterogeneous else None,
                                    overlap_grad_reduce=True, overlap_param_gather=z >= 1)
                                if not kind.block:
                                    for split in _splits(model.num_layers, pp, vpp, o.uneven_chunks):
                                        yield with_split(s, split)
                                    continue
                                # full recompute of k layers per chunk: on the starting split only
                                # (the search's definition; the partition is not re-solved for it)
                                valid, split = initial_split(model, cluster, s, groups, uneven=False)
                                if valid:
                                    per_chunk = min(split or s.stage_layers(model)) // vpp
                                    for k in range(1, per_chunk):
                                        yield s.with_(recompute_num_layers=k, layers_per_stage=split)


def _execution(model, o, cluster, kind):
    """The Strategy fields of a LayerExecution, with the search's other execution settings."""
    ex = execution_of(model, o, cluster)
    return {**ex, **kind.fields(ex["moe_shared_expert_overlap"])}


def assert_bounds(bounds, cluster, s, plain, e, extra_s=None, budget=GpuBudget()):
    """Every bound the search prunes with, from the family down to the candidate, is at most
    the estimate, whatever the split; the vectorised children bounds do not exceed `candidate`
    (which adds whole-layer integrality)."""
    tk = time_key(plain)
    groups = s.stage_node_groups or (cluster.node_groups[0].name,) * s.pp
    layouts = stage_layouts(cluster, s.gpus_per_stage, s.pp, budget)
    step = e.step_time_s * (1 + 1e-9)
    cand = bounds.candidate(plain, tk, groups, extra_s=extra_s)
    assert cand <= step, s
    assert bounds.on_split(plain, tk, groups, extra_s) <= step, s     # on the candidate's own split
    assert bounds.cell(plain, tk, groups, (s.vpp,), (s.zero_stage,)) <= step, s
    caps = bounds.stage_caps(s.gpus_per_stage, s.pp, layouts)
    assert bounds.family(plain, tk, s.pp, s.num_microbatches, s.gpus_per_stage, caps, s.vpp) <= step, s
    if extra_s is None:
        _, [[child]] = bounds.children(plain, tk, (groups,), (s.vpp,), (s.zero_stage,))
        assert child <= cand * (1 + 1e-9)   # the closed form without whole layers


def assert_floor_bound(bounds, cluster, s, e, budget=GpuBudget()):
    """A recomputing family is queued under the bound of its class without recompute
    (LayerExecution.floor): that bound too is at most the estimate."""
    if s.recompute == "none":
        return
    floor = s.with_(recompute="none", recompute_modules=("core_attn",))
    caps = bounds.stage_caps(s.gpus_per_stage, s.pp, stage_layouts(cluster, s.gpus_per_stage, s.pp, budget))
    assert bounds.family(floor, time_key(floor), s.pp, s.num_microbatches, s.gpus_per_stage, caps,
                         s.vpp) <= e.step_time_s * (1 + 1e-9), s


# Strategy fields a family carries from the search's execution settings and its LayerExecution
_EXECUTION_FIELDS = ("recompute_modules", "fp8_recipe", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
                     "moe_shared_expert_overlap")


def _assert_family_screen_passes(model, cluster, s, uneven, budget=GpuBudget()):
    """The family memory screen never rules out a strategy that fits."""
    block = s.recompute_num_layers is not None
    base = Strategy(tp=s.tp, pp=s.pp, dp=s.dp, cp=s.cp, ep=s.ep, etp=s.etp, micro_batch_size=s.micro_batch_size,
                    global_batch_size=s.global_batch_size, seq_length=s.seq_length,
                    recompute="none" if block else s.recompute, sequence_parallel=s.tp > 1,
                    precision=s.precision, overlap_grad_reduce=True,
                    **{f: getattr(s, f) for f in _EXECUTION_FIELDS})
    layouts = stage_layouts(cluster, s.gpus_per_stage, s.pp, budget)
    got = _screen_families(model, cluster, [base], block, (s.vpp,), (s.zero_stage,), uneven, layouts)
    assert got.may_fit[0], s
    # nor, screened with every ZeRO stage, under its own (the search builds only those)
    zeros = (0, 1, 2, 3)
    every = _screen_families(model, cluster, [base], block, (s.vpp,), zeros, uneven, layouts)
    assert every.may_fit[0] and every.zero_fit[0][zeros.index(s.zero_stage)], s
    return got.peak[0]


def _screen_families(model, cluster, bases, block, vpps, zeros, uneven, layouts):
    """FamilyScreen over families of these strategies (vpp 1, any pp and dp) and stage layouts."""
    screen = FamilyScreen(model, cluster, zeros, uneven)
    names = tuple(sorted({g for orders in layouts.values() for gs in orders for g in gs}))
    for b in bases:
        screen.add(b, time_key(b), b.pp, b.dp, b.num_microbatches, block, max(vpps), names)
    return screen.run(every_peak=True)


def assert_peak_bounds(model, cluster, s, e, uneven, budget=GpuBudget()):
    """The peak-memory bounds the search prunes dominated plans with are at most the peak
    bytes of any GPU, for the candidate (any split) and for its whole family (any vpp, ZeRO
    stage and placement); both hold whether or not the strategy fits."""
    peak = max(m.total for m in e.memory)
    bounds = Bounds(model, cluster, uneven)
    reach = bounds.dense_ranks(s.pp, s.vpp)   # MoE-only ranks get an MoE layer's bytes
    may_fit, n_max, peak_lb = memory_screen(model, cluster, s, uneven=uneven, dense_reach=reach)
    assert peak_lb <= peak * (1 + 1e-12), s
    assert may_fit or not e.fits, s      # the candidate screen never rules out a plan that fits
    if e.fits and s.chunk_layers is None:   # nor a stage's layers (the caps the bounds use)
        assert all(n >= k for n, k in zip(n_max, s.stage_layers(model))), (s, n_max)
    if e.fits and s.recompute_num_layers is None:
        # the bound the screened candidate is queued again with: the most layers each stage holds
        groups = s.stage_node_groups or (cluster.node_groups[0].name,) * s.pp
        assert bounds.candidate(s, time_key(s), groups, n_max) <= e.step_time_s * (1 + 1e-9), s
        # the same caps over a whole cell at once, as the search bounds a cell's candidates
        # (Bounds.children with stage_rooms), with the margin too where the plan fits with it
        names = tuple(sorted(set(groups)))
        rows = {g: i for i, g in enumerate(names)}
        margins = (False, True) if all(m.verdict == "fits" for m in e.memory) else (False,)
        _, (_, *capped) = bounds.children(s, time_key(s), (groups,), (s.vpp,), (s.zero_stage,),
                                          [lambda v, z, mg=mg: (rows, stage_rooms(model, cluster, s, names, reach,
                                                                                  with_margin=mg))
                                           for mg in margins])
        assert all(b[0] <= e.step_time_s * (1 + 1e-9) for b in capped), (s, capped)
        # and over the cell's stage groups without their order (Bounds.cell_bounds: each group's
        # stages on its roomiest ranks), at most each order's bound
        held = []
        for mg in margins:
            room = stage_rooms(model, cluster, s, names, reach, with_margin=mg).room
            t = np.arange(1, max(1, min(int(room.max()), model.num_layers)) + 1)
            held.append((rows, (room[:, :, None] >= t).sum(axis=1)))
        _, *cells = bounds.cell_bounds(s, time_key(s), groups, (s.vpp,), (s.zero_stage,),
                                       [lambda v, z, h=h: h for h in held])
        assert all(c <= b[0] * (1 + 1e-9) for c, b in zip(cells, capped)), (s, cells, capped)
    if e.fits:
        assert _assert_family_screen_passes(model, cluster, s, uneven, budget) <= peak * (1 + 1e-12), s


_BRUTE: dict = {}


def _brute_force(model, cluster, o):
    """(best, fitting count, count, every fitting estimate) over the space; one run per model,
    cluster and space (the top K does not change the space)."""
    key = (model.name, cluster, replace(o, top=1, keep_dominated=False))
    if key not in _BRUTE:
        _BRUTE[key] = brute_force_run(model, cluster, o)
    return _BRUTE[key]


def brute_force_run(model, cluster, o):
    best, n_fit, n_all, bounds = None, 0, 0, Bounds(model, cluster, o.uneven_chunks)
    fitting = []
    for s in _space(model, cluster, o):
        try:
            check_structure(s, model)
            e = estimate(model, cluster, s)
        except InvalidStrategy:
            continue
        n_all += 1
        groups = s.stage_node_groups or (cluster.node_groups[0].name,) * s.pp
        if s.recompute_num_layers is None:
            assert_bounds(bounds, cluster, s, s, e, budget=o.budget)
            assert_floor_bound(bounds, cluster, s, e, o.budget)
        else:   # a block-recompute child: bounded on the plain costs plus its recompute
            plain = s.with_(recompute="none", recompute_num_layers=None)
            assert_bounds(bounds, cluster, s, plain, e, bounds.recompute_extra(s, groups), o.budget)
        assert_peak_bounds(model, cluster, s, e, o.uneven_chunks, o.budget)
        if e.fits:
            n_fit += 1
            fitting.append(e)
            if best is None or e.step_time_s < best.step_time_s:
                best = e
    return best, n_fit, n_all, fitting


def _assert_counts_add_up(r):
    assert r.invalid == 0
    assert r.candidates == r.pruned_memory + r.pruned_bound + r.pruned_dominated + r.priced, r


@pytest.mark.parametrize("cluster,uneven", [(HOMOGENEOUS, False), (SMALL_MEMORY, False), (MIXED, False),
                                            (HOMOGENEOUS, True), (MIXED, True)],
                         ids=["h100", "a100-40g", "h100+a100", "h100-uneven-chunks", "h100+a100-uneven-chunks"])
def test_top_plan_is_the_brute_force_optimum(cluster, uneven):
    o = replace(OPTIONS, uneven_chunks=uneven)
    best, n_fit, n_all, _ = _brute_force(MODEL, cluster, o)
    assert n_all > 1000 and 0 < n_fit < n_all   # not trivial: memory rules some out
    r = search(MODEL, cluster, o)
    top = r.plans[0]
    assert top.fits
    assert top.step_time_s == pytest.approx(best.step_time_s, rel=1e-9), (top.strategy, best.strategy)
    assert r.priced < n_all / 10   # the bounds pruned most of the space
    _assert_counts_add_up(r)


# 4 MoE layers of 8 experts (with a wide dense TP, expert-TP and EP fold over the stage's ranks
# in several ways), 8 GPUs: MoE parallel folding against brute force.
MOE = model_from_dict({
    "name": "moe-4", "num_layers": 4, "hidden_size": 6144, "num_attention_heads": 48, "num_query_groups": 8,
    "ffn_hidden_size": 16384, "vocab_size": 128256, "max_position_embeddings": 4096, "swiglu": True,
    "normalization": "RMSNorm", "untie_embeddings_and_output_weights": True, "position_embedding_type": "rope",
    "add_bias_linear": False, "attention_dropout": 0.0, "hidden_dropout": 0.0, "num_experts": 8,
    "moe_router_topk": 2, "moe_ffn_hidden_size": 16384}, "test")


# The same with a dense first layer (DeepSeek-V3's pattern): the memory screens bound the MoE
# layers' room apart from the lighter dense layers'.
MOE_DENSE_FIRST = model_from_dict({**{k: getattr(MOE, k) for k in (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size",
    "max_position_embeddings", "swiglu", "normalization", "untie_embeddings_and_output_weights",
    "position_embedding_type", "add_bias_linear", "attention_dropout", "hidden_dropout", "num_experts",
    "moe_router_topk", "moe_ffn_hidden_size")}, "name": "moe-4-dense-first", "moe_layer_freq": [0, 1, 1, 1]}, "test")


@pytest.mark.parametrize("model,cluster", [(MOE, HOMOGENEOUS), (MOE_DENSE_FIRST, HOMOGENEOUS),
                                           (MOE_DENSE_FIRST, MIXED)],
                         ids=["all-moe", "dense-first", "dense-first-h100+a100"])
def test_moe_parallel_folding_against_brute_force(model, cluster):
    o = replace(OPTIONS, recompute=("none", "full"), zero_stages=(1,), partial_recompute=False)
    space = list(enumerate_space(model, cluster, o))
    assert any(etp not in (1, tp) for tp, _, _, _, _, etp in space)     # expert-TP beyond {1, tp}
    assert any(ep > dp for _, _, _, dp, ep, _ in space)                 # EP folded over TP ranks
    best, n_fit, n_all, _ = _brute_force(model, cluster, o)
    assert 0 < n_fit < n_all
    r = search(model, cluster, o)
    assert r.plans[0].step_time_s == pytest.approx(best.step_time_s, rel=1e-9), (r.plans[0].strategy, best.strategy)
    _assert_counts_add_up(r)


@pytest.mark.parametrize("model,cluster", [(MOE, HOMOGENEOUS), (MOE_DENSE_FIRST, MIXED)],
                         ids=["all-moe", "dense-first-h100+a100"])
def test_moe_execution_choices_against_brute_force(model, cluster):
    """Selective recompute module sets and the EP all-to-all overlap are families of the space:
    the top plan is the brute-force optimum over them, and both are in the space."""
    o = replace(OPTIONS, recompute=("none", "selective", "full"), zero_stages=(1,), partial_recompute=False)
    space = list(_space(model, cluster, o))
    assert any(s.overlap_moe_expert_parallel_comm and s.delay_wgrad_compute and not s.moe_shared_expert_overlap
               for s in space)
    assert {s.recompute_modules for s in space if s.recompute == "selective"} == {
        ("core_attn",), ("moe_act",), ("layernorm", "moe_act")}
    best, n_fit, n_all, _ = _brute_force(model, cluster, o)
    assert 0 < n_fit < n_all
    r = search(model, cluster, o)
    assert r.plans[0].step_time_s == pytest.approx(best.step_time_s, rel=1e-9), (r.plans[0].strategy, best.strategy)
    _assert_counts_add_up(r)


def test_counts_add_up_when_the_time_limit_stops_the_search(monkeypatch):
    import itertools as it

    import planner.search.best_first as P

    clock = it.count()
    monkeypatch.setattr(P.time, "perf_counter", lambda: next(clock) * 0.001)
    r = search(MODEL, MIXED, replace(OPTIONS, time_limit_s=0.01))
    assert r.status == "time-limit"
    _assert_counts_add_up(r)


def test_mixed_cluster_uses_the_a100s_when_they_help():
    alone = search(MODEL, H100_ALONE, OPTIONS).plans[0]
    mixed = search(MODEL, MIXED, OPTIONS)
    assert mixed.plans[0].step_time_s < alone.step_time_s
    assert set(mixed.plans[0].stage_groups) == {"h100", "a100"} and mixed.idle_groups == []


def test_mixed_cluster_says_when_the_a100s_cannot_help():
    alone = search(SMALL, H100_ALONE, OPTIONS).plans[0]
    mixed = search(SMALL, MIXED, OPTIONS)
    assert mixed.plans[0].step_time_s == pytest.approx(alone.step_time_s, rel=1e-12)
    assert mixed.idle_groups == ["a100"]


def test_large_inputs_stay_bounded():
    """#7: a 100,000-GPU cluster and a 1,000-layer model plan (the bench times them); the
    plans are whole: every GPU counted, every layer placed, memory within capacity."""
    from planner.library import load_cluster_ref, load_model_ref

    huge = cluster_from_dict({"name": "h100-100k", "node_groups": [group_dict("h100", "h100-sxm-80g", 25_000, 400)]}, "test")
    r = search(load_model_ref("llama3.1-405b"), huge, SearchOptions(global_batch_size=16384, seq_length=8192, top=1))
    s = r.plans[0].strategy
    assert r.status == "optimal" and r.plans[0].fits
    assert 50_000 < s.world_size <= 100_000
    deep = _model("deep-1000", 1000, 4096, 32, 14336, True)
    r = search(deep, load_cluster_ref("dgx-h100-x128"), SearchOptions(global_batch_size=1024, seq_length=4096, top=1))
    e = r.plans[0]
    assert r.status == "optimal" and e.fits and sum(e.strategy.stage_layers(deep)) == 1000


def test_a_crashing_ilp_solver_falls_back_to_the_dp(monkeypatch):
    """#7: --solver ilp whose solver fails still plans, warns, and says the DP ran."""
    import planner.search.split as split_module

    def broken(*a, **k):
        raise RuntimeError("solver binary missing")

    monkeypatch.setattr(split_module, "partition_ilp", broken)
    o = replace(OPTIONS, solver="ilp")
    r = search(MODEL, MIXED, o)
    assert r.plans and r.solver == "dp"
    assert any("fell back to dynamic programming" in w for w in r.warnings)
    monkeypatch.undo()
    r2 = search(MODEL, MIXED, o)
    assert r2.solver == "dp, checked by ilp-cbc" and not r2.warnings
    assert r2.plans[0].step_time_s == pytest.approx(r.plans[0].step_time_s, rel=1e-12)


def test_time_limit_reports_a_true_gap(monkeypatch):
    """A search stopped by its time limit returns its best plan and a gap that bounds how far
    the optimum can be below it: optimum >= best x (1 - gap). The clock is simulated (one tick
    a call) so that the cut falls at the same place on any machine."""
    import itertools as it

    import planner.search.best_first as P

    full = search(MODEL, MIXED, OPTIONS)
    optimum = full.plans[0].step_time_s
    for ticks in range(40, 400, 5):
        clock = it.count()
        monkeypatch.setattr(P.time, "perf_counter", lambda: next(clock) * 0.001)
        r = search(MODEL, MIXED, replace(OPTIONS, time_limit_s=ticks * 0.001))
        monkeypatch.undo()
        if r.status != "time-limit" or not r.plans:
            continue
        best = r.plans[0].step_time_s
        assert best >= optimum * (1 - 1e-12)
        assert 0 <= r.optimality_gap < 1 and optimum >= best * (1 - r.optimality_gap) - 1e-12
        return
    pytest.fail("no simulated time limit cut the search after a plan was found")


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["llama3-8b", "mixtral-8x7b", "qwen2.5-72b", "gpt-neox-20b", "llama3-70b"]),
       st.sampled_from(["dgx-h100-x8", "h100-a100-lab", "selene-a100-x64"]),
       st.sampled_from([64, 128, 256]), st.sampled_from([2048, 4096, 8192]))
def test_returned_plans_fit_and_emit_launches_megatron_accepts(model_name, cluster_name, gbs, seq):
    """The two promises: no returned plan exceeds memory, and its emitted launch passes the
    Megatron rules (checked_args raises otherwise; the parsed launch is checked again)."""
    from planner.megatron.emit import checked_args
    from planner.megatron.launch import parse_words
    from planner.megatron.rules import megatron_violations
    from planner.library import load_cluster_ref, load_model_ref

    model, cluster = load_model_ref(model_name), load_cluster_ref(cluster_name)
    r = search(model, cluster, SearchOptions(global_batch_size=gbs, seq_length=seq, top=3))
    for e in r.plans:
        again = estimate(model, cluster, e.strategy)
        assert again.fits and all(m.total <= m.capacity for m in again.memory)
        args = checked_args(model, e.strategy)
        launch = parse_words(args, "emitted", world_size=e.strategy.world_size)
        assert megatron_violations(launch, model) == []
    if not r.plans:
        assert r.closest is None or not r.closest.fits


# ---- distinct top K --------------------------------------------------------------------------
# Two identical sites of one 4-GPU node joined by a slow link: every stage order has a mirror
# image (site a then b is b then a) that the cost model prices alike.
TWO_SITE = cluster_from_dict({
    "name": "two-site", "node_groups": [group_dict("site-a", "h100-sxm-80g", 1, 400),
                                        group_dict("site-b", "h100-sxm-80g", 1, 400)],
    "interconnect": [{"between": ["site-a", "site-b"], "bandwidth": "100 Gb/s", "latency": "1 ms"}]}, "test")


def _point(e):
    """The figures a user compares plans on: step time, peak GiB per GPU as the table prints
    it, GPUs used."""
    return (e.step_time_s, round(max(m.total for m in e.memory) / 2**30, 1), e.strategy.world_size)


def _plans_of_space(fitting):
    """The search's plans, from brute force: each candidate (a strategy up to its layer split;
    block recompute up to its k) at its fastest fitting split or k."""
    best = {}
    for e in fitting:
        s = e.strategy
        key = (s.with_(layers_per_stage=None, chunk_layers=None, recompute_num_layers=None),
               s.recompute_num_layers is not None)
        if key not in best or e.step_time_s < best[key].step_time_s:
            best[key] = e
    return list(best.values())


def _front(points):
    """The points no other point is at least as good as on every figure (equal points: one)."""
    pts = sorted(set(points))
    return [p for p in pts if not any(q != p and all(a <= b for a, b in zip(q, p)) for q in pts)]


def _flat(points):
    return [x for p in points for x in p]


@pytest.mark.parametrize("cluster", [HOMOGENEOUS, MIXED, TWO_SITE], ids=["h100", "h100+a100", "two-site"])
def test_safe_by_default_top_k_is_the_brute_force_front_of_plans_with_margin(cluster):
    """By default (no allow_tight) the top K are the K best plans that fit with the memory
    model's margin and that no such plan dominates; a TIGHT plan is never ranked above them,
    and the fastest TIGHT plan of the space, when faster than #1, is reported beside them."""
    o = replace(OPTIONS, top=3, allow_tight=False)
    _, _, _, fitting = _brute_force(MODEL, cluster, o)
    safe = [e for e in fitting if e.memory_verdict == "fits"]
    tight = [e for e in fitting if e.memory_verdict == "tight"]
    front = _front([_point(e) for e in _plans_of_space(safe)])
    assert len(front) >= 3
    r = search(MODEL, cluster, o)
    assert all(e.memory_verdict == "fits" for e in r.plans)
    assert _flat(_point(e) for e in r.plans) == pytest.approx(_flat(front[:3]), rel=1e-9)
    assert r.status == "optimal"
    _assert_counts_add_up(r)
    fastest_tight = min((e.step_time_s for e in tight), default=float("inf"))
    if fastest_tight < r.plans[0].step_time_s:
        assert r.fastest_tight is not None
        assert r.fastest_tight.step_time_s == pytest.approx(fastest_tight, rel=1e-9)
    else:
        assert r.fastest_tight is None


def test_safe_by_default_changes_the_ranking_somewhere():
    """The case above is not vacuous: on the mixed cluster allow_tight ranks a TIGHT plan above
    one that fits with margin, and the default does not."""
    o = replace(OPTIONS, top=3)
    verdicts = [e.memory_verdict for e in search(MODEL, MIXED, o).plans]
    assert "tight" in verdicts and "fits" in verdicts[verdicts.index("tight"):]
    assert [e.memory_verdict for e in search(MODEL, MIXED, replace(o, allow_tight=False)).plans] == ["fits"] * 3


@pytest.mark.parametrize("cluster", [HOMOGENEOUS, MIXED, TWO_SITE], ids=["h100", "h100+a100", "two-site"])
def test_top_k_is_the_brute_force_front(cluster):
    """The top K (K = 3) are the K best plans no plan of the space dominates, and with
    keep_dominated (--all) the K best distinct plans: exact under the cost model, against every
    strategy and split of the space."""
    o = replace(OPTIONS, top=3)
    _, _, _, fitting = _brute_force(MODEL, cluster, o)
    points = [_point(e) for e in _plans_of_space(fitting)]
    front = _front(points)
    assert len(front) >= 3 and len(front) < len(set(points))   # dominance removes plans here
    r = search(MODEL, cluster, o)
    assert _flat(_point(e) for e in r.plans) == pytest.approx(_flat(front[:3]), rel=1e-9)
    assert r.status == "optimal"
    _assert_counts_add_up(r)
    every = search(MODEL, cluster, replace(o, keep_dominated=True))
    assert [e.step_time_s for e in every.plans] == pytest.approx(sorted(p[0] for p in points)[:3], rel=1e-9)
    assert len({e.strategy for e in every.plans}) == 3
    _assert_counts_add_up(every)


def _swap_sites(groups):
    return tuple({"site-a": "site-b", "site-b": "site-a"}[g] for g in groups)


def test_mirror_stage_orders_on_two_identical_sites_are_one_plan(monkeypatch):
    """On two identical sites a plan and its mirror image (the sites swapped) cost the same to
    the last byte and second, so the space keeps one of them: the top plans are all distinct,
    none the image of another, and the full set of orders holds each image the kept one
    stands for."""

    r = search(MODEL, TWO_SITE, replace(OPTIONS, top=4, keep_dominated=True))
    assert len(r.plans) == 4
    keys = set()
    for e in r.plans:
        s = e.strategy
        if s.stage_node_groups is None or len(set(s.stage_node_groups)) == 1:
            mirror = s.with_(stage_node_groups=_swap_sites(s.stage_node_groups)) if s.stage_node_groups else s
        else:
            mirror = s.with_(stage_node_groups=_swap_sites(s.stage_node_groups))
        m = estimate(MODEL, TWO_SITE, mirror)
        assert m.step_time_s == e.step_time_s
        assert [x.total for x in m.memory] == [x.total for x in e.memory]
        keys.add((s.with_(stage_node_groups=None), frozenset({s.stage_node_groups, mirror.stage_node_groups})))
    assert len(keys) == 4   # no plan is the mirror image of another
    # the space without the symmetry holds both images; with it, one
    full = {}
    import planner.search.space as space_module
    monkeypatch.setattr(space_module, "distinct_orders", lambda cluster, layouts: layouts)
    full = stage_layouts(TWO_SITE, 4, 2)
    monkeypatch.undo()
    kept = stage_layouts(TWO_SITE, 4, 2)
    orders = lambda lay: sorted(g for v in lay.values() for g in v)
    assert orders(full) == [("site-a", "site-b"), ("site-b", "site-a")]
    assert orders(kept) == [("site-a", "site-b")]


def test_groups_are_interchangeable_only_when_everything_a_plan_sees_agrees():
    """A different NIC, price, node count or link to the other used group makes two groups
    distinct; a link to a group the plan does not use does not."""
    from planner.search.planner import distinct_orders, order_key

    base = group_dict("x", "h100-sxm-80g", 1, 400)
    for change in ({"nic_bandwidth": "200 Gb/s"}, {"price_per_gpu_hour": 3.0}, {"nodes": 2}):
        c = cluster_from_dict({"name": "c", "node_groups": [base, {**base, "name": "y", **change}]}, "test")
        lay = {(1, 1): [("x", "y"), ("y", "x")]}
        assert distinct_orders(c, lay) == lay, change
    three = cluster_from_dict({
        "name": "c3", "node_groups": [base, {**base, "name": "y"}, {**base, "name": "z"}],
        "interconnect": [{"between": ["x", "y"], "bandwidth": "400 Gb/s"}, {"between": ["y", "z"], "bandwidth": "100 Gb/s"}]},
        "test")
    assert order_key(three, ("x", "y")) == order_key(three, ("y", "x"))       # the fast pair, either way
    assert order_key(three, ("x", "y")) != order_key(three, ("y", "z"))       # the slow pair differs
    assert order_key(three, ("x", "x")) == order_key(three, ("z", "z"))       # one group alone


@pytest.mark.parametrize("budget,expect", [({"gpus": 4}, {4}), ({"max_gpus": 7}, {4}),
                                           ({"min_gpu_fraction": 0.0}, {4, 8}), ({}, {8})])
def test_gpu_budget_bounds_the_space(budget, expect):
    """--gpus N: exactly N GPUs; --max-gpus N: at most N (and more than the minimum fraction of
    N); --min-gpu-fraction 0: any size. On 2 nodes of 4 GPUs, with stages on whole nodes, the
    space holds exactly the world sizes the budget allows, and the top plan is the brute-force
    optimum of that space."""
    o = replace(OPTIONS, **budget)
    sizes = {tp * cp * pp * dp for tp, cp, pp, dp, _, _ in enumerate_space(SMALL, HOMOGENEOUS, o)
             if stage_layouts(HOMOGENEOUS, tp * cp * dp, pp, o.budget)}
    assert sizes == expect
    r = search(SMALL, HOMOGENEOUS, o)
    assert {e.strategy.world_size for e in r.plans} <= expect
    best = min((e for e in brute_force_run(SMALL, HOMOGENEOUS, o)[3]), key=lambda e: e.step_time_s)
    assert r.plans[0].step_time_s == pytest.approx(best.step_time_s, rel=1e-9)


# ---- the cost objective --------------------------------------------------------------------
# MIXED with prices: H100 at $4 and A100 at $2 per GPU-hour (2024-25 cloud list prices are of
# this order; only their ratio matters here).
PRICES = {"h100": 4.0, "a100": 2.0}
PRICED_MIXED = cluster_from_dict({
    "name": "mixed-2x4-priced",
    "node_groups": [{**group_dict(g["name"], g["gpu"], 1, g["nic"]), "price_per_gpu_hour": PRICES[g["name"]]}
                    for g in ({"name": "h100", "gpu": "h100-sxm-80g", "nic": 400},
                              {"name": "a100", "gpu": "a100-sxm-40g", "nic": 200})],
    "interconnect": [{"between": ["h100", "a100"], "bandwidth": "100 Gb/s", "latency": "20 us"}]}, "test")


def _usd_per_step(e, charge_idle=False):
    """Dollars a step: the GPUs on each node group (every stage of a search plan sits on one)
    at its price, or every GPU of the cluster."""
    s = e.strategy
    if charge_idle:
        return sum(PRICES[g] * 4 for g in PRICES) * e.step_time_s / 3600
    return sum(PRICES[g] * s.gpus_per_stage for g in s.stage_node_groups) * e.step_time_s / 3600


def test_cheapest_plan_differs_from_the_fastest_and_both_are_exact():
    """On a priced heterogeneous cluster the fastest plan runs on both node groups, while the
    cheapest per token leaves the A100s idle (they add less speed than they cost). Under
    --objective cost the top K are the K cheapest plans that no plan dominates on step time,
    memory, GPUs and dollars, against brute force (the estimates of the unpriced cluster: a
    price changes no time); with --charge-idle the whole cluster is paid for, so cost ranks as
    step time."""
    o = replace(OPTIONS, top=3)
    _, _, _, fitting = _brute_force(MODEL, MIXED, o)
    plans = _plans_of_space(fitting)
    points = [_point(e) + (_usd_per_step(e),) for e in plans]
    by_cost = sorted(_front(points), key=lambda p: (p[3],) + p[:3])
    fast = search(MODEL, PRICED_MIXED, o)
    cheap = search(MODEL, PRICED_MIXED, replace(o, objective="cost"))
    got = [_point(e) + (_usd_per_step(e),) for e in cheap.plans]
    assert _flat(got) == pytest.approx(_flat(by_cost[:3]), rel=1e-9)
    f, c = fast.plans[0], cheap.plans[0]
    assert set(f.stage_groups) == {"h100", "a100"} and set(c.stage_groups) == {"h100"}
    assert c.step_time_s > f.step_time_s and _usd_per_step(c) < _usd_per_step(f)
    fig = cheap.plan_figures[0]
    assert fig.gpus_used == 4 and fig.gpus_idle == 4
    assert fig.usd_per_million_tokens == pytest.approx(
        _usd_per_step(c) / (o.global_batch_size * o.seq_length) * 1e6, rel=1e-12)
    _assert_counts_add_up(cheap)
    whole = search(MODEL, PRICED_MIXED, replace(o, objective="cost", charge_idle=True))
    assert whole.plans[0].step_time_s == f.step_time_s
    assert whole.plan_figures[0].usd_per_million_tokens == pytest.approx(
        _usd_per_step(f, charge_idle=True) / (o.global_batch_size * o.seq_length) * 1e6, rel=1e-12)


def test_the_k_th_best_can_rise_and_the_top_k_stays_exact():
    """A new plan that dominates two of the K best lowers their count: the K-th best objective
    rises (which is why the search defers, not drops, what lies above it)."""
    from types import SimpleNamespace


    plans = Plans(replace(OPTIONS, top=3))

    def fig(step, gib, gpus):
        return SimpleNamespace(objective=lambda _: step, point=(step, gib, gpus, 0.0))

    for step, gib in ((1.0, 60.0), (2.0, 50.0), (3.0, 40.0), (4.0, 30.0)):
        plans.add(SimpleNamespace(step=step), fig(step, gib, 8))
    assert plans.kth() == 3.0
    plans.add(SimpleNamespace(step=1.5), fig(1.5, 35.0, 8))   # dominates the plans of 2 s and 3 s
    assert [x[0] for x in plans.items] == [1.0, 1.5, 4.0] and plans.kth() == 4.0
    assert plans.dominate(5.0, 8, 0.0, 35 * 2**30) and not plans.dominate(5.0, 4, 0.0, 35 * 2**30)


def test_mixed_floor_never_exceeds_the_least_slowest_stage():
    """mixed_floor against every way of placing the dense layers: stage i holds v layers (at
    least), d_i of them dense, sum d_i <= n_dense; its cost is B_i - d_i saves_i. The bound must
    not exceed the least slowest stage over all placements, and must beat the single-kind floor
    max(B_i - v saves_i) when few dense layers meet many stages."""
    import itertools
    import random
    rng = random.Random(7)
    tighter = 0
    for _ in range(400):
        p, v, n_dense = rng.randint(1, 5), rng.randint(1, 3), rng.randint(0, 4)
        B = [rng.uniform(1, 10) for _ in range(p)]
        saves = [rng.uniform(0, 1) * b / v for b in B]
        best = min(max(b - d * s for b, s, d in zip(B, saves, ds))
                   for ds in itertools.product(range(v + 1), repeat=p) if sum(ds) <= n_dense)
        low = mixed_floor(B, saves, n_dense, v)
        assert low <= best + 1e-12, (B, saves, n_dense, v, low, best)
        tighter += low > max(b - v * s for b, s in zip(B, saves)) + 1e-9
    assert tighter > 100


def test_mixed_count_minmax_never_exceeds_the_least_slowest_stage():
    """mixed_count_minmax against every whole-layer placement: stage i (k_i of it alike) holds
    n_i MoE and d_i dense layers, n_i + d_i <= its memory cap, at least one layer, the d_i
    summing to n_dense, and takes e_i + n_i a_i + d_i c_i (c_i <= a_i, a dense layer's seconds).
    The bound must not exceed the least slowest stage, and on a slow stage that memory forces
    to take MoE layers it must be the worked value."""
    import random
    # two fast stages hold 2 layers each, the slow one takes the rest: 1 dense layer anywhere,
    # so at least 7 - 2 - 2 - 1 = 2 MoE layers on the slow stage: T >= 2 x 10 s
    stages = {(1.0, 0.0, 2): 2, (10.0, 0.0, 10): 1}
    assert mixed_count_minmax(stages, 7, 1, 0.0) == pytest.approx(20.0, rel=1e-8)
    rng = random.Random(11)
    for _ in range(300):
        rows = [(rng.uniform(1, 10), rng.uniform(0, 5), rng.randint(1, 4)) for _ in range(rng.randint(1, 3))]
        dense = [rng.uniform(0, 1) * a for a, _, _ in rows]
        L = rng.randint(len(rows), sum(c for _, _, c in rows))
        n_dense = rng.randint(0, min(2, L))
        best = float("inf")
        for counts in itertools.product(*[range(1, c + 1) for _, _, c in rows]):
            if sum(counts) != L:
                continue
            for ds in itertools.product(*[range(0, n + 1) for n in counts]):
                if sum(ds) != n_dense:
                    continue
                best = min(best, max(e + (n - d) * a + d * c for (a, e, _), c, n, d in zip(rows, dense, counts, ds)))
        if best == float("inf"):
            continue
        stages: dict = {}
        for a, e, cap in rows:
            stages[(a, e, cap)] = stages.get((a, e, cap), 0) + 1
        lo = max(e for _, e, _ in rows)
        assert mixed_count_minmax(stages, L, n_dense, lo) <= best * (1 + 1e-12), (rows, dense, L, n_dense)


def test_even_chunks_count_whole_layers_vpp_at_a_time():
    """Without uneven chunks every rank holds a multiple of vpp layers (check_structure): 12
    layers on 4 stages at vpp 2 put 4 on some stage, not 3, and the bounds that count whole
    layers know it. The candidate and cell-children bounds rise, and stay at most the estimate
    of every split the search can price."""
    model = _model("deep-12", 12, 4096, 32, 14336, True)
    s = Strategy(tp=2, pp=4, dp=1, vpp=2, schedule="interleaved", micro_batch_size=1, global_batch_size=16,
                 seq_length=2048, sequence_parallel=True, zero_stage=1, overlap_grad_reduce=True,
                 overlap_param_gather=True)
    tk, groups = time_key(s), ("h100",) * 4
    even, uneven = Bounds(model, HOMOGENEOUS, uneven_chunks=False), Bounds(model, HOMOGENEOUS)
    assert even.layer_multiple(2) == 2 and uneven.layer_multiple(2) == 1
    low, high = uneven.candidate(s, tk, groups, (12,) * 4), even.candidate(s, tk, groups, (12,) * 4)
    assert high > low * (1 + 1e-6)
    # the same caps through the cell's children (count_floor_rows, two layers at a time)
    rooms = {"h100": 0}
    room = StageRooms(room=np.full((1, 4), 12), moe_room=None, per=None, fixed=None)
    _, (_, [child]) = even.children(s, tk, (groups,), (2,), (1,), [lambda v, z: (rooms, room)])
    _, (_, [loose]) = uneven.children(s, tk, (groups,), (2,), (1,), [lambda v, z: (rooms, room)])
    assert child > loose * (1 + 1e-6)
    splits = list(_splits(12, 4, 2, uneven=False))
    assert (3, 3, 3, 3) not in splits and len(splits) == 10
    least = min(estimate(model, HOMOGENEOUS, with_split(s, split)).step_time_s for split in splits)
    assert max(high, child) <= least * (1 + 1e-9)


@pytest.mark.parametrize("freq", [[0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1], [1, 0, 1, 0, 1, 0, 1, 0],
                                  [1, 1, 1, 1, 1, 1, 0, 0]])
def test_dense_ranks_hold_every_dense_layer_of_every_split(freq):
    """Bounds.dense_ranks against every split whose virtual stages hold >= 1 layer each, in
    Megatron's order (virtual stage k p + r is chunk k of rank r): every rank that holds a dense
    layer in some split is in the set (the bound may only drop ranks no split gives one)."""
    from planner.library import load_cluster_ref
    model = model_from_dict({**{k: getattr(MOE, k) for k in (
        "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size",
        "max_position_embeddings", "swiglu", "normalization", "untie_embeddings_and_output_weights",
        "position_embedding_type", "add_bias_linear", "attention_dropout", "hidden_dropout", "num_experts",
        "moe_router_topk", "moe_ffn_hidden_size")}, "num_layers": len(freq), "name": "m", "moe_layer_freq": freq},
        "test")
    b = Bounds(model, load_cluster_ref("dgx-h100-x8"))
    L = len(freq)
    for p, v in ((2, 1), (2, 2), (3, 1), (4, 2), (8, 1)):
        V = p * v
        if V > L:
            continue
        reached = set()
        for cuts in itertools.combinations(range(1, L), V - 1):
            bounds_ = (0, *cuts, L)
            for vs in range(V):
                if any(freq[j] == 0 for j in range(bounds_[vs], bounds_[vs + 1])):
                    reached.add(vs % p)
        assert reached <= b.dense_ranks(p, v), (freq, p, v, reached, b.dense_ranks(p, v))
        if freq[0] == 0 and sum(1 for x in freq if x == 0) < p and L - V < p:
            assert b.dense_ranks(p, v) != frozenset(range(p))    # the bound has something to use


@pytest.mark.parametrize("model", [MODEL, MOE_DENSE_FIRST], ids=["dense", "dense-first-moe"])
def test_family_screen_shares_only_what_each_table_leaves_out(model):
    """FamilyScreen shares a rank's state bytes across micro-batch sizes and recompute, its
    activation bytes across data-parallel sizes and ZeRO stages, and both across pipeline
    depths: screening every family with one shared screen gives exactly what a fresh screen
    per family gives."""
    o = replace(OPTIONS, recompute=("none", "selective", "full"), zero_stages=(0, 1, 3))
    shared = FamilyScreen(model, MIXED, (0, 1, 3), False)
    alone, added = [], []
    for tp, cp, pp, dp, ep, etp in enumerate_space(model, MIXED, o):
        layouts = stage_layouts(MIXED, tp * cp * dp, pp, GpuBudget())
        if not layouts:
            continue
        for mbs, seq, rec, block in itertools.product((1, 2), (o.seq_length, 32 * o.seq_length),
                                                      ("none", "full"), (False, True)):
            if o.global_batch_size % (mbs * dp) == 0 and not (block and rec == "full"):
                base = Strategy(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp, micro_batch_size=mbs,
                                global_batch_size=o.global_batch_size, seq_length=seq, recompute=rec,
                                sequence_parallel=tp > 1, overlap_grad_reduce=True)
                names = tuple(sorted({g for orders in layouts.values() for gs in orders for g in gs}))
                shared.add(base, time_key(base), pp, dp, base.num_microbatches, block, 1, names)
                added.append((base, block, names))
                alone.append(_screen_families(model, MIXED, [base], block, (1,), (0, 1, 3), False, layouts))
    got = shared.run(every_peak=True)
    fit, zero_fit, peak = got.may_fit, got.zero_fit, got.peak
    assert len(alone) > 40 and 0 < fit.sum() < len(fit)   # both verdicts occur
    assert [(bool(f), float(p)) for f, p in zip(fit, peak)] == [(bool(a.may_fit[0]), float(a.peak[0])) for a in alone]
    assert (zero_fit == np.array([a.zero_fit[0] for a in alone])).all() and (fit == zero_fit.any(axis=1)).all()
    # some family may fit under one ZeRO stage and not another: the search expands only those
    assert (zero_fit.any(axis=1) & ~zero_fit.all(axis=1)).any()
    # the search's own run bounds the peak of the families that may fit, the others on demand
    again = FamilyScreen(model, MIXED, (0, 1, 3), False)
    for base, block, names in added:
        again.add(base, time_key(base), base.pp, base.dp, base.num_microbatches, block, 1, names)
    got2 = again.run()
    fit2, peak2 = got2.may_fit, got2.peak
    unfit = np.flatnonzero(~fit2)
    assert (fit2 == fit).all() and (peak2[fit] == peak[fit]).all() and np.isnan(peak2[unfit]).all()
    assert (again.peaks(unfit) == peak[unfit]).all()
    # a screen with the memory model's margin gives the verdict without it too (the search's
    # TIGHT phase): what a screen without the margin gives, and never less than with it
    margin = FamilyScreen(model, MIXED, (0, 1, 3), False, with_margin=True)
    for base, block, names in added:
        margin.add(base, time_key(base), base.pp, base.dp, base.num_microbatches, block, 1, names)
    got = margin.run(every_peak=True)
    assert (got.tight_zero_fit == zero_fit).all() and (got.zero_fit <= got.tight_zero_fit).all()
    assert (got.zero_fit < got.tight_zero_fit).any() and (got.peak == peak).all()


def test_a_ranks_memory_is_its_own():
    """fits_exactly shares a rank's verdict among block candidates that differ only in the
    other ranks' layers and GPUs: a rank's memory (even chunks) does not change with them, and
    does change with its own layers."""
    model = load_model_ref("deepseek-v3")
    base = Strategy(tp=4, pp=8, dp=2, ep=8, etp=1, micro_batch_size=1, global_batch_size=256, seq_length=4096,
                    recompute="full", recompute_num_layers=2, sequence_parallel=True, zero_stage=1,
                    overlap_grad_reduce=True)
    gpu = load_bundled_profile("h100-sxm-80g")
    splits = (((8, 8, 8, 8, 8, 8, 8, 5), None), ((8, 10, 6, 8, 6, 8, 8, 7), ("h100",) * 8),
              ((8, 6, 10, 8, 10, 6, 6, 7), ("h100",) * 4 + ("a100",) * 4))
    for rank in (0, 3):
        seen = set()
        for split, groups in splits:
            s = replace(base, layers_per_stage=split, stage_node_groups=groups)
            m = stage_memory(model, s, placement_of(s), rank, gpu)
            seen.add((m.total, m.activations, m.buffers, m.parameters))
        assert len(seen) == 1
    own = replace(base, layers_per_stage=(8, 8, 8, 10, 6, 8, 8, 5))
    assert stage_memory(model, own, placement_of(own), 3, gpu).total > next(iter(seen))[0]


@pytest.mark.parametrize("model", [MODEL, MOE_DENSE_FIRST], ids=["dense", "dense-first-moe"])
def test_candidate_screen_shares_its_terms_across_a_search(model):
    """The search hands memory_screen one RoomTerms for all its candidates: candidates that
    differ in depth, data-parallel size, micro-batch, recompute, ZeRO stage, vpp, stage
    placement and split screen exactly as with a fresh cache, whatever was screened before."""
    terms, checked = RoomTerms(model, MIXED), 0
    for pp, dp, mbs, recompute, zero in [(4, 2, 1, "none", 1), (2, 4, 1, "none", 1), (4, 2, 2, "none", 1),
                                         (4, 2, 1, "full", 1), (4, 2, 1, "none", 3), (4, 1, 1, "none", 0),
                                         (1, 8, 1, "selective", 1), (2, 4, 2, "full", 3)]:
        base = Strategy(tp=1, pp=pp, dp=dp, micro_batch_size=mbs, global_batch_size=16, seq_length=2048,
                        recompute=recompute, overlap_grad_reduce=True, zero_stage=zero,
                        overlap_param_gather=zero >= 1)
        layouts = stage_layouts(MIXED, base.gpus_per_stage, base.pp, GpuBudget())
        for orders in layouts.values():
            for groups in orders:
                for vpp in (1, 2):
                    for split in (None, (1, 1, 1, 1) if model.num_layers == 4 and pp == 4 else None):
                        s = base.with_(vpp=vpp, stage_node_groups=groups)
                        if split is not None and vpp == 1:
                            s = with_split(s, split)
                        try:
                            check_structure(s, model)
                        except InvalidStrategy:
                            continue
                        for margin in (False, True):
                            assert (memory_screen(model, MIXED, s, terms=terms, with_margin=margin)
                                    == memory_screen(model, MIXED, s, with_margin=margin)), s
                        checked += 1
    assert checked >= 20


def test_a_sequence_past_the_models_positions_is_a_named_warning():
    """A RoPE model planned beyond max_position_embeddings is searched (Megatron runs it with
    --max-position-embeddings raised), with a warning naming both lengths and rope scaling."""
    short = replace(MODEL, max_position_embeddings=1024)
    r = search(short, HOMOGENEOUS, OPTIONS)
    assert r.plans
    assert any("2048" in w and "1024" in w and "rope scaling" in w for w in r.warnings), r.warnings
    assert not any("max_position_embeddings" in w for w in search(MODEL, HOMOGENEOUS, OPTIONS).warnings)


def _outcome(r):
    """Everything a search returns that must not depend on how many processes ran it."""
    return ([e.strategy for e in r.plans], [e.step_time_s for e in r.plans], [f.point for f in r.plan_figures],
            r.fastest_tight.strategy if r.fastest_tight else None, r.tight_listed, r.status, r.optimality_gap,
            r.candidates, r.pruned_memory, r.pruned_bound, r.pruned_dominated, r.priced, r.invalid,
            sorted(r.warnings), r.idle_groups)


@pytest.mark.parametrize("model,cluster", [(MODEL, MIXED), (MOE_DENSE_FIRST, MIXED), (MODEL, HOMOGENEOUS)],
                         ids=["dense", "dense-first-moe", "h100"])
def test_a_group_bound_is_under_every_family_of_the_group(model, cluster):
    """The search takes family groups in the order of Families.group_bound (group_order.py):
    without and with the whole-layer term it is at most the bound each family of the group is
    queued under (Families.queue_bound) and its own (Families.own_bound), which the brute-force
    tests hold under every candidate's estimate; and the whole-layer term only raises it."""
    from planner.search.bounds import Bounds
    from planner.search.families import Families

    o = replace(OPTIONS, allow_tight=False)
    families = Families(model, cluster, o, Bounds(model, cluster, o.uneven_chunks), True)
    checked = 0
    for g in families.groups():
        loose, whole = families.group_bound(g), families.group_bound(g, whole=True)
        assert loose <= whole
        for j in range(len(g.specs.kinds)):
            spec = g.specs.spec(j)
            assert whole <= families.queue_bound(spec, {}) <= families.own_bound(spec)
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("model,cluster,options", [
    (MODEL, HOMOGENEOUS, replace(OPTIONS, top=3, allow_tight=False)),
    (MODEL, MIXED, replace(OPTIONS, top=3, allow_tight=False)),
    (MODEL, TWO_SITE, replace(OPTIONS, top=4, allow_tight=False, keep_dominated=True)),
    (MODEL, PRICED_MIXED, replace(OPTIONS, top=3, allow_tight=False, objective="cost")),
    (MODEL, H100_ALONE, replace(OPTIONS, top=5, allow_tight=False)),
    (MODEL, H100_ALONE, replace(OPTIONS, top=8, allow_tight=False)),
    (MOE_DENSE_FIRST, MIXED, replace(OPTIONS, top=3, allow_tight=False, zero_stages=(1,), partial_recompute=False)),
    (MODEL, MIXED, replace(OPTIONS, top=3, uneven_chunks=True)),
], ids=["h100", "h100+a100", "two-site-all", "cost", "one-node-top5", "one-node-top8", "moe-dense-first",
     "allow-tight-uneven"])
def test_parallel_search_returns_what_the_serial_one_does(model, cluster, options, monkeypatch):
    """jobs 2 (a second process prices candidates ahead of the search, and in a big space bounds
    half of the family groups first) returns the same top K, the same TIGHT plan beside them and the
    same counts as jobs 1, on the brute-force cases above; so does a parallel search whose
    second process dies at once, or at its first candidate (the search then does the work
    itself)."""
    import planner.search.best_first as P
    import planner.search.families as F
    import planner.search.group_order as G
    import planner.search.helper as H

    monkeypatch.setattr(P, "HELPER_AFTER_S", 0.0)   # these searches are short: a helper all the same
    started = []
    start = H.Helper.start
    monkeypatch.setattr(H.Helper, "start", classmethod(lambda cls, *a: started.append(start(*a)) or started[-1]))
    serial = _outcome(search(model, cluster, replace(options, jobs=1)))
    assert not started
    assert _outcome(search(model, cluster, replace(options, jobs=2))) == serial
    assert len(started) == 1 and started[0] is not None and started[0].task_result is None
    # the group bounds split with the helper (every space counts as big here)
    monkeypatch.setattr(F, "SPLIT_FAMILIES", 0)
    assert _outcome(search(model, cluster, replace(options, jobs=2))) == serial
    assert len(started) == 2 and started[1].task_result is not None
    main = H.helper_main
    for broken in (_helper_dies_at_once, _helper_dies_at_its_first_candidate, _helper_fails_its_task(main)):
        monkeypatch.setattr(H, "helper_main", broken)
        assert _outcome(search(model, cluster, replace(options, jobs=2))) == serial
    # batches of 4 groups: the helper takes part 1's half of many ahead of the search; one that
    # dies after its first leaves the search to take the rest (replaying the ones it took)
    monkeypatch.setattr(G, "GROUPS_PER_BATCH", 4)
    small = _outcome(search(model, cluster, replace(options, jobs=1)))
    assert small[:3] == serial[:3]   # the same plans, whatever the batches
    for helper in (main, _helper_dies_after_its_first_answer(main)):
        monkeypatch.setattr(H, "helper_main", helper)
        assert _outcome(search(model, cluster, replace(options, jobs=2))) == small
    monkeypatch.setattr(G, "GROUPS_PER_BATCH", 2048)
    monkeypatch.setattr(F, "SPLIT_FAMILIES", 10 ** 9)
    for broken in (_helper_dies_at_once, _helper_dies_at_its_first_candidate):
        monkeypatch.setattr(H, "helper_main", broken)
        assert _outcome(search(model, cluster, replace(options, jobs=2))) == serial


def _helper_dies_after_its_first_answer(main):
    """A helper that stops (its pipe closed) once it has sent its first answer to a request."""
    class Conn:
        def __init__(self, conn):
            self.conn = conn

        def send(self, msg):
            self.conn.send(msg)
            if msg[0] == "answer":
                self.conn.close()
                raise EOFError

        def recv(self):
            return self.conn.recv()

        def close(self):
            self.conn.close()

    def broken(conn, *args):
        main(Conn(conn), *args)
    return broken


def _helper_fails_its_task(main):
    """A helper whose first task raises (the search bounds that part itself)."""
    def broken(conn, model, cluster, o, task=None):
        main(conn, model, cluster, o, (_raise, ()) if task is not None else None)
    return broken


def _raise():
    raise RuntimeError("task failed")


def _helper_dies_at_once(conn, *args):
    conn.close()


def _helper_dies_at_its_first_candidate(conn, *args):
    conn.send(("ready", None))
    conn.recv()
    conn.close()


def test_the_parallel_cases_reach_every_path():
    """The cases above are not vacuous: on one node a TIGHT plan is faster than #1 and closes a
    list of 5 (four plans fit with margin), and a list of 8 needs more than one TIGHT plan."""
    five = search(MODEL, H100_ALONE, replace(OPTIONS, top=5, allow_tight=False, jobs=2))
    assert five.fastest_tight is not None and five.tight_listed == 1 and len(five.plans) == 5
    eight = search(MODEL, H100_ALONE, replace(OPTIONS, top=8, allow_tight=False, jobs=2))
    assert 8 - (len(eight.plans) - eight.tight_listed) > 1   # fewer than 7 fit with margin


def _helper_offered_two(o):
    """A helper process past its start, offered two candidates the search priced (bounds 1 and
    2), and those candidates."""
    from planner.search.helper import Helper

    cands = [e.strategy for e in search(MODEL, MIXED, replace(o, jobs=1)).priced_estimates[:2]]
    helper = Helper.start(MODEL, MIXED, o)
    while not helper.ready:
        helper.receive(True)
    for tie, s in enumerate(cands):
        helper.offer(1.0 + tie, tie, s)
    return helper, cands


def test_the_helper_prices_a_candidate_as_the_search_does():
    """The helper process (jobs >= 2) prices a candidate it is handed exactly as the search
    would itself (pricing.priced_apart): the same estimates, and the same counts and warnings
    for the search's result."""
    from planner.search.pricing import priced_apart

    o = replace(OPTIONS, top=3, jobs=2)
    helper, cands = _helper_offered_two(o)
    try:
        helper.feed(float("inf"), 0.0)   # the search's own next entry is elsewhere: the helper takes the first
        assert helper.in_hand == cands[0]
        fitting, short, effects = helper.take(cands[0])
        assert helper.taken == 1 and helper.take(cands[1]) is None   # never handed: the search prices it
    finally:
        helper.close()
    here_fitting, here_short, here_effects = priced_apart(MODEL, MIXED, cands[0], o.uneven_chunks, not o.allow_tight)
    assert [(e.strategy, e.step_time_s, e.peak_memory.total) for e in fitting] == \
        [(e.strategy, e.step_time_s, e.peak_memory.total) for e in here_fitting]
    assert (short is None) == (here_short is None)
    assert (effects.priced, effects.invalid, effects.solver, effects.optimality_gap, effects.warnings) == \
        (here_effects.priced, here_effects.invalid, here_effects.solver, here_effects.optimality_gap,
         here_effects.warnings)


def test_the_search_prices_the_next_candidate_while_the_helper_prices_one():
    """The helper is never handed the search's own next entry (it would wait for it idle), and
    while it prices a candidate the search needs, the search prices the next one pending itself
    (Helper.take's `price`): each result is then taken as priced_apart gives it."""
    from planner.search.pricing import priced_apart

    o = replace(OPTIONS, top=3, jobs=2)

    def price(x):
        here.append(x)
        return priced_apart(MODEL, MIXED, x, o.uneven_chunks, not o.allow_tight)

    here: list = []
    helper, cands = _helper_offered_two(o)
    try:
        helper.feed(float("inf"), 1.0)    # cands[0] is the search's next entry: the helper takes cands[1]
        assert helper.in_hand == cands[1]
        got = [helper.take(cands[1], price), helper.take(cands[0], price)]
        assert here == [cands[0]] and helper.taken == 2
    finally:
        helper.close()
    for s, (fitting, short, _) in zip((cands[1], cands[0]), got):
        want, want_short, _ = priced_apart(MODEL, MIXED, s, o.uneven_chunks, not o.allow_tight)
        assert [(e.strategy, e.step_time_s) for e in fitting] == [(e.strategy, e.step_time_s) for e in want]
        assert (short is None) == (want_short is None)


def test_a_sweep_in_a_pool_runs_its_searches_serial_with_the_same_plans(monkeypatch):
    """planner sweep runs one search per process; with a pool of several its searches run
    serial (no pool inside a pool), with one process the one search may use the jobs, and the
    best plans and counts are the same either way."""
    import planner.search.sweep as S

    options = S.sweep_options([HOMOGENEOUS, MIXED], None, {})
    o = replace(OPTIONS, allow_tight=False)
    monkeypatch.setattr(S, "run_one", _sweep_search_noting_its_jobs)
    pooled = S.run_sweep(MODEL, options, o, jobs=2)
    here = S.run_sweep(MODEL, options, o, jobs=1)
    alone = S.run_sweep(MODEL, options[:1], o, jobs=2)
    assert [x.status for x in pooled + here + alone] == ["jobs 1"] * 4 + ["jobs 2"]
    assert [(x.plan.strategy, x.candidates) for x in pooled] == [(x.plan.strategy, x.candidates) for x in here]
    assert alone[0].plan.strategy == here[0].plan.strategy


def _sweep_search_noting_its_jobs(args):
    """sweep.run_one with its outcome's status replaced by the jobs its search was given."""
    got = run_one(args)
    got.status = f"jobs {args[2].jobs}"
    return got


def test_a_parallel_search_stopped_by_its_time_limit_ends_as_the_serial_one(monkeypatch):
    """With the time limit spent before its families are queued, a search (serial or parallel)
    runs no TIGHT phase and ends at the limit as the serial one does."""
    import itertools as it

    import planner.search.best_first as P

    for jobs in (1, 2):
        clock = it.count()
        monkeypatch.setattr(P.time, "perf_counter", lambda: next(clock) * 0.001)
        r = search(MODEL, MIXED, replace(OPTIONS, allow_tight=False, time_limit_s=0.001, jobs=jobs))
        assert r.status == "time-limit" and not any("TIGHT" in w for w in r.warnings), jobs
        _assert_counts_add_up(r)


def test_a_search_shorter_than_a_helper_is_worth_runs_without_one(monkeypatch):
    """With o.jobs >= 2 the helper starts only once queueing the families took HELPER_AFTER_S
    (a shorter search ends before a second process pays for itself): the same plans either way."""
    import planner.search.best_first as P
    import planner.search.helper as H

    started = []
    monkeypatch.setattr(H.Helper, "start", classmethod(lambda cls, *a: started.append(a) or None))
    o = replace(OPTIONS, top=3, allow_tight=False, jobs=2)
    quick = _outcome(search(MODEL, MIXED, o))
    assert started == []
    monkeypatch.setattr(P, "HELPER_AFTER_S", 0.0)
    assert _outcome(search(MODEL, MIXED, o)) == quick and len(started) == 1


def test_split_group_bounds_name_the_same_closest_plan_when_nothing_fits(monkeypatch):
    """When no plan fits, the closest miss comes from the families nearest to fitting: with
    the group bounds split with the helper and the groups screened batch by batch, every family
    is screened again for it, and it is the serial search's (Llama 3 70B on one 8-GPU node)."""
    import planner.search.families as F

    one = cluster_from_dict({"name": "h100-1x8", "node_groups": [
        {"name": "h100", "nodes": 1, "gpus_per_node": 8, "gpu": "h100-sxm-80g", "nics_per_node": 8,
         "nic_bandwidth": "400 Gb/s"}]}, "test")
    m = load_model_ref("llama3-70b")
    o = SearchOptions(global_batch_size=16, seq_length=2048, top=1)
    serial = search(m, one, o)
    assert serial.plans == [] and serial.closest is not None
    monkeypatch.setattr(F, "SPLIT_FAMILIES", 0)
    split = search(m, one, replace(o, jobs=2))
    assert split.closest.strategy == serial.closest.strategy and _outcome(split) == _outcome(serial)


@pytest.mark.parametrize("top", [6, 8])
def test_tight_plans_close_a_short_list_as_brute_force_ranks_them(top):
    """When fewer than K plans fit with margin (one 4-GPU node), the list closes with the best
    TIGHT plans of the space that no plan of the space dominates (one that fits with margin
    included), by step time; the TIGHT phase finds them as brute force does."""
    o = replace(OPTIONS, top=top, allow_tight=False)
    _, _, _, fitting = _brute_force(MODEL, H100_ALONE, o)
    plans = _plans_of_space(fitting)
    front = set(_front([_point(e) for e in plans]))
    safe = _front([_point(e) for e in plans if e.memory_verdict == "fits"])
    tight = sorted({_point(e) for e in plans if e.memory_verdict == "tight" and _point(e) in front})
    n_tight = len({_point(e) for e in plans if e.memory_verdict == "tight"})
    assert len(safe) < top and n_tight > len(tight) >= 1   # some TIGHT plans are dominated
    r = search(MODEL, H100_ALONE, o)
    n_safe = len(r.plans) - r.tight_listed
    assert _flat(_point(e) for e in r.plans[:n_safe]) == pytest.approx(_flat(safe), rel=1e-9)
    assert _flat(_point(e) for e in r.plans[n_safe:]) == pytest.approx(_flat(tight[:top - n_safe]), rel=1e-9)


def test_safe_by_default_under_the_cost_objective_names_the_cheapest_tight_plan():
    """Safe by default under --objective cost: the top K are the cheapest plans that fit with
    margin (of their front), and the TIGHT plan named beside them is the cheapest TIGHT plan of
    the space when it costs less than #1, against brute force."""
    o = replace(OPTIONS, top=3, allow_tight=False, objective="cost")
    _, _, _, fitting = _brute_force(MODEL, MIXED, o)
    plans = _plans_of_space(fitting)
    safe = [_point(e) + (_usd_per_step(e),) for e in plans if e.memory_verdict == "fits"]
    by_cost = sorted(_front(safe), key=lambda p: (p[3],) + p[:3])
    r = search(MODEL, PRICED_MIXED, o)
    assert all(e.memory_verdict == "fits" for e in r.plans)
    assert _flat(_point(e) + (_usd_per_step(e),) for e in r.plans) == pytest.approx(_flat(by_cost[:3]), rel=1e-9)
    cheapest_tight = min(_usd_per_step(e) for e in plans if e.memory_verdict == "tight")
    assert cheapest_tight < _usd_per_step(r.plans[0])   # here a TIGHT plan is cheaper than #1
    assert _usd_per_step(r.fastest_tight) == pytest.approx(cheapest_tight, rel=1e-9)
