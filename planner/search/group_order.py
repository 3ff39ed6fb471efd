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
from .space import SearchOptions

# Groups a batch holds: big enough for the screen's numpy work to pay (a batch's tables and
# arrays), small enough that a search reaching a few thousand groups screens few beyond them.
GROUPS_PER_BATCH = 2048


class GroupOrder:
    """Every group of the space, its families appended to `specs` in the order enumerated
    (family i is specs[i]), with the step-time bound of each group of `part` (every group when
    None; Families.groups' halves, the other computed by the helper process) without the
    whole-layer term; `order` queues them by it, and `take` hands them out in batches, least
    bound first, each group's bound raised by the whole-layer term when it comes up (it goes
    back in line if that puts it behind another): deterministic, so a search takes the same
    batches whatever its jobs."""

    def __init__(self, families: Families, specs: FamilySpecs, part: int | None = None):
        self.families, self.specs = families, specs
        self.groups, self.runs, step = [], [], []
        for g in families.groups():
            self.runs.append(specs.add(g.specs))
            self.groups.append(g)
            step.append(families.group_bound(g) if part is None or g.part == part else np.nan)
        self.step_lbs = np.array(step, dtype=float)
        self.heap: list = []         # (objective bound, group index, with the whole-layer term)
        self.objective = None
        self.left = 0                # candidates of the groups not taken
        self.screen: FamilyScreen | None = None

    def order(self, objective=None, theirs: np.ndarray | None = None) -> None:
        """Queue the groups by their bounds: the step-time bounds not computed here are
        `theirs` (the other part's, in order) or, when that is None (no helper, or it failed),
        computed now; `objective(step_lbs, groups)`, if given, turns step-time bounds into
        objective bounds."""
        missing = np.flatnonzero(np.isnan(self.step_lbs))
        if len(missing):
            self.step_lbs[missing] = (theirs if theirs is not None and len(theirs) == len(missing)
                                      else [self.families.group_bound(self.groups[i]) for i in missing.tolist()])
        self.objective = objective
        lbs = objective(self.step_lbs, self.groups) if objective is not None else self.step_lbs.tolist()
        self.heap = [(lb, i, False) for i, lb in enumerate(lbs)]
        heapq.heapify(self.heap)
        self.left = int(self.specs.candidates.sum())

    def __bool__(self) -> bool:
        """Whether groups are left to take."""
        return bool(self.heap)

    def bound(self) -> float:
        """The least bound of the groups left (inf when none are)."""
        return self.heap[0][0] if self.heap else float("inf")

    def candidates_left(self) -> int:
        return self.left

    def take(self, upto: float) -> list[int]:
        """The next batch: up to GROUPS_PER_BATCH groups, least bound first, of those bounded
        (with the whole-layer term) at or below `upto` (none can enter a search's result above
        its K-th best); a group without that term at the head of the line gets it and goes
        back in line."""
        heap, batch = self.heap, []
        while heap and len(batch) < GROUPS_PER_BATCH and heap[0][0] <= upto:
            lb, i, whole = heapq.heappop(heap)
            if whole:
                batch.append(i)
                continue
            step = self.families.group_bound(self.groups[i], whole=True)
            lb = self.objective(np.array([step]), [self.groups[i]])[0] if self.objective is not None else step
            heapq.heappush(heap, (lb, i, True))
        counts = self.specs.candidates
        for i in batch:
            first, n = self.runs[i]
            self.left -= int(counts[first:first + n].sum())
        return batch

    def screened(self, batch: list[int]) -> tuple[Screened, np.ndarray]:
        """The memory screen of these groups' families (one screen across batches: its tables
        are built once) and their family indices (row k is family index[k])."""
        if self.screen is None:
            self.screen = self.families.new_screen()
        for i in batch:
            self.screen.add_group(*self.groups[i].screen_args)
        return self.screen.run(), run_indices([self.runs[i] for i in batch])

    def every_args(self) -> list:
        """Every group's add_group arguments in the order enumerated (a screen of them all has
        family i in row i)."""
        return [g.screen_args for g in self.groups]


def group_bounds_half(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, part: int) -> np.ndarray:
    """The step-time bounds of the groups of one part (Families.groups), in order: what the
    helper process of a search that splits them computes (their time classes' layer costs are
    most of it; module-level, so a spawned process can take it)."""
    families = Families(model, cluster, o, Bounds(model, cluster, o.uneven_chunks), not o.allow_tight)
    return np.array([families.group_bound(g) for g in families.groups() if g.part == part], dtype=float)
