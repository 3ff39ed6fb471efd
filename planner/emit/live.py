"""The live line of a long search on a terminal (rich): candidates reached and priced, the best
plan so far and how much better an unpriced one could still be. Shown only once the search
has run SHOW_AFTER_S, replaced in place, gone when the search ends."""

from __future__ import annotations

# A search shorter than this prints nothing extra (most plans take well under it).
SHOW_AFTER_S = 1.0


def progress_text(p, objective: str) -> str:
    """'searching 12 s: 1,234 of 305,278 candidates reached, 57 priced; best 14.270 s/step;
    bound gap 3.2%' (p: search.planner.SearchProgress)."""
    if p.best is None:
        best = "no plan fits yet"
    elif objective == "cost":
        best = f"best ${p.best:.3f}/M tokens ({p.best_step_s:.3f} s/step)"
    else:
        best = f"best {p.best_step_s:.3f} s/step"
    gap = "" if p.gap is None else f"; bound gap {p.gap * 100:.1f}%"
    return (f"searching {p.seconds:.0f} s: {p.reached:,} of {p.candidates:,} candidates reached, "
            f"{p.priced:,} priced; {best}{gap}")


class LiveSearch:
    """A progress callback for search(): the first call after SHOW_AFTER_S starts a transient
    rich Live on `console`; `with` stops it (its line is erased)."""

    def __init__(self, console, objective: str, show_after_s: float = SHOW_AFTER_S):
        self.console, self.objective, self.show_after_s = console, objective, show_after_s
        self.live = None

    def __call__(self, p) -> None:
        if p.seconds < self.show_after_s:
            return
        from rich.text import Text
        text = Text(progress_text(p, self.objective), no_wrap=True, overflow="ellipsis")
        if self.live is None:
            from rich.live import Live
            self.live = Live(text, console=self.console, transient=True, auto_refresh=False)
            self.live.start()
        self.live.update(text, refresh=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
