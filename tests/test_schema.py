"""`planner schema`: the JSON Schemas describe exactly the fields the loaders accept, and every
bundled spec validates against them (with a small validator for the keywords the schemas use).
A schema that accepted a file the loader refuses, or the reverse, would mislead editors."""

import json
import re
import subprocess
import sys

import pytest

from planner.library import CLUSTERS_DIR, MODELS_DIR, PROFILES_DIR
from planner.specs.cluster import CLUSTER_FIELDS, GROUP_FIELDS, INTERCONNECT_FIELDS
from planner.specs.hardware import EFF_FIELDS, PROFILE_FIELDS
from planner.specs.model import MODEL_FIELDS
from planner.specs.schema import schema
from planner.yamlio import load_file


def errors(value, sch, path="$"):
    """The subset of JSON Schema the spec schemas use."""
    out = []
    if "oneOf" in sch:
        if sum(not errors(value, s, path) for s in sch["oneOf"]) != 1:
            out.append(f"{path}: matches none or several of oneOf")
        return out
    if "enum" in sch and value not in sch["enum"]:
        out.append(f"{path}: {value!r} not in {sch['enum']}")
    t = sch.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float)}
    if t and (not isinstance(value, types[t]) or (t in ("integer", "number") and isinstance(value, bool))):
        return out + [f"{path}: {value!r} is not {t}"]
    if t == "object":
        for k in sch.get("required", []):
            if k not in value:
                out.append(f"{path}: missing {k}")
        props = sch.get("properties", {})
        for k, v in value.items():
            if k in props:
                out += errors(v, props[k], f"{path}.{k}")
            elif sch.get("additionalProperties") is False:
                out.append(f"{path}: unexpected {k}")
    if t == "array":
        for i, v in enumerate(value):
            out += errors(v, sch.get("items", {}), f"{path}[{i}]")
    if t == "string" and "pattern" in sch and not re.search(sch["pattern"], value):
        out.append(f"{path}: {value!r} does not match {sch['pattern']}")
    if t in ("integer", "number"):
        if "minimum" in sch and value < sch["minimum"] or "maximum" in sch and value > sch["maximum"]:
            out.append(f"{path}: {value} out of range")
        if "exclusiveMinimum" in sch and value <= sch["exclusiveMinimum"]:
            out.append(f"{path}: {value} out of range")
    return out


def test_schema_fields_are_the_loaders_fields():
    m, c, p = schema("model"), schema("cluster"), schema("profile")
    assert set(m["properties"]) == MODEL_FIELDS
    assert set(c["properties"]) == CLUSTER_FIELDS
    assert set(c["properties"]["node_groups"]["items"]["properties"]) == GROUP_FIELDS
    assert set(c["properties"]["interconnect"]["items"]["properties"]) == INTERCONNECT_FIELDS
    assert set(p["properties"]) == PROFILE_FIELDS
    assert set(p["properties"]["efficiency"]["properties"]) == EFF_FIELDS


@pytest.mark.parametrize("kind,folder", [("model", MODELS_DIR), ("cluster", CLUSTERS_DIR), ("profile", PROFILES_DIR)])
def test_bundled_specs_validate(kind, folder):
    files = sorted(folder.glob("*.yaml"))
    assert files
    for f in files:
        assert errors(load_file(f), schema(kind)) == [], f


def test_schema_rejects_what_the_loader_rejects():
    c = load_file(CLUSTERS_DIR / "dgx-h100-x8.yaml")
    c["node_groups"][0]["nic_bandwidth"] = 400              # bare number: units required
    c["node_groups"][0]["nics"] = 8                         # unknown field
    errs = errors(c, schema("cluster"))
    assert any("nic_bandwidth" in e for e in errs) and any("unexpected nics" in e for e in errs)
    m = load_file(MODELS_DIR / "llama3-8b.yaml")
    m["normalization"] = "rmsnorm"
    assert errors(m, schema("model"))


def test_cli_prints_the_schema():
    out = subprocess.run([sys.executable, "-m", "planner.cli", "schema", "cluster"], capture_output=True, text=True)
    assert out.returncode == 0
    assert json.loads(out.stdout) == schema("cluster")
    bad = subprocess.run([sys.executable, "-m", "planner.cli", "schema", "modle"], capture_output=True, text=True)
    assert bad.returncode == 2 and "model" in bad.stderr and "Traceback" not in bad.stderr


def test_price_per_gpu_hour_is_read_and_refused_alike():
    """The optional price of a node group (USD per GPU-hour): loader and schema accept the
    same values, and a price that cannot be per GPU-hour is one line naming the field."""
    from planner.errors import SpecError
    from planner.specs.cluster import cluster_from_dict

    c = load_file(CLUSTERS_DIR / "dgx-h100-x8.yaml")
    assert cluster_from_dict(c, "c.yaml").node_groups[0].price_per_gpu_hour is None
    c["node_groups"][0]["price_per_gpu_hour"] = 2.49
    assert errors(c, schema("cluster")) == []
    assert cluster_from_dict(c, "c.yaml").node_groups[0].price_per_gpu_hour == 2.49
    for bad in ("2.49", -1, 5000, True, float("nan")):
        c["node_groups"][0]["price_per_gpu_hour"] = bad
        assert errors(c, schema("cluster")) or bad != bad, bad     # JSON has no NaN; the loader refuses it
        with pytest.raises(SpecError, match=r"c.yaml: node_groups\[0\].price_per_gpu_hour"):
            cluster_from_dict(c, "c.yaml")
