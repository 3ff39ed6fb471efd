"""#16, property-based: random and mutated model / cluster specs and random CLI options never
give a traceback (exit 0, 1 or 2; a refusal is one line), and every plan the CLI accepts and
returns fits in memory and passes the rules (re-checked by `planner check --plan`).

Each test is bounded (max_examples) and runs in seconds: main() is called in-process, the
same entry point as the installed `planner` command."""

import json
import os
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, event, given, settings, strategies as st

from _cli import ROOT, one_error_line, run_main

from planner.errors import SpecError
from planner.specs.hardware import load_profile

# PLANNER_FUZZ=N multiplies every test's max_examples (a longer run outside CI: docs/fuzz.md)
FUZZ = max(1.0, float(os.environ.get("PLANNER_FUZZ", "1") or 1))


def n(examples: int) -> int:
    return max(1, int(examples * FUZZ))


MODEL_LINES = (ROOT / "model_specs" / "mixtral-8x7b.yaml").read_text().splitlines()
CLUSTER_LINES = (ROOT / "examples" / "clusters" / "h100-a100-lab.yaml").read_text().splitlines()

# values a careless or hostile edit puts into a spec
VALUES = st.one_of(
    st.sampled_from(["0", "-1", "1", "3", "7", "64", "99999999999999999999", "1e400", "-1e400", ".nan", ".inf",
                     "1.5", "true", "null", "~", "[]", "{}", "[1, 2]", "''", "'x'", "&a 1", "*a", "*nope",
                     "!!python/object/apply:os.system ['true']", "!!binary aGk=", "1e-300 Gb/s", "1e400 Gb/s",
                     "0 Gb/s", "400 Gb/s", "400 GB/s", "400", "5 us", "-5 us", "1e999 ms", "80 GB", "0 GB",
                     "1e-300 GB", "h100-sxm-80g", "../../etc/passwd.yaml", "/etc/passwd.yaml", "a100-sxm-80g",
                     "RMSNorm", "rope", "([0]*3+[1]*58)", "[0, 1]", "'\\x1b[31m'", "\"\\u202e\""]),
    st.integers(-10**12, 10**12).map(str),
    st.text(max_size=12).map(json.dumps),
)
MUTATION = st.one_of(
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
    st.tuples(st.just("duplicate"), st.integers(0, 10**6)),
    st.tuples(st.just("value"), st.integers(0, 10**6), VALUES),
    st.tuples(st.just("indent"), st.integers(0, 10**6), st.integers(-4, 4)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.text(max_size=40)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6)),
)


def mutate(lines: list[str], ops) -> str:
    lines = list(lines)
    for op in ops:
        if not lines:
            break
        i = op[1] % len(lines)
        if op[0] == "delete":
            del lines[i]
        elif op[0] == "duplicate":
            lines.insert(i, lines[i])
        elif op[0] == "value":
            key, sep, _ = lines[i].partition(":")
            lines[i] = f"{key}: {op[2]}" if sep else f"{lines[i]} {op[2]}"
        elif op[0] == "indent":
            body = lines[i].lstrip(" ")
            lines[i] = " " * max(0, len(lines[i]) - len(body) + op[2]) + body
        elif op[0] == "insert":
            lines.insert(i, op[2])
        else:
            lines = lines[:i]
    return "\n".join(lines) + "\n"


def assert_clean(rc: int, out: str, err: str) -> None:
    """Exit 0/1/2; a refusal is one 'error:' line; never a traceback or an unexpected error."""
    event(f"exit {rc}")
    assert rc in (0, 1, 2), (rc, out, err)
    assert "Traceback" not in out + err and "error: unexpected" not in err, err
    if rc == 2:
        one_error_line(err)
    if rc == 0:
        assert json.loads(out)["memory"]["fits"] is True


