"""Does the planner rank layouts as they measured? Published sets of one MoE model on one system run in several layouts.

Usage: python validation/ranking.py [--json] [--terms]

Each set of validation/data/moe_ranking.yaml is one model on one cluster (GPU, node count, fabric) run in several
layouts, each row with its source. Every row is a Megatron-LM launch read by the launch reader `planner check` uses
and priced with planner.estimate on the set's DGX cluster (validation/bridge.py's dgx_cluster): rows named
`bridge_row` are the launches of validation/data/megatron_bridge_launches.yaml as validation/bridge.py prices them,
`derive_from` rows edit one of those launches to another release's recipe, Model Zoo rows are the set's
`launch_base` plus the row's flags. Throughput per GPU, measured: the published tokens/s/GPU, or
global batch x sequence / (step seconds x GPUs) where a step time is published (exact); predicted: the same
from the estimated step time.

Printed per set: each row's measured and predicted tokens/s/GPU, the Spearman rank correlation between them (ties
take their average rank), and every pair the planner orders wrongly: predicted faster, measured slower, with how
much slower it measured (its step took that much longer); pairs measured >= 15% slower are flagged (the issue's
bar: the planner never prefers a layout that measured >= 15% slower). `--terms` adds each row's step-time breakdown
(compute, exposed communication per axis, bubble, optimizer: estimate's breakdown) and, per wrong pair, the terms
that differ. Nothing is fitted here: a wrong order is a finding, not a constant to change.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.estimate import estimate  # noqa: E402
from planner.megatron.rules import megatron_violations  # noqa: E402
from validation.bridge import SYSTEMS, dgx_cluster, read_launch  # noqa: E402

DATA = ROOT / "validation" / "data"
RANKING = DATA / "moe_ranking.yaml"
BRIDGE_PERF = DATA / "megatron_bridge_perf.yaml"
BRIDGE_LAUNCHES = DATA / "megatron_bridge_launches.yaml"
# Issue 25 ("Done when"): the planner never prefers a layout that measured >= 15% slower than one it was compared with.
FLAG_SLOWER_PCT = 15.0
METRICS = ("tokens_per_s_per_gpu", "step_time_s")
# layout key of moe_ranking.yaml -> Strategy field it is checked against
LAYOUT_FIELDS = {"tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "etp": "etp", "vpp": "vpp", "mbs": "micro_batch_size"}


class RankingDataError(ValueError):
    pass


def _need(obj: dict, key: str, where: str, what: str):
    if not isinstance(obj, dict) or key not in obj:
        raise RankingDataError(f"{RANKING.name}: {where}: field '{key}' missing; expected {what}")
    return obj[key]


def load(path: Path = RANKING) -> dict:
    """The ranking sets, checked: every set has a system, metric and rows; every row one way to build its launch,
    a measured figure of the set's metric and a source (its own, or its Bridge row's)."""
    doc = yaml.safe_load(path.read_text())
    sets = _need(doc, "sets", "top level", "a list of sets")
    perf = {r["id"]: r for r in yaml.safe_load(BRIDGE_PERF.read_text())["rows"]}
    launches = {r["id"]: r for r in yaml.safe_load(BRIDGE_LAUNCHES.read_text())["rows"]}
    seen = set()
    for s in sets:
        sid = _need(s, "id", "a set", "a set id")
        if sid in seen:
            raise RankingDataError(f"{path.name}: sets: id '{sid}' repeated; expected unique set ids")
        seen.add(sid)
        system = _need(s, "system", f"set {sid}", "a system (name, gpu, nodes, gpus_per_node, nics_per_node, nic_bandwidth)")
        name = _need(system, "name", f"set {sid}.system", f"one of {sorted(SYSTEMS)}")
        if SYSTEMS.get(name) != _need(system, "gpu", f"set {sid}.system", "a GPU id"):
            raise RankingDataError(f"{path.name}: set {sid}.system: gpu '{system['gpu']}' is not the GPU of '{name}'; "
                                   f"expected {SYSTEMS.get(name)}")
        metric = _need(s, "metric", f"set {sid}", f"one of {METRICS}")
        if metric not in METRICS:
            raise RankingDataError(f"{path.name}: set {sid}.metric: '{metric}'; expected one of {METRICS}")
        for key in ("seq", "global_batch", "source"):
            _need(s, key, f"set {sid}", "the set's " + key)
        rows = _need(s, "rows", f"set {sid}", "a list of rows")
        if len(rows) < 2:
            raise RankingDataError(f"{path.name}: set {sid}.rows: {len(rows)} row(s); expected at least 2 to rank")
        for r in rows:
            rid = _need(r, "id", f"set {sid}.rows", "a row id")
            where = f"set {sid}, row {rid}"
            ways = [k for k in ("bridge_row", "derive_from", "flags") if k in r]
            if len(ways) != 1:
                raise RankingDataError(f"{path.name}: {where}: has {ways or 'none'}; expected exactly one of bridge_row, "
                                       "derive_from, flags")
            if "bridge_row" in r:
                if r["bridge_row"] not in perf or r["bridge_row"] not in launches:
                    raise RankingDataError(f"{path.name}: {where}: bridge_row '{r['bridge_row']}' is not a row of "
                                           f"{BRIDGE_PERF.name} with a launch in {BRIDGE_LAUNCHES.name}")
                if metric != "tokens_per_s_per_gpu":
                    raise RankingDataError(f"{path.name}: {where}: Bridge rows publish tokens/s/GPU; expected the set's "
                                           "metric tokens_per_s_per_gpu")
                continue
            if "derive_from" in r and r["derive_from"] not in launches:
                raise RankingDataError(f"{path.name}: {where}: derive_from '{r['derive_from']}' is not a launch of "
                                       f"{BRIDGE_LAUNCHES.name}")
            if "flags" in r:
                _need(s, "launch_base", f"set {sid}", "the Megatron-LM flags every row of the set shares")
            measured = _need(r, "measured", where, f"a measured figure ({metric})")
            value = _need(measured, metric, f"{where}.measured", f"the set's metric {metric}, a positive number")
            if not isinstance(value, (int, float)) or value <= 0:
                raise RankingDataError(f"{path.name}: {where}.measured.{metric}: {value!r}; expected a positive number")
            _need(r, "source", where, "where the measured figure was published")
            _need(r, "layout", where, "the layout as published")
    return {"sets": sets, "skipped": doc.get("skipped", []), "perf": perf, "launches": launches}


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation: Pearson's correlation of the ranks, ties given their average rank
    (Spearman 1904; the tie rule of scipy.stats.spearmanr). None when fewer than two values or a side is all ties."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman: {len(xs)} x values, {len(ys)} y values; expected as many of each")
    if len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / (sxx * syy) ** 0.5


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ascending; equal values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def edit_flags(text: str, set_flags: dict, add_flags: list, remove_flags: list) -> str:
    """A launch with flags set (`set_flags`: a value replaces an existing flag's first value word, a list all its
    values; an absent flag is appended), switches appended (`add_flags`) and flags dropped with their values (`remove_flags`: the words up
    to the next flag). Flags are the shell words starting with '--'."""
    words = shlex.split(text)
    out: list[str] = []
    i = 0
    done = set()
    while i < len(words):
        w = words[i]
        j = i + 1
        while j < len(words) and not words[j].startswith("--"):
            j += 1
        values = words[i + 1:j] if w.startswith("--") else []
        if not w.startswith("--"):
            out.append(w)
            i += 1
            continue
        if w in remove_flags:
            done.add(w)
        elif w in set_flags and isinstance(set_flags[w], list):   # a list: all the flag's values replaced
            out += [w, *map(str, set_flags[w])]
            done.add(w)
        elif w in set_flags:   # one value: the first word replaced, the words after it kept (the script)
            out += [w, str(set_flags[w]), *values[1:]]
            done.add(w)
        else:
            out += [w, *values]
        i = j
    missing = [f for f in remove_flags if f not in done]
    if missing:
        raise RankingDataError(f"{RANKING.name}: remove_flags {missing}: not in the launch derived from")
    for flag, value in set_flags.items():
        if flag not in done:
            out += [flag, *map(str, value if isinstance(value, list) else [value])]
    present = set(out)
    for flag in add_flags:
        if flag in present:
            raise RankingDataError(f"{RANKING.name}: add_flags {flag}: already in the launch derived from")
        out.append(flag)
    return shlex.join(out)


def row_launch(s: dict, r: dict, data: dict) -> str:
    if "bridge_row" in r:
        return data["launches"][r["bridge_row"]]["launch"]
    if "derive_from" in r:
        return edit_flags(data["launches"][r["derive_from"]]["launch"], r.get("set_flags") or {},
                          r.get("add_flags") or [], r.get("remove_flags") or [])
    sysd = s["system"]
    return (f"torchrun --nnodes {sysd['nodes']} --nproc-per-node {sysd['gpus_per_node']} pretrain_gpt.py "
            f"{s['launch_base']} {r['flags']}")


def measured_tokens_per_s_per_gpu(s: dict, r: dict, data: dict, gpus: int) -> float:
    """Tokens/s/GPU as published, or global batch x seq / (step s x GPUs) from a published step time (exact)."""
    if "bridge_row" in r:
        return float(data["perf"][r["bridge_row"]]["tokens_per_s_per_gpu"])
    m = r["measured"]
    if s["metric"] == "tokens_per_s_per_gpu":
        return float(m["tokens_per_s_per_gpu"])
    return s["global_batch"] * s["seq"] / (m["step_time_s"] * gpus)


def price_row(s: dict, r: dict, data: dict) -> dict:
    sysd = s["system"]
    gpus = sysd["nodes"] * sysd["gpus_per_node"]
    rec = {"id": r["id"], "measured_tokens_per_s_per_gpu": measured_tokens_per_s_per_gpu(s, r, data, gpus)}
    launch = read_launch(row_launch(s, r, data), r["id"], gpus)
    broken = megatron_violations(launch)   # a launch Megatron-LM would refuse never ran: a transcription error
    if broken:
        raise RankingDataError(f"{RANKING.name}: set {s['id']}, row {r['id']}: {broken[0]}; expected a launch Megatron-LM accepts")
    st = launch.strategy
    if (st.global_batch_size, st.seq_length) != (s["global_batch"], s["seq"]):
        raise RankingDataError(f"{RANKING.name}: set {s['id']}, row {r['id']}: launch has global batch "
                               f"{st.global_batch_size}, seq {st.seq_length}; expected the set's {s['global_batch']}, {s['seq']}")
    for key, field in LAYOUT_FIELDS.items():
        if key in r.get("layout", {}) and getattr(st, field) != r["layout"][key]:
            raise RankingDataError(f"{RANKING.name}: set {s['id']}, row {r['id']}: layout.{key} {r['layout'][key]} but the "
                                   f"launch gives {getattr(st, field)}; expected them equal")
    rec["layout"] = {key: getattr(st, field) for key, field in LAYOUT_FIELDS.items()}
    precision = st.precision if st.precision != "fp8" else f"fp8-{st.fp8_recipe}"
    rec["layout"].update(recompute=st.recompute, precision=precision, dispatcher=st.moe_token_dispatcher_type,
                         ep_overlap=bool(st.overlap_moe_expert_parallel_comm),
                         token_drop=bool(st.moe_pad_expert_input_to_capacity))
    e = estimate(launch.model, dgx_cluster(sysd["name"], gpus), launch.strategy)
    rec.update(predicted_step_s=e.step_time_s,
               predicted_tokens_per_s_per_gpu=s["global_batch"] * s["seq"] / (e.step_time_s * gpus),
               verdict=e.memory_verdict, breakdown=_terms(e.breakdown))
    return rec


def _terms(b: dict) -> dict:
    """estimate's step breakdown as flat named seconds per step."""
    out = {k: v for k, v in b.items() if isinstance(v, float)}
    for axis, v in (b.get("exposed_communication_by_axis") or {}).items():
        out[f"exposed_{axis}"] = v
    return out


