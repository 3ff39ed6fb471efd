"""The plans a search has found (Plans): the best distinct ones, or the front of those no
other found plan dominates, with the K-th best objective that stops the search, and the plans
that fit only within the memory model's margin (TIGHT) kept apart."""

from __future__ import annotations

import itertools

from ..estimate import Estimate
from .objective import dominates, figures, memory_figure
from .space import SearchOptions

class Plans:
    """The plans found so far: with `keep_dominated`, the best distinct ones; else the front of
    those no other found plan dominates (objective.dominates on Figures.point). `kth` is the
    K-th best objective among them: no plan worse than it can enter the top K. It may rise when
    a new plan dominates several (which is why entries above it are deferred, not dropped)."""

    def __init__(self, o: SearchOptions, tiered: bool | None = None):
        self.o = o
        self.top = max(o.top, 1)
        self.items: list = []         # (objective, point, order, Estimate, Figures), best first
        self.dominated_objs: list = []
        self._order = itertools.count()
        # safe by default: plans that fit only within the memory model's margin (TIGHT) are kept
        # apart, so the K-th best, the stop and dominance count only plans that fit with margin
        tiered = not o.allow_tight if tiered is None else tiered
        self.tight = Plans(o, tiered=False) if tiered else None

    def offer(self, estimates: list[Estimate], tight_only: bool = False) -> list[Estimate]:
        """Add the best of a candidate's fitting estimates (its splits): the fastest, or with
        tiers the fastest that fits with margin and the fastest TIGHT one when faster still.
        `tight_only`: only that TIGHT one (the search's TIGHT phase: a plan that fits with margin
        it meets cannot enter the top K, the first phase found those). Returns those added."""
        if not estimates:
            return []
        key = (lambda x: x.step_time_s)
        if self.tight is None:
            picked = [min(estimates, key=key)]
        else:
            safe = [x for x in estimates if x.memory_verdict == "fits"]
            tight = [x for x in estimates if x.memory_verdict == "tight"]
            picked = [min(safe, key=key)] if safe else []
            if tight and (not picked or min(tight, key=key).step_time_s < picked[0].step_time_s):
                picked.append(min(tight, key=key))
            if tight_only:
                picked = [e for e in picked if e.memory_verdict == "tight"]
        for e in picked:
            fig = figures(e, charge_idle=self.o.charge_idle)
            if self.tight is not None and e.memory_verdict == "tight":
                self.tight.add(e, fig)
            else:
                self.add(e, fig)
        return picked

    def kth(self) -> float:
        return self.items[self.top - 1][0] if len(self.items) >= self.top else float("inf")

    def best(self):
        return self.items[0] if self.items else None

    def add(self, e: Estimate, fig) -> None:
        obj, pt = fig.objective(self.o.objective), fig.point
        item = (obj, pt, next(self._order), e, fig)
        if self.o.keep_dominated:
            self.items.append(item)
            self.items.sort(key=lambda x: x[:3])
            del self.items[self.top:]
            return
        if any(dominates(x[1], pt) for x in self.items):
            self.dominated_objs.append(obj)
            return
        self.dominated_objs.extend(x[0] for x in self.items if dominates(pt, x[1]))
        self.items = [x for x in self.items if not dominates(pt, x[1])] + [item]
        self.items.sort(key=lambda x: x[:3])

    def dominate(self, step_lb: float, gpus: int, usd_step_lb: float, peak_lb) -> bool:
        """Whether a found plan dominates every plan of an entry whose plans take at least
        step_lb seconds, exactly `gpus` GPUs, at least usd_step_lb dollars a step and at least
        peak_lb bytes on some GPU (peak_lb may be a function: it is called only when a found
        plan already matches the other figures)."""
        if self.o.keep_dominated:
            return False
        near = [x[1] for x in self.items if x[1][0] <= step_lb and x[1][2] <= gpus and x[1][3] <= usd_step_lb]
        if not near:
            return False
        peak = memory_figure(peak_lb() if callable(peak_lb) else peak_lb)
        return any(p[1] <= peak for p in near)