SETTINGS = dict(max_examples=n(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(**SETTINGS)
@given(st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_model_spec_never_crashes(ops):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "model.yaml"
        f.write_text(mutate(MODEL_LINES, ops))
        assert_clean(*run_main(["estimate", "--model", str(f), "--cluster", "dgx-h100-x8", "--tp", "2", "--ep", "8",
                                "--json"]))


@settings(**SETTINGS)
@given(st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_cluster_spec_never_crashes(ops):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "cluster.yaml"
        f.write_text(mutate(CLUSTER_LINES, ops))
        assert_clean(*run_main(["estimate", "--model", "llama3-8b", "--cluster", str(f), "--tp", "8", "--json"]))


@settings(max_examples=n(40), deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["spec.yaml", "config.json"]))
def test_random_bytes_as_a_spec_never_crash(data, name):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / name
        f.write_bytes(data)
        assert_clean(*run_main(["estimate", "--model", str(f), "--cluster", "dgx-h100-x8", "--json"]))
        assert_clean(*run_main(["estimate", "--model", "llama3-8b", "--cluster", str(f), "--json"]))


DEGREE = st.one_of(st.sampled_from([1, 2, 4, 8]), st.integers(-3, 70))


@settings(max_examples=n(60), deadline=None)
@given(tp=DEGREE, pp=DEGREE, cp=st.sampled_from([1, 1, 2, 0, -1]), mbs=DEGREE,
       gbs=st.one_of(st.sampled_from([64, 256, 512]), st.integers(-5, 5000)),
       seq=st.one_of(st.sampled_from([2048, 4096, 8192, 8193]), st.integers(-5, 40000)),
       rec=st.sampled_from(["none", "selective", "full", "bogus"]), zero=st.integers(-1, 4),
       sp=st.booleans())
def test_random_estimate_options(tp, pp, cp, mbs, gbs, seq, rec, zero, sp):
    args = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--tp", str(tp), "--pp", str(pp),
            "--cp", str(cp), "--micro-batch-size", str(mbs), "--global-batch-size", str(gbs), "--seq-length", str(seq),
            "--recompute", rec, "--zero", str(zero), "--sequence-parallel" if sp else "--no-sequence-parallel", "--json"]
    rc, out, err = run_main(args)
    assert_clean(rc, out, err)
    if min(tp, pp, cp, mbs, gbs, seq) < 1 or rec == "bogus" or zero not in (0, 1, 2, 3):
        assert rc == 2, (args, rc, err)   # an unusable option is exit 2, not "does not fit"


FIX = st.lists(st.one_of(
    st.sampled_from(["tp=1", "tp=2", "tp=4", "tp=8", "tp=3", "pp=1", "pp=2", "pp=4", "pp=3", "mbs=1", "mbs=2",
                     "recompute=full", "recompute=selective", "recompute=none", "zero=0", "zero=1", "zero=3",
                     "cp=2", "vpp=2", "dp=8", "tp=0", "pp=-1"])), max_size=3)


@settings(max_examples=n(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["llama3-8b", "mixtral-8x7b", "megatron-gpt-1.7b"]),
       cluster=st.sampled_from(["dgx-h100-x8", "h100-a100-lab", "dgx-h100-x16"]),
       gbs=st.one_of(st.sampled_from([64, 256, 512]), st.integers(1, 3000)),
       seq=st.one_of(st.sampled_from([2048, 4096, 8192, 8193, 16384]), st.integers(1, 20000)),
       fix=FIX, precision=st.sampled_from(["bf16", "fp16", "fp8"]), zero=st.sampled_from(["0,1", "0,1,3", "1"]))
def test_every_plan_the_cli_returns_fits_and_passes_the_rules(model, cluster, gbs, seq, fix, precision, zero):
    args = ["plan", "--model", model, "--cluster", cluster, "--global-batch-size", str(gbs), "--seq-length", str(seq),
            "--precision", precision, "--zero-stages", zero, "--top", "2", "--time-limit", "5", "--json"]
    for f in fix:
        args += ["--fix", f]
    rc, out, err = run_main(args)
    event(f"exit {rc}")
    assert rc in (0, 1, 2) and "Traceback" not in err and "error: unexpected" not in err, (args, err)
    if rc == 2:
        one_error_line(err)
        return
    doc = json.loads(out)
    if rc == 1:
        assert not doc["plans"]
        return
    assert doc["plans"]
    with tempfile.TemporaryDirectory() as d:
        for k, p in enumerate(doc["plans"]):
            f = Path(d) / f"plan-{k}.json"
            f.write_text(json.dumps({"plans": [p]}))
            # the gate re-derives the strategy from the JSON, applies Megatron's rules and the
            # memory model: exit 0 means valid and fits
            rc2, out2, err2 = run_main(["check", "--cluster", cluster, "--model", model, "--plan", str(f)])
            assert rc2 == 0, (args, p["plan"], out2, err2)
            assert p["memory"]["fits"] is True
            s = p["plan"]
            assert not (s["sequence_parallel"] and s["tensor_model_parallel_size"] > 1
                        and seq % (s["context_parallel_size"] * s["tensor_model_parallel_size"])), s


# ---- issue 29: one field of a valid bundled spec corrupted ----------------------------------------

BUNDLED = {
    "model": yaml.safe_load((ROOT / "model_specs" / "llama3-8b.yaml").read_text()),
    "cluster": yaml.safe_load((ROOT / "examples" / "clusters" / "h100-a100-lab.yaml").read_text()),
    "profile": yaml.safe_load((ROOT / "hardware_profiles" / "h100-sxm-80g.yaml").read_text()),
}
# values of the wrong type: the loader must name the field they were put in
WRONG_TYPE = ["x", [1, 2], {"a": 1}, True, "12 parsecs", "\x1b[31m", "\u202e", "\x00"]
CORRUPT = st.one_of(st.sampled_from(["delete"]), st.sampled_from(WRONG_TYPE),
                    st.sampled_from([0, -1, 1, 3, 10**30, 1e400, -1e400, 0.5, None, "", [], {}]),
                    st.integers(-10**6, 10**12), st.floats(allow_nan=True), st.text(max_size=8))


def _paths(data, prefix=()):
    """Every (path to a field) of a spec: mapping keys and list indexes, nested."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, prefix + (i,))


PATHS = {kind: sorted(_paths(d), key=str) for kind, d in BUNDLED.items()}


def _kind_of(v) -> str:
    return ("bool" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) else
            "text" if isinstance(v, str) else "list" if isinstance(v, list) else
            "mapping" if isinstance(v, dict) else "null")


def _corrupt(kind: str, index: int, value):
    """The bundled spec with one field deleted or set to `value`: (data, path, whether the new
    value is of another type than the field's)."""
    data = json.loads(json.dumps(BUNDLED[kind]))
    path = PATHS[kind][index % len(PATHS[kind])]
    holder = data
    for p in path[:-1]:
        holder = holder[p]
    old = holder[path[-1]]
    if value == "delete":
        del holder[path[-1]]
        retyped = False
    else:
        holder[path[-1]] = value
        retyped = value is not None and _kind_of(old) not in ("null", _kind_of(value))
    return data, path, retyped


def _check_named(line: str, f: Path, path, retyped: bool) -> None:
    """An exit-2 line names the file, and the corrupted field when its value has another type
    (a value of the right type may break a rule that names another field)."""
    assert str(f) in line, line
    if retyped and isinstance(path[-1], str):
        assert path[-1] in line, (path, line)


@settings(max_examples=n(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["model", "cluster"]), index=st.integers(0, 10**6), value=CORRUPT)
def test_one_corrupted_field_of_a_bundled_spec(kind, index, value):
    data, path, retyped = _corrupt(kind, index, value)
    event(f"{kind}: {path[0]}")
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / f"{kind}.yaml"
        f.write_text(yaml.safe_dump(data, allow_unicode=True))
        spec = ["--model", str(f), "--cluster", "h100-a100-lab"] if kind == "model" else \
            ["--model", "llama3-8b", "--cluster", str(f)]
        rc, out, err = run_main(["estimate", *spec, "--tp", "8", "--json"])
        assert_clean(rc, out, err)
        if rc == 2:
            _check_named(one_error_line(err), f, path, retyped)


@settings(max_examples=n(80), deadline=None)
@given(index=st.integers(0, 10**6), value=CORRUPT)
def test_one_corrupted_field_of_a_hardware_profile(index, value):
    data, path, retyped = _corrupt("profile", index, value)
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "gpu.yaml"
        f.write_text(yaml.safe_dump(data, allow_unicode=True))
        try:
            load_profile(f)
        except SpecError as exc:
            line = str(exc)
            assert "\n" not in line, line
            _check_named(line, f, path, retyped)
