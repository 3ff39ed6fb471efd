"""The fp8 recipe fp8 plans are made with: by default the one NVIDIA's Megatron-Bridge recipes
train with on the cluster's GPUs (MXFP8 on Blackwell, tensorwise current scaling on Hopper, one
recipe for a launch across both), or --fp8-recipe; emitted in the launch and refused in one line
where Transformer Engine would refuse it."""

import subprocess
import sys

import pytest

from planner.library import load_cluster_ref
from planner.search.space import SearchOptions, fp8_recipe_of
from planner.specs.cluster import cluster_from_dict


def _cluster(*gpus):
    return cluster_from_dict({"name": "c", "node_groups": [
        {"name": f"g{i}", "nodes": 1, "gpus_per_node": 8, "gpu": gpu, "nics_per_node": 8, "nic_bandwidth": "400 Gb/s"}
        for i, gpu in enumerate(gpus)]}, "test")


@pytest.mark.parametrize("gpus,recipe", [(("b200-sxm-180g",), "mxfp8"), (("gb200-186g",), "mxfp8"),
                                         (("h100-sxm-80g",), "tensorwise"),
                                         (("b200-sxm-180g", "h100-sxm-80g"), "tensorwise")])
def test_default_recipe_follows_the_gpus(gpus, recipe):
    o = SearchOptions(global_batch_size=64, seq_length=4096, precision="fp8")
    assert fp8_recipe_of(o, _cluster(*gpus)) == recipe


def test_a_given_recipe_is_kept():
    o = SearchOptions(global_batch_size=64, seq_length=4096, precision="fp8", fp8_recipe="delayed")
    assert fp8_recipe_of(o, load_cluster_ref("dgx-h100-x8")) == "delayed"


def _plan(*args):
    return subprocess.run([sys.executable, "-m", "planner", "plan", "--model", "llama3-8b", "--global-batch-size", "256",
                           "--seq-length", "8192", "--top", "1", *args], capture_output=True, text=True, timeout=300)


def test_the_plan_and_its_launch_carry_the_recipe(tmp_path):
    out = tmp_path / "out"
    r = _plan("--cluster", "dgx-h100-x8", "--precision", "fp8", "--emit", "megatron", "--out", str(out))
    assert r.returncode == 0, r.stderr
    args = (out / "plan-1" / "megatron.args").read_text().split()
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"
    r = _plan("--cluster", "dgx-h100-x8", "--precision", "fp8", "--fp8-recipe", "delayed", "--emit", "megatron",
              "--out", str(tmp_path / "delayed"))
    assert r.returncode == 0, r.stderr
    assert "--fp8-recipe" not in (tmp_path / "delayed" / "plan-1" / "megatron.args").read_text()   # Megatron's default


@pytest.mark.parametrize("args,needle", [
    (("--cluster", "dgx-h100-x8", "--precision", "fp8", "--fp8-recipe", "mxfp8"), "needs Blackwell"),
    (("--cluster", "dgx-h100-x8", "--fp8-recipe", "tensorwise"), "expected it with --precision fp8"),
    (("--cluster", "dgx-h100-x8", "--precision", "fp8", "--fp8-recipe", "current"), "expected one of delayed"),
])
def test_refusals_are_one_line(args, needle):
    r = _plan(*args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "--fp8-recipe" in r.stderr and needle in r.stderr
