"""The after-step term of a candidate's bound, stage by stage and layer count by layer count.

After the pipeline drains, estimate charges every stage its per-step DP collectives that its
last micro-batch's backward (parameter gathers: its first forward) does not hide, its optimizer
step and the tied embedding's all-reduce, and the step pays the largest over stages
(estimate.py; cost/parallel.py dp_cost, dp_step_exposed_s). Where a stage's DP traffic outlasts
its backward (expert gradients of a slow GPU behind a slow NIC), that term grows with the
stage's layers by more than its pipeline time does, so a bound that counts one layer's share
of it (Bounds.after_step) is far below the price. Here:

- `AfterStepRows.stage_after`: a stage's after-step seconds for arrays of (dense, MoE) layer
  counts, as estimate prices it: the same cost functions estimate calls (kind_pass_s and
  stage_ends_s for the backward that hides the traffic, layer_count_params for the bytes,
  dp_collectives / collective_time / dp_step_exposed_s, optimizer_time, tied_embedding_cost).
  The partition takes it for every stage interval (split.after_matrix), so that the split
  minimises the step;
- `AfterStepRows.rows`: for each stage of a candidate and each layer count n, the least of it
  over every mix of dense and MoE layers n can hold;
- `joint_bound`: the least (pipeline bound + after-step) over every layer split. A split whose
  largest after-step is at most a keeps each stage's count at most its largest count with an
  after-step <= a, so its pipeline is no faster than the pipeline bound under those caps; the
  least over a of (that bound + a) is a bound on every split, found by branch and bound over
  the values a can take.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import numpy as np

from ..cost import compute as C
from ..cost.comm import collective_time_affine
from ..cost.memory import layer_count_params, one_layer_params
from ..cost.parallel import dp_collectives, dp_step_exposed_s, moe_alone_share, tied_embedding_cost
from ..estimate import kind_pass_s, layer_time_of, stage_ends_s
from ..placement import placement_of
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy

# Mixes of dense and MoE layers a stage of n layers is priced at, at most: beyond it (models
# with many of both kinds) the bytes of the lighter kind and the backward of the heavier one
# bound every mix from below.
_MIXES_MAX = 16
# Pipeline bounds evaluated per candidate by joint_bound's branch and bound before it settles
# for the least bound of the intervals left (still a bound; most end proven before this).
_JOINT_EVALS_MAX = 24
# Strategies whose rows and stage terms are kept (one per candidate bounded or priced) before
# the caches start again.
_KEPT = 4096


class AfterStepRows:
    """Per-stage after-step lower bounds of a model on a cluster, cached by stage kind."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec):
        self.model, self.cluster = model, cluster
        self.n_kind = {False: model.num_dense_layers, True: model.num_moe_layers}
        self._rows: dict = {}
        self._tied: dict = {}
        self._terms_of: dict = {}

    def rows(self, s: Strategy, tk: Strategy, groups: tuple[str, ...]) -> np.ndarray:
        """[p, L + 1]: row i, column n, the least after-step seconds of stage i (on node group
        groups[i]) holding n layers (inf for n = 0)."""
        base = _base(s)
        p = s.pp
        kept = self._rows.get(base)
        if kept is None:
            if len(self._rows) >= _KEPT:
                self._rows.clear()
            kept = self._rows[base] = {}
        out = np.empty((p, self.model.num_layers + 1))
        for i, g in enumerate(groups):
            # rows differ by group, by end (embedding, output layer) and by the EP-overlap
            # schedule's warm-up share, which moves the backward the traffic hides under
            share = moe_alone_share(s, i)
            key = (g, i == 0, i == p - 1, share)
            row = kept.get(key)
            if row is None:
                row = kept[key] = self._row(s, tk, i, g, share)
            out[i] = row
        tied = self._tied_s(base, groups)
        out[0] += tied[0]
        out[p - 1] += tied[1] if p > 1 else 0.0
        return out

    def _tied_s(self, base: Strategy, groups: tuple[str, ...]) -> tuple[float, float]:
        """The tied embedding's all-reduce on the first and the last stage (estimate's
        tied_embedding_cost), which depends on the groups of both."""
        key = (base, groups[0], groups[-1])
        got = self._tied.get(key)
        if got is None:
            p = base.pp
            cl = self.cluster
            ends = {0: [cl.group(groups[0])], p - 1: [cl.group(groups[-1])]}
            stage_groups = [ends.get(i, ends[0]) for i in range(p)]
            got = self._tied[key] = tuple(
                tied_embedding_cost(self.model, base, stage_groups, i, stage_groups[i][0], cl).after_step_s
                for i in (0, p - 1))
        return got

    def _mixes(self, n: np.ndarray):
        """(counts by kind, valid) for every mix of dense and MoE layers a stage of n layers may
        hold (k of the rarer kind, n - k of the other), or None when there are too many mixes
        (then the two kinds are bounded below together)."""
        rare = min(self.n_kind, key=self.n_kind.get)
        if self.n_kind[rare] + 1 > _MIXES_MAX:
            yield None, None
            return
        other = not rare
        for k in range(min(self.n_kind[rare], len(n) - 1) + 1):
            rest = n - k
            yield {rare: np.full_like(n, k), other: np.maximum(rest, 0)}, (rest >= 0) & (rest <= self.n_kind[other])

    def stage_after(self, s: Strategy, tk: Strategy, groups: tuple[str, ...], i: int, counts: dict) -> np.ndarray:
        """Stage i's after-step seconds (on node group groups[i]) holding counts[moe] layers of
        each kind (arrays of one shape), as estimate prices it: its DP collectives, optimizer
        step and, on an end, the tied embedding's all-reduce. Without an offloaded optimizer
        (whose host share this leaves out: then a lower bound)."""
        base = _base(s)
        terms = self._terms_of_stage(base, s, tk, i, groups[i], moe_alone_share(s, i))
        n = sum(counts.get(moe, 0) for moe in (False, True))
        tied = self._tied_s(base, groups)
        end = (tied[0] if i == 0 else 0.0) + (tied[1] if i == s.pp - 1 and s.pp > 1 else 0.0)
        return self._after(terms, {moe: counts.get(moe, 0) for moe in self.model.layer_kinds}, False, n) + end

    def _terms_of_stage(self, base: Strategy, s: Strategy, tk: Strategy, i: int, group_name: str,
                        share: float) -> dict:
        """_terms, kept by what they depend on (a few per candidate; a bound on how many)."""
        key = (base, group_name, i == 0, i == s.pp - 1, share)
        terms = self._terms_of.get(key)
        if terms is None:
            if len(self._terms_of) >= _KEPT:
                self._terms_of.clear()
            terms = self._terms_of[key] = self._terms(s, tk, i, group_name, share)
        return terms

    def _row(self, s: Strategy, tk: Strategy, i: int, group_name: str, share: float) -> np.ndarray:
        terms = self._terms_of_stage(_base(s), s, tk, i, group_name, share)
        n = np.arange(self.model.num_layers + 1)
        best = np.full(len(n), np.inf)
        for counts, ok in self._mixes(n):
            bounded = counts is None   # many of both kinds: the lighter bytes, the longer backward
            if bounded:
                counts, ok = {moe: n for moe in self.model.layer_kinds}, np.ones(len(n), dtype=bool)
            a = self._after(terms, counts, bounded, n)
            best = np.where(ok & (n > 0), np.minimum(best, a), best)
        return best

    def _terms(self, s: Strategy, tk: Strategy, i: int, group_name: str, share: float) -> dict:
        """What stage i's after-step depends on besides its layer counts: per layer of each kind
        its (forward, backward) seconds per micro-batch and parameters, the same for its ends,
        the placement and its DP collectives on the stage's group."""
        model = self.model
        g = self.cluster.group(group_name)
        kinds = model.layer_kinds
        placement = placement_of(s)
        return {"s": s, "gpu": g.gpu, "placement": placement,
                "pace": {moe: kind_pass_s(layer_time_of(model, tk, g.gpu, moe), s, moe, 1, 0, share) for moe in kinds},
                "params": {moe: one_layer_params(model, moe) for moe in kinds},
                "ends": stage_ends_s(model, s, i, g.gpu, tk),
                "end_params": layer_count_params(model, s, 0, 0, i == 0, i == s.pp - 1),
                "collectives": [c for c in dp_collectives(s, placement, [g], self.cluster)
                                if c.collective.when == "per-step"]}

    @staticmethod
    def _after(terms: dict, counts: dict, bounded: bool, n):
        """The after-step seconds of a stage holding counts[moe] layers of each kind, as estimate
        computes it (vectorised over the counts; n their sum). `bounded`: counts are n of
        every kind and each term takes its least favourable kind per layer (a bound on every
        mix)."""
        def kind_sum(per_kind: dict, end, most: bool):
            vals = [counts[moe] * x for moe, x in per_kind.items()]
            if not bounded:
                return sum(vals) + end
            return (np.maximum if most else np.minimum).reduce(vals) + end

        s, placement, ends, end_params = terms["s"], terms["placement"], terms["ends"], terms["end_params"]
        fwd = kind_sum({moe: x[0] for moe, x in terms["pace"].items()}, ends[0], True)
        bwd = kind_sum({moe: x[1] for moe, x in terms["pace"].items()}, ends[1], True)
        comm = {"gradients": 0.0, "parameters": 0.0}
        for c in terms["collectives"]:
            dc = c.collective
            factor = placement.model_shard_factor(dc.group) * c.bytes_per_param
            per_layer = {moe: getattr(x, dc.group) * factor for moe, x in terms["params"].items()}
            msg = kind_sum(per_layer, getattr(end_params, dc.group) * factor, False)
            comm[dc.tensor] = comm[dc.tensor] + _collective_s(dc.kind, msg, c.ranks, c.link)
        layers = np.maximum(n, 1)
        after = (dp_step_exposed_s(comm["gradients"], bwd, layers, s.overlap_grad_reduce)
                 + dp_step_exposed_s(comm["parameters"], fwd, layers, s.overlap_param_gather))
        if s.offload_optimizer:
            return after   # the host's share of the step is not bounded here

        def shard(x) -> float:
            return sum(getattr(x, k) * placement.shard_factor("optimizer", k) for k in ("dense", "norms", "experts"))

        opt_params = kind_sum({moe: shard(x) for moe, x in terms["params"].items()}, shard(end_params), False)
        return after + C.optimizer_time(opt_params, terms["gpu"], C.adam_step_bytes_per_param(s))


