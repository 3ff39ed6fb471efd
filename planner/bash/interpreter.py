"""The interpreter: runs a script's commands the way bash would, without running anything
(see planner.bash). It records the commands a script would start (`Command`), its variables,
what it exports and its #SBATCH options, and notes every decision it took."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecError
from .conditions import decide
from .expand import Expander, strip_assign_prefix
from .lexer import ASSIGN, NAME, Lexer
from .parser import (AndOr, ArrayNode, Assign, Case, For, Function, Group, If, Parser, Pipe, Simple, Subshell,
                     While, WordNode, exits, line_of, raw_text, text_of)
from .slurm import SLURM_VARS, sbatch_header_options, sbatch_options
from .words import Partial, Word, concat, pieces_to_value

MAX_SOURCE_DEPTH = 8          # nested `source` / `bash -c` / here-documents followed
MAX_LOOP_ITERATIONS = 1000    # a `for` loop over more words than this is not run


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


class Stop(Exception):
    """A top-level `exit`: the script ends there."""


class Interpreter(Expander):
    def __init__(self, source: str, env: dict, base_dir: Path | None, depth: int = 0, wrappers=None,
                 args: list[str] | None = None, pins: dict | None = None):
        super().__init__(source, env, base_dir, args)
        self.pins = dict(pins or {})     # --set NAME=VALUE: also replaces values the script cannot know
        self.exported: dict = {}
        self.functions: dict = {}
        self.commands: list[Command] = []
        self.sbatch: dict = {}
        self.depth = depth
        self.wrappers = list(wrappers or [])
        self.stopped_at: int | None = None

    # ---- running
    def run_text(self, text: str, line0: int = 0):
        toks = Lexer(text, self.source).tokens()
        for t in toks:
            t.line += line0
        parser = Parser(toks, self.source)
        prog = parser.program()
        if self.depth == 0:
            self._sbatch_headers(text)
        try:
            self.run_list(prog)
        except Stop:
            pass

    def _sbatch_headers(self, text: str):
        """#SBATCH lines before the first command (where sbatch reads them)."""
        self.sbatch.update(sbatch_header_options(text))
        for opt, names in SLURM_VARS.items():
            if opt in self.sbatch:
                for n in names:
                    if n not in self.env:
                        self.vars[n] = self.sbatch[opt]

    def run_list(self, nodes):
        for node in nodes:
            self.run(node)

    def run(self, node):
        if isinstance(node, Simple):
            self.run_simple(node)
        elif isinstance(node, AndOr):
            self.run_andor(node)
        elif isinstance(node, Pipe):
            for n in node.commands:
                self.run(n)
        elif isinstance(node, If):
            self.run_if(node)
        elif isinstance(node, Case):
            self.run_case(node)
        elif isinstance(node, For):
            self.run_for(node)
        elif isinstance(node, While):
            self.run_while(node)
        elif isinstance(node, Group):
            self.run_list(node.body)
        elif isinstance(node, Subshell):
            saved = (dict(self.vars), dict(self.exported))
            try:
                self.run_list(node.body)
            finally:
                self.vars, self.exported = saved
        elif isinstance(node, Function):
            self.functions[node.name] = node.body

    def run_andor(self, node):
        first, rest = node.first, node.rest
        ok = self.status_of(first)
        self.run(first)
        for op, n in rest:
            if op == "&&" and ok is False or op == "||" and ok is not False:
                if op == "||" and ok is None:
                    self.note(line_of(n), f"`{text_of(first)} || ...`: the test cannot be decided without running it; "
                              "took the default (the part after || is not run)")
                continue
            ok = self.status_of(n)
            self.run(n)

    def status_of(self, node):
        """True/False for a test whose value is known, None when it cannot be decided; other
        commands are assumed to succeed (True)."""
        if isinstance(node, Simple) and node.words and isinstance(node.words[0], WordNode) \
                and raw_text(node.words[0]) in ("[", "[[", "test", "!"):
            return self.eval_test(node)
        return True

    def run_if(self, node):
        clauses, else_body, line = node.clauses, node.else_body, node.line
        for cond, body in clauses:
            v = self.eval_condition(cond)
            ctext = " ".join(text_of(c) for c in cond)
            if v is None:
                self.note(line, f"`if {ctext}` cannot be decided without running it; took the "
                          + ("else branch" if else_body is not None else "default (no branch)"))
                if else_body is not None:
                    self._take(else_body, line, "else branch")
                return
            if v:
                if exits(body):
                    self.note(line, f"`if {ctext}` is true here and its branch ends the script; assumed the "
                              "check passes (branch not taken)")
                    return
                self.note(line, f"`if {ctext}`: true, took that branch")
                self._take(body, line, "branch")
                return
        if else_body is not None:
            if exits(else_body):
                self.note(line, "the else branch ends the script; assumed not taken")
                return
            self.run_list(else_body)

    def _take(self, body, line, what):
        if exits(body):
            self.note(line, f"the {what} ends the script; not taken")
            return
        self.run_list(body)

    def eval_condition(self, cond_nodes):
        v = True
        for n in cond_nodes:
            v = self.status_of(n) if not isinstance(n, AndOr) else self.eval_andor(n)
        return v

    def eval_andor(self, node):
        first, rest = node.first, node.rest
        v = self.status_of(first) if not isinstance(first, AndOr) else self.eval_andor(first)
        for op, n in rest:
            w = self.status_of(n)
            if op == "&&":
                v = False if (v is False or w is False) else (None if (v is None or w is None) else True)
            else:
                v = True if (v is True or w is True) else (None if (v is None or w is None) else False)
        return v

    def eval_test(self, node):
        vals = []
        for w in node.words:
            if not isinstance(w, WordNode):
                return None
            raw = w.raw
            if raw in ("[", "]", "[[", "]]", "test", "!", "&&", "||", "-a", "-o", "(", ")", "==", "=", "!=") \
                    or re.fullmatch(r"-[a-zA-Z]+", raw):
                vals.append(("op", raw))
                continue
            text = self.test_value(w)
            if text is None:
                return None
            vals.append(("val", text))
        return decide(vals)

    def run_case(self, node):
        word, items, line = node.word, node.items, node.line
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
                if exits(body):
                    self.note(line, f"`case {word.raw}`: the matching branch ({value!r}) ends the script; not taken")
                    return
                if value is None:
                    self.note(line, f"`case {word.raw}` cannot be decided without running it; took the default branch *)")
                else:
                    self.note(line, f"`case {word.raw}` is {value!r}: took that branch")
                self.run_list(body)
                return
        if value is None:
            self.note(line, f"`case {word.raw}` cannot be decided without running it and has no *) branch")

    def run_for(self, node):
        name, words, body, line = node.name, node.words, node.body, node.line
        items: list[str] = []
        for w in words:
            for x in self.expand_parts(w.parts, w.line):
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
        until, cond, line = node.until, node.cond, node.line
        v = self.eval_condition(cond)
        if v is not None and (v is False) != until:
            return   # runs zero times (e.g. `while [[ $# -gt 0 ]]` with no arguments)
        self.note(line, "loop not run (a loop whose condition holds would need the script to run)")

    def run_simple(self, node):
        assigns, redirects, words, line = node.assigns, node.redirects, node.words, node.line
        heredoc = next((r for r in redirects if r.heredoc is not None), None)
        if not words:
            for a in assigns:
                self.assign(a, line)
            return
        head = raw_text(words[0]) if isinstance(words[0], WordNode) else ""
        if head in ("export", "declare", "typeset", "local", "readonly"):
            self.run_declare(head, words[1:], line)
            return
        if head == "unset":
            for w in words[1:]:
                n = raw_text(w)
                if NAME.fullmatch(n):
                    self.vars.pop(n, None)
                    self.env.pop(n, None) if n in self.env else None
                    self.exported[n] = None
            return
        if head in ("exit", "return") and self.depth == 0:
            self.stopped_at = line
            raise Stop()
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
            if isinstance(w, ArrayNode):
                continue
            expanded.extend(self.expand_parts(w.parts, w.line))
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
        for opt, names in SLURM_VARS.items():
            if opt in opts:
                for n in names:
                    self.vars[n] = opts[opt]

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
            toks = Lexer(text, str(f)).tokens()
            self.source = str(f)
            self.run_list(Parser(toks, str(f)).program())
        finally:
            self.source = saved
            self.depth -= 1
        self.note(line, f"read `source {path.text}`")

    def run_declare(self, head: str, words, line: int):
        export = head == "export" or any(raw_text(w) in ("-x", "-gx") for w in words if isinstance(w, WordNode))
        for w in words:
            if isinstance(w, ArrayNode):
                self.assign(w, line, export)
                continue
            raw = raw_text(w)
            if raw.startswith("-"):
                continue
            m = ASSIGN.fullmatch(raw)
            if m:
                self.assign(Assign(w), line, export)
            elif NAME.fullmatch(raw) and export:
                v = self.lookup(raw)
                self.exported[raw] = "" if v is None else v

    def _assign_value(self, a, line: int):
        """(name, op, value) of NAME=word / NAME+=word / NAME=( words )."""
        if isinstance(a, ArrayNode):
            name, op = ASSIGN.fullmatch(a.raw).group(1, 2)
            vals = []
            for parts, raw, ln in a.items:
                for f in self.expand_parts_pieces(parts, ln):
                    vals.append(pieces_to_value(f))
            return name, op, vals
        w = a.word
        raw = raw_text(w)
        m = ASSIGN.fullmatch(raw)
        name, op = m.group(1), m.group(2)
        parts = strip_assign_prefix(w.parts, len(name) + len(op))
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
                value = concat(old, value)
        self.vars[name] = value
        if export or name in self.exported:
            self.exported[name] = value


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
            lx = Lexer(rw, source)
            parts = lx.word(stop="\0")
            for w in it.expand_parts(parts, k):
                if w.unknown and strict:
                    raise SpecError(source, w.unknown[0], "is not set; set it or write the value")
                out.append(w)
    return out
