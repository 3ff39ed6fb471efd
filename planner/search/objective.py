"""What a plan means to the person who runs it, beyond its step time: the GPUs it takes and
leaves idle on each node group, what it costs (node groups' optional `price_per_gpu_hour`,
USD), the days and dollars to a token budget; the objective plans are ranked by; and when
one plan dominates another on the figures the output reports.

Units: seconds, bytes, USD; a token budget in tokens."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..units import GIB
from ..errors import PlannerError, SpecError
from ..specs.cluster import ClusterSpec
from ..strategy import Strategy

OBJECTIVES = ("throughput", "cost", "time-to-train")
# Default of --min-gpu-fraction: plans use more than this fraction of the GPUs available to them
# (those of the node groups they run on, at most --max-gpus), so that the space holds no plan
# that leaves most of what the user has idle (and stays small on large clusters).
MIN_GPU_FRACTION = 0.5
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
TOKENS_PER_MILLION = 1e6
# Peak memory is compared at the precision the plan table prints it (GiB to one decimal): two
# plans whose peaks differ by less are one choice on memory (a few MiB are below what the
# allocator's fragmentation alone moves, and below anything a user can act on).
MEMORY_DECIMALS_GIB = 1

# --train-tokens: SI multipliers (B for billion, as token budgets are written: "15T", "300B")
TOKEN_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
# The largest budget accepted: 1000T tokens, 25x the largest published pre-training run
# (Llama 4, about 40T tokens in 2025); above it a value is a typo (an extra suffix or digits).
MAX_TRAIN_TOKENS = 1e15
_TOKENS = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]?)\s*")


@dataclass(frozen=True)
class GpuBudget:
    """How many GPUs a plan may use: exactly `gpus`, else at most `max_gpus` and more than
    `min_fraction` of the GPUs available to it (its node groups', capped by max_gpus)."""
    gpus: int | None = None
    max_gpus: int | None = None
    min_fraction: float = MIN_GPU_FRACTION

    def cap(self, available: int) -> int:
        return available if self.max_gpus is None else min(available, self.max_gpus)

    def allows(self, world: int, available: int) -> bool:
        if self.gpus is not None:
            return world == self.gpus and world <= available
        cap = self.cap(available)
        return world <= cap and world > self.min_fraction * cap


def parse_token_count(text: str, option: str = "--train-tokens") -> float:
    """'2T' -> 2e12 tokens; K, M, B, T (either case) or a plain number such as 1.5e12."""
    m = _TOKENS.fullmatch(text) if isinstance(text, str) else None
    mult = TOKEN_SUFFIXES.get(m.group(2).upper(), None) if m and m.group(2) else 1.0
    value = float(m.group(1)) * mult if m and mult is not None else math.nan
    if not 1 <= value <= MAX_TRAIN_TOKENS:
        raise SpecError(option, None, f"found {text!r}, expected a token count from 1 to {MAX_TRAIN_TOKENS:.0e} such "
                        "as 2T, 300B or 1.5e12 (suffixes K, M, B, T)")
    return value


def gpus_by_group(cluster: ClusterSpec, s: Strategy) -> dict[str, int]:
    """GPUs the strategy occupies on each node group, as estimate.assign_stage_groups places its
    stages: on the groups `stage_node_groups` names, else filling the groups in listed order."""
    used = {g.name: 0 for g in cluster.node_groups}
    if s.stage_node_groups is not None:
        for name in s.stage_node_groups:
            used[name] += s.gpus_per_stage
        return used
    left = s.world_size
    for g in cluster.node_groups:
        used[g.name] = min(left, g.num_gpus)
        left -= used[g.name]
    return used


def usd_per_hour(cluster: ClusterSpec, used: dict[str, int], charge_idle: bool) -> float | None:
    """USD an hour of the GPUs charged: those the plan uses, or with `charge_idle` every GPU of
    the cluster (a cluster held whole pays for its idle GPUs too). None when a charged group
    has no price."""
    total = 0.0
    for g in cluster.node_groups:
        n = g.num_gpus if charge_idle else used.get(g.name, 0)
        if n == 0:
            continue
        if g.price_per_gpu_hour is None:
            return None
        total += n * g.price_per_gpu_hour
    return total


def usd_per_million_tokens(usd_hour: float, step_time_s: float, tokens_per_step: int) -> float:
    """Dollars per million trained tokens: (USD / h) x (h / step) / (tokens / step) x 1e6."""
    return usd_hour * step_time_s / SECONDS_PER_HOUR / tokens_per_step * TOKENS_PER_MILLION


def objective_lb(objective: str, step_lb: float, usd_hour, tokens_per_step: int) -> float:
    """A bound on the objective from a bound on step time and the USD an hour of the GPUs
    charged: the step time itself, or for "cost" the USD per million tokens it implies."""
    if objective == "cost":
        return usd_per_million_tokens(usd_hour, step_lb, tokens_per_step)
    return step_lb


def check_objective(cluster: ClusterSpec, objective: str, charge_idle: bool) -> None:
    """The cost objective needs a price on every node group a plan may use."""
    if objective not in OBJECTIVES:
        raise SpecError("--objective", None, f"found {objective!r}, expected one of {', '.join(OBJECTIVES)}")
    if objective == "cost" and not cluster.is_priced:
        missing = [i for i, g in enumerate(cluster.node_groups) if g.price_per_gpu_hour is None]
        raise SpecError(cluster.origin or cluster.name, f"node_groups[{missing[0]}].price_per_gpu_hour",
                        f"required by --objective cost (node group {cluster.node_groups[missing[0]].name} has no "
                        "price; give USD per GPU-hour on every node group)")


@dataclass(frozen=True)
class GroupUse:
    name: str
    gpu: str                 # the hardware profile
    gpus: int                # in the node group
    used: int
    price_per_gpu_hour: float | None

    @property
    def idle(self) -> int:
        return self.gpus - self.used


@dataclass(frozen=True)
class Figures:
    """Every figure the output reports for one plan (cost fields None where their inputs are
    missing: prices for dollars, --train-tokens for days and the total)."""
    step_time_s: float
    tokens_per_step: int
    peak_bytes: float                # the most any GPU of the plan holds (max over stages)
    groups: tuple[GroupUse, ...]
    idle_charged: bool
    usd_per_hour: float | None
    train_tokens: float | None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def gpus_used(self) -> int:
        return sum(g.used for g in self.groups)

    @property
    def gpus_idle(self) -> int:
        return sum(g.idle for g in self.groups)

    @property
    def usd_per_million_tokens(self) -> float | None:
        if self.usd_per_hour is None:
            return None
        return usd_per_million_tokens(self.usd_per_hour, self.step_time_s, self.tokens_per_step)

    @property
    def days_to_train(self) -> float | None:
        if self.train_tokens is None:
            return None
        return self.train_tokens / self.tokens_per_s / SECONDS_PER_DAY

    @property
    def usd_total(self) -> float | None:
        if self.train_tokens is None or self.usd_per_hour is None:
            return None
        return self.usd_per_hour * self.train_tokens / self.tokens_per_s / SECONDS_PER_HOUR

    def objective(self, objective: str) -> float:
        """The value plans are ranked by (lower is better). Time-to-train ranks as throughput:
        every plan of one search trains the same tokens per step (--global-batch-size x
        --seq-length), so its days are proportional to its step time."""
        if objective == "cost":
            if self.usd_per_hour is None:
                raise PlannerError("--objective cost needs a price_per_gpu_hour on every node group")
            return self.usd_per_million_tokens
        return self.step_time_s

    @property
    def point(self) -> tuple:
        """(step time, peak GiB as printed, GPUs used, $ per step or 0): the figures dominance
        compares. Dollars count only where every node group is priced (a plan on an unpriced
        group has no dollar figure to compare)."""
        priced = all(g.price_per_gpu_hour is not None for g in self.groups)
        usd = self.usd_per_hour * self.step_time_s if priced and self.usd_per_hour is not None else 0.0
        return (self.step_time_s, memory_figure(self.peak_bytes), self.gpus_used, usd)


def memory_figure(peak_bytes: float) -> float:
    """Peak bytes as the comparison sees them (MEMORY_DECIMALS_GIB); monotone in the bytes, so
    a lower bound on bytes gives a lower bound on this."""
    return round(peak_bytes / GIB, MEMORY_DECIMALS_GIB)


def figures(e, train_tokens: float | None = None, charge_idle: bool = False) -> Figures:
    """The Figures of an Estimate."""
    cluster, s = e.cluster, e.strategy
    used = gpus_by_group(cluster, s)
    groups = tuple(GroupUse(g.name, g.gpu.name, g.num_gpus, used[g.name], g.price_per_gpu_hour)
                   for g in cluster.node_groups)
    return Figures(step_time_s=e.step_time_s, tokens_per_step=s.global_batch_size * s.seq_length,
                   peak_bytes=max(m.total for m in e.memory), groups=groups, idle_charged=charge_idle,
                   usd_per_hour=usd_per_hour(cluster, used, charge_idle), train_tokens=train_tokens)


def dominates(a: tuple, b: tuple) -> bool:
    """Point a (Figures.point) is no worse than b on every figure: no slower, no more memory per
    GPU, no more GPUs and (priced) no more dollars per step. Equal points dominate each other:
    they are one choice on every figure the user sees."""
    return all(x <= y for x, y in zip(a, b))