def _base(s: Strategy) -> Strategy:
    """s without its stage order and split (which the rows do not depend on)."""
    return replace(s, stage_node_groups=None, layers_per_stage=None, chunk_layers=None)


def _collective_s(kind: str, message_bytes: np.ndarray, n: int, link) -> np.ndarray:
    """collective_time over an array of message sizes (collective_time_affine), 0 for an empty
    message."""
    message_bytes = np.asarray(message_bytes, dtype=float)
    x = float(message_bytes.max()) if message_bytes.size and message_bytes.max() > 0 else 1.0
    per_byte, fixed = collective_time_affine(kind, n, link, x)
    return np.where(message_bytes > 0, fixed + per_byte * message_bytes, 0.0)


def joint_bound(rows: np.ndarray, counts_ok: np.ndarray, pipe) -> float:
    """The least over every split of (pipeline bound + the largest stage's after-step).

    rows[i, n]: stage i's least after-step holding n layers (AfterStepRows.rows); counts_ok[i,
    n]: whether stage i can hold n layers (whole blocks, memory); pipe(caps): the pipeline
    bound with stage i holding at most caps[i] layers (non-increasing as caps grow). For a the
    largest after-step of a split, every stage's count is at most cap_i(a) = max{n : rows[i, n]
    <= a}, so the split costs >= pipe(cap(a)) + a; over the values a takes (rows' entries) the
    least of that is the bound. Branch and bound over them in increasing order: on an interval
    [a_lo, a_hi] no value beats pipe(cap(a_hi)) + a_lo."""
    A = np.where(counts_ok, rows, np.inf)
    least = A.min(axis=1)
    a_min = float(least.max())
    if not np.isfinite(a_min):
        return float("inf")
    values = np.unique(A[np.isfinite(A) & (A >= a_min)])
    cols = np.arange(A.shape[1])
    piped: dict = {}

    def pipe_at(k: int) -> float:
        got = piped.get(k)
        if got is None:
            under = A <= values[k]
            caps = np.where(under.any(axis=1), np.where(under, cols, -1).max(axis=1), 0)
            got = piped[k] = pipe(caps.tolist())
        return got

    hi = len(values) - 1
    best = min(pipe_at(0) + values[0], pipe_at(hi) + values[hi])
    heap = [(pipe_at(hi) + values[0], 0, hi)]
    while heap and len(piped) < _JOINT_EVALS_MAX:
        lb, lo, hi = heapq.heappop(heap)
        if lb >= best:
            return float(best)
        if hi - lo <= 1 or pipe_at(lo) == pipe_at(hi):
            continue   # its least value is at an end, already counted
        mid = (lo + hi) // 2
        best = min(best, pipe_at(mid) + values[mid])
        for a, b in ((lo, mid), (mid, hi)):
            lb_ab = pipe_at(b) + values[a]
            if lb_ab < best:
                heapq.heappush(heap, (lb_ab, a, b))
    return float(min(best, heap[0][0])) if heap else float(best)
