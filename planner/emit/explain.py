"""`--explain`: what a plan's memory and step time are made of, which link bounds each
collective, and which terms make one plan beat another."""

from __future__ import annotations

from ..units import GIB
from ..estimate import Estimate

BAR_WIDTH = 30
STATES = ("parameters", "gradients", "optimizer", "activations", "buffers")
STATE_MARKS = {"parameters": ("P", "blue"), "gradients": ("G", "yellow"), "optimizer": ("O", "green"),
               "activations": ("A", "red"), "buffers": ("B", "magenta")}


def memory_bar(mem) -> str:
    """A rich-markup bar of one stage's memory by state, scaled to its usable capacity
    (BAR_WIDTH characters = capacity; an overflow shows past a '|')."""
    out, used = [], 0
    for state in STATES:
        n = round(getattr(mem, state) / mem.capacity * BAR_WIDTH)
        ch, color = STATE_MARKS[state]
        out.append(f"[{color}]{ch * n}[/]")
        used += n
    bar = "".join(out)
    if used < BAR_WIDTH:
        bar += "." * (BAR_WIDTH - used) + "|"
    else:
        bar += "|"   # already past capacity
    return bar


def time_terms(e: Estimate) -> dict[str, float]:
    """The step time by part (seconds): compute of the critical stage, exposed communication
    per axis, pipeline bubble, optimizer step. They add up to the step time."""
    b = e.breakdown
    terms = {"compute": b["compute"]}
    for axis, v in b["exposed_communication_by_axis"].items():
        terms[f"exposed {axis}"] = v
    terms["bubble"] = b["bubble"]
    terms["optimizer"] = b["optimizer"]
    return terms


def charged_entries(e: Estimate) -> list:
    """The ledger rows the step time pays for: the per-micro-batch collectives of the critical
    stage and the per-step ones of the stage that finishes last. Their exposed seconds add up
    to the breakdown's exposed communication, axis by axis."""
    crit, after = e.breakdown["critical_stage"], e.breakdown["after_step_stage"]
    return [c for c in e.communication
            if (c.when == "per-microbatch" and c.stage == crit) or (c.when == "per-step" and c.stage == after)]


def collectives(e: Estimate) -> list[dict]:
    """The collectives the step time pays for (charged_entries), grouped by (axis, kind, link)."""
    rows: dict = {}
    for c in charged_entries(e):
        key = (c.axis, c.kind, c.link)
        r = rows.setdefault(key, {"axis": c.axis, "kind": c.kind, "link": c.link, "count": 0.0, "bytes": c.bytes,
                                  "group_size": c.group_size, "time_s": 0.0, "exposed_s": 0.0, "stages": set()})
        r["count"] += c.count_per_step
        r["time_s"] += c.time_s
        r["exposed_s"] += c.exposed_s
        r["bytes"] = max(r["bytes"], c.bytes)
        r["stages"].add(c.stage)
    return sorted(rows.values(), key=lambda r: -r["time_s"])


def differing_terms(a: Estimate, b: Estimate) -> list[tuple[str, float, float]]:
    """(term, a, b) for the step-time terms and peak memory, largest difference first."""
    ta, tb = time_terms(a), time_terms(b)
    rows = [(k, ta.get(k, 0.0), tb.get(k, 0.0)) for k in dict.fromkeys(list(ta) + list(tb))]
    rows = [r for r in rows if abs(r[1] - r[2]) > 1e-9 * max(a.step_time_s, b.step_time_s)]
    return sorted(rows, key=lambda r: -abs(r[1] - r[2]))


def strategy_line(e: Estimate) -> str:
    s = e.strategy
    return (f"tp={s.tp} pp={s.pp} dp={s.dp} cp={s.cp} ep={s.ep} vpp={s.vpp} mbs={s.micro_batch_size} "
            f"recompute={s.recompute_label} zero={s.zero_stage} {s.schedule}")


def gpu_use_line(fig) -> str:
    """'GPUs: 48 of 64 used, 16 idle (h100 32 used, 0 idle; a100 16 used, 16 idle)'."""
    per = "; ".join(f"{g.name} {g.used} used, {g.idle} idle" for g in fig.groups)
    return f"GPUs: {fig.gpus_used} of {fig.gpus_used + fig.gpus_idle} used, {fig.gpus_idle} idle ({per})"


