#!/usr/bin/env python3
"""Rewrite every pasted output in README.md and docs/*.md from the tool itself.

A pasted output is a fenced block preceded by one or more marker lines:

    <!-- output: planner plan --model llama3-8b --cluster dgx-h100-x8 --global-batch-size 256 --seq-length 8192 -->
    ```
    ... rewritten by this script ...
    ```

Each marker's command is run with bash (COLUMNS=200, so on a pipe at the width the pages were
printed at), stdout and stderr together, and the block becomes, for each marker in turn, a line
`$ COMMAND`, the command's output and, when it exits non-zero, a line `(exit N)`. The table
borders rich draws (the top, header-separator and bottom lines) are left out, unless the marker
says `output keep-borders:`.

The commands run in a scratch folder that mirrors the clone (its top-level entries linked,
`examples/` copied), so that `--out DIR`, `--plot DIR` and `calibrate --out ... --force` write
there and never into the clone; a ```bash block that writes files with `cat > FILE <<'EOF'` is
run there too, so that the markers after it can read them; commands of one page run in order in one scratch folder (a
`check` of `demo/plan-1/launch.sh` follows the `--emit` that wrote it).

Slow commands (`python bench/bench_search.py`, `python validation/bridge.py`) are not markers:
their tables are kept as pasted, with the command that reproduces them beside each.

Usage: python docs/regenerate.py [--check] [FILE.md ...]   (default: README.md and docs/*.md)
       --check: rewrite nothing, exit 1 when a pasted output differs from the tool's
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- output( keep-borders)?: (.+?) -->\s*$")
BORDER_START = tuple("┏┡┗└┌├╞╭╰")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def make_sandbox(tmp: Path) -> Path:
    """A folder that looks like the clone: top-level entries linked, examples/ copied."""
    box = tmp / "clone"
    box.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in (".git", ".venv", "build") or entry.name.endswith(".egg-info"):
            continue
        if entry.name == "examples":
            shutil.copytree(entry, box / "examples", symlinks=True)
        else:
            (box / entry.name).symlink_to(entry)
    return box


def env() -> dict:
    e = {**os.environ, "COLUMNS": "200"}
    for k in ("GITHUB_ACTIONS", "FORCE_COLOR", "CLICOLOR_FORCE"):
        e.pop(k, None)
    bindir = str(Path(sys.executable).parent)          # the environment's `planner`
    e["PATH"] = bindir + os.pathsep + e.get("PATH", "")
    return e


def run(cmd: str, cwd: Path, keep_borders: bool) -> list[str]:
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    lines = [f"$ {cmd}"]
    for line in r.stdout.rstrip("\n").splitlines():
        if not keep_borders and line.lstrip().startswith(BORDER_START):
            continue
        lines.append(line.rstrip())
    if r.returncode:
        lines.append(f"(exit {r.returncode})")
    return lines


def regenerate(text: str, cwd: Path) -> str:
    src = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(src):
        markers = []
        while i < len(src) and MARKER.match(src[i]):
            m = MARKER.match(src[i])
            markers.append((m.group(2), bool(m.group(1))))
            out.append(src[i])
            i += 1
        if not markers:
            if src[i] == "```bash":                  # a block that writes files a marker reads
                j = src.index("```", i + 1)
                block = "\n".join(src[i + 1:j])
                if "<<'EOF'" in block:
                    r = subprocess.run(["bash", "-c", block], cwd=cwd, env=env(), capture_output=True, text=True)
                    if r.returncode:
                        raise SystemExit(f"setup block failed: {block[:60]!r}: {r.stderr}")
                out += src[i:j + 1]
                i = j + 1
                continue
            out.append(src[i])
            i += 1
            continue
        if i >= len(src) or not src[i].startswith("```"):
            raise SystemExit(f"marker {markers[-1][0]!r} is not followed by a fenced block")
        fence = src[i]
        j = i + 1
        while j < len(src) and src[j] != "```":
            j += 1
        if j >= len(src):
            raise SystemExit(f"unclosed block after marker {markers[-1][0]!r}")
        body = []
        for cmd, keep in markers:
            body += run(cmd, cwd, keep)
        out += [fence, *body, "```"]
        i = j + 1
    return "\n".join(out)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    files = [Path(a).resolve() for a in argv if a != "--check"] or pages()
    stale = []
    for page in files:
        with tempfile.TemporaryDirectory() as tmp:
            box = make_sandbox(Path(tmp))
            old = page.read_text()
            new = regenerate(old, box)
        if new != old:
            stale.append(page.relative_to(ROOT))
            if not check:
                page.write_text(new)
    verb = "differ" if check else "rewritten"
    print(f"{verb}: {', '.join(map(str, stale))}" if stale else "all pasted outputs are current")
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
