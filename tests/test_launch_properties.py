"""Property-based: random Megatron-LM launch scripts, assembled from Megatron's own flag table
(planner/megatron/flags_megatron.json) with shell quoting, variables, arrays, default and
command substitutions and line continuations, never give a traceback through `planner check`:
exit 0, 1 or 2, an exit-2 refusal is one line naming the script, no command in the script is
run, and nothing is written beside it. Bounded (max_examples; PLANNER_FUZZ=N multiplies it,
docs/fuzz.md) and in-process, so the file runs in seconds."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from _cli import ROOT, one_error_line, run_main

FUZZ = max(1.0, float(os.environ.get("PLANNER_FUZZ", "1") or 1))
TABLE = json.loads((ROOT / "planner" / "megatron" / "flags_megatron.json").read_text())["flags"]
FLAGS = [f for f in TABLE if f["options"][0].startswith("--")]

# a launch that reads and fits on dgx-h100-x8 before anything is added to it
BASE = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "4096",
        "--max-position-embeddings", "4096", "--vocab-size", "128256", "--micro-batch-size", "1",
        "--global-batch-size", "64", "--bf16"]

INTS = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 8, 64, -1, 10**12]), st.integers(-10, 100000))
FLOATS = st.one_of(st.sampled_from([0.0, 1.0, 0.5, -1.0, 1e-300, 1e300]), st.floats(allow_nan=False, width=32))
TEXT = st.one_of(st.sampled_from(["alltoall", "flex", "selective", "full", "core_attn", "rope", "RMSNorm", "x y",
                                  "a'b", 'a"b', "$HOME", "*", "", "-", "--", "E|t*8|tL", "(t|)*31"]),
                 st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=10))


def _value(flag: dict):
    kind = flag.get("type")
    if kind == "int":
        return INTS.map(str)
    if kind == "float":
        return FLOATS.map(repr)
    return TEXT


@st.composite
def flag_words(draw) -> list[str]:
    """One flag of Megatron's table with a value of its type (or a wrong one), or none."""
    flag = draw(st.sampled_from(FLAGS))
    opt = flag["options"][0]
    if flag["action"] in ("store_true", "store_false"):
        return [opt]
    if flag.get("nargs") in ("*", "+"):
        return [opt] + draw(st.lists(_value(flag), max_size=3))
    return [opt, draw(st.one_of(_value(flag), TEXT))]


def _quote(word: str, how: int) -> str:
    if how == 0 and word and all(c.isalnum() or c in "-_./=:,+" for c in word):
        return word
    if how == 1 and "'" not in word:
        return f"'{word}'"
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return f'"{escaped}"'


@st.composite
def scripts(draw) -> str:
    """A launch script: the base launch and random flags, each word quoted one way or another,
    some values through variables (with defaults, some of which would run a command), an
    array, line continuations, a launcher in front."""
    words = BASE + [w for ws in draw(st.lists(flag_words(), max_size=6)) for w in ws]
    lines = ["#!/bin/bash", "set -euo pipefail"]
    out = []
    for k, w in enumerate(words):
        style = draw(st.integers(0, 5))
        if style == 4 and not w.startswith("--"):
            name = f"V{k}"
            default = draw(st.sampled_from([f"${{{name}:-{_quote(w, 1)}}}", f"${{{name}:-$(hostname)}}",
                                            f"${{{name}-`date`}}", _quote(w, 2)]))
            lines.append(f"{name}={default}")
            out.append(f'"${name}"' if draw(st.booleans()) else f"${{{name}}}")
        else:
            out.append(_quote(w, style % 3))
    launcher = draw(st.sampled_from(["torchrun --nproc-per-node 8 --nnodes 8", "python", "srun python",
                                     "python -m torch.distributed.run --nproc_per_node 8 --nnodes 8"]))
    if draw(st.booleans()):
        lines.append("ARGS=(\n  " + " \\\n  ".join(out) + "\n)")
        lines.append(f'{launcher} pretrain_gpt.py "${{ARGS[@]}}"')
    else:
        lines.append(f"{launcher} pretrain_gpt.py \\\n  " + " \\\n  ".join(out))
    return "\n".join(lines) + "\n"


@settings(max_examples=max(1, int(60 * FUZZ)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(script=scripts())
def test_random_launch_scripts_never_crash_the_gate(script):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "launch.sh"
        path.write_text(script)
        before = sorted(os.listdir(d))
        rc, out, err = run_main(["check", "--cluster", "dgx-h100-x8", "--megatron-args", str(path)])
        assert sorted(os.listdir(d)) == before, "the gate wrote beside the script"
    assert rc in (0, 1, 2), (rc, out, err, script)
    assert "Traceback" not in out + err and "unexpected" not in err, (err, script)
    if rc == 2:
        line = one_error_line(err)
        assert "launch.sh" in line or "--" in line, (line, script)
    else:
        assert any(v in out for v in ("FITS", "TIGHT", "DOES NOT FIT", "INVALID")), (out, script)
