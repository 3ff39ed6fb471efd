"""#16: `plan --emit megatron --out DIR [--force]` never deletes what planner did not write.

Every CLI test runs in a scratch folder holding sentinel files (a user's work) and checks
afterwards that every one of them is still there, unchanged."""

import errno
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import ROOT, env_with, one_error_line, run

PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--global-batch-size", "256",
        "--seq-length", "4096", "--top", "2", "--emit", "megatron"]


def snapshot(folder: Path) -> dict:
    """Every file under folder (not following links) with its content hash."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(folder))] = "link:" + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[str(p.relative_to(folder))] = "dir"
    return out


@pytest.fixture
def scratch(tmp_path):
    """A user's folder: work/ (the current folder) with sentinel files, a home folder, inputs."""
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "notes.txt").write_text("my notes\n")
    (work / "src" / "train.py").write_text("print('mine')\n")
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "id_ed25519").write_text("secret\n")
    (tmp_path / "inputs").mkdir()
    shutil.copy(ROOT / "model_specs" / "llama3-8b.yaml", tmp_path / "inputs" / "model.yaml")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.bin").write_bytes(b"\0\1\2")
    return tmp_path


def _env(scratch):
    return env_with(HOME=str(scratch / "home"))


@pytest.mark.parametrize("out,why", [
    (".", "current folder"),
    ("..", "current folder"),
    ("/", "root folder"),
    ("{home}", "home folder"),
    ("{tmp}", "current folder"),             # an ancestor of the current folder
    ("{tmp}/inputs", "input"),               # holds the --model file
    ("{tmp}/other", "not a folder planner wrote"),   # non-empty, no manifest
    ("src", "not a folder planner wrote"),
])
def test_force_refuses_what_planner_did_not_write(scratch, out, why):
    before = snapshot(scratch)
    out = out.format(home=scratch / "home", tmp=scratch)
    model = str(scratch / "inputs" / "model.yaml")
    args = [*PLAN, "--out", out, "--force"]
    args[args.index("llama3-8b")] = model
    r = run(args, cwd=scratch / "work", env=_env(scratch))
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = one_error_line(r.stderr)
    assert line.startswith("error: --out: ") and (why in line or "planner did not write" in line), line
    assert snapshot(scratch) == before


def test_force_refuses_a_symlink_and_keeps_its_target(scratch):
    (scratch / "work" / "link").symlink_to(scratch / "other")
    before = snapshot(scratch)
    r = run([*PLAN, "--out", "link", "--force"], cwd=scratch / "work", env=_env(scratch))
    assert r.returncode == 2
    assert "symbolic link" in one_error_line(r.stderr)
    assert snapshot(scratch) == before


def test_force_replaces_only_an_unchanged_planner_output(scratch):
    work = scratch / "work"
    r = run([*PLAN, "--out", "plans"], cwd=work, env=_env(scratch))
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (work / "plans").iterdir()} == {"plan-1", "plan-2", "planner-manifest.json"}
    # the manifest lists exactly the files written, by hash
    import json
    man = json.loads((work / "plans" / "planner-manifest.json").read_text())
    assert set(man["files"]) == {f"plan-{k}/{f}" for k in (1, 2) for f in ("launch.sh", "megatron.args", "plan.json")}
    for rel, meta in man["files"].items():
        assert hashlib.sha256((work / "plans" / rel).read_bytes()).hexdigest() == meta["sha256"]
    # without --force an existing output is kept
    r = run([*PLAN, "--out", "plans"], cwd=work, env=_env(scratch))
    assert r.returncode == 2 and "--force" in one_error_line(r.stderr)
    # --force replaces planner's own output ...
    (work / "plans" / "plan-2" / "launch.sh").touch()     # same content, newer time: still planner's
    r = run([*PLAN, "--out", "plans", "--force", "--top", "1"], cwd=work, env=_env(scratch))
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (work / "plans").iterdir()} == {"plan-1", "planner-manifest.json"}
    assert not [p for p in work.iterdir() if p.name.startswith(".plans.")]   # no staging left behind
    # ... but not once a user's file is in it, nor once a file planner wrote was edited
    (work / "plans" / "my-notes.txt").write_text("mine\n")
    before = snapshot(scratch)
    r = run([*PLAN, "--out", "plans", "--force"], cwd=work, env=_env(scratch))
    assert r.returncode == 2 and "my-notes.txt" in one_error_line(r.stderr)
    assert snapshot(scratch) == before
    (work / "plans" / "my-notes.txt").unlink()
    with open(work / "plans" / "plan-1" / "launch.sh", "a") as fh:
        fh.write("# my change\n")
    before = snapshot(scratch)
    r = run([*PLAN, "--out", "plans", "--force"], cwd=work, env=_env(scratch))
    assert r.returncode == 2 and "plan-1/launch.sh, changed" in one_error_line(r.stderr)
    assert snapshot(scratch) == before


def test_cwd_inside_an_old_output_is_not_pulled_away(scratch):
    work = scratch / "work"
    assert run([*PLAN, "--out", "plans"], cwd=work, env=_env(scratch)).returncode == 0
    before = snapshot(scratch)
    r = run([*PLAN, "--out", "..", "--force"], cwd=work / "plans" / "plan-1", env=_env(scratch))
    assert r.returncode == 2 and "current folder" in one_error_line(r.stderr)
    assert snapshot(scratch) == before


