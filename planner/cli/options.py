"""The option checks several commands share, written once: a layout from estimate's options,
and the search options `plan` and `sweep` both take (precision, global batch, sequence length,
time limit, ZeRO stages, --fix, GPU budget, objective), with their shared help texts."""

from __future__ import annotations

from typing import NamedTuple, Optional

from ..errors import InvalidStrategy, SpecError
from ..inputs import MAX_COUNT, MAX_DEGREE, int_option, printable
from ..search.objective import OBJECTIVES, parse_token_count
from ..strategy import FP8_RECIPES, PRECISIONS, RECOMPUTE, SCHEDULES, Strategy
from ..yamlio import suggest

# help text of the options `plan` and `sweep` share
HELP_MIN_FRACTION = ("Plans use more than this fraction of the GPUs available to them (their node groups', "
                     "at most --max-gpus); 0 allows any size.")
HELP_OBJECTIVE = ("throughput | cost | time-to-train: rank by step time, by $ per million tokens "
                  "(price_per_gpu_hour on every node group), or by days to --train-tokens.")
HELP_TOKENS = "Token budget for days and $ to train: 2T, 300B, 1.5e12 (suffixes K, M, B, T)."
HELP_ALLOW_TIGHT = ("Rank plans that fit only within the memory model's stated margin (TIGHT: they may run "
                    "out of memory) with the others; default: after every plan that fits with margin.")
HELP_CHARGE_IDLE = ("Charge every GPU of the cluster, idle ones too (a cluster held whole); default: a plan "
                    "pays for the GPUs it uses (a reservation sized to it).")
HELP_ZERO_STAGES = "ZeRO stages to consider (2, 3 = Megatron-FSDP)"

# --fix NAME=VALUE: the pinnable choices and their values (degrees bounded like spec counts)
FIX_MAX_DEGREE = MAX_DEGREE
FIX_NAMES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "recompute", "zero")


def strategy_from_options(model, cluster, tp, pp, dp, cp, ep, etp, vpp, mbs, gbs, seq, recompute,
                          recompute_num_layers, sp, zero, precision, schedule, layers_per_stage,
                          stage_groups, offload) -> Strategy:
    """The layout estimate's options describe, each option checked (dp: default all GPUs)."""
    for flag, value, hi in (("--tp", tp, MAX_DEGREE), ("--pp", pp, MAX_DEGREE), ("--dp", dp, MAX_DEGREE),
                            ("--cp", cp, MAX_DEGREE), ("--ep", ep, MAX_DEGREE), ("--etp", etp, MAX_DEGREE),
                            ("--vpp", vpp, MAX_DEGREE), ("--micro-batch-size", mbs, MAX_DEGREE),
                            ("--global-batch-size", gbs, MAX_COUNT), ("--seq-length", seq, MAX_COUNT),
                            ("--recompute-num-layers", recompute_num_layers, MAX_DEGREE)):
        int_option(flag, value, 1, hi)
    for flag, value, choices in (("--precision", precision, PRECISIONS), ("--recompute", recompute, RECOMPUTE),
                                 ("--schedule", schedule, SCHEDULES + (None,)), ("--zero", zero, (0, 1, 2, 3))):
        if value not in choices:
            shown = [str(c) for c in choices if c is not None]
            raise SpecError(flag, None, f"found {value!r}, expected one of {', '.join(shown)}"
                            f"{suggest(str(value), shown)}")
    if dp is None:
        n = cluster.num_gpus
        if n % (tp * pp * cp):
            raise InvalidStrategy("world-size", f"cluster has {n} GPUs, not divisible by tp x pp x cp = {tp * pp * cp}")
        dp = n // (tp * pp * cp)
    if schedule is None:
        schedule = "interleaved" if vpp > 1 else "1f1b"
    lps = None
    if layers_per_stage:
        try:
            lps = tuple(int(x) for x in layers_per_stage.split(","))
            assert all(1 <= n <= MAX_DEGREE for n in lps)
        except (ValueError, AssertionError):
            raise SpecError("--layers-per-stage", None, f"found {layers_per_stage!r}, expected positive layer "
                            "counts, e.g. 20,20,22,18") from None
    groups = tuple(stage_groups.split(",")) if stage_groups else None
    return Strategy(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, micro_batch_size=mbs,
                    global_batch_size=gbs, seq_length=seq, recompute=recompute,
                    recompute_num_layers=recompute_num_layers, sequence_parallel=sp, zero_stage=zero,
                    precision=precision, schedule=schedule, layers_per_stage=lps,
                    stage_node_groups=groups, offload_optimizer=offload)



class SearchChoices(NamedTuple):
    """The search options of `plan` and `sweep`, checked."""
    zero_stages: tuple
    fixed: tuple
    objective: str
    train_tokens: Optional[float]


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise SpecError("--precision", None, f"found {precision!r}, expected one of {', '.join(PRECISIONS)}")


def check_fp8_recipe(fp8_recipe: str | None, precision: str) -> None:
    """--fp8-recipe: one of Megatron's recipes, and only with --precision fp8."""
    if fp8_recipe is None:
        return
    if fp8_recipe not in FP8_RECIPES:
        raise SpecError("--fp8-recipe", None, f"found {fp8_recipe!r}, expected one of {', '.join(FP8_RECIPES)}")
    if precision != "fp8":
        raise SpecError("--fp8-recipe", None, f"found {fp8_recipe!r} with --precision {precision}, expected it "
                        "with --precision fp8")


