"""Pipeline layouts as Megatron builds them.

- `--pipeline-model-parallel-layout`: the grammar of
  megatron/core/transformer/pipeline_parallel_layer_layout.py (PipelineParallelLayerLayout):
  ',' is cosmetic; `(...)*N` repeats a group (groups do not nest: Megatron's pattern
  `\\(([^)]+)\\)\\*(\\d+)` is applied once, left to right), then `x*N` repeats one symbol; '|'
  separates stages; symbols E (embedding), t (decoder layer), m (MTP layer), L (loss); a stage
  may be empty. The stages are pp x vpp in Megatron's order: stage k is virtual chunk k // pp of
  pipeline rank k % pp. validate_layer_layout's checks are `layout_problems`.
- `--decoder-first/last-pipeline-num-layers` and `--account-for-embedding/loss-in-pipeline-split`:
  get_num_layers_to_build in megatron/core/transformer/transformer_block.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_REPEAT = re.compile(r"(.)\*(\d+)")
SYMBOLS = "EtmL"
MAX_LAYOUT_SYMBOLS = 1_000_000


class LayoutError(ValueError):
    """A layout Megatron would refuse; the message says why."""


@dataclass(frozen=True)
class Layout:
    stages: tuple[str, ...]      # unrolled symbols per stage, Megatron's order
    pp: int

    @property
    def vpp(self) -> int:
        return len(self.stages) // self.pp

    @property
    def chunk_layers(self) -> tuple[int, ...]:
        """Decoder layers per stage (segment k: chunk k // pp of rank k % pp)."""
        return tuple(s.count("t") for s in self.stages)

    @property
    def per_rank(self) -> tuple[int, ...]:
        return rank_sums(self.chunk_layers, self.pp)

    def rank_chunks(self, rank: int) -> tuple[str, ...]:
        return self.stages[rank::self.pp]


def rank_sums(chunk_layers, pp: int) -> tuple[int, ...]:
    return tuple(sum(chunk_layers[r::pp]) for r in range(pp))


def unroll(text: str) -> str:
    """Megatron's parse_str_to_list before the split on '|'."""
    s = text.replace(",", "")
    if len(s) > 10_000:
        raise LayoutError("longer than 10,000 characters")

    def rep(m):
        n = int(m.group(2))
        if len(m.group(1)) * n > MAX_LAYOUT_SYMBOLS:
            raise LayoutError(f"{m.group(0)!r} unrolls to more than {MAX_LAYOUT_SYMBOLS} symbols")
        return m.group(1) * n
    s = _GROUP.sub(rep, s)
    s = _REPEAT.sub(rep, s)
    return s


def parse_layout(text: str, pp: int) -> Layout:
    s = unroll(text)
    stages = tuple(s.split("|"))
    for st in stages:
        bad = sorted(set(st) - set(SYMBOLS))
        if bad:
            hint = " (groups do not nest in Megatron's grammar)" if set(bad) & set("()*") else ""
            raise LayoutError(f"invalid layer character {bad[0]!r} in stage {st!r}; known: E, t, m, L{hint}")
    if pp < 1 or len(stages) % pp:
        raise LayoutError(f"{len(stages)} stages, not divisible by pipeline_model_parallel_size ({pp})")
    return Layout(stages, pp)


def layout_problems(lay: Layout, num_layers: int, mtp_num_layers: int) -> list[str]:
    """validate_layer_layout: embedding first and once, loss last and once, decoder and MTP
    counts, MTP after every decoder layer, in the last virtual stage of a rank, all in one."""
    flat = "".join(lay.stages)   # layer-id order: chunk by chunk, rank by rank = stage order
    out = []
    if not flat or flat[0] != "E":
        out.append(f"the first layer must be the embedding (E), found {flat[:1] or 'nothing'!r}")
    if not flat or flat[-1] != "L":
        out.append(f"the last layer must be the loss (L), found {flat[-1:] or 'nothing'!r}")
    if flat.count("E") != 1:
        out.append(f"the embedding (E) must appear exactly once, found {flat.count('E')}")
    if flat.count("L") != 1:
        out.append(f"the loss (L) must appear exactly once, found {flat.count('L')}")
    if flat.count("t") != num_layers:
        out.append(f"the layout places {flat.count('t')} decoder layers, num_layers is {num_layers}")
    if flat.count("m") != (mtp_num_layers or 0):
        out.append(f"the layout places {flat.count('m')} MTP layers (m), mtp_num_layers is {mtp_num_layers or 0}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        out.append("decoder layers must be placed before MTP layers")
    for r in range(lay.pp):
        chunks = lay.rank_chunks(r)
        if any("m" in c for c in chunks[:-1]):
            out.append(f"MTP layers must be in the last virtual stage of pipeline rank {r}")
        if "m" in chunks[-1] and chunks[-1].count("m") != (mtp_num_layers or 0):
            out.append("all MTP layers must be in one virtual stage")
    return out


def split_chunk_layers(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None,
                       account_for_embedding: bool, account_for_loss: bool) -> tuple[tuple[int, ...], list[str]]:
    """Decoder layers per (rank, chunk) in layout-segment order, as get_num_layers_to_build
    computes them, and the assertions it would fail."""
    problems: list[str] = []
    if first is not None or last is not None:
        if account_for_embedding or account_for_loss:
            problems.append("uneven first/last stages cannot be combined with "
                            "--account-for-embedding/loss-in-pipeline-split")
        rest, left = num_layers, pp
        if first is not None:
            rest, left = rest - first, left - 1
        if last is not None:
            rest, left = rest - last, left - 1
        if left > 0:
            if rest % left:
                problems.append(f"{rest} middle layers are not divisible by the {left} middle pipeline stages")
            mid = rest // left if left else 0
        else:
            mid = 0
            if rest:
                problems.append(f"{rest} layers left over with no middle pipeline stage")
        per_rank = [mid] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        n = num_layers + account_for_embedding + account_for_loss
        if n % pp:
            problems.append(f"number of layers ({n}) is not divisible by the pipeline-model-parallel size ({pp})")
        per_rank = [n // pp] * pp
    chunks = [[0] * vpp for _ in range(pp)]
    for r, n in enumerate(per_rank):
        if n % vpp:
            problems.append(f"pipeline rank {r} has {n} layers, not divisible by {vpp} virtual stages")
        for c in range(vpp):
            chunks[r][c] = n // vpp
    if account_for_embedding:
        chunks[0][0] -= 1
    if account_for_loss:
        chunks[-1][-1] -= 1
    if any(x < 0 for row in chunks for x in row):
        problems.append("not enough layers in the first or last virtual stage for the embedding/loss")
    return tuple(chunks[r][c] for c in range(vpp) for r in range(pp)), problems


def layout_string(chunk_layers, mtp_num_layers: int = 0) -> str:
    """A layout that Megatron unrolls to exactly these decoder counts per stage: 'E' on the
    first stage, MTP layers (if any) and 'L' on the last."""
    n = len(chunk_layers)
    mtp_num_layers = mtp_num_layers or 0   # a model without MTP may say None
    out = []
    for k, c in enumerate(chunk_layers):
        seg = ("E" if k == 0 else "") + ("t" if c == 1 else (f"t*{c}" if c > 1 else ""))
        if k == n - 1:
            seg += ("m" if mtp_num_layers == 1 else (f"m*{mtp_num_layers}" if mtp_num_layers > 1 else "")) + "L"
        out.append(seg)
    return "|".join(out)
