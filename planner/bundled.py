"""Where bundled specs (GPU profiles, models, clusters) and a user's own live, by kind and name.

Folders only, no parsing: names are looked up first in the user's folder, $PLANNER_DATA_DIR
(which adds to the bundled specs and may override one by name), then in the bundled specs:
planner/_data/ inside an installed wheel (setup.py copies the top-level folders there at build
time), or the clone's top-level hardware_profiles/, model_specs/ and examples/clusters/ for an
editable install, where git keeps them. The loaders on top are in planner.library (models,
clusters) and planner.specs.hardware (profiles, which a cluster names).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from .inputs import check_data_dir, data_dir, printable

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



def user_folders(kind: str, user: Path | None) -> tuple[Path, ...]:
    """Where the user's folder may hold specs of `kind`: the clone's layout (a copy of the
    clone's folders works) or the package's (clusters/), in that order."""
    if user is None:
        return ()
    return tuple(dict.fromkeys(user / sub for sub in LAYOUT[kind]))


def folders(kind: str) -> tuple[Path, ...]:
    """The folders specs of `kind` are looked up in, first match wins: the user's, then the
    bundled one. Refuses a $PLANNER_DATA_DIR that is not a folder (read on every lookup, so a
    changed variable is seen)."""
    return (*user_folders(kind, check_data_dir(os.environ)), BUNDLED[kind])


def stems(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob(SPEC_PATTERN)} if folder.is_dir() else set()


def names(kind: str) -> list[str]:
    return sorted(set().union(*(stems(f) for f in folders(kind))))


def find(kind: str, name: str) -> Path | None:
    """The file of the spec `name` in the first folder that has one, or None."""
    for folder in folders(kind):
        if name in stems(folder):
            return folder / f"{name}{SPEC_SUFFIX}"
    return None


def bundled_profile_names() -> list[str]:
    return names("profile")


def bundled_model_names() -> list[str]:
    return names("model")


def bundled_cluster_names() -> list[str]:
    return names("cluster")


def data_folders() -> tuple[Path, ...]:
    """Every folder specs are read from, the user's and the bundled (an output folder must never
    replace them). Does not refuse a bad $PLANNER_DATA_DIR: the lookups do, with their message."""
    user = data_dir(os.environ)
    return tuple(f for kind in LAYOUT for f in (*user_folders(kind, user), BUNDLED[kind]))

def nothing_found(kind: str) -> str:
    """Why no spec of `kind` was found: the folders searched (none exists, or none holds one)."""
    return f"none (no {SPEC_PATTERN} in {', '.join(printable(f) for f in folders(kind))})"
