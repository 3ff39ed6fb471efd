"""`planner sweep` output: one row per option (cluster x node counts) with its best plan,
tokens/s, $ per million tokens and days; the JSON document; the scaling picture."""

from __future__ import annotations

from .plans import OBJECTIVE_TEXT, cost_cells, plan_entry, tokens_text


def plan_text(e) -> str:
    s = e.strategy
    return (f"tp{s.tp} pp{s.pp} dp{s.dp} cp{s.cp} ep{s.ep} vpp{s.vpp} mbs{s.micro_batch_size} "
            f"{s.recompute_label} z{s.zero_stage}")


def render_sweep(outcomes, model, o, train_tokens, console) -> None:
    from rich.table import Table

    priced = any(x.figures is not None and x.figures.usd_per_million_tokens is not None for x in outcomes)
    t = Table(title=f"Sweep: {model.name}, global batch {o.global_batch_size} x {o.seq_length} tokens "
                    f"(the best plan of each option by {OBJECTIVE_TEXT[o.objective]})")
    cols = ["cluster", "nodes", "GPUs", "best plan", "GPUs used", "step s", "tokens/s"]
    cols += ["$/M tokens"] if priced else []
    cols += ["days"] if train_tokens is not None else []
    cols += ["$ total"] if priced and train_tokens is not None else []
    cols += ["MFU", "search"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("cluster", "nodes", "best plan", "search") else "right")
    for x in outcomes:
        row = [x.option.base, x.option.label, f"{x.option.cluster.num_gpus:,}"]
        if x.plan is None:
            row += [x.error or "no plan", "-", "-", "-"] + ["-"] * (len(cols) - 9) + ["-", x.status]
        else:
            f, e = x.figures, x.plan
            row += [plan_text(e), f"{f.gpus_used:,}", f"{e.step_time_s:.3f}", f"{e.tokens_per_s:,.0f}"]
            row += cost_cells(f, priced, train_tokens)
            row += [f"{e.mfu * 100:.1f}%", _status(x)]
        t.add_row(*row)
    console.print(t)
    if train_tokens is not None:
        console.print(f"days and $ total for {tokens_text(train_tokens)} tokens", markup=False)
    if priced:
        console.print("$: " + ("every GPU of each cluster, idle ones too (--charge-idle)" if o.charge_idle else
                               "the GPUs each plan uses (idle GPUs are not charged)"), markup=False)


def _status(x) -> str:
    text = f"{x.seconds:.1f} s, " + ("optimal" if x.status == "optimal" else x.status)
    if x.status == "time-limit":
        text += f" (gap {x.gap * 100:.1f}%)"
    return text


def sweep_document(outcomes, model, model_file, o, train_tokens) -> dict:
    rows = []
    for x in outcomes:
        rows.append({"cluster": x.option.base, "nodes": dict(x.option.nodes), "gpus": x.option.cluster.num_gpus,
                     "status": x.status, "gap": x.gap, "seconds": round(x.seconds, 3),
                     "candidates": x.candidates, "priced": x.priced, "error": x.error,
                     "plan": None if x.plan is None else plan_entry(x.plan, x.figures, model_file)})
    return {"model": {"name": model.name, "parameters": model.parameters, "active_parameters": model.active_parameters,
                      "file": str(model_file)},
            "objective": o.objective, "train_tokens": train_tokens, "global_batch_size": o.global_batch_size,
            "seq_length": o.seq_length, "options": rows}
