"""Command line: a thin typer + rich layer over the library.

This package holds the shared typer `app`, the consoles, `main()` (the `planner` script) and
its error handling; each command registers itself on `app` from its own module (listing.py:
models, clusters, gpus, schema; estimate.py, plan.py, sweep.py, compare.py, check.py,
calibrate.py), and options.py checks the options several commands share.

Imports stay at the top of each module, except of the heavy ones, which `planner --help` (it
imports every command module) would otherwise load: numpy (the search, calibrate), matplotlib
(the plots), the cost model (planner.estimate and the emit modules built on it), the Megatron
launch reader (megatron.rules, with its shell interpreter), rich.progress and
importlib.metadata. Those are imported inside the command that needs them, each marked with a
comment naming which of these it is.
"""

from __future__ import annotations

import json
import os
import sys

import typer
from rich.console import Console

from .. import __version__
from ..errors import PlannerError
from ..inputs import printable, terminal_size
from .help import polish

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Auto-parallel planner for large-model training (Megatron-LM).")


class _Console(Console):
    """A rich console that escapes control characters in the text it is given (file names
    are echoed: an ESC or a newline in one must not reach the terminal raw). On stderr every
    message is one line, so newlines are escaped too."""

    def __init__(self, *, one_line: bool, **kw):
        super().__init__(**kw)
        self._one_line = one_line

    def print(self, *objects, **kw):
        if self._one_line:
            objects = tuple(printable(o) if isinstance(o, str) else o for o in objects)
        else:
            objects = tuple("\n".join(map(printable, o.split("\n"))) if isinstance(o, str) else o
                            for o in objects)
        super().print(*objects, **kw)


def _make_console(stderr: bool) -> Console:
    # The size comes from inputs.terminal_size (COLUMNS=abc, 0 or -5 fall back to the terminal's
    # size, or 160 columns on a pipe so that tables do not fold); messages never wrap.
    cols, lines = terminal_size(os.environ, 2 if stderr else 1)
    return _Console(one_line=stderr, stderr=stderr, width=cols, height=lines, soft_wrap=True)


console = _make_console(stderr=False)
err_console = _make_console(stderr=True)
_DEBUG = {"on": False}


def version_text() -> str:
    """'planner 0.1.0': the installed distribution's version (the package's own if it was never
    installed, e.g. on PYTHONPATH)."""
    from importlib import metadata   # only --version needs it

    try:
        return f"planner {metadata.version('planner')}"
    except metadata.PackageNotFoundError:
        return f"planner {__version__}"


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(version_text() + "\n")
        raise typer.Exit(0)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for unexpected errors."),
          version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the version and exit.")):
    _DEBUG["on"] = debug


def print_json(obj) -> None:
    """One JSON document on stdout (the --json output of every command)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _click_exception_types():
    """click's exception classes: typer >= 0.20 vendors click as typer._click (and plain click
    may not be installed at all); older typer uses click itself. Whichever are importable."""
    usage, abort = [], []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            mod = __import__(module, fromlist=["_"])
        except ImportError:
            continue
        for name, out in (("ClickException", usage), ("Abort", abort)):
            cls = getattr(mod, name, None)
            if isinstance(cls, type):
                out.append(cls)
    return tuple(usage), tuple(abort)


def error_line(text: str) -> None:
    """Write one error line to stderr, plain: not through rich, so that no terminal width,
    TERM or colour setting can fold, colour or swallow it; control characters escaped, no
    leading blank line."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    line = printable(str(text).strip())
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _PipeTolerant:
    """A standard stream whose reader may go away (`planner check ... | head`): the rest of the
    output goes to /dev/null, so the exit code stays the verdict's (click would exit 1 on EPIPE,
    which a CI gate reads as DOES NOT FIT)."""

    def __init__(self, stream):
        self._stream = stream

    def _drop(self) -> None:
        try:   # Python's documented remedy: point the descriptor at /dev/null
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        except (OSError, ValueError):
            pass

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _tolerant_streams() -> None:
    # a non-UTF-8 locale (LC_ALL=C with PYTHONUTF8=0, PYTHONIOENCODING=ascii) must not turn a
    # verdict with a non-ASCII file name into a UnicodeEncodeError: unencodable characters are
    # written as escapes instead
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass
    sys.stdout, sys.stderr = _PipeTolerant(sys.stdout), _PipeTolerant(sys.stderr)


def command():
    """The click command of `app`, its options' help polished (help.py)."""
    cmd = typer.main.get_command(app)
    polish(cmd)
    return cmd


def main() -> None:
    """Entry point: every expected error is one line and exit 2 (1 for invalid/does-not-fit)."""
    _tolerant_streams()
    try:
        rc = command()(standalone_mode=False)   # click returns the code of a typer.Exit here
        sys.exit(rc if isinstance(rc, int) else 0)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        error_line("interrupted")
        sys.exit(130)
    except PlannerError as exc:
        error_line(f"error: {exc}")
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - the top-level handler of a CLI
        usage, abort = _click_exception_types()
        if isinstance(exc, usage):
            # bad option values and usage: one line, exit 2 (click's own code for usage errors)
            error_line("error: " + " ".join(exc.format_message().split("\n")))
            sys.exit(2)
        if isinstance(exc, abort):
            sys.exit(130)
        if _DEBUG["on"] or "--debug" in sys.argv:
            raise
        error_line(f"error: unexpected {type(exc).__name__}: {exc} (run with --debug for details)")
        sys.exit(2)


# The commands register on `app` as their modules are imported, in the order `planner --help`
# lists them (after app, the consoles and print_json above, which they import).
from . import listing, estimate, plan, sweep, compare, check, calibrate  # noqa: E402,F401  isort: skip
