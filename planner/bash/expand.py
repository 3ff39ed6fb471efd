"""Expansion: a word's parts -> words (parameter expansion, then field splitting), with what
cannot be known without running something kept as `Unknown` values that name it."""

from __future__ import annotations

import re
from pathlib import Path

from .conditions import arith_eval
from .lexer import NAME, Arith, Cmd, Lexer, Lit, Var
from .words import Partial, Piece, Unknown, Word, pieces_to_value

# the script's own folder, as scripts find it to source their neighbours (quotes aside):
# SCRIPT_DIR="$(dirname "$(readlink -f "$0")")" in Megatron-LM's examples/post_training/modelopt
SCRIPT_DIR_IDIOMS = {"$(dirname $0)", "$(dirname $(readlink -f $0))", "$(dirname $(realpath $0))",
                     "$(cd $(dirname $0) && pwd)", "$(cd $(dirname $(readlink -f $0)) && pwd)"}


def is_script_dir(command: str) -> bool:
    """A command substitution that prints the folder of the script ($0): known without running
    it, as the folder the script was read from."""
    text = re.sub(r"\s+", " ", command.replace('"', "").replace("${0}", "$0")).strip()
    if text.startswith("`") and text.endswith("`"):
        text = "$(" + text[1:-1] + ")"
    return text in SCRIPT_DIR_IDIOMS


def written(parts) -> str:
    """A word's parts as written (quotes aside)."""
    out = []
    for p in parts:
        if isinstance(p, Var):
            out.append("${" + p.name + p.op + written(p.arg) + "}" if p.op or p.arg else "${" + p.name + "}")
        elif isinstance(p, Arith):
            out.append("$((" + p.text + "))")
        else:
            out.append(p.text)
    return "".join(out)


