"""Command line: a thin typer + rich layer over the library."""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

import typer
from rich.console import Console

from .errors import InvalidStrategy, PlannerError, SpecError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Auto-parallel planner for large-model training (Megatron-LM).")
console = Console()
err_console = Console(stderr=True)
_DEBUG = {"on": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for unexpected errors.")):
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


def _strategy_from_options(model, cluster, tp, pp, dp, cp, ep, etp, vpp, mbs, gbs, seq, recompute,
                           recompute_num_layers, sp, zero, precision, schedule, layers_per_stage,
                           stage_groups, offload):
    from .strategy import Strategy
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
        except ValueError:
            raise SpecError("--layers-per-stage", None, f"found {layers_per_stage!r}, expected e.g. 20,20,22,18") from None
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
    as_json: bool = typer.Option(False, "--json"),
):
    """Memory, communication and step time of one configuration."""
    from .estimate import estimate as run_estimate
    from .emit.report import estimate_to_dict, render_estimate
    from .library import load_cluster_ref, load_model_ref
    c = load_cluster_ref(cluster)
    if megatron_args:
        from .emit.megatron_parse import parse_file
        from .emit.megatron_rules import check_megatron
        launch = parse_file(megatron_args)
        m = load_model_ref(model) if model else launch.model
        s = launch.strategy
        if launch.world_size is None:
            pass
        check_megatron(launch, m)
    else:
        if model is None:
            raise SpecError("--model", None, "required (or give --megatron-args)")
        m = load_model_ref(model)
        s = _strategy_from_options(m, c, tp, pp, dp, cp, ep, etp, vpp, micro_batch_size, global_batch_size,
                                   seq_length, recompute, recompute_num_layers, sequence_parallel, zero,
                                   precision, schedule, layers_per_stage, stage_groups, offload_optimizer)
    e = run_estimate(m, c, s)
    if as_json:
        _print_json(estimate_to_dict(e))
    else:
        render_estimate(e, console)
    raise typer.Exit(0 if e.fits else 1)


def main() -> None:
    """Entry point: every expected error is one line and exit 2 (1 for invalid/does-not-fit)."""
    try:
        app(standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except PlannerError as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False)
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - the top-level handler of a CLI
        import click
        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(130)
        if _DEBUG["on"] or "--debug" in sys.argv:
            raise
        err_console.print(f"error: unexpected {type(exc).__name__}: {exc} (run with --debug for details)",
                          markup=False, highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
