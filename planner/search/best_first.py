"""The best-first search of `planner plan` (search): families of candidates (degrees x
micro-batch x recompute), in groups of one degrees and micro-batch taken in the order of a
bound none of their families beats (group_order.py), screened by memory a batch of groups at
a time and bounded over all their stage placements, then expanded best first, family -> cell
-> candidate -> priced plan, until the K-th best plan found is better than every bound left.

The queue holds (bound, tie, kind, payload) entries: the bound and a unique tie order them,
the kind says what the payload is (the groups not screened yet, a family, a cell, a candidate,
a candidate queued again with a higher bound, a block-recompute candidate, or entries set
aside as out of reach: entries.py).

Safe by default, the memory screens leave the memory model's margin; what they rule out that
may still fit within it (TIGHT) is set aside in a second queue and searched after the first,
for the TIGHT plans the result reports beside the plans that fit with margin (_take_tight)."""

from __future__ import annotations

import gc
import heapq
import itertools
import time
from dataclasses import replace

import numpy as np

from ..errors import InvalidStrategy, PlannerError
from ..estimate import Estimate, estimate
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy
from .bounds import Bounds
from .entries import (BLOCK, CAND, CELL, DEFERRED, FAMILY, GROUPS, REQUEUED, Cell, Child, Family, FamilySpec,
                      FamilySpecs, Pending, QueuedFamily, Requeued, child_strategy, entry_count, family_of)
from .families import Families
from .group_order import GroupOrder, group_bounds_half
from .helper import Helper
from .objective import check_objective, dominates, figures, objective_lb
from .pricing import add_effects, ilp_cross_check, priced_apart
from .results import Plans
from .rooms import FamilyRooms
from .screen import fits_exactly, least_block_recompute, memory_screen, stage_memories
from .space import PROGRESS_INTERVAL_S, SearchOptions, SearchProgress, SearchResult, warn
from .split import initial_split, with_split

# A screened candidate goes back in the queue only when its bound rose by more than rounding.
_REQUEUE_SLACK = 1e-9

# Seconds of queueing families after which a search with o.jobs >= 2 starts its helper process:
# forking it and handing it candidates cost about 0.1 s (Llama 3 70B on 128 nodes and a 1,000-layer
# model searched 0.1 s slower with it), a search that queues its families faster ends in ~1 s.
HELPER_AFTER_S = 0.5

# Queue entries (the top levels of the heap) among which an idle helper is offered candidates.
_AHEAD = 7
# ... and among which this process finds one to price while it waits for the helper's result.
_AHEAD_WAITING = 63

# Families ruled out by memory whose smallest candidate is tried for the closest-plan report.
_CLOSEST_FAMILIES = 32

def _closest_of(model, cluster, families: list, zeros) -> tuple | None:
    """(bytes short, strategy) of the family candidate closest to fitting: each family's first
    placement at vpp 1 under each ZeRO stage, on its starting split."""
    best = None
    for fam in families:
        orders = next(iter(fam.layouts.values()))
        for z in zeros:
            c, groups = child_strategy(fam, 1, z, orders[0], cluster)
            if fam.block:
                c = replace(c, recompute="full")
            valid, split = initial_split(model, cluster, c, groups, uneven=False)
            if not valid:
                continue
            c = with_split(c, split)
            short = max(m.total - m.capacity for m in stage_memories(model, cluster, c))
            if best is None or short < best[0]:
                best = (short, c)
    return best


def search(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, progress=None) -> SearchResult:
    """The top o.top plans of the space under the cost model, best first by o.objective: with
    o.keep_dominated the best distinct plans, else the best of those no plan of the space
    dominates; safe by default (not o.allow_tight), the plans that fit with the memory model's
    margin, with the fastest TIGHT plan when it beats #1 (and TIGHT plans closing a list that
    fewer than K plans fit with margin). `progress`, if given, is called with a SearchProgress
    every PROGRESS_INTERVAL_S seconds. With o.jobs >= 2 a second process (search/helper.py)
    prices candidates ahead of the search: the same plans and counts as o.jobs 1."""
    # The search keeps 10^5-10^6 small tuples alive (families, queue entries, cache keys), and
    # every cyclic garbage collection walks them all: 30% of DeepSeek-V3's search on mixed-512
    # (14.5 s -> 10.3 s without it, measured side by side). It makes no reference cycles that
    # must be freed while it runs, so collection waits until it returns.
    was_enabled = gc.isenabled()
    gc.disable()
    first = _BestFirst(model, cluster, o, progress)
    try:
        return first.run()
    finally:
        if first.helper is not None:
            first.helper.close()
        if was_enabled:
            gc.enable()


