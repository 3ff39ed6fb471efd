"""Emit: tables, JSON, plots and the atomic writer of plan folders (Megatron launches: planner.megatron)."""
