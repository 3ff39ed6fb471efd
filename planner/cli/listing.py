"""The listing commands: models, clusters, gpus (the bundled specs) and schema."""

from __future__ import annotations

import typer
from rich.table import Table

from ..errors import SpecError
from ..library import (bundled_cluster_names, bundled_model_names, bundled_profile_names, load_bundled_profile,
                       load_cluster_ref, load_model_ref)
from ..specs.schema import schema as spec_schema
from ..yamlio import suggest
from . import app, console, print_json


@app.command()
def models():
    """List the bundled model specs with total and active parameter counts."""
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
    t = Table(title="Bundled clusters (one row per node group; links per node unless said; scale-up within a "
                    "node, or within an N-GPU domain of nodes where said)")
    for col in ("cluster", "GPUs", "node group", "nodes x GPUs", "GPU", "scale-up / GPU", "NICs", "between groups",
                "$/GPU-h"):
        t.add_column(col, justify="left" if col in ("cluster", "node group", "GPU", "between groups") else "right")
    for n in bundled_cluster_names():
        c = load_cluster_ref(n)
        links = [f"{ic.a}-{ic.b} {ic.bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s, {ic.latency_s * 1e6:g} us"
                 for ic in c.interconnects]
        for k, g in enumerate(c.node_groups):
            t.add_row(n if k == 0 else "", f"{c.num_gpus:,}" if k == 0 else "", g.name,
                      f"{g.nodes} x {g.gpus_per_node}", g.gpu.name, f"{g.intra_node_bandwidth_bytes_per_s / 1e9:g} GB/s"
                      + (f", {g.domain_gpus}-GPU domain" if g.scale_up_domain_gpus else ""),
                      f"{g.nics_per_node} x {g.nic_bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s",
                      "; ".join(links) if k == 0 and links else ("-" if k == 0 else ""),
                      "-" if g.price_per_gpu_hour is None else f"{g.price_per_gpu_hour:g}")
    console.print(t)


@app.command()
def gpus():
    """List the bundled hardware profiles."""
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
    kinds = ("model", "cluster", "profile")
    if kind not in kinds:
        raise SpecError("schema", None, f"found {kind!r}, expected one of {', '.join(kinds)}{suggest(kind, kinds)}")
    print_json(spec_schema(kind))
