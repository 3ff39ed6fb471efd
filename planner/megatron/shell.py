"""Read a launch script the way bash would, without running anything.

The subset is the one Megatron-LM's own example scripts are written in: quoting, backslash
continuations, comments, variables with `${VAR:-d}` / `${VAR:=d}` / `${VAR-d}` / `${VAR:+w}`,
bash arrays (`A=( ... )`, `A+=( ... )`, `"${A[@]}"`), `export` / `unset`, `$(( ))` arithmetic,
`if` / `case` / `for` blocks, `&&` / `||`, `source FILE`, here-documents (`sbatch <<EOF`),
`bash -c "..."`, and `#SBATCH` headers. The launch is the last command that runs a Python
training script, found through `srun`, `torchrun`, `python -m torch.distributed.run`, `uv run`,
`nsys profile`, `env`, ... prefixes.

Nothing is executed: `$(...)` and backticks stay text, and a value that depends on one, on a
script argument (`$1`) or on a variable nobody set is *unknown*: words carry the names they
depend on, so the reader can say which value is missing and how to give it (`--set NAME=VALUE`
or the environment). A condition that cannot be decided without running something takes its
default branch (`else`, or `*)` in a `case`), and every decision is reported in `notes`.
Branches that end the script (`exit`) are not taken: the checks a script makes before it
launches are assumed to pass.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecError
from .flags import Word

MAX_SOURCE_DEPTH = 8          # nested `source` / `bash -c` / here-documents followed
MAX_LOOP_ITERATIONS = 1000    # a `for` loop over more words than this is not run
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?=)(.*)", re.S)
_KEYWORDS = {"if", "then", "elif", "else", "fi", "case", "esac", "for", "while", "until", "do", "done",
             "in", "function", "{", "}", "!", "[[", "]]"}


class ShellSyntaxError(SpecError):
    pass


# ---- lexer ----------------------------------------------------------------------------------
# A word is a tuple of parts: ("lit", text, quoted) | ("var", name, op, arg_parts, quoted)
# | ("cmd", text, quoted) | ("arith", text, quoted). Tokens: ("word", parts, line),
# ("op", text, line), ("nl", "\n", line), ("array", [words], line) after NAME=( .


@dataclass
class _Tok:
    kind: str
    value: object
    line: int
    raw: str = ""            # the word as written (for messages and keywords)
    heredoc: str | None = None
    heredoc_expand: bool = True


class _Lexer:
    def __init__(self, text: str, source: str):
        self.s = text
        self.i = 0
        self.line = 1
        self.source = source
        self.pending_heredocs: list[tuple[_Tok, str, bool, bool]] = []

    def err(self, msg: str):
        raise ShellSyntaxError(self.source, f"line {self.line}", msg)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def tokens(self) -> list[_Tok]:
        out: list[_Tok] = []
        while self.i < len(self.s):
            c = self.peek()
            if c == "\\" and self.peek(1) == "\n":          # continuation
                self.i += 2
                self.line += 1
                continue
            if c in " \t\r":
                self.i += 1
                continue
            if c == "#":                                     # comment to end of line
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
                continue
            if c == "\n":
                self.i += 1
                out.append(_Tok("nl", "\n", self.line))
                self._read_heredocs()
                self.line += 1
                continue
            op = next((o for o in (";;", "&&", "||", "2>&1", ">>", "<<-", "<<<", "<<", ">&", "&>", ";", "|", "&",
                                   "(", ")", "<", ">") if self.s.startswith(o, self.i)), None)
            if op == "(" and out and out[-1].kind == "word" and self.i > 0 and self.s[self.i - 1] == "=" \
                    and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\+?=", out[-1].raw):
                # NAME=( words ) / NAME+=( words ): a bash array
                self.i += 1
                arr_tok = out.pop()
                out.append(_Tok("array", self._array_words(), arr_tok.line, raw=arr_tok.raw))
                continue
            if op in ("<<", "<<-"):
                self.i += len(op)
                while self.peek() and self.peek() in " \t":
                    self.i += 1
                delim_parts = self._word()
                if not delim_parts:
                    self.err(f"{op} without a here-document delimiter")
                quoted = any(p[0] == "lit" and p[2] for p in delim_parts)
                delim = "".join(p[1] for p in delim_parts if p[0] == "lit")
                tok = _Tok("op", op, self.line, raw=op)
                out.append(tok)
                self.pending_heredocs.append((tok, delim, not quoted, op == "<<-"))
                continue
            if op:
                self.i += len(op)
                out.append(_Tok("op", op, self.line, raw=op))
                continue
            start = self.i
            line = self.line
            parts = self._word()
            out.append(_Tok("word", tuple(parts), line, raw=self.s[start:self.i]))
        if self.pending_heredocs:
            self._read_heredocs()
        return out

    def _read_heredocs(self):
        for tok, delim, expand, strip in self.pending_heredocs:
            lines = []
            while self.i < len(self.s):
                j = self.s.find("\n", self.i)
                j = len(self.s) if j < 0 else j
                ln = self.s[self.i:j]
                self.i = min(j + 1, len(self.s))
                self.line += 1
                check = ln.lstrip("\t") if strip else ln
                if check == delim:
                    break
                lines.append(check if strip else ln)
            tok.heredoc = "\n".join(lines) + "\n"
            tok.heredoc_expand = expand
        self.pending_heredocs = []

    def _array_words(self) -> list[tuple]:
        """Words of NAME=( ... ) up to the closing parenthesis; comments and newlines allowed."""
        words = []
        while True:
            if self.i >= len(self.s):
                self.err("array not closed with ')'")
            c = self.peek()
            if c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c in " \t\r":
                self.i += 1
            elif c == "\n":
                self.i += 1
                self.line += 1
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            elif c == ")":
                self.i += 1
                return words
            else:
                start = self.i
                parts = self._word()
                if self.i == start:
                    self.err(f"unexpected {c!r} in an array")
                words.append((tuple(parts), self.s[start:self.i], self.line))

    def _word(self, stop: str = "") -> list[tuple]:
        """Parts of one word, up to an unquoted blank or operator (or `stop`)."""
        parts: list[tuple] = []
        buf: list[str] = []

        def flush():
            if buf:
                parts.append(("lit", "".join(buf), False))
                buf.clear()
        while self.i < len(self.s):
            c = self.peek()
            if stop and c in stop:
                break
            if not stop and c in " \t\r\n;|&<>()":
                break
            if c == "\\":
                nxt = self.peek(1)
                if nxt == "\n":
                    self.i += 2
                    self.line += 1
                    continue
                flush()
                parts.append(("lit", nxt, True))
                self.i += 2
                continue
            if c == "'":
                flush()
                j = self.s.find("'", self.i + 1)
                if j < 0:
                    self.err("unclosed single quote")
                text = self.s[self.i + 1:j]
                self.line += text.count("\n")
                parts.append(("lit", text, True))
                self.i = j + 1
                continue
            if c == '"':
                flush()
                self.i += 1
                parts.extend(self._double_quoted())
                continue
            if c == "$":
                flush()
                parts.append(self._dollar(quoted=False))
                continue
            if c == "`":
                flush()
                parts.append(("cmd", self._backtick(), False))
                continue
            buf.append(c)
            self.i += 1
        flush()
        return parts

    def _double_quoted(self) -> list[tuple]:
        parts: list[tuple] = []
        buf: list[str] = []

        def flush():
            if buf:
                parts.append(("lit", "".join(buf), True))
                buf.clear()
        while True:
            if self.i >= len(self.s):
                self.err("unclosed double quote")
            c = self.peek()
            if c == '"':
                self.i += 1
                flush()
                if not parts:
                    parts.append(("lit", "", True))
                return parts
            if c == "\\":
                nxt = self.peek(1)
                if nxt == "\n":
                    self.i += 2
                    self.line += 1
                    continue
                if nxt in '$`"\\':
                    buf.append(nxt)
                    self.i += 2
                    continue
                buf.append(c)
                self.i += 1
                continue
            if c == "$":
                flush()
                parts.append(self._dollar(quoted=True))
                continue
            if c == "`":
                flush()
                parts.append(("cmd", self._backtick(), True))
                continue
            if c == "\n":
                self.line += 1
            buf.append(c)
            self.i += 1

    def _backtick(self) -> str:
        j = self.i + 1
        while j < len(self.s) and self.s[j] != "`":
            j += 2 if self.s[j] == "\\" else 1
        if j >= len(self.s):
            self.err("unclosed backtick")
        text = self.s[self.i:j + 1]
        self.line += text.count("\n")
        self.i = j + 1
        return text

    def _balanced(self, open_: str, close: str) -> str:
        """Text from the current position to the matching close (quotes respected)."""
        depth, j = 0, self.i
        while j < len(self.s):
            c = self.s[j]
            if c == "\\":
                j += 2
                continue
            if c == "'" and open_ != "{":
                k = self.s.find("'", j + 1)
                j = (k if k >= 0 else len(self.s)) + 1
                continue
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    text = self.s[self.i:j + 1]
                    self.line += text.count("\n")
                    self.i = j + 1
                    return text
            j += 1
        self.err(f"unclosed {open_}")
        return ""

    def _dollar(self, quoted: bool) -> tuple:
        nxt = self.peek(1)
        if nxt == "(" and self.peek(2) == "(":
            self.i += 1
            text = self._balanced("(", ")")
            return ("arith", text[2:-2], quoted)
        if nxt == "(":
            self.i += 1
            return ("cmd", "$" + self._balanced("(", ")"), quoted)
        if nxt == "{":
            self.i += 2
            m = re.match(r"#?([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!])(\[[^\]]*\])?", self.s[self.i:])
            if not m:
                self.err("bad ${...} expansion")
            length = self.s[self.i] == "#" and m.group(1) not in "#" and m.end() > 1
            name = m.group(1) + (m.group(2) or "")
            self.i += m.end()
            op, arg = "", ()
            rest = self.s[self.i:]
            opm = re.match(r":-|:=|:\+|:\?|-|=|\+|\?", rest)
            if self.peek() == "}":
                pass
            elif opm:
                op = opm.group()
                self.i += len(op)
                arg = tuple(self._brace_arg())
            else:
                # ${x/a/b}, ${x%.*}, ...: not modelled; the whole expansion stays unknown text
                start = self.i
                depth = 1
                while self.i < len(self.s) and depth:
                    if self.s[self.i] == "{":
                        depth += 1
                    elif self.s[self.i] == "}":
                        depth -= 1
                    self.i += 1
                return ("cmd", "${" + name + self.s[start:self.i], quoted)
            if self.peek() != "}":
                self.err("${...} not closed with '}'")
            self.i += 1
            return ("var", name, "#" if length else op, arg, quoted)
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]|[@*#?$!]", self.s[self.i + 1:])
        if not m:
            self.i += 1
            return ("lit", "$", quoted)
        self.i += 1 + m.end()
        return ("var", m.group(), "", (), quoted)

    def _brace_arg(self) -> list[tuple]:
        """The word after :- / := / :+ inside ${...}: quotes and expansions, up to '}'."""
        parts: list[tuple] = []
        while self.i < len(self.s) and self.peek() != "}":
            c = self.peek()
            if c == '"':
                self.i += 1
                parts.extend(self._double_quoted())
            elif c == "'":
                j = self.s.find("'", self.i + 1)
                if j < 0:
                    self.err("unclosed single quote")
                parts.append(("lit", self.s[self.i + 1:j], True))
                self.i = j + 1
            elif c == "$":
                parts.append(self._dollar(quoted=False))
            elif c == "\\":
                parts.append(("lit", self.peek(1), True))
                self.i += 2
            else:
                j = self.i
                while j < len(self.s) and self.s[j] not in '}"\'$\\':
                    j += 1
                parts.append(("lit", self.s[self.i:j], False))
                self.i = j
        return parts


# ---- values ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Unknown:
    """A value that cannot be known without running something."""
    name: str          # the variable, or the command text
    why: str           # 'unset' (nobody set it: empty in a test) | 'argument' ($1 ...) | 'command'
    text: str          # how it was written


@dataclass(frozen=True)
class Partial:
    """A string some of whose pieces are unknown: segments of str and Unknown."""
    segments: tuple

    @property
    def unknowns(self) -> tuple[Unknown, ...]:
        return tuple(x for x in self.segments if isinstance(x, Unknown))

    @property
    def text(self) -> str:
        return "".join(x.text if isinstance(x, Unknown) else x for x in self.segments)


@dataclass
class _Piece:
    text: str
    split: bool                       # unquoted expansion: split on blanks
    unknown: tuple[Unknown, ...] = ()


def _pieces_to_value(pieces: list[_Piece]):
    """Pieces of one field -> str, or Partial when some are unknown."""
    if not any(p.unknown for p in pieces):
        return "".join(p.text for p in pieces)
    segs: list = []
    for p in pieces:
        if p.unknown:
            segs.append(p.unknown[0])
        elif p.text:
            if segs and isinstance(segs[-1], str):
                segs[-1] += p.text
            else:
                segs.append(p.text)
    return Partial(tuple(segs))


# ---- interpreter ----------------------------------------------------------------------------

@dataclass
class Wrapper:
    """A program in front of the training script (srun, torchrun, ...) and its options."""
    program: str
    words: list[Word]


@dataclass
class Command:
    words: list[Word]
    env: dict                    # NAME=value prefixes of this command
    line: int
    wrappers: list[Wrapper] = field(default_factory=list)   # outer srun / bash -c levels
    source: str = ""


@dataclass
class ShellResult:
    commands: list[Command]
    variables: dict                      # name -> str | list[str] | Unknown
    exported: dict                       # name -> value (None: unset) the script exports/unsets
    sbatch: dict                         # option -> value of the #SBATCH headers
    notes: list[str]
    stopped_at: int | None = None        # line of a top-level `exit`


class _Stop(Exception):
    pass


_SRUN_VALUED = set("""-A --account -c --cpus-per-task -D --chdir -e --error -i --input -J --job-name -N --nodes
-n --ntasks -o --output -p --partition -t --time -w --nodelist -x --exclude --container-image --container-mounts
--container-workdir --container-name --container-env --export --mpi --ntasks-per-node --gpus-per-node --gpus -G
--gres --mem --mem-per-cpu --mem-per-gpu --cpus-per-gpu --gpus-per-task --ntasks-per-gpu --cpu-bind --distribution
-m --network --reservation --qos -q --constraint -C --dependency -d --comment --nodefile -F --het-group
--accel-bind --switches --wait -W --signal --open-mode --kill-on-bad-exit""".split())
_SBATCH_VALUED = _SRUN_VALUED | {"--array", "-a", "--begin", "-b", "--mail-type", "--mail-user"}
# the script's own folder, as scripts find it to source their neighbours (quotes aside):
# SCRIPT_DIR="$(dirname "$(readlink -f "$0")")" in Megatron-LM's examples/post_training/modelopt
_SCRIPT_DIR_IDIOMS = {"$(dirname $0)", "$(dirname $(readlink -f $0))", "$(dirname $(realpath $0))",
                      "$(cd $(dirname $0) && pwd)", "$(cd $(dirname $(readlink -f $0)) && pwd)"}


def _is_script_dir(command: str) -> bool:
    """A command substitution that prints the folder of the script ($0): known without running
    it, as the folder the script was read from."""
    text = re.sub(r"\s+", " ", command.replace('"', "").replace("${0}", "$0")).strip()
    if text.startswith("`") and text.endswith("`"):
        text = "$(" + text[1:-1] + ")"
    return text in _SCRIPT_DIR_IDIOMS


def sbatch_options(words: list[str]) -> dict:
    """--nodes=2 / -N 2 / --ntasks-per-node 8 / --gpus-per-node=8 / --gres=gpu:8 -> dict."""
    out: dict = {}
    i = 0
    alias = {"-N": "--nodes", "-n": "--ntasks", "-G": "--gpus", "-p": "--partition", "-A": "--account"}
    while i < len(words):
        w = words[i]
        i += 1
        if not w.startswith("-"):
            continue
        key, eq, val = w.partition("=")
        if not eq and key in _SBATCH_VALUED and i < len(words):
            val = words[i]
            i += 1
        elif not eq and len(key) > 2 and key[1] != "-" and key[:2] in alias:   # -N2
            key, val = key[:2], key[2:]
        out[alias.get(key, key)] = val
    return out


class Interpreter:
    def __init__(self, source: str, env: dict, base_dir: Path | None, depth: int = 0, wrappers=None,
                 args: list[str] | None = None, pins: dict | None = None):
        self.source = source
        self.pins = dict(pins or {})     # --set NAME=VALUE: also replaces values the script cannot know
        self.env = env                   # the environment the script starts with
        self.vars: dict = {}
        self.exported: dict = {}
        self.functions: dict = {}
        self.commands: list[Command] = []
        self.notes: list[str] = []
        self.sbatch: dict = {}
        self.base_dir = base_dir
        self.depth = depth
        self.wrappers = list(wrappers or [])
        self.args = list(args or [])     # positional parameters ($1 ...), from --set 1=...
        self.stopped_at: int | None = None

    # ---- variables
    def lookup(self, name: str):
        if name in self.vars:
            return self.vars[name]
        if name in self.env:
            return self.env[name]
        if name.isdigit():
            k = int(name)
            if k == 0:
                return self.source
            if k <= len(self.args):
                return self.args[k - 1]
            return Unknown(f"${name}", "argument", f"${name}")
        if name == "#":
            return str(len(self.args))
        if name in ("@", "*"):
            return list(self.args) if self.args else Unknown("$@", "argument", "$@")
        if name == "BASH_SOURCE":
            return [self.source]
        return None

    def note(self, line: int, msg: str):
        self.notes.append(f"line {line}: {msg}" if line else msg)

    # ---- expansion
    def _var_value(self, part: tuple, line: int):
        """-> None (unset) | str | list | Partial."""
        _, name, op, arg, quoted = part
        base, _, index = name.partition("[")
        index = index.rstrip("]")
        val = self.lookup(base)
        if isinstance(val, Unknown):
            val = Partial((val,))
        if index and not isinstance(val, Partial):
            lst = val if isinstance(val, list) else ([] if val is None else [val])
            if index in ("@", "*"):
                val = lst
            elif index.isdigit():
                val = lst[int(index)] if int(index) < len(lst) else None
            else:
                return Partial((Unknown(name, "command", "${" + name + "}"),))
        elif isinstance(val, list) and not index and base not in ("@", "*"):
            val = val[0] if val else ""          # $ARR is ${ARR[0]}
        if op == "#":
            if isinstance(val, Partial):
                return val
            return str(len(val) if isinstance(val, list) else len(val or ""))
        is_unset = val is None
        is_null = is_unset or val == "" or val == []
        arg_unknown = isinstance(val, Partial) and all(u.why == "argument" for u in val.unknowns)
        if op in (":-", "-", ":=", "=", ":?", "?"):
            use_default = (is_null if op.startswith(":") else is_unset) or arg_unknown   # run without that argument
            if not use_default:
                return val
            if op in (":?", "?"):
                return Partial((Unknown(base, "unset", "${" + name + op + "}"),))
            d = self._as_value(self.expand_parts_pieces(arg, line, assign=True))
            if op in (":=", "="):
                self.vars[base] = d
            return d
        if op in (":+", "+"):
            if isinstance(val, Partial):
                return val
            present = not (is_null if op == ":+" else is_unset)
            return self._as_value(self.expand_parts_pieces(arg, line, assign=True)) if present else ""
        if is_unset:
            plain = not index and _NAME.fullmatch(name)
            return Partial((Unknown(base, "unset", "$" + (name if plain else "{" + name + "}")),))
        return val

    @staticmethod
    def _as_value(fields: list[list[_Piece]]):
        """Fields of an unsplit expansion -> one value."""
        pieces = [p for f in fields for p in f]
        return _pieces_to_value(pieces)

    def expand_parts(self, parts, line: int, assign: bool = False) -> list[Word]:
        out = []
        for f in self.expand_parts_pieces(parts, line, assign):
            names = tuple(dict.fromkeys(u.name for p in f for u in p.unknown))
            out.append(Word("".join(p.text for p in f), names, line))
        return out

    def expand_parts_pieces(self, parts, line: int, assign: bool = False) -> list[list[_Piece]]:
        """A word's parts -> fields (bash: parameter expansion, then field splitting of the
        unquoted expansions). `assign`: no splitting (right side of NAME=value)."""
        fields: list[list[_Piece]] = [[]]
        quoted_seen = False

        def add_value(val, quoted):
            split = not quoted and not assign
            if isinstance(val, Partial):
                for seg in val.segments:
                    if isinstance(seg, Unknown):
                        fields[-1].append(_Piece(seg.text, False, (seg,)))
                    else:
                        fields[-1].append(_Piece(seg, split))
            else:
                fields[-1].append(_Piece(val, split))
        for part in parts:
            kind = part[0]
            quoted = part[-1]
            if kind == "lit":
                fields[-1].append(_Piece(part[1], False))
                quoted_seen = quoted_seen or quoted
                continue
            if kind == "cmd" and self.base_dir is not None and _is_script_dir(part[1]):
                fields[-1].append(_Piece(str(self.base_dir), not quoted and not assign))
                msg = f"line {line}: {part[1]}: the script's folder, {self.base_dir}"
                if msg not in self.notes:
                    self.notes.append(msg)
                continue
            if kind == "cmd":
                fields[-1].append(_Piece(part[1], False, (Unknown(part[1], "command", part[1]),)))
                continue
            if kind == "arith":
                v = self.arith(part[1], line)
                if isinstance(v, Unknown):
                    fields[-1].append(_Piece("$((" + part[1] + "))", False, (v,)))
                else:
                    fields[-1].append(_Piece(str(v), not quoted and not assign))
                continue
            val = self._var_value(part, line)
            if val is None:
                val = ""
            if isinstance(val, list):
                if quoted and not part[1].endswith("[*]") and not assign:
                    # "${A[@]}": one field per element
                    quoted_seen = quoted_seen or bool(val)
                    for k, el in enumerate(val):
                        if k > 0:
                            fields.append([])
                        add_value(el, True)
                    continue
                segs: list = []
                for k, el in enumerate(val):
                    if k:
                        segs.append(" ")
                    segs.extend(el.segments if isinstance(el, Partial) else [el])
                val = _pieces_to_value([_Piece(x, False) if isinstance(x, str) else _Piece(x.text, False, (x,)) for x in segs])
            if quoted:
                quoted_seen = True
            add_value(val, quoted)
        out: list[list[_Piece]] = []
        for f in fields:
            out.extend(self._split(f, quoted_seen, assign))
        return out

    @staticmethod
    def _split(pieces: list[_Piece], keep_empty: bool, assign: bool) -> list[list[_Piece]]:
        """Field splitting: unquoted expansion text splits on blanks; the rest joins."""
        words: list[list[_Piece]] = [[]]
        for p in pieces:
            if p.split and not assign:
                chunks = re.split(r"[ \t\n]+", p.text)
                for k, ch in enumerate(chunks):
                    if k > 0 and words[-1]:
                        words.append([])
                    if ch:
                        words[-1].append(_Piece(ch, False))
            else:
                words[-1].append(p)
        out = [w for w in words if any(p.text or p.unknown for p in w)]
        if not out and keep_empty:
            out = [[_Piece("", False)]]
        return out

    def scalar(self, parts, line: int):
        """The value of an assignment's right side: str, or Partial."""
        return self._as_value(self.expand_parts_pieces(parts, line, assign=True))

    def arith(self, text: str, line: int):
        """$(( )) over integers: + - * / % and parentheses, variables by name."""
        names_unknown = []

        def sub(m):
            name = m.group(1) or m.group(2) or m.group(3)
            v = self.lookup(name)
            if isinstance(v, list):
                v = v[0] if v else ""
            if isinstance(v, Unknown):
                v = Partial((v,))
            if isinstance(v, Partial) or v is None:
                names_unknown.append(v.unknowns[0] if v is not None else Unknown(name, "unset", "$" + name))
                return "0"
            v = v.strip()
            if not re.fullmatch(r"-?\d+", v or "0"):
                names_unknown.append(Unknown(name, "command", f"{name}={v!r}"))
                return "0"
            return v or "0"
        expr = re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)|\b([A-Za-z_]\w*)\b", sub, text)
        if names_unknown:
            return names_unknown[0]
        if not re.fullmatch(r"[0-9+\-*/%() \t]*", expr):
            return Unknown("$((" + text + "))", "command", "$((" + text + "))")
        if not expr.strip():
            return 0
        v = _arith_eval(expr.replace("/", "//").strip())
        return Unknown("$((" + text + "))", "command", "$((" + text + "))") if v is None else v

    # ---- running
    def run_text(self, text: str, line0: int = 0):
        toks = _Lexer(text, self.source).tokens()
        for t in toks:
            t.line += line0
        parser = _Parser(toks, self.source)
        prog = parser.program()
        if self.depth == 0:
            self._sbatch_headers(text)
        try:
            self.run_list(prog)
        except _Stop:
            pass

    def _sbatch_headers(self, text: str):
        """#SBATCH lines before the first command (where sbatch reads them)."""
        for ln in text.splitlines():
            s = ln.strip()
            if not s or (s.startswith("#") and not s.startswith("#SBATCH")):
                continue
            if not s.startswith("#SBATCH"):
                break
            self.sbatch.update(sbatch_options(s[len("#SBATCH"):].split()))
        slurm = {"--nodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"), "--ntasks-per-node": ("SLURM_NTASKS_PER_NODE",),
                 "--ntasks": ("SLURM_NTASKS",), "--gpus-per-node": ("SLURM_GPUS_PER_NODE",)}
        for opt, names in slurm.items():
            if opt in self.sbatch:
                for n in names:
                    if n not in self.env:
                        self.vars[n] = self.sbatch[opt]

    def run_list(self, nodes):
        for node in nodes:
            self.run(node)

    def run(self, node):
        kind = node[0]
        if kind == "simple":
            self.run_simple(node)
        elif kind == "andor":
            self.run_andor(node)
        elif kind == "pipe":
            for n in node[1]:
                self.run(n)
        elif kind == "if":
            self.run_if(node)
        elif kind == "case":
            self.run_case(node)
        elif kind == "for":
            self.run_for(node)
        elif kind == "while":
            self.run_while(node)
        elif kind == "group":
            self.run_list(node[1])
        elif kind == "subshell":
            saved = (dict(self.vars), dict(self.exported))
            try:
                self.run_list(node[1])
            finally:
                self.vars, self.exported = saved
        elif kind == "function":
            self.functions[node[1]] = node[2]
        elif kind == "test":
            pass

    def run_andor(self, node):
        _, first, rest = node
        ok = self.status_of(first)
        self.run(first)
        for op, n in rest:
            if op == "&&" and ok is False or op == "||" and ok is not False:
                if op == "||" and ok is None:
                    self.note(_line_of(n), f"`{_text_of(first)} || ...`: the test cannot be decided without running it; "
                              "took the default (the part after || is not run)")
                continue
            ok = self.status_of(n)
            self.run(n)

    def status_of(self, node):
        """True/False for a test whose value is known, None when it cannot be decided; other
        commands are assumed to succeed (True)."""
        if node[0] == "simple" and node[3] and node[3][0][0] == "word" and _raw(node[3][0]) in ("[", "[[", "test", "!"):
            return self.eval_test(node)
        return True

    def run_if(self, node):
        _, clauses, else_body, line = node
        for cond, body in clauses:
            v = self.eval_condition(cond)
            ctext = " ".join(_text_of(c) for c in cond)
            if v is None:
                self.note(line, f"`if {ctext}` cannot be decided without running it; took the "
                          + ("else branch" if else_body is not None else "default (no branch)"))
                if else_body is not None:
                    self._take(else_body, line, "else branch")
                return
            if v:
                if _exits(body):
                    self.note(line, f"`if {ctext}` is true here and its branch ends the script; assumed the "
                              "check passes (branch not taken)")
                    return
                self.note(line, f"`if {ctext}`: true, took that branch")
                self._take(body, line, "branch")
                return
        if else_body is not None:
            if _exits(else_body):
                self.note(line, "the else branch ends the script; assumed not taken")
                return
            self.run_list(else_body)

    def _take(self, body, line, what):
        if _exits(body):
            self.note(line, f"the {what} ends the script; not taken")
            return
        self.run_list(body)

    def eval_condition(self, cond_nodes):
        v = True
        for n in cond_nodes:
            v = self.status_of(n) if n[0] != "andor" else self.eval_andor(n)
        return v

    def eval_andor(self, node):
        _, first, rest = node
        v = self.status_of(first) if first[0] != "andor" else self.eval_andor(first)
        for op, n in rest:
            w = self.status_of(n)
            if op == "&&":
                v = False if (v is False or w is False) else (None if (v is None or w is None) else True)
            else:
                v = True if (v is True or w is True) else (None if (v is None or w is None) else False)
        return v

    def test_value(self, w):
        """A test operand: its text, '' for a variable nobody set (or a script argument not
        given), None when it depends on a command."""
        fields = self.expand_parts_pieces(w[1], w[2], assign=True)
        unk = [u for f in fields for p in f for u in p.unknown]
        if any(u.why == "command" for u in unk):
            return None
        return "".join(p.text for f in fields for p in f if not p.unknown)

    def eval_test(self, node):
        vals = []
        for w in node[3]:
            if w[0] != "word":
                return None
            raw = w[3]
            if raw in ("[", "]", "[[", "]]", "test", "!", "&&", "||", "-a", "-o", "(", ")", "==", "=", "!=") \
                    or re.fullmatch(r"-[a-zA-Z]+", raw):
                vals.append(("op", raw))
                continue
            text = self.test_value(w)
            if text is None:
                return None
            vals.append(("val", text))
        return _test(vals)

    def run_case(self, node):
        _, word, items, line = node
        value = self.test_value(word)
        for pats, body in items:
            hit = False
            for p in pats:
                pv = self.test_value(p)
                if pv is not None and value is not None and fnmatch.fnmatchcase(value, pv):
                    hit = True
                if value is None and pv == "*":
                    hit = True
            if hit:
                if _exits(body):
                    self.note(line, f"`case {word[3]}`: the matching branch ({value!r}) ends the script; not taken")
                    return
                if value is None:
                    self.note(line, f"`case {word[3]}` cannot be decided without running it; took the default branch *)")
                else:
                    self.note(line, f"`case {word[3]}` is {value!r}: took that branch")
                self.run_list(body)
                return
        if value is None:
            self.note(line, f"`case {word[3]}` cannot be decided without running it and has no *) branch")

    def run_for(self, node):
        _, name, words, body, line = node
        items: list[str] = []
        for w in words:
            for x in self.expand_parts(w[1], w[2]):
                if x.unknown:
                    self.note(line, f"`for {name} in ...` over words that cannot be known ({', '.join(x.unknown)}); loop not run")
                    return
                items.append(x.text)
        if len(items) > MAX_LOOP_ITERATIONS:
            self.note(line, f"`for {name}` over {len(items)} words; loop not run")
            return
        for it in items:
            self.vars[name] = it
            self.run_list(body)

    def run_while(self, node):
        _, until, cond, body, line = node
        v = self.eval_condition(cond)
        if v is not None and (v is False) != until:
            return   # runs zero times (e.g. `while [[ $# -gt 0 ]]` with no arguments)
        self.note(line, "loop not run (a loop whose condition holds would need the script to run)")

    def run_simple(self, node):
        _, assigns, redirects, words, line = node
        heredoc = next((r for r in redirects if r.heredoc is not None), None)
        if not words:
            for a in assigns:
                self.assign(a, line)
            return
        head = _raw(words[0]) if words[0][0] == "word" else ""
        if head in ("export", "declare", "typeset", "local", "readonly"):
            self.run_declare(head, words[1:], line)
            return
        if head == "unset":
            for w in words[1:]:
                n = _raw(w)
                if _NAME.fullmatch(n):
                    self.vars.pop(n, None)
                    self.env.pop(n, None) if n in self.env else None
                    self.exported[n] = None
            return
        if head in ("exit", "return") and self.depth == 0:
            self.stopped_at = line
            raise _Stop()
        if head in self.functions and self.depth < MAX_SOURCE_DEPTH:
            self.depth += 1
            try:
                self.run_list(self.functions[head])
            finally:
                self.depth -= 1
            return
        prefix_env = {}
        for a in assigns:
            name, op, value = self._assign_value(a, line)
            prefix_env[name] = value
        expanded: list[Word] = []
        for w in words:
            if w[0] == "array":
                continue
            expanded.extend(self.expand_parts(w[1], w[2]))
        if not expanded:
            return
        prog = expanded[0].text
        if prog in ("source", ".") and len(expanded) > 1:
            self.run_source(expanded[1], line)
            return
        cmd = Command(expanded, prefix_env, line, list(self.wrappers), self.source)
        self.commands.append(cmd)
        self.follow_nested(cmd, heredoc)

    def follow_nested(self, cmd: Command, heredoc):
        """bash -c STRING and here-documents fed to a shell or sbatch are scripts too."""
        if self.depth >= MAX_SOURCE_DEPTH:
            return
        words = cmd.words
        names = [os.path.basename(w.text) for w in words]
        if heredoc is not None and names and names[0] in ("sbatch", "bash", "sh", "srun"):
            body = heredoc.heredoc
            if heredoc.heredoc_expand:
                body = self.expand_heredoc(body, cmd.line)
            child = self.child(wrappers=self.wrappers + ([Wrapper("sbatch", words)] if names[0] == "sbatch" else []))
            child._sbatch_headers(body)
            if names[0] == "sbatch":
                child.sbatch.update(sbatch_options([w.text for w in words[1:]]))
                child._slurm_vars_from(child.sbatch)
            child.run_text(body, cmd.line)
            self.absorb(child)
            return
        # a shell given a string: srun ... bash -x -c "..."
        for k, n in enumerate(names):
            if n in ("bash", "sh", "zsh") and "-c" in [w.text for w in words[k + 1:]]:
                j = k + 1 + [w.text for w in words[k + 1:]].index("-c")
                if j + 1 < len(words):
                    s = words[j + 1]
                    if s.unknown and not s.text.strip():
                        return
                    outer = [Wrapper(os.path.basename(words[0].text), words[:k])] if k else []
                    child = self.child(wrappers=self.wrappers + outer)
                    child.run_text(s.text, cmd.line)
                    self.absorb(child)
                    cmd.words = []          # the launch, if any, is inside
                return

    def child(self, wrappers):
        env = dict(self.env)
        for k, v in self.exported.items():
            if v is None:
                env.pop(k, None)
            elif isinstance(v, str):
                env[k] = v
        return Interpreter(self.source, env, self.base_dir, self.depth + 1, wrappers, self.args, self.pins)

    def absorb(self, child: "Interpreter"):
        self.commands.extend(child.commands)
        self.notes.extend(child.notes)
        for k, v in child.sbatch.items():
            self.sbatch.setdefault(k, v)
        for k, v in child.exported.items():
            self.exported.setdefault(k, v)

    def _slurm_vars_from(self, opts: dict):
        for opt, names in {"--nodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"), "--ntasks-per-node": ("SLURM_NTASKS_PER_NODE",),
                           "--ntasks": ("SLURM_NTASKS",), "--gpus-per-node": ("SLURM_GPUS_PER_NODE",)}.items():
            if opt in opts:
                for n in names:
                    self.vars[n] = opts[opt]

    def expand_heredoc(self, body: str, line: int) -> str:
        """An unquoted here-document: $VAR, ${...} and $(( )) expanded as in double quotes;
        what cannot be known stays as written."""
        lx = _Lexer(body, self.source)
        out = []
        buf = []
        while lx.i < len(lx.s):
            c = lx.peek()
            if c == "\\" and lx.peek(1) in "$`\\":
                buf.append(lx.peek(1))
                lx.i += 2
                continue
            if c == "\\" and lx.peek(1) == "\n":
                lx.i += 2
                continue
            if c == "$":
                start = lx.i
                part = lx._dollar(quoted=True)
                if part[0] == "lit":
                    buf.append("$")
                    continue
                # what cannot be known stays as written (an Unknown's text), for the script
                # that reads the document to find unknown again
                buf.append("".join(w.text for w in self.expand_parts([part], line, assign=True)))
                del start
                continue
            buf.append(c)
            lx.i += 1
        out.append("".join(buf))
        return "".join(out)

    def run_source(self, path: Word, line: int):
        if path.unknown:
            self.note(line, f"`source {path.text}`: the path cannot be known without running it; not read")
            return
        p = Path(path.text)
        cands = [p] if p.is_absolute() else [x for x in ((self.base_dir / p) if self.base_dir else None, p) if x]
        f = next((c for c in cands if c.is_file()), None)
        if f is None:
            self.note(line, f"`source {path.text}`: no such file here; not read")
            return
        if self.depth >= MAX_SOURCE_DEPTH:
            self.note(line, f"`source {path.text}`: nested too deep; not read")
            return
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.note(line, f"`source {path.text}`: cannot read ({exc}); not read")
            return
        self.depth += 1
        saved = self.source
        try:
            toks = _Lexer(text, str(f)).tokens()
            self.source = str(f)
            self.run_list(_Parser(toks, str(f)).program())
        finally:
            self.source = saved
            self.depth -= 1
        self.note(line, f"read `source {path.text}`")

    def run_declare(self, head: str, words, line: int):
        export = head == "export" or any(_raw(w) in ("-x", "-gx") for w in words if w[0] == "word")
        for w in words:
            if w[0] == "array":
                self.assign(w, line, export)
                continue
            raw = _raw(w)
            if raw.startswith("-"):
                continue
            m = _ASSIGN.fullmatch(raw)
            if m:
                self.assign(("assign", w), line, export)
            elif _NAME.fullmatch(raw) and export:
                v = self.lookup(raw)
                self.exported[raw] = "" if v is None else v

    def _assign_value(self, a, line: int):
        """(name, op, value) of NAME=word / NAME+=word / NAME=( words )."""
        if a[0] == "array":
            tok = a
            name, op = _ASSIGN.fullmatch(tok[2]).group(1, 2)
            vals = []
            for parts, raw, ln in tok[1]:
                for f in self.expand_parts_pieces(parts, ln):
                    vals.append(_pieces_to_value(f))
            return name, op, vals
        w = a[1]
        raw = _raw(w)
        m = _ASSIGN.fullmatch(raw)
        name, op = m.group(1), m.group(2)
        parts = _strip_assign_prefix(w[1], len(name) + len(op))
        return name, op, self.scalar(parts, line)

    def assign(self, a, line: int, export: bool = False):
        name, op, value = self._assign_value(a, line)
        if name in self.pins and (isinstance(value, Partial) or
                                  isinstance(value, list) and any(isinstance(x, Partial) for x in value)):
            self.note(line, f"{name}: the script's value cannot be known; used --set {name}={self.pins[name]}")
            value, op = self.pins[name], "="
        if op == "+=":
            old = self.lookup(name)
            if isinstance(value, list):
                base = old if isinstance(old, list) else ([] if old in (None, "") else [old])
                value = base + value
            elif isinstance(old, (str, Partial)) and isinstance(value, (str, Partial)):
                value = _concat(old, value)
        self.vars[name] = value
        if export or name in self.exported:
            self.exported[name] = value


