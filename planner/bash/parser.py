"""The parser: tokens -> a list of commands, each a node below (small frozen dataclasses; the
lists inside are the script's bodies, in order)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .lexer import ASSIGN, NAME, ArrayItem, Lit, ShellSyntaxError, Tok


# ---- nodes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class WordNode:
    """A word as written: its parts (lexer), line and text."""
    parts: tuple
    line: int
    raw: str


@dataclass(frozen=True)
class ArrayNode:
    """NAME=( ... ) / NAME+=( ... ); raw is 'NAME=' or 'NAME+='."""
    items: list[ArrayItem]
    raw: str
    line: int


@dataclass(frozen=True)
class Assign:
    """NAME=word / NAME+=word."""
    word: WordNode


@dataclass(frozen=True)
class Simple:
    """A simple command: NAME=value prefixes (Assign / ArrayNode), here-document tokens, words."""
    assigns: list
    redirects: list[Tok]
    words: list
    line: int


@dataclass(frozen=True)
class AndOr:
    """first && n1 || n2 ...: rest is [(operator, node)]."""
    first: object
    rest: list


@dataclass(frozen=True)
class Pipe:
    commands: list


@dataclass(frozen=True)
class If:
    """clauses: [(condition, body)] for if / elif; else_body: None when there is no else."""
    clauses: list
    else_body: list | None
    line: int


@dataclass(frozen=True)
class Case:
    """items: [(patterns, body)]."""
    word: WordNode
    items: list
    line: int


@dataclass(frozen=True)
class For:
    name: str
    words: list[WordNode]
    body: list
    line: int


@dataclass(frozen=True)
class While:
    """while / until (until=True) COND; do BODY; done."""
    until: bool
    cond: list
    body: list
    line: int


@dataclass(frozen=True)
class Group:
    """{ ...; }"""
    body: list


@dataclass(frozen=True)
class Subshell:
    """( ... ): its variables do not outlive it."""
    body: list


@dataclass(frozen=True)
class Function:
    name: str
    body: list


def raw_text(w) -> str:
    """A word's literal text, expansions as NUL ('' for an array)."""
    if isinstance(w, WordNode):
        return "".join(p.text if isinstance(p, Lit) else "\0" for p in w.parts)
    return ""


def text_of(node) -> str:
    """A command as written, for messages."""
    if isinstance(node, Simple):
        return " ".join(w.raw if isinstance(w, WordNode) else "(...)" for w in node.words)[:80]
    if isinstance(node, AndOr):
        return text_of(node.first) + " " + " ".join(f"{op} {text_of(n)}" for op, n in node.rest)
    return type(node).__name__.lower()


def line_of(node) -> int:
    return node.line if isinstance(node, (Simple, If, Case)) else 0


def exits(body) -> bool:
    """A branch whose own commands end the script (exit / return)."""
    for n in body:
        if isinstance(n, Simple) and n.words and raw_text(n.words[0]) in ("exit", "return"):
            return True
        if isinstance(n, AndOr) and exits([n.first]):
            return True
    return False


class Parser:
    def __init__(self, toks: list[Tok], source: str):
        self.t = toks
        self.k = 0
        self.source = source

    def err(self, msg: str):
        line = self.t[self.k].line if self.k < len(self.t) else (self.t[-1].line if self.t else 0)
        raise ShellSyntaxError(self.source, f"line {line}", msg)

    def peek(self):
        return self.t[self.k] if self.k < len(self.t) else None

    def need_word(self, what: str) -> Tok:
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
        return AndOr(first, rest) if rest else first

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
        return cmds[0] if len(cmds) == 1 else Pipe(cmds)

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
            return Subshell(b)
        if self.word_is(tok, "{"):
            self.k += 1
            b = self.body(end=("}",))
            self.k += 1
            return Group(b)
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
            return While(until, cond, b, line)
        if self.word_is(tok, "function"):
            self.k += 1
            name = self.need_word("a function name").raw
            if self.peek() is not None and self.peek().kind == "op" and self.peek().value == "(":
                self.k += 2
            self.skip_only_nl()
            if self.peek() is None:
                self.err("expected a function body")
            return Function(name, [self.command()] if self.peek() is not None else self.err("expected a function body"))
        if tok.kind == "word" and NAME.fullmatch(tok.raw) and self.k + 2 < len(self.t) \
                and self.t[self.k + 1].kind == "op" and self.t[self.k + 1].value == "(" \
                and self.t[self.k + 2].kind == "op" and self.t[self.k + 2].value == ")":
            name = tok.raw
            self.k += 3
            self.skip_only_nl()
            if self.peek() is None:
                self.err("expected a function body")
            return Function(name, [self.command()] if self.peek() is not None else self.err("expected a function body"))
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
                    words.append(ArrayNode(tok.value, tok.raw, tok.line))
                else:
                    assigns.append(ArrayNode(tok.value, tok.raw, tok.line))
                self.k += 1
                continue
            if re.fullmatch(r"[0-9]?>>?|[0-9]?<", tok.raw or ""):
                self.k += 1
                continue
            if not words and ASSIGN.fullmatch(tok.raw) and not tok.raw.startswith("="):
                assigns.append(Assign(WordNode(tok.value, tok.line, tok.raw)))
                self.k += 1
                continue
            words.append(WordNode(tok.value, tok.line, tok.raw))
            self.k += 1
        if self.k == start:
            tok = self.peek()
            self.err(f"unexpected {tok.value if tok.kind == 'op' else tok.raw!r}")
        return Simple(assigns, redirects, words, line)

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
                return If(clauses, else_body, line)
            else:
                self.err("expected elif, else or fi")

    def case_(self):
        line = self.peek().line
        self.k += 1
        tok = self.need_word("a word after case")
        word = WordNode(tok.value, tok.line, tok.raw)
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
                return Case(word, items, line)
            if tok.kind == "op" and tok.value == "(":
                self.k += 1
            pats = []
            while True:
                tok = self.peek()
                if tok is None or tok.kind != "word":
                    self.err("expected a case pattern")
                pats.append(WordNode(tok.value, tok.line, tok.raw))
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
                words.append(WordNode(tok.value, tok.line, tok.raw))
                self.k += 1
        self.skip_nl()
        if not self.word_is(self.peek(), "do"):
            self.err("expected 'do'")
        self.k += 1
        b = self.body(end=("done",))
        self.k += 1
        return For(name, words, b, line)
