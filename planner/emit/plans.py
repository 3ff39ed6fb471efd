"""`planner plan` output: the table and the JSON document of the top plans (GPUs used and idle
per node group, cost and time to a token budget, whether #1 is optimal), and the message when
no plan fits."""

from __future__ import annotations

from ..units import GIB
from ..search.objective import Figures, figures
from .explain import differing_terms
from .report import compress_runs, estimate_to_dict

# The GPUs-needed hint: bf16 parameters (2 bytes), fp32 gradients (4), fp32 main parameters and
# two Adam moments (12) per parameter, Megatron-LM's distributed-optimizer table
# (docs/source/api-guide/dist_optimizer.md, "fp16 param, fp32 grads"), unsharded by ZeRO...
MODEL_STATE_BYTES_PER_PARAM = 18
# ...over this share of each GPU's usable memory (the rest left to activations and buffers):
# the hint is a size to aim for, not a plan.
MODEL_STATE_SHARE = 0.8
OBJECTIVE_TEXT = {"throughput": "step time", "cost": "$ per million tokens", "time-to-train": "days to train"}


def group_use_text(fig: Figures, idle: bool) -> str:
    """'64' on one node group; 'h100 32 a100 16' on several (the used, or with `idle` the idle,
    GPUs of each group that has any)."""
    if len(fig.groups) == 1:
        return str(fig.groups[0].idle if idle else fig.groups[0].used)
    parts = [f"{g.name} {g.idle if idle else g.used}" for g in fig.groups if (g.idle if idle else g.used)]
    return " ".join(parts) or "0"


def tokens_text(n: float) -> str:
    """2e12 -> '2T' (the largest SI suffix that keeps a short mantissa)."""
    for suffix, mult in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= mult:
            return f"{n / mult:.4g}{suffix}"
    return f"{n:.4g}"


def cost_cells(fig: Figures, priced: bool, train_tokens, with_total: bool = True) -> list[str]:
    """The $/M tokens, days and $ total cells of a table row, for the inputs that exist."""
    cells = []
    if priced:
        cells.append("-" if fig.usd_per_million_tokens is None else f"{fig.usd_per_million_tokens:.3f}")
    if train_tokens is not None:
        cells.append(f"{fig.days_to_train:.1f}")
    if with_total and priced and train_tokens is not None:
        cells.append("-" if fig.usd_total is None else f"{fig.usd_total:,.0f}")
    return cells


def plan_entry(e, fig: Figures, model_file=None) -> dict:
    """One plan of `plan --json`: the estimate's blocks plus the model, the GPUs used and idle
    (in total and per node group) and the cost block (null where its inputs are missing)."""
    d = estimate_to_dict(e)
    model = dict(d["model"])
    if model_file is not None:
        model["file"] = str(model_file)
    return {
        "model": model, "plan": d["plan"], "memory": d["memory"], "time": d["time"],
        "throughput": d["throughput"], "communication": d["communication"],
        "gpus_used": fig.gpus_used, "gpus_idle": fig.gpus_idle,
        "node_groups": [{"name": g.name, "gpu": g.gpu, "gpus": g.gpus, "used": g.used, "idle": g.idle,
                         "price_per_gpu_hour": g.price_per_gpu_hour} for g in fig.groups],
        "cost": {"tokens_per_s": fig.tokens_per_s, "usd_per_hour": fig.usd_per_hour,
                 "usd_per_million_tokens": fig.usd_per_million_tokens, "train_tokens": fig.train_tokens,
                 "days_to_train": fig.days_to_train, "usd_total": fig.usd_total,
                 "idle_gpus_charged": fig.idle_charged},
    }


def plan_figures(res, train_tokens, charge_idle) -> list[Figures]:
    """The figures of each plan, with the token budget the output reports against."""
    return [figures(e, train_tokens, charge_idle) for e in res.plans]


def search_info(res, o) -> dict:
    """The "search" block of `plan --json`: what the search priced, pruned and how it ended,
    under which options."""
    return {"candidates": res.candidates, "pruned": res.pruned_memory + res.pruned_bound + res.pruned_dominated,
            "pruned_memory": res.pruned_memory, "pruned_bound": res.pruned_bound,
            "pruned_dominated": res.pruned_dominated, "priced": res.priced, "seconds": round(res.seconds, 3),
            "solver": res.solver, "status": res.status, "optimality_gap": res.optimality_gap,
            "objective": o.objective, "gpus": o.gpus, "max_gpus": o.max_gpus,
            "min_gpu_fraction": o.min_gpu_fraction, "charge_idle": o.charge_idle, "all": o.keep_dominated,
            "allow_tight": o.allow_tight}


