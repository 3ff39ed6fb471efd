"""Build hook: the bundled specs ship inside the package.

The top-level folders hardware_profiles/, model_specs/ and examples/clusters/ are the source of
truth (an editable install, the tests and the README read them there). An installed wheel has no
such folders beside the package, so build_py copies their YAML files to planner/_data/ in the
build tree, where planner/bundled.py finds them through importlib.resources. MANIFEST.in puts the
folders in the sdist, so that a wheel built from the sdist has them too. The rest of the
metadata is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PACKAGE = "planner"
PACKAGE_DATA = "_data"
SPEC_PATTERN = "*.yaml"
# source folder (relative to this file) -> folder under planner/_data/; planner/bundled.py's
# LAYOUT maps the same folders (tests/test_package.py checks the built wheel against it)
BUNDLED = {
    "hardware_profiles": "hardware_profiles",
    "model_specs": "model_specs",
    "examples/clusters": "clusters",
}


def bundled_files() -> list[tuple[Path, Path]]:
    """(source file, its path relative to the package) for every bundled spec. A missing source
    folder stops the build: a wheel without its specs installs but fails on every name."""
    pairs = []
    for source, packaged in BUNDLED.items():
        folder = HERE / source
        if not folder.is_dir():
            raise SystemExit(f"error: {folder} does not exist; expected the folder of bundled specs "
                             f"(an sdist must include it: see MANIFEST.in)")
        pairs += [(f, Path(PACKAGE_DATA) / packaged / f.name) for f in sorted(folder.glob(SPEC_PATTERN))]
    return pairs


class BuildWithSpecs(build_py):
    """build_py that also copies the bundled specs into the built package. Not in an editable
    install: there bundled.py reads the clone's folders, which stay current as they change."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        # a build folder left from an earlier build may hold a spec deleted since
        shutil.rmtree(Path(self.build_lib) / PACKAGE / PACKAGE_DATA, ignore_errors=True)
        for source, rel in bundled_files():
            target = Path(self.build_lib) / PACKAGE / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        """The copied specs too, so that install --record lists (and uninstall removes) them."""
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        return outputs + [str(Path(self.build_lib) / PACKAGE / rel) for _, rel in bundled_files()]


setup(cmdclass={"build_py": BuildWithSpecs})