def check_precision_on_cluster(precision: str, cluster, fp8_recipe: str | None = None) -> None:
    """--precision (and --fp8-recipe) against every node group's GPU: nvfp4 needs an fp4 tensor
    peak, MXFP8 Blackwell; one line naming the option, the GPU and what is expected
    (cost/kernels.py precision_problem). fp8 on a GPU without fp8 runs 16-bit, as it always has."""
    from ..cost.kernels import precision_problem   # the cost model
    for g in cluster.node_groups:
        problem = precision_problem(Strategy(precision=precision, fp8_recipe=fp8_recipe or "delayed"), g.gpu)
        if problem:
            if fp8_recipe == "mxfp8":
                raise SpecError("--fp8-recipe", None, f"{problem} (node group {g.name} of {cluster.name})")
            raise SpecError("--precision", None, f"{problem} (node group {g.name} of {cluster.name}); "
                            "expected a cluster of such GPUs, or --precision fp8 / bf16")


def search_choices(global_batch_size, seq_length, time_limit, zero, fix, gpus, max_gpus, min_gpu_fraction,
                   objective, train_tokens, jobs=None) -> SearchChoices:
    """The checks `plan` and `sweep` both make (after check_precision and their own), in the
    order they make them; jobs is their --jobs (None: not given)."""
    int_option("--global-batch-size", global_batch_size, 1, MAX_COUNT)
    int_option("--seq-length", seq_length, 1, MAX_COUNT)
    int_option("--jobs", jobs, 1, 1024)
    if not time_limit > 0:
        raise SpecError("--time-limit", None, f"found {time_limit:g}, expected seconds > 0")
    zs = zero_stages(zero)
    fixed = parse_fix(fix)
    budget_options(gpus, max_gpus, min_gpu_fraction, None)
    objective, tokens = objective_options(objective, train_tokens)
    return SearchChoices(zs, fixed, objective, tokens)


def zero_stages(zero: str) -> tuple[int, ...]:
    try:
        zs = tuple(int(x) for x in zero.split(","))
        assert all(z in (0, 1, 2, 3) for z in zs)
    except (ValueError, AssertionError):
        raise SpecError("--zero-stages", None, f"found {zero!r}, expected e.g. 0,1") from None
    return zs


def parse_fix(items: list[str]) -> tuple:
    """--fix NAME=VALUE pins, checked: ((name, value), ...) in the order given."""
    out: dict = {}

    def pin(k, value):
        # the same choice pinned twice to different values is a contradiction, not "the last wins"
        if k in out and out[k] != value:
            raise SpecError("--fix", k, f"pinned twice, to {k}={out[k]} and {k}={value}; give one value")
        out[k] = value

    for it in items or []:
        k, _, v = it.partition("=")
        if k not in FIX_NAMES or not v:
            raise SpecError("--fix", printable(k), f"expected NAME=VALUE with NAME one of {', '.join(FIX_NAMES)}"
                            f"{suggest(k, FIX_NAMES)}")
        if k == "recompute":
            if v not in RECOMPUTE:
                raise SpecError("--fix", k, f"found {v!r}, expected one of {', '.join(RECOMPUTE)}{suggest(v, RECOMPUTE)}")
            pin(k, v)
            continue
        try:
            n = int(v)
        except ValueError:
            raise SpecError("--fix", k, f"found {v!r}, expected an integer") from None
        lo, hi = (0, 3) if k == "zero" else (1, FIX_MAX_DEGREE)
        if not lo <= n <= hi:
            raise SpecError("--fix", k, f"found {n}, expected an integer in [{lo}, {hi}]")
        pin(k, n)
    return tuple(out.items())


def budget_options(gpus, max_gpus, min_gpu_fraction, c) -> None:
    """--gpus, --max-gpus and --min-gpu-fraction against each other and the cluster."""
    int_option("--gpus", gpus, 1, MAX_COUNT)
    int_option("--max-gpus", max_gpus, 1, MAX_COUNT)
    if gpus is not None and max_gpus is not None:
        raise SpecError("--gpus", None, "give --gpus (exactly N) or --max-gpus (at most N), not both")
    if not 0 <= min_gpu_fraction < 1:
        raise SpecError("--min-gpu-fraction", None, f"found {min_gpu_fraction:g}, expected a fraction in [0, 1)")
    if c is not None:
        for flag, n in (("--gpus", gpus), ("--max-gpus", max_gpus)):
            if n is not None and n > c.num_gpus:
                raise SpecError(flag, None, f"found {n}, but {c.name} has {c.num_gpus} GPUs")


def objective_options(objective: str, train_tokens: Optional[str]):
    """(objective, tokens or None) checked: --objective one of objective.OBJECTIVES, and
    time-to-train needs --train-tokens."""
    if objective not in OBJECTIVES:
        raise SpecError("--objective", None, f"found {objective!r}, expected one of {', '.join(OBJECTIVES)}"
                        f"{suggest(objective, OBJECTIVES)}")
    tokens = parse_token_count(train_tokens) if train_tokens is not None else None
    if objective == "time-to-train" and tokens is None:
        raise SpecError("--objective", None, "time-to-train needs --train-tokens (e.g. --train-tokens 2T)")
    return objective, tokens
