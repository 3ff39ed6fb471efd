"""The families of a search's space as the best-first search (best_first.py) queues them:
each family's time class (its Strategy without pp, dp or placement, and its time key), the stage
layouts of its pipeline shape (Layouts) and its row of the family memory screen, group by
group of one degrees and micro-batch (Families.groups), and the bound a group is ordered by
(Families.group_bound, group_order.py)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..estimate import time_key
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy
from .bounds import Bounds
from .entries import FamilySpec, GroupSpecs, Layouts, TimeClass
from .family_screen import FamilyScreen
from .objective import usd_per_hour
from .space import (SearchOptions, enumerate_space, execution_of, family_groups, layer_executions, stage_layouts,
                    zero_options)

# Degrees x layer executions from which a search with o.jobs >= 2 splits its group bounds with
# the helper process. Kept from the split family screen this replaced, where queueing that many
# took about a second (Mixtral 8x22B's 19,840 on 256 H100 1.0 s; Llama 3.1 405B's 3,992 0.2 s);
# not measured again for the split bounds.
SPLIT_FAMILIES = 15_000


class FamilyGroup(NamedTuple):
    """The families of one degrees and micro-batch as Families.groups yields them."""
    part: int                      # 0 or 1: the half of split group bounds it belongs to
    pp: int
    dp: int
    m: int                         # micro-batches
    names: tuple                   # the node groups its stage layouts use
    rows: tuple                    # its families as FamilyScreen.add_group takes them
    rows_key: int                  # names rows (the same key, the same rows)
    specs: GroupSpecs
    floors: tuple                  # (floor TimeClass, most virtual stages of its families) per floor class

    @property
    def screen_args(self) -> tuple:
        """FamilyScreen.add_group's arguments."""
        return self.pp, self.dp, self.m, self.names, self.rows, self.rows_key


