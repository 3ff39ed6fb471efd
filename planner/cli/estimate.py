"""`planner estimate`: memory, communication and step time of one configuration."""

from __future__ import annotations

from typing import List, Optional

import typer

from ..errors import SpecError
from ..library import load_cluster_ref, load_model_ref
from ..megatron.check import launch_json, launch_report, load_launch, parse_settings
from . import app, console, print_json
from .options import check_precision_on_cluster, strategy_from_options
from .plotting import check_folder, estimate_plots, write_plots


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
    from ..emit.explain import render_explain   # the cost model
    from ..emit.report import estimate_to_dict, render_estimate
    from ..estimate import estimate as run_estimate
    from ..megatron.rules import check_megatron   # the launch reader
    check_folder(plot)
    c = load_cluster_ref(cluster)
    report: list[str] = []
    ld = None
    if megatron_args:
        ld = load_launch(megatron_args, c, model, world_size, parse_settings(set_values))
        m, s = ld.model, ld.strategy
        check_megatron(ld.launch, m)
        report = launch_report(ld, verbose)
    else:
        if model is None:
            raise SpecError("--model", None, "required (or give --megatron-args)")
        m = load_model_ref(model)
        s = strategy_from_options(m, c, tp, pp, dp, cp, ep, etp, vpp, micro_batch_size, global_batch_size,
                                  seq_length, recompute, recompute_num_layers, sequence_parallel, zero,
                                  precision, schedule, layers_per_stage, stage_groups, offload_optimizer)
        check_precision_on_cluster(precision, c)
    e = run_estimate(m, c, s)
    if as_json:
        doc = estimate_to_dict(e)
        if ld is not None:
            doc["launch"] = launch_json(ld)
        print_json(doc)
    else:
        render_estimate(e, console)
        for line in report:
            console.print(line, markup=False, highlight=False)
        if explain:
            render_explain(e, console)
    if plot is not None:
        write_plots(plot, lambda: estimate_plots(plot, e, None), as_json)
    raise typer.Exit(0 if e.fits else 1)