def plan_document(res, info: dict, o, train_tokens, model_file=None, emitted=(), compared=None) -> dict:
    """The document `plan --json` prints: the top plans (plan_entry each), the search block
    `info`, the fastest TIGHT plan left out, the files emitted, and with `compared` (the file
    and the estimate of --compare-with) that plan beside #1 and the terms that differ."""
    figs = plan_figures(res, train_tokens, o.charge_idle)
    doc = {"status": res.status, "gap": res.optimality_gap, "objective": o.objective, "train_tokens": train_tokens,
           "search": info, "idle_node_groups": res.idle_groups,
           "plans": [plan_entry(e, f, model_file) for e, f in zip(res.plans, figs)]}
    if res.fastest_tight is not None:
        doc["fastest_tight"] = plan_entry(res.fastest_tight, figures(res.fastest_tight, train_tokens, o.charge_idle),
                                          model_file)
    if emitted:
        doc["emitted"] = list(emitted)
    if compared is not None:
        file, other = compared
        doc["compare_with"] = {"file": file, "estimate": estimate_to_dict(other),
                               "top_plan_speedup": other.step_time_s / res.plans[0].step_time_s,
                               "differing_terms": [{"term": k, "top_s": a, "compared_s": b}
                                                   for k, a, b in differing_terms(res.plans[0], other)],
                               "settings_planned_with": {k: v for k, v in o.settings}}
    return doc


def settings_text(settings) -> str:
    """The recipe settings a search planned with (SearchOptions.settings), as 'field value'."""
    return ", ".join(f"{k} {'on' if v is True else v}" for k, v in settings)


