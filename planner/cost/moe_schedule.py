"""A MoE layer as Megatron runs it: its compute, its token all-to-alls and the host thread that
issues them, placed on the GPU's streams. Times are seconds, per layer and micro-batch.

A MoE layer is four units (megatron/core/models/gpt/fine_grained_callables.py): pre-dispatch
(attention, pre-MLP norm, shared expert, router, permutation), dispatch (all-to-all), experts,
combine (all-to-all, then unpermutation and residual). Their order, forward and backward:

- Plain schedule (Megatron's MoELayer): pre_f, dispatch_f, experts_f, combine_f one after the
  other on one stream, and later the backward in reverse (combine_b, experts_b with its weight
  gradients, dispatch_b, pre_b). The all-to-alls sit on the critical path, but for what
  --moe-shared-expert-overlap runs beside them (the shared expert's fc1 and fc2).
- EP-overlap schedule (--overlap-moe-expert-parallel-comm; model_chunk_schedule_plan.py,
  TransformerLayerSchedulePlan.run, Megatron-LM d98e8a6): the forward of one micro-batch and the
  backward of another merged layer by layer, the all-to-alls on a communication stream. The host
  issues, in order:

      comm stream:  combine_b        | dispatch_f -> dispatch_b            | combine_f
      comp stream:  pre_f            | experts_b -> experts_b weight -> experts_f | pre_b (-> weight)

  with the data dependencies experts_b <- combine_b, dispatch_f <- pre_f, dispatch_b <- experts_b,
  experts_f <- dispatch_f, combine_f <- experts_f, pre_b <- dispatch_b; the next pair's pre_f waits
  for this combine_f, its combine_b for this pre_b. Without --delay-wgrad-compute a unit's
  backward computes its weight gradients before it returns (dispatch_b then waits for them).
  The pipeline's warm-up forwards and cool-down backwards run alone (f or b is None).

The communication kernels take SMs from the GEMMs they run beside: NCCL's all-to-all one CTA
per p2p channel, DeepEP / HybridEP the SM count they are configured with (MoENodes
comm_sm_share: that count over the GPU's SMs, cost/compute.py). A compute unit that runs beside
an all-to-all of `a` seconds on a share `c` of the SMs does its work at (1 - c) of its speed
while they overlap, so its `d` seconds become (sm_shared_s)

    d + min(d, a (1 - c)) c / (1 - c)        = d + c min(d / (1 - c), a),

i.e. d / (1 - c) when it ends first, d + c a when it outlasts the all-to-all. Each all-to-all of
the EP-overlap schedule is taken as running beside the compute it is paired with in the diagram
above for as long as both last (its partner group: combine_b | pre_f, dispatch_f | experts_b,
dispatch_b | experts_b weight + experts_f, combine_f | pre_b + pre_b weight), the whole charge
of a group on its first unit: an upper bound where the schedule delays the all-to-all (it may
start after its partner), exact where it starts with it; and the group's total is right when it
spans two units (charging the first alone keeps every period monotone in every weight). The
all-to-all itself is not slowed (its own SMs), nor the GPU work that the combine units run on
the communication stream (compute beside compute is not modelled). In the plain schedule only
--moe-shared-expert-overlap runs compute beside an all-to-all (the shared expert's fc1 / fc2).

Dropless routing makes the host wait for the GPU once per forward, before dispatch_f, for the
token counts the router produced (token_dispatcher.py: cuda_sync_point "before_ep_alltoall", or
"before_finish" without EP); with padding to capacity or the all-gather dispatcher it does not.

Each operation is placed by a list schedule: it starts once the host has begun issuing it, its
stream is free and its inputs are ready; it ends no sooner than its GPU time after that and no
sooner than the host finishes issuing its kernels. A layer's time is the steady-state period of
a chain of such layers (a micro-batch runs a stage's layers back to back), so the GPU waits for
a slow host, a slow host hides under a busy GPU, and an all-to-all hides only under the work the
schedule really places beside it. Every placement is a max of sums, so one layer maps the
times a chain has reached (the host's cursor, each stream's free time, the forward's output
and the backward's input gradient) max-plus linearly to the next layer's, and the period is
that map's largest cycle mean (Karp 1978), exact, where a finite chain can still be in its
transient.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

# "Not yet": the time of a state that nothing has reached (the identity of max).
_NEVER = float("-inf")


@dataclass(frozen=True)
class ScheduleNode:
    """One unit of a MoE layer for one micro-batch: GPU seconds of its forward, input-gradient
    (incl. the recompute of its parts) and weight-gradient work, and the host seconds to issue
    them."""
    forward_s: float
    backward_s: float
    weight_s: float
    host_forward_s: float
    host_backward_s: float    # input- and weight-gradient kernels (and recompute)


@dataclass(frozen=True)
class MoENodes:
    """A MoE layer's compute units and how its dispatcher talks to the host."""
    pre: ScheduleNode          # attention .. permutation
    experts: ScheduleNode      # routed experts (between dispatch and combine)
    post: ScheduleNode         # after the combine all-to-all: unpermutation, residual
    host_a2a_s: float          # host seconds to issue one all-to-all
    synced: bool               # the host waits for the token counts before dispatching
    shared_forward_s: float = 0.0   # the shared expert's forward GEMMs (part of pre)
    comm_sm_share: float = 0.0      # SMs the all-to-all kernels hold while they run / the GPU's SMs

    def __post_init__(self):
        if not 0.0 <= self.comm_sm_share < 1.0:
            raise ValueError(f"MoENodes.comm_sm_share: {self.comm_sm_share}; expected a share of the GPU's "
                             "SMs in [0, 1) (the communication kernels must leave the GEMMs some)")


