"""Write emitted plans: DIR/plan-K/{megatron.args, launch.sh, plan.json} and DIR/planner-manifest.json.

Output safety (docs/reliability.md):
- the new output is written into a sibling temporary folder and renamed into place, so a
  failure (an error, a full disk, Ctrl-C) leaves the old output as it was;
- the manifest lists every file planner wrote, with its size and SHA-256; `--force` replaces
  an existing non-empty folder only when it holds exactly those files, unchanged: nothing
  planner did not write (or that was edited since) is ever deleted;
- never, with or without --force: a symbolic link, the root folder, the home folder, the
  current folder or one holding it, a folder holding an input file or the bundled specs.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from ..errors import PlannerError, SpecError
from ..inputs import printable, read_regular_file
from ..megatron.emit import checked_args, flag_groups, launch_script, stage_host_map
from .report import estimate_to_dict

MANIFEST = "planner-manifest.json"
MANIFEST_KIND = "planner --emit megatron output"
MANIFEST_MAX_BYTES = 2**20
# an output folder planner wrote holds a few files per plan (--top is at most 50)
MAX_MANIFEST_ENTRIES = 1000


def _err(option: str, message: str) -> SpecError:
    return SpecError(option, None, message)


def _first_existing(p: Path) -> Path:
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def _probe_writable(option: str, folder: Path) -> None:
    """Create and remove a temporary folder in `folder`: the only reliable test (os.access
    says yes to root on a read-only sysfs)."""
    try:
        os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".planner-probe-"))
    except OSError as exc:
        raise _err(option, f"cannot write in {printable(folder)}: {exc.strerror}") from None


def check_plot_folder(path: str) -> Path:
    """A folder --plot can write timeline.png / memory.png / candidates.png into (it may
    exist; those three names are replaced, nothing else is touched)."""
    option = "--plot"
    if not path or not path.strip():
        raise _err(option, f"found {path!r}, expected a folder path")
    p = Path(os.path.abspath(path))
    if os.path.lexists(p) and not p.is_dir():
        raise _err(option, f"{printable(path)} exists and is not a folder")
    anc = _first_existing(p)
    if not anc.is_dir():
        raise _err(option, f"{printable(path)}: {printable(anc)} is not a folder")
    _probe_writable(option, anc)
    return p


def _protected(real: Path, inputs: Iterable[Path]) -> str | None:
    """Why `real` (an absolute path, ancestors resolved) must never be replaced, or None."""
    if real == real.parent:
        return "is the root folder"
    try:
        cwd = Path.cwd().resolve()
    except OSError:      # the current folder was deleted: nothing to protect there
        cwd = None
    if cwd is not None and (real == cwd or real in cwd.parents):
        return "is the current folder or holds it"
    try:
        home = os.path.expanduser("~")   # stays "~" without $HOME and a password entry
        home = Path(home).resolve() if home != "~" else None
    except (OSError, RuntimeError, KeyError):
        home = None
    if home is not None and (real == home or real in home.parents):
        return "is the home folder or holds it"
    for f in inputs:
        try:
            f = Path(f).resolve()
        except (OSError, RuntimeError):
            continue
        if real == f or real in f.parents:
            return f"holds the input {printable(f)}"
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _entries(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every entry under root (not following links), as (relative path, lstat), bounded."""
    out, stack = [], [Path()]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel) as it:
            for d in it:
                r = rel / d.name
                st = d.stat(follow_symlinks=False)
                out.append((r.as_posix(), st))
                if len(out) > MAX_MANIFEST_ENTRIES:
                    return out
                if stat.S_ISDIR(st.st_mode):
                    stack.append(r)
    return out