class Families:
    """The space's families for one search: model, cluster and options, the search's bounds
    (for the stage caps of each layout) and whether its memory screens leave the margin."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, bounds: Bounds,
                 with_margin: bool):
        self.model, self.cluster, self.o, self.bounds = model, cluster, o, bounds
        self.with_margin = with_margin
        self.zero_opts = zero_options(o)
        self.layouts: dict = {}   # (GPUs per stage, pp) -> Layouts

    def usd_hour(self, counts: tuple, per: int) -> float | None:
        """USD an hour of the GPUs charged for stages of `per` GPUs, `counts` on each group."""
        used = {g.name: c * per for g, c in zip(self.cluster.node_groups, counts)}
        return usd_per_hour(self.cluster, used, self.o.charge_idle)

    def layouts_of(self, per: int, pp: int) -> int:
        """How many stage orders pipelines of pp stages of `per` GPUs have (their Layouts
        cached in self.layouts)."""
        lkey = (per, pp)
        if lkey not in self.layouts:
            lay = stage_layouts(self.cluster, per, pp, self.o.budget)
            usd = {counts: self.usd_hour(counts, per) for counts in lay}
            known = [u for u in usd.values() if u is not None]
            caps = self.bounds.stage_caps(per, pp, lay)
            self.layouts[lkey] = Layouts(lay, sum(len(v) for v in lay.values()), caps,
                                         usd, min(known) if known and len(known) == len(usd) else None,
                                         tuple(sorted(g for g, c in caps.items() if c > 0)))
        return self.layouts[lkey].n_orders

    def groups(self):
        """family_groups with each family's time class, per group of families (one degrees and
        micro-batch): FamilyGroup, rows as FamilyScreen.add_group takes them (rows_key naming
        them), specs their GroupSpecs, part 0 or 1 alternating over (tp, cp, ep, etp, mbs) in
        order of first appearance (the halves of group bounds split between two processes:
        each computes the layer costs of its own time classes). A family is a row of its group
        until it is reached; its Strategy is built from its time class's."""
        model, o = self.model, self.o
        execution = execution_of(model, o, self.cluster)
        shared_overlap = execution.pop("moe_shared_expert_overlap")
        # (tp, cp, ep, etp, mbs, time class) -> (TimeClass, an int naming it: the screen keys its
        # tables by it, hashing the class 10^6 times was a third of the enumeration)
        classes: dict = {}
        # (tp, cp, ep, etp, mbs, family_groups' fams_id) -> (rows, rows_key, kinds, per_order)
        made: dict = {}
        parts: dict = {}

        def time_class(tp, cp, ep, etp, mbs, kind) -> tuple[TimeClass, int]:
            ckey = (tp, cp, ep, etp, mbs, kind)
            got = classes.get(ckey)
            if got is None:
                ts = Strategy(tp=tp, cp=cp, ep=ep, etp=etp, micro_batch_size=mbs,
                              global_batch_size=o.global_batch_size, seq_length=o.seq_length,
                              sequence_parallel=tp > 1, precision=o.precision,
                              **execution, **kind.fields(shared_overlap),
                              overlap_grad_reduce=True)
                got = classes[ckey] = (TimeClass(ts, time_key(ts)), len(classes))
            return got

        def group_rows(dkey, fams) -> tuple:
            rows, kinds, floors = [], [], {}
            for _, kind, vh, per_order in fams:
                cls, cid = time_class(*dkey, kind.time_class)
                floor, floor_id = time_class(*dkey, kind.floor)
                # the bytes a GPU can allocate are the same without recompute: keyed by the floor
                rows.append((cls.base, cid, floor_id, kind.block, max(vh)))
                kinds.append((cls, floor, kind.block, vh, per_order))
                floors[floor_id] = (floor, max(max(vh), floors.get(floor_id, (None, 0))[1]))
            return (tuple(rows), len(made), tuple(kinds), np.array([per_order for *_, per_order in fams]),
                    tuple(floors.values()))

        for tp, cp, pp, dp, ep, etp, mbs, m, n_orders, fams, fams_id in family_groups(model, self.cluster, o,
                                                                                       self.layouts_of):
            lkey = (tp * cp * dp, pp)
            dkey = (tp, cp, ep, etp, mbs)
            part = parts.get(dkey)
            if part is None:
                part = parts[dkey] = len(parts) % 2
            got = made.get((dkey, fams_id))
            if got is None:
                got = made[dkey, fams_id] = group_rows(dkey, fams)
            rows, rows_key, kinds, per_order, floors = got
            yield FamilyGroup(part, pp, dp, m, self.layouts[lkey].names, rows, rows_key,
                              GroupSpecs(kinds, pp, dp, lkey, m, n_orders, per_order), floors)

    def group_bound(self, g: FamilyGroup, whole: bool = False) -> float:
        """A step-time bound no family of a group beats: the least over its floor classes of
        Bounds.family at the most virtual stages of the group's families of that class (no more
        than any of their queue bounds); with `whole`, with the whole-layer term too (tighter,
        and several times the cost: GroupOrder adds it when a group comes up)."""
        lay = self.layouts[g.specs.lkey]
        return min(self.bounds.family(floor.base, floor.tk, g.pp, g.m, g.specs.lkey[0], lay.caps, vmax, lay.names,
                                      whole=whole) for floor, vmax in g.floors)

    def own_bound(self, spec: FamilySpec) -> float:
        """The step-time bound of a family over all its stage placements (Bounds.family)."""
        return self._class_bound(spec.cls, spec)

    def _class_bound(self, cls: TimeClass, spec: FamilySpec) -> float:
        """Bounds.family of spec's pipeline shape, micro-batches and layouts at time class cls
        (its own, or its floor's)."""
        lay = self.layouts[spec.lkey]
        return self.bounds.family(cls.base, cls.tk, spec.pp, spec.m, spec.lkey[0], lay.caps, max(spec.vpps), lay.names)

    def queue_bound(self, spec: FamilySpec, floor_lbs: dict) -> float:
        """The bound a family that may fit is queued under: its own where its class recomputes
        nothing, else its floor class's (no more than its own, shared by the families of one
        degrees that differ in recompute; the search computes their own only when they are
        reached). Both cached in floor_lbs: a family whose class recomputes nothing is the
        floor class of its siblings that do, so their bound is its own."""
        key = (spec.floor.tk, spec.pp, spec.m, spec.lkey, max(spec.vpps))
        lb = floor_lbs.get(key)
        if lb is None:
            lb = floor_lbs[key] = self._class_bound(spec.floor, spec)
        return lb

    def new_screen(self) -> FamilyScreen:
        """An empty family memory screen for these families (the search's ZeRO stages, margin)."""
        return FamilyScreen(self.model, self.cluster, self.zero_opts, self.o.uneven_chunks, self.with_margin)

    def split(self) -> bool:
        """Whether the group bounds are split with a helper process (o.jobs >= 2, and a space
        of at least SPLIT_FAMILIES degrees x layer executions)."""
        model, o = self.model, self.o
        if o.jobs < 2:
            return False
        kinds = len(layer_executions(model, o, 2 if model.is_moe else 1))
        return sum(1 for _ in enumerate_space(model, self.cluster, o)) * kinds >= SPLIT_FAMILIES