@dataclass(frozen=True)
class A2A:
    """GPU seconds of one MoE layer's all-to-alls per micro-batch, forward (dispatch + combine)
    and backward (their mirrors); each direction's two are taken as equal halves."""
    forward_s: float
    backward_s: float


NO_A2A = A2A(0.0, 0.0)


def sm_shared_s(compute_s: float, comm_s: float, share: float) -> float:
    """Seconds of `compute_s` of GPU work run beside a communication kernel of `comm_s` seconds
    that holds `share` of the SMs: the work runs at (1 - share) of its speed while both last,
    d + min(d, a (1 - share)) share / (1 - share) (module docstring). Increases with d and a."""
    if share <= 0.0 or comm_s <= 0.0 or compute_s <= 0.0:
        return compute_s
    return compute_s + share * min(compute_s / (1.0 - share), comm_s)


def _group_charge_s(units: tuple[float, ...], comm_s: float, share: float) -> float:
    """What a group of units run back to back beside one communication kernel loses to it in
    all (sm_shared_s of their sum, less the sum)."""
    total = sum(units)
    return sm_shared_s(total, comm_s, share) - total


class _Timeline:
    """The host's cursor and each stream's free time; `op` places one operation."""

    def __init__(self, streams: bool):
        self.host = 0.0
        self.free = {"comp": 0.0, "comm": 0.0}
        self.comm = "comm" if streams else "comp"

    def op(self, stream: str, gpu_s: float, host_s: float, after: float = _NEVER, sync: float | None = None) -> float:
        if sync is not None:             # the host blocks until the GPU gets there
            self.host = max(self.host, sync)
        stream = self.comm if stream == "comm" else stream
        issue_start = self.host
        self.host += host_s
        end = max(max(issue_start, self.free[stream], after) + gpu_s, self.host)
        self.free[stream] = end
        return end