def wrong_pairs(rows: list[dict]) -> list[dict]:
    """Pairs the planner orders wrongly: predicted faster (higher tokens/s/GPU), measured slower. `slower_pct`: how
    much longer the measured-slower row's step took (throughput ratio - 1); flagged at >= FLAG_SLOWER_PCT."""
    out = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            for fast, slow in ((a, b), (b, a)):
                if (fast["predicted_tokens_per_s_per_gpu"] > slow["predicted_tokens_per_s_per_gpu"]
                        and fast["measured_tokens_per_s_per_gpu"] < slow["measured_tokens_per_s_per_gpu"]):
                    pct = 100 * (slow["measured_tokens_per_s_per_gpu"] / fast["measured_tokens_per_s_per_gpu"] - 1)
                    pred = 100 * (fast["predicted_tokens_per_s_per_gpu"] / slow["predicted_tokens_per_s_per_gpu"] - 1)
                    keys = sorted(set(fast["breakdown"]) | set(slow["breakdown"]))
                    delta = {k: fast["breakdown"].get(k, 0.0) - slow["breakdown"].get(k, 0.0) for k in keys
                             if k != "critical_stage"}
                    out.append({"predicted_faster": fast["id"], "measured_faster": slow["id"],
                                "measured_slower_pct": pct, "predicted_faster_pct": pred,
                                "flagged": pct >= FLAG_SLOWER_PCT, "term_delta_s": delta})
    return out


