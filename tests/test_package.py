"""The package as users install it: the wheel carries the bundled specs inside the package (an
installed planner has no clone beside it), the sdist carries their source folders (a wheel built
from it needs them), and $PLANNER_DATA_DIR adds a user's specs to the bundled ones.

The builds run on a copy of the project in tmp_path, so that they neither write build/ into the
working tree nor race another test run building there."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from _cli import ROOT, env_with
from planner.library import LAYOUT, PACKAGE_DATA, SPEC_PATTERN

PACKAGE = "planner"
# setuptools that reads `license` as an SPDX expression (pyproject.toml's build requirement)
MIN_SETUPTOOLS = (77,)
# what a build never needs from the working tree: environments, caches, earlier builds, VCS
NOT_BUILD_INPUTS = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                    ".hypothesis", "out")
BUILD_TIMEOUT_S = 300


def _bundled_sources() -> dict[str, list[Path]]:
    """Clone folder (as LAYOUT names it) -> its spec files: what every package must carry."""
    return {source: sorted((ROOT / source).glob(SPEC_PATTERN)) for source, _ in LAYOUT.values()}


def _project_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "project"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(*NOT_BUILD_INPUTS))
    return copy


def _setuptools_is_recent() -> bool:
    """Whether this environment's setuptools can build the project itself, offline; otherwise
    pip builds in an isolated environment fetched from the package index, as a user's pip does."""
    try:
        version = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        return False
    major = version.split(".")[0]
    return major.isdigit() and (int(major),) >= MIN_SETUPTOOLS


def _pip_wheel(source: Path, out: Path) -> Path:
    """The wheel `pip wheel --no-deps` builds from a project folder or an sdist."""
    isolation = ["--no-build-isolation"] if _setuptools_is_recent() else []
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *isolation, "-w", str(out),
                        str(source)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    (wheel,) = out.glob(f"{PACKAGE}-*.whl")
    return wheel


def _setuptools_path(tmp_path: Path) -> str:
    """A folder to put on PYTHONPATH that holds a recent enough setuptools ('' when this
    environment has one): pip has no sdist command, so the test calls the build backend itself."""
    if _setuptools_is_recent():
        return ""
    target = tmp_path / "backend"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
                        f"setuptools>={'.'.join(map(str, MIN_SETUPTOOLS))}"],
                       capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    return str(target)


def _build_sdist(project: Path, out: Path, backend_path: str) -> Path:
    out.mkdir()
    env = env_with(PYTHONPATH=backend_path)
    r = subprocess.run([sys.executable, "-c", "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))",
                        str(out)], cwd=project, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    return out / r.stdout.strip().splitlines()[-1]


def _assert_wheel_carries_the_specs(wheel: Path) -> None:
    """Every clone spec is in the wheel under planner/_data/, byte for byte."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for source, packaged in LAYOUT.values():
            for spec in _bundled_sources()[source]:
                member = f"{PACKAGE}/{PACKAGE_DATA}/{packaged}/{spec.name}"
                assert member in names, f"{member} missing from {wheel.name}"
                assert z.read(member) == spec.read_bytes(), member


def test_the_wheel_carries_every_bundled_spec_inside_the_package(tmp_path):
    assert all(_bundled_sources().values())    # the clone has specs of every kind to ship
    wheel = _pip_wheel(_project_copy(tmp_path), tmp_path / "dist")
    _assert_wheel_carries_the_specs(wheel)
    with zipfile.ZipFile(wheel) as z:
        assert f"{PACKAGE}/__main__.py" in z.namelist()    # python -m planner


def test_a_wheel_built_from_the_sdist_carries_them_too(tmp_path):
    sdist = _build_sdist(_project_copy(tmp_path), tmp_path / "sdist", _setuptools_path(tmp_path))
    with tarfile.open(sdist) as t:
        members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
    for source, specs in _bundled_sources().items():
        for spec in specs:
            assert f"{source}/{spec.name}" in members, f"{source}/{spec.name} missing from {sdist.name}"
    _assert_wheel_carries_the_specs(_pip_wheel(sdist, tmp_path / "dist"))


# ---- $PLANNER_DATA_DIR adds to the bundled specs ----------------------------------------------

def _renamed(source: Path, target: Path, name: str, **changes: str) -> None:
    """A copy of a bundled spec as a user's own: a new name, and `key: value` lines replaced."""
    text = source.read_text()
    for key, value in {"name": name, **changes}.items():
        text, n = re.subn(rf"^(\s*){key}:.*$", rf"\g<1>{key}: {value}", text, flags=re.MULTILINE)
        assert n == 1, f"{source.name}: {n} lines of {key}"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _user_data(tmp_path: Path) -> Path:
    """A user's folder with one model, one GPU profile and, in the package layout's clusters/,
    one cluster of that GPU."""
    data = tmp_path / "my-specs"
    _renamed(ROOT / "model_specs" / "llama3-8b.yaml", data / "model_specs" / "my-model.yaml", "my-model")
    _renamed(ROOT / "hardware_profiles" / "h100-sxm-80g.yaml", data / "hardware_profiles" / "my-gpu.yaml", "my-gpu")
    _renamed(ROOT / "examples" / "clusters" / "dgx-h100-x8.yaml", data / "clusters" / "my-cluster.yaml",
             "my-cluster", gpu="my-gpu")
    return data


def _planner(args: list[str], cwd: Path, data: Path) -> subprocess.CompletedProcess:
    """`python -m planner ...` with $PLANNER_DATA_DIR set (a subprocess: the variable is read
    from the environment, as users set it)."""
    return subprocess.run([sys.executable, "-m", PACKAGE, *args], cwd=cwd, capture_output=True, text=True,
                          env=env_with(PLANNER_DATA_DIR=str(data), COLUMNS="400"), timeout=120)


@pytest.mark.parametrize("command,user_name,bundled_name", [
    ("models", "my-model", "llama3-8b"),
    ("gpus", "my-gpu", "h100-sxm-80g"),
    ("clusters", "my-cluster", "dgx-h100-x8"),
])
def test_planner_data_dir_adds_to_the_bundled_lists(tmp_path, command, user_name, bundled_name):
    r = _planner([command], tmp_path, _user_data(tmp_path))
    assert r.returncode == 0, r.stderr
    assert user_name in r.stdout and bundled_name in r.stdout


@pytest.mark.parametrize("model,cluster", [("my-model", "dgx-h100-x8"), ("llama3-8b", "my-cluster")])
def test_user_and_bundled_specs_resolve_together(tmp_path, model, cluster):
    r = _planner(["estimate", "--model", model, "--cluster", cluster, "--json"], tmp_path, _user_data(tmp_path))
    assert r.returncode == 0, r.stderr


def test_a_user_spec_of_a_bundled_name_comes_first(tmp_path):
    data = _user_data(tmp_path)
    mine = data / "model_specs" / "llama3-8b.yaml"
    _renamed(ROOT / "model_specs" / "llama3-8b.yaml", mine, "llama3-8b")
    code = "from planner.library import resolve_model_ref; print(resolve_model_ref('llama3-8b'))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env=env_with(PLANNER_DATA_DIR=str(data)), timeout=120)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == mine