def no_fit_document(res, m, c, info: dict, o) -> dict:
    """The document `plan --json` prints when no plan fits: the search block, the closest plan
    and what to try; its "error" is the one line `plan` prints without --json."""
    from ..search.diagnose import budget_rule, empty_space_reason   # numpy, kept off `planner --help`
    e = res.closest
    doc = {"status": "no-plan" if res.status == "optimal" else res.status, "gap": None, "search": info,
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
        doc["closest"] = {"plan": {"tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp, "ep": s.ep,
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
    doc["error"] = text
    return doc


def optimality_text(info: dict) -> str:
    """Whether #1 is the optimum of the space under the cost model, or how far it may be."""
    if info["status"] == "time-limit":
        return (f"#1 is within {info['optimality_gap'] * 100:.1f}% of the optimum: the search stopped at its time "
                "limit, and no plan left unpriced can be better by more (its bound)")
    if info["optimality_gap"] > 0:
        return (f"#1 is within {info['optimality_gap'] * 100:.2f}% of the optimum: a stage-partition DP hit its "
                "work cap")
    if not info.get("allow_tight"):
        return ("#1 is optimal under the cost model: no plan of the space that fits with margin is better "
                "(every one left unpriced is bounded)")
    return "#1 is optimal under the cost model: no plan of the space is better (every one left unpriced is bounded)"


def tight_lines(res, o) -> list[str]:
    """The TIGHT rows explained, and (safe by default) the faster TIGHT plan left out."""
    out = []
    tight = [k for k, e in enumerate(res.plans, 1) if e.memory_verdict == "tight"]
    if tight:
        u = res.plans[0].memory[0].uncertainty
        out.append(f"TIGHT: plan(s) {', '.join(f'#{k}' for k in tight)} fit, but by less than the memory model's "
                   f"stated uncertainty ({u * 100:.0f}% + 256 MiB): they may run out of memory"
                   + ("" if o.allow_tight else "; listed after every plan that fits with margin"))
    ft = res.fastest_tight
    if ft is not None and res.plans and ft is not res.plans[0]:
        s = ft.strategy
        gain = res.plans[0].step_time_s / ft.step_time_s - 1
        speed = f"{abs(gain):.1%} " + ("faster" if gain >= 0 else "slower")
        out.append(f"not ranked: a TIGHT plan would rank above #1 ({ft.step_time_s:.3f} s a step, {speed} than #1; tp{s.tp} pp{s.pp} dp{s.dp} cp{s.cp} ep{s.ep} vpp{s.vpp} mbs{s.micro_batch_size} "
                   f"{s.recompute_label} z{s.zero_stage}, {ft.peak_memory.total / GIB:.1f}/"
                   f"{ft.peak_memory.capacity / GIB:.1f} GiB); --allow-tight ranks TIGHT plans with the others")
    return out


_UNLIMITED_COLUMNS = 10**4


def layout_text(s) -> str:
    """The compact layout cell: the degrees above 1 in Megatron's order, e.g. 'tp4 pp4 vpp5
    dp32' ('dp1' when nothing is split)."""
    parts = [f"{k}{v}" for k, v in (("tp", s.tp), ("cp", s.cp), ("ep", s.ep), ("pp", s.pp), ("vpp", s.vpp),
                                    ("dp", s.dp)) if v > 1]
    return " ".join(parts) or "dp1"


def _plans_table(res, m, c, figs, priced, train_tokens, wide: bool):
    """The plans table: every column (wide), or the compact one a 100-column terminal holds
    (layout in one cell; stages, GPU use and TFLOP/s left to --wide / --explain)."""
    from rich.table import Table

    t = Table(title=f"Top plans: {m.name} on {c.name} ({c.num_gpus} GPUs)")
    if wide:
        cols = ["#", "tp pp dp cp ep vpp", "mbs", "recompute", "zero", "layers/stage", "stages on", "GPUs used",
                "idle", "GiB used/usable", "step s", "tokens/s"]
    else:   # with prices, $/M tokens stands for tokens/s (and days for $ total)
        cols = ["#", "layout", "mbs", "recompute", "zero", "GiB used/usable", "step s"]
        cols += [] if priced else ["tokens/s"]
    cols += ["$/M tokens"] if priced else []
    cols += ["days"] if train_tokens is not None else []
    cols += ["$ total"] if wide and priced and train_tokens is not None else []
    cols += ["TFLOP/s", "MFU"] if wide else ["MFU"]
    moe = m.is_moe
    if moe:   # the MoE communication overlap each plan runs, beside its recompute
        cols.insert(cols.index("recompute") + 1, "MoE overlap")
    for col in cols:
        t.add_column(col, justify="right", overflow="fold")
    for k, (e, f) in enumerate(zip(res.plans, figs), 1):
        s = e.strategy
        pk = e.peak_memory
        memory = f"{pk.total / GIB:.1f}/{pk.capacity / GIB:.1f}" + (" TIGHT" if e.memory_verdict == "tight" else "")
        if wide:
            row = [str(k), f"{s.tp} {s.pp} {s.dp} {s.cp} {s.ep} {s.vpp}", str(s.micro_batch_size),
                   s.recompute_label, str(s.zero_stage), compress_runs([str(x) for x in s.stage_layers(m)]),
                   compress_runs(e.stage_groups), group_use_text(f, False), group_use_text(f, True), memory,
                   f"{e.step_time_s:.3f}", f"{e.tokens_per_s:,.0f}"]
        else:
            row = [str(k), layout_text(s), str(s.micro_batch_size), s.recompute_label, str(s.zero_stage), memory,
                   f"{e.step_time_s:.3f}"] + ([] if priced else [f"{e.tokens_per_s:,.0f}"])
        row += cost_cells(f, priced, train_tokens, with_total=wide)
        row += ([f"{e.model_tflops_per_gpu:.0f}"] if wide else []) + [f"{e.mfu * 100:.1f}%"]
        if moe:
            row.insert(cols.index("MoE overlap"), s.moe_overlap_label)
        t.add_row(*row)
    return t


def render_plans(res, m, c, info: dict, o, train_tokens, console, wide: bool = False) -> None:
    """The plans table (the full one when the terminal holds it or with `wide`, else the
    compact one) and the lines that explain it."""
    figs = plan_figures(res, train_tokens, o.charge_idle)
    priced = any(f.usd_per_million_tokens is not None for f in figs)
    from rich.measure import Measurement

    t = _plans_table(res, m, c, figs, priced, train_tokens, wide=True)
    # the width the full table takes unfolded (measured without the terminal's limit)
    natural = Measurement.get(console, console.options.update_width(_UNLIMITED_COLUMNS), t).maximum
    compact = not wide and natural > console.width
    if compact:
        t = _plans_table(res, m, c, figs, priced, train_tokens, wide=False)
    console.print(t)
    first = res.plans[0]
    legend = (("layout: the degrees above 1 (tp cp ep pp vpp dp); --wide adds stages, GPU use and TFLOP/s; "
               if compact else "TFLOP/s: model FLOPs per second per GPU; ")
              + f"MFU against the {first.mfu_basis}")
    console.print(legend + (" (fp8 plans too)" if first.strategy.precision == "fp8" else ""), markup=False)
    ranked = OBJECTIVE_TEXT[o.objective]
    if o.objective == "time-to-train":
        ranked += (" (the order of step time: every plan trains --global-batch-size x --seq-length tokens a step)")
    console.print(f"ranked by {ranked} (--objective {o.objective})"
                  + (f"; days for {tokens_text(train_tokens)} tokens" if train_tokens is not None else ""),
                  markup=False)
    if priced:
        console.print("$: " + ("every GPU of the cluster, idle ones too (--charge-idle)" if o.charge_idle else
                               "the GPUs each plan uses; idle GPUs are not charged (--charge-idle charges the "
                               "whole cluster)") + ", at the node groups' price_per_gpu_hour", markup=False)
    console.print(f"searched {info['candidates']} candidates ({info['pruned_memory']} pruned by memory, "
                  f"{info['pruned_bound']} by the bound, {info['pruned_dominated']} dominated, {info['priced']} "
                  f"priced) in {info['seconds']:.1f} s; stage partition solver: {info['solver']}", markup=False)
    console.print(optimality_text(info), markup=False)
    for line in tight_lines(res, o):
        console.print(line, markup=False)
    if res.hidden_dominated and not o.keep_dominated:
        console.print(f"left out: {res.hidden_dominated} priced plan(s) in this range that another plan matches or "
                      "beats on step time, memory" + (", GPUs and $" if priced else " and GPUs")
                      + " (--all lists them)", markup=False)
    if res.idle_groups:
        console.print(f"node groups left idle by the best plan: {', '.join(res.idle_groups)} "
                      "(adding them did not make a better plan under the cost model)", markup=False)


def no_fit_hints(e, o, cluster) -> list[str]:
    """What to try when nothing fits, leaving out what the search already tried or the user
    already asked for."""
    pins = dict(o.fixed)
    hints = []
    tried_recompute = [pins["recompute"]] if "recompute" in pins else list(o.recompute)
    if "full" not in tried_recompute:
        hints.append("full recompute (--fix recompute=full)")
    if "mbs" in pins and pins["mbs"] > 1:
        hints.append(f"a micro-batch below --fix mbs={pins['mbs']}")
    zeros = [pins["zero"]] if "zero" in pins else list(o.zero_stages)
    if 3 not in zeros:
        hints.append("ZeRO-3 / FSDP (" + ("--fix zero=3" if "zero" in pins else
                                         f"--zero-stages {','.join(str(z) for z in sorted(set(zeros) | {3}))}") + ")")
    degrees = [f"{k}={v}" for k, v in o.fixed if k in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp")]
    if degrees:
        hints.append(f"fewer pins than --fix {' --fix '.join(degrees)}")
    hints.append("optimizer offload (planner estimate --offload-optimizer)")
    worst = max(e.memory, key=lambda x: x.total - x.capacity)
    need = e.model.parameters * MODEL_STATE_BYTES_PER_PARAM / (worst.capacity * MODEL_STATE_SHARE)
    cap = o.gpus if o.gpus is not None else o.max_gpus
    if cap is not None and cap < cluster.num_gpus:
        flag = "--gpus" if o.gpus is not None else "--max-gpus"
        hints.append(f"more GPUs than {flag} {cap} (the cluster has {cluster.num_gpus})")
    else:
        hints.append(f"more GPUs (model states alone need about {need:,.0f} GPUs of this size at "
                     f"{MODEL_STATE_BYTES_PER_PARAM} bytes/parameter)")
    return hints
