"""A hash computed once for the frozen specs the cost caches key on. The search looks up
layer times, placements and MoE schedules keyed by (model, strategy, GPU) 10^5-10^6 times; a
dataclass's own hash rebuilds the tuple of every field each time (1.5 us for a ModelSpec).
The cached value is dropped when pickled: string hashes differ between processes (a sweep's
workers)."""

from __future__ import annotations

from dataclasses import fields


def hash_once(self) -> int:
    """The dataclass's own hash (of its fields' values, in order), computed once."""
    h = self.__dict__.get("_hash")
    if h is None:
        names = _FIELD_NAMES.get(type(self))
        if names is None:
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in fields(self))
        h = hash(tuple([getattr(self, f) for f in names]))
        object.__setattr__(self, "_hash", h)
    return h


_FIELD_NAMES: dict = {}   # class -> its field names


def state_without_hash(self) -> dict:
    state = dict(self.__dict__)
    state.pop("_hash", None)
    return state
