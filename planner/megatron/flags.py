"""Megatron-LM's argument table (flags_megatron.json, read once from a named Megatron-LM commit)
and an argparse-faithful reader of a launch's flags.

Megatron builds its parser with allow_abbrev=False, so a flag is recognised only when written in
full; anything else is refused, as Megatron's own argparse refuses it ("unrecognized arguments").
Values are converted with the flag's argparse type and checked against its choices. Nothing here
evaluates a value as code: list expressions of the `*_freq_type` flags ('([0]*3+[1]*58)*2'),
which Megatron passes to eval, are read with a small grammar of lists, '+' and '*'.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..bash.words import Word  # noqa: F401 (re-exported: the words of a launch)
from ..yamlio import suggest

TABLE_PATH = Path(__file__).with_name("flags_megatron.json")
COST_CLASSES = ("model", "strategy", "no-cost", "unmodelled")
# argparse's test for a value that looks like a negative number rather than an option
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d+(\.\d*)?[eE][-+]?\d+$")


@dataclass(frozen=True)
class Flag:
    """One argparse action of Megatron's parser."""
    options: tuple[str, ...]
    dest: str
    action: str                  # store | store_true | store_false | boolean_optional
    type: str | None             # argparse type's name (int, float, str, bool, tuple_type, ...)
    nargs: Any                   # None | '+' | '*' | '?' | int (store actions)
    choices: tuple | None
    default: Any
    group: str
    cost: str                    # model | strategy | no-cost | unmodelled
    why: str = ""

    @property
    def takes_value(self) -> bool:
        return self.action == "store"


@dataclass(frozen=True)
class Table:
    commit: str
    date: str
    flags: tuple[Flag, ...]
    by_option: dict = field(repr=False, hash=False, compare=False, default_factory=dict)
    by_dest: dict = field(repr=False, hash=False, compare=False, default_factory=dict)

    def __getitem__(self, option: str) -> Flag:
        return self.by_option[option]

    def __contains__(self, option: str) -> bool:
        return option in self.by_option


@lru_cache(maxsize=1)
def table() -> Table:
    doc = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    flags = []
    for e in doc["flags"]:
        ch = e.get("choices")
        flags.append(Flag(options=tuple(e["options"]), dest=e["dest"], action=e["action"], type=e.get("type"),
                          nargs=e.get("nargs"), choices=tuple(ch) if ch is not None else None,
                          default=e.get("default"), group=e.get("group") or "", cost=e["cost"], why=e.get("why", "")))
    t = Table(commit=doc["megatron_lm"]["commit"], date=doc["megatron_lm"]["date"], flags=tuple(flags))
    for f in flags:
        for o in f.options:
            t.by_option[o] = f
        t.by_dest[f.dest] = f
    return t


# ---- values -------------------------------------------------------------------------------

class FlagError(ValueError):
    """A value Megatron's argparse would refuse; the message says what was expected."""


def list_expression(text: str) -> list[int]:
    """'[0]*3+[1]*58', '([1]*3+[0]*1)*3', '[0,1,1]': lists of integers joined by '+' and
    repeated by '*'. A small recursive-descent reader (Megatron evals the text)."""
    s = text.replace(" ", "")
    pos = 0

    def expr() -> list[int]:
        nonlocal pos
        out = term()
        while pos < len(s) and s[pos] == "+":
            pos += 1
            out = out + term()
        return out

    def term() -> list[int]:
        nonlocal pos
        out = atom()
        while pos < len(s) and s[pos] == "*":
            pos += 1
            m = re.match(r"\d{1,6}", s[pos:])
            if not m:
                raise FlagError(f"{text!r}: expected a count after '*'")
            pos += m.end()
            out = out * int(m.group())
        return out

    def atom() -> list[int]:
        nonlocal pos
        if pos < len(s) and s[pos] == "(":
            pos += 1
            out = expr()
            if pos >= len(s) or s[pos] != ")":
                raise FlagError(f"{text!r}: unbalanced parentheses")
            pos += 1
            return out
        m = re.match(r"\[(-?\d+(?:,-?\d+)*)?\]", s[pos:])
        if not m:
            raise FlagError(f"{text!r}: expected a list such as [0]*3+[1]*58")
        pos += m.end()
        return [int(x) for x in m.group(1).split(",")] if m.group(1) else []

    out = expr()
    if pos != len(s):
        raise FlagError(f"{text!r}: unexpected {s[pos:]!r}")
    if len(out) > 1_000_000:
        raise FlagError(f"{text!r}: longer than a million entries")
    return out


def convert(flag: Flag, text: str) -> Any:
    """One value through the flag's argparse type, then its choices."""
    t = flag.type
    try:
        if t == "int":
            v: Any = int(text)
        elif t == "float":
            v = float(text)
        elif t == "bool":
            v = bool(text)             # argparse type=bool: any non-empty text is True
        elif t == "tuple_type":        # '127,0' or '(127,0)'
            v = tuple(int(x) for x in text.strip("()").split(","))
        elif t in ("moe_freq_type", "no_rope_freq_type", "la_freq_type"):
            v = list_expression(text) if "[" in text else int(text)
        else:
            v = text
    except ValueError as exc:
        if isinstance(exc, FlagError):
            raise
        want = {"int": "an integer", "float": "a number", "tuple_type": "integers separated by commas",
                "moe_freq_type": "an integer or a list expression", "no_rope_freq_type": "an integer or a list expression",
                "la_freq_type": "an integer or a list expression"}.get(t, "a value")
        raise FlagError(f"found {text!r}, expected {want}") from None
    if flag.choices is not None and v not in flag.choices:
        shown = [str(c) for c in flag.choices]
        raise FlagError(f"found {text!r}, expected one of {', '.join(shown)}{suggest(str(text), shown)}")
    return v


