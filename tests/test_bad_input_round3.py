"""Issue 29, "Bad input, round three": each case is a one-line refusal naming the file, the field
and what was expected (exit 2 for input, 1 for an invalid launch), or an answer that says what
it assumed. Hardware profiles (bf16 / fp16 peaks, all missing fields at once), Hugging Face
"architectures", --seq-length 0 and NUL bytes in launch scripts, folders and FIFOs where a
file is expected. (Pipeline layouts with empty stages: test_bad_input_layout.py.)"""

import json
import os

import pytest
import yaml

from _cli import ROOT, one_error_line, refused, run, run_main

from planner.errors import SpecError
from planner.specs.hardware import load_profile

H100 = yaml.safe_load((ROOT / "hardware_profiles" / "h100-sxm-80g.yaml").read_text())
V100 = yaml.safe_load((ROOT / "hardware_profiles" / "v100-sxm2-32g.yaml").read_text())
LAUNCH = (ROOT / "tests" / "fixtures" / "uv_distributed_run_layout.sh").read_text()


def _profile(tmp_path, name="p.yaml", **changes):
    data = json.loads(json.dumps(H100))
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    f = tmp_path / name
    f.write_text(yaml.safe_dump(data))
    return f


def _data_dir_with(tmp_path, profile: dict, monkeypatch):
    """PLANNER_DATA_DIR holding `profile` (named test-gpu) and a one-node cluster of it."""
    d = tmp_path / "data"
    (d / "hardware_profiles").mkdir(parents=True)
    (d / "clusters").mkdir()
    (d / "hardware_profiles" / "test-gpu.yaml").write_text(yaml.safe_dump({**profile, "name": "test-gpu"}))
    (d / "clusters" / "test-box.yaml").write_text(yaml.safe_dump({"name": "test-box", "node_groups": [
        {"name": "g", "nodes": 1, "gpus_per_node": 8, "gpu": "test-gpu", "nics_per_node": 1,
         "nic_bandwidth": "100 Gb/s", "host_memory": "1 TB"}]}))
    monkeypatch.setenv("PLANNER_DATA_DIR", str(d))
    return d


# ---- hardware profiles: which peak prices 16-bit training ----------------------------------

