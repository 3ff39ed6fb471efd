"""Command line: a thin typer + rich layer over the library."""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

import typer
from rich.console import Console

from .errors import InvalidStrategy, PlannerError, SpecError
from .inputs import MAX_COUNT, MAX_DEGREE, int_option, printable, terminal_size
from .search.objective import MIN_GPU_FRACTION

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Auto-parallel planner for large-model training (Megatron-LM).")


class _Console(Console):
    """A rich console that escapes control characters in the text it is given (file names
    are echoed: an ESC or a newline in one must not reach the terminal raw). On stderr every
    message is one line, so newlines are escaped too."""

    def __init__(self, *, one_line: bool, **kw):
        super().__init__(**kw)
        self._one_line = one_line

    def print(self, *objects, **kw):
        if self._one_line:
            objects = tuple(printable(o) if isinstance(o, str) else o for o in objects)
        else:
            objects = tuple("\n".join(map(printable, o.split("\n"))) if isinstance(o, str) else o
                            for o in objects)
        super().print(*objects, **kw)


def _make_console(stderr: bool) -> Console:
    # The size comes from inputs.terminal_size (COLUMNS=abc, 0 or -5 fall back to the terminal's
    # size, or 160 columns on a pipe so that tables do not fold); messages never wrap.
    cols, lines = terminal_size(os.environ, 2 if stderr else 1)
    return _Console(one_line=stderr, stderr=stderr, width=cols, height=lines, soft_wrap=True)


console = _make_console(stderr=False)
err_console = _make_console(stderr=True)
_DEBUG = {"on": False}


def version_text() -> str:
    """'planner 0.1.0': the installed distribution's version (the package's own if it was never
    installed, e.g. on PYTHONPATH)."""
    from importlib import metadata

    from . import __version__
    try:
        return f"planner {metadata.version('planner')}"
    except metadata.PackageNotFoundError:
        return f"planner {__version__}"


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(version_text() + "\n")
        raise typer.Exit(0)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for unexpected errors."),
          version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the version and exit.")):
    _DEBUG["on"] = debug


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


@app.command()
def models():
    """List the bundled model specs with total and active parameter counts."""
    from rich.table import Table
    from .library import bundled_model_names, load_model_ref
    t = Table(title="Bundled models")
    for c in ("name", "layers", "hidden", "heads", "groups", "experts", "params (B)", "active (B)"):
        t.add_column(c, justify="right" if c != "name" else "left")
    for n in bundled_model_names():
        m = load_model_ref(n)
        t.add_row(n, str(m.num_layers), str(m.hidden_size), str(m.num_attention_heads),
                  str(m.num_query_groups), str(m.num_experts or "-"), f"{m.parameters / 1e9:.2f}",
                  f"{m.active_parameters / 1e9:.2f}")
    console.print(t)


@app.command()
def clusters():
    """List the bundled clusters: node groups, GPUs, links and prices."""
    from rich.table import Table
    from .library import bundled_cluster_names, load_cluster_ref
    t = Table(title="Bundled clusters (one row per node group; links per node unless said)")
    for col in ("cluster", "GPUs", "node group", "nodes x GPUs", "GPU", "scale-up / GPU", "NICs", "between groups",
                "$/GPU-h"):
        t.add_column(col, justify="left" if col in ("cluster", "node group", "GPU", "between groups") else "right")
    for n in bundled_cluster_names():
        c = load_cluster_ref(n)
        links = [f"{ic.a}-{ic.b} {ic.bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s, {ic.latency_s * 1e6:g} us"
                 for ic in c.interconnects]
        for k, g in enumerate(c.node_groups):
            t.add_row(n if k == 0 else "", f"{c.num_gpus:,}" if k == 0 else "", g.name,
                      f"{g.nodes} x {g.gpus_per_node}", g.gpu.name, f"{g.intra_node_bandwidth_bytes_per_s / 1e9:g} GB/s",
                      f"{g.nics_per_node} x {g.nic_bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s",
                      "; ".join(links) if k == 0 and links else ("-" if k == 0 else ""),
                      "-" if g.price_per_gpu_hour is None else f"{g.price_per_gpu_hour:g}")
    console.print(t)


@app.command()
def gpus():
    """List the bundled hardware profiles."""
    from rich.table import Table
    from .library import bundled_profile_names, load_bundled_profile
    t = Table(title="Hardware profiles")
    for c in ("name", "memory (GB)", "HBM (GB/s)", "bf16 TFLOP/s", "fp8 TFLOP/s", "scale-up (GB/s/dir)", "uncertain"):
        t.add_column(c)
    for n in bundled_profile_names():
        p = load_bundled_profile(n)
        bf = p.peak("bf16") if p.supports("bf16") else p.peak("fp16")
        fp8 = f"{p.peak('fp8') / 1e12:g}" if p.supports("fp8") else "-"
        t.add_row(n, f"{p.memory_bytes / 1e9:g}", f"{p.memory_bandwidth_bytes_per_s / 1e9:g}",
                  f"{bf / 1e12:g}" + ("" if p.supports("bf16") else " (fp16)"), fp8,
                  f"{p.scale_up_bandwidth_bytes_per_s / 1e9:g}", ", ".join(p.uncertain) or "-")
    console.print(t)


