"""The validation sets as tests: what docs/accuracy.md's table states must stay true.
(The full tables: python validation/bridge.py, python validation/memory.py.)"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "validation"))

import bridge  # noqa: E402
import memory  # noqa: E402

from planner.cost.memory import MEMORY_UNCERTAINTY, MEMORY_UNCERTAINTY_BYTES  # noqa: E402


def test_every_published_bridge_configuration_is_judged_to_fit():
    """NVIDIA's 23 published Megatron-Bridge pre-training configurations all ran: the gate must
    not refuse one (issue: 18 of 29 were judged not to fit)."""
    rows = bridge.rows()
    assert len(rows) == 23 and all("error" not in r for r in rows)
    assert [r["id"] for r in rows if not r["fits"]] == []


def test_launches_that_ran_break_no_megatron_rule():
    """Every launch in the validation sets ran (NVIDIA's Bridge recipes) or is transcribed as a
    launch Megatron-LM would accept (the published layouts): no rule of planner/megatron/rules.py
    may refuse one. (The EP-overlap rules found the DeepSeek-V3 transcription on PP16 without
    a virtual pipeline, which TransformerConfig refuses.)"""
    import yaml

    from planner.megatron.launch import parse_file
    from planner.megatron.rules import megatron_violations

    perf = {r["id"]: r for r in yaml.safe_load(open(bridge.DATA / "megatron_bridge_perf.yaml"))["rows"]}
    bad = {}
    for row in yaml.safe_load(open(bridge.DATA / "megatron_bridge_launches.yaml"))["rows"]:
        launch = bridge.read_launch(row["launch"], row["id"], perf[row["id"]]["gpus"])
        bad[row["id"]] = [str(v) for v in megatron_violations(launch)]
    for name, world in (("deepseek-v3.sh", 2048), ("llama3-405b-meta.sh", 16384)):
        launch = parse_file(bridge.DATA / "published" / name, env={}, default_world_size=world)
        bad[name] = [str(v) for v in megatron_violations(launch)]
    assert len(bad) == 25 and not any(bad.values()), {k: v for k, v in bad.items() if v}


def test_dense_bridge_step_times_within_ten_percent():
    rows = [r for r in bridge.rows() if r["id"].startswith("llama")]
    assert len(rows) == 11
    assert max(abs(r["error_pct"]) for r in rows) < 10.0, [(r["id"], round(r["error_pct"], 1)) for r in rows]


def test_measured_memory_peaks_within_the_stated_uncertainty():
    """Megatron-LM CI runs' measured last-stage peaks: within the uncertainty the TIGHT verdict
    states (dense / MoE), and the 7B-class dense runs within 3%."""
    rows = memory.rows()
    assert len(rows) >= 17 and all("error" not in r for r in rows)
    for r in rows:
        u = MEMORY_UNCERTAINTY["moe" if "moe" in r["id"] else "dense"]
        margin = u * r["predicted_last_stage_bytes"] + MEMORY_UNCERTAINTY_BYTES
        assert abs(r["measured_bytes"] - r["predicted_last_stage_bytes"]) <= margin, r
    big = [r for r in rows if "-7b-" in r["id"]]
    assert len(big) == 4 and all(abs(r["error_pct"]) < 3.0 for r in big)


def test_runs_with_a_known_outcome_get_the_gate_verdict_they_earned():
    """Public runs that trained are not refused; runs that ran out of memory are not passed as FITS.
    The Llama-3-70B SFT launch OOMed in 30-60% of runs with PyTorch's default allocator and passed
    with expandable segments (Megatron-Bridge PR 3107): TIGHT, then FITS. GPT-2 774M on one V100
    (Megatron-LM issue 525) needs more than the device: DOES NOT FIT."""
    rows = {r["id"]: r for r in memory.outcome_rows()}
    assert len(rows) == 6 and all("error" not in r and not r["violations"] for r in rows.values())
    assert all(r["agrees"] for r in rows.values()), [(k, r["verdict"]) for k, r in rows.items() if not r["agrees"]]
    assert rows["mbridge-llama3-70b-sft-fp8cs-tp4pp4vpp5-noexpseg-h100"]["verdict"] == "tight"
    assert rows["mbridge-llama3-70b-sft-fp8cs-tp4pp4vpp5-expseg-h100"]["verdict"] == "fits"
    assert rows["mlm-issue-525-gpt2-774m-v100-oom"]["verdict"] == "does not fit"


def test_slower_kernels_never_shorten_a_step_with_ep_overlap():
    """--overlap-moe-expert-parallel-comm hides the all-to-alls under the other micro-batch's
    phase: its wall time, the host's kernel issue when that is longer. Slower GEMMs must then
    never give a shorter step (they once did: on NVIDIA's Qwen3-235B H100 launch, host-bound, a
    half-speed grouped GEMM hid 3 s more all-to-all than it added)."""
    from dataclasses import replace

    import yaml
    from planner.estimate import layer_time_of, estimate

    rid = "qwen3_235b_a22b-h100-sxm-80g-fp8-cs-25.11"
    row = {r["id"]: r for r in yaml.safe_load(open(bridge.DATA / "megatron_bridge_launches.yaml"))["rows"]}[rid]
    perf = {r["id"]: r for r in yaml.safe_load(open(bridge.DATA / "megatron_bridge_perf.yaml"))["rows"]}[rid]
    launch = bridge.read_launch(row["launch"], rid, perf["gpus"])
    assert launch.strategy.overlap_moe_expert_parallel_comm
    cluster = bridge.dgx_cluster(row["system"], perf["gpus"])
    g = cluster.node_groups[0]
    steps = []
    for scale in (1.0, 0.8, 0.6, 0.4):
        eff = g.gpu.efficiency
        gpu = replace(g.gpu, efficiency=replace(eff, matmul=eff.matmul * scale, matmul_fp8=eff.matmul_fp8 * scale))
        layer_time_of.cache_clear()
        steps.append(estimate(launch.model, replace(cluster, node_groups=(replace(g, gpu=gpu),)), launch.strategy).step_time_s)
    layer_time_of.cache_clear()
    assert steps == sorted(steps), steps
