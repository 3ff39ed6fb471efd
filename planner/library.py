"""Bundled specs (GPU profiles, models, clusters) and a user's own, found by name.

`--model` and `--cluster` take a path or the name of a spec. Names are looked up first in the
user's folder, $PLANNER_DATA_DIR (which adds to the bundled specs and may override one by name),
then in the bundled specs: planner/_data/ inside an installed wheel (setup.py copies the
top-level folders there at build time), or the clone's top-level hardware_profiles/,
model_specs/ and examples/clusters/ for an editable install, where git keeps them.
"""

from __future__ import annotations

import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .errors import SpecError
from .inputs import check_data_dir, check_regular_file, data_dir, printable

# kind -> (its folder in a clone, relative to the project root; its folder under planner/_data/
# in a built package). setup.py's BUNDLED must map the same folders (tests/test_package.py checks).
LAYOUT = {
    "profile": ("hardware_profiles", "hardware_profiles"),
    "model": ("model_specs", "model_specs"),
    "cluster": ("examples/clusters", "clusters"),
}
PACKAGE_DATA = "_data"
SPEC_SUFFIX = ".yaml"
SPEC_PATTERN = f"*{SPEC_SUFFIX}"
CLONE_ROOT = Path(__file__).resolve().parent.parent


def _packaged_data() -> Path | None:
    """planner/_data/ of an installed wheel; None in a clone (git does not hold it, only a build
    writes it) and for a package imported from a zip archive, which has no folder to list."""
    data = resources.files(__package__) / PACKAGE_DATA
    return data if isinstance(data, Path) and data.is_dir() else None


def _bundled_folders() -> dict[str, Path]:
    """The folder of each kind of bundled spec: inside the installed package, else the clone's."""
    data = _packaged_data()
    if data is not None:
        return {kind: data / packaged for kind, (_, packaged) in LAYOUT.items()}
    return {kind: CLONE_ROOT / source for kind, (source, _) in LAYOUT.items()}


BUNDLED = _bundled_folders()
PROFILES_DIR, MODELS_DIR, CLUSTERS_DIR = BUNDLED["profile"], BUNDLED["model"], BUNDLED["cluster"]

_EXPECTED = {"model": "a model YAML or a Hugging Face config.json", "cluster": "a cluster YAML"}


def _user_folders(kind: str, user: Path | None) -> tuple[Path, ...]:
    """Where the user's folder may hold specs of `kind`: the clone's layout (a copy of the
    clone's folders works) or the package's (clusters/), in that order."""
    if user is None:
        return ()
    return tuple(dict.fromkeys(user / sub for sub in LAYOUT[kind]))


def _folders(kind: str) -> tuple[Path, ...]:
    """The folders specs of `kind` are looked up in, first match wins: the user's, then the
    bundled one. Refuses a $PLANNER_DATA_DIR that is not a folder (read on every lookup, so a
    changed variable is seen)."""
    return (*_user_folders(kind, check_data_dir(os.environ)), BUNDLED[kind])


def _stems(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob(SPEC_PATTERN)} if folder.is_dir() else set()


def _names(kind: str) -> list[str]:
    return sorted(set().union(*(_stems(f) for f in _folders(kind))))


def _find(kind: str, name: str) -> Path | None:
    """The file of the spec `name` in the first folder that has one, or None."""
    for folder in _folders(kind):
        if name in _stems(folder):
            return folder / f"{name}{SPEC_SUFFIX}"
    return None


def bundled_profile_names() -> list[str]:
    return _names("profile")


def bundled_model_names() -> list[str]:
    return _names("model")


def bundled_cluster_names() -> list[str]:
    return _names("cluster")


def data_folders() -> tuple[Path, ...]:
    """Every folder specs are read from, the user's and the bundled (an output folder must never
    replace them). Does not refuse a bad $PLANNER_DATA_DIR: the lookups do, with their message."""
    user = data_dir(os.environ)
    return tuple(f for kind in LAYOUT for f in (*_user_folders(kind, user), BUNDLED[kind]))


def load_bundled_profile(name: str):
    """The GPU profile `name` (a cluster YAML names its GPUs so), the user's before the bundled."""
    path = _find("profile", name)
    if path is None:
        from .yamlio import suggest
        names = bundled_profile_names()
        raise SpecError(printable(name), None, f"no GPU profile of that name{suggest(name, names)}; "
                        f"expected one of: {', '.join(names)}")
    return _load_profile(path)


@lru_cache(maxsize=None)
def _load_profile(path: Path):
    """Cached by path, not name: a user's profile of a bundled name is a different file."""
    from .specs.hardware import load_profile
    return load_profile(path)


def _resolve(ref: str, kind: str, option: str) -> Path:
    from .yamlio import MAX_FILE_BYTES
    expected = f"{_EXPECTED[kind]} ({option})"
    if not isinstance(ref, str) or not ref.strip():
        raise SpecError(option, None, f"found {ref!r}, expected a path to {_EXPECTED[kind]} or a bundled {kind} name")
    p = Path(ref)
    if p.suffix in (".yaml", ".yml", ".json") or os.sep in ref or os.path.lexists(ref):
        check_regular_file(p, MAX_FILE_BYTES, expected)
        return p
    found = _find(kind, ref)
    if found is not None:
        return found
    from .yamlio import suggest
    names = _names(kind)
    bundled = ", ".join(names) if names else _nothing_found(kind)
    raise SpecError(printable(ref), None, f"no such file and no bundled {kind} of that name{suggest(ref, names)}; "
                    f"expected {expected}; bundled: {bundled}")


def _nothing_found(kind: str) -> str:
    """Why no spec of `kind` was found: the folders searched (none exists, or none holds one)."""
    return f"none (no {SPEC_PATTERN} in {', '.join(printable(f) for f in _folders(kind))})"


def resolve_model_ref(ref: str, option: str = "--model") -> Path:
    """The file a --model value names (checked to be a regular file)."""
    return _resolve(ref, "model", option)


def resolve_cluster_ref(ref: str, option: str = "--cluster") -> Path:
    return _resolve(ref, "cluster", option)


def load_model_ref(ref: str, option: str = "--model"):
    from .specs.model import load_model
    return load_model(resolve_model_ref(ref, option))


def load_cluster_ref(ref: str, option: str = "--cluster"):
    from .specs.cluster import load_cluster
    return load_cluster(resolve_cluster_ref(ref, option))
