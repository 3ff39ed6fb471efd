"""PNG pictures for `--plot DIR` (matplotlib, the optional `plot` extra):
- timeline.png: the pipeline schedule of one step, stages x time, F/B/W blocks per micro-batch;
- memory.png: per-stage memory by state against the usable capacity;
- candidates.png (plan only): step throughput vs peak memory of every priced candidate, with
  the Pareto front (no other candidate is both faster and lighter);
- sweep.png (sweep): tokens/s of each option's best plan against its GPUs, one line per
  cluster with its ideal linear scaling, and $ per million tokens (or MFU) beside it."""

from __future__ import annotations

from pathlib import Path

from ..units import GIB
from ..errors import PlannerError
from ..estimate import Estimate
from ..cost.timeline import simulate

COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
STATE_COLORS = {"parameters": "#4C72B0", "gradients": "#DD8452", "optimizer": "#55A868",
                "activations": "#C44E52", "buffers": "#8172B3"}
# The timeline is drawn with at most this many micro-batches (the fill and drain, which carry
# the bubble, look the same; the steady state is shorter); the title says so.
MAX_TIMELINE_MICROBATCHES = 16


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlannerError("--plot needs matplotlib: pip install -e '.[plot]'") from None
    return plt


def timeline(e: Estimate, path: Path) -> Path:
    plt = _pyplot()
    s = e.strategy
    m = min(s.num_microbatches, MAX_TIMELINE_MICROBATCHES)
    if s.schedule == "interleaved":   # interleaving needs whole groups of pp micro-batches
        m = min(s.num_microbatches, max(s.pp, m // s.pp * s.pp))
    t = e.stage_times
    blocks = simulate([x.forward_s for x in t], [x.backward_s for x in t], [x.weight_grad_s for x in t],
                      [x.exposed_comm_s for x in t], m, s.vpp, s.schedule)
    fig, ax = plt.subplots(figsize=(12, 0.5 * s.pp + 1.5))
    for b in blocks:
        ax.barh(b.stage, b.end_s - b.start_s, left=b.start_s, color=COLORS[b.kind], edgecolor="white",
                linewidth=0.3, height=0.8)
        if m <= 16 and b.end_s - b.start_s > 0:
            ax.text((b.start_s + b.end_s) / 2, b.stage, str(b.microbatch), ha="center", va="center",
                    fontsize=6, color="white")
    ax.set_yticks(range(s.pp), [f"stage {i} ({t[i].node_group})" for i in range(s.pp)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    shown = "" if m == s.num_microbatches else f", drawn with {m} of its {s.num_microbatches} micro-batches"
    ax.set_title(f"{e.model.name}: {s.schedule} pipeline, pp={s.pp} vpp={s.vpp}{shown}\n"
                 "(list-scheduled from the estimate's per-stage times)", fontsize=10)
    from matplotlib.patches import Patch
    names = {"F": "forward", "B": "backward", "W": "weight grad"}
    ax.legend(handles=[Patch(color=c, label=names[k]) for k, c in COLORS.items() if any(b.kind == k for b in blocks)],
              loc="lower right", fontsize=8)
    return _save(fig, plt, path)


def memory(e: Estimate, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(e.memory) + 3), 4))
    x = range(len(e.memory))
    bottom = [0.0] * len(e.memory)
    for state, color in STATE_COLORS.items():
        vals = [getattr(mm, state) / GIB for mm in e.memory]
        ax.bar(x, vals, bottom=bottom, color=color, label=state)
        bottom = [a + b for a, b in zip(bottom, vals)]
    ax.step([i - 0.5 for i in x] + [len(e.memory) - 0.5], [mm.capacity / GIB for mm in e.memory]
            + [e.memory[-1].capacity / GIB], where="post", color="black", linestyle="--", label="usable")
    ax.set_xticks(list(x), [f"{mm.stage}\n{mm.node_group}" for mm in e.memory], fontsize=7)
    ax.set_ylabel("GiB per GPU")
    ax.set_xlabel("pipeline stage")
    ax.set_title(f"{e.model.name}: memory per GPU by stage")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, plt, path)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points (memory, throughput) that no other point beats on both: less or
    equal memory and more or equal throughput, one strictly."""
    front = []
    for i, (mi, ti) in enumerate(points):
        if not any((mj <= mi and tj >= ti and (mj < mi or tj > ti)) for j, (mj, tj) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def candidates(estimates: list[Estimate], path: Path) -> Path:
    plt = _pyplot()
    pts = [(e.peak_memory.total / e.peak_memory.capacity, e.tokens_per_s) for e in estimates]
    fig, ax = plt.subplots(figsize=(7, 5))
    fits = [p for p, e in zip(pts, estimates) if e.fits]
    over = [p for p, e in zip(pts, estimates) if not e.fits]
    if fits:
        ax.scatter([p[0] * 100 for p in fits], [p[1] for p in fits], s=12, color="#4C72B0", label="fits")
    if over:
        ax.scatter([p[0] * 100 for p in over], [p[1] for p in over], s=12, color="#C44E52", marker="x",
                   label="does not fit")
    front = pareto_front([p for p in fits])
    if front:
        ax.plot([fits[i][0] * 100 for i in front], [fits[i][1] for i in front], color="black", label="Pareto front")
    ax.axvline(100, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("peak memory, % of usable")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{len(estimates)} priced candidates (the bound pruned the rest)")
    ax.legend(fontsize=8)
    return _save(fig, plt, path)


def scaling(outcomes, path: Path, title: str) -> Path:
    """The sweep's picture: per cluster, tokens/s against GPUs used (log-log, with the ideal
    linear scaling from its smallest option dashed), and $ per million tokens where priced,
    else MFU, against the same GPUs. Options without a plan are left out (the table says why)."""
    plt = _pyplot()
    lines: dict = {}
    for x in outcomes:
        if x.plan is not None:
            lines.setdefault(x.option.base, []).append(x)
    priced = any(x.figures.usd_per_million_tokens is not None for xs in lines.values() for x in xs)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for k, (name, xs) in enumerate(lines.items()):
        xs = sorted(xs, key=lambda x: x.figures.gpus_used)
        color = f"C{k % 10}"
        g = [x.figures.gpus_used for x in xs]
        tps = [x.plan.tokens_per_s for x in xs]
        ax.plot(g, tps, marker="o", color=color, label=name)
        ax.plot([g[0], g[-1]], [tps[0], tps[0] * g[-1] / g[0]], linestyle="--", linewidth=0.8, color=color,
                label=f"{name}: linear from {g[0]} GPUs")
        for gi, ti, x in zip(g, tps, xs):
            ax.annotate(f"tp{x.plan.strategy.tp} pp{x.plan.strategy.pp}", (gi, ti), textcoords="offset points",
                        xytext=(4, -10), fontsize=6, color=color)
        if priced:
            usd = [(gi, x.figures.usd_per_million_tokens) for gi, x in zip(g, xs)
                   if x.figures.usd_per_million_tokens is not None]
            if usd:
                ax2.plot([u[0] for u in usd], [u[1] for u in usd], marker="o", color=color, label=name)
        else:
            ax2.plot(g, [x.plan.mfu * 100 for x in xs], marker="o", color=color, label=name)
    from matplotlib.ticker import FixedLocator, NullLocator
    ticks = sorted({x.figures.gpus_used for xs in lines.values() for x in xs})
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.xaxis.set_major_locator(FixedLocator(ticks))
        a.xaxis.set_minor_locator(NullLocator())
        a.set_xticklabels([f"{t:,}" for t in ticks], fontsize=8)
        a.set_xlabel("GPUs used by the best plan")
        a.grid(True, which="both", linewidth=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("tokens/s")
    ax.set_title("throughput", fontsize=10)
    ax.legend(fontsize=7)
    ax2.set_ylabel("$ per million tokens" if priced else "MFU, %")
    ax2.set_title("cost per token" if priced else "model FLOPs utilisation", fontsize=10)
    ax2.legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    return _save(fig, plt, path)


def _save(fig, plt, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)   # atomic: no half-written picture
    return path
