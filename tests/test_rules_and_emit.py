import json
import os
import subprocess
import sys

import pytest
import yaml

from planner.megatron.emit import checked_args, layout_string
from planner.megatron.launch import parse_file, parse_text, parse_words
from planner.megatron.rules import megatron_violations
from planner.megatron.shell import tokenize
from planner.errors import SpecError
from planner.estimate import estimate
from planner.library import load_cluster_ref, load_model_ref
from planner.strategy import Strategy


def test_rules_agree_with_megatron_vectors(reference):
    vec = yaml.safe_load(open(reference / "megatron_vectors.yaml"))
    for v in vec["rules"]:
        L = parse_words(tokenize(v["args"], "v"), "v", world_size=v["world_size"])
        assert (not megatron_violations(L)) == v["accepted"], v["name"]


def test_parser_handles_shell_forms(monkeypatch):
    text = """# a launch script
torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py \\
  --num-layers 32 --hidden-size=4096 --num-attention-heads 32 \\
  --seq-length "$SEQ" --max-position-embeddings 4096 --vocab-size 32000 \\
  --micro-batch-size 1 --global-batch-size 64 --tensor-model-parallel-size 2 \\
  --data-path /x/y --lr 3e-4  # comment
"""
    L = parse_text(text, "launch.sh", env={"SEQ": "4096"})
    assert L.world_size == 16 and L.strategy.tp == 2 and L.strategy.dp == 8
    assert L.strategy.seq_length == 4096 and "--data-path" in L.no_cost and "--lr" in L.no_cost
    with pytest.raises(SpecError, match="SEQ"):
        parse_text(text, "launch.sh", env={})


def test_layout_string_roundtrip():
    m = load_model_ref("llama3-8b")
    s = Strategy(pp=4, dp=2, layers_per_stage=(7, 9, 9, 7), global_batch_size=64)
    assert layout_string(m, s) == "Et*7|t*9|t*9|t*7L"


@pytest.mark.parametrize("model,cluster,kw", [
    ("llama3-8b", "dgx-h100-x8", dict(tp=2, pp=2, dp=16, vpp=4, global_batch_size=128)),
    ("llama3-70b", "dgx-h100-x16", dict(tp=8, pp=4, dp=4, layers_per_stage=(18, 22, 22, 18), global_batch_size=256)),
    ("mixtral-8x7b", "dgx-h100-x8", dict(tp=2, pp=2, dp=16, ep=8, etp=1, global_batch_size=128)),
    ("deepseek-v3", "dgx-h100-x128", dict(tp=8, pp=8, dp=16, ep=64, etp=1, recompute="full", global_batch_size=1024,
                                          layers_per_stage=(7, 8, 8, 8, 8, 8, 7, 7))),
])
def test_emitted_launch_round_trips(model, cluster, kw):
    m, c = load_model_ref(model), load_cluster_ref(cluster)
    s = Strategy(seq_length=4096, **kw)
    args = checked_args(m, s)
    back = parse_words(args, "emitted", world_size=s.world_size)
    assert not megatron_violations(back, m)
    e1 = estimate(m, c, s)
    e2 = estimate(back.model, c, back.strategy.with_(stage_node_groups=None))
    assert e2.step_time_s == pytest.approx(e1.step_time_s, rel=1e-9)
    assert max(x.total for x in e2.memory) == pytest.approx(max(x.total for x in e1.memory), rel=1e-9)


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, env=env)


def test_check_gate_exit_codes(tmp_path, reference):
    vec = yaml.safe_load(open(reference / "megatron_vectors.yaml"))
    ok = next(v for v in vec["rules"] if v["name"] == "ok-baseline")
    f = tmp_path / "ok.sh"
    f.write_text(f"torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py {ok['args']}\n")
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(f))
    assert r.returncode == 0, r.stderr
    bad = next(v for v in vec["rules"] if v["name"] == "layers-not-divisible-by-pp")
    f2 = tmp_path / "bad.sh"
    f2.write_text(f"torchrun --nnodes 3 --nproc-per-node 8 pretrain_gpt.py {bad['args']}\n")
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(f2))
    assert r.returncode == 1 and "divisible" in r.stdout
    # does not fit: 70B with no sharding on 8 GPUs
    f3 = tmp_path / "oom.sh"
    f3.write_text("torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 80 --hidden-size 8192 "
                  "--num-attention-heads 64 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 "
                  "--micro-batch-size 1 --global-batch-size 8 --bf16\n")
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(f3), "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["fits"] is False
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(tmp_path / "missing.sh"))
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr


def test_plan_emit_and_no_traceback(tmp_path):
    out = tmp_path / "out"
    r = _cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "128",
             "--seq-length", "4096", "--fix", "tp=2", "--fix", "pp=2", "--json", "--emit", "megatron", "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["plans"] and all(p["memory"]["fits"] for p in doc["plans"])
    args = (out / "plan-1" / "megatron.args").read_text()
    assert "--tensor-model-parallel-size 2" in args
    r2 = _cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "128",
              "--seq-length", "4096", "--fix", "tp=2", "--fix", "pp=2", "--emit", "megatron", "--out", str(out))
    assert r2.returncode == 2 and "--force" in r2.stderr
    r3 = _cli("plan", "--model", "nosuchmodel", "--cluster", "dgx-h100-x8", "--global-batch-size", "8", "--seq-length", "8")
    assert r3.returncode == 2 and "Traceback" not in r3.stderr


def test_plan_reports_when_nothing_fits():
    r = _cli("plan", "--model", "llama3.1-405b", "--cluster", "dgx-h100-x8", "--global-batch-size", "64",
             "--seq-length", "8192", "--json", "--fix", "tp=8", "--zero-stages", "0,1")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["plans"] == [] and doc["closest"]["short_bytes"] > 0