def _layer(tl: _Timeline, n: MoENodes, a2a: A2A, f: bool, b: bool, delay_wgrad: bool, shared_overlap: bool,
           f_in: float, b_in: float) -> tuple[float, float]:
    """Places one layer's forward (f) and / or backward (b) in TransformerLayerSchedulePlan.run's
    order (which for f or b alone is the plain MoELayer order). f_in / b_in: when the input / the
    output gradient is ready. Returns when the output / the input gradient is ready.
    shared_overlap (--moe-shared-expert-overlap, plain schedule only): the shared expert's fc1
    runs on its own stream beside the dispatch and its fc2 beside the combine
    (token_dispatcher.py); taken as half of its forward GEMM time each.
    Compute beside an all-to-all is charged the SMs its kernels hold (module docstring): in a
    merged pair each all-to-all's partner group, with the plain schedule the shared expert."""
    pre, exp, post = n.pre, n.experts, n.post
    h = n.host_a2a_s
    shared = n.shared_forward_s if shared_overlap and f and not b else 0.0
    split = delay_wgrad and f and b
    a_f, a_b = a2a.forward_s / 2, a2a.backward_s / 2      # one all-to-all of each direction
    # GPU seconds of the compute units, with the SMs the all-to-all beside them takes: only a
    # merged pair on two streams places compute beside an all-to-all
    c = n.comm_sm_share if f and b and tl.comm == "comm" else 0.0
    pre_f_s = pre.forward_s - shared
    mlp_b_s = exp.backward_s + (0.0 if split else exp.weight_s)
    exp_w_s = exp.weight_s if split else 0.0
    pre_b_s = pre.backward_s + (0.0 if split else pre.weight_s)
    pre_w_s = pre.weight_s if split else 0.0
    if c > 0.0:
        pre_f_s += _group_charge_s((pre_f_s,), a_b, c)                      # beside combine_b
        mlp_b_s += _group_charge_s((mlp_b_s,), a_f, c)                      # beside dispatch_f
        if split:                                                           # beside dispatch_b
            exp_w_s += _group_charge_s((exp_w_s, exp.forward_s), a_b, c)
            mlp_f_s = exp.forward_s
        else:
            mlp_f_s = exp.forward_s + _group_charge_s((exp.forward_s,), a_b, c)
        pre_b_s += _group_charge_s((pre_b_s, pre_w_s), a_f, c)              # beside combine_f
    else:
        mlp_f_s = exp.forward_s
    # the shared expert's fc1 / fc2 beside the forward all-to-alls (plain schedule)
    shared_half = sm_shared_s(shared / 2, a_f, n.comm_sm_share) if shared else 0.0
    f_out, b_out = f_in, b_in
    if b:
        combine_b = tl.op("comm", a_b + post.backward_s + post.weight_s, h + post.host_backward_s, after=b_in)
    if f:
        pre_f = tl.op("comp", pre_f_s, pre.host_forward_s, after=f_in)
    if b:
        mlp_b = tl.op("comp", mlp_b_s, exp.host_backward_s / (2 if split else 1), after=combine_b)
    if f:
        dispatch_f = tl.op("comm", max(a_f, shared_half), h, after=pre_f, sync=pre_f if n.synced else None)
    if b:
        if split:
            tl.op("comp", exp_w_s, exp.host_backward_s / 2)
        dispatch_b = tl.op("comm", a_b, h, after=mlp_b)
    if f:
        mlp_f = tl.op("comp", mlp_f_s, exp.host_forward_s, after=dispatch_f)
        f_out = tl.op("comm", max(a_f, shared_half) + post.forward_s, h + post.host_forward_s, after=mlp_f)
    if b:
        b_out = tl.op("comp", pre_b_s, pre.host_backward_s / (2 if split else 1), after=dispatch_b)
        if split:
            tl.op("comp", pre_w_s, pre.host_backward_s / 2)
    return f_out, b_out


def _layer_map(n: MoENodes, a2a: A2A, f: bool, b: bool, overlap: bool, delay_wgrad: bool,
               shared_overlap: bool) -> list[list[float]]:
    """The max-plus matrix of one layer: entry [i][j] is how long after state j (host cursor,
    compute stream, communication stream, forward output, backward input gradient) state i can
    be at the end of the layer at the latest (_NEVER: it does not depend on it). Column j is
    one layer placed from state j alone at time 0."""
    cols = []
    for j in range(5):
        x = [_NEVER] * 5
        x[j] = 0.0
        tl = _Timeline(streams=overlap)
        tl.host, tl.free["comp"], tl.free["comm"] = x[0], x[1], x[2]
        f_out, b_out = _layer(tl, n, a2a, f, b, delay_wgrad and overlap, shared_overlap and not overlap, x[3], x[4])
        cols.append((tl.host, tl.free["comp"], tl.free["comm"], f_out, b_out))
    return [[cols[j][i] for j in range(5)] for i in range(5)]


