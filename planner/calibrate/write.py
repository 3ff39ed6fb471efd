"""The calibrated cluster YAML: the input cluster as written (its fields and units), plus the
`calibration:` block; written atomically (a temporary file in the same folder, then renamed),
so that an error leaves nothing, and a reader never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from ..errors import SpecError
from ..specs.calibration import calibration_to_dict


# The first line render() writes: how --force recognises a file calibrate wrote.
HEADER_START = "# Calibrated by `planner calibrate`"


def check_out_path(out: str, cluster_file: Path, data: dict, force: bool = False) -> Path:
    """Refuse an --out that would overwrite the input, sit in a missing folder, or break the
    cluster's profile paths (relative to its own folder). An existing file is replaced only
    with `force`, and only when calibrate wrote it (its header): never what the tool did not
    write."""
    p = Path(out)
    if p.is_dir():
        raise SpecError("--out", None, f"{out} is a folder; expected a file name, e.g. calibrated.yaml")
    if os.path.lexists(p):
        if not force:
            raise SpecError("--out", None, f"{out} exists; pass --force to replace a calibrated cluster that "
                            "planner calibrate wrote, or name a new file")
        if not _written_by_calibrate(p):
            raise SpecError("--out", None, f"{out} exists and was not written by planner calibrate (no "
                            f"'{HEADER_START}' header); it is not replaced, even with --force")
    if not p.parent.resolve().is_dir():
        raise SpecError("--out", None, f"folder {p.parent} does not exist")
    if p.suffix not in (".yaml", ".yml"):
        raise SpecError("--out", None, f"found {out!r}, expected a .yaml file")
    if p.exists() and p.resolve() == cluster_file.resolve():
        raise SpecError("--out", None, f"{out} is the input cluster; write the calibrated one to a new file")
    refs = [g.get("gpu") for g in data.get("node_groups") or [] if isinstance(g, dict)]
    if any(isinstance(r, str) and r.endswith((".yaml", ".yml")) for r in refs) \
            and p.parent.resolve() != cluster_file.parent.resolve():
        raise SpecError("--out", None, f"the cluster names hardware profile files relative to its folder "
                        f"({cluster_file.parent}); write the calibrated cluster there")
    return p


def _written_by_calibrate(p: Path) -> bool:
    """Whether p is a regular file that starts with render()'s header."""
    if p.is_symlink() or not p.is_file():
        return False
    try:
        with open(p, encoding="utf-8", errors="replace") as fh:
            return fh.read(len(HEADER_START)) == HEADER_START
    except OSError:
        return False


def document(data: dict, cal, base) -> dict:
    doc = {k: v for k, v in data.items() if k != "calibration"}
    doc["calibration"] = calibration_to_dict(cal, base)
    return doc


def render(doc: dict, cluster_file: Path, created: str) -> str:
    head = (f"{HEADER_START} ({created}) from {cluster_file.name}: the `calibration:`\n"
            "# block holds each fitted value, where it was measured, and what was left at its profile value.\n")
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=110, allow_unicode=True)


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent.resolve()))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
