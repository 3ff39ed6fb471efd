"""`planner plan`: search the best layout of a model on a cluster; print, emit or compare it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from ..emit.live import LiveSearch
from ..errors import SpecError
from ..library import load_cluster_ref, load_model_ref, resolve_cluster_ref, resolve_model_ref
from ..megatron.check import load_plan_or_launch
from ..search.objective import MIN_GPU_FRACTION, check_objective
from . import app, console, err_console, error_line, print_json
from .options import (HELP_ALLOW_TIGHT, HELP_CHARGE_IDLE, HELP_MIN_FRACTION, HELP_OBJECTIVE, HELP_TOKENS,
                      HELP_ZERO_STAGES, budget_options, check_fp8_recipe, check_precision, check_precision_on_cluster,
                      search_choices)
from .plotting import check_folder, estimate_plots, write_plots


@app.command()
def plan(
    model: str = typer.Option(..., "--model", help="Model YAML / HF config.json path or bundled name."),
    cluster: str = typer.Option(..., "--cluster", help="Cluster YAML path or bundled name."),
    global_batch_size: int = typer.Option(..., "--global-batch-size"),
    seq_length: int = typer.Option(..., "--seq-length"),
    top: int = typer.Option(3, "--top", min=1, max=50),
    fix: Optional[List[str]] = typer.Option(None, "--fix", help="Pin a choice, e.g. --fix tp=8 --fix recompute=full"),
    precision: str = typer.Option("bf16", "--precision", help="bf16 | fp16 | fp8 | nvfp4 (nvfp4: Blackwell GPUs)"),
    fp8_recipe: Optional[str] = typer.Option(None, "--fp8-recipe", help="With --precision fp8: delayed | tensorwise "
                                             "| blockwise | mxfp8 (default: mxfp8 on Blackwell, tensorwise "
                                             "elsewhere, as NVIDIA's Megatron-Bridge recipes)"),
    zero: str = typer.Option("0,1", "--zero-stages", help=HELP_ZERO_STAGES),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="Use exactly this many of the cluster's GPUs."),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus", help="Use at most this many of the cluster's GPUs."),
    min_gpu_fraction: float = typer.Option(MIN_GPU_FRACTION, "--min-gpu-fraction", help=HELP_MIN_FRACTION,
                                           show_default=True),
    objective: str = typer.Option("throughput", "--objective", help=HELP_OBJECTIVE, show_default=True),
    train_tokens: Optional[str] = typer.Option(None, "--train-tokens", help=HELP_TOKENS),
    charge_idle: bool = typer.Option(False, "--charge-idle", help=HELP_CHARGE_IDLE),
    all_plans: bool = typer.Option(False, "--all", help="Also list plans another plan beats on every figure "
                                                        "(step time, memory, GPUs, $)."),
    allow_tight: bool = typer.Option(False, "--allow-tight", help=HELP_ALLOW_TIGHT),
    solver: str = typer.Option("dp", "--solver", help="dp | ilp | ilp-highs: stage-partition solver (the search always prices with the exact DP; ilp re-solves the top plans as an ILP)"),
    time_limit: float = typer.Option(120.0, "--time-limit", help="Seconds before the search stops with its best so far."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Processes the search may use (default: every core; "
                                                            "1: serial). The plans are the same either way."),
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
    from ..emit.plans import no_fit_document, plan_document, search_info   # the cost model
    from ..emit.writer import check_out_folder
    from ..estimate import estimate as run_estimate
    from ..search.planner import SearchOptions   # numpy
    from ..search.space import recipe_settings
    from ..search.sweep import default_jobs
    check_precision(precision)
    check_fp8_recipe(fp8_recipe, precision)
    _check_output_options(solver, emit, out)
    ch = search_choices(global_batch_size, seq_length, time_limit, zero, fix, gpus, max_gpus, min_gpu_fraction,
                        objective, train_tokens, jobs)
    # every input and output checked before the search (which may take minutes)
    refs = resolve_model_ref(model), resolve_cluster_ref(cluster)
    if out is not None:
        check_out_folder(out, force, refs)
    check_folder(plot)
    m = load_model_ref(model)
    c = load_cluster_ref(cluster)
    budget_options(gpus, max_gpus, min_gpu_fraction, c)
    check_precision_on_cluster(precision, c, fp8_recipe)
    check_objective(c, ch.objective, charge_idle)
    compared, settings = None, ()
    if compare_with is not None:
        # read before the search (a bad file fails at once); its recipe settings are planned with
        om, os_ = load_plan_or_launch(compare_with, c, model if os.path.isfile(str(model)) else None)
        compared = (compare_with, run_estimate(om, c, os_))
        settings = recipe_settings(os_, precision)
    opts = SearchOptions(global_batch_size=global_batch_size, seq_length=seq_length, top=top,
                         fixed=ch.fixed, precision=precision, fp8_recipe=fp8_recipe, zero_stages=ch.zero_stages,
                         solver=solver,
                         time_limit_s=time_limit, allow_tp_across_nodes=allow_tp_across_nodes,
                         uneven_chunks=uneven_chunks, gpus=gpus, max_gpus=max_gpus,
                         min_gpu_fraction=min_gpu_fraction, objective=ch.objective, charge_idle=charge_idle,
                         keep_dominated=all_plans, allow_tight=allow_tight, jobs=jobs or default_jobs(),
                         settings=settings)
    res = _search(m, c, opts, as_json)
    info = search_info(res, opts)
    if not res.plans:
        doc = no_fit_document(res, m, c, info, opts)
        if as_json:
            print_json(doc)
        else:
            error_line(f"error: {doc['error']}")
        raise typer.Exit(1)
    written, plot_done = _emit(res, out, force, refs, plot) if emit == "megatron" else ([], False)
    if as_json:
        print_json(plan_document(res, info, opts, ch.train_tokens, refs[0], written, compared))
    else:
        _render(res, m, c, info, opts, ch.train_tokens, wide, written, explain, compared)
    if plot is not None and not plot_done:
        write_plots(plot, lambda: estimate_plots(plot, res.plans[0], res.priced_estimates), as_json)
    elif plot_done and not as_json:
        console.print(f"wrote the plots into {plot}", markup=False)
    raise typer.Exit(0)


def _check_output_options(solver: str, emit: Optional[str], out: Optional[str]) -> None:
    """--solver, and --emit with --out (each needs the other)."""
    if solver not in ("dp", "ilp", "ilp-highs"):
        raise SpecError("--solver", None, f"found {solver!r}, expected dp, ilp or ilp-highs")
    if emit not in (None, "megatron"):
        raise SpecError("--emit", None, f"found {emit!r}, expected 'megatron'")
    if emit and out is None:
        raise SpecError("--out", None, "required with --emit")
    if out is not None and not emit:
        raise SpecError("--out", None, "needs --emit megatron (nothing else is written there)")


def _search(m, c, opts, as_json: bool):
    """The search, shown live on a terminal (not with --json); its warnings on stderr."""
    from ..search.planner import search   # numpy
    if as_json or not err_console.is_terminal:
        res = search(m, c, opts)
    else:
        with LiveSearch(err_console, opts.objective) as live:
            res = search(m, c, opts, progress=live)
    for w in res.warnings:
        err_console.print(f"warning: {w}", markup=False)
    return res


def _emit(res, out: str, force: bool, refs, plot):
    """--emit megatron: the launch files of the plans written into out; (files, whether the
    plots went in too)."""
    from ..emit.writer import write_plans   # the cost model
    extra = None
    rel = _inside(plot, out) if plot is not None else None
    if rel is not None:
        # --plot inside --out: the pictures are part of the output folder that is swapped in
        # as a whole (and listed in its manifest), so a later --force may replace them
        def extra(staged):
            estimate_plots(staged / rel, res.plans[0], res.priced_estimates)
    written = write_plans(res.plans, out, force, refs, extra=extra,
                          warn=lambda w: err_console.print(f"warning: {w}", markup=False))
    return written, rel is not None


def _inside(path: str, folder: str):
    """path relative to folder when path is folder or inside it (both may not exist yet), else None."""
    a, b = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    try:
        a = a.parent.resolve() / a.name
        b = b.parent.resolve() / b.name
    except (OSError, RuntimeError):
        return None
    return a.relative_to(b) if a == b or b in a.parents else None


def _render(res, m, c, info, opts, train_tokens, wide, written, explain, compared) -> None:
    """The plans table and its notes, the files written, --explain and --compare-with."""
    from ..emit.explain import render_difference, render_explain   # the cost model
    from ..emit.plans import render_plans, settings_text
    render_plans(res, m, c, info, opts, train_tokens, console, wide)
    for w in written:
        console.print(f"wrote {w}", markup=False)
    if explain:
        console.print("\n[bold]Plan #1[/]")
        render_explain(res.plans[0], console, charge_idle=opts.charge_idle)
        if len(res.plans) > 1:
            render_difference(res.plans[0], res.plans[1], console)
    if compared is not None:
        file, other = compared
        console.print(f"\n#1 is predicted {other.step_time_s / res.plans[0].step_time_s:.2f}x the speed of "
                      f"{file} on {c.name} (its verdict: {other.memory_verdict})", markup=False)
        if opts.settings:
            console.print(f"planned with its recipe settings: {settings_text(opts.settings)}", markup=False)
        render_difference(res.plans[0], other, console, "#1", "compared")
