"""The memory caps the best-first search bounds cells and candidates with (best_first.py): for
a family's candidates under one vpp and ZeRO stage, the most layers each pipeline rank can
hold on each of its node groups (screen.py stage_rooms), and per group how many ranks can
hold t layers (for Bounds.cell_bounds); cached per family, vpp, ZeRO stage and margin, their
terms shared across the search (RoomTerms)."""

from __future__ import annotations

import numpy as np

from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from .bounds import Bounds
from .entries import Family, child_strategy
from .screen import RoomTerms, stage_rooms


class FamilyRooms:
    """rooms_of / held_of: the callables (vpp, ZeRO stage) -> rooms that Bounds.children and
    Bounds.cell_bounds take, for one family and margin."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, bounds: Bounds):
        self.model, self.cluster, self.bounds = model, cluster, bounds
        self.terms = RoomTerms(model, cluster)   # memory_screen's / stage_rooms' terms
        self._rooms: dict = {}
        self._held: dict = {}

    def rooms_of(self, fam: Family, margin: bool):
        """(vpp, ZeRO stage) -> (row of each node group, stage_rooms) of family fam's candidates,
        for Bounds.children."""
        def room_of(vpp: int, z: int):
            key = (fam.base, vpp, z, margin)
            got = self._rooms.get(key)
            if got is None:
                c, _ = child_strategy(fam, vpp, z, None, self.cluster)
                names = fam.names or tuple(sorted({g for orders in fam.layouts.values() for o in orders for g in o}))
                got = self._rooms[key] = ({g: i for i, g in enumerate(names)},
                                          stage_rooms(self.model, self.cluster, c, names,
                                                      self.bounds.dense_ranks(c.pp, vpp), self.terms, margin, fam.tk))
            return got
        return room_of

    def held_of(self, fam: Family, margin: bool):
        """(vpp, ZeRO stage) -> (row of each node group, held) of family fam's candidates, for
        Bounds.cell_bounds: held[row, t - 1] the pipeline ranks whose stage on that group can
        hold >= t layers."""
        room_of = self.rooms_of(fam, margin)
        L = self.model.num_layers

        def held_of(vpp: int, z: int):
            key = (fam.base, vpp, z, margin)
            got = self._held.get(key)
            if got is None:
                row_of, rooms = room_of(vpp, z)
                t = np.arange(1, max(1, min(int(rooms.room.max()), L)) + 1)
                got = self._held[key] = (row_of, (rooms.room[:, :, None] >= t).sum(axis=1))
            return got
        return held_of