class Expander:
    """The variables of a script and their expansion. `env`: the environment it starts with;
    `args`: its positional parameters ($1 ...); `base_dir`: the folder it was read from."""

    def __init__(self, source: str, env: dict, base_dir: Path | None, args: list[str] | None = None):
        self.source = source
        self.env = env
        self.vars: dict = {}
        self.notes: list[str] = []
        self.base_dir = base_dir
        self.args = list(args or [])

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
    def _var_value(self, part: Var, line: int):
        """-> None (unset) | str | list | Partial."""
        name, op, arg = part.name, part.op, part.arg
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
            if isinstance(d, Partial) and any(u.why == "command" for u in d.unknowns) \
                    and (NAME.fullmatch(base) or base.isdigit()):
                # the default would run a command (X=${X:-$(hostname)}): not run, and unknown as
                # the variable it defaults, which --set X=... (or the environment) gives
                d = Partial((Unknown(base, "command", "${" + name + op + written(arg) + "}"),))
            if op in (":=", "="):
                self.vars[base] = d
            return d
        if op in (":+", "+"):
            if isinstance(val, Partial):
                return val
            present = not (is_null if op == ":+" else is_unset)
            return self._as_value(self.expand_parts_pieces(arg, line, assign=True)) if present else ""
        if is_unset:
            plain = not index and NAME.fullmatch(name)
            return Partial((Unknown(base, "unset", "$" + (name if plain else "{" + name + "}")),))
        return val

    @staticmethod
    def _as_value(fields: list[list[Piece]]):
        """Fields of an unsplit expansion -> one value."""
        pieces = [p for f in fields for p in f]
        return pieces_to_value(pieces)

    def expand_parts(self, parts, line: int, assign: bool = False) -> list[Word]:
        out = []
        for f in self.expand_parts_pieces(parts, line, assign):
            names = tuple(dict.fromkeys(u.name for p in f for u in p.unknown))
            out.append(Word("".join(p.text for p in f), names, line))
        return out

    def expand_parts_pieces(self, parts, line: int, assign: bool = False) -> list[list[Piece]]:
        """A word's parts -> fields (bash: parameter expansion, then field splitting of the
        unquoted expansions). `assign`: no splitting (right side of NAME=value)."""
        fields: list[list[Piece]] = [[]]
        quoted_seen = False

        def add_value(val, quoted):
            split = not quoted and not assign
            if isinstance(val, Partial):
                for seg in val.segments:
                    if isinstance(seg, Unknown):
                        fields[-1].append(Piece(seg.text, False, (seg,)))
                    else:
                        fields[-1].append(Piece(seg, split))
            else:
                fields[-1].append(Piece(val, split))
        for part in parts:
            quoted = part.quoted
            if isinstance(part, Lit):
                fields[-1].append(Piece(part.text, False))
                quoted_seen = quoted_seen or quoted
                continue
            if isinstance(part, Cmd) and self.base_dir is not None and is_script_dir(part.text):
                fields[-1].append(Piece(str(self.base_dir), not quoted and not assign))
                msg = f"line {line}: {part.text}: the script's folder, {self.base_dir}"
                if msg not in self.notes:
                    self.notes.append(msg)
                continue
            if isinstance(part, Cmd):
                fields[-1].append(Piece(part.text, False, (Unknown(part.text, "command", part.text),)))
                continue
            if isinstance(part, Arith):
                v = self.arith(part.text, line)
                if isinstance(v, Unknown):
                    fields[-1].append(Piece("$((" + part.text + "))", False, (v,)))
                else:
                    fields[-1].append(Piece(str(v), not quoted and not assign))
                continue
            val = self._var_value(part, line)
            if val is None:
                val = ""
            if isinstance(val, list):
                if quoted and not part.name.endswith("[*]") and not assign:
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
                val = pieces_to_value([Piece(x, False) if isinstance(x, str) else Piece(x.text, False, (x,)) for x in segs])
            if quoted:
                quoted_seen = True
            add_value(val, quoted)
        out: list[list[Piece]] = []
        for f in fields:
            out.extend(self._split(f, quoted_seen, assign))
        return out

    @staticmethod
    def _split(pieces: list[Piece], keep_empty: bool, assign: bool) -> list[list[Piece]]:
        """Field splitting: unquoted expansion text splits on blanks; the rest joins."""
        words: list[list[Piece]] = [[]]
        for p in pieces:
            if p.split and not assign:
                chunks = re.split(r"[ \t\n]+", p.text)
                for k, ch in enumerate(chunks):
                    if k > 0 and words[-1]:
                        words.append([])
                    if ch:
                        words[-1].append(Piece(ch, False))
            else:
                words[-1].append(p)
        out = [w for w in words if any(p.text or p.unknown for p in w)]
        if not out and keep_empty:
            out = [[Piece("", False)]]
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
        v = arith_eval(expr.replace("/", "//").strip())
        return Unknown("$((" + text + "))", "command", "$((" + text + "))") if v is None else v

    def test_value(self, w):
        """A test operand: its text, '' for a variable nobody set (or a script argument not
        given), None when it depends on a command."""
        fields = self.expand_parts_pieces(w.parts, w.line, assign=True)
        unk = [u for f in fields for p in f for u in p.unknown]
        if any(u.why == "command" for u in unk):
            return None
        return "".join(p.text for f in fields for p in f if not p.unknown)

    def expand_heredoc(self, body: str, line: int) -> str:
        """An unquoted here-document: $VAR, ${...} and $(( )) expanded as in double quotes;
        what cannot be known stays as written."""
        lx = Lexer(body, self.source)
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
                part = lx.dollar(quoted=True)
                if isinstance(part, Lit):
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


def strip_assign_prefix(parts, n: int):
    """The parts of NAME=value after the first n characters (the 'NAME=')."""
    out = []
    for p in parts:
        if n <= 0:
            out.append(p)
            continue
        if not isinstance(p, Lit):
            out.append(p)
            n = 0
            continue
        if len(p.text) <= n:
            n -= len(p.text)
            continue
        out.append(Lit(p.text[n:], p.quoted))
        n = 0
    return tuple(out) or (Lit("", True),)
