"""Cost model: memory, compute, communication and the pipeline schedule -> step time.
Every function is pure and states its units."""
