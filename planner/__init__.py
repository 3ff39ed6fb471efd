"""planner: an auto-parallel planner for large-model training.

Data flows one way:
specs (YAML -> validated dataclasses) -> strategy (one parallel config) -> placement
(states x axes -> modes) -> cost (memory, compute, comm, pipeline -> step time) -> search
(enumerate + ILP/DP) -> emit (tables, JSON, Megatron args).
"""

__version__ = "0.1.0"
