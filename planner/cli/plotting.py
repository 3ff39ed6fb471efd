"""--plot of estimate, plan and sweep: the folder checked before any work, the pictures written
after it, each file said unless the output is JSON."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecError
from ..inputs import printable
from . import console


def check_folder(plot) -> None:
    """A --plot folder that can be written (nothing to check without --plot)."""
    if plot is not None:
        from ..emit.writer import check_plot_folder   # the cost model
        check_plot_folder(plot)


def estimate_plots(folder, e, priced) -> list:
    """timeline.png and memory.png of an estimate, and candidates.png of the priced plans."""
    from ..emit import plots   # matplotlib
    out = [plots.timeline(e, Path(folder) / "timeline.png"), plots.memory(e, Path(folder) / "memory.png")]
    if priced:
        out.append(plots.candidates(priced, Path(folder) / "candidates.png"))
    return out


def write_plots(folder: str, make, quiet: bool) -> None:
    """The files make() writes into folder, said one a line unless quiet."""
    try:
        out = make()
    except OSError as exc:
        raise SpecError("--plot", None, f"cannot write in {printable(folder)}: {exc.strerror or exc}") from None
    if not quiet:
        for f in out:
            console.print(f"wrote {f}", markup=False)