def test_emitted_launch_files_pass_the_gate_as_written(tmp_path):
    """The CI gate reads what `plan --emit` writes: launch.sh with its NNODES=${NNODES:-n}
    defaults and "$@" pass-through, and megatron.args without a world size (the cluster's)."""
    out = tmp_path / "out"
    r = _cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x16", "--global-batch-size", "128",
             "--seq-length", "4096", "--fix", "pp=2", "--emit", "megatron", "--out", str(out))
    assert r.returncode == 0, r.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("NNODES", "GPUS_PER_NODE", "MASTER_ADDR", "NODE_RANK")}
    for name in ("launch.sh", "megatron.args"):
        r = _cli("check", "--cluster", "dgx-h100-x16", "--megatron-args", str(out / "plan-1" / name), "--json", env=env)
        assert r.returncode == 0, (name, r.stdout, r.stderr)
        assert json.loads(r.stdout)["fits"] is True
    # the script exports the allocator setting the plan's memory verdict assumes, and reads back so
    script = out / "plan-1" / "launch.sh"
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in script.read_text()
    assert parse_file(script, env={"MASTER_ADDR": "h", "NODE_RANK": "0"}).strategy.expandable_segments


def test_shell_defaults_and_assignments_in_launch_scripts():
    text = ('NNODES=${NNODES:-2}\nGPUS=8\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n'
            'torchrun --nnodes "$NNODES" --nproc-per-node $GPUS pretrain_gpt.py --num-layers 4 --hidden-size 256 '
            '--num-attention-heads 8 --seq-length 128 --max-position-embeddings 128 --vocab-size 1000 '
            '--micro-batch-size 1 --global-batch-size ${GBS-32} "$@"')
    launch = parse_text(text, "x.sh", env={})
    assert launch.world_size == 16 and launch.strategy.global_batch_size == 32
    assert parse_text(text, "x.sh", env={"NNODES": "4", "GBS": "64"}).world_size == 32
    with pytest.raises(SpecError, match="MB"):
        parse_text(text.replace("--micro-batch-size 1", "--micro-batch-size $MB"), "x.sh", env={})


def test_gate_prices_an_emitted_heterogeneous_launch_as_the_plan(tmp_path):
    """launch.sh carries the stage placement (which node group hosts each stage) in a header
    line, so `check` prices the launch where the plan put it, not in cluster order."""
    out = tmp_path / "out"
    r = _cli("plan", "--model", "llama3-70b", "--cluster", "h100-a100-lab", "--global-batch-size", "512",
             "--seq-length", "4096", "--top", "1", "--json", "--emit", "megatron", "--out", str(out))
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plans"][0]
    groups = [s["node_group"] for s in plan["plan"]["stages"]]
    assert len(set(groups)) == 2 and groups != sorted(groups, key=["h100", "a100"].index)  # A100 stages first
    r = _cli("check", "--cluster", "h100-a100-lab", "--megatron-args", str(out / "plan-1" / "launch.sh"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["step_time_s"] == pytest.approx(plan["time"]["step_s"], rel=1e-9)
    assert [s["node_group"] for s in json.loads(r.stdout)["stages"]] == groups


def test_stages_smaller_than_a_node_share_it_in_the_launch():
    """Regression: a stage of 4 GPUs on 8-GPU nodes took a whole node in the host map, so
    launch.sh started twice the world size."""
    from planner.megatron.emit import launch_script, stage_host_map

    s = Strategy(tp=2, pp=16, dp=2, micro_batch_size=1, global_batch_size=64, seq_length=4096,
                 stage_node_groups=("a100",) * 8 + ("h100",) * 8)
    rows = stage_host_map(s, s.stage_node_groups, {"a100": 8, "h100": 8})
    assert [r["node_ranks"] for r in rows[:3]] == [[0, 0], [0, 0], [1, 1]]
    assert rows[8]["node_ranks"] == [4, 4] and rows[8]["group_nodes"] == [0, 0]
    model = load_model_ref("llama3-70b")
    text = launch_script(checked_args(model, s), s, rows, 8, "plan-x")
    assert "NNODES=${NNODES:-8}" in text
    assert parse_text(text, "launch.sh", env={}).world_size == 64


def test_megatron_fsdp_launch_rules(tmp_path):
    """Found by running Megatron-LM's validate_args on emitted ZeRO-2/3 launches: Megatron-FSDP
    needs --ckpt-format fsdp_dtensor and refuses CUDA_DEVICE_MAX_CONNECTIONS=1
    (arguments.py). The emitted launch satisfies both; the check names each rule."""
    out = tmp_path / "out"
    r = _cli("plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "256",
             "--seq-length", "4096", "--zero-stages", "3", "--top", "1", "--emit", "megatron", "--out", str(out))
    assert r.returncode == 0, r.stderr
    launch = (out / "plan-1" / "launch.sh").read_text()
    assert "--ckpt-format fsdp_dtensor" in launch and "unset CUDA_DEVICE_MAX_CONNECTIONS" in launch
    env = {k: v for k, v in os.environ.items() if k != "NNODES"}
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(out / "plan-1" / "launch.sh"), env=env)
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.sh"
    bad.write_text(launch.replace("unset CUDA_DEVICE_MAX_CONNECTIONS", "export CUDA_DEVICE_MAX_CONNECTIONS=1")
                   .replace("--ckpt-format fsdp_dtensor", "--ckpt-format torch_dist"))
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(bad), "--json", env=env)
    assert r.returncode == 1
    v = " ".join(json.loads(r.stdout)["violations"])
    assert "fsdp-ckpt-format" in v and "fsdp-cuda-connections" in v
