"""NVIDIA's published Megatron-Bridge runs, read as launches, against the planner.

Usage: python validation/bridge.py [--json] [--as-published]

Each row of validation/data/megatron_bridge_perf.yaml (published tokens/s/GPU on DGX H100 and
DGX B200, exact layouts) is estimated from the Megatron-LM launch of its release's recipe
(validation/data/megatron_bridge_launches.yaml, every setting with its source), through the same
launch reader `planner check` uses, on a cluster of DGX nodes: 8 GPUs on NVLink, 8 x 400 Gb/s
InfiniBand (ConnectX-7) per node. The DGX-GB200 / DGX-GB300 rows of the same release
(megatron_bridge_gb_perf.yaml, megatron_bridge_gb_launches.yaml) run the same way on NVL72 racks:
trays of 4 GPUs, each tray with 4 NICs (ConnectX-7 400 Gb/s on GB200, ConnectX-8 800 Gb/s on
GB300), the trays of one rack on one NVLink domain. The tables do not say how many GPUs of a rack
a job used: assumed 64 (16 of the rack's 18 trays, as examples/clusters/gb200-nvl72-x4.yaml), so a
job of 256 GPUs spans 4 racks and one of 8 GPUs sits in one rack. The rack rows are read with
their job's environment (Bridge sets expandable segments for Llama 3.1 405B on GB200).
Step time measured = global batch x sequence / (tokens/s/GPU x GPUs). Printed per row: measured
and predicted step seconds, the error, the predicted peak memory of the most loaded stage as the
device would show it against the device's memory, and the gate's verdict (fits, tight or DOES NOT
FIT; the DGX launches set no expandable segments, so the margin includes the default allocator's
fragmentation); then the MAPE per system, dense and MoE apart. Every one of these configurations
ran, so a DOES NOT FIT is a finding. `--as-published` uses the table's layout where it differs
from the recipe.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.estimate import estimate  # noqa: E402
from planner.specs.cluster import cluster_from_dict  # noqa: E402

DATA = ROOT / "validation" / "data"
GIB = 2**30
# DGX H100 and DGX B200: 8 GPUs per node, 8 ConnectX-7 at 400 Gb/s (NVIDIA DGX H100 / B200 user guides)
SYSTEMS = {"dgx-h100": "h100-sxm-80g", "dgx-b200": "b200-sxm-180g", "dgx-gb200": "gb200-186g", "dgx-gb300": "gb300-288g"}
# GB200 / GB300 NVL72: 18 compute trays of 4 GPUs per rack, one NIC per GPU (ConnectX-7 400 Gb/s on GB200,
# ConnectX-8 800 Gb/s on GB300; NVIDIA GB200 NVL72 / GB300 NVL72 product pages), as the bundled
# examples/clusters/gb200-nvl72-x4.yaml and gb300-nvl72-x8.yaml describe them
RACK_NIC_BANDWIDTH = {"dgx-gb200": "400 Gb/s", "dgx-gb300": "800 Gb/s"}
TRAY_GPUS = 4
# GPUs of a rack a job uses: not published; assumed 64 (16 of 18 trays), as the bundled rack clusters
RACK_GPUS_IN_USE = 64
DATASETS = (("megatron_bridge_perf.yaml", "megatron_bridge_launches.yaml"),
            ("megatron_bridge_gb_perf.yaml", "megatron_bridge_gb_launches.yaml"))


def dgx_cluster(system: str, gpus: int):
    if system in RACK_NIC_BANDWIDTH:
        return rack_cluster(system, gpus)
    return cluster_from_dict({"name": f"{system}-x{gpus // 8}", "node_groups": [
        {"name": system, "nodes": max(1, gpus // 8), "gpus_per_node": min(8, gpus), "gpu": SYSTEMS[system],
         "nics_per_node": 8, "nic_bandwidth": "400 Gb/s"}]}, "validation/bridge.py")


def rack_cluster(system: str, gpus: int):
    """`gpus` GPUs of NVL72 racks in trays of 4, RACK_GPUS_IN_USE of each rack on one NVLink domain."""
    return cluster_from_dict({"name": f"{system}-{gpus}", "node_groups": [
        {"name": system, "nodes": max(1, gpus // TRAY_GPUS), "gpus_per_node": min(TRAY_GPUS, gpus),
         "scale_up_domain_gpus": min(RACK_GPUS_IN_USE, gpus), "gpu": SYSTEMS[system],
         "nics_per_node": min(TRAY_GPUS, gpus), "nic_bandwidth": RACK_NIC_BANDWIDTH[system]}]}, "validation/bridge.py")


def read_launch(text: str, source: str, world: int, env: dict | None = None):
    from planner.megatron.launch import parse_text
    return parse_text(text, source, env=env or {}, default_world_size=world)


def load(perf_file: str, launches_file: str) -> tuple[dict, list]:
    """(published rows by id, launch rows) of one data set; a launch without its published row is refused."""
    perf = {r["id"]: r for r in yaml.safe_load(open(DATA / perf_file))["rows"]}
    launches = yaml.safe_load(open(DATA / launches_file))["rows"]
    for row in launches:
        if row["id"] not in perf:
            raise SystemExit(f"validation/data/{launches_file}: row id {row['id']!r} has no row in {perf_file}")
        if row["system"] not in SYSTEMS:
            raise SystemExit(f"validation/data/{launches_file}: row {row['id']!r} field system: {row['system']!r}, "
                             f"expected one of {', '.join(SYSTEMS)}")
    return perf, launches


def rows(as_published: bool = False, datasets=DATASETS) -> list[dict]:
    """Every row of `datasets` ((published file, launches file) pairs), estimated."""
    out = []
    for perf_file, launches_file in datasets:
        perf, launches = load(perf_file, launches_file)
        out += _rows(perf, launches, as_published)
    return out


def _rows(perf: dict, launches: list, as_published: bool) -> list[dict]:
    out = []
    for row in launches:
        p = perf[row["id"]]
        text = row["launch"]
        if as_published and row.get("launch_as_published"):
            text = row["launch_as_published"]["launch"]
        cluster = dgx_cluster(row["system"], p["gpus"])
        measured = p["gbs"] * p["seq"] / (p["tokens_per_s_per_gpu"] * p["gpus"])
        rec = {"id": row["id"], "system": row["system"], "measured_s": measured,
               "dense": p["shape"]["family"] == "dense", "precision": p["precision"]}
        # rack rows carry their job environment (clean values); the DGX rows' env is documentation only
        env = row["env"] if row["system"] in RACK_NIC_BANDWIDTH else None
        try:
            launch = read_launch(text, row["id"], p["gpus"], env)
            e = estimate(launch.model, cluster, launch.strategy)
        except Exception as exc:   # a row the planner cannot read or price is reported, not hidden
            rec.update(error=f"{type(exc).__name__}: {exc}")
            out.append(rec)
            continue
        peak = max(e.memory, key=lambda m: m.device_total / m.device_bytes)
        rec.update(predicted_s=e.step_time_s, error_pct=100 * (e.step_time_s - measured) / measured,
                   peak_device_bytes=peak.device_total, device_bytes=peak.device_bytes, fits=e.fits,
                   verdict=e.memory_verdict, stage=peak.stage)
        out.append(rec)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--as-published", action="store_true", help="the table's layout where it differs from the recipe")
    a = ap.parse_args(argv)
    out = rows(a.as_published)
    summary = {}
    for system in SYSTEMS:
        mine = [r for r in out if r["system"] == system]
        errs = [abs(r["error_pct"]) for r in mine if "error_pct" in r]
        dense = [abs(r["error_pct"]) for r in mine if "error_pct" in r and r["dense"]]
        moe = [abs(r["error_pct"]) for r in mine if "error_pct" in r and not r["dense"]]
        summary[system] = {"rows": len(errs), "mape_pct": sum(errs) / len(errs) if errs else None,
                           "dense_mape_pct": sum(dense) / len(dense) if dense else None, "dense_rows": len(dense),
                           "moe_mape_pct": sum(moe) / len(moe) if moe else None, "moe_rows": len(moe),
                           "judged_to_fit": sum(r["fits"] for r in mine if "fits" in r),
                           "tight": sum(r.get("verdict") == "tight" for r in mine),
                           "unreadable": sum(1 for r in mine if "error" in r)}
    if a.json:
        print(json.dumps({"rows": out, "summary": summary}, indent=2))
        return
    print(f"{'row':50s} {'measured':>9s} {'predicted':>9s} {'error':>7s} {'peak GiB / device':>18s} verdict")
    for r in out:
        if "error" in r:
            print(f"{r['id']:50s} {r['measured_s']:9.3f}  cannot price: {r['error']}")
            continue
        mem = f"{r['peak_device_bytes'] / GIB:6.1f} / {r['device_bytes'] / GIB:6.1f}"
        print(f"{r['id']:50s} {r['measured_s']:9.3f} {r['predicted_s']:9.3f} {r['error_pct']:+6.1f}% {mem:>18s} "
              f"{r['verdict'] if r['verdict'] != 'does not fit' else 'DOES NOT FIT'} (stage {r['stage']})")
    for system, s in summary.items():
        if not s["rows"] and not s["unreadable"]:
            continue

        def pct(x):
            return f"{x:.1f}%" if x is not None else "-"
        print(f"{system}: step-time MAPE {pct(s['mape_pct'])} over {s['rows']} rows (dense {pct(s['dense_mape_pct'])} "
              f"over {s['dense_rows']}, MoE {pct(s['moe_mape_pct'])} over {s['moe_rows']}); {s['judged_to_fit']} of "
              f"{s['rows']} judged to fit (all ran; {s['tight']} of them TIGHT); {s['unreadable']} unreadable")


if __name__ == "__main__":
    main()
