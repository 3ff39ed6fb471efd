"""The pipeline schedule as blocks on a timeline: which stage runs which micro-batch's forward
(F), backward (B) or weight-gradient (W) work when, for the pictures of `--plot`.

Each pipeline rank runs its operations in its schedule's order, each as soon as the rank is free
and its dependency is done (list scheduling):
- F of (chunk c, micro-batch j) on rank i needs F(c, j) on rank i-1; on rank 0 it needs
  F(c-1, j) on the last rank (interleaved chunks wrap around the pipeline).
- B(c, j) on rank i needs B(c, j) on rank i+1; on the last rank, B(c+1, j) on rank 0, or its
  own F of the last chunk.
- W(c, j) (ZB-H1 only) follows B(c, j) on the same rank and fills idle time.
Orders: 1F1B and ZB-H1 warm up with min(p - i - 1, m) forwards (Narayanan et al. 2021; Qi et
al. 2023); interleaved warms up (p - i - 1) * 2 + (v - 1) * p chunks and maps the k-th op to
chunk (k // p) % v of micro-batch (k // (p v)) p + k % p, as Megatron's schedules.py does.
With equal stages the 1F1B and interleaved makespans equal pipeline.py's closed forms
(tests/test_timeline.py); with unequal stages the closed form the step time uses is the larger
(it charges every fill step at the slowest stage). ZB-H1 here is a greedy list schedule (a W
runs only in an idle gap it fits, the rest at the end): it shows a larger bubble than the
closed form, which assumes Qi et al.'s hand-built schedule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    stage: int
    kind: str          # F | B | W
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


def _orders(p: int, m: int, v: int, schedule: str) -> list[list[tuple[str, int, int]]]:
    """Per rank, its (kind, chunk, micro-batch) operations in order (W listed after its B)."""
    out = []
    for i in range(p):
        if schedule == "interleaved" and v > 1:
            total = m * v
            warm = min((p - i - 1) * 2 + (v - 1) * p, total)

            def fwd(k):
                return ("F", (k // p) % v, (k // (p * v)) * p + k % p)

            def bwd(k):
                return ("B", v - 1 - (k // p) % v, (k // (p * v)) * p + k % p)
        else:
            total, warm = m, min(p - i - 1, m)

            def fwd(k):
                return ("F", 0, k)

            def bwd(k):
                return ("B", 0, k)
        ops = [fwd(k) for k in range(warm)]
        for k in range(total - warm):
            ops += [fwd(warm + k), bwd(k)]
        ops += [bwd(k) for k in range(total - warm, total)]
        out.append(ops)
    return out


def simulate(fwd_s: list[float], bwd_s: list[float], wgrad_s: list[float], comm_s: list[float],
             m: int, v: int = 1, schedule: str = "1f1b") -> list[Block]:
    """Blocks of one step's pipeline. Per rank i, per micro-batch over all its chunks: forward
    fwd_s[i], backward bwd_s[i] (of which wgrad_s[i] is weight-gradient work), exposed
    communication comm_s[i] (split evenly between F and B). A chunk takes 1/v of each."""
    p = len(fwd_s)
    v = v if schedule == "interleaved" else 1
    zb = schedule == "zb-h1"
    dur = {}
    for i in range(p):
        f = (fwd_s[i] + comm_s[i] / 2) / v
        b = (bwd_s[i] + comm_s[i] / 2) / v
        w = wgrad_s[i] / v if zb else 0.0
        dur[i] = {"F": f, "B": b - w, "W": w}
    orders = _orders(p, m, v, schedule)
    done: dict = {}            # (kind, rank, chunk, mb) -> end time
    pos = [0] * p
    free = [0.0] * p
    pending_w: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    blocks: list[Block] = []

    def dep(kind, i, c, j):
        if kind == "F":
            if i > 0:
                return ("F", i - 1, c, j)
            return ("F", p - 1, c - 1, j) if c > 0 else None
        if i < p - 1:
            return ("B", i + 1, c, j)
        return ("B", 0, c + 1, j) if c < v - 1 else ("F", p - 1, c, j)

    def run(i, kind, c, j, ready):
        start = max(free[i], ready)
        end = start + dur[i][kind]
        free[i] = end
        done[(kind, i, c, j)] = end
        blocks.append(Block(i, kind, j, c, start, end))

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            while pos[i] < len(orders[i]):
                kind, c, j = orders[i][pos[i]]
                d = dep(kind, i, c, j)
                if d is not None and d not in done:
                    break
                ready = done[d] if d is not None else 0.0
                # ZB-H1: weight-gradient work fills the wait for the next dependency
                while zb and pending_w[i] and free[i] + dur[i]["W"] <= ready:
                    wc, wj = pending_w[i].pop(0)
                    run(i, "W", wc, wj, 0.0)
                run(i, kind, c, j, ready)
                if zb and kind == "B":
                    pending_w[i].append((c, j))
                    if pos[i] + 1 < len(orders[i]) and len(pending_w[i]) > max(0, p - i - 1):
                        wc, wj = pending_w[i].pop(0)   # steady state: W right after its B
                        run(i, "W", wc, wj, 0.0)
                pos[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")   # a bug in the orders, not bad input
    for i in range(p):   # the rest of the deferred weight gradients
        while pending_w[i]:
            wc, wj = pending_w[i].pop(0)
            run(i, "W", wc, wj, 0.0)
    return blocks


def makespan(blocks: list[Block]) -> float:
    return max(b.end_s for b in blocks) - min(b.start_s for b in blocks)