def _concat(a, b):
    segs = [x for v in (a, b) for x in (v.segments if isinstance(v, Partial) else (v,))]
    return Partial(tuple(segs)) if any(isinstance(x, Unknown) for x in segs) else "".join(segs)


def _strip_assign_prefix(parts, n: int):
    """The parts of NAME=value after the first n characters (the 'NAME=')."""
    out = []
    for p in parts:
        if n <= 0:
            out.append(p)
            continue
        if p[0] != "lit":
            out.append(p)
            n = 0
            continue
        if len(p[1]) <= n:
            n -= len(p[1])
            continue
        out.append(("lit", p[1][n:], p[2]))
        n = 0
    return tuple(out) or (("lit", "", True),)


def _arith_eval(expr: str) -> int | None:
    """Integer arithmetic over + - * // % and parentheses; None if it is not that (or divides
    by zero)."""
    import ast
    import operator as op
    ops = {ast.Add: op.add, ast.Sub: op.sub, ast.Mult: op.mul, ast.FloorDiv: op.floordiv, ast.Mod: op.mod}

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            return -ev(n.operand) if isinstance(n.op, ast.USub) else ev(n.operand)
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            b = ev(n.right)
            if isinstance(n.op, (ast.FloorDiv, ast.Mod)) and b == 0:
                raise ZeroDivisionError
            return ops[type(n.op)](ev(n.left), b)
        raise ValueError
    try:
        return ev(ast.parse(expr, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, OverflowError):
        return None


def _test(vals):
    """[ ... ] / [[ ... ]] over known strings: -z -n = == != -eq -ne -lt -le -gt -ge, !, &&, ||.
    File tests (-f -d -e ...) cannot be known: None."""
    items = [v for v in vals if v not in (("op", "["), ("op", "]"), ("op", "[["), ("op", "]]"), ("op", "test"))]

    def one(seq):
        neg = False
        while seq and seq[0] == ("op", "!"):
            neg = not neg
            seq = seq[1:]
        r = _primary(seq)
        return None if r is None else (not r if neg else r)
    # split on && / || (-a / -o) left to right
    groups, ops, cur = [], [], []
    for v in items:
        if v in (("op", "&&"), ("op", "-a"), ("op", "||"), ("op", "-o")):
            groups.append(cur)
            ops.append("&&" if v[1] in ("&&", "-a") else "||")
            cur = []
        else:
            cur.append(v)
    groups.append(cur)
    result = one(groups[0])
    for o, g in zip(ops, groups[1:]):
        r = one(g)
        if o == "&&":
            result = False if (result is False or r is False) else (None if None in (result, r) else True)
        else:
            result = True if (result is True or r is True) else (None if None in (result, r) else False)
    return result


def _primary(seq):
    if len(seq) == 1:
        return seq[0][0] == "val" and seq[0][1] != ""
    if len(seq) == 2 and seq[0][0] == "op":
        o, v = seq[0][1], seq[1][1]
        if o == "-z":
            return v == ""
        if o == "-n":
            return v != ""
        return None          # -f, -d, -e, -v, ...: need the machine
    if len(seq) == 3 and seq[1][0] == "op":
        a, o, b = seq[0][1], seq[1][1], seq[2][1]
        if o in ("=", "=="):
            return fnmatch.fnmatchcase(a, b) if any(c in b for c in "*?[") else a == b
        if o == "!=":
            return a != b
        nums = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__,
                "-gt": int.__gt__, "-ge": int.__ge__}
        if o in nums:
            try:
                return nums[o](int(a or 0), int(b or 0))
            except ValueError:
                return None
    return None


