"""`planner plan`: enumerate degrees, micro-batch, recompute, ZeRO stage, virtual stages and the
placement of stages on node groups; prune by memory, then by a compute lower bound; price the
survivors with the full estimate; re-partition the layers of the best ones exactly (DP, or
ILP), and return the top K plans that fit.

This module is the search's public entry: what the CLI, the sweep, the benchmark and the
validation scripts import. The search lives in the modules of this package, one concern each:
- space.py: SearchOptions, SearchResult, SearchProgress, the constants that bound the space,
  enumerate_space, stage_layouts (with order_key, distinct_orders), the families, space_worlds;
- bounds.py: the lower bounds (Bounds); minmax.py: the min-max solvers they use;
- screen.py: the memory screens (memory_screen and stage_rooms, fits_exactly, block
  recompute, peak_bytes_lower_bound); rooms.py: the memory caps of a family's cells and
  candidates, cached for the search (FamilyRooms);
- split.py: the stage split (initial_split, partition_problem, refine_partition,
  balanced_chunks, with_split);
- pricing.py: a candidate's estimate and exact re-split, the ILP cross-check;
- results.py: the plans found (Plans);
- best_first.py: the best-first loop (search);
- helper.py: the second process of a search with --jobs >= 2 (half the family screen, pricing
  ahead)."""

from __future__ import annotations

from .best_first import search
from .objective import GpuBudget
from .partition import partition_ilp
from .screen import peak_bytes_lower_bound
from .space import (CP_FULL_RANGE_SEQ_LENGTH, CP_MIN_SEQ_LENGTH, CP_SHORT_MAX, MAX_CP, MAX_PP, MICRO_BATCHES,
                    PROGRESS_INTERVAL_S, VPP_CHOICES, SearchOptions, SearchProgress, SearchResult, distinct_orders,
                    enumerate_space, order_key, space_worlds, stage_layouts)
from .split import balanced_chunks, partition_problem, refine_partition, with_split

__all__ = ["CP_FULL_RANGE_SEQ_LENGTH", "CP_MIN_SEQ_LENGTH", "CP_SHORT_MAX", "GpuBudget", "MAX_CP", "MAX_PP",
           "MICRO_BATCHES", "PROGRESS_INTERVAL_S", "SearchOptions", "SearchProgress", "SearchResult", "VPP_CHOICES",
           "balanced_chunks", "distinct_orders", "enumerate_space", "order_key", "partition_ilp",
           "partition_problem", "peak_bytes_lower_bound", "refine_partition", "search", "space_worlds",
           "stage_layouts", "with_split"]