class _BestFirst:
    """One search: the queue, the plans found, the caches its steps share and the result it
    fills in. run() queues the families, takes entries best first, and finishes the result."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, progress):
        self.t0 = time.perf_counter()
        self.helper: Helper | None = None   # another process pricing candidates ahead (o.jobs >= 2)
        # safe by default: memory screens leave the memory model's margin, and what they rule
        # out that may fit within it is set aside in the TIGHT queue, searched after (_take_tight)
        self.with_margin = not o.allow_tight
        self.tight_heap: list | None = [] if self.with_margin else None
        self.tight_phase = False
        self.priced: set = set()     # candidates priced (the TIGHT phase does not price one again)
        if model.position_embedding_type == "learned_absolute" and o.seq_length > model.max_position_embeddings:
            raise PlannerError(f"--seq-length {o.seq_length} exceeds the learned position table of {model.name} "
                               f"(max_position_embeddings {model.max_position_embeddings}); no plan can run it")
        check_objective(cluster, o.objective, o.charge_idle)
        self.model, self.cluster, self.o, self.progress = model, cluster, o, progress
        self.res = SearchResult(plans=[], solver=o.solver, objective=o.objective)
        if o.seq_length > model.max_position_embeddings:
            # rotary models run any length, but past the one they were built for they need their
            # positions rescaled or long-context training: say so rather than emit it silently
            warn(self.res.warnings, f"--seq-length {o.seq_length} exceeds {model.name}'s max_position_embeddings "
                                     f"({model.max_position_embeddings}); launches set --max-position-embeddings "
                                     f"{o.seq_length}. Past its trained length a RoPE model needs rope scaling "
                                     "(--use-rope-scaling --rope-scaling-factor) or a long-context stage")
        self.bounds = Bounds(model, cluster, o.uneven_chunks)
        self.heap: list = []   # (objective bound, tie, kind, payload)
        self.tie = itertools.count()
        self.families = Families(model, cluster, o, self.bounds, self.with_margin)
        self.zero_opts = self.families.zero_opts
        self.plans = Plans(o)
        self.tokens_per_step = o.global_batch_size * o.seq_length
        self.priced_cluster = cluster.is_priced
        # the families (_queue_families): every spec, and those memory ruled out
        self.specs = FamilySpecs()
        # bounds of families (spec index ->) and of their floor classes (Families.queue_bound's key ->)
        self.family_lbs: dict = {}
        self.floor_lbs: dict = {}
        self.unfit = np.zeros(0, dtype=np.int64)
        self.groups: GroupOrder | None = None   # the family groups, screened batch by batch
        self.helper_takes = self.asked = False   # the helper takes part 1's half batches / was asked the next
        # what the entries taken best first share
        self.seen: set = set()
        self.rank_fits: dict = {}    # fits_exactly's verdicts per rank, shared by block candidates
        self.rooms = FamilyRooms(model, cluster, self.bounds)   # the memory caps of cells and candidates
        self.screened_out: list = []  # candidates (Child) the memory screens ruled out before any plan was found
        self.splits: dict = {}       # initial_split per time class, depth, vpp, stage order and evenness
        self.offered: set = set()    # ties of the queued candidates offered to the helper (_offer_ahead)
        self.closest = None
        self.done = 0
        self.last_report = self.t0

    def run(self) -> SearchResult:
        """The families queued, the entries taken best first (then the TIGHT ones), the result.
        With o.jobs >= 2, the helper process starts once the families are queued, if that took
        HELPER_AFTER_S (a search that short is over before a second process pays for itself),
        unless it started before to bound half of the groups (_queue_families)."""
        self._queue_families()
        if self.helper is None and self.o.jobs >= 2 and time.perf_counter() - self.t0 >= HELPER_AFTER_S:
            self.helper = Helper.start(self.model, self.cluster, self.o)
        self._take_best_first()
        if self.tight_heap is not None and self.res.status != "time-limit":
            self._take_tight()
        return self._finish()

    # ---- objective bounds and the queue --------------------------------------------------------

    def _kth(self) -> float:
        """No entry whose bound is above this can enter the result: the K-th best plan found;
        in the TIGHT phase, _tight_kth."""
        return self._tight_kth() if self.tight_phase else self.plans.kth()

    def _tight_kth(self) -> float:
        """No TIGHT plan above this changes the result: with K plans that fit with margin, the
        fastest TIGHT plan is reported only when it beats #1 (so only one better than both #1
        and the fastest TIGHT one found matters); with fewer, the TIGHT plans close the list
        (the one that would come last)."""
        plans, tight = self.plans, self.plans.tight
        need = plans.top - len(plans.items)
        if need <= 0:
            return min(plans.items[0][0], tight.items[0][0]) if tight.items else plans.items[0][0]
        return tight.items[need - 1][0] if len(tight.items) >= need else float("inf")

    def _spill(self, bound: float, kind: int, payload) -> None:
        """Set an entry aside for the TIGHT phase: what a screen with the memory model's margin
        ruled out, or bounded with the layers each stage holds with it, that may fit (faster)
        within it. Nothing is set aside in the TIGHT phase itself, nor when TIGHT plans are
        allowed (one search screens without the margin)."""
        if self._setting_aside():
            heapq.heappush(self.tight_heap, (bound, next(self.tie), kind, payload))

    def _setting_aside(self) -> bool:
        """Whether what the margin rules out is set aside for the TIGHT phase (the first phase
        of a search safe by default)."""
        return self.tight_heap is not None and not self.tight_phase

    def _objective_lb(self, step_lb: float, usd_h) -> float:
        """objective.objective_lb for this search."""
        return objective_lb(self.o.objective, step_lb, usd_h, self.tokens_per_step)

    def _usd_step(self, step_lb: float, usd_h) -> float:
        return usd_h * step_lb if self.priced_cluster and usd_h is not None else 0.0

    def _dominated(self, step_lb: float, gpus: int, usd_h, peak_lb) -> bool:
        """Whether a plan found dominates every plan of an entry (Plans.dominate)."""
        return self.plans.dominate(step_lb, gpus, self._usd_step(step_lb, usd_h), peak_lb)

    def _queue(self, items: list) -> None:
        """Queue each Pending item that can still enter the top K; keep the others as one
        deferred entry (the K-th best can rise, see Plans)."""
        kth = self._kth()
        deferred: list = []
        for it in items:
            if it.bound <= kth:
                heapq.heappush(self.heap, (it.bound, next(self.tie), it.kind, it.payload))
            else:
                deferred.append(it)
        if deferred:
            heapq.heappush(self.heap, (min(it.bound for it in deferred), next(self.tie), DEFERRED, deferred))

    # ---- 1. families -----------------------------------------------------------------------------

    def _queue_families(self) -> None:
        """Families: degrees x micro-batch x recompute, in groups of one degrees and micro-batch
        lined up by a bound none of their families beats (GroupOrder); the first batch of
        groups screened and queued (_queue_groups), the others under the bound of the next.
        With a big space and o.jobs >= 2 the helper process (started here) computes the bounds
        of the groups of part 1 (group_bounds_half) while this one computes part 0's, then
        takes part 1's half of each batch ahead of the search."""
        o, families = self.o, self.families
        if families.split():
            self.helper = Helper.start(self.model, self.cluster, o, (group_bounds_half,
                                                                     (self.model, self.cluster, o, 1)))
        self.groups = GroupOrder(families, self.specs, 0 if self.helper is not None else None)
        self.res.candidates = int(self.specs.candidates.sum())
        theirs = self.helper.first_result() if self.helper is not None else None
        self.groups.order(theirs)
        self.helper_takes = theirs is not None
        self._ask_ahead()
        self._queue_groups()

    def _ask_ahead(self) -> None:
        """Ask the helper for part 1's next half batch (GroupOrder.serve): it takes it meanwhile."""
        self.asked = self.helper_takes and self.groups.has_left(1) and self.helper.ask(1)

    def _queue_groups(self) -> None:
        """The next batch of groups (GroupOrder.take: each part's next half) screened by memory
        all at once (family_screen.py), those of their families that may fit queued under their
        bounds (_queue_screened), part 0's then part 1's (taken by the helper where it took
        them ahead: serial or not, the same batches in the same order, so the same ties); the
        groups left under the least bound of theirs (a GROUPS entry)."""
        mine = self.groups.take(0)
        if mine:
            self._queue_screened(*self.groups.screened(mine))
        got = self.helper.answer() if self.asked else None
        if self.asked and got is None:
            self.helper_takes = False   # it failed or died: part 1 taken here from now on
        if got is not None:
            theirs, screened, step_lb, bound, left = got
            self.groups.taken_there(1, theirs, bound, left)
            if theirs:
                self._queue_screened(screened, self.groups.index_of(theirs), step_lb)
        elif self.groups.has_left(1):
            theirs = self.groups.take(1)
            if theirs:
                self._queue_screened(*self.groups.screened(theirs))
        self._ask_ahead()
        if self.groups:
            heapq.heappush(self.heap, (self.groups.bound(), next(self.tie), GROUPS, self.groups.candidates_left()))

    def _family_lb(self, i: int, spec: FamilySpec) -> float:
        """The time bound of family i (a pure function of it, cached)."""
        lb = self.family_lbs.get(i)
        if lb is None:
            lb = self.family_lbs[i] = self.families.own_bound(spec)
        return lb

    def _queue_screened(self, screened, index: np.ndarray, step_lb: np.ndarray | None = None) -> None:
        """Queue the families screened (family index[k] in row k) that may fit, bounded over all
        their stage placements: under their own bound when it is known or their class
        recomputes nothing, else under their floor class's (Families.queue_bound, or step_lb[k]
        where the helper computed it; _expand_family computes their own when they are
        reached). Those that may fit only within the memory model's margin are set aside
        (_spill)."""
        specs, res = self.specs, self.res
        may_fit, peaks = screened.may_fit, screened.peak.tolist()
        entries = []
        # the ZeRO stages each family may fit under: bit k of its mask for zero_opts[k]
        zero_sets = [tuple(z for k, z in enumerate(self.zero_opts) if mask >> k & 1)
                     for mask in range(2 ** len(self.zero_opts))]
        bits = 1 << np.arange(len(self.zero_opts))
        masks = (screened.zero_fit * bits).sum(axis=1).tolist()
        tight = screened.tight_zero_fit
        # the ZeRO stages under which a family may fit only within the margin
        tight_masks = ((tight & ~screened.zero_fit) * bits).sum(axis=1).tolist() if tight is not None else None
        at = index.tolist()
        for k in np.flatnonzero(may_fit if tight is None else tight.any(axis=1)).tolist():
            i = at[k]
            spec = specs[i]
            lay = self.families.layouts[spec.lkey]
            exact = spec.floor is spec.cls
            lb = step_lb[k] if step_lb is not None else self.families.queue_bound(spec, self.floor_lbs)
            if exact:
                self.family_lbs[i] = lb
            bound = self._objective_lb(lb, lay.usd_min)
            if may_fit[k]:
                entries.append((bound, next(self.tie), FAMILY,
                                QueuedFamily(spec, lb, peaks[k], i, exact, zero_sets[masks[k]],
                                              zero_sets[tight_masks[k]] if tight_masks is not None else ())))
            else:
                self._spill(bound, FAMILY, QueuedFamily(spec, lb, peaks[k], i, exact, zero_sets[tight_masks[k]], ()))
        # one heapify for 10^5 families (the (bound, tie) keys are distinct: the pops come in the
        # order pushing them one by one gives)
        self.heap.extend(entries)
        heapq.heapify(self.heap)
        unfit = index[~may_fit]
        self.unfit = np.sort(np.concatenate((self.unfit, unfit)))
        res.pruned_memory += int(specs.candidates[unfit].sum())

    # ---- 2. best first ---------------------------------------------------------------------------

    def _take_best_first(self) -> None:
        """Families -> cells -> candidates -> priced plans, until the K-th best plan is better
        than every bound left (or the time limit)."""
        heap, helper = self.heap, self.helper
        while heap:
            lb, _, kind, payload = heap[0]
            if lb > self._kth():
                break
            now = time.perf_counter()
            if now - self.t0 > self.o.time_limit_s:
                self._stop_at_time_limit(lb)
                break
            if self.progress is not None and now - self.last_report >= PROGRESS_INTERVAL_S:
                self._report(now, lb)
            heapq.heappop(heap)
            c = self._reach(lb, kind, payload)
            if c is not None:
                self._price_and_offer(c)
            if helper is not None:
                if helper.idle():
                    self._offer_ahead(helper)
                helper.feed(self._kth(), heap[0][0] if heap else float("inf"))

    def _offer_ahead(self, helper: Helper, ahead: int = _AHEAD) -> None:
        """Offer the helper the candidates at the head of the queue (its first `ahead` entries,
        the top levels of the heap) on their starting split, as _reach_candidate will price
        them if memory and their bound let it: the helper prices one while this process reaches
        the entries before it (or prices another while it waits, Helper.take)."""
        for bound, tie, kind, child in self.heap[:ahead]:
            if kind == CAND and tie not in self.offered:
                self.offered.add(tie)
                helper.offer(bound, tie, self._on_start(child)[0])

    def _take_tight(self) -> None:
        """The TIGHT phase: the entries set aside (_spill) taken best first, screened without
        the margin, while they may hold a TIGHT plan that changes the result (_tight_kth). The
        first phase took every entry whose bound is below the K-th best plan that fits with
        margin, which is no less than _tight_kth, and set aside all it ruled out by the margin
        alone, so the TIGHT plans found are the best of the space. Its counts stay out of the
        result: they describe the space searched for plans that fit with margin."""
        res, heap, margin = self.res, self.heap, self.with_margin
        # its own counts, from the first's (the progress lines go on from there)
        self.res = SearchResult(plans=[], solver=res.solver, objective=res.objective, candidates=res.candidates,
                                priced=res.priced)
        self.heap, self.tight_phase, self.with_margin = self.tight_heap, True, False
        try:
            self._take_best_first()
        finally:
            tight_res = self.res
            self.res, self.heap, self.tight_phase, self.with_margin = res, heap, False, margin
        if tight_res.status == "time-limit":
            warn(res.warnings, "the search for TIGHT plans after them stopped at the time limit")

    def _stop_at_time_limit(self, lb: float) -> None:
        res = self.res
        res.status = "time-limit"
        # nothing left in the queue can beat its lowest bound: the optimum is >= min(top, lb)
        best = self.plans.best()
        res.optimality_gap = (max(res.optimality_gap, (best[0] - lb) / best[0] if best[0] > 0 else 0.0, 0.0)
                              if best else 1.0)
        warn(res.warnings, f"search stopped at its {self.o.time_limit_s:g} s time limit; "
                            f"the plans are the best of those priced")

    def _report(self, now: float, lb: float) -> None:
        self.last_report = now
        best = self.plans.best()
        res = self.res
        self.progress(SearchProgress(candidates=res.candidates, reached=self.done, priced=res.priced,
                                     best=best[0] if best else None,
                                     best_step_s=best[3].step_time_s if best else None,
                                     bound=lb, seconds=now - self.t0))

    def _reach(self, lb: float, kind: int, payload) -> Strategy | None:
        """Take one entry off the queue: expand it into entries, or screen it; the candidate
        to price, if it is one that may still enter the top K."""
        if kind == DEFERRED:
            # the K-th best rose since these were set aside: queue those that can now enter
            self._queue(payload)
            return None
        if kind == FAMILY:
            self._expand_family(lb, payload)
            return None
        if kind == GROUPS:
            self._queue_groups()
            return None
        if kind == CELL:
            self._expand_cell(lb, payload)
            return None
        if kind == REQUEUED:
            return self._reach_requeued(payload)
        fam = payload.family
        if self._dominated(payload.step_lb, fam.base.world_size, payload.usd_hour, fam.peak_lb):
            self.res.pruned_dominated += 1
            return None
        if kind == BLOCK:
            self._reach_block(lb, payload)
            return None
        return self._reach_candidate(lb, payload)

    def _expand_family(self, lb: float, entry: QueuedFamily) -> None:
        lay = self.families.layouts[entry.spec.lkey]
        if not entry.exact:
            # queued under its floor class's bound: its own may be higher
            own = self._family_lb(entry.index, entry.spec)
            entry = entry._replace(step_lb=own, exact=True)
            bound = self._objective_lb(own, lay.usd_min)
            if bound > lb * (1 + _REQUEUE_SLACK):
                self._queue([Pending(bound, FAMILY, entry, entry.spec.candidates)])
                return
        fam = family_of(entry.spec, lay, entry.peak_lb, entry.zeros)
        if self._dominated(entry.step_lb, fam.base.world_size, lay.usd_min, fam.peak_lb):
            self.res.pruned_dominated += fam.count
            return
        if entry.tight_zeros:
            # its candidates under ZeRO stages that may fit only within the margin
            self._spill(self._objective_lb(entry.step_lb, lay.usd_min), FAMILY,
                        entry._replace(zeros=entry.tight_zeros, tight_zeros=()))
        items = []
        # the candidates under ZeRO stages the family screen ruled out are never built
        per_zero = fam.count // len(self.zero_opts)
        self.res.pruned_memory += per_zero * (len(self.zero_opts) - len(fam.zeros))
        for counts, orders in fam.layouts.items():
            n = len(orders) * len(fam.vpps) * len(fam.zeros)
            cb = self.bounds.cell(fam.base, fam.tk, orders[0], fam.vpps, fam.zeros)
            cell = Cell(fam, tuple(orders), n, cb, lay.usd[counts])
            items.append(Pending(self._objective_lb(cb, lay.usd[counts]), CELL, cell, n))
        self._queue(items)

    def _capped_cell(self, lb: float, cell: Cell) -> Cell | None:
        """Bound a cell with the layers its stages can hold in memory (Bounds.cell_bounds): when
        that rises above lb the cell is queued again under it, or pruned by memory when no
        candidate of it can fit (None); else the cell to expand. Where the margin raised it,
        the cell is also set aside whole under its bound without the margin (its children then
        are not, one by one)."""
        fam, usd_h = cell.family, cell.usd_hour
        spill = self._setting_aside()
        margins = (True, False) if spill else (self.with_margin,)
        _, capped, *loose = self.bounds.cell_bounds(fam.base, fam.tk, cell.orders[0], fam.vpps, fam.zeros,
                                                    [self.rooms.held_of(fam, m) for m in margins])
        spilled = spill and loose[0] < capped * (1 - _REQUEUE_SLACK)
        if spilled:
            self._spill(self._objective_lb(loose[0], usd_h), CELL, replace(cell, step_lb=loose[0], capped=True))
        cell = replace(cell, capped=True, spilled=spilled)
        if capped == float("inf"):
            if self.plans.items:   # (before any plan, expanded for the closest miss report)
                self.res.pruned_memory += cell.count
                return None
            capped = cell.step_lb
        bound = self._objective_lb(capped, usd_h)
        if bound > lb * (1 + _REQUEUE_SLACK):
            self._queue([Pending(bound, CELL, replace(cell, step_lb=capped), cell.count)])
            return None
        return cell

    def _expand_cell(self, lb: float, cell: Cell) -> None:
        """A cell's candidates (after its own bound with memory caps, _capped_cell), each
        bounded with the layers each of its stages can hold in memory (memory_screen's caps,
        all at once: Bounds.children); those that cannot fit are pruned by memory here. Those
        the margin rules out, or whose bound it raises, are set aside under their bound
        without it (_spill). A block-recompute family's caps depend on its k: its candidates
        are bounded without them (_reach_block screens them)."""
        fam, usd_h = cell.family, cell.usd_hour
        if self._dominated(cell.step_lb, fam.base.world_size, usd_h, fam.peak_lb):
            self.res.pruned_dominated += cell.count
            return
        if not cell.capped and not fam.block and fam.base.pp > 1:
            cell = self._capped_cell(lb, cell)
            if cell is None:
                return
        if fam.block:
            rows, (bounds,) = self.bounds.children(fam.base, fam.tk, cell.orders, fam.vpps, fam.zeros)
            self._queue([Pending(self._objective_lb(b, usd_h), BLOCK, Child(fam, vpp, z, groups, b, usd_h), 1)
                         for b, (vpp, z, groups) in zip(bounds.tolist(), rows)])
            return
        # set aside child by child, unless the whole cell was (_capped_cell)
        spill = self._setting_aside() and not cell.spilled
        margins = (True, False) if spill else (self.with_margin,)
        rows, (_, capped, *without) = self.bounds.children(fam.base, fam.tk, cell.orders, fam.vpps, fam.zeros,
                                                           [self.rooms.rooms_of(fam, m) for m in margins])
        loose = without[0].tolist() if spill else None
        items = []
        for k, (b, (vpp, z, groups)) in enumerate(zip(capped.tolist(), rows)):
            child = Child(fam, vpp, z, groups, b, usd_h)
            if b == float("inf"):
                self.res.pruned_memory += 1
                if not self.plans.items:
                    self.screened_out.append(child)
            else:
                items.append(Pending(self._objective_lb(b, usd_h), CAND, child, 1))
            if spill and loose[k] < b * (1 - _REQUEUE_SLACK):
                # it may fit, or fit faster, within the margin
                self._spill(self._objective_lb(loose[k], usd_h), CAND, child._replace(step_lb=loose[k]))
        self._queue(items)

    def _initial_split(self, fam: Family, c: Strategy, groups: tuple, uneven: bool):
        """split.initial_split of a candidate c of family fam, cached: it reads c's depth, vpp
        and time key (fam.tk: the ZeRO stage and placement of c do not enter) and the stage order
        (the candidates of a cell differ in ZeRO stage: most share a split)."""
        key = (fam.tk, c.pp, c.vpp, groups, uneven)
        got = self.splits.get(key)
        if got is None:
            got = self.splits[key] = initial_split(self.model, self.cluster, c, groups, uneven)
        return got

    def _requeue(self, bound: float, entry: Requeued) -> None:
        """Queue a built candidate again, under a higher bound; the helper may price it."""
        tie = next(self.tie)
        heapq.heappush(self.heap, (bound, tie, REQUEUED, entry))
        if self.helper is not None:
            self.helper.offer(bound, tie, entry.strategy)

    def _reach_block(self, lb: float, child: Child) -> None:
        """A block-recompute child: on its starting split (the partition assumes every layer
        recomputed alike, so it is not re-solved), more recomputed layers only cost time and
        save memory, so the smallest k that fits dominates every larger k."""
        model, cluster = self.model, self.cluster
        c, groups = child_strategy(child.family, child.vpp, child.zero, child.groups, cluster)
        valid, split = self._initial_split(child.family, c, groups, False)
        per_chunk = min(split or c.stage_layers(model)) // c.vpp
        ck = least_block_recompute(model, cluster, c.with_(recompute="full", layers_per_stage=split),
                                    per_chunk - 1, self.rank_fits, safe=self.with_margin)
        # within the margin fewer layers may need recomputing
        self._spill(lb, BLOCK, child)
        if ck is None:
            self.res.pruned_memory += 1
            return
        if self.tight_phase and ck in self.priced:   # priced in the first phase
            return
        b = self.bounds.block_candidate(ck, groups, tk=child.family.tk)
        self._requeue(self._objective_lb(b, child.usd_hour), Requeued(ck, b, child.usd_hour, child.family.peak_lb))

    def _reach_candidate(self, lb: float, child: Child) -> Strategy | None:
        """A candidate on its starting split, screened by memory; with the layers each stage can
        hold its bound may rise: then it is queued again rather than priced."""
        model, cluster, o, res = self.model, self.cluster, self.o, self.res
        fam, usd_h = child.family, child.usd_hour
        c, groups = self._on_start(child)
        self.done += 1
        if self.tight_phase and c in self.priced:   # priced in the first phase
            return None
        may_fit, n_max, peak_lb = memory_screen(model, cluster, c, uneven=o.uneven_chunks,
                                                 dense_reach=self.bounds.dense_ranks(c.pp, c.vpp),
                                                 terms=self.rooms.terms, act_key=fam.tk,
                                                 with_margin=self.with_margin)
        if not may_fit:
            res.pruned_memory += 1
            if not self.plans.items:
                self.screened_out.append(child)
            self._spill(lb, CAND, child)
            return None
        b2 = self.bounds.candidate(c, fam.tk, groups, n_max)
        if self._dominated(b2, c.world_size, usd_h, peak_lb):
            res.pruned_dominated += 1
            return None
        lb2 = self._objective_lb(b2, usd_h)
        if lb2 > lb * (1 + _REQUEUE_SLACK):
            self._requeue(lb2, Requeued(c, b2, usd_h, peak_lb))
            # within the margin its stages may hold more layers: its bound there may be lower
            self._spill(lb, CAND, child)
            return None
        return c

    def _on_start(self, child: Child) -> tuple[Strategy, tuple]:
        """A candidate's Strategy on its starting split (initial_split), and its stage groups."""
        c, groups = child_strategy(child.family, child.vpp, child.zero, child.groups, self.cluster)
        return with_split(c, self._initial_split(child.family, c, groups, self.o.uneven_chunks)[1]), groups

    def _reach_requeued(self, entry: Requeued) -> Strategy | None:
        c = entry.strategy
        if self._dominated(entry.step_lb, c.world_size, entry.usd_hour, entry.peak_lb):
            self.res.pruned_dominated += 1
            return None
        if self.tight_phase and c in self.priced:   # priced in the first phase
            return None
        if c.recompute_num_layers is not None:
            self.done += 1
            if not fits_exactly(self.model, self.cluster, c, self.rank_fits, safe=self.with_margin):
                self.res.pruned_memory += 1
                return None
        return c

    def _price_and_offer(self, c: Strategy) -> None:
        """Price a candidate (its exact split too) and offer the plans that fit."""
        o = self.o
        def price(x):
            return priced_apart(self.model, self.cluster, x, o.uneven_chunks, not o.allow_tight)

        got = None
        if self.helper is not None:
            if self.helper.in_hand == c:   # candidates it may price here while it waits
                self._offer_ahead(self.helper, _AHEAD_WAITING)
            got = self.helper.take(c, price)
        if got is None:
            got = price(c)
        fitting, short, effects = got
        add_effects(self.res, effects)
        self.priced.add(c)
        if not fitting:
            if short is not None and (self.closest is None or short[0] < self.closest[0]):
                self.closest = short
            return
        self.seen.update(x.strategy for x in self.plans.offer([x for x in fitting if x.strategy not in self.seen],
                                                               tight_only=self.tight_phase))

    # ---- 3. the result ---------------------------------------------------------------------------

    def _finish(self) -> SearchResult:
        o, res, plans = self.o, self.res, self.plans
        res.pruned_bound += sum(entry_count(k, p) for _, _, k, p in self.heap)
        if o.solver.startswith("ilp"):
            found = [x[3] for x in plans.items[:o.top]]
            found = ilp_cross_check(self.model, self.cluster, found, o.solver, res, o.uneven_chunks,
                                     safe=not o.allow_tight)
            again = Plans(o, tiered=False)
            for e in found:
                again.add(e, figures(e, charge_idle=o.charge_idle))
            plans.items = again.items
        res.plans = [x[3] for x in plans.items[:o.top]]
        res.plan_figures = [x[4] for x in plans.items[:o.top]]
        if res.plans:
            last = plans.items[min(o.top, len(plans.items)) - 1][0]
            res.hidden_dominated = sum(1 for x in plans.dominated_objs if x <= last)
        if plans.tight is not None and plans.tight.items:
            tight = plans.tight.items
            if not plans.items or tight[0][0] < plans.items[0][0]:
                res.fastest_tight = tight[0][3]
            # fewer than K plans fit with margin: the best TIGHT ones close the list, those no
            # plan that fits with margin dominates (the plans kept apart dominate only each other)
            if not o.keep_dominated:
                tight = [x for x in tight if not any(dominates(p[1], x[1]) for p in plans.items)]
            fill = tight[:max(o.top - len(res.plans), 0)]
            res.tight_listed = len(fill)
            res.plans += [x[3] for x in fill]
            res.plan_figures += [x[4] for x in fill]
        if not res.plans:
            self._closest_report()
        if res.plans and self.cluster.is_heterogeneous:
            used = set(res.plans[0].stage_groups)
            res.idle_groups = [g.name for g in self.cluster.node_groups if g.name not in used]
        res.seconds = time.perf_counter() - self.t0
        return res

    def _closest_report(self) -> None:
        """No plan fits: the candidate closest to fitting, as res.closest."""
        model, cluster, closest = self.model, self.cluster, self.closest
        # the exact shortfall of each candidate the screen ruled out (computed only now, as most
        # searches find a plan)
        for child in self.screened_out:
            c, _ = self._on_start(child)
            short = max(m.total - m.capacity for m in stage_memories(model, cluster, c))
            if closest is None or short < closest[0]:
                closest = (short, c)
        if closest is None:
            # the families memory ruled out with the least peak bytes, their candidates tried
            peaks = self.groups.peaks(self.unfit)
            near = self.unfit[np.argsort(peaks, kind="stable")[:_CLOSEST_FAMILIES]]
            closest = _closest_of(model, cluster,
                                  [family_of(self.specs[i], self.families.layouts[self.specs[i].lkey]) for i in near],
                                  self.zero_opts)
        self.closest = closest
        if closest is not None:
            try:
                self.res.closest = (closest[1] if isinstance(closest[1], Estimate)
                                    else estimate(model, cluster, closest[1]))
            except InvalidStrategy:
                self.res.closest = None   # the nearest miss breaks a structure rule: no plan to show
