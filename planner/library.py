"""Bundled specs: hardware_profiles/, model_specs/, examples/clusters/ beside the package.

`--model` and `--cluster` take a path or the name of a bundled spec.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from .errors import SpecError
from .inputs import DATA_DIR_VARIABLE, check_data_dir, check_regular_file, data_dir, printable

ROOT = data_dir(os.environ, Path(__file__).resolve().parent.parent)
PROFILES_DIR = ROOT / "hardware_profiles"
MODELS_DIR = ROOT / "model_specs"
CLUSTERS_DIR = ROOT / "examples" / "clusters"

_EXPECTED = {"model": "a model YAML or a Hugging Face config.json", "cluster": "a cluster YAML"}


def _names(folder: Path) -> list[str]:
    check_data_dir(os.environ, ROOT)
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml"))


def bundled_profile_names() -> list[str]:
    return _names(PROFILES_DIR)


def bundled_model_names() -> list[str]:
    return _names(MODELS_DIR)


def bundled_cluster_names() -> list[str]:
    return _names(CLUSTERS_DIR)


def data_folders() -> tuple[Path, ...]:
    """The folders bundled specs are read from (an output folder must never replace them)."""
    return (PROFILES_DIR, MODELS_DIR, CLUSTERS_DIR)


@lru_cache(maxsize=None)
def load_bundled_profile(name: str):
    from .specs.hardware import load_profile
    return load_profile(PROFILES_DIR / f"{name}.yaml")


def _resolve(ref: str, folder: Path, kind: str, option: str) -> Path:
    from .yamlio import MAX_FILE_BYTES
    expected = f"{_EXPECTED[kind]} ({option})"
    if not isinstance(ref, str) or not ref.strip():
        raise SpecError(option, None, f"found {ref!r}, expected a path to {_EXPECTED[kind]} or a bundled {kind} name")
    p = Path(ref)
    if p.suffix in (".yaml", ".yml", ".json") or os.sep in ref or os.path.lexists(ref):
        check_regular_file(p, MAX_FILE_BYTES, expected)
        return p
    names = _names(folder)
    if ref in names:
        return folder / f"{ref}.yaml"
    from .yamlio import suggest
    bundled = ", ".join(names) if names else f"none ({printable(folder)} does not exist" + (
        f"; {DATA_DIR_VARIABLE} is set)" if os.environ.get(DATA_DIR_VARIABLE) else ")")
    raise SpecError(printable(ref), None, f"no such file and no bundled {kind} of that name{suggest(ref, names)}; "
                    f"expected {expected}; bundled: {bundled}")


def resolve_model_ref(ref: str, option: str = "--model") -> Path:
    """The file a --model value names (checked to be a regular file)."""
    return _resolve(ref, MODELS_DIR, "model", option)


def resolve_cluster_ref(ref: str, option: str = "--cluster") -> Path:
    return _resolve(ref, CLUSTERS_DIR, "cluster", option)


def load_model_ref(ref: str, option: str = "--model"):
    from .specs.model import load_model
    return load_model(resolve_model_ref(ref, option))


def load_cluster_ref(ref: str, option: str = "--cluster"):
    from .specs.cluster import load_cluster
    return load_cluster(resolve_cluster_ref(ref, option))
