"""Run the planner CLI as users do: a subprocess on pipes or on a pseudo-terminal, or main()
in-process (the same entry point, fast enough for property-based tests)."""

from __future__ import annotations

import contextlib
import io
import os
import select
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def env_with(**changes) -> dict:
    """The current environment with changes (None removes a variable); the checkout importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run(args, cwd=None, env=None, timeout=120) -> subprocess.CompletedProcess:
    """The CLI on pipes (as in CI): returncode, stdout, stderr as text."""
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=cwd, env=env or env_with(),
                          capture_output=True, text=True, errors="replace", timeout=timeout)


def run_tty(args, cwd=None, env=None, timeout=120) -> tuple[int, str]:
    """The CLI with stdout and stderr on one pseudo-terminal: (returncode, everything shown)."""
    import pty
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "planner.cli", *args], cwd=cwd, env=env or env_with(),
                         stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:   # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif p.poll() is not None:
                break
        rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
    return rc, out.decode("utf-8", "replace")


def run_main(args) -> tuple[int, str, str]:
    """planner.cli.main() in this process: (exit code, stdout, stderr)."""
    from planner import cli
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["planner", *args]
    code = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                code = exc.code
    finally:
        sys.argv = argv
    return (0 if code is None else code), out.getvalue(), err.getvalue()


def one_error_line(stderr: str) -> str:
    """The stderr of a refused input: exactly one line, 'error: ...', no traceback, no blank
    line before it. Returns the line."""
    assert "Traceback" not in stderr, stderr
    assert stderr.startswith("error: "), repr(stderr)
    assert stderr.count("\n") == 1 and stderr.endswith("\n"), repr(stderr)
    assert not stderr.startswith("error: unexpected "), stderr
    return stderr.rstrip("\n")


def refused(args, *needles, code=2) -> str:
    """main() on args must refuse them: exit `code`, one error line holding every needle.
    Returns the line."""
    rc, out, err = run_main(args)
    assert rc == code, (rc, out, err)
    line = one_error_line(err)
    for n in needles:
        assert n in line, line
    return line
