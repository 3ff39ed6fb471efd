"""Words after expansion and the values they are made of.

A value is a str, a list (a bash array), an `Unknown` (what cannot be known without running
something) or a `Partial` (a string some of whose pieces are unknown).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Word:
    """A shell word after expansion. `unknown` names what its text depends on that cannot be
    known without running something (a variable no one set, `$(...)`); `text` then holds the
    word as written."""
    text: str
    unknown: tuple[str, ...] = ()
    line: int = 0


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
class Piece:
    """A piece of one field during expansion."""
    text: str
    split: bool                       # unquoted expansion: split on blanks
    unknown: tuple[Unknown, ...] = ()


def pieces_to_value(pieces: list[Piece]):
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


def concat(a, b):
    """Two str / Partial values joined."""
    segs = [x for v in (a, b) for x in (v.segments if isinstance(v, Partial) else (v,))]
    return Partial(tuple(segs)) if any(isinstance(x, Unknown) for x in segs) else "".join(segs)
