"""The entries of the search's queue (best_first.py): what a family, a cell and a candidate
carry until they are reached, and the kinds that say which one a queue entry holds."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..specs.cluster import ClusterSpec
from ..strategy import Strategy

# heap entry kinds (GROUPS: the family groups not screened yet, group_order.py)
FAMILY, CELL, CAND, REQUEUED, BLOCK, DEFERRED, GROUPS = 0, 1, 2, 3, 4, 5, 6


@dataclass
class Family:
    """Degrees x micro-batch x recompute: every stage placement, vpp, ZeRO stage and order."""
    base: Strategy                 # vpp 1, no placement; recompute 'none' for a block family
    tk: Strategy
    block: bool
    vpps: tuple[int, ...]
    layouts: dict                  # stage counts per group -> stage orders
    count: int                     # candidates it stands for
    peak_lb: float = 0.0           # peak bytes per GPU no candidate of it goes below
    names: tuple | None = None     # the groups its layouts use, sorted (None: read from layouts)
    zeros: tuple | None = None     # the ZeRO stages under which it may fit (None: every one searched)


@dataclass
class Cell:
    family: Family
    orders: tuple
    count: int
    step_lb: float                 # seconds no candidate of the cell beats
    usd_hour: float | None         # USD an hour of the GPUs its candidates are charged for
    capped: bool = False           # step_lb allows for the layers its stages can hold (Bounds.cell_bounds)
    spilled: bool = False          # set aside whole for the TIGHT phase (its children are not, one by one)


class TimeClass(NamedTuple):
    """What families of one time class share: their strategy (no pp, dp or placement yet) and
    its time key."""
    base: Strategy
    tk: Strategy


class Layouts(NamedTuple):
    """The stage layouts of one pipeline shape (GPUs per stage, pp) under the GPU budget."""
    layouts: dict                  # stage counts per group -> stage orders (stage_layouts)
    n_orders: int                  # stage orders in all
    caps: dict                     # most stages any layout puts on each group
    usd: dict                      # stage counts -> USD an hour of the GPUs charged (None: unpriced)
    usd_min: float | None          # the least of those, when every layout is priced
    names: tuple                   # the groups with caps > 0, sorted


class FamilySpec(NamedTuple):
    """A family as the space enumerates it (its Family is built only when it is reached)."""
    cls: TimeClass
    floor: TimeClass              # its class without recompute (LayerExecution.floor): cls when none
    pp: int
    dp: int
    block: bool
    vpps: tuple[int, ...]
    lkey: tuple                    # (GPUs per stage, pp): the key of its Layouts
    candidates: int
    m: int                         # micro-batches


class GroupSpecs(NamedTuple):
    """The FamilySpecs of one group of families (one degrees and micro-batch), each built when
    asked: a search enumerates 10^5-10^6 families in 10^4-10^5 groups and reaches a few percent."""
    kinds: tuple                   # per family: (cls, floor, block, vpps, candidates per stage order)
    pp: int
    dp: int
    lkey: tuple
    m: int
    n_orders: int                  # stage orders of its pipeline shape
    per_order: np.ndarray          # candidates per stage order of each of its families

    def spec(self, j: int) -> FamilySpec:
        cls, floor, block, vpps, per_order = self.kinds[j]
        return FamilySpec(cls, floor, self.pp, self.dp, block, vpps, self.lkey, per_order * self.n_orders, self.m)


class FamilySpecs:
    """A search's families in the order enumerated, group by group: family i is
    specs[i] (a FamilySpec built on demand) and `candidates` each one's count (numpy)."""

    def __init__(self):
        self._groups: list = []
        self._starts: list = []
        self._n = 0
        self._counts = None

    def add(self, group: GroupSpecs) -> tuple[int, int]:
        """Append a group's families: (index of its first, how many)."""
        at = (self._n, len(group.kinds))
        self._groups.append(group)
        self._starts.append(self._n)
        self._n += len(group.kinds)
        self._counts = None
        return at

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> FamilySpec:
        g = bisect_right(self._starts, i) - 1
        return self._groups[g].spec(i - self._starts[g])

    @property
    def candidates(self) -> np.ndarray:
        """(F,) candidates each family stands for."""
        if self._counts is None:
            if not self._groups:
                self._counts = np.zeros(0, dtype=np.int64)
            else:
                per = np.concatenate([g.per_order for g in self._groups])
                orders = np.repeat([g.n_orders for g in self._groups], [len(g.kinds) for g in self._groups])
                self._counts = per.astype(np.int64) * orders
        return self._counts


class QueuedFamily(NamedTuple):
    """A FAMILY entry's payload."""
    spec: FamilySpec
    step_lb: float                 # seconds no candidate of the family beats
    peak_lb: float                 # peak bytes per GPU no candidate of it goes below
    index: int                     # of the spec in the search's specs
    exact: bool                    # step_lb is the family's own bound, not its floor class's
    zeros: tuple                   # the ZeRO stages under which it may fit (family_screen.py)
    tight_zeros: tuple             # those under which it may fit only within the memory margin


class Child(NamedTuple):
    """A CAND or BLOCK entry's payload: one candidate of a cell, built when it is reached."""
    family: Family
    vpp: int
    zero: int
    groups: tuple
    step_lb: float
    usd_hour: float | None


class Requeued(NamedTuple):
    """A REQUEUED entry's payload: a built candidate queued again under a higher bound."""
    strategy: Strategy
    step_lb: float
    usd_hour: float | None
    peak_lb: float                 # peak bytes per GPU it does not go below


class Pending(NamedTuple):
    """An entry to queue, or to set aside in a DEFERRED entry's payload (a list of them)."""
    bound: float                   # objective bound
    kind: int
    payload: object
    candidates: int


def entry_count(kind: int, payload) -> int:
    """Candidates a queued entry stands for."""
    if kind == FAMILY:
        return payload.spec.candidates
    if kind == CELL:
        return payload.count
    if kind == DEFERRED:
        return sum(it.candidates for it in payload)
    if kind == GROUPS:
        return payload
    return 1


def family_of(spec: FamilySpec, lay: Layouts, peak_lb: float = 0.0, zeros: tuple | None = None) -> Family:
    """The Family of one of the search's family specs."""
    ts, tk = spec.cls
    # a group has stages in some layout exactly when its cap is > 0
    return Family(ts.with_(pp=spec.pp, dp=spec.dp), tk, spec.block, spec.vpps, lay.layouts, spec.candidates,
                   peak_lb, names=lay.names, zeros=zeros)


def child_strategy(fam: Family, vpp: int, z: int, groups: tuple,
           cluster: ClusterSpec) -> tuple[Strategy, tuple[str, ...]]:
    """The Strategy of a queued candidate (built only when it is reached)."""
    c = fam.base.with_(vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b", zero_stage=z,
                       overlap_param_gather=z >= 1, stage_node_groups=groups if cluster.is_heterogeneous else None)
    return c, groups