def test_profile_without_bf16_or_fp16_names_the_rule(tmp_path):
    f = _profile(tmp_path, peak_tflops={"fp32": 60, "tf32": 400})
    with pytest.raises(SpecError) as e:
        load_profile(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: peak_tflops.bf16: "), msg
    assert "fp16" in msg and "V100" in msg and "\n" not in msg


def test_profile_with_fp8_but_no_bf16_is_refused(tmp_path):
    # fp8 runs price attention with the bf16 peak (cost/compute.py): it used to fail mid-estimate
    f = _profile(tmp_path, peak_tflops={"fp16": 900, "fp8": 1900})
    with pytest.raises(SpecError, match=r"peak_tflops\.bf16: an fp8 peak without a bf16 peak"):
        load_profile(f)


def test_fp16_only_profile_keeps_working_and_says_it_prices_with_fp16(tmp_path, monkeypatch):
    _data_dir_with(tmp_path, V100, monkeypatch)
    p = load_profile(tmp_path / "data" / "hardware_profiles" / "test-gpu.yaml")
    assert not p.supports("bf16") and p.peak("fp16") == 125e12
    rc, out, err = run_main(["estimate", "--model", "llama3-8b", "--cluster", "test-box", "--tp", "8"])
    assert rc in (0, 1), (rc, out, err)   # fits or not: priced, not refused
    assert "of fp16 dense peak" in out, out


def test_bf16_only_profile_prices_fp16_runs_with_the_bf16_peak_and_says_so(tmp_path, monkeypatch):
    peaks = {k: v for k, v in H100["peak_tflops"].items() if k != "fp16"}
    _data_dir_with(tmp_path, {**H100, "peak_tflops": peaks}, monkeypatch)
    p = load_profile(tmp_path / "data" / "hardware_profiles" / "test-gpu.yaml")
    assert p.peak("fp16") == p.peak("bf16")
    assert any(u.startswith("peak_tflops.fp16") for u in p.uncertain), p.uncertain
    rc, out, err = run_main(["estimate", "--model", "llama3-8b", "--cluster", "test-box", "--tp", "8",
                             "--precision", "fp16"])
    assert rc in (0, 1) and "Traceback" not in err, (rc, out, err)
    assert "error" not in err, err


# ---- several missing required fields: all of them, in one line --------------------------------

def test_profile_missing_several_fields_names_them_all(tmp_path):
    f = _profile(tmp_path, compute_capability=None, memory=None, efficiency=None)
    with pytest.raises(SpecError) as e:
        load_profile(f)
    msg = str(e.value)
    assert "3 required fields are missing: compute_capability, efficiency, memory" in msg, msg
    assert msg.startswith(str(f)) and "\n" not in msg


def test_one_missing_field_keeps_its_short_form(tmp_path):
    with pytest.raises(SpecError, match=r": compute_capability: required field is missing$"):
        load_profile(_profile(tmp_path, compute_capability=None))


def test_profile_missing_efficiency_fields_names_them_with_their_prefix(tmp_path):
    eff = {k: v for k, v in H100["efficiency"].items() if k not in ("matmul", "network")}
    with pytest.raises(SpecError, match=r": efficiency: 2 required fields are missing: efficiency\.matmul, "
                                        r"efficiency\.network$"):
        load_profile(_profile(tmp_path, efficiency=eff))


def test_model_and_cluster_specs_name_every_missing_field(tmp_path):
    m = tmp_path / "m.yaml"
    m.write_text("name: x\nnum_layers: 2\n")
    line = refused(["estimate", "--model", str(m), "--cluster", "dgx-h100-x8"], str(m),
                   "3 required fields are missing: hidden_size, num_attention_heads, vocab_size")
    assert "num_layers" not in line.split("missing:")[1]
    c = tmp_path / "c.yaml"
    c.write_text("{}\n")
    refused(["estimate", "--model", "llama3-8b", "--cluster", str(c)], str(c),
            "2 required fields are missing: name, node_groups")


# ---- Hugging Face config.json: "architectures" ---------------------------------------------------

HF = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
      "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "hidden_act": "silu"}


@pytest.mark.parametrize("arch,needle", [
    ("LlamaForCausalLM", "found the text 'LlamaForCausalLM', not a list"),
    (["LlamaForCausalLM", "MixtralForCausalLM"], "2 architectures in one config"),
    ([], "0 architectures in one config"),
    ([7], "found [7]"),
])
@pytest.mark.parametrize("with_model_type", [True, False])
def test_hf_architectures_must_be_a_list_of_one(tmp_path, arch, needle, with_model_type):
    cfg = {**HF, "architectures": arch}
    if not with_model_type:
        del cfg["model_type"]
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    refused(["estimate", "--model", str(f), "--cluster", "dgx-h100-x8"], str(f), ": architectures: ", needle,
            "expected a list with one architecture")


def test_hf_one_architecture_still_reads(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**HF, "architectures": ["LlamaForCausalLM"]}))
    rc, out, err = run_main(["estimate", "--model", str(f), "--cluster", "dgx-h100-x8", "--json"])
    assert rc in (0, 1), err


# ---- launch scripts: --seq-length 0, NUL bytes ------------------------------------------------------

