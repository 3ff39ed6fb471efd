"""#7: every CLI option refuses bad input with one line naming it and exit 2; never a traceback."""

import subprocess
import sys

import pytest

PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "256", "--seq-length", "4096"]
EST = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-x8"]


@pytest.mark.parametrize("args,names", [
    (PLAN + ["--fix", "tp=0"], "tp"),
    (PLAN + ["--fix", "mbs=0"], "mbs"),
    (PLAN + ["--fix", "recompute=partial"], "recompute"),
    (PLAN + ["--fix", "zero=4"], "zero"),
    (PLAN + ["--fix", "tpp=2"], "tp"),
    (PLAN + ["--top", "0"], "--top"),
    (PLAN + ["--time-limit", "-5"], "--time-limit"),
    (PLAN + ["--precision", "bf61"], "bf16"),
    (PLAN + ["--zero-stages", "0,5"], "--zero-stages"),
    (PLAN + ["--solver", "gurobi"], "--solver"),
    (PLAN + ["--bogus", "3"], "--bogus"),
    (EST + ["--precision", "bf61"], "--precision"),
    (EST + ["--recompute", "some"], "--recompute"),
    (EST + ["--schedule", "gpipe"], "--schedule"),
    (EST + ["--zero", "7"], "--zero"),
    (EST + ["--layers-per-stage", "a,b"], "--layers-per-stage"),
    (["schema", "modle"], "model"),
    (["compare", "nope.json", "nope2.json", "--cluster", "dgx-h100-x8"], "nope.json"),
])
def test_bad_option_is_one_line_exit_2(args, names):
    r = subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and names in lines[0], r.stderr
    assert "Traceback" not in r.stderr