# ---- parser ---------------------------------------------------------------------------------
# nodes: ("simple", assigns, redirects, words, line) | ("andor", first, [(op, node)])
# | ("pipe", [nodes]) | ("if", [(cond, body)], else_body|None, line) | ("case", word, [(pats, body)], line)
# | ("for", name, words, body, line) | ("while", until, cond, body, line) | ("group", body)
# | ("subshell", body) | ("function", name, body)

def _raw(w) -> str:
    if w[0] == "word":
        return "".join(p[1] if p[0] == "lit" else "\0" for p in w[1])
    return ""


def _text_of(node) -> str:
    if node[0] == "simple":
        return " ".join(w[3] if w[0] == "word" else "(...)" for w in node[3])[:80]
    if node[0] == "andor":
        return _text_of(node[1]) + " " + " ".join(f"{op} {_text_of(n)}" for op, n in node[2])
    return node[0]


def _line_of(node) -> int:
    return node[-1] if node[0] in ("simple", "if", "case") else 0


def _exits(body) -> bool:
    """A branch whose own commands end the script (exit / return)."""
    for n in body:
        if n[0] == "simple" and n[3] and _raw(n[3][0]) in ("exit", "return"):
            return True
        if n[0] == "andor" and _exits([n[1]]):
            return True
    return False