def foreign_entry(root: Path) -> str | None:
    """The first entry of `root` that planner did not write (per its manifest), or that was
    changed since, with the reason; None when the folder is exactly planner's output."""
    try:
        doc = json.loads(read_regular_file(root / MANIFEST, MANIFEST_MAX_BYTES, "a planner manifest"))
    except (PlannerError, ValueError):
        return f"no valid {MANIFEST} (it is not a folder planner wrote)"
    files = doc.get("files") if isinstance(doc, dict) and doc.get("kind") == MANIFEST_KIND else None
    if not isinstance(files, dict):
        return f"a {MANIFEST} that planner did not write"
    dirs = {p.as_posix() for f in files for p in Path(f).parents if p != Path()}
    try:
        entries = _entries(root)
    except OSError as exc:
        return f"entries that cannot be read ({exc.strerror})"
    if len(entries) > MAX_MANIFEST_ENTRIES:
        return f"more than {MAX_MANIFEST_ENTRIES} entries"
    for rel, st in entries:
        if rel == MANIFEST and stat.S_ISREG(st.st_mode):
            continue
        if stat.S_ISDIR(st.st_mode) and rel in dirs:
            continue
        want = files.get(rel)
        if stat.S_ISREG(st.st_mode) and isinstance(want, dict):
            try:
                same = want.get("bytes") == st.st_size and want.get("sha256") == _sha256(root / rel)
            except OSError:
                same = False
            if same:
                continue
            return f"{printable(rel)}, changed since planner wrote it"
        return f"{printable(rel)}, which planner did not write"
    return None


def check_out_folder(out: str, force: bool, inputs: Iterable[Path] = ()) -> Path:
    """The absolute path --out names, after refusing what it must not replace or cannot use.
    `inputs`: files the run reads (model, cluster); the bundled spec folders are added."""
    from ..library import data_folders
    option = "--out"
    if not out or not out.strip():
        raise _err(option, f"found {out!r}, expected a folder path")
    inputs = (*inputs, *data_folders())
    name = printable(out)
    target = Path(os.path.abspath(out))
    if os.path.islink(target):
        raise _err(option, f"{name} is a symbolic link; give the folder itself (the output replaces what --out names)")
    try:
        real = target.parent.resolve() / target.name
    except (OSError, RuntimeError) as exc:
        raise _err(option, f"{name}: cannot resolve its folder ({exc})") from None
    why = _protected(real, inputs)
    if why:
        raise _err(option, f"{name} {why}; planner replaces the --out folder as a whole, so give a new "
                           "folder, e.g. ./plans")
    if not os.path.lexists(target):
        anc = _first_existing(target)
        if not anc.is_dir():
            raise _err(option, f"{name}: {printable(anc)} is not a folder")
        _probe_writable(option, anc)
        return target
    if not target.is_dir():
        raise _err(option, f"{name} exists and is not a folder")
    try:
        empty = not any(os.scandir(target))
    except OSError as exc:
        raise _err(option, f"{name}: cannot read the folder: {exc.strerror}") from None
    if not empty:
        foreign = foreign_entry(target)
        if foreign:
            raise _err(option, f"{name} is not empty and holds {foreign}; --force replaces only a folder "
                               "planner wrote, unchanged: move those files, or choose a new folder")
        if not force:
            raise _err(option, f"{name} holds an earlier planner output; pass --force to replace it")
    _probe_writable(option, target.parent)
    return target


