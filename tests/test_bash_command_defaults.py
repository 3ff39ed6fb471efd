"""A default that would run a command (`X=${X:-$(hostname)}`, issue 29): the command is not run,
and the value is one the planner cannot know, named by the variable it defaults (X), which
`--set X=...` (or the environment) gives; it is never replaced by a guess."""

import os
import subprocess
import sys

import pytest

from planner.bash import read_script
from planner.errors import SpecError
from planner.megatron.launch import parse_text

MODEL = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
         "--seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 --micro-batch-size 1 "
         "--global-batch-size 64 --bf16")
SCRIPT = "X=${X:-$(hostname)}\n" + MODEL + " --tensor-model-parallel-size $X\n"


def _check(tmp_path, text, *extra):
    f = tmp_path / "launch.sh"
    f.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "X"}
    return subprocess.run([sys.executable, "-m", "planner", "check", "--cluster", "dgx-h100-x8", "--megatron-args",
                           str(f), *extra], capture_output=True, text=True, env=env)


def test_a_priced_flag_fed_by_a_command_default_is_a_one_line_error_naming_the_variable(tmp_path):
    r = _check(tmp_path, SCRIPT)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "--tensor-model-parallel-size" in lines[0]
    assert "depends on X," in lines[0] and "--set X=" in lines[0], lines[0]
    assert "hostname" not in lines[0]


def test_the_value_given_with_set_is_the_one_used(tmp_path):
    r = _check(tmp_path, SCRIPT, "--set", "X=4")
    assert r.returncode in (0, 1), r.stderr
    L = parse_text(SCRIPT, "launch.sh", env={}, settings={"X": "4"})
    assert L.strategy.tp == 4


def test_a_no_cost_flag_fed_by_a_command_default_is_listed_as_unknown_by_name(tmp_path):
    text = "X=${X:-$(hostname)}\n" + MODEL + " --tensor-model-parallel-size 1 --save $X/ckpt\n"
    r = _check(tmp_path, text, "--verbose")
    assert r.returncode in (0, 1), r.stderr
    assert "value not known (no effect on the estimate): --save depends on X" in r.stdout, r.stdout
    L = parse_text(text, "launch.sh", env={})
    assert L.unknown_values == (("--save", ("X",)),)


@pytest.mark.parametrize("text", ["X=${X:-$(hostname)}", "X=${X-`hostname`}", ": ${X:=$(hostname)}",
                                  'X="${X:-$(hostname)}"', "X=${X:-node-$(hostname)-1}", "X=${X:-${Y:-$(nproc)}}"])
def test_command_defaults_of_every_form_are_unknown_as_the_variable(text):
    res = read_script(text + "\necho $X\n", "s.sh", env={})
    words = res.commands[-1].words
    assert words[1].unknown == ("X",), words


def test_the_command_in_a_default_is_never_run(tmp_path):
    marker = tmp_path / "ran"
    text = f"X=${{X:-$(touch {marker})}}\n" + MODEL + " --tensor-model-parallel-size $X\n"
    with pytest.raises(SpecError, match=r"depends on X,.*--set X="):
        parse_text(text, "launch.sh", env={})
    assert not marker.exists()


def test_a_value_set_in_the_environment_wins_over_the_command_default():
    L = parse_text(SCRIPT, "launch.sh", env={"X": "2"})
    assert L.strategy.tp == 2


def test_a_test_on_a_command_default_stays_undecided():
    res = read_script('X=${X:-$(hostname)}\nif [ -z "$X" ]; then\necho empty\nelse\necho set\nfi\n', "s.sh", env={})
    assert [w.text for w in res.commands[-1].words] == ["echo", "set"]
    assert any("cannot be decided" in n for n in res.notes), res.notes


def test_a_plain_command_substitution_is_still_named_as_written():
    res = read_script("X=$(hostname)\necho $X\n", "s.sh", env={})
    assert res.commands[-1].words[1].unknown == ("$(hostname)",)