# ---- a launch's flags ---------------------------------------------------------------------

@dataclass
class ParsedFlags:
    values: dict = field(default_factory=dict)     # dest -> converted value (given flags only)
    given: dict = field(default_factory=dict)      # dest -> the option as written
    unknown: dict = field(default_factory=dict)    # dest -> names its value depends on
    errors: list = field(default_factory=list)     # (rule, message): what argparse refuses
    notes: list = field(default_factory=list)      # said, not refused
    passthrough: bool = False                      # "$@": the script's own arguments
    unrecognized: list = field(default_factory=list)   # (word, the flag before it or None)

    def unrecognized_messages(self) -> list[tuple[str, str]]:
        t = table()
        out = []
        groups: list[tuple[list[str], str | None]] = []
        for u, prev in self.unrecognized:      # consecutive stray words after one flag: one line
            if not u.startswith("-") and groups and not groups[-1][0][0].startswith("-") and groups[-1][1] == prev:
                groups[-1][0].append(u)
            else:
                groups.append(([u], prev))
        for us, prev in groups:
            u = us[0]
            if u.startswith("-"):
                hint = suggest(u.partition("=")[0], list(t.by_option))
                out.append(("unknown-flag", f"{u}: unknown flag for Megatron-LM {t.commit[:12]}{hint}"))
            else:
                after = f" (after {prev}, which takes {_arity(t.by_option[prev])})" if prev in t.by_option else ""
                # each stray word as argparse sees it: a quoted value split by an unquoted
                # expansion (${ARR[@]}, $VAR) arrives as several words
                words = " ".join(repr(w) for w in us)
                out.append(("unknown-flag", f"{words}: {len(us)} unrecognized argument{'s' if len(us) > 1 else ''}"
                                            f"{after}; Megatron takes no positional arguments: a value with spaces "
                                            "reaches it as one word only if quoted, and an array's elements only if "
                                            'expanded quoted ("${ARR[@]}")'))
        return out


def _arity(flag: Flag) -> str:
    n = flag.nargs
    if not flag.takes_value:
        return "no value"
    if n in (None, "?"):
        return "one value"
    return "one or more values" if n in ("+", "*") else f"{n} values"


def _looks_like_option(w: str) -> bool:
    return w.startswith("-") and len(w) > 1 and not _NEGATIVE_NUMBER.match(w)


def parse_flags(words: list[Word | str]) -> ParsedFlags:
    """Megatron's argparse over the words after the training script."""
    t = table()
    ws = [w if isinstance(w, Word) else Word(w) for w in words]
    out = ParsedFlags()
    prev: str | None = None
    i = 0
    while i < len(ws):
        w = ws[i]
        i += 1
        if w.text in ('"$@"', "$@", "$*"):
            out.passthrough = True
            continue
        if w.unknown and not w.text.startswith("-"):
            out.notes.append(f"{w.text} (line {w.line}) is not known ({', '.join(w.unknown)}); read as no words")
            continue
        if not _looks_like_option(w.text):
            out.unrecognized.append((w.text, prev))
            continue
        opt, eq, inline = w.text.partition("=")
        if not opt.startswith("--"):
            eq = ""
        flag = t.by_option.get(opt if eq else w.text)
        prev = opt if eq else w.text
        if flag is None:
            out.unrecognized.append((opt if eq else w.text, None))
            # argparse gives up on the rest; skip this flag's would-be values to report the others
            while i < len(ws) and not _looks_like_option(ws[i].text):
                i += 1
            continue
        if not flag.takes_value:
            if eq:
                out.errors.append(("flag-takes-no-value", f"{opt}: takes no value (found '={inline}')"))
                continue
            if flag.action == "boolean_optional":
                out.values[flag.dest] = not opt.startswith("--no-")
            else:
                out.values[flag.dest] = flag.action == "store_true"
            out.given[flag.dest] = opt
            continue
        # value-taking: argparse's nargs
        vals: list[Word] = []
        if eq:
            vals = [Word(inline, w.unknown, w.line)]
        else:
            n = flag.nargs
            if n in (None, "?") or isinstance(n, int):
                want = 1 if n in (None, "?") else n
                while len(vals) < want and i < len(ws) and not _looks_like_option(ws[i].text):
                    vals.append(ws[i])
                    i += 1
                if len(vals) < want and n != "?":
                    what = "one value" if want == 1 else f"{want} values"
                    out.errors.append(("flag-missing-value", f"{opt}: expected {what}"))
                    continue
            else:   # '+' or '*'
                while i < len(ws) and not _looks_like_option(ws[i].text):
                    vals.append(ws[i])
                    i += 1
                if n == "+" and not vals:
                    out.errors.append(("flag-missing-value", f"{opt}: expected at least one value"))
                    continue
        names = tuple(dict.fromkeys(x for v in vals for x in v.unknown))
        out.given[flag.dest] = opt
        if names:
            out.unknown[flag.dest] = names
            out.values.pop(flag.dest, None)
            continue
        out.unknown.pop(flag.dest, None)
        try:
            conv = [convert(flag, v.text) for v in vals]
        except FlagError as exc:
            out.errors.append(("flag-value", f"{opt}: {exc}"))
            continue
        single = flag.nargs in (None, "?") or eq and flag.nargs not in ("+", "*")
        out.values[flag.dest] = conv[0] if single and conv else (conv if conv else flag.default)
    return out
