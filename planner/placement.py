"""Placement semantics: each training state has a mode along each parallel axis.

States: parameters, gradients, optimizer, activations. Modes: replicated, sharded,
sharded-with-gather (sharded at rest, gathered when used: ZeRO-3/FSDP), materialized (rebuilt on
demand: recomputed activations), offloaded (host memory). ZeRO 1-3, Megatron's distributed
optimizer, FSDP/HSDP, TP, SP, CP, PP and EP are tables of modes, derived by `placement_of`.

From the table alone follow (a) per-rank shard factors (memory.py multiplies bytes by them) and
(b) the data-axis collectives a step needs (`data_collectives`), as in the placement-semantics
paper: DP all-reduce 2 Psi, ZeRO-1/2 reduce-scatter + all-gather 2 Psi, ZeRO-3 3 Psi.
`validate` checks the paper's two conditions (gradient integrity, state consistency) and the
composition rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cached_property, lru_cache

from .errors import InvalidStrategy
from .strategy import Strategy


class Mode(str, Enum):
    REPLICATED = "replicated"
    SHARDED = "sharded"
    SHARDED_GATHER = "sharded-with-gather"
    MATERIALIZED = "materialized"
    OFFLOADED = "offloaded"


STATES = ("parameters", "gradients", "optimizer", "activations")
# Parameter groups differ in how they are laid out: dense weights are split by TP; norms and the
# router are replicated over TP; routed experts are split by EP x expert-TP and their data axis is
# the expert-data-parallel group.
GROUPS = ("dense", "norms", "experts")
_SHARED_FACTORS: dict = {}     # Placement._factors of the tables alike but for pp
_SHARED_FACTORS_MAX = 65536    # tables kept before the cache starts over (each holds a few dozen floats)
AXES = ("dp", "cp", "tp", "pp", "ep", "etp", "edp")
MODEL_AXES = ("tp", "ep", "etp")   # pp splits by layer assignment, not by a factor
DATA_AXES = {"dense": "dp", "norms": "dp", "experts": "edp"}  # the axis gradients reduce over


@dataclass(frozen=True)
class Placement:
    """modes[(state, group)] = {axis: Mode}; sizes = {axis: degree}."""
    modes: tuple[tuple[tuple[str, str], tuple[tuple[str, Mode], ...]], ...]
    sizes: tuple[tuple[str, int], ...]
    hsdp_shard_size: int | None = None   # HSDP: shard over this many ranks, replicate beyond
    # share of an offloaded state kept in host memory (Megatron --optimizer-offload-fraction);
    # the rest stays on the GPU, sharded like the distributed optimizer's state
    offload_fraction: float = 1.0

    @cached_property
    def _mode_map(self) -> dict:
        return {key: dict(axes) for key, axes in self.modes}

    @cached_property
    def _size_map(self) -> dict:
        return dict(self.sizes)

    def mode(self, state: str, group: str, axis: str) -> Mode:
        return self._mode_map.get((state, group), {}).get(axis, Mode.REPLICATED)

    def size(self, axis: str) -> int:
        return self._size_map.get(axis, 1)

    def shard_factor(self, state: str, group: str) -> float:
        """Fraction of a stage's bytes of a state that one rank holds in GPU memory at rest.
        (The pp axis splits by layer assignment, not by a factor: a stage owns its layers.)"""
        key = (state, group)
        f = self._factors.get(key)
        if f is None:
            f = self._factors[key] = self._compute_shard_factor(state, group)
        return f

    @cached_property
    def _factors(self) -> dict:
        # no factor depends on the pp degree (a stage owns its layers): tables that differ only
        # in pp share one cache, which the search, building a table per pipeline depth, reuses
        key = (self.modes, tuple(x for x in self.sizes if x[0] != "pp"), self.hsdp_shard_size, self.offload_fraction)
        f = _SHARED_FACTORS.get(key)
        if f is None:
            if len(_SHARED_FACTORS) > _SHARED_FACTORS_MAX:
                _SHARED_FACTORS.clear()
            f = _SHARED_FACTORS[key] = {}
        return f

    def model_shard_factor(self, group: str) -> float:
        """Fraction of a stage's parameters of a group one rank computes with: the model axes
        only (tp; ep x etp for experts), before any data-axis (ZeRO) sharding."""
        key = ("model", group)
        f = self._factors.get(key)
        if f is None:
            f = self._factors[key] = self._compute_model_shard_factor(group)
        return f

    def _compute_model_shard_factor(self, group: str) -> float:
        f = 1.0
        for axis in MODEL_AXES:
            if self.mode("parameters", group, axis) in (Mode.SHARDED, Mode.SHARDED_GATHER):
                f /= self.size(axis)
        return f

    def rank_params(self, params) -> float:
        """Parameters one rank computes with, from a StageParams-like (dense, norms, experts)."""
        return sum(getattr(params, g) * self.model_shard_factor(g) for g in GROUPS)

    def state_params(self, state: str, params) -> float:
        """Parameters' worth of `state` one rank holds in GPU memory, from a StageParams-like."""
        f = self._factors.get(state)    # the search asks this millions of times: one tuple per state
        if f is None:
            f = self._factors[state] = tuple(self.shard_factor(state, g) for g in GROUPS)
        return params.dense * f[0] + params.norms * f[1] + params.experts * f[2]

    def host_factor(self, state: str, group: str) -> float:
        """Fraction of a stage's bytes of a state that one rank keeps in host memory."""
        key = ("host", state, group)
        h = self._factors.get(key)
        if h is None:
            f, offloaded = self._sharded_factor(state, group)
            h = self._factors[key] = f * self.offload_fraction if offloaded else 0.0
        return h

    def _sharded_factor(self, state: str, group: str) -> tuple[float, bool]:
        """(fraction one rank holds if offloaded axes count as sharded, any axis offloaded?)"""
        f, offloaded = 1.0, False
        for axis in AXES:
            if axis == "pp":
                continue
            m = self.mode(state, group, axis)
            n = self.size(axis)
            if m in (Mode.SHARDED, Mode.SHARDED_GATHER, Mode.OFFLOADED):
                if axis in ("dp", "edp") and self.hsdp_shard_size:
                    n = min(n, self.hsdp_shard_size)
                f /= n
                offloaded = offloaded or m is Mode.OFFLOADED
        return f, offloaded

    def _compute_shard_factor(self, state: str, group: str) -> float:
        f, offloaded = self._sharded_factor(state, group)
        return f * (1.0 - self.offload_fraction) if offloaded else f

    def table(self) -> list[dict]:
        """The table as rows for display/JSON."""
        rows = []
        for (state, group), axes in self.modes:
            rows.append({"state": state, "group": group,
                         **{a: m.value for a, m in axes if self.size(a) > 1 or a == "pp"}})
        return rows


