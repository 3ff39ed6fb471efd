"""Specs found by name or path: `--model` and `--cluster` take a path or the name of a bundled
(or the user's) spec; where names are looked up is planner.bundled. The public entry points
for the library's users: load_model_ref, load_cluster_ref, load_bundled_profile and the names
of what is bundled.
"""

from __future__ import annotations

import os
from pathlib import Path

from .bundled import (BUNDLED, CLONE_ROOT, CLUSTERS_DIR, LAYOUT, MODELS_DIR, PACKAGE_DATA,
                      PROFILES_DIR, SPEC_PATTERN, SPEC_SUFFIX, bundled_cluster_names, bundled_model_names,
                      bundled_profile_names, data_folders, find, names, nothing_found)
from .errors import SpecError
from .inputs import check_regular_file, printable
from .specs.cluster import load_cluster
from .specs.hardware import load_bundled_profile
from .specs.hf import is_hf_config, model_from_hf
from .specs.model import ModelSpec, model_from_dict
from .yamlio import MAX_FILE_BYTES, load_file, suggest

# the library's public names (the folders' own live in planner.bundled)
__all__ = ["BUNDLED", "CLONE_ROOT", "CLUSTERS_DIR", "LAYOUT", "MODELS_DIR", "PACKAGE_DATA", "PROFILES_DIR",
           "SPEC_PATTERN", "SPEC_SUFFIX", "bundled_cluster_names", "bundled_model_names", "bundled_profile_names",
           "data_folders", "load_bundled_profile", "load_cluster_ref", "load_model_file", "load_model_ref",
           "resolve_cluster_ref", "resolve_model_ref"]

_EXPECTED = {"model": "a model YAML or a Hugging Face config.json", "cluster": "a cluster YAML"}

def _resolve(ref: str, kind: str, option: str) -> Path:
    expected = f"{_EXPECTED[kind]} ({option})"
    if not isinstance(ref, str) or not ref.strip():
        raise SpecError(option, None, f"found {ref!r}, expected a path to {_EXPECTED[kind]} or a bundled {kind} name")
    p = Path(ref)
    if p.suffix in (".yaml", ".yml", ".json") or os.sep in ref or os.path.lexists(ref):
        check_regular_file(p, MAX_FILE_BYTES, expected)
        return p
    found = find(kind, ref)
    if found is not None:
        return found
    known = names(kind)
    bundled = ", ".join(known) if known else nothing_found(kind)
    raise SpecError(printable(ref), None, f"no such file and no bundled {kind} of that name{suggest(ref, known)}; "
                    f"expected {expected}; bundled: {bundled}")




def resolve_model_ref(ref: str, option: str = "--model") -> Path:
    """The file a --model value names (checked to be a regular file)."""
    return _resolve(ref, "model", option)


def resolve_cluster_ref(ref: str, option: str = "--cluster") -> Path:
    return _resolve(ref, "cluster", option)


def load_model_file(path: str | Path) -> ModelSpec:
    """A model YAML, or a Hugging Face config.json (told apart by its field names)."""
    data = load_file(path)
    if is_hf_config(data):
        return model_from_hf(data, str(path))
    return model_from_dict(data, str(path))


def load_model_ref(ref: str, option: str = "--model") -> ModelSpec:
    return load_model_file(resolve_model_ref(ref, option))


def load_cluster_ref(ref: str, option: str = "--cluster"):
    return load_cluster(resolve_cluster_ref(ref, option))
