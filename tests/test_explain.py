"""`--explain`, `--plot` and `planner compare`: what they print and write, as a user runs them."""

import json
import subprocess
import sys

import pytest

from planner.emit.explain import charged_entries, collectives, differing_terms, time_terms
from planner.emit.plots import pareto_front
from planner.estimate import estimate
from planner.library import load_cluster_ref, load_model_ref
from planner.strategy import Strategy

MODEL, CLUSTER = load_model_ref("llama3-8b"), load_cluster_ref("dgx-h100-x8")
PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "128",
        "--seq-length", "4096", "--fix", "tp=2", "--fix", "pp=2"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True)


def test_time_terms_add_up_to_the_step_and_collectives_cover_the_ledger():
    e = estimate(MODEL, CLUSTER, Strategy(tp=2, pp=2, dp=16, vpp=2, micro_batch_size=1, global_batch_size=128,
                                          seq_length=4096, recompute="selective"))
    assert sum(time_terms(e).values()) == pytest.approx(e.step_time_s, rel=1e-9)
    rows = collectives(e)
    assert sum(r["time_s"] for r in rows) == pytest.approx(sum(c.time_s for c in charged_entries(e)), rel=1e-12)
    assert {r["axis"] for r in rows} >= {"tp", "pp", "dp"} and all(r["link"] for r in rows)


def test_differing_terms_name_what_changed():
    base = Strategy(tp=2, pp=2, dp=16, micro_batch_size=1, global_batch_size=128, seq_length=4096, recompute="none")
    a = estimate(MODEL, CLUSTER, base)
    b = estimate(MODEL, CLUSTER, base.with_(recompute="full"))
    terms = dict((k, (va, vb)) for k, va, vb in differing_terms(a, b))
    assert terms["compute"][1] > terms["compute"][0]       # full recompute re-runs the forward
    assert differing_terms(a, a) == []


def test_pareto_front():
    pts = [(1.0, 10.0), (2.0, 20.0), (2.0, 15.0), (3.0, 18.0), (0.5, 5.0)]
    assert pareto_front(pts) == [4, 0, 1]


def test_plan_explain_prints_the_breakdowns():
    r = _cli(*PLAN, "--explain")
    assert r.returncode == 0, r.stderr
    for title in ("Memory per GPU by stage", "Step time", "Collectives per step", "the terms that differ"):
        assert title in r.stdout
    assert "scale-up" in r.stdout or "NICs" in r.stdout