@pytest.mark.parametrize("option", ["--out", "--plot"])
@pytest.mark.parametrize("path,expect", [
    ("/dev/null/x", "/dev/null is not a folder"),
    ("notes.txt", "exists and is not a folder"),
    ("", "expected a folder path"),
])
def test_unusable_output_path_is_one_line_naming_the_option(scratch, option, path, expect):
    before = snapshot(scratch)
    args = [*PLAN, "--out", "plans"] if option == "--plot" else list(PLAN)
    r = run([*args, option, path], cwd=scratch / "work", env=_env(scratch))
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = one_error_line(r.stderr)
    assert line.startswith(f"error: {option}: ") and expect in line, line
    assert snapshot(scratch) == before
    assert r.stdout == ""   # refused before the search


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.isdir("/sys/kernel"), reason="needs sysfs")
@pytest.mark.parametrize("option", ["--out", "--plot"])
def test_output_on_a_filesystem_that_refuses_writes(scratch, option):
    # sysfs refuses mkdir even to root (os.access says yes: only trying tells)
    probe = subprocess.run(["mkdir", "/sys/planner-probe"], capture_output=True)
    if probe.returncode == 0:
        os.rmdir("/sys/planner-probe")
        pytest.skip("sysfs is writable here")
    args = [*PLAN, "--out", "plans"] if option == "--plot" else list(PLAN)
    r = run([*args, option, "/sys/planner-out"], cwd=scratch / "work", env=_env(scratch))
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert line.startswith(f"error: {option}: cannot write in /sys"), line


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_output_in_a_read_only_folder(scratch):
    ro = scratch / "work" / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = run([*PLAN, "--out", "ro/plans"], cwd=scratch / "work", env=_env(scratch))
        assert r.returncode == 2 and one_error_line(r.stderr).startswith("error: --out: cannot write in")
    finally:
        ro.chmod(0o755)


# ---- in-process: a failure part-way leaves the old output exactly as it was ----------------

@pytest.fixture
def plans():
    from planner.library import load_cluster_ref, load_model_ref
    from planner.search.planner import SearchOptions, search
    res = search(load_model_ref("llama3-8b"), load_cluster_ref("dgx-h100-x8"),
                 SearchOptions(global_batch_size=256, seq_length=4096, top=2))
    return res.plans


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_failure_while_writing_keeps_the_old_output(tmp_path, monkeypatch, plans, failure):
    from planner.emit import writer
    from planner.errors import SpecError
    monkeypatch.chdir(tmp_path)
    writer.write_plans(plans, "plans", force=False)
    before = snapshot(tmp_path)
    real = writer._write_plan

    def failing(d, k, e):
        if k == 2:
            raise failure
        real(d, k, e)

    monkeypatch.setattr(writer, "_write_plan", failing)
    with pytest.raises(SpecError if isinstance(failure, OSError) else KeyboardInterrupt) as info:
        writer.write_plans(plans, "plans", force=True)
    if isinstance(failure, OSError):
        assert str(info.value).startswith("--out: cannot write plans: No space left on device")
    assert snapshot(tmp_path) == before    # old output intact, no staging folder left


def test_failure_at_the_swap_rolls_back(tmp_path, monkeypatch, plans):
    from planner.emit import writer
    from planner.errors import SpecError
    monkeypatch.chdir(tmp_path)
    writer.write_plans(plans, "plans", force=False)
    before = snapshot(tmp_path)
    real_rename = os.rename

    def rename(a, b):
        if ".planner-new-" in str(a):   # the new output's move into place fails
            raise OSError(errno.EIO, "Input/output error")
        real_rename(a, b)

    monkeypatch.setattr(writer.os, "rename", rename)
    with pytest.raises(SpecError):
        writer.write_plans(plans[:1], "plans", force=True)
    assert snapshot(tmp_path) == before


def test_plots_inside_the_output_are_part_of_it(scratch):
    pytest.importorskip("matplotlib")
    work = scratch / "work"
    for _ in range(2):   # the second run replaces the first, plots included
        r = run([*PLAN, "--out", "plans", "--plot", "plans/pictures", "--force"], cwd=work, env=_env(scratch))
        assert r.returncode == 0, r.stderr
    import json
    man = json.loads((work / "plans" / "planner-manifest.json").read_text())
    assert {"pictures/timeline.png", "pictures/memory.png", "pictures/candidates.png"} <= set(man["files"])


@pytest.mark.parametrize("path,expect", [("/dev/null/x", "/dev/null is not a folder"),
                                         ("notes.txt", "exists and is not a folder")])
def test_estimate_plot_path_that_cannot_be_used(scratch, path, expect):
    before = snapshot(scratch)
    r = run(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-x8", "--plot", path],
            cwd=scratch / "work", env=_env(scratch))
    assert r.returncode == 2 and r.stdout == ""
    line = one_error_line(r.stderr)
    assert line.startswith("error: --plot: ") and expect in line, line
    assert snapshot(scratch) == before


def test_concurrent_runs_leave_one_complete_output(scratch):
    from planner.emit.writer import foreign_entry
    work = scratch / "work"
    before = {k: v for k, v in snapshot(scratch).items()}
    for force in (False, True):   # racing to create the folder, then racing to replace it
        args = [sys.executable, "-m", "planner.cli", *PLAN, "--out", "plans", "--json"] + (["--force"] if force else [])
        procs = [subprocess.Popen(args, cwd=work, env=_env(scratch), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
        results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
        for p in procs:
            p.stderr.close()
        assert any(rc == 0 for rc, _ in results), results
        for rc, err in results:
            assert rc in (0, 2), results
            if rc == 2:
                one_error_line(err)
        assert foreign_entry(work / "plans") is None          # a complete planner output
        assert sorted(p.name for p in work.iterdir()) == ["notes.txt", "plans", "src"]   # nothing left behind
    now = snapshot(scratch)
    assert {k: v for k, v in now.items() if not k.startswith("work/plans")} == before