def _max_cycle_mean(a: list[list[float]]) -> float:
    """Largest mean weight of a cycle of the graph with an edge j -> i of weight a[i][j]: the
    growth per step of x -> a (x) x (Karp's algorithm, with a source tied to every node)."""
    n = len(a)
    d = [[0.0] * n]            # d[k][v]: heaviest walk of k edges ending at v
    for k in range(1, n + 1):
        d.append([max(d[k - 1][u] + a[v][u] for u in range(n)) for v in range(n)])
    best = _NEVER
    for v in range(n):
        if d[n][v] == _NEVER:
            continue
        best = max(best, min((d[n][v] - d[k][v]) / (n - k) for k in range(n) if d[k][v] != _NEVER))
    return best


@lru_cache(maxsize=65536)
def layer_period_s(n: MoENodes, a2a: A2A, f: bool, b: bool, overlap: bool, delay_wgrad: bool,
                   shared_overlap: bool = False) -> float:
    """Steady-state seconds per layer of a chain of layers run forward (f), backward (b) or as
    merged pairs (f and b, the EP-overlap schedule; overlap puts the all-to-alls on their own
    stream): the largest cycle mean of one layer's max-plus map."""
    return _max_cycle_mean(_layer_map(n, a2a, f, b, overlap, delay_wgrad, shared_overlap))


def moe_layer_s(n: MoENodes, a2a: A2A, overlap: bool, delay_wgrad: bool, alone_share: float,
                shared_overlap: bool = False) -> float:
    """Seconds per MoE layer and micro-batch (one forward and one backward). Plain schedule: the
    forward and the backward run alone. EP-overlap: merged pairs, but for `alone_share` of the
    chunk steps (the pipeline's warm-up / cool-down), which run alone."""
    alone = (layer_period_s(n, a2a, True, False, overlap, delay_wgrad, shared_overlap)
             + layer_period_s(n, a2a, False, True, overlap, delay_wgrad, shared_overlap))
    if not overlap:
        return alone
    pair = layer_period_s(n, a2a, True, True, True, delay_wgrad)
    return (1.0 - alone_share) * pair + alone_share * alone


@lru_cache(maxsize=65536)
def moe_layer_seconds(n: MoENodes, a2a: A2A, overlap: bool, delay_wgrad: bool, alone_share: float,
                      rerun: bool = False, full_recompute: bool = False,
                      shared_overlap: bool = False) -> tuple[float, float]:
    """(compute, exposed all-to-all) seconds of one MoE layer per micro-batch: compute is the
    layer's time with its all-to-alls taking no time (its GPU work and the host issuing it, as
    the schedule places them), exposed what the all-to-alls add to that. `rerun`: the backward
    re-runs the MoE forward, all-to-alls included (full recompute, or --recompute-modules moe);
    under a full recompute that forward (plain schedule) is compute too."""
    base0 = moe_layer_s(n, NO_A2A, overlap, delay_wgrad, alone_share, shared_overlap)
    base = moe_layer_s(n, a2a, overlap, delay_wgrad, alone_share, shared_overlap)
    compute, exposed = base0, base - base0
    if rerun:
        fa0 = layer_period_s(n, NO_A2A, True, False, False, False)
        exposed += layer_period_s(n, a2a, True, False, False, False) - fa0
        if full_recompute:
            compute += fa0
    return compute, exposed


@lru_cache(maxsize=65536)
def moe_layer_floor_s(n: MoENodes, a2a: A2A, overlap: bool, delay_wgrad: bool, rerun: bool = False,
                      full_recompute: bool = False, shared_overlap: bool = False) -> float:
    """The least compute + exposed of moe_layer_seconds over every warm-up share (linear in it).
    That sum is the layer's time with its all-to-alls (moe_layer_s) and, with `rerun`, the
    re-run forward with its all-to-alls less the one without them (exposed), plus under a full
    recompute that one again (compute): so the periods without all-to-alls are not needed but
    for a rerun that is not a full recompute."""
    out = min(moe_layer_s(n, a2a, overlap, delay_wgrad, share, shared_overlap) for share in (0.0, 1.0))
    if rerun:
        out += layer_period_s(n, a2a, True, False, False, False)
        if not full_recompute:
            out -= layer_period_s(n, NO_A2A, True, False, False, False)
    return out
