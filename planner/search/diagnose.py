"""Why a search had nothing to price: the GPU budget (--gpus, --max-gpus, --min-gpu-fraction),
a pin (--fix) that breaks a structural rule, or pins that exclude each other. Each reason is a
sentence that names the options the user passed and what would make room."""

from __future__ import annotations

from dataclasses import replace

from ..errors import InvalidStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy, check_structure
from .planner import SearchOptions, space_worlds
from .space import NEED_SHARDED_OPTIMIZER, execution_of, zero_options

# world sizes listed in a message
_SHOWN_SIZES = 6


def _pins(o: SearchOptions, skip: str | None = None) -> str:
    return " ".join(f"--fix {k}={v}" for k, v in o.fixed if k != skip)


def _sizes(worlds) -> str:
    w = sorted(worlds)
    shown = ", ".join(str(x) for x in w[:_SHOWN_SIZES])
    return shown + (f", ... {w[-1]}" if len(w) > _SHOWN_SIZES else "")


def budget_rule(o: SearchOptions, cluster: ClusterSpec) -> str:
    """The GPU budget in force, as the no-plan messages state it: 'GPU budget: ...'."""
    if o.gpus is not None:
        return f"GPU budget: exactly --gpus {o.gpus}"
    where = (f"the cluster's {cluster.num_gpus}" if len(cluster.node_groups) == 1 else
             "those of the node groups it runs on")
    cap = f", at most --max-gpus {o.max_gpus}" if o.max_gpus is not None else ""
    return (f"GPU budget: more than --min-gpu-fraction {o.min_gpu_fraction:g} of the GPUs available to a plan "
            f"({where}{cap})")


def _structure_problem(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions) -> str | None:
    """The structural rule (strategy.check_structure) the pinned degrees break, if any."""
    pins = dict(o.fixed)
    tp, cp, pp = pins.get("tp", 1), pins.get("cp", 1), pins.get("pp", 1)
    dp = pins.get("dp", 1)
    vpp = pins.get("vpp", 1)
    try:
        s = Strategy(tp=tp, pp=pp, dp=dp, cp=cp, ep=pins.get("ep", 1), etp=pins.get("etp"), vpp=vpp,
                     micro_batch_size=pins.get("mbs", 1), global_batch_size=o.global_batch_size,
                     seq_length=o.seq_length, recompute=pins.get("recompute", "none"), sequence_parallel=tp > 1,
                     zero_stage=pins.get("zero", 1), precision=o.precision, **execution_of(model, o, cluster),
                     schedule="interleaved" if vpp > 1 else "1f1b")
        check_structure(s, model)
    except InvalidStrategy as exc:
        return exc.message
    except (ValueError, TypeError) as exc:   # a Strategy the dataclass itself refuses
        return str(exc)
    if s.world_size > cluster.num_gpus:
        return f"tp x cp x pp x dp = {s.world_size} GPUs, the cluster has {cluster.num_gpus}"
    return None


def empty_space_reason(model: ModelSpec, cluster: ClusterSpec, o: SearchOptions) -> str:
    """Why the space of o holds no candidate (one sentence, without a trailing period)."""
    pins = _pins(o)
    if not zero_options(o):
        need = ", ".join(k for k, v in o.settings if k in NEED_SHARDED_OPTIMIZER and v)
        zeros = f"--fix zero={dict(o.fixed)['zero']}" if "zero" in dict(o.fixed) else \
            f"--zero-stages {','.join(map(str, o.zero_stages))}"
        return (f"{zeros} leaves no ZeRO stage to search: the compared launch's settings ({need}) need the "
                "distributed optimizer (ZeRO 1 or more)")
    relaxed = replace(o, gpus=None, max_gpus=None, min_gpu_fraction=0.0)
    worlds = space_worlds(model, cluster, relaxed)
    if worlds:
        what = f"with {pins} " if pins else ""
        if o.gpus is not None:
            near = sorted(worlds, key=lambda w: (abs(w - o.gpus), w))[:_SHOWN_SIZES]
            return (f"no plan {what}uses exactly --gpus {o.gpus} GPUs; plans {what}can use {_sizes(near)} GPUs "
                    "(pipeline stages fill whole nodes, and dp divides --global-batch-size)")
        if o.max_gpus is not None and min(worlds) > o.max_gpus:
            return f"plans {what}need at least {min(worlds)} GPUs, more than --max-gpus {o.max_gpus}"
        biggest = max(w for w in worlds if o.max_gpus is None or w <= o.max_gpus)
        return (f"plans {what}use {_sizes(worlds)} GPUs, outside the {budget_rule(o, cluster)}: pass --max-gpus "
                f"{biggest} (or --gpus {biggest}) to plan on {biggest} GPUs, or lower --min-gpu-fraction")
    problem = _structure_problem(model, cluster, o)
    if problem is not None and pins:
        return f"{pins}: {problem}"
    for k, v in o.fixed:
        if space_worlds(model, cluster, replace(relaxed, fixed=tuple(x for x in o.fixed if x[0] != k))):
            others = _pins(o, skip=k)
            return (f"--fix {k}={v} leaves nothing to search" + (f" with {others}" if others else "")
                    + " on this model, batch and cluster (without it the space has plans)")
    if pins:
        return f"no plan of the search space has {pins}"
    return "no plan in the search space for this model, batch and cluster"
