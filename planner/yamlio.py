"""Safe YAML loading with bounds, and field checking with 'did you mean' suggestions."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError

MAX_FILE_BYTES = 4 * 2**20  # a spec is a few KiB; anything beyond 4 MiB is not a spec
MAX_ALIASES = 64            # bounds alias expansion ("billion laughs")
MAX_NODES = 200_000         # bounds the composed document


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader (no object-building tags) that counts aliases and nodes while composing."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases; refusing to expand")
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise yaml.YAMLError(f"more than {MAX_NODES} nodes")
        return super().compose_node(parent, index)


def _count_expanded(obj: Any, budget: list[int]) -> None:
    """Walk the loaded object counting nodes, so aliases of aliases cannot blow up later."""
    budget[0] -= 1
    if budget[0] < 0:
        raise yaml.YAMLError(f"document expands to more than {MAX_NODES} values")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _count_expanded(v, budget)
    elif isinstance(obj, list):
        for v in obj:
            _count_expanded(v, budget)


def load_text(text: str, source: str) -> Any:
    if len(text.encode("utf-8", "replace")) > MAX_FILE_BYTES:
        raise SpecError(source, None, f"file larger than {MAX_FILE_BYTES} bytes; not a spec")
    try:
        loader = _BoundedLoader(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
        _count_expanded(data, [MAX_NODES])
    except yaml.YAMLError as exc:
        msg = " ".join(str(exc).split())
        raise SpecError(source, None, f"not valid YAML: {msg}") from None
    return data


def load_file(path: str | Path) -> Any:
    """Load a YAML (or JSON, which is YAML) file safely; errors name the file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(str(path), None, "file not found")
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SpecError(str(path), None, f"file is {size} bytes, larger than {MAX_FILE_BYTES}")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(str(path), None, "not UTF-8 text") from None
    except OSError as exc:
        raise SpecError(str(path), None, f"cannot read: {exc.strerror}") from None
    if p.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(str(path), None, f"not valid JSON: {exc}") from None
    return load_text(text, str(path))


def suggest(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_fields(data: Any, source: str, prefix: str, allowed: set[str], required: set[str]) -> dict:
    """Refuse a non-mapping, unknown fields (with a suggestion) and missing required fields."""
    where = prefix or None
    if not isinstance(data, dict):
        raise SpecError(source, where, f"found {type(data).__name__}, expected a mapping")
    for key in data:
        if not isinstance(key, str):
            raise SpecError(source, where, f"found key {key!r}, expected text keys")
        if key not in allowed:
            raise SpecError(source, _join(prefix, key),
                            f"unknown field{suggest(key, allowed)}; allowed: {', '.join(sorted(allowed))}")
    for key in sorted(required):
        if key not in data or data[key] is None:
            raise SpecError(source, _join(prefix, key), "required field is missing")
    return data


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def get_int(data: dict, key: str, source: str, prefix: str = "", default: Any = None,
            minimum: int = 1, maximum: int = 10**9) -> Any:
    v = data.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(source, _join(prefix, key), f"found {v!r}, expected an integer")
    if v < minimum or v > maximum:
        raise SpecError(source, _join(prefix, key), f"found {v}, expected an integer in [{minimum}, {maximum}]")
    return v


def get_float(data: dict, key: str, source: str, prefix: str = "", default: Any = None,
              minimum: float = 0.0, maximum: float = 1e30) -> Any:
    v = data.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SpecError(source, _join(prefix, key), f"found {v!r}, expected a number")
    if not (minimum <= v <= maximum):
        raise SpecError(source, _join(prefix, key), f"found {v}, expected a number in [{minimum}, {maximum}]")
    return float(v)


def get_bool(data: dict, key: str, source: str, prefix: str = "", default: bool = False) -> bool:
    v = data.get(key, default)
    if not isinstance(v, bool):
        raise SpecError(source, _join(prefix, key), f"found {v!r}, expected true or false")
    return v


def get_str(data: dict, key: str, source: str, prefix: str = "", default: Any = None,
            choices: tuple[str, ...] | None = None) -> Any:
    v = data.get(key, default)
    if v is None:
        return None
    if not isinstance(v, str):
        raise SpecError(source, _join(prefix, key), f"found {v!r}, expected text")
    if choices is not None and v not in choices:
        raise SpecError(source, _join(prefix, key),
                        f"found {v!r}, expected one of {', '.join(choices)}{suggest(v, choices)}")
    return v