def placement_of(s: Strategy) -> Placement:
    """The placement table of a strategy. Model axes (tp, pp, ep, etp) shard weights; data axes
    (dp, cp, edp) replicate or shard them according to the ZeRO stage."""
    return _placement(s.zero_stage, s.offload_optimizer, s.sp, s.recompute,
                      (("dp", s.dp), ("cp", s.cp), ("tp", s.tp), ("pp", s.pp), ("ep", s.ep),
                       ("etp", s.expert_tp), ("edp", s.expert_dp)), s.optimizer_offload_fraction)


@lru_cache(maxsize=4096)   # the search builds the same few thousand tables many times
def _placement(z: int, offload_optimizer: bool, sp: bool, recompute: str, sizes: tuple,
               offload_fraction: float = 1.0) -> Placement:
    R, S, G, M, O = Mode.REPLICATED, Mode.SHARDED, Mode.SHARDED_GATHER, Mode.MATERIALIZED, Mode.OFFLOADED
    # Megatron's DDP and distributed optimizer use the data-parallel group *with* context
    # parallel ranks (parallel_state: get_data_parallel_group(with_context_parallel=True)); the
    # data axis of dense weights is therefore dp x cp, represented as both axes sharded.
    data_param = G if z >= 3 else R
    data_grad = S if z >= 2 else R
    data_opt = O if offload_optimizer else (S if z >= 1 else R)
    modes = {}
    for group in GROUPS:
        model_axes = {"pp": S}
        if group == "dense":
            model_axes["tp"] = S
        elif group == "experts":
            model_axes.update({"ep": S, "etp": S})
        data_axes = ("edp",) if group == "experts" else ("dp", "cp")
        for state, dm in (("parameters", data_param), ("gradients", data_grad), ("optimizer", data_opt)):
            axes = dict(model_axes)
            for a in data_axes:
                axes[a] = dm
            modes[(state, group)] = tuple(axes.items())
    # Activations: split by samples (dp), sequence (cp), layers (pp). Along tp they are split
    # with SP, else partly replicated (Korthikanti et al. 2022: the 10 sbh term). Recomputed
    # activations are 'materialized' (rebuilt in backward).
    act = {"dp": S, "cp": S, "pp": S, "tp": S if sp else R, "ep": S}
    if recompute == "full":
        act["layer"] = M
    elif recompute == "selective":
        act["core_attention"] = M
    modes[("activations", "all")] = tuple(act.items())
    return Placement(modes=tuple(modes.items()), sizes=sizes, offload_fraction=offload_fraction)


