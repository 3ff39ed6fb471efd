"""Emit: tables, JSON, Megatron-LM launch arguments and scripts; parse Megatron launches."""