class _Parser:
    def __init__(self, toks: list[_Tok], source: str):
        self.t = toks
        self.k = 0
        self.source = source

    def err(self, msg: str):
        line = self.t[self.k].line if self.k < len(self.t) else (self.t[-1].line if self.t else 0)
        raise ShellSyntaxError(self.source, f"line {line}", msg)

    def peek(self):
        return self.t[self.k] if self.k < len(self.t) else None

    def need_word(self, what: str) -> _Tok:
        tok = self.peek()
        if tok is None or tok.kind != "word":
            self.err(f"expected {what}")
        self.k += 1
        return tok

    def word_is(self, tok, *names) -> bool:
        return tok is not None and tok.kind == "word" and tok.raw in names

    def skip_nl(self):
        while self.peek() is not None and (self.peek().kind == "nl" or (self.peek().kind == "op" and self.peek().value == ";")):
            self.k += 1

    def program(self):
        return self.body(end=())

    def body(self, end: tuple):
        out = []
        while True:
            self.skip_nl()
            tok = self.peek()
            if tok is None:
                if end:
                    self.err(f"expected {' or '.join(end)} before the end of the file")
                return out
            if self.word_is(tok, *end) or (tok.kind == "op" and tok.value in end):
                return out
            out.append(self.andor())

    def andor(self):
        first = self.pipeline()
        rest = []
        while self.peek() is not None and self.peek().kind == "op" and self.peek().value in ("&&", "||"):
            op = self.peek().value
            self.k += 1
            self.skip_only_nl()
            rest.append((op, self.pipeline()))
        if self.peek() is not None and self.peek().kind == "op" and self.peek().value == "&":
            self.k += 1
        return ("andor", first, rest) if rest else first

    def skip_only_nl(self):
        while self.peek() is not None and self.peek().kind == "nl":
            self.k += 1

    def pipeline(self):
        if self.word_is(self.peek(), "!"):
            self.k += 1
        cmds = [self.command()]
        while self.peek() is not None and self.peek().kind == "op" and self.peek().value == "|":
            self.k += 1
            self.skip_only_nl()
            cmds.append(self.command())
        return cmds[0] if len(cmds) == 1 else ("pipe", cmds)

    def command(self):
        tok = self.peek()
        if tok is None:
            self.err("expected a command")
        if tok.kind == "nl":
            self.err("expected a command before the end of the line")
        if tok.kind == "op" and tok.value == "(":
            self.k += 1
            b = self.body(end=(")",))
            self.k += 1
            return ("subshell", b)
        if self.word_is(tok, "{"):
            self.k += 1
            b = self.body(end=("}",))
            self.k += 1
            return ("group", b)
        if self.word_is(tok, "if"):
            return self.if_()
        if self.word_is(tok, "case"):
            return self.case_()
        if self.word_is(tok, "for"):
            return self.for_()
        if self.word_is(tok, "while", "until"):
            until = tok.raw == "until"
            line = tok.line
            self.k += 1
            cond = self.body(end=("do",))
            self.k += 1
            b = self.body(end=("done",))
            self.k += 1
            return ("while", until, cond, b, line)
        if self.word_is(tok, "function"):
            self.k += 1
            name = self.need_word("a function name").raw
            if self.peek() is not None and self.peek().kind == "op" and self.peek().value == "(":
                self.k += 2
            self.skip_only_nl()
            if self.peek() is None:
                self.err("expected a function body")
            return ("function", name, [self.command()] if self.peek() is not None else self.err("expected a function body"))
        if tok.kind == "word" and _NAME.fullmatch(tok.raw) and self.k + 2 < len(self.t) \
                and self.t[self.k + 1].kind == "op" and self.t[self.k + 1].value == "(" \
                and self.t[self.k + 2].kind == "op" and self.t[self.k + 2].value == ")":
            name = tok.raw
            self.k += 3
            self.skip_only_nl()
            if self.peek() is None:
                self.err("expected a function body")
            return ("function", name, [self.command()] if self.peek() is not None else self.err("expected a function body"))
        return self.simple()

    def simple(self):
        assigns, redirects, words = [], [], []
        line = self.peek().line
        start = self.k
        while True:
            tok = self.peek()
            if tok is None or tok.kind == "nl":
                break
            if tok.kind == "op":
                if tok.value in ("<<", "<<-"):
                    redirects.append(tok)
                    self.k += 1
                    continue
                if tok.value in ("<", ">", ">>", ">&", "&>", "<<<"):
                    self.k += 1
                    if self.peek() is not None and self.peek().kind == "word":
                        self.k += 1
                    continue
                if tok.value == "2>&1":
                    self.k += 1
                    continue
                break
            if tok.kind == "array":
                if words:
                    words.append(("array", tok.value, tok.raw, tok.line))
                else:
                    assigns.append(("array", tok.value, tok.raw, tok.line))
                self.k += 1
                continue
            if re.fullmatch(r"[0-9]?>>?|[0-9]?<", tok.raw or ""):
                self.k += 1
                continue
            if not words and _ASSIGN.fullmatch(tok.raw) and not tok.raw.startswith("="):
                assigns.append(("assign", ("word", tok.value, tok.line, tok.raw)))
                self.k += 1
                continue
            words.append(("word", tok.value, tok.line, tok.raw))
            self.k += 1
        if self.k == start:
            tok = self.peek()
            self.err(f"unexpected {tok.value if tok.kind == 'op' else tok.raw!r}")
        return ("simple", assigns, redirects, words, line)

    def if_(self):
        line = self.peek().line
        self.k += 1
        clauses = []
        cond = self.body(end=("then",))
        self.k += 1
        b = self.body(end=("elif", "else", "fi"))
        clauses.append((cond, b))
        else_body = None
        while True:
            tok = self.peek()
            if self.word_is(tok, "elif"):
                self.k += 1
                cond = self.body(end=("then",))
                self.k += 1
                b = self.body(end=("elif", "else", "fi"))
                clauses.append((cond, b))
            elif self.word_is(tok, "else"):
                self.k += 1
                else_body = self.body(end=("fi",))
            elif self.word_is(tok, "fi"):
                self.k += 1
                return ("if", clauses, else_body, line)
            else:
                self.err("expected elif, else or fi")

    def case_(self):
        line = self.peek().line
        self.k += 1
        tok = self.need_word("a word after case")
        word = ("word", tok.value, tok.line, tok.raw)
        self.skip_only_nl()
        if not self.word_is(self.peek(), "in"):
            self.err("expected 'in' after case WORD")
        self.k += 1
        items = []
        while True:
            self.skip_nl()
            tok = self.peek()
            if tok is None:
                self.err("expected esac")
            if self.word_is(tok, "esac"):
                self.k += 1
                return ("case", word, items, line)
            if tok.kind == "op" and tok.value == "(":
                self.k += 1
            pats = []
            while True:
                tok = self.peek()
                if tok is None or tok.kind != "word":
                    self.err("expected a case pattern")
                pats.append(("word", tok.value, tok.line, tok.raw))
                self.k += 1
                tok = self.peek()
                if tok is not None and tok.kind == "op" and tok.value == "|":
                    self.k += 1
                    continue
                if tok is not None and tok.kind == "op" and tok.value == ")":
                    self.k += 1
                    break
                self.err("expected ')' after the case pattern")
            b = self.body(end=(";;", "esac"))
            if self.peek() is not None and self.peek().kind == "op" and self.peek().value == ";;":
                self.k += 1
            items.append((pats, b))

    def for_(self):
        line = self.peek().line
        self.k += 1
        name = self.need_word("a loop variable").raw
        words = []
        self.skip_only_nl()
        if self.word_is(self.peek(), "in"):
            self.k += 1
            while self.peek() is not None and self.peek().kind == "word":
                tok = self.peek()
                words.append(("word", tok.value, tok.line, tok.raw))
                self.k += 1
        self.skip_nl()
        if not self.word_is(self.peek(), "do"):
            self.err("expected 'do'")
        self.k += 1
        b = self.body(end=("done",))
        self.k += 1
        return ("for", name, words, b, line)