_ORDER = {Mode.REPLICATED: 0, Mode.SHARDED: 1, Mode.SHARDED_GATHER: 1, Mode.OFFLOADED: 1}


def validate(p: Placement) -> None:
    """Raise InvalidStrategy naming the rule a placement breaks.

    - gradient-integrity: along a data axis of size > 1, a parameter whose compute is replicated
      (replicated or gathered) must have its gradient reduced over exactly that axis:
      gradient mode replicated (all-reduce) or sharded (reduce-scatter); nothing else.
    - state-consistency: along a data axis, sharding may only grow from parameters to gradients
      to optimizer state (params sharded => grads sharded => optimizer sharded/offloaded),
      else replicas update from different gradients and drift apart.
    - model-axis consistency: along tp/pp/ep/etp, parameters, gradients and optimizer state are
      split the same way (a shard's optimizer updates exactly that shard).
    - activations cannot be offloaded or gathered along model axes in this model.
    """
    for group in GROUPS:
        for axis in ("dp", "cp", "edp"):
            if group == "experts" and axis != "edp" or group != "experts" and axis == "edp":
                continue
            if p.size(axis) <= 1:
                continue
            pm = p.mode("parameters", group, axis)
            gm = p.mode("gradients", group, axis)
            om = p.mode("optimizer", group, axis)
            if pm in (Mode.REPLICATED, Mode.SHARDED_GATHER) and gm not in (Mode.REPLICATED, Mode.SHARDED):
                raise InvalidStrategy("gradient-integrity",
                                      f"{group} gradients along {axis} are {gm.value}: they must be reduced "
                                      "over the ranks that computed them (replicated = all-reduce, "
                                      "sharded = reduce-scatter)")
            if pm is Mode.SHARDED:
                raise InvalidStrategy("gradient-integrity",
                                      f"{group} parameters are plainly sharded along data axis {axis}: each "
                                      "rank would compute with a part of the weights; use sharded-with-gather")
            if not (_ORDER.get(pm, 9) <= _ORDER.get(gm, 9) <= _ORDER.get(om, 9)):
                raise InvalidStrategy("state-consistency",
                                      f"{group} along {axis}: parameters {pm.value}, gradients {gm.value}, "
                                      f"optimizer {om.value}; sharding must not shrink from parameters to "
                                      "gradients to optimizer state")
        for axis in ("tp", "pp", "ep", "etp"):
            ms = {p.mode(st, group, axis) for st in ("parameters", "gradients", "optimizer")}
            if len(ms) > 1:
                raise InvalidStrategy("model-axis-consistency",
                                      f"{group} along {axis}: parameters/gradients/optimizer modes differ "
                                      f"({', '.join(sorted(m.value for m in ms))})")
    for axis in ("tp", "pp", "ep"):
        if p.mode("activations", "all", axis) in (Mode.OFFLOADED, Mode.SHARDED_GATHER):
            raise InvalidStrategy("composition", f"activations along {axis} cannot be offloaded or gathered")


@dataclass(frozen=True)
class DataCollective:
    """A data-axis collective of one parameter group, in units of that group's parameters."""
    group: str
    kind: str            # all-reduce | reduce-scatter | all-gather
    tensor: str          # gradients | parameters
    when: str            # per-step | per-microbatch-forward | per-microbatch-backward
    params_fraction: float = 1.0


def data_collectives(p: Placement) -> list[DataCollective]:
    """Collectives along the data axes that the placement implies (ZeRO paper, sec. 7)."""
    out = []
    for group in GROUPS:
        axis = DATA_AXES[group]
        n = p.size(axis) * (p.size("cp") if group != "experts" else 1)
        if n <= 1:
            continue
        pm = p.mode("parameters", group, axis)
        gm = p.mode("gradients", group, axis)
        om = p.mode("optimizer", group, axis)
        if pm is Mode.SHARDED_GATHER:
            out.append(DataCollective(group, "all-gather", "parameters", "per-microbatch-forward"))
            out.append(DataCollective(group, "all-gather", "parameters", "per-microbatch-backward"))
            out.append(DataCollective(group, "reduce-scatter", "gradients", "per-microbatch-backward"))
        elif gm is Mode.SHARDED:
            out.append(DataCollective(group, "reduce-scatter", "gradients", "per-microbatch-backward"))
            out.append(DataCollective(group, "all-gather", "parameters", "per-step"))
        elif om in (Mode.SHARDED, Mode.OFFLOADED):
            out.append(DataCollective(group, "reduce-scatter", "gradients", "per-step"))
            out.append(DataCollective(group, "all-gather", "parameters", "per-step"))
        else:
            out.append(DataCollective(group, "all-reduce", "gradients", "per-step"))
    return out
