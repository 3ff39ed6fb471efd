"""`planner calibrate`: a calibrated cluster YAML from the cluster's own logs."""

from __future__ import annotations

from typing import List, Optional

import typer

from . import app, console


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
    from ..calibrate.command import run_calibrate   # numpy
    raise typer.Exit(run_calibrate(cluster, megatron_log, megatron_args, nccl_tests, nccl_nodes, nccl_gpus_per_node,
                                   nccl_group, out, as_json, console, force))
