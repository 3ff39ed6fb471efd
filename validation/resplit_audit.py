"""How far the priced layer split is from the best split of the whole step, near #1.

Usage: python validation/resplit_audit.py MODEL CLUSTER GLOBAL_BATCH SEQ [--within F]

The search prices each candidate on the split of least step time (search/partition.py: the
pipeline (m - 1/v) max t_i + sum t_i / v, with each layer's per-micro-batch exposure as on the
starting split, plus the largest stage's after-step term: the per-step DP collectives not
hidden under the last micro-batch's backward, the optimizer step). An estimate of another split
prices everything anew, so this checks the partition's objective against `estimate` itself:
it runs the search (jobs 1), then for every candidate priced that fits with margin within F
(default 6%) of #1 it climbs from its priced split, moving vpp layers (a layer with
--uneven-chunks) across one stage boundary at a time while the estimated step falls and every
stage still fits with margin. Printed: how many such candidates a re-split improves, the
largest gain, and whether any re-split beats #1 (the search would then have missed a faster
plan; exit 1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.errors import InvalidStrategy  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.library import load_cluster_ref, load_model_ref  # noqa: E402
from planner.search.planner import SearchOptions, search  # noqa: E402
from planner.search.split import with_split  # noqa: E402


def climb(model, cluster, e, multiple: int):
    """The best step a boundary-by-boundary re-split reaches from e's split (fits with margin)."""
    s = e.strategy
    split, best = list(s.layers_per_stage or s.stage_layers(model)), e.step_time_s
    improved = True
    while improved:
        improved = False
        for i in range(len(split)):
            for j in (i - 1, i + 1):
                if not 0 <= j < len(split) or split[i] - multiple < s.vpp:
                    continue
                trial = list(split)
                trial[i] -= multiple
                trial[j] += multiple
                try:
                    e2 = estimate(model, cluster, with_split(s, tuple(trial)))
                except InvalidStrategy:
                    continue
                if e2.memory_verdict == "fits" and e2.step_time_s < best * (1 - 1e-12):
                    split, best, improved = trial, e2.step_time_s, True
    return best, tuple(split)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("cluster")
    ap.add_argument("global_batch", type=int)
    ap.add_argument("seq", type=int)
    ap.add_argument("--within", type=float, default=0.06)
    a = ap.parse_args()
    model, cluster = load_model_ref(a.model), load_cluster_ref(a.cluster)
    o = SearchOptions(global_batch_size=a.global_batch, seq_length=a.seq, jobs=1, top=1)
    r = search(model, cluster, o)
    top = r.plans[0].step_time_s
    near: dict = {}   # the fastest fitting split priced per candidate
    for e in r.priced_estimates:
        if e.memory_verdict == "fits" and e.step_time_s <= top * (1 + a.within):
            key = e.strategy.with_(layers_per_stage=None, chunk_layers=None)
            if key not in near or e.step_time_s < near[key].step_time_s:
                near[key] = e
    gains, beats = [], []
    for e in near.values():
        best, split = climb(model, cluster, e, 1 if o.uneven_chunks else e.strategy.vpp)
        if best < e.step_time_s:
            gains.append(e.step_time_s / best - 1)
        if best < top:
            beats.append((best, e.strategy, split))
    print(f"{a.model} on {a.cluster}, gbs {a.global_batch}, seq {a.seq}: #1 {top:.3f} s; "
          f"{len(near)} candidates priced within {a.within:.0%} of it; a re-split improves {len(gains)}"
          f" (largest gain {max(gains, default=0.0):.1%}); re-splits faster than #1: {len(beats)}")
    for best, s, split in beats:
        print(f"  {best:.3f} s: {s} on {split}")
    return 1 if beats else 0


if __name__ == "__main__":
    sys.exit(main())