def _write_plan(d: Path, k: int, e) -> None:
    d.mkdir()
    s = e.strategy
    args = checked_args(e.model, s)
    gpn = {g.name: g.gpus_per_node for g in e.cluster.node_groups}
    used = {gpn[g] for g in e.stage_groups if g in gpn}
    if len(used) > 1:
        raise PlannerError(f"plan-{k} runs on node groups with {' and '.join(map(str, sorted(used)))} GPUs "
                           "per node; one torchrun launch needs the same --nproc-per-node everywhere")
    hmap = stage_host_map(s, e.stage_groups, gpn)
    lines = [" ".join(group) for group in flag_groups(args)]
    (d / "megatron.args").write_text("\n".join(lines) + "\n", encoding="utf-8")
    script = launch_script(args, s, hmap, min(gpn.values()), f"plan-{k}")
    (d / "launch.sh").write_text(script, encoding="utf-8")
    os.chmod(d / "launch.sh", 0o755)
    doc = estimate_to_dict(e)
    doc["stage_hosts"] = hmap
    (d / "plan.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_manifest(staging: Path) -> None:
    files = {}
    for rel, st in sorted(_entries(staging)):
        if stat.S_ISREG(st.st_mode):
            files[rel] = {"bytes": st.st_size, "sha256": _sha256(staging / rel)}
    doc = {"kind": MANIFEST_KIND, "files": files,
           "note": "planner --force replaces this folder only while it holds exactly these files, unchanged"}
    (staging / MANIFEST).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _swap(staging: Path, target: Path, name: str, force: bool, warn: Callable[[str], None]) -> None:
    """Put staging where target is. Without --force, or with target absent or an empty folder:
    one rename, atomic, which the OS refuses onto anything but an absent or empty folder (so a
    folder or file that appeared meanwhile is never touched). With --force onto planner's own
    output, checked again here: rename it aside, rename staging in (rolled back on failure),
    check the old one once more (it may have changed meanwhile), and only then delete it."""
    if not force or not os.path.lexists(target) or (_is_real_dir(target) and not any(os.scandir(target))):
        os.rename(staging, target)
        return
    changed = "changed while planner wrote (another run?); nothing was replaced, run again"
    if not _is_real_dir(target) or foreign_entry(target):
        raise _err("--out", f"{name} {changed}")
    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.planner-old-"))
    try:
        os.rename(target, old)           # replaces the empty placeholder
    except FileNotFoundError:
        os.rmdir(old)
        raise _err("--out", f"{name} {changed}") from None
    except BaseException:
        os.rmdir(old)
        raise
    try:
        os.rename(staging, target)
    except BaseException:
        try:
            os.rename(old, target)       # roll back
        except OSError:                  # another run's output took the place meanwhile
            _discard(old, warn)
        raise
    _discard(old, warn)


def _discard(old: Path, warn: Callable[[str], None]) -> None:
    """Delete the previous output set aside, after checking once more that it is exactly what
    planner wrote (it may have changed between the first check and the rename)."""
    foreign = foreign_entry(old)
    if foreign:
        warn(f"the previous output changed while this one was written (it holds {foreign}); "
             f"kept it at {printable(old)}")
        return
    shutil.rmtree(old, ignore_errors=True)
    if os.path.lexists(old):
        warn(f"could not delete the previous output set aside at {printable(old)}")


def _is_real_dir(p: Path) -> bool:
    return p.is_dir() and not os.path.islink(p)


def write_plans(plans, out: str, force: bool, inputs: Iterable[Path] = (),
                extra: Callable[[Path], object] | None = None, warn: Callable[[str], None] = lambda w: None) -> list[str]:
    """Write plan-1..K into --out (see the module docstring for what may be replaced).
    `extra(folder)` writes more files into the staged output (--plot inside --out)."""
    inputs = tuple(inputs)
    target = check_out_folder(out, force, inputs)   # again: the folder may have changed since the first check
    name = printable(out)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.planner-new-"))
        os.chmod(staging, 0o777 & ~_umask())   # mkdtemp makes it private; an output folder is not
    except OSError as exc:
        raise _err("--out", f"cannot write {name}: {exc.strerror}") from None
    written = []
    try:
        for k, e in enumerate(plans, 1):
            _write_plan(staging / f"plan-{k}", k, e)
            written.append(str(Path(out) / f"plan-{k}"))
        if extra is not None:
            extra(staging)
        _write_manifest(staging)
        _swap(staging, target, name, force, warn)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise _err("--out", f"{name} appeared while planner wrote (another run?); nothing of it was "
                                "touched, run again") from None
        raise _err("--out", f"cannot write {name}: {exc.strerror or exc}; the previous output (if any) is "
                            "unchanged") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return written
