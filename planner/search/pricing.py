"""Pricing of the search: a candidate's full estimate and its exact re-split (price_candidate,
_estimate_split; priced_apart and add_effects where it runs in another process), and with
--solver ilp the top plans' splits solved again as an ILP (ilp_cross_check)."""

from __future__ import annotations

from ..errors import InvalidStrategy
from ..estimate import Estimate, estimate
from ..strategy import Strategy
from .space import SearchResult, warn
from .split import refine_partition

def price_candidate(model, cluster, s: Strategy, solver: str, res: SearchResult, uneven: bool = True,
           safe_split: bool = False):
    """Estimate one candidate and re-split its layers exactly. Returns (the estimates that fit,
    (bytes short, estimate) when none does). With `safe_split`, when the fastest split is
    TIGHT the layers are split again within each stage's room with the memory model's margin
    (the plan that fits safely may be another split of the same candidate)."""
    try:
        e = estimate(model, cluster, s)
    except InvalidStrategy:
        res.invalid += 1
        return [], None
    res.priced += 1
    res.priced_estimates.append(e)
    fitting = [e] if e.fits else []
    for safe in (False, True):
        if safe and (not safe_split or not fitting
                     or min(fitting, key=lambda x: x.step_time_s).memory_verdict != "tight"):
            break
        gaps: list = []
        s2, used = refine_partition(model, cluster, s, e, solver, res.warnings, gaps, uneven, safe)
        if used != "none":
            res.solver = used
        res.optimality_gap = max([res.optimality_gap] + gaps)
        e2 = _estimate_split(model, cluster, s, s2)
        if e2 is not None:
            res.priced_estimates.append(e2)
            if e2.fits:
                fitting.append(e2)
    if fitting:
        return fitting, None
    return [], (_short(e), e)


def priced_apart(model, cluster, s: Strategy, uneven: bool, safe_split: bool):
    """price_candidate on a result of its own: (the estimates that fit, the shortfall, the
    result holding what pricing adds to a search's result, for add_effects). A pure function of
    its arguments, so it can run in another process (best_first.py's helper) and give the same."""
    effects = SearchResult(plans=[], solver="")
    fitting, short = price_candidate(model, cluster, s, "dp", effects, uneven, safe_split)
    return fitting, short, effects


def add_effects(res: SearchResult, effects: SearchResult) -> None:
    """Add to res what price_candidate added to `effects` (priced_apart): the same as pricing
    into res itself."""
    res.invalid += effects.invalid
    res.priced += effects.priced
    res.priced_estimates.extend(effects.priced_estimates)
    if effects.solver:
        res.solver = effects.solver
    res.optimality_gap = max(res.optimality_gap, effects.optimality_gap)
    for w in effects.warnings:
        warn(res.warnings, w)


def _estimate_split(model, cluster, s: Strategy, s2):
    """The estimate of a re-split strategy s2, or None if there is none or it is s's own split."""
    if s2 is None or s2.layers_per_stage == s.stage_layers(model):
        return None
    try:
        return estimate(model, cluster, s2)
    except InvalidStrategy:
        return None


def ilp_cross_check(model, cluster, plans: list[Estimate], solver: str, res: SearchResult,
                     uneven: bool = True, safe: bool = False) -> list[Estimate]:
    """--solver ilp: the search prices with the exact DP (milliseconds a candidate); the top
    plans' splits are then solved again as an ILP, which agrees unless a solver limit hit.
    `safe`: a plan that fits with margin is replaced only by a split that does too."""
    out = []
    for e in plans:
        keep_safe = safe and e.memory_verdict == "fits"
        s2, used = refine_partition(model, cluster, e.strategy, e, solver, res.warnings, uneven=uneven,
                                    safe=keep_safe)
        if used.startswith("ilp"):
            res.solver = f"dp, checked by {used}"
        e2 = _estimate_split(model, cluster, e.strategy, s2)
        ok = e2 is not None and (e2.memory_verdict == "fits" if keep_safe else e2.fits)
        out.append(e2 if ok and e2.step_time_s < e.step_time_s else e)
    return sorted(out, key=lambda x: x.step_time_s)


def _short(e: Estimate) -> float:
    return max(m.total - m.capacity for m in e.memory)