@pytest.mark.parametrize("flag,old,new", [
    ("--seq-length", "--seq-length 4096", "--seq-length 0"),
    ("--seq-length", "--seq-length 4096", "--seq-length -8"),
    ("--global-batch-size", "--global-batch-size 256", "--global-batch-size 0"),
    ("--micro-batch-size", "--micro-batch-size 1", "--micro-batch-size 0"),
])
def test_zero_sequence_and_batch_are_invalid_launches_like_num_layers_0(tmp_path, flag, old, new):
    f = tmp_path / "train.sh"
    f.write_text(LAUNCH.replace(old, new))
    line = refused(["estimate", "--cluster", "dgx-h100-x8", "--megatron-args", str(f)], flag, code=1)
    assert "[positive-degrees]" in line and "expected an integer >= 1" in line, line
    rc, out, err = run_main(["check", "--cluster", "dgx-h100-x8", "--megatron-args", str(f)])
    assert rc == 1 and out.startswith("INVALID ") and flag in out and "Traceback" not in err, (rc, out, err)
    f.write_text(LAUNCH.replace("--num-layers 30", "--num-layers 0"))
    refused(["estimate", "--cluster", "dgx-h100-x8", "--megatron-args", str(f)], "--num-layers", code=1)


@pytest.mark.parametrize("old,new,flag", [
    ("--hidden-size 4096", "--hidden-size 40\x0096", "--hidden-size"),
    ("--bf16", "--bf16 --data-path /data/x\x00y", "--data-path"),
    ("--bf16", "--bf16 --tokenizer-type HuggingFaceTokenizer --tokenizer-model /t\x00k", "--tokenizer-model"),
    ('LAYOUT="Et', 'LAYOUT="E\x00t', None),
])
def test_a_nul_byte_in_a_launch_is_one_line(tmp_path, old, new, flag):
    f = tmp_path / "train.sh"
    f.write_text(LAUNCH.replace(old, new))
    line = refused(["estimate", "--cluster", "dgx-h100-x8", "--megatron-args", str(f)], str(f), ": line ",
                   "NUL byte", "expected text without NUL bytes")
    if flag:
        assert f"the value of {flag}" in line, line


# ---- paths: a folder, a FIFO, a device where a file is expected ---------------------------------

@pytest.mark.parametrize("opt", ["--megatron-args", "--model", "--cluster"])
def test_folder_fifo_and_device_are_named_for_what_they_are(tmp_path, opt):
    fifo = tmp_path / "launch.fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "a folder"
    folder.mkdir()
    base = {"--megatron-args": ["estimate", "--cluster", "dgx-h100-x8"],
            "--model": ["estimate", "--cluster", "dgx-h100-x8"],
            "--cluster": ["estimate", "--model", "llama3-8b"]}[opt]
    for path, what in ((folder, "is a directory"), (fifo, "is a named pipe (FIFO)"),
                       ("/dev/null", "is a character device")):
        # a subprocess with a timeout: opening a FIFO for reading would block forever
        r = run([*base, opt, str(path)], timeout=60)
        assert r.returncode == 2, (path, r.returncode, r.stdout, r.stderr)
        line = one_error_line(r.stderr)
        assert str(path) in line and what in line and "expected" in line, line
        assert "not found" not in line, line


def test_check_on_a_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "train.sh"
    os.mkfifo(fifo)
    r = run(["check", "--cluster", "dgx-h100-x8", "--megatron-args", str(fifo)], timeout=60)
    assert r.returncode == 2 and "is a named pipe (FIFO)" in one_error_line(r.stderr), r.stderr


@pytest.mark.parametrize("opt", ["--megatron-log", "--nccl-tests"])
def test_calibrate_names_a_folder_or_fifo_given_as_a_measurement(tmp_path, opt):
    fifo = tmp_path / "run.log"
    os.mkfifo(fifo)
    extra = (["--megatron-args", str(ROOT / "examples/calibration/llama3-70b-tp8-pp4.sh")] if opt == "--megatron-log"
             else ["--nccl-nodes", "1"])
    for path, what in ((fifo, "is a named pipe (FIFO)"), (tmp_path, "is a directory")):
        r = run(["calibrate", "--cluster", "dgx-h100-x16", opt, str(path), *extra, "--out", str(tmp_path / "c.yaml")],
                timeout=60)
        assert r.returncode == 2, (r.stdout, r.stderr)
        line = one_error_line(r.stderr)
        assert what in line and "not found" not in line, line