@app.command()
def schema(kind: str = typer.Argument(..., help="model | cluster | profile")):
    """Print the JSON Schema of a spec file (for editor validation and completion)."""
    from .specs.schema import schema as spec_schema
    from .yamlio import suggest
    kinds = ("model", "cluster", "profile")
    if kind not in kinds:
        raise SpecError("schema", None, f"found {kind!r}, expected one of {', '.join(kinds)}{suggest(kind, kinds)}")
    _print_json(spec_schema(kind))


def _strategy_from_options(model, cluster, tp, pp, dp, cp, ep, etp, vpp, mbs, gbs, seq, recompute,
                           recompute_num_layers, sp, zero, precision, schedule, layers_per_stage,
                           stage_groups, offload):
    from .strategy import PRECISIONS, RECOMPUTE, SCHEDULES, Strategy
    from .yamlio import suggest
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


@app.command()
def estimate(
    cluster: str = typer.Option(..., "--cluster", help="Cluster YAML path or bundled name."),
    model: Optional[str] = typer.Option(None, "--model", help="Model YAML / HF config.json path or bundled name."),
    megatron_args: Optional[str] = typer.Option(None, "--megatron-args", help="File with a Megatron-LM command line."),
    tp: int = typer.Option(1, "--tp"), pp: int = typer.Option(1, "--pp"),
    dp: Optional[int] = typer.Option(None, "--dp", help="Default: all GPUs of the cluster."),
    cp: int = typer.Option(1, "--cp"), ep: int = typer.Option(1, "--ep"),
    etp: Optional[int] = typer.Option(None, "--etp"), vpp: int = typer.Option(1, "--vpp"),
    micro_batch_size: int = typer.Option(1, "--micro-batch-size"),
    global_batch_size: int = typer.Option(256, "--global-batch-size"),
    seq_length: int = typer.Option(4096, "--seq-length"),
    recompute: str = typer.Option("selective", "--recompute", help="none | selective | full"),
    recompute_num_layers: Optional[int] = typer.Option(None, "--recompute-num-layers"),
    sequence_parallel: bool = typer.Option(True, "--sequence-parallel/--no-sequence-parallel"),
    zero: int = typer.Option(1, "--zero", help="0 DDP, 1 distributed optimizer, 2, 3 (FSDP)"),
    precision: str = typer.Option("bf16", "--precision"),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="1f1b | interleaved | zb-h1"),
    layers_per_stage: Optional[str] = typer.Option(None, "--layers-per-stage"),
    stage_groups: Optional[str] = typer.Option(None, "--stage-groups", help="Node group per stage, comma-separated."),
    offload_optimizer: bool = typer.Option(False, "--offload-optimizer"),
    explain: bool = typer.Option(False, "--explain", help="Memory bars, step-time parts, the link bounding each collective."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Folder for timeline.png and memory.png (needs the plot extra)."),
    as_json: bool = typer.Option(False, "--json"),
    world_size: Optional[int] = typer.Option(None, "--world-size", help="With --megatron-args: default from the launcher, else the cluster size"),
    set_values: Optional[List[str]] = typer.Option(None, "--set", help="With --megatron-args: NAME=VALUE for a script variable (1=... for $1)"),
    verbose: bool = typer.Option(False, "--verbose", help="With --megatron-args: also list the flags read that change nothing"),
):
    """Memory, communication and step time of one configuration."""
    from .estimate import estimate as run_estimate
    from .emit.report import estimate_to_dict, render_estimate
    from .library import load_cluster_ref, load_model_ref
    if plot is not None:
        from .emit.writer import check_plot_folder
        check_plot_folder(plot)
    c = load_cluster_ref(cluster)
    report: list[str] = []
    if megatron_args:
        from .megatron.check import launch_report, load_launch, parse_settings
        from .megatron.rules import check_megatron
        ld = load_launch(megatron_args, c, model, world_size, parse_settings(set_values))
        m, s = ld.model, ld.strategy
        check_megatron(ld.launch, m)
        report = launch_report(ld, verbose)
    else:
        if model is None:
            raise SpecError("--model", None, "required (or give --megatron-args)")
        m = load_model_ref(model)
        s = _strategy_from_options(m, c, tp, pp, dp, cp, ep, etp, vpp, micro_batch_size, global_batch_size,
                                   seq_length, recompute, recompute_num_layers, sequence_parallel, zero,
                                   precision, schedule, layers_per_stage, stage_groups, offload_optimizer)
    e = run_estimate(m, c, s)
    if as_json:
        doc = estimate_to_dict(e)
        if megatron_args:
            from .megatron.check import launch_json
            doc["launch"] = launch_json(ld)
        _print_json(doc)
    else:
        render_estimate(e, console)
        for line in report:
            console.print(line, markup=False, highlight=False)
        if explain:
            from .emit.explain import render_explain
            render_explain(e, console)
    if plot is not None:
        _write_plots(plot, e, None, as_json)
    raise typer.Exit(0 if e.fits else 1)


