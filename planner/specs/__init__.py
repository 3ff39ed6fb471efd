"""Specs: YAML (or HF config.json) -> validated, frozen dataclasses."""
