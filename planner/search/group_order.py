"""The family groups of a search's space (Families.groups: one degrees and micro-batch each),
in the order of a bound no family of a group beats (Families.group_bound), handed to the search
a batch at a time: it screens a batch for memory and bounds its families one by one only when
its queue reaches the batch's bound. A search reaches a few percent of 10^4-10^5 groups, and
screening and bounding every family before the first was half of a big search (Qwen3-235B on
mixed-512 at seq 8192: 4.6 of 10.6 s)."""

from __future__ import annotations

import heapq

import numpy as np

from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from .bounds import Bounds
from .entries import FamilySpecs
from .families import Families
from .family_screen import FamilyScreen, Screened, run_indices
from .helper import Served
from .objective import objective_lb
from .space import SearchOptions

# Groups a batch holds: big enough for the screen's numpy work to pay (a batch's tables and
# arrays), small enough that a search reaching a few thousand groups screens few beyond them.
GROUPS_PER_BATCH = 2048


class GroupOrder:
    """Every group of the space, its families appended to `specs` in the order enumerated
    (family i is specs[i]), with the step-time bound of each group of `part` (every group when
    None; Families.groups' two parts, the other computed by the helper process) without the
    whole-layer term. `order` lines each part's groups up by it; `take(part)` hands out that
    part's next half batch, least bound first, a group's bound raised by the whole-layer term
    when it comes to the head of the line (it goes back in line if that puts it behind
    another). Each part's batches depend on that part alone, so the helper process can take
    part 1's ahead of the search; serial or not, a search takes the same batches."""

    def __init__(self, families: Families, specs: FamilySpecs, part: int | None = None):
        self.families, self.specs = families, specs
        self.groups, self.runs, step = [], [], []
        for g in families.groups():
            self.runs.append(specs.add(g.specs))
            self.groups.append(g)
            step.append(families.group_bound(g) if part is None or g.part == part else np.nan)
        self.step_lbs = np.array(step, dtype=float)
        self.heaps: list = [[], []]  # per part: (objective bound, group index, with the whole-layer term)
        self.elsewhere: dict = {}    # part -> (least bound, batches taken, any left) where the helper takes them
        self.left = 0                # candidates of the groups not taken
        self.screen: FamilyScreen | None = None
        self.floor_lbs: dict = {}    # Families.queue_bound's cache (serve)

    def order(self, theirs: np.ndarray | None = None) -> None:
        """Line the groups up by their bounds: the step-time bounds not computed here are
        `theirs` (the other part's, in order) or, when that is None (no helper, or it failed),
        computed now."""
        missing = np.flatnonzero(np.isnan(self.step_lbs))
        if len(missing):
            self.step_lbs[missing] = (theirs if theirs is not None and len(theirs) == len(missing)
                                      else [self.families.group_bound(self.groups[i]) for i in missing.tolist()])
        lbs = self._objective(self.step_lbs.tolist(), self.groups)
        for i, (lb, g) in enumerate(zip(lbs, self.groups)):
            self.heaps[g.part].append((lb, i, False))
        for heap in self.heaps:
            heapq.heapify(heap)
        self.left = int(self.specs.candidates.sum())

    def _objective(self, step_lbs: list, groups: list) -> list:
        """Step-time bounds as objective bounds (objective_lb, at the least USD an hour of each
        group's layouts), as the search bounds its families."""
        o = self.families.o
        if o.objective != "cost":
            return step_lbs
        lay, tokens = self.families.layouts, o.global_batch_size * o.seq_length
        return [objective_lb(o.objective, lb, lay[g.specs.lkey].usd_min, tokens) for lb, g in zip(step_lbs, groups)]

    def __bool__(self) -> bool:
        """Whether groups are left to take."""
        return self.has_left(0) or self.has_left(1)

    def has_left(self, part: int) -> bool:
        """Whether groups of this part are left to take."""
        return self.elsewhere[part][2] if part in self.elsewhere else bool(self.heaps[part])

    def bound(self, part: int | None = None) -> float:
        """The least bound of the groups left, of one part or of both (inf when none are)."""
        parts = (0, 1) if part is None else (part,)
        return min((self.elsewhere[p][0] if p in self.elsewhere else self.heaps[p][0][0] if self.heaps[p]
                    else float("inf")) for p in parts)

    def candidates_left(self) -> int:
        return self.left

    def take(self, part: int) -> list[int]:
        """The next half batch of one part: up to GROUPS_PER_BATCH / 2 of its groups, least
        bound (with the whole-layer term) first. A part the helper took batches of (taken_there)
        replays them first (the helper stopped; the same batches, whoever takes them)."""
        if part in self.elsewhere:
            _, replays, _ = self.elsewhere.pop(part)
            for _ in range(replays):
                self._take(part)
        batch = self._take(part)
        self._gone(batch)
        return batch

    def _take(self, part: int) -> list[int]:
        heap, batch = self.heaps[part], []
        while heap and len(batch) < GROUPS_PER_BATCH // 2:
            lb, i, whole = heapq.heappop(heap)
            if whole:
                batch.append(i)
                continue
            step = self.families.group_bound(self.groups[i], whole=True)
            heapq.heappush(heap, (self._objective([step], [self.groups[i]])[0], i, True))
        return batch

    def taken_there(self, part: int, batch: list[int], bound: float, left: bool) -> None:
        """A half batch of `part` the helper took (GroupOrder.serve): its groups are no longer
        left, the part's least bound is now `bound`, and whether any is left `left`."""
        replays = self.elsewhere.get(part, (0.0, 0, True))[1]
        self.elsewhere[part] = (bound, replays + 1, left)
        self._gone(batch)

    def _gone(self, batch: list[int]) -> None:
        """These groups' candidates are no longer left (candidates_left)."""
        counts = self.specs.candidates
        for i in batch:
            first, n = self.runs[i]
            self.left -= int(counts[first:first + n].sum())

    def screened(self, batch: list[int]) -> tuple[Screened, np.ndarray]:
        """The memory screen of these groups' families (one screen across batches: its tables
        are built once) and their family indices (row k is family index[k])."""
        if self.screen is None:
            self.screen = self.families.new_screen()
        for i in batch:
            self.screen.add_group(*self.groups[i].screen_args)
        return self.screen.run(), self.index_of(batch)

    def index_of(self, batch: list[int]) -> np.ndarray:
        """The family indices of these groups' families, in order."""
        return run_indices([self.runs[i] for i in batch])

    def serve(self, part: int):
        """The helper's answer to a search that asks for `part`'s next half batch (best_first
        _queue_groups, ahead of its need): the groups, their screen, the queue bound of each
        family that may fit, with or without the margin (Families.queue_bound; nan for the
        others), the part's least bound left and whether any group is."""
        batch = self._take(part)
        got, index = self.screened(batch)
        may = got.may_fit if got.tight_zero_fit is None else got.tight_zero_fit.any(axis=1)
        step_lb = np.full(len(may), np.nan)
        for k in np.flatnonzero(may).tolist():
            step_lb[k] = self.families.queue_bound(self.specs[int(index[k])], self.floor_lbs)
        return batch, got, step_lb, self.bound(part), self.has_left(part)

    def peaks(self, index) -> np.ndarray:
        """The family screen's peak bounds of the families at `index` (families that cannot fit,
        asked only when no plan fits, so every group was screened): every group screened again,
        in the order enumerated (family i in row i)."""
        screen = self.families.new_screen()
        for g in self.groups:
            screen.add_group(*g.screen_args)
        return screen.run(every_peak=True).peak[index]


def group_bounds_half(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, part: int) -> Served:
    """The step-time bounds of the groups of one part (Families.groups), in order, and the
    helper's GroupOrder that takes that part's batches after (serve): what the helper process
    of a search that splits them computes (their time classes' layer costs are most of the
    bounds; module-level, so a spawned process can take it)."""
    families = Families(model, cluster, o, Bounds(model, cluster, o.uneven_chunks), not o.allow_tight)
    order = GroupOrder(families, FamilySpecs(), part)
    mine = np.array([g.part == part for g in order.groups], dtype=bool)
    bounds = order.step_lbs[mine]
    order.step_lbs[~mine] = np.inf   # (the other part's groups are the search's: never taken here)
    order.order()
    return Served(bounds, order.serve)