def read_script(text: str, source: str, env: dict | None = None, base_dir: Path | None = None,
                args: list[str] | None = None, pins: dict | None = None) -> ShellResult:
    """Interpret a script's text; `env`: the environment it starts with (os.environ when None),
    `args`: its positional parameters ($1, ...), `pins`: --set values."""
    it = Interpreter(source, dict(os.environ) if env is None else dict(env), base_dir, args=args, pins=pins)
    it.run_text(text.replace("\r\n", "\n"))
    return ShellResult(commands=it.commands, variables=it.vars, exported=it.exported, sbatch=it.sbatch,
                       notes=it.notes, stopped_at=it.stopped_at)


def is_flags_text(text: str) -> bool:
    """A flags file (megatron.args, or flags pasted from a launch): its first word is a --flag.
    Such a file is read as words only: '|' and ';' in it are text, as in `$(cat megatron.args)`."""
    for ln in text.splitlines():
        s = ln.strip()
        if s and not s.startswith("#"):
            return s.startswith("--")
    return False


def tokenize(text: str, source: str, env: dict | None = None) -> list[str]:
    """The words of a flags text (no commands): quotes, comments and continuations as in the
    shell, no operators; $VAR from `env` (os.environ when None). An unknown variable is an
    error naming it."""
    return [w.text for w in flag_words(text, source, env, strict=True)]


def flag_words(text: str, source: str, env: dict | None = None, strict: bool = False) -> list[Word]:
    import shlex
    it = Interpreter(source, dict(os.environ) if env is None else dict(env), None)
    out: list[Word] = []
    for k, ln in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        try:
            lex = shlex.shlex(ln, posix=False)
            lex.whitespace_split = True
            lex.commenters = "#"
            raw_words = list(lex)
        except ValueError as exc:
            raise SpecError(source, f"line {k}", f"cannot split into words: {exc}") from None
        for rw in raw_words:
            lx = _Lexer(rw, source)
            parts = lx._word(stop="\0")
            for w in it.expand_parts(parts, k):
                if w.unknown and strict:
                    raise SpecError(source, w.unknown[0], "is not set; set it or write the value")
                out.append(w)
    return out
