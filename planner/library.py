"""Bundled specs: hardware_profiles/, model_specs/, examples/clusters/ beside the package.

`--model` and `--cluster` take a path or the name of a bundled spec.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from .errors import SpecError

ROOT = Path(os.environ.get("PLANNER_DATA_DIR", Path(__file__).resolve().parent.parent))
PROFILES_DIR = ROOT / "hardware_profiles"
MODELS_DIR = ROOT / "model_specs"
CLUSTERS_DIR = ROOT / "examples" / "clusters"


def _names(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml"))


def bundled_profile_names() -> list[str]:
    return _names(PROFILES_DIR)


def bundled_model_names() -> list[str]:
    return _names(MODELS_DIR)


def bundled_cluster_names() -> list[str]:
    return _names(CLUSTERS_DIR)


@lru_cache(maxsize=None)
def load_bundled_profile(name: str):
    from .specs.hardware import load_profile
    return load_profile(PROFILES_DIR / f"{name}.yaml")


def _resolve(ref: str, folder: Path, kind: str, names: list[str]) -> Path:
    p = Path(ref)
    if p.suffix in (".yaml", ".yml", ".json") or os.sep in ref or p.exists():
        if not p.is_file():
            raise SpecError(ref, None, "file not found")
        return p
    if ref in names:
        return folder / f"{ref}.yaml"
    from .yamlio import suggest
    raise SpecError(ref, None, f"no such file and no bundled {kind} of that name{suggest(ref, names)}; "
                    f"bundled: {', '.join(names)}")


def load_model_ref(ref: str):
    from .specs.model import load_model
    return load_model(_resolve(ref, MODELS_DIR, "model", bundled_model_names()))


def cluster_path(ref: str) -> Path:
    """The file a `--cluster` reference (a path or a bundled name) names."""
    return _resolve(ref, CLUSTERS_DIR, "cluster", bundled_cluster_names())


def load_cluster_ref(ref: str):
    from .specs.cluster import load_cluster
    return load_cluster(cluster_path(ref))