def _plots_into(folder, e, priced) -> list:
    from pathlib import Path

    from .emit import plots
    out = [plots.timeline(e, Path(folder) / "timeline.png"), plots.memory(e, Path(folder) / "memory.png")]
    if priced:
        out.append(plots.candidates(priced, Path(folder) / "candidates.png"))
    return out


def _write_plots(folder: str, e, priced, quiet: bool) -> None:
    try:
        out = _plots_into(folder, e, priced)
    except OSError as exc:
        raise SpecError("--plot", None, f"cannot write in {printable(folder)}: {exc.strerror or exc}") from None
    if not quiet:
        for f in out:
            console.print(f"wrote {f}", markup=False)


# --fix NAME=VALUE: the pinnable choices and their values (degrees bounded like spec counts)
FIX_MAX_DEGREE = MAX_DEGREE


def _parse_fix(items: list[str]) -> tuple:
    from .strategy import RECOMPUTE
    from .yamlio import suggest
    allowed = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "recompute", "zero")
    out: dict = {}

    def pin(k, value):
        # the same choice pinned twice to different values is a contradiction, not "the last wins"
        if k in out and out[k] != value:
            raise SpecError("--fix", k, f"pinned twice, to {k}={out[k]} and {k}={value}; give one value")
        out[k] = value

    for it in items or []:
        k, _, v = it.partition("=")
        if k not in allowed or not v:
            raise SpecError("--fix", printable(k), f"expected NAME=VALUE with NAME one of {', '.join(allowed)}"
                            f"{suggest(k, allowed)}")
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


def _budget_options(gpus, max_gpus, min_gpu_fraction, c) -> None:
    """--gpus, --max-gpus and --min-gpu-fraction against each other and the cluster."""
    from .inputs import MAX_COUNT
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


def _objective_options(objective: str, train_tokens: Optional[str]):
    """(objective, tokens or None) checked: --objective one of objective.OBJECTIVES, and
    time-to-train needs --train-tokens."""
    from .search.objective import OBJECTIVES, parse_token_count
    from .yamlio import suggest
    if objective not in OBJECTIVES:
        raise SpecError("--objective", None, f"found {objective!r}, expected one of {', '.join(OBJECTIVES)}"
                        f"{suggest(objective, OBJECTIVES)}")
    tokens = parse_token_count(train_tokens) if train_tokens is not None else None
    if objective == "time-to-train" and tokens is None:
        raise SpecError("--objective", None, "time-to-train needs --train-tokens (e.g. --train-tokens 2T)")
    return objective, tokens


def _search_info(res, o) -> dict:
    return {"candidates": res.candidates, "pruned": res.pruned_memory + res.pruned_bound + res.pruned_dominated,
            "pruned_memory": res.pruned_memory, "pruned_bound": res.pruned_bound,
            "pruned_dominated": res.pruned_dominated, "priced": res.priced, "seconds": round(res.seconds, 3),
            "solver": res.solver, "status": res.status, "optimality_gap": res.optimality_gap,
            "objective": o.objective, "gpus": o.gpus, "max_gpus": o.max_gpus,
            "min_gpu_fraction": o.min_gpu_fraction, "charge_idle": o.charge_idle, "all": o.keep_dominated,
            "allow_tight": o.allow_tight}


# help text of the options `plan` and `sweep` share
_HELP_MIN_FRACTION = ("Plans use more than this fraction of the GPUs available to them (their node groups', "
                      "at most --max-gpus); 0 allows any size.")
_HELP_OBJECTIVE = ("throughput | cost | time-to-train: rank by step time, by $ per million tokens "
                   "(price_per_gpu_hour on every node group), or by days to --train-tokens.")
_HELP_TOKENS = "Token budget for days and $ to train: 2T, 300B, 1.5e12 (suffixes K, M, B, T)."
_HELP_ALLOW_TIGHT = ("Rank plans that fit only within the memory model's stated margin (TIGHT: they may run "
                     "out of memory) with the others; default: after every plan that fits with margin.")
_HELP_CHARGE_IDLE = ("Charge every GPU of the cluster, idle ones too (a cluster held whole); default: a plan "
                     "pays for the GPUs it uses (a reservation sized to it).")


