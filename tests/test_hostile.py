"""#16: hostile input. Every case of the issue (outside the launch reader) is refused in one
line naming the file or option, with the exit code a CI gate relies on, or is handled:
files that are not regular files, deep nesting, duplicate keys, numbers out of range,
bad degrees, conflicting pins, a Hugging Face config without its model type, control
characters in names, the terminal environment, PLANNER_DATA_DIR, sequence parallelism."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from _cli import ROOT, env_with, one_error_line, refused, run, run_main, run_tty

EST = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-x8"]
CLUSTER = (ROOT / "examples" / "clusters" / "dgx-h100-x8.yaml").read_text()
MODEL = (ROOT / "model_specs" / "llama3-8b.yaml").read_text()
# a Megatron-LM launch for llama3-8b on dgx-h100-x8 (pretrain_gpt.py flags, as a user writes them)
LAUNCH = ("pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
          "--num-query-groups 8 --ffn-hidden-size 14336 --vocab-size 128256 --max-position-embeddings 16384 "
          "--position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights "
          "--disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0 --pipeline-model-parallel-size 1 "
          "--micro-batch-size 1 --global-batch-size 256 --use-distributed-optimizer --bf16 ")


# ---- files ---------------------------------------------------------------------------------

def test_not_a_regular_file_is_named_for_what_it_is(tmp_path):
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)
    refused(["estimate", "--model", str(tmp_path), "--cluster", "dgx-h100-x8"], "is a directory", "--model")
    refused(["estimate", "--model", str(fifo), "--cluster", "dgx-h100-x8"], "named pipe (FIFO)", "--model")
    refused(["estimate", "--model", "/dev/null", "--cluster", "dgx-h100-x8"], "character device")
    refused(["estimate", "--model", "llama3-8b", "--cluster", str(fifo)], "named pipe (FIFO)", "--cluster")
    refused(["estimate", "--model", str(tmp_path / "nope.yaml"), "--cluster", "dgx-h100-x8"], "file not found")


@pytest.mark.parametrize("value", ["", "  "])
def test_empty_model_names_the_option(value):
    refused(["estimate", "--model", value, "--cluster", "dgx-h100-x8"], "error: --model: found")
    refused(["plan", "--model", "llama3-8b", "--cluster", value, "--global-batch-size", "8", "--seq-length", "8"],
            "error: --cluster: found")


@pytest.mark.parametrize("suffix,text", [
    (".yaml", "name: x\nnode_groups: " + "[" * 5000 + "]" * 5000 + "\n"),
    (".yaml", "name: x\nnode_groups:\n" + "".join("  " * i + "- \n" for i in range(2000))),
    (".json", '{"name": "x", "node_groups": ' + "[" * 100000 + "]" * 100000 + "}"),
])
def test_deep_nesting_is_one_line_naming_the_file(tmp_path, suffix, text):
    f = tmp_path / f"deep{suffix}"
    f.write_text(text)
    refused([*EST[:3], "--cluster", str(f)], str(f), "nested deeper than 64 levels")


def test_duplicate_keys_are_refused_with_key_and_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(CLUSTER.replace("nics_per_node:", "nics_per_node: 1\n    nics_per_node:", 1))
    line = refused([*EST[:3], "--cluster", str(f)], str(f), "duplicate key 'nics_per_node'")
    n = CLUSTER.splitlines().index(next(x for x in CLUSTER.splitlines() if "nics_per_node:" in x)) + 1
    assert f"at line {n + 1} (first at line {n})" in line
    f.write_text("{name: a, name: b}\n")
    refused([*EST[:3], "--cluster", str(f)], "duplicate key 'name' at line 1")
    j = tmp_path / "config.json"
    j.write_text('{"model_type": "llama", "num_hidden_layers": 2, "num_hidden_layers": 4}')
    refused(["estimate", "--model", str(j), "--cluster", "dgx-h100-x8"], str(j), "duplicate key 'num_hidden_layers'")


def test_yaml_merge_keys_may_still_be_overridden():
    from planner.yamlio import load_text
    assert load_text("a: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", "t.yaml")["c"] == {"x": 3, "y": 2}


# ---- numbers with units ----------------------------------------------------------------------

@pytest.mark.parametrize("value,needle", [
    ("1e400 Gb/s", "not a finite bandwidth"),
    ("1e-300 Gb/s", "from 1 Mb/s to 1 PB/s"),
    ("0 Gb/s", "from 1 Mb/s to 1 PB/s"),
    ("1e30 GB/s", "from 1 Mb/s to 1 PB/s"),
])
def test_bandwidth_outside_a_sane_range_is_refused(tmp_path, value, needle):
    f = tmp_path / "c.yaml"
    f.write_text(CLUSTER.replace("400 Gb/s", value))
    assert value in f.read_text()
    refused([*EST[:3], "--cluster", str(f)], str(f), "nic_bandwidth", needle)


def test_unit_bounds_are_the_named_constants():
    from planner import units
    assert units.parse_bandwidth("1 Mb/s") == units.MIN_BANDWIDTH_BYTES_PER_S
    assert units.parse_bandwidth("1000 TB/s") == units.MAX_BANDWIDTH_BYTES_PER_S
    assert units.parse_time("0 s") == 0.0 and units.parse_time("1 s") == units.MAX_TIME_S
    assert units.parse_size("1 MB") == units.MIN_SIZE_BYTES and units.parse_size("1000 TB") == units.MAX_SIZE_BYTES
    for fn, text in ((units.parse_bandwidth, "0.9 Mb/s"), (units.parse_time, "1.5 s"), (units.parse_time, "1e999 us"),
                     (units.parse_size, "0.5 MB"), (units.parse_size, "2000 TB")):
        with pytest.raises(units.UnitError):
            fn(text)


def test_latency_and_memory_out_of_range(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(CLUSTER.replace("gpu: h100-sxm-80g", "gpu: h100-sxm-80g\n    nic_latency: 1e400 us"))
    refused([*EST[:3], "--cluster", str(f)], "nic_latency", "not a finite time")
    f.write_text(CLUSTER.replace("host_memory: 2 TB", "host_memory: 1e-300 GB"))
    refused([*EST[:3], "--cluster", str(f)], "host_memory", "from 1 MB to 1 PB")


# ---- options ---------------------------------------------------------------------------------

@pytest.mark.parametrize("option,value", [("--tp", "0"), ("--pp", "0"), ("--pp", "-1"), ("--cp", "0"), ("--dp", "-2"),
                                          ("--ep", "0"), ("--etp", "0"), ("--vpp", "-3"), ("--micro-batch-size", "0"),
                                          ("--global-batch-size", "-256"), ("--seq-length", "0"),
                                          ("--recompute-num-layers", "0"), ("--tp", "99999999999")])
def test_estimate_degrees_out_of_range_exit_2(option, value):
    refused([*EST, option, value], f"error: {option}: found {value}, expected an integer in [1, ")


@pytest.mark.parametrize("value", ["0,32", "-1,33", "a,b"])
def test_layers_per_stage_must_be_positive(value):
    refused([*EST, "--pp", "2", "--layers-per-stage", value], "--layers-per-stage")


PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "256", "--seq-length", "4096"]


def test_conflicting_pins_are_refused_naming_both():
    refused([*PLAN, "--fix", "tp=2", "--fix", "tp=4"], "--fix: tp:", "tp=2", "tp=4")
    refused([*PLAN, "--fix", "recompute=full", "--fix", "recompute=none"], "recompute=full", "recompute=none")
    rc, out, err = run_main([*PLAN, "--fix", "tp=2", "--fix", "tp=2", "--json", "--top", "1"])
    assert rc == 0, err
    assert json.loads(out)["plans"][0]["plan"]["tensor_model_parallel_size"] == 2


def test_out_without_emit_is_not_silently_ignored(tmp_path):
    refused([*PLAN, "--out", str(tmp_path / "x")], "--out", "--emit megatron")


# ---- Hugging Face detection ------------------------------------------------------------------

def test_hf_config_without_model_type_says_what_was_expected(tmp_path):
    hf = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
          "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(hf))
    refused(["estimate", "--model", str(f), "--cluster", "dgx-h100-x8"], "Hugging Face config.json",
            "neither model_type nor architectures", "expected model_type one of llama")
    f.write_text(json.dumps({**hf, "architectures": ["GPT2LMHeadModel"]}))
    refused(["estimate", "--model", str(f), "--cluster", "dgx-h100-x8"], "GPT2LMHeadModel", "model_type")
    # transformers' architecture name is enough to know the model type
    f.write_text(json.dumps({**hf, "architectures": ["LlamaForCausalLM"]}))
    rc, out, err = run_main(["estimate", "--model", str(f), "--cluster", "dgx-h100-x8", "--json"])
    assert rc in (0, 1) and json.loads(out)["model"]["parameters"] > 8e9, err


# ---- echoed names, error text ----------------------------------------------------------------

def test_control_characters_in_file_names_are_escaped(tmp_path):
    name = tmp_path / "evil\x1b[31mred\nsecond\u202eline.yaml"
    name.write_text("name: [\n")
    line = refused(["estimate", "--model", str(name), "--cluster", "dgx-h100-x8"], "evil\\x1b[31mred\\nsecond\\u202eline.yaml")
    assert "\x1b" not in line and "\u202e" not in line
    r = run(["estimate", "--model", str(name), "--cluster", "dgx-h100-x8"])   # and through a real process
    assert r.returncode == 2 and "\x1b" not in r.stderr and one_error_line(r.stderr)


# ---- the environment -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    d = tmp_path_factory.mktemp("launch")
    (d / "bad.sh").write_text(LAUNCH + "--tensor-model-parallel-size 3 --seq-length 4096\n")
    (d / "ok.sh").write_text(LAUNCH + "--tensor-model-parallel-size 8 --sequence-parallel --seq-length 8192\n")
    return d


def _verdicts(launches, env, tty, ok=False):
    """check on an invalid launch (exit 1, INVALID line), an unusable input (exit 2, error
    line) and, with ok, a valid one (exit 0, FITS line), all under `env`."""
    cases = [("bad.sh", 1, "INVALID"), ("missing.sh", 2, "error:")] + ([("ok.sh", 0, "FITS")] if ok else [])
    for f, code, verdict in cases:
        args = ["check", "--cluster", "dgx-h100-x8", "--megatron-args", str(launches / f)]
        if tty:
            rc, shown = run_tty(args, env=env)
        else:
            r = run(args, env=env)
            rc, shown = r.returncode, r.stdout + r.stderr
            assert "Traceback" not in shown
        assert rc == code, (env, f, rc, shown)
        assert verdict in shown and f in shown, (env, shown)


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "tty"])
@pytest.mark.parametrize("columns", ["abc", "0", "-5", "1", "99999999999999"])
def test_any_columns_prints_the_verdict(launches, columns, tty):
    _verdicts(launches, env_with(COLUMNS=columns, LINES=columns), tty, ok=columns == "0")


@pytest.mark.parametrize("env", [{"TERM": "dumb"}, {"TERM": ""}, {"TERM": "\x1b]evil"}, {"TERM": None},
                                 {"NO_COLOR": "1"}, {"FORCE_COLOR": "1"}, {"LC_ALL": "C"}, {"LANG": "C", "LC_ALL": None},
                                 {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": None}],
                         ids=lambda e: ",".join(f"{k}={v!r}" for k, v in e.items()))
def test_terminal_and_locale_settings_keep_the_verdict(launches, env):
    _verdicts(launches, env_with(**env), tty=False)


def test_ascii_only_output_still_names_a_non_ascii_file(tmp_path):
    d = tmp_path / "sp\u00e9cs"
    d.mkdir()
    (d / "m\u00f6del.sh").write_text(LAUNCH + "--tensor-model-parallel-size 3 --seq-length 4096\n")
    r = run(["check", "--cluster", "dgx-h100-x8", "--megatron-args", str(d / "m\u00f6del.sh")],
            env=env_with(PYTHONIOENCODING="ascii"))
    assert r.returncode == 1 and "INVALID" in r.stdout and "Traceback" not in r.stderr
    r = run(["estimate", "--model", str(d / "n\u00f6.yaml"), "--cluster", "dgx-h100-x8"], env=env_with(PYTHONIOENCODING="ascii"))
    assert r.returncode == 2 and "n\\xf6.yaml" in one_error_line(r.stderr)


def test_planner_data_dir_pointing_nowhere_says_so(tmp_path):
    for cmd in (EST, ["models"]):
        r = run(cmd, env=env_with(PLANNER_DATA_DIR=str(tmp_path / "missing")))
        assert r.returncode == 2
        line = one_error_line(r.stderr)
        assert line.startswith("error: PLANNER_DATA_DIR: ") and "does not exist" in line, line
    # a copy of the data folder works: the variable is read, not ignored
    data = tmp_path / "data"
    for sub in ("hardware_profiles", "model_specs", "examples/clusters"):
        shutil.copytree(ROOT / sub, data / sub)
    r = run([*EST, "--json"], env=env_with(PLANNER_DATA_DIR=str(data)))
    assert r.returncode == 0, r.stderr


# ---- sequence parallelism needs seq_length / cp divisible by tp --------------------------------

def test_sequence_parallel_rule():
    from planner.errors import InvalidStrategy
    from planner.library import load_model_ref
    from planner.strategy import Strategy, check_structure
    m = load_model_ref("llama3-8b")
    base = dict(dp=8, micro_batch_size=1, global_batch_size=256)
    with pytest.raises(InvalidStrategy) as info:
        check_structure(Strategy(tp=8, seq_length=8193, **base), m)
    assert info.value.rule == "sp-seq-divisible-by-tp"
    with pytest.raises(InvalidStrategy):   # with CP: each rank's seq_length / cp tokens are split over tp
        check_structure(Strategy(tp=4, cp=2, seq_length=8196, **base), m)
    check_structure(Strategy(tp=8, seq_length=8193, sequence_parallel=False, **base), m)
    check_structure(Strategy(tp=4, cp=2, seq_length=8200, **base), m)
    check_structure(Strategy(tp=1, seq_length=8193, **base), m)   # Megatron turns SP off at tp 1


def test_plan_never_emits_sequence_parallel_that_megatron_asserts_on(tmp_path):
    rc, out, err = run_main(["plan", "--model", "llama3-70b", "--cluster", "dgx-h100-x16", "--global-batch-size",
                             "256", "--seq-length", "8193", "--top", "3", "--emit", "megatron", "--out",
                             str(tmp_path / "plans")])
    assert rc == 0, err
    for k in (1, 2, 3):
        args = (tmp_path / "plans" / f"plan-{k}" / "megatron.args").read_text()
        tp = int(args.split("--tensor-model-parallel-size ")[1].split()[0])
        assert "--sequence-parallel" not in args or 8193 % tp == 0, args


def test_gate_refuses_sequence_parallel_with_an_indivisible_sequence(launches, tmp_path):
    f = tmp_path / "sp.sh"
    f.write_text(LAUNCH + "--tensor-model-parallel-size 8 --sequence-parallel --seq-length 8193\n")
    rc, out, err = run_main(["check", "--cluster", "dgx-h100-x8", "--megatron-args", str(f)])
    assert rc == 1 and "INVALID" in out and "sp-seq-divisible-by-tp" in out


def test_zero_worlds_are_refused(tmp_path):
    """`torchrun --nnodes 0` used to fall back to the cluster (then crash), `--world-size 0` was
    ignored: both are one line and exit 2."""
    base = ("pretrain_gpt.py --num-layers 2 --hidden-size 512 --num-attention-heads 8 --vocab-size 1000 "
            "--seq-length 512 --max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 --bf16\n")
    zero = tmp_path / "zero.sh"
    zero.write_text("torchrun --nnodes 0 --nproc-per-node 8 " + base)
    ok = tmp_path / "ok.sh"
    ok.write_text("torchrun --nnodes 1 --nproc-per-node 8 " + base)
    for args in (["check", "--cluster", "dgx-h100-x8", "--megatron-args", str(zero)],
                 ["check", "--cluster", "dgx-h100-x8", "--megatron-args", str(ok), "--world-size", "0"],
                 ["estimate", "--cluster", "dgx-h100-x8", "--megatron-args", str(ok), "--world-size", "-2"]):
        r = run(args)
        assert r.returncode == 2 and "world" in one_error_line(r.stderr).lower(), (args, r.stderr)


def test_a_reader_that_goes_away_does_not_change_the_verdict_code(tmp_path):
    """`planner check ... | head`: when stdout's reader has closed before the verdict is written,
    the exit code is still the verdict's (click's EPIPE handling would make a FITS launch exit 1)."""
    import subprocess
    fixture = Path(__file__).parent / "fixtures" / "train_arrays.sh"
    big = tmp_path / "big.sh"
    big.write_text(fixture.read_text().replace("--micro-batch-size 1", "--micro-batch-size 16"))
    for launch, rc in ((fixture, 0), (big, 1)):
        p = subprocess.Popen([sys.executable, "-m", "planner.cli", "check", "--cluster", "dgx-h100-x16",
                              "--megatron-args", str(launch)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.close()          # the reader is gone before anything is written
        err = p.stderr.read()
        assert p.wait() == rc, (launch.name, err)
        assert b"Traceback" not in err
