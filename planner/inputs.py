"""Where raw input becomes validated values: files (a regular file of bounded size), integer
options, environment variables (COLUMNS, LINES, PLANNER_DATA_DIR), and text echoed back.

The spec loaders (yamlio.load_file), the bundled-spec library and the CLI call these, so that
each kind of bad input is refused once, the same way: one SpecError naming the source (a file,
an option, a variable), and what was found and expected. Numbers with units are bounded in
units.py; spec fields in yamlio.get_int / get_float.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path

from .errors import SpecError

# --tp, --pp, --fix tp=..., --global-batch-size ...: degrees and batch counts are bounded like
# spec counts (a 1,000,000-GPU cluster is the largest a cluster spec may describe)
MAX_DEGREE = 1_000_000
# --global-batch-size and --seq-length: beyond 1e8 (samples or tokens) no training run exists
MAX_COUNT = 10**8
# COLUMNS beyond this is not a terminal (rich would pad lines to it)
MAX_COLUMNS = 10_000
# piped output (CI logs, files) gets a wide fixed width instead of rich's 80 columns, so that
# tables do not fold
PIPE_COLUMNS = 160
# a terminal whose size cannot be read: the VT100 default
TTY_COLUMNS, TTY_LINES = 80, 25

_ESCAPED_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")   # controls, format (bidi), surrogates, separators
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object) -> str:
    """`text` safe to echo on one terminal line: control characters (newline, ESC, bidi
    overrides, line separators) are written as escapes, e.g. \\n, \\x1b; bytes that were not
    valid in the locale's encoding (surrogate escapes) as the byte, \\xNN."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) not in _ESCAPED_CATEGORIES:
            out.append(ch)
            continue
        o = ord(ch)
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif 0xDC80 <= o <= 0xDCFF:        # os.fsdecode's escape of an undecodable byte
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x100:
            out.append(f"\\x{o:02x}")
        else:
            out.append(f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)


_KINDS = ((stat.S_ISDIR, "is a directory"), (stat.S_ISFIFO, "is a named pipe (FIFO)"),
          (stat.S_ISCHR, "is a character device"), (stat.S_ISBLK, "is a block device"),
          (stat.S_ISSOCK, "is a socket"))


def _not_regular(mode: int) -> str:
    for test, what in _KINDS:
        if test(mode):
            return what
    return "is not a regular file"


def check_regular_file(path: str | Path, max_bytes: int, expected: str = "a file") -> None:
    """Refuse, by what it is, a path that is not a regular file of at most max_bytes: missing,
    a directory, a FIFO (reading one would block), a device, a socket."""
    name = printable(path)
    if str(path) == "":
        raise SpecError("''", None, f"empty path, expected {expected}")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SpecError(name, None, f"file not found, expected {expected}") from None
    except NotADirectoryError:
        raise SpecError(name, None, f"file not found (a part of the path is not a folder), expected {expected}") from None
    except OSError as exc:
        raise SpecError(name, None, f"cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(name, None, f"{_not_regular(st.st_mode)}, expected {expected}")
    if st.st_size > max_bytes:
        raise SpecError(name, None, f"file is {st.st_size} bytes, larger than {max_bytes}; expected {expected}")


def read_regular_file(path: str | Path, max_bytes: int, expected: str = "a file") -> bytes:
    """The bytes of a regular file of at most `max_bytes` (check_regular_file first, so a FIFO
    is never opened for reading); a file that grows or lies about its size (procfs) is cut
    off after max_bytes + 1."""
    check_regular_file(path, max_bytes, expected)
    name = printable(path)
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO since the stat, open does not wait
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SpecError(name, None, f"cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(name, None, f"{_not_regular(st.st_mode)}, expected {expected}")
        chunks, left = [], max_bytes + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
    except OSError as exc:
        raise SpecError(name, None, f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise SpecError(name, None, f"file is larger than {max_bytes} bytes; expected {expected}")
    return data


def int_option(option: str, value: int | None, minimum: int = 1, maximum: int = MAX_DEGREE) -> int | None:
    """An integer option in [minimum, maximum] (None: not given)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise SpecError(option, None, f"found {value!r}, expected an integer in [{minimum}, {maximum}]")
    return value


def _env_int(environ, name: str, maximum: int) -> int | None:
    """A positive integer environment variable; None when unset, empty or not such a number
    (COLUMNS=abc or COLUMNS=0 must not stop a verdict from printing: the default is used)."""
    text = (environ.get(name) or "").strip()
    if not text.isascii() or not text.isdigit():
        return None
    n = int(text)
    return n if 1 <= n <= maximum else None


def terminal_size(environ, fd: int) -> tuple[int, int]:
    """(columns, lines) for the console writing to file descriptor `fd`: COLUMNS / LINES when
    they are sane numbers, else the terminal's own size, else PIPE_COLUMNS for a pipe."""
    is_tty = _isatty(fd)
    cols, lines = _env_int(environ, "COLUMNS", MAX_COLUMNS), _env_int(environ, "LINES", MAX_COLUMNS)
    if is_tty and (cols is None or lines is None):
        try:
            size = os.get_terminal_size(fd)
            cols = cols or (size.columns if size.columns > 0 else None)
            lines = lines or (size.lines if size.lines > 0 else None)
        except OSError:
            pass
    return cols or (TTY_COLUMNS if is_tty else PIPE_COLUMNS), lines or TTY_LINES


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


DATA_DIR_VARIABLE = "PLANNER_DATA_DIR"


def data_dir(environ) -> Path | None:
    """$PLANNER_DATA_DIR: a user's own folder of specs, searched before the bundled ones so that
    it adds models, clusters and GPU profiles (or overrides one by name) without copying the
    rest. None when unset; empty means unset."""
    value = environ.get(DATA_DIR_VARIABLE) or ""
    return Path(value) if value else None


def check_data_dir(environ) -> Path | None:
    """data_dir, refusing in one line a value that is not a folder (a typo must not silently
    leave only the bundled specs)."""
    folder = data_dir(environ)
    if folder is not None and not folder.is_dir():
        what = "does not exist" if not os.path.lexists(folder) else "is not a folder"
        raise SpecError(DATA_DIR_VARIABLE, None, f"{printable(folder)} {what}; expected a folder holding any of "
                        "hardware_profiles/, model_specs/, examples/clusters/ or clusters/ (or unset it)")
    return folder