@app.command()
def plan(
    model: str = typer.Option(..., "--model", help="Model YAML / HF config.json path or bundled name."),
    cluster: str = typer.Option(..., "--cluster", help="Cluster YAML path or bundled name."),
    global_batch_size: int = typer.Option(..., "--global-batch-size"),
    seq_length: int = typer.Option(..., "--seq-length"),
    top: int = typer.Option(3, "--top", min=1, max=50),
    fix: Optional[List[str]] = typer.Option(None, "--fix", help="Pin a choice, e.g. --fix tp=8 --fix recompute=full"),
    precision: str = typer.Option("bf16", "--precision", help="bf16 | fp16 | fp8"),
    zero: str = typer.Option("0,1", "--zero-stages", help="ZeRO stages to consider (2, 3 = Megatron-FSDP)"),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="Use exactly this many of the cluster's GPUs."),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus", help="Use at most this many of the cluster's GPUs."),
    min_gpu_fraction: float = typer.Option(MIN_GPU_FRACTION, "--min-gpu-fraction", help=_HELP_MIN_FRACTION,
                                           show_default=True),
    objective: str = typer.Option("throughput", "--objective", help=_HELP_OBJECTIVE, show_default=True),
    train_tokens: Optional[str] = typer.Option(None, "--train-tokens", help=_HELP_TOKENS),
    charge_idle: bool = typer.Option(False, "--charge-idle", help=_HELP_CHARGE_IDLE),
    all_plans: bool = typer.Option(False, "--all", help="Also list plans another plan beats on every figure "
                                                        "(step time, memory, GPUs, $)."),
    allow_tight: bool = typer.Option(False, "--allow-tight", help=_HELP_ALLOW_TIGHT),
    solver: str = typer.Option("dp", "--solver", help="dp | ilp | ilp-highs: stage-partition solver (the search always prices with the exact DP; ilp re-solves the top plans as an ILP)"),
    time_limit: float = typer.Option(120.0, "--time-limit", help="Seconds before the search stops with its best so far."),
    allow_tp_across_nodes: bool = typer.Option(False, "--allow-tp-across-nodes",
                                               help="Also try TP groups larger than a node (slow networks make them lose)."),
    uneven_chunks: bool = typer.Option(False, "--uneven-chunks",
                                       help="Also try pipeline ranks whose layers do not divide by vpp (virtual chunks differ by one layer, emitted as a --pipeline-model-parallel-layout). The top plan is exact; #2.. may miss a better plan."),
    emit: Optional[str] = typer.Option(None, "--emit", help="megatron: write launch files"),
    out: Optional[str] = typer.Option(None, "--out", help="Folder for --emit"),
    force: bool = typer.Option(False, "--force", help="Replace an --out folder planner wrote (only while it holds "
                                                      "exactly the files of its planner-manifest.json, unchanged)"),
    explain: bool = typer.Option(False, "--explain", help="Explain the top plan and why it beats the runner-up."),
    compare_with: Optional[str] = typer.Option(None, "--compare-with",
                                               help="A launch or plan JSON (e.g. the layout you run today): priced on the same cluster beside #1, with the terms that differ."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Folder for timeline, memory and candidates PNGs (plot extra)."),
    as_json: bool = typer.Option(False, "--json"),
    wide: bool = typer.Option(False, "--wide", help="Every column of the plans table, however narrow the terminal "
                                                    "(default: a compact table where the full one would wrap)."),
):
    """Search the best DP/TP/PP/CP/EP layout, micro-batch, recompute, ZeRO and stage split."""
    from .emit.plans import plan_entry, plan_figures, render_plans
    from .library import load_cluster_ref, load_model_ref, resolve_cluster_ref, resolve_model_ref
    from .search.objective import check_objective
    from .search.planner import SearchOptions, search
    from .strategy import PRECISIONS
    if precision not in PRECISIONS:
        raise SpecError("--precision", None, f"found {precision!r}, expected one of {', '.join(PRECISIONS)}")
    if solver not in ("dp", "ilp", "ilp-highs"):
        raise SpecError("--solver", None, f"found {solver!r}, expected dp, ilp or ilp-highs")
    if emit not in (None, "megatron"):
        raise SpecError("--emit", None, f"found {emit!r}, expected 'megatron'")
    if emit and out is None:
        raise SpecError("--out", None, "required with --emit")
    if out is not None and not emit:
        raise SpecError("--out", None, "needs --emit megatron (nothing else is written there)")
    int_option("--global-batch-size", global_batch_size, 1, MAX_COUNT)
    int_option("--seq-length", seq_length, 1, MAX_COUNT)
    if not time_limit > 0:
        raise SpecError("--time-limit", None, f"found {time_limit:g}, expected seconds > 0")
    zs = _zero_stages(zero)
    fixed = _parse_fix(fix)
    _budget_options(gpus, max_gpus, min_gpu_fraction, None)
    objective, tokens = _objective_options(objective, train_tokens)
    # every input and output checked before the search (which may take minutes)
    model_file, cluster_file = resolve_model_ref(model), resolve_cluster_ref(cluster)
    if out is not None:
        from .emit.writer import check_out_folder
        check_out_folder(out, force, (model_file, cluster_file))
    if plot is not None:
        from .emit.writer import check_plot_folder
        check_plot_folder(plot)
    m = load_model_ref(model)
    c = load_cluster_ref(cluster)
    _budget_options(gpus, max_gpus, min_gpu_fraction, c)
    check_objective(c, objective, charge_idle)
    opts = SearchOptions(global_batch_size=global_batch_size, seq_length=seq_length, top=top,
                         fixed=fixed, precision=precision, zero_stages=zs, solver=solver,
                         time_limit_s=time_limit, allow_tp_across_nodes=allow_tp_across_nodes,
                         uneven_chunks=uneven_chunks, gpus=gpus, max_gpus=max_gpus,
                         min_gpu_fraction=min_gpu_fraction, objective=objective, charge_idle=charge_idle,
                         keep_dominated=all_plans, allow_tight=allow_tight)
    if as_json or not err_console.is_terminal:
        res = search(m, c, opts)
    else:
        from .emit.live import LiveSearch
        with LiveSearch(err_console, objective) as live:
            res = search(m, c, opts, progress=live)
    for w in res.warnings:
        err_console.print(f"warning: {w}", markup=False)
    search_info = _search_info(res, opts)
    if not res.plans:
        _report_no_fit(res, m, c, as_json, search_info, opts)
        raise typer.Exit(1)
    other = None
    if compare_with is not None:
        from .estimate import estimate as run_estimate
        from .megatron.check import load_plan_or_launch
        om, os_ = load_plan_or_launch(compare_with, c, model if os.path.isfile(str(model)) else None)
        other = run_estimate(om, c, os_)
    written = []
    plot_done = False
    if emit == "megatron":
        from .emit.writer import write_plans
        extra = None
        rel = _inside(plot, out) if plot is not None else None
        if rel is not None:
            # --plot inside --out: the pictures are part of the output folder that is swapped in
            # as a whole (and listed in its manifest), so a later --force may replace them
            def extra(staged):
                _plots_into(staged / rel, res.plans[0], res.priced_estimates)
            plot_done = True
        written = write_plans(res.plans, out, force, (model_file, cluster_file), extra=extra,
                              warn=lambda w: err_console.print(f"warning: {w}", markup=False))
    if as_json:
        doc = {"status": res.status, "gap": res.optimality_gap, "objective": objective, "train_tokens": tokens,
               "search": search_info, "idle_node_groups": res.idle_groups,
               "plans": [plan_entry(e, f, model_file) for e, f in zip(res.plans, plan_figures(res, tokens, charge_idle))]}
        if res.fastest_tight is not None:
            from .search.objective import figures
            doc["fastest_tight"] = plan_entry(res.fastest_tight, figures(res.fastest_tight, tokens, charge_idle),
                                              model_file)
        if written:
            doc["emitted"] = written
        if other is not None:
            from .emit.explain import differing_terms
            from .emit.report import estimate_to_dict
            doc["compare_with"] = {"file": compare_with, "estimate": estimate_to_dict(other),
                                   "top_plan_speedup": other.step_time_s / res.plans[0].step_time_s,
                                   "differing_terms": [{"term": k, "top_s": a, "compared_s": b}
                                                       for k, a, b in differing_terms(res.plans[0], other)]}
        _print_json(doc)
    else:
        render_plans(res, m, c, search_info, opts, tokens, console, wide)
        for w in written:
            console.print(f"wrote {w}", markup=False)
        if explain:
            from .emit.explain import render_difference, render_explain
            console.print("\n[bold]Plan #1[/]")
            render_explain(res.plans[0], console, charge_idle=charge_idle)
            if len(res.plans) > 1:
                render_difference(res.plans[0], res.plans[1], console)
        if other is not None:
            from .emit.explain import render_difference
            console.print(f"\n#1 is predicted {other.step_time_s / res.plans[0].step_time_s:.2f}x the speed of "
                          f"{compare_with} on {c.name} (its verdict: {other.memory_verdict})", markup=False)
            render_difference(res.plans[0], other, console, "#1", "compared")
    if plot is not None and not plot_done:
        _write_plots(plot, res.plans[0], res.priced_estimates, as_json)
    elif plot_done and not as_json:
        console.print(f"wrote the plots into {plot}", markup=False)
    raise typer.Exit(0)


