"""Safe YAML loading with bounds, and field checking with 'did you mean' suggestions."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError
from .inputs import printable, read_regular_file

MAX_FILE_BYTES = 4 * 2**20  # a spec is a few KiB; anything beyond 4 MiB is not a spec
MAX_ALIASES = 64            # bounds alias expansion ("billion laughs")
MAX_NODES = 200_000         # bounds the composed document
# A spec nests at most four levels (cluster -> node_groups -> [i] -> field); 64 leaves room for
# any hand-written layout while keeping the recursive composer (and json) far from Python's
# recursion limit (1000), which deep nesting would otherwise hit as a RecursionError.
MAX_DEPTH = 64


class _DuplicateKey(yaml.YAMLError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader (no object-building tags) that counts aliases, nodes and nesting depth while
    composing, and refuses a key given twice in one mapping (PyYAML lets the last one win)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        self._nodes = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases; refusing to expand")
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise yaml.YAMLError(f"more than {MAX_NODES} nodes")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue   # merge keys ('<<') may be overridden; non-text keys are refused later
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                try:
                    again = key in first
                except TypeError:
                    continue
                if again:
                    raise _DuplicateKey(f"duplicate key {printable(key)!r} at line {line} "
                                        f"(first at line {first[key]}); give each key once")
                first[key] = line
        return super().construct_mapping(node, deep)


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
    source = printable(source)
    if len(text.encode("utf-8", "replace")) > MAX_FILE_BYTES:
        raise SpecError(source, None, f"file larger than {MAX_FILE_BYTES} bytes; not a spec")
    try:
        loader = _BoundedLoader(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
        _count_expanded(data, [MAX_NODES])
    except _DuplicateKey as exc:
        raise SpecError(source, None, str(exc)) from None
    except yaml.YAMLError as exc:
        raise SpecError(source, None, f"not valid YAML: {printable(_yaml_problem(exc))}") from None
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error as one short line: what, where (its own text quotes the source lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    return f"{context + ': ' if context else ''}{problem} (line {mark.line + 1}, column {mark.column + 1})"


def _json_depth(text: str) -> int:
    """Deepest nesting of [ and { outside strings (json.loads recurses once per level)."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _json_object(pairs: list) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(f"duplicate key {printable(k)!r}; give each key once")
        out[k] = v
    return out


def load_json_text(text: str, source: str) -> Any:
    source = printable(source)
    if _json_depth(text) > MAX_DEPTH:
        raise SpecError(source, None, f"not valid JSON for a spec: nested deeper than {MAX_DEPTH} levels")
    try:
        data = json.loads(text, object_pairs_hook=_json_object)
        _count_expanded(data, [MAX_NODES])
    except _DuplicateKey as exc:
        raise SpecError(source, None, str(exc)) from None
    except json.JSONDecodeError as exc:
        raise SpecError(source, None, f"not valid JSON: {printable(exc)}") from None
    except yaml.YAMLError as exc:
        raise SpecError(source, None, f"not valid JSON for a spec: {exc}") from None
    return data


def load_file(path: str | Path, expected: str = "a YAML or JSON spec file") -> Any:
    """Load a YAML (or JSON) spec file safely: a regular file of bounded size, UTF-8, bounded
    nesting, no duplicate keys; errors name the file."""
    raw = read_regular_file(path, MAX_FILE_BYTES, expected)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SpecError(printable(path), None, "not UTF-8 text") from None
    if Path(path).suffix == ".json":
        return load_json_text(text, str(path))
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
    missing = [key for key in sorted(required) if key not in data or data[key] is None]
    if len(missing) == 1:
        raise SpecError(source, _join(prefix, missing[0]), "required field is missing")
    if missing:
        # all of them in one line: fixing one at a time would take as many runs as fields
        raise SpecError(source, where, f"{len(missing)} required fields are missing: "
                        f"{', '.join(_join(prefix, k) for k in missing)}")
    return data


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _value(data: dict, key: str, default: Any) -> Any:
    """A field's value; an explicit null (`key:` or `key: null`) is the field left out, so it
    takes the default (a default of None stays None)."""
    v = data.get(key)
    return default if v is None else v


def get_int(data: dict, key: str, source: str, prefix: str = "", default: Any = None,
            minimum: int = 1, maximum: int = 10**9) -> Any:
    v = _value(data, key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(source, _join(prefix, key), f"found {v!r}, expected an integer")
    if v < minimum or v > maximum:
        raise SpecError(source, _join(prefix, key), f"found {v}, expected an integer in [{minimum}, {maximum}]")
    return v


def get_float(data: dict, key: str, source: str, prefix: str = "", default: Any = None,
              minimum: float = 0.0, maximum: float = 1e30) -> Any:
    v = _value(data, key, default)
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
    v = _value(data, key, default)
    if v is None:
        return None
    if not isinstance(v, str):
        raise SpecError(source, _join(prefix, key), f"found {v!r}, expected text")
    if choices is not None and v not in choices:
        raise SpecError(source, _join(prefix, key),
                        f"found {v!r}, expected one of {', '.join(choices)}{suggest(v, choices)}")
    return v
