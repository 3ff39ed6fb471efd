"""`planner sweep`: the best plan of one model on each cluster and node count, searched in
parallel."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..library import load_cluster_ref, load_model_ref, resolve_model_ref
from ..search.objective import MIN_GPU_FRACTION, check_objective
from . import app, console, err_console, print_json
from .options import (HELP_ALLOW_TIGHT, HELP_CHARGE_IDLE, HELP_MIN_FRACTION, HELP_OBJECTIVE, HELP_TOKENS,
                      HELP_ZERO_STAGES, check_precision, check_precision_on_cluster,
                      search_choices)
from .plotting import check_folder, write_plots


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
    precision: str = typer.Option("bf16", "--precision", help="bf16 | fp16 | fp8 | nvfp4 (nvfp4: Blackwell GPUs)"),
    zero: str = typer.Option("0,1", "--zero-stages", help=HELP_ZERO_STAGES),
    min_gpu_fraction: float = typer.Option(MIN_GPU_FRACTION, "--min-gpu-fraction", help=HELP_MIN_FRACTION,
                                           show_default=True),
    objective: str = typer.Option("throughput", "--objective", help=HELP_OBJECTIVE, show_default=True),
    train_tokens: Optional[str] = typer.Option(None, "--train-tokens", help=HELP_TOKENS),
    charge_idle: bool = typer.Option(False, "--charge-idle", help=HELP_CHARGE_IDLE),
    allow_tight: bool = typer.Option(False, "--allow-tight", help=HELP_ALLOW_TIGHT),
    time_limit: float = typer.Option(120.0, "--time-limit", help="Seconds each search may take."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Searches run at once (default: every core)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Folder for sweep.png, the scaling picture (plot extra)."),
    as_json: bool = typer.Option(False, "--json"),
):
    """What if: the best plan of one model on each cluster and node count, searched in parallel;
    one row each (plan, tokens/s, $ per million tokens, days)."""
    from ..emit.sweep import render_sweep, sweep_document   # the cost model
    from ..search.planner import SearchOptions   # numpy
    from ..search.sweep import default_jobs, parse_nodes, run_sweep, sweep_options
    check_precision(precision)
    ch = search_choices(global_batch_size, seq_length, time_limit, zero, fix, None, None, min_gpu_fraction,
                        objective, train_tokens, jobs)
    every, named = parse_nodes(nodes)
    check_folder(plot)
    model_file = resolve_model_ref(model)
    m = load_model_ref(model)
    clusters = [load_cluster_ref(c) for c in cluster]
    for c in clusters:
        check_objective(c, ch.objective, charge_idle)
        check_precision_on_cluster(precision, c)
    options = sweep_options(clusters, every, named)
    opts = SearchOptions(global_batch_size=global_batch_size, seq_length=seq_length, top=1, fixed=ch.fixed,
                         precision=precision, zero_stages=ch.zero_stages, time_limit_s=time_limit,
                         min_gpu_fraction=min_gpu_fraction, objective=ch.objective, charge_idle=charge_idle,
                         allow_tight=allow_tight)
    n_jobs = jobs or default_jobs()
    if as_json or not err_console.is_terminal:
        outcomes = run_sweep(m, options, opts, ch.train_tokens, n_jobs)
    else:
        from rich.progress import Progress   # rich.progress
        with Progress(transient=True, console=err_console) as prog:
            task = prog.add_task(f"sweep: {len(options)} searches, {min(n_jobs, len(options))} at a time",
                                 total=len(options))
            outcomes = run_sweep(m, options, opts, ch.train_tokens, n_jobs,
                                 on_done=lambda k, n: prog.update(task, completed=k))
    if as_json:
        print_json(sweep_document(outcomes, m, model_file, opts, ch.train_tokens))
    else:
        render_sweep(outcomes, m, opts, ch.train_tokens, console)
    if plot is not None:
        from ..emit import plots   # matplotlib
        title = f"{m.name}: global batch {global_batch_size} x {seq_length} tokens, best plan of each option"
        write_plots(plot, lambda: [plots.scaling(outcomes, Path(plot) / "sweep.png", title)], as_json)
    raise typer.Exit(0 if any(x.plan is not None for x in outcomes) else 1)