@app.command()
def sweep(
    model: str = typer.Option(..., "--model", help="Model YAML / HF config.json path or bundled name."),
    cluster: List[str] = typer.Option(..., "--cluster", help="A cluster to try (repeat for several)."),
    nodes: Optional[List[str]] = typer.Option(None, "--nodes", help="Node counts to try: 16,32,64 (every node group "
                                                                    "at each count) or GROUP=8,16 (one group; "
                                                                    "several: every combination)."),
    global_batch_size: int = typer.Option(..., "--global-batch-size"),
    seq_length: int = typer.Option(..., "--seq-length"),
    fix: Optional[List[str]] = typer.Option(None, "--fix", help="Pin a choice in every search, e.g. --fix tp=8"),
    precision: str = typer.Option("bf16", "--precision", help="bf16 | fp16 | fp8"),
    zero: str = typer.Option("0,1", "--zero-stages", help="ZeRO stages to consider (2, 3 = Megatron-FSDP)"),
    min_gpu_fraction: float = typer.Option(MIN_GPU_FRACTION, "--min-gpu-fraction", help=_HELP_MIN_FRACTION,
                                           show_default=True),
    objective: str = typer.Option("throughput", "--objective", help=_HELP_OBJECTIVE, show_default=True),
    train_tokens: Optional[str] = typer.Option(None, "--train-tokens", help=_HELP_TOKENS),
    charge_idle: bool = typer.Option(False, "--charge-idle", help=_HELP_CHARGE_IDLE),
    allow_tight: bool = typer.Option(False, "--allow-tight", help=_HELP_ALLOW_TIGHT),
    time_limit: float = typer.Option(120.0, "--time-limit", help="Seconds each search may take."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Searches run at once (default: every core)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Folder for sweep.png, the scaling picture (plot extra)."),
    as_json: bool = typer.Option(False, "--json"),
):
    """What if: the best plan of one model on each cluster and node count, searched in parallel;
    one row each (plan, tokens/s, $ per million tokens, days)."""
    from .emit.sweep import render_sweep, sweep_document
    from .library import load_cluster_ref, load_model_ref, resolve_model_ref
    from .search.objective import check_objective
    from .search.planner import SearchOptions
    from .search.sweep import default_jobs, parse_nodes, run_sweep, sweep_options
    from .strategy import PRECISIONS
    if precision not in PRECISIONS:
        raise SpecError("--precision", None, f"found {precision!r}, expected one of {', '.join(PRECISIONS)}")
    int_option("--global-batch-size", global_batch_size, 1, MAX_COUNT)
    int_option("--seq-length", seq_length, 1, MAX_COUNT)
    int_option("--jobs", jobs, 1, 1024)
    if not time_limit > 0:
        raise SpecError("--time-limit", None, f"found {time_limit:g}, expected seconds > 0")
    zs = _zero_stages(zero)
    fixed = _parse_fix(fix)
    _budget_options(None, None, min_gpu_fraction, None)
    objective, tokens = _objective_options(objective, train_tokens)
    every, named = parse_nodes(nodes)
    if plot is not None:
        from .emit.writer import check_plot_folder
        check_plot_folder(plot)
    model_file = resolve_model_ref(model)
    m = load_model_ref(model)
    clusters = [load_cluster_ref(c) for c in cluster]
    for c in clusters:
        check_objective(c, objective, charge_idle)
    options = sweep_options(clusters, every, named)
    opts = SearchOptions(global_batch_size=global_batch_size, seq_length=seq_length, top=1, fixed=fixed,
                         precision=precision, zero_stages=zs, time_limit_s=time_limit,
                         min_gpu_fraction=min_gpu_fraction, objective=objective, charge_idle=charge_idle,
                         allow_tight=allow_tight)
    n_jobs = jobs or default_jobs()
    if as_json or not err_console.is_terminal:
        outcomes = run_sweep(m, options, opts, tokens, n_jobs)
    else:
        from rich.progress import Progress
        with Progress(transient=True, console=err_console) as prog:
            task = prog.add_task(f"sweep: {len(options)} searches, {min(n_jobs, len(options))} at a time",
                                 total=len(options))
            outcomes = run_sweep(m, options, opts, tokens, n_jobs,
                                 on_done=lambda k, n: prog.update(task, completed=k))
    if as_json:
        _print_json(sweep_document(outcomes, m, model_file, opts, tokens))
    else:
        render_sweep(outcomes, m, opts, tokens, console)
    if plot is not None:
        from pathlib import Path

        from .emit import plots
        title = f"{m.name}: global batch {global_batch_size} x {seq_length} tokens, best plan of each option"
        try:
            f = plots.scaling(outcomes, Path(plot) / "sweep.png", title)
        except OSError as exc:
            raise SpecError("--plot", None, f"cannot write in {printable(plot)}: {exc.strerror or exc}") from None
        if not as_json:
            console.print(f"wrote {f}", markup=False)
    raise typer.Exit(0 if any(x.plan is not None for x in outcomes) else 1)


def _zero_stages(zero: str) -> tuple[int, ...]:
    try:
        zs = tuple(int(x) for x in zero.split(","))
        assert all(z in (0, 1, 2, 3) for z in zs)
    except (ValueError, AssertionError):
        raise SpecError("--zero-stages", None, f"found {zero!r}, expected e.g. 0,1") from None
    return zs


def _inside(path: str, folder: str):
    """path relative to folder when path is folder or inside it (both may not exist yet), else None."""
    from pathlib import Path
    a, b = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    try:
        a = a.parent.resolve() / a.name
        b = b.parent.resolve() / b.name
    except (OSError, RuntimeError):
        return None
    return a.relative_to(b) if a == b or b in a.parents else None


def _report_no_fit(res, m, c, as_json, info, o) -> None:
    from .emit.plans import no_fit_hints
    from .search.diagnose import budget_rule, empty_space_reason
    e = res.closest
    msg = {"status": "no-plan" if res.status == "optimal" else res.status, "gap": None, "search": info,
           "plans": [], "error": "no plan fits in memory"}
    rule = f" ({budget_rule(o, c)})"
    if res.status == "time-limit":
        text = ("the search stopped at its time limit before it found a plan that fits (nothing it "
                "priced fits); raise --time-limit or pin degrees with --fix" + rule)
    elif e is not None:
        worst = max(e.memory, key=lambda x: x.total - x.capacity)
        short = worst.total - worst.capacity
        s = e.strategy
        hints = no_fit_hints(e, o, c)
        msg["closest"] = {"plan": {"tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp, "ep": s.ep,
                                   "micro_batch_size": s.micro_batch_size, "recompute": s.recompute,
                                   "zero_stage": s.zero_stage},
                          "stage": worst.stage, "short_bytes": short, "needed_bytes": worst.total,
                          "usable_bytes": worst.capacity, "suggestions": hints}
        text = (f"no plan fits in memory{rule}. Closest: tp={s.tp} pp={s.pp} dp={s.dp} cp={s.cp} ep={s.ep} "
                f"mbs={s.micro_batch_size} recompute={s.recompute_label} zero={s.zero_stage}: stage {worst.stage} needs "
                f"{worst.total / 2**30:.1f} GiB of {worst.capacity / 2**30:.1f} GiB usable "
                f"({short / 2**30:.1f} GiB short). Try: " + "; ".join(hints))
    else:
        text = f"no valid plan: {empty_space_reason(m, c, o)}"
        if "GPU budget" not in text:
            text += rule
    msg["error"] = text
    if as_json:
        _print_json(msg)
    else:
        _error_line(f"error: {text}")


@app.command()
def compare(
    plan_a: str = typer.Argument(..., help="Plan JSON (plan --json, or plan.json from --emit) or Megatron launch file"),
    plan_b: str = typer.Argument(..., help="The same, for the other plan"),
    cluster: str = typer.Option(..., "--cluster"),
    model: Optional[str] = typer.Option(None, "--model", help="Default: the model the files name"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Two plans (or launches) side by side on one cluster, and the terms that differ."""
    from .megatron.check import load_plan_or_launch
    from .emit.explain import differing_terms, render_compare
    from .emit.report import estimate_to_dict
    from .estimate import estimate as run_estimate
    from .library import load_cluster_ref
    c = load_cluster_ref(cluster)
    ests = []
    for f in (plan_a, plan_b):
        m, s = load_plan_or_launch(f, c, model)
        ests.append(run_estimate(m, c, s))
    a, b = ests
    if as_json:
        _print_json({"a": estimate_to_dict(a), "b": estimate_to_dict(b),
                     "differing_terms": [{"term": k, "a_s": va, "b_s": vb} for k, va, vb in differing_terms(a, b)]})
        raise typer.Exit(0)
    render_compare(a, b, console, f"{plan_a} vs {plan_b} on {c.name}")
    raise typer.Exit(0)


@app.command()
def check(
    cluster: str = typer.Option(..., "--cluster"),
    megatron_args: Optional[str] = typer.Option(None, "--megatron-args"),
    plan_file: Optional[str] = typer.Option(None, "--plan", help="A plan JSON written by `planner plan --json`"),
    model: Optional[str] = typer.Option(None, "--model"),
    world_size: Optional[int] = typer.Option(None, "--world-size", help="Default: from the launcher (torchrun, Slurm), else the cluster size"),
    set_values: Optional[List[str]] = typer.Option(None, "--set", help="NAME=VALUE for a script variable the planner cannot know (1=... for $1)"),
    verbose: bool = typer.Option(False, "--verbose", help="Also list the flags read that change nothing"),
    as_json: bool = typer.Option(False, "--json"),
):
    """CI gate: exit 0 if the launch is valid and fits, 1 if it breaks a rule or does not fit,
    2 if the input is unusable."""
    from .megatron.check import parse_settings, run_check
    code = run_check(cluster, megatron_args, plan_file, model, world_size, as_json, console,
                     parse_settings(set_values), verbose)
    raise typer.Exit(code)


@app.command()
def calibrate(
    cluster: str = typer.Option(..., "--cluster", help="Cluster YAML path or bundled name."),
    megatron_log: Optional[List[str]] = typer.Option(None, "--megatron-log", help="A Megatron-LM training log (repeat; each with its --megatron-args)."),
    megatron_args: Optional[List[str]] = typer.Option(None, "--megatron-args", help="The launch that produced the log (anything `planner check` reads)."),
    nccl_tests: Optional[List[str]] = typer.Option(None, "--nccl-tests", help="nccl-tests output (repeat; each with its --nccl-nodes)."),
    nccl_nodes: Optional[List[int]] = typer.Option(None, "--nccl-nodes", help="Nodes the nccl-tests run used."),
    nccl_gpus_per_node: Optional[List[int]] = typer.Option(None, "--nccl-gpus-per-node", help="GPUs per node it used (default: its device report, else the node group's)."),
    nccl_group: Optional[List[str]] = typer.Option(None, "--nccl-group", help="Node group it ran on (a,b across two); needed when the cluster has several."),
    out: str = typer.Option(..., "--out", help="The calibrated cluster YAML to write (a new file)."),
    force: bool = typer.Option(False, "--force", help="Replace an --out file that planner calibrate wrote."),
    as_json: bool = typer.Option(False, "--json"),
):
    """Learn the cluster from its own Megatron-LM logs and nccl-tests output: write a calibrated
    cluster YAML that plan, estimate and check accept."""
    from .calibrate.command import run_calibrate
    raise typer.Exit(run_calibrate(cluster, megatron_log, megatron_args, nccl_tests, nccl_nodes, nccl_gpus_per_node,
                                   nccl_group, out, as_json, console, force))


def _click_exception_types():
    """click's exception classes: typer >= 0.20 vendors click as typer._click (and plain click
    may not be installed at all); older typer uses click itself. Whichever are importable."""
    usage, abort = [], []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            mod = __import__(module, fromlist=["_"])
        except ImportError:
            continue
        for name, out in (("ClickException", usage), ("Abort", abort)):
            cls = getattr(mod, name, None)
            if isinstance(cls, type):
                out.append(cls)
    return tuple(usage), tuple(abort)


def _error_line(text: str) -> None:
    """Write one error line to stderr, plain: not through rich, so that no terminal width,
    TERM or colour setting can fold, colour or swallow it; control characters escaped, no
    leading blank line."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    line = printable(str(text).strip())
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _PipeTolerant:
    """A standard stream whose reader may go away (`planner check ... | head`): the rest of the
    output goes to /dev/null, so the exit code stays the verdict's (click would exit 1 on EPIPE,
    which a CI gate reads as DOES NOT FIT)."""

    def __init__(self, stream):
        self._stream = stream

    def _drop(self) -> None:
        try:   # Python's documented remedy: point the descriptor at /dev/null
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        except (OSError, ValueError):
            pass

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _tolerant_streams() -> None:
    # a non-UTF-8 locale (LC_ALL=C with PYTHONUTF8=0, PYTHONIOENCODING=ascii) must not turn a
    # verdict with a non-ASCII file name into a UnicodeEncodeError: unencodable characters are
    # written as escapes instead
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass
    sys.stdout, sys.stderr = _PipeTolerant(sys.stdout), _PipeTolerant(sys.stderr)


def command():
    """The click command of `app`, its options' help polished (cli_help.py)."""
    from .cli_help import polish
    cmd = typer.main.get_command(app)
    polish(cmd)
    return cmd


def main() -> None:
    """Entry point: every expected error is one line and exit 2 (1 for invalid/does-not-fit)."""
    _tolerant_streams()
    try:
        rc = command()(standalone_mode=False)   # click returns the code of a typer.Exit here
        sys.exit(rc if isinstance(rc, int) else 0)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        _error_line("interrupted")
        sys.exit(130)
    except PlannerError as exc:
        _error_line(f"error: {exc}")
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - the top-level handler of a CLI
        usage, abort = _click_exception_types()
        if isinstance(exc, usage):
            # bad option values and usage: one line, exit 2 (click's own code for usage errors)
            _error_line("error: " + " ".join(exc.format_message().split("\n")))
            sys.exit(2)
        if isinstance(exc, abort):
            sys.exit(130)
        if _DEBUG["on"] or "--debug" in sys.argv:
            raise
        _error_line(f"error: unexpected {type(exc).__name__}: {exc} (run with --debug for details)")
        sys.exit(2)


if __name__ == "__main__":
    main()