def test_plot_writes_the_pictures(tmp_path):
    pytest.importorskip("matplotlib")
    r = _cli(*PLAN, "--plot", str(tmp_path / "pics"))
    assert r.returncode == 0, r.stderr
    for name in ("timeline.png", "memory.png", "candidates.png"):
        data = (tmp_path / "pics" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    r = _cli("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--tp", "2", "--pp", "4",
             "--schedule", "zb-h1", "--global-batch-size", "64", "--plot", str(tmp_path / "est"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "est" / "timeline.png").is_file() and not (tmp_path / "est" / "candidates.png").exists()


def test_compare_two_plans_and_a_launch(tmp_path):
    out = tmp_path / "out"
    r = _cli(*PLAN, "--top", "2", "--emit", "megatron", "--out", str(out))
    assert r.returncode == 0, r.stderr
    r = _cli("compare", str(out / "plan-1" / "plan.json"), str(out / "plan-2" / "megatron.args"),
             "--cluster", "dgx-h100-x8", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["a"]["time"]["step_s"] <= doc["b"]["time"]["step_s"]
    assert doc["a"]["plan"]["pipeline_model_parallel_size"] == 2
    r = _cli("compare", str(out / "plan-1" / "plan.json"), str(out / "plan-2" / "plan.json"), "--cluster", "dgx-h100-x8")
    assert r.returncode == 0 and "the terms that differ" in r.stdout
    r = _cli("compare", str(out / "plan-1" / "plan.json"), str(tmp_path / "nope.json"), "--cluster", "dgx-h100-x8")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "nope.json" in r.stderr


def test_ledger_exposed_matches_breakdown():
    """--explain's collective ledger and its step-time breakdown agree axis by axis (the
    ledger used to say DP exposed 0 while the breakdown charged it)."""
    from planner.emit.explain import charged_entries
    from planner.estimate import estimate
    from planner.library import load_cluster_ref, load_model_ref
    from planner.strategy import Strategy
    cases = [("llama3-70b", "dgx-h100-x16", Strategy(tp=8, pp=4, dp=4, vpp=5, micro_batch_size=1,
                                                   global_batch_size=256, seq_length=4096, recompute="selective")),
             ("llama3-8b", "dgx-h100-x8", Strategy(tp=1, pp=1, dp=32, cp=2, micro_batch_size=1, global_batch_size=256,
                                                  seq_length=8192, recompute="none", zero_stage=3)),
             ("mixtral-8x22b", "dgx-h100-x32", Strategy(tp=2, pp=8, dp=16, ep=8, etp=1, micro_batch_size=1,
                                                       global_batch_size=512, seq_length=4096, recompute="full",
                                                       overlap_grad_reduce=False, overlap_param_gather=False)),
             ("gpt3-175b", "dgx-h100-x16", Strategy(tp=8, pp=8, dp=2, micro_batch_size=1, global_batch_size=64,
                                                   seq_length=2048, recompute="full"))]
    for mname, cname, s in cases:
        e = estimate(load_model_ref(mname), load_cluster_ref(cname), s)
        ledger: dict = {}
        for c in charged_entries(e):
            axis = "dp" if c.axis in ("dp", "edp", "embedding") else c.axis
            ledger[axis] = ledger.get(axis, 0.0) + c.exposed_s
        charged = e.breakdown["exposed_communication_by_axis"]
        assert set(k for k, v in ledger.items() if v > 0) <= set(charged), (mname, ledger, charged)
        for axis, v in charged.items():
            assert abs(ledger.get(axis, 0.0) - v) <= 1e-9 * e.step_time_s, (mname, axis, ledger, charged)
        assert charged.get("dp", 0.0) > 0 or s.dp == 1


def test_fp8_mfu_says_its_basis():
    """fp8 plans used to print 97.5% 'MFU' with no label: MFU is against the bf16 dense peak, and
    every output says so and gives achieved TFLOP/s per GPU."""
    s = Strategy(tp=2, pp=1, dp=32, micro_batch_size=1, global_batch_size=256, seq_length=4096,
                 recompute="selective", precision="fp8")
    e = estimate(MODEL, CLUSTER, s)
    assert "bf16 dense peak" in e.mfu_label and "fp8 peak" in e.mfu_label
    assert e.mfu_gemm_peak == pytest.approx(e.mfu / 2, rel=1e-3)   # H100: fp8 peak ~ 2 x bf16
    r = _cli("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--tp", "2", "--precision", "fp8", "--json")
    tp = json.loads(r.stdout)["throughput"]
    assert tp["mfu_basis"] == "bf16 dense peak" and tp["model_tflops_per_gpu"] > 0
    r = _cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "128",
             "--seq-length", "4096", "--precision", "fp8", "--fix", "tp=2", "--fix", "pp=1", "--top", "1")
    assert r.returncode == 0 and "MFU against the bf16 dense peak (fp8 plans too)" in r.stdout, r.stdout


def test_plan_compare_with_prices_the_launch_run_today(tmp_path):
    """`plan --compare-with` prices a user's own launch on the same cluster beside #1. The launch
    below is inside the search space, so #1 can be no slower than it under the same cost model."""
    launch = tmp_path / "today.sh"
    launch.write_text(
        "torchrun --nproc-per-node 8 --nnodes 8 pretrain_gpt.py \\\n"
        "  --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \\\n"
        "  --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 8192 \\\n"
        "  --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --position-embedding-type rope \\\n"
        "  --disable-bias-linear --vocab-size 128256 --bf16 --use-flash-attn --use-distributed-optimizer \\\n"
        "  --tensor-model-parallel-size 4 --pipeline-model-parallel-size 1 --micro-batch-size 1 \\\n"
        "  --global-batch-size 128 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1\n")
    base = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "128",
            "--seq-length", "4096", "--compare-with"]
    r = _cli(*base, str(launch), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    cw = doc["compare_with"]
    assert cw["estimate"]["plan"]["tensor_model_parallel_size"] == 4
    assert cw["estimate"]["plan"]["recompute"] == "full"
    assert cw["top_plan_speedup"] == pytest.approx(cw["estimate"]["time"]["step_s"] / doc["plans"][0]["time"]["step_s"])
    assert cw["top_plan_speedup"] >= 1.0
    assert "compute" in {t["term"] for t in cw["differing_terms"]}     # full recompute re-runs the forward
    r = _cli(*base, str(launch))
    assert r.returncode == 0 and "x the speed of" in r.stdout and "the terms that differ" in r.stdout
    r = _cli(*base, str(tmp_path / "nope.sh"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "nope.sh" in r.stderr


# Llama 3 8B on one DGX node with the distributed optimizer, global batch 128 (the compare-with tests add flags)
LLAMA3_8B_LAUNCH = (
    "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
    "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --seq-length 4096 "
    "--max-position-embeddings 8192 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights "
    "--position-embedding-type rope --disable-bias-linear --vocab-size 128256 --bf16 "
    "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 128")


def test_plan_compare_with_plans_with_the_launchs_recipe_settings(tmp_path):
    """The compared launch's training-recipe settings (fp8 parameter all-gather, the
    precision-aware optimizer's dtypes) are planned with, and said so in text and JSON."""
    launch = tmp_path / "today.sh"
    launch.write_text(LLAMA3_8B_LAUNCH + " --tensor-model-parallel-size 2 --fp8-format hybrid --fp8-recipe tensorwise "
                      "--fp8-param-gather --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16\n")
    base = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "128",
            "--seq-length", "4096", "--precision", "fp8", "--compare-with", str(launch), "--top", "1"]
    r = _cli(*base)
    assert r.returncode == 0, r.stderr
    assert "planned with its recipe settings: fp8_param_gather on, use_precision_aware_optimizer on" in r.stdout
    doc = json.loads(_cli(*base, "--json").stdout)
    assert doc["compare_with"]["settings_planned_with"]["exp_avg_dtype"] == "bf16"
    plan = doc["plans"][0]["plan"]
    assert plan["fp8_param_gather"] is True and plan["zero_stage"] >= 1
    assert doc["compare_with"]["top_plan_speedup"] >= 1.0


def test_compare_with_settings_that_need_the_distributed_optimizer_against_zero_0_say_so(tmp_path):
    launch = tmp_path / "today.sh"
    launch.write_text(LLAMA3_8B_LAUNCH + " --use-precision-aware-optimizer\n")
    r = _cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "128",
             "--seq-length", "4096", "--zero-stages", "0", "--compare-with", str(launch))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--zero-stages 0 leaves no ZeRO stage" in r.stderr and "use_precision_aware_optimizer" in r.stderr