def render_explain(e: Estimate, console, charge_idle: bool = False) -> None:
    from rich.table import Table

    from ..search.objective import figures
    fig = figures(e, charge_idle=charge_idle)
    usd = "" if fig.usd_per_hour is None else (f"; ${fig.usd_per_hour:,.2f} an hour, "
                                               f"${fig.usd_per_million_tokens:.3f} per million tokens")
    console.print(gpu_use_line(fig) + usd, markup=False)

    t = Table(title="Memory per GPU by stage against usable capacity "
                    "(P params, G grads, O optimizer, A activations, B buffers; | = capacity)")
    for col in ("stage", "group", "layers", "GiB", "usable", "bar"):
        t.add_column(col, justify="left" if col in ("group", "bar") else "right", no_wrap=True)
    for m in e.memory:
        t.add_row(str(m.stage), m.node_group, str(m.layers), f"{m.total / GIB:.1f}", f"{m.capacity / GIB:.1f}",
                  memory_bar(m))
    console.print(t)
    terms = time_terms(e)
    t2 = Table(title=f"Step time {e.step_time_s:.3f} s by part")
    t2.add_column("part")
    t2.add_column("seconds", justify="right")
    t2.add_column("share", justify="right")
    for k, v in terms.items():
        t2.add_row(k, f"{v:.3f}", f"{v / e.step_time_s * 100:.1f}%")
    console.print(t2)
    t3 = Table(title="Collectives per step on the stages that set the step time (per micro-batch: the critical stage; per step: the last to finish), and the link that bounds each")
    for col in ("axis", "kind", "ranks", "MiB each", "count", "time s", "exposed s", "bounded by"):
        t3.add_column(col, justify="left" if col in ("axis", "kind", "bounded by") else "right")
    for r in collectives(e):
        t3.add_row(r["axis"], r["kind"], str(r["group_size"]), f"{r['bytes'] / 2**20:.1f}", f"{r['count']:g}",
                   f"{r['time_s']:.3f}", f"{r['exposed_s']:.3f}", r["link"])
    console.print(t3)
    from .moe import render_moe_layer
    render_moe_layer(e, console)


def render_difference(a: Estimate, b: Estimate, console, label_a: str = "#1", label_b: str = "#2") -> None:
    from rich.table import Table

    console.print(f"\n[bold]{label_a} ({a.step_time_s:.3f} s) vs {label_b} ({b.step_time_s:.3f} s): "
                  "the terms that differ[/]")
    t = Table()
    for col in ("term", label_a, label_b, f"{label_b} - {label_a}"):
        t.add_column(col, justify="left" if col == "term" else "right")
    for k, va, vb in differing_terms(a, b):
        t.add_row(k, f"{va:.3f}", f"{vb:.3f}", f"{vb - va:+.3f}")
    pa, pb = a.peak_memory, b.peak_memory
    t.add_row("peak memory GiB", f"{pa.total / GIB:.1f}", f"{pb.total / GIB:.1f}", f"{(pb.total - pa.total) / GIB:+.1f}")
    console.print(t)
    console.print(f"{label_a}: {strategy_line(a)}\n{label_b}: {strategy_line(b)}", markup=False)


def render_compare(a: Estimate, b: Estimate, console, title: str) -> None:
    """Two estimates side by side (choices, memory, step-time parts, throughput), then the
    terms that differ."""
    from rich.table import Table

    from .report import compress_runs

    t = Table(title=title)
    t.add_column("")
    t.add_column("A", justify="right")
    t.add_column("B", justify="right")
    rows = [("model", a.model.name, b.model.name)]
    for label, key in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("ep", "ep"), ("vpp", "vpp"),
                       ("micro batch", "micro_batch_size"), ("recompute", "recompute_label"), ("zero", "zero_stage"),
                       ("schedule", "schedule"), ("precision", "precision")):
        rows.append((label, str(getattr(a.strategy, key)), str(getattr(b.strategy, key))))
    rows.append(("layers/stage", compress_runs([str(x) for x in a.strategy.stage_layers(a.model)]),
                 compress_runs([str(x) for x in b.strategy.stage_layers(b.model)])))
    rows.append(("peak GiB / usable", f"{a.peak_memory.total / GIB:.1f} / {a.peak_memory.capacity / GIB:.1f}",
                 f"{b.peak_memory.total / GIB:.1f} / {b.peak_memory.capacity / GIB:.1f}"))
    rows.append(("fits", str(a.fits), str(b.fits)))
    rows.append(("step s", f"{a.step_time_s:.3f}", f"{b.step_time_s:.3f}"))
    ta, tb = time_terms(a), time_terms(b)
    for k in dict.fromkeys(list(ta) + list(tb)):
        rows.append((f"  {k} s", f"{ta.get(k, 0.0):.3f}", f"{tb.get(k, 0.0):.3f}"))
    rows.append(("tokens/s", f"{a.tokens_per_s:,.0f}", f"{b.tokens_per_s:,.0f}"))
    rows.append((f"MFU ({a.mfu_basis})", f"{a.mfu * 100:.1f}%", f"{b.mfu * 100:.1f}%"))
    rows.append(("model TFLOP/s/GPU", f"{a.model_tflops_per_gpu:.0f}", f"{b.model_tflops_per_gpu:.0f}"))
    for r in rows:
        t.add_row(*r)
    console.print(t)
    render_difference(a, b, console, "A", "B")
