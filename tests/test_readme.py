"""The README and docs/ as tests: every `planner ...` command in a ```bash block runs as written
from a clone and exits with the code the page states (`# ... exit N` after it; 0 otherwise).

Commands run with bash in a scratch folder that mirrors the clone (top-level entries linked,
examples/ copied), so that `--out DIR`, `--plot DIR`, `> file` and `calibrate --force` write
there. The commands of one page run in order in one folder (a `check` of an emitted launch
follows its `--emit`; `cat > FILE <<'EOF'` blocks write the specs later commands read).
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import regenerate  # noqa: E402

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Not run here: installs, the test suite itself, the slow benchmark / validation scripts, and
# sweeps over many node counts (seconds per option; the sweep's output is pasted by
# docs/regenerate.py, which does run it).
SKIP = ("pip install", "python -m pytest", "python bench/", "python validation/", "planner sweep")


def commands(text):
    """(command, expected exit code) for each command of each ```bash block, in order."""
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        lines = block.split("\n")
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if "<<'EOF'" in line:                       # a heredoc: up to its EOF line
                body = [line]
                while i < len(lines):
                    body.append(lines[i])
                    i += 1
                    if lines[i - 1] == "EOF":
                        break
                out.append(("\n".join(body), 0))
                continue
            while line.rstrip().endswith("\\") and i < len(lines):
                line = line.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
            m = re.search(r"\s#\s.*?\bexit (\d+)\s*$", line)
            out.append((line, int(m.group(1)) if m else 0))
    return out


def test_readme_is_at_most_250_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= 250, f"README.md has {n} lines; move detail to docs/"


def test_readme_keeps_the_set_up_commands():
    text = (ROOT / "README.md").read_text()
    for cmd in ("pip install -e . && planner plan --model llama3-8b --cluster dgx-h100-x8 "
                "--global-batch-size 256 --seq-length 8192",
                "pip install -e '.[test]' && python -m pytest -q tests"):
        assert f"```bash\n{cmd}\n```" in text


def test_every_page_has_commands_and_links_resolve():
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (page.parent / target).exists(), (page.name, target)
    assert any("planner check" in c for c, _ in commands((ROOT / "README.md").read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_commands_run_as_written_with_the_stated_exit_code(page, tmp_path):
    cmds = [(c, rc) for c, rc in commands(page.read_text()) if not any(s in c for s in SKIP)]
    if not cmds:
        pytest.skip("no runnable command on this page")
    box = regenerate.make_sandbox(tmp_path)
    for cmd, expected in cmds:
        r = subprocess.run(["bash", "-c", cmd], cwd=box, env=regenerate.env(), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == expected, (page.name, cmd, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (cmd, r.stderr)


def test_pasted_outputs_name_their_commands():
    """Each block after output markers holds a `$ COMMAND` line per marker, in order
    (python docs/regenerate.py rewrites them)."""
    for page in PAGES:
        text = page.read_text()
        for group, block in re.findall(r"((?:^<!-- output[^\n]*-->\n)+)```\n(.*?)^```", text, flags=re.S | re.M):
            wanted = [regenerate.MARKER.match(x).group(2) for x in group.strip().split("\n")]
            shown = [x[2:] for x in block.split("\n") if x.startswith("$ ")]
            assert shown == wanted, (page.name, wanted, shown)