def evaluate(data: dict | None = None) -> dict:
    data = data or load()
    out = []
    for s in data["sets"]:
        rows = [price_row(s, r, data) for r in s["rows"]]
        rho = spearman([r["predicted_tokens_per_s_per_gpu"] for r in rows],
                       [r["measured_tokens_per_s_per_gpu"] for r in rows])
        out.append({"id": s["id"], "model": s["model"], "system": s["system"], "n": len(rows), "spearman": rho,
                    "rows": rows, "wrong_pairs": wrong_pairs(rows)})
    pairs = sum(x["n"] * (x["n"] - 1) // 2 for x in out)
    wrong = [p for x in out for p in x["wrong_pairs"]]
    rhos = [x["spearman"] for x in out if x["spearman"] is not None and x["n"] >= 3]
    overall = {"sets": len(out), "rows": sum(x["n"] for x in out), "pairs": pairs, "wrong_pairs": len(wrong),
               "flagged_pairs": sum(p["flagged"] for p in wrong),
               "sets_with_3_or_more_rows": len(rhos), "min_spearman_3_or_more": min(rhos) if rhos else None,
               "mean_spearman_3_or_more": sum(rhos) / len(rhos) if rhos else None,
               "skipped": len(data["skipped"])}
    return {"sets": out, "overall": overall, "skipped": data["skipped"]}


def _fmt_rho(x):
    return f"{x:+.2f}" if x is not None else "n/a"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--terms", action="store_true", help="each row's step breakdown and each wrong pair's differing terms")
    ap.add_argument("--launch", metavar="ROW", help="print the Megatron-LM launch a row is priced from (for planner estimate "
                    "--megatron-args FILE --explain) and exit")
    a = ap.parse_args(argv)
    if a.launch:
        data = load()
        for s in data["sets"]:
            for r in s["rows"]:
                if r["id"] == a.launch:
                    print(row_launch(s, r, data))
                    return
        raise SystemExit(f"error: {a.launch}: no row of that id in {RANKING.name}")
    res = evaluate()
    if a.json:
        print(json.dumps(res, indent=2))
        return
    for x in res["sets"]:
        sysd = x["system"]
        print(f"== {x['id']}: {x['model']} on {sysd['nodes']} x {sysd['name']} ({sysd['nodes'] * sysd['gpus_per_node']} GPUs)")
        print(f"   {'row':52s} {'measured':>9s} {'predicted':>9s}  tp pp cp ep vpp mbs recompute  precision       dispatcher ovl drop verdict")
        for r in sorted(x["rows"], key=lambda r: -r["measured_tokens_per_s_per_gpu"]):
            L = r["layout"]
            print(f"   {r['id']:52s} {r['measured_tokens_per_s_per_gpu']:9.0f} {r['predicted_tokens_per_s_per_gpu']:9.0f}  "
                  f"{L['tp']:2d} {L['pp']:2d} {L['cp']:2d} {L['ep']:2d} {L['vpp']:3d} {L['mbs']:3d} {L['recompute']:10s} "
                  f"{L['precision']:15s} {L['dispatcher']:10s} {'y' if L['ep_overlap'] else '-':>3s} "
                  f"{'y' if L['token_drop'] else '-':>4s} {r['verdict']}")
            if a.terms:
                print("      terms (s/step): " + ", ".join(f"{k} {v:.2f}" for k, v in r["breakdown"].items()))
        print(f"   n {x['n']}, Spearman rho {_fmt_rho(x['spearman'])}, wrong pairs {len(x['wrong_pairs'])} "
              f"({sum(p['flagged'] for p in x['wrong_pairs'])} measured >= {FLAG_SLOWER_PCT:.0f}% slower)")
        for p in x["wrong_pairs"]:
            print(f"   {'FLAG ' if p['flagged'] else 'wrong'} {p['predicted_faster']} predicted {p['predicted_faster_pct']:.1f}% "
                  f"faster than {p['measured_faster']}, measured {p['measured_slower_pct']:.1f}% slower")
            if a.terms:
                big = sorted(p["term_delta_s"].items(), key=lambda kv: -abs(kv[1]))[:4]
                print("         predicted-faster minus other (s/step): " + ", ".join(f"{k} {v:+.2f}" for k, v in big))
    o = res["overall"]
    print(f"overall: {o['sets']} sets, {o['rows']} rows, {o['pairs']} pairs: {o['wrong_pairs']} ordered wrongly, "
          f"{o['flagged_pairs']} of them measured >= {FLAG_SLOWER_PCT:.0f}% slower; Spearman over the "
          f"{o['sets_with_3_or_more_rows']} sets of 3+ rows: min {_fmt_rho(o['min_spearman_3_or_more'])}, "
          f"mean {_fmt_rho(o['mean_spearman_3_or_more'])}; {o['skipped']} published groups skipped (moe_ranking.yaml: skipped)")


if __name__ == "__main__":
    main()
