"""Shell words of a launch script: quoting, continuations, comments, variables. Nothing is
executed."""

from __future__ import annotations

import os
import re
import shlex

from ..errors import SpecError

# $NAME, ${NAME}, ${NAME:-default} / ${NAME-default} (shell default values)
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)


def _expand(text: str, source: str, env: dict, strict: bool = True) -> str:
    def sub(m):
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        if m.group(2) is not None:
            return m.group(2)
        if not strict:
            return m.group(0)
        raise SpecError(source, name, "environment variable is not set; set it or write the value")
    return _VAR.sub(sub, text)


def tokenize(text: str, source: str, env: dict | None = None) -> list[str]:
    """Shell words of a launch script, variables expanded. Assignments before the training
    script (NNODES=${NNODES:-8}, export X=1) define variables for the words after them; words
    before the launcher line are not needed, so their unknown variables are not an error."""
    return _tokenize(text, source, env)[0]


def _tokenize(text: str, source: str, env: dict | None = None) -> tuple[list[str], dict]:
    """(words, the variables the script assigns before its training script)."""
    env = dict(os.environ) if env is None else dict(env)
    assigned: dict = {}
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")   # backslash continuations
    try:
        lex = shlex.shlex(text, posix=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        words = list(lex)
    except ValueError as exc:
        raise SpecError(source, None, f"cannot split into shell words: {exc}") from None
    script = max((i for i, w in enumerate(words) if w.endswith(".py")), default=None)
    out = []
    for i, w in enumerate(words):
        before = script is not None and i < script
        m = _ASSIGN.fullmatch(w) if before else None
        if m:
            env[m.group(1)] = assigned[m.group(1)] = _expand(m.group(2), source, env, strict=False)
        elif before and i > 0 and words[i - 1] == "unset" and re.fullmatch(r"[A-Za-z_]\w*", w):
            env.pop(w, None)
            assigned[w] = None   # explicitly unset
        out.append(_expand(w, source, env, strict=not before))
    return out, assigned


