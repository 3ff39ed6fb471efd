"""The lexer: a script's text -> tokens; a word is a tuple of parts (`Lit`, `Var`, `Cmd`,
`Arith`), nothing expanded yet. Here-documents are read into the `<<` token that opens them, and
`NAME=( ... )` is one `array` token."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple, Union

from ..errors import SpecError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?=)(.*)", re.S)


class ShellSyntaxError(SpecError):
    pass


# ---- parts of a word ------------------------------------------------------------------------

@dataclass(frozen=True)
class Lit:
    """Literal text; `quoted`: it came from inside quotes (or after a backslash)."""
    text: str
    quoted: bool


@dataclass(frozen=True)
class Var:
    """$NAME / ${NAME} / ${NAME op arg}; op is '' | ':-' | '-' | ':=' | '=' | ':+' | '+' | ':?' |
    '?' | '#' (the length); `name` may carry an index (A[@], A[0])."""
    name: str
    op: str
    arg: tuple
    quoted: bool


@dataclass(frozen=True)
class Cmd:
    """$(...) / `...` / an expansion not modelled (${x/a/b}): text as written, never run."""
    text: str
    quoted: bool


@dataclass(frozen=True)
class Arith:
    """$(( text ))."""
    text: str
    quoted: bool


Part = Union[Lit, Var, Cmd, Arith]


class ArrayItem(NamedTuple):
    """One word of NAME=( ... )."""
    parts: tuple
    raw: str
    line: int


@dataclass
class Tok:
    """kind: 'word' (value: the parts) | 'op' (value: the operator) | 'nl' | 'array' (value:
    the ArrayItems after NAME=( , raw: 'NAME=' or 'NAME+=')."""
    kind: str
    value: object
    line: int
    raw: str = ""            # the word as written (for messages and keywords)
    heredoc: str | None = None
    heredoc_expand: bool = True


class Lexer:
    def __init__(self, text: str, source: str):
        self.s = text
        self.i = 0
        self.line = 1
        self.source = source
        self.pending_heredocs: list[tuple[Tok, str, bool, bool]] = []

    def err(self, msg: str):
        raise ShellSyntaxError(self.source, f"line {self.line}", msg)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def tokens(self) -> list[Tok]:
        out: list[Tok] = []
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
                out.append(Tok("nl", "\n", self.line))
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
                out.append(Tok("array", self._array_words(), arr_tok.line, raw=arr_tok.raw))
                continue
            if op in ("<<", "<<-"):
                self.i += len(op)
                while self.peek() and self.peek() in " \t":
                    self.i += 1
                delim_parts = self.word()
                if not delim_parts:
                    self.err(f"{op} without a here-document delimiter")
                quoted = any(isinstance(p, Lit) and p.quoted for p in delim_parts)
                delim = "".join(p.text for p in delim_parts if isinstance(p, Lit))
                tok = Tok("op", op, self.line, raw=op)
                out.append(tok)
                self.pending_heredocs.append((tok, delim, not quoted, op == "<<-"))
                continue
            if op:
                self.i += len(op)
                out.append(Tok("op", op, self.line, raw=op))
                continue
            start = self.i
            line = self.line
            parts = self.word()
            out.append(Tok("word", tuple(parts), line, raw=self.s[start:self.i]))
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

    def _array_words(self) -> list[ArrayItem]:
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
                parts = self.word()
                if self.i == start:
                    self.err(f"unexpected {c!r} in an array")
                words.append(ArrayItem(tuple(parts), self.s[start:self.i], self.line))

    def word(self, stop: str = "") -> list[Part]:
        """Parts of one word, up to an unquoted blank or operator (or `stop`)."""
        parts: list[Part] = []
        buf: list[str] = []

        def flush():
            if buf:
                parts.append(Lit("".join(buf), False))
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
                parts.append(Lit(nxt, True))
                self.i += 2
                continue
            if c == "'":
                flush()
                j = self.s.find("'", self.i + 1)
                if j < 0:
                    self.err("unclosed single quote")
                text = self.s[self.i + 1:j]
                self.line += text.count("\n")
                parts.append(Lit(text, True))
                self.i = j + 1
                continue
            if c == '"':
                flush()
                self.i += 1
                parts.extend(self._double_quoted())
                continue
            if c == "$":
                flush()
                parts.append(self.dollar(quoted=False))
                continue
            if c == "`":
                flush()
                parts.append(Cmd(self._backtick(), False))
                continue
            buf.append(c)
            self.i += 1
        flush()
        return parts

    def _double_quoted(self) -> list[Part]:
        parts: list[Part] = []
        buf: list[str] = []

        def flush():
            if buf:
                parts.append(Lit("".join(buf), True))
                buf.clear()
        while True:
            if self.i >= len(self.s):
                self.err("unclosed double quote")
            c = self.peek()
            if c == '"':
                self.i += 1
                flush()
                if not parts:
                    parts.append(Lit("", True))
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
                parts.append(self.dollar(quoted=True))
                continue
            if c == "`":
                flush()
                parts.append(Cmd(self._backtick(), True))
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

    def dollar(self, quoted: bool) -> Part:
        nxt = self.peek(1)
        if nxt == "(" and self.peek(2) == "(":
            self.i += 1
            text = self._balanced("(", ")")
            return Arith(text[2:-2], quoted)
        if nxt == "(":
            self.i += 1
            return Cmd("$" + self._balanced("(", ")"), quoted)
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
                return Cmd("${" + name + self.s[start:self.i], quoted)
            if self.peek() != "}":
                self.err("${...} not closed with '}'")
            self.i += 1
            return Var(name, "#" if length else op, arg, quoted)
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]|[@*#?$!]", self.s[self.i + 1:])
        if not m:
            self.i += 1
            return Lit("$", quoted)
        self.i += 1 + m.end()
        return Var(m.group(), "", (), quoted)

    def _brace_arg(self) -> list[Part]:
        """The word after :- / := / :+ inside ${...}: quotes and expansions, up to '}'."""
        parts: list[Part] = []
        while self.i < len(self.s) and self.peek() != "}":
            c = self.peek()
            if c == '"':
                self.i += 1
                parts.extend(self._double_quoted())
            elif c == "'":
                j = self.s.find("'", self.i + 1)
                if j < 0:
                    self.err("unclosed single quote")
                parts.append(Lit(self.s[self.i + 1:j], True))
                self.i = j + 1
            elif c == "$":
                parts.append(self.dollar(quoted=False))
            elif c == "`":
                parts.append(Cmd(self._backtick(), False))
            elif c == "\\":
                parts.append(Lit(self.peek(1), True))
                self.i += 2
            else:
                j = self.i
                while j < len(self.s) and self.s[j] not in '}"\'$\\`':
                    j += 1
                parts.append(Lit(self.s[self.i:j], False))
                self.i = j
        return parts
