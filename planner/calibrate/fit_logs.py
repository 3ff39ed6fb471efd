"""Fitting compute scales and link bandwidths to Megatron-LM training logs.

Each log is checked against its launch (world size, degrees, model, batch, the FLOPs its
throughput implies) and reduced to its steady-state iteration time (steady.py). The parameters
are those the logs determine: least squares in log space of predicted / measured iteration
time, each log weighted by its uncertainty (its median's standard error and the model's own
error), a parameter kept only while its standard error stays under MAX_REL_STDERR. Compute
scales (per GPU kind) come first, then link bandwidths that no nccl-tests measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import median

import numpy as np

from ..errors import SpecError
from ..specs.calibration import Key, Value, all_keys, bounds, current_value
from .fit_model import LEVEL_ORDER, cluster_with
from .megatron_log import MegatronLog, parse_log
from .steady import SteadyState, steady_state

# The planner's own iteration-time error on published dense runs (docs/accuracy.md: 2-4% MAPE, rows
# up to 7.7%): two logs whose residuals differ by less than this cannot tell one parameter from model error.
MODEL_TIME_ERROR = 0.05
# A parameter the logs pin to within 20% (one standard error, relative) is determined; beyond
# that it stays at its profile value (planner assumption).
MAX_REL_STDERR = 0.20
# Relative step of the numerical derivatives (d ln t / d ln parameter).
JACOBIAN_STEP = 0.01
# The log's throughput x time x world size must agree with the planner's FLOPs count of the
# launch to within this factor: Megatron's count differs by version (causal attention halved
# since 2025, SwiGLU counted as two matrices in 2024) by up to ~25%; a world size or a model off
# by 2x lands outside (the geometric midpoint of 1 and 2).
FLOPS_AGREEMENT = math.sqrt(2)
# A log residual beyond this after the fit, with a parameter at a physical bound, means the log
# cannot be this launch on this cluster.
MAX_RESIDUAL_AT_BOUND = 0.03


@dataclass(frozen=True)
class LogInput:
    """A Megatron-LM log and the launch (script, flags file or plan JSON) it is the log of."""
    log: str
    launch: str


@dataclass
class LogCase:
    """One log read and checked against its launch, with the predictions before and after."""
    inp: LogInput
    log: MegatronLog
    model: object
    strategy: object
    steady: SteadyState
    ignored_flags: tuple
    before_s: float = 0.0
    after_s: float = 0.0
    sigma: float = MODEL_TIME_ERROR
    memory: list = field(default_factory=list)
    fits_before: bool | None = None
    fits_after: bool | None = None


def _check_log(case_log: MegatronLog, launch_path: str, model, s, iters) -> None:
    """Refuse a log that is not of this launch: world size and degrees (start-up line), model and
    batch (arguments dump, iteration lines), and the FLOPs its throughput implies."""
    from ..cost.compute import model_flops_per_step
    path = case_log.path
    deg = f"tp {s.tp} x pp {s.pp} x dp {s.dp} x cp {s.cp}"
    want = {"world_size": s.world_size, "data_parallel_size": s.dp, "context_parallel_size": s.cp,
            "tensor_model_parallel_size": s.tp, "pipeline_model_parallel_size": s.pp,
            "expert_model_parallel_size": s.ep, "num_layers": model.num_layers, "hidden_size": model.hidden_size,
            "num_attention_heads": model.num_attention_heads, "ffn_hidden_size": model.ffn_hidden_size,
            "seq_length": s.seq_length, "micro_batch_size": s.micro_batch_size,
            "global_batch_size": s.global_batch_size, "num_experts": model.num_experts}
    for run in case_log.runs:
        for k, (v, line) in run.world.items():
            if v != want[k]:
                what = "world size" if k == "world_size" else k.replace("_", " ")
                hint = "; without torchrun sizes a launch takes the whole cluster" if k == "world_size" else ""
                raise SpecError(path, f"line {line}", f"the log's {what} is {v}, launch {launch_path} has "
                                f"{want[k]} ({s.world_size} GPUs: {deg}{hint}): not the log of this launch")
        for k, (text, line) in run.args.items():
            if k in want and want[k] is not None and text.strip().isdigit() and int(text) != want[k]:
                raise SpecError(path, f"line {line}", f"the log's {k} is {text.strip()}, launch {launch_path} has "
                                f"{want[k]}: not the log of this launch")
    sizes = {it.global_batch_size for it in iters if it.global_batch_size is not None}
    if sizes and s.global_batch_size not in sizes:
        raise SpecError(path, f"line {iters[0].line}", f"global batch size {', '.join(map(str, sorted(sizes)))} in "
                        f"the log, {s.global_batch_size} in launch {launch_path}: not the log of this launch")
    rated = [it for it in iters[1:] if it.tflops_per_gpu and it.global_batch_size == s.global_batch_size]
    if rated:
        implied = median([it.tflops_per_gpu * 1e12 * it.elapsed_s * s.world_size for it in rated])
        full = model_flops_per_step(model, s)
        # the attention term a S^2 from two evaluations (F = l S + a S^2): Megatron halves it for
        # the causal mask since 2025
        half = model_flops_per_step(model, replace(s, seq_length=max(1, s.seq_length // 2)))
        attn = max(0.0, 2 * (full - 2 * half)) if s.seq_length % 2 == 0 else 0.0
        lo, hi = (full - attn / 2) / FLOPS_AGREEMENT, full * FLOPS_AGREEMENT
        if not lo <= implied <= hi:
            raise SpecError(path, f"line {rated[0].line}", f"throughput per GPU x time x {s.world_size} GPUs = "
                            f"{implied / 1e15:.4g} PFLOP per iteration, launch {launch_path} is "
                            f"{full / 1e15:.4g} PFLOP ({model.name}, {deg}): another world size or model")


def _load_launch(path: str, cluster):
    """(model, strategy, the flags the launch gives, as written) of a Megatron launch file or a
    plan JSON: anything `planner check` reads."""
    from ..megatron.check import is_plan_json, load_launch, load_plan_or_launch
    if is_plan_json(path):
        model, s = load_plan_or_launch(path, cluster, None)
        return model, s, ()
    ld = load_launch(path, cluster, None)
    return ld.model, ld.strategy, tuple(ld.launch.given.values())


def log_case(inp: LogInput, before) -> LogCase:
    """A log read, checked against its launch (priced on `before`) and reduced to its steady state."""
    log = parse_log(inp.log)
    iters = log.iterations
    if not iters:
        raise SpecError(inp.log, None, "no Megatron iteration lines ('iteration N/ M | ... | elapsed time per "
                        "iteration (ms): ...'): not a training log, or training never logged")
    model, s, ignored = _load_launch(inp.launch, before)
    _check_log(log, inp.launch, model, s, iters)
    st = steady_state(log, s.global_batch_size)
    if st is None:
        raise SpecError(inp.log, None, f"no steady-state iteration line: {len(iters)} line(s), all warm-up, "
                        "skipped/nan or at another batch size")
    return LogCase(inp=inp, log=log, model=model, strategy=s, steady=st, ignored_flags=ignored,
                   sigma=math.hypot(st.relative_error, MODEL_TIME_ERROR))


def step_time(case: LogCase, cluster) -> float:
    """The planner's iteration time of the log's launch on `cluster`."""
    from ..estimate import estimate
    return estimate(case.model, cluster, case.strategy).step_time_s


def _residuals(cases, base, values) -> np.ndarray:
    cl = cluster_with(base, values)
    return np.array([math.log(step_time(c, cl) / c.steady.measured_s) / c.sigma for c in cases])


def _jacobian(cases, base, values, keys) -> np.ndarray:
    """d(weighted ln residual) / d ln parameter, central differences."""
    cols = []
    for k in keys:
        v = values[k].value
        up = _residuals(cases, base, {**values, k: Value(v * math.exp(JACOBIAN_STEP))})
        dn = _residuals(cases, base, {**values, k: Value(v * math.exp(-JACOBIAN_STEP))})
        cols.append((up - dn) / (2 * JACOBIAN_STEP))
    return np.array(cols).T if cols else np.zeros((len(cases), 0))


def _stderr(J: np.ndarray) -> np.ndarray | None:
    """Relative standard errors of the parameters (J is weighted); None if not identifiable."""
    H = J.T @ J
    if J.shape[1] == 0 or np.linalg.cond(H) > 1e10:
        return None
    return np.sqrt(np.diag(np.linalg.inv(H)))


def fit_logs(cases: list[LogCase], base, values: dict, fixed: set, reasons: dict) -> list[Key]:
    """Choose the parameters the logs determine and fit them; returns the chosen keys."""
    cands = [k for k in all_keys(base) if k.field == "compute_time_scale"]
    links = [k for k in all_keys(base) if k.field in LEVEL_ORDER and k not in fixed]
    full = {k: values.get(k, Value(current_value(base, k))) for k in cands + links}
    work = {**values, **full}
    J0 = _jacobian(cases, base, work, cands + links)
    sens = {k: float(np.max(np.abs(J0[:, i] * np.array([c.sigma for c in cases])))) for i, k in enumerate(cands + links)}
    order = sorted(cands, key=lambda k: -sens[k]) + sorted(links, key=lambda k: -sens[k])
    chosen: list[Key] = []
    for k in order:
        if sens[k] < 1e-6:
            reasons.setdefault(k, "no log ran on this GPU kind" if k in cands else "no logged launch uses this link")
            continue
        if len(chosen) + 1 > len(cases):
            reasons.setdefault(k, f"the logs determine {len(chosen)} parameter(s) at most ({len(cases)} log(s)); "
                                  f"this one moves their iteration time by {sens[k]:.2f}% per %")
            continue
        trial = chosen + [k]
        J = _jacobian(cases, base, work, trial)
        se = _stderr(J)
        if se is None or float(np.max(se)) > MAX_REL_STDERR:
            shown = "not separable from the others" if se is None else f"+-{float(se[-1]):.0%}"
            reasons.setdefault(k, f"the logs do not determine it ({shown}; needs <= {MAX_REL_STDERR:.0%})")
            continue
        chosen.append(k)
    if not chosen:
        return chosen
    # Levenberg-Marquardt in log space, within each parameter's physical bounds
    lo = np.array([math.log(max(bounds(base, k)[0], 1e-300)) for k in chosen])
    hi = np.array([math.log(bounds(base, k)[1]) for k in chosen])
    x = np.array([math.log(work[k].value) for k in chosen])

    def at(xv):
        return {**work, **{k: Value(math.exp(xi)) for k, xi in zip(chosen, xv)}}

    r = _residuals(cases, base, at(x))
    lam = 1e-3
    for _ in range(60):
        J = _jacobian(cases, base, at(x), chosen)
        H, g = J.T @ J, J.T @ r
        step = np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-12), -g)
        xn = np.clip(x + step, lo, hi)
        rn = _residuals(cases, base, at(xn))
        if rn @ rn < r @ r:
            x, r, lam = xn, rn, lam / 3
            if float(np.max(np.abs(step))) < 1e-7:
                break
        else:
            lam *= 4
            if lam > 1e8:
                break
        if float(r @ r) < 1e-14:
            break
    for i, k in enumerate(chosen):
        at_bound = x[i] <= lo[i] + 1e-6 or x[i] >= hi[i] - 1e-6
        worst = max(cases, key=lambda c: abs(math.log(step_time(c, cluster_with(base, at(x))) / c.steady.measured_s)))
        err = step_time(worst, cluster_with(base, at(x))) / worst.steady.measured_s - 1
        if at_bound and abs(err) > MAX_RESIDUAL_AT_BOUND:
            b = bounds(base, k)
            raise SpecError(worst.inp.log, None, f"measured {worst.steady.measured_s:.4g} s per iteration; the planner "
                            f"predicts {worst.before_s:.4g} s for {worst.inp.launch} and cannot reach it with {k} in its "
                            f"physical range ({b[0]:.3g}, {b[1]:.3g}]: is this the log of this launch on this cluster?")
        values[k] = Value(math.exp(x[i]))
    return chosen


def log_date(c: LogCase) -> str:
    """When the log's iterations ran (their dates, else the file's modification time)."""
    return c.steady.dates or f"{c.log.modified} (file modified)"
