"""Megatron's --pipeline-model-parallel-layout."""

from __future__ import annotations

import re

from ..errors import SpecError


def layout_stage_layers(layout: str, pp: int, source: str) -> tuple[list[int], int]:
    """Parse Megatron's --pipeline-model-parallel-layout ('Et*7|t*9|t*9|t*7L'): returns layers
    per pipeline rank (virtual segments of a rank summed) and the number of virtual stages."""
    segments = layout.replace(",", "").split("|")
    counts = []
    for seg in segments:
        n = 0
        for m in re.finditer(r"([EtLm])(?:\*([0-9]+))?", seg):
            if m.group(1) == "t":
                n += int(m.group(2) or 1)
        if re.sub(r"([EtLm])(\*[0-9]+)?", "", seg).strip():
            raise SpecError(source, "--pipeline-model-parallel-layout",
                            f"segment {seg!r}: expected symbols E, t, L, m with optional *count")
        counts.append(n)
    if len(counts) % pp != 0:
        raise SpecError(source, "--pipeline-model-parallel-layout",
                        f"{len(counts)} segments, not divisible by pipeline size {pp}")
    v = len(counts) // pp
    per_rank = [sum(counts[r + k * pp] for k in range(v)) for r in range(pp)]
    return per_rank, v
