"""`planner plan`: enumerate degrees, micro-batch, recompute, ZeRO stage, virtual stages and the
placement of stages on node groups; prune by memory, then by a compute lower bound; price the
survivors with the full estimate; re-partition the layers of the best ones exactly (DP, or
ILP), and return the top K plans that fit.

The search lives in the modules of this package, one concern each; this module re-exports
what other code and the tests import from it:
- space.py: SearchOptions, SearchResult, SearchProgress, the constants that bound the space,
  enumerate_space, stage_layouts (with order_key, distinct_orders), the families, space_worlds;
- bounds.py: the lower bounds (_Bounds and the min-max solvers it uses);
- screen.py: the memory screens (_memory_screen, _fits_exactly, block recompute,
  peak_bytes_lower_bound);
- split.py: the stage split (_initial_split, partition_problem, refine_partition,
  balanced_chunks, with_split);
- pricing.py: a candidate's estimate and exact re-split, the ILP cross-check;
- results.py: the plans found (_Plans);
- best_first.py: the best-first loop (search)."""

from __future__ import annotations

import time  # noqa: F401  (tests set planner.search.planner.time.perf_counter)

from .best_first import search
from .bounds import _Bounds, _mixed_count_minmax, _mixed_floor  # noqa: F401
from .objective import GpuBudget
from .partition import partition_ilp
from .results import _Plans  # noqa: F401
from .screen import _memory_screen, peak_bytes_lower_bound  # noqa: F401
from .space import (CP_FULL_RANGE_SEQ_LENGTH, CP_MIN_SEQ_LENGTH, CP_SHORT_MAX, MAX_CP, MAX_PP, MICRO_BATCHES,
                    PROGRESS_INTERVAL_S, VPP_CHOICES, SearchOptions, SearchProgress, SearchResult, distinct_orders,
                    enumerate_space, order_key, space_worlds, stage_layouts)
from .split import _initial_split, balanced_chunks, partition_problem, refine_partition, with_split  # noqa: F401

__all__ = ["CP_FULL_RANGE_SEQ_LENGTH", "CP_MIN_SEQ_LENGTH", "CP_SHORT_MAX", "GpuBudget", "MAX_CP", "MAX_PP",
           "MICRO_BATCHES", "PROGRESS_INTERVAL_S", "SearchOptions", "SearchProgress", "SearchResult", "VPP_CHOICES",
           "balanced_chunks", "distinct_orders", "enumerate_space", "order_key", "partition_ilp",
           "partition_problem", "peak_bytes_lower_bound", "refine_partition", "search", "space_worlds",
           "stage_layouts", "with_split"]
