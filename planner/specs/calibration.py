"""The `calibration:` block of a cluster YAML (written by `planner calibrate`) and how its values
are applied to the node groups when the cluster is loaded.

Every parameter is an *attained* figure measured on the user's own cluster, stored with where it
came from. On load each node group gets a calibrated copy of its GPU profile (named so):

  gpus.<profile name>                         (one GPU kind, all groups that use it)
    compute_time_scale       -> GPUProfile.compute_time_scale (measured / modelled compute time)
    cuda_context             -> GPUProfile.cuda_context_bytes (memory outside the allocator's tensors
                                that is not per communicator)
    fragmentation_fraction   -> GPUProfile.fragmentation_fraction
  node_groups.<group name>
    scale_up_bus_bandwidth   NCCL bus bandwidth per GPU inside one node
                             -> efficiency.scale_up = value / intra_node_bandwidth
    scale_up_latency         -> GPUProfile.scale_up_latency_s
    scale_out_bus_bandwidth  NCCL bus bandwidth per node of a ring over every GPU of each node
                             -> efficiency.network = value / (nics_per_node x nic_bandwidth)
    nic_latency              -> NodeGroup.nic_latency_s
  interconnect[] (between: [a, b])
    bus_bandwidth            per node, between the two groups
                             -> Interconnect.bandwidth = value / min(network efficiency of a, b)
    latency                  -> Interconnect.latency_s

The bandwidths are stored as attained bus bandwidths, not as efficiencies, because a measured
value may exceed the naive link figure: with in-network reduction (NVLink SHARP inside a node,
InfiniBand SHARP across nodes) an all-reduce sends each element about once instead of 2(n-1)/n
times, so its nccl-tests bus bandwidth can reach ~2x the per-direction link rate. A profile's
efficiency field is bounded by 1.0 when written by hand; a calibrated one may exceed it, up to
MAX_BUS_OVER_LINE_RATE.

The conversions mirror how planner/cost/comm.py derives attained bus bandwidth today
(intra x efficiency.scale_up; node egress x efficiency.network x j / G; interconnect x the
groups' network efficiency); tests/test_calibrate.py checks them against comm.group_link.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..errors import SpecError
from ..units import UnitError, parse_bandwidth, parse_size, parse_time

# In-network reduction (NVLS, SHARP) can lift an all-reduce's bus bandwidth to 2(n-1)/n x the
# link rate, < 2x (nccl-tests doc/PERFORMANCE.md defines busbw as algbw x 2(n-1)/n).
MAX_BUS_OVER_LINE_RATE = 2.0
# A GPU slower than 1/5 of what its profile predicts is a broken run or a log of another launch;
# refuse to bake it into a cluster rather than learn it (planner assumption).
MAX_COMPUTE_TIME_SCALE = 5.0
# A per-message latency above 1 ms is no fabric's (NVLink ~ 1-3 us, InfiniBand ~ 2-10 us).
MAX_LATENCY_S = 1e-3
# The profile loader's own bound on the fragmentation allowance (planner/specs/hardware.py).
MAX_FRAGMENTATION_FRACTION = 0.5

GPU_FIELDS = ("compute_time_scale", "cuda_context", "fragmentation_fraction")
GROUP_FIELDS = ("scale_up_bus_bandwidth", "scale_up_latency", "scale_out_bus_bandwidth", "nic_latency")
INTERCONNECT_FIELDS = ("bus_bandwidth", "latency")
BLOCK_FIELDS = {"created", "tool", "gpus", "node_groups", "interconnect", "notes"}
ENTRY_FIELDS = {"value", "profile", "from", "left_at_profile"}
SOURCE_FIELDS = {"file", "lines", "date", "sha256", "what"}
UNITS = {"compute_time_scale": "ratio", "cuda_context": "size", "fragmentation_fraction": "ratio",
         "scale_up_bus_bandwidth": "bandwidth", "scale_out_bus_bandwidth": "bandwidth",
         "bus_bandwidth": "bandwidth", "scale_up_latency": "time", "nic_latency": "time", "latency": "time"}


class Key(NamedTuple):
    """One calibratable parameter: scope (gpus | node_groups | interconnect), target (a GPU
    profile name, a node group name, or 'a,b' for an interconnect) and field."""
    scope: str
    target: str
    field: str

    def __str__(self) -> str:
        return f"{self.scope}[{self.target}].{self.field}"


@dataclass(frozen=True)
class Source:
    file: str
    lines: str          # e.g. "212-1190"
    date: str           # when measured: from the file's own timestamps, else its modification date
    what: str = ""      # e.g. "median of 92 steady-state iteration lines"
    sha256: str = ""    # first 16 hex digits of the file's SHA-256


@dataclass(frozen=True)
class Value:
    value: float                    # SI units: bytes/s, s, bytes, or a ratio
    sources: tuple[Source, ...] = ()


@dataclass(frozen=True)
class Calibration:
    values: tuple[tuple[Key, Value], ...] = ()
    left_at_profile: tuple[tuple[Key, str], ...] = ()
    created: str = ""
    notes: str = ""

    def get(self, key: Key) -> Value | None:
        for k, v in self.values:
            if k == key:
                return v
        return None

    def as_dict(self) -> dict:
        return dict(self.values)


# ---- the one place that reads and writes a profile's memory overheads (the cost model's names
# for them may change; only these two functions then change)

def memory_overheads(gpu) -> tuple[float, float]:
    """(CUDA context and other fixed memory outside the tensors in bytes, fragmentation fraction:
    reserved beyond allocated over allocated) of a GPU profile."""
    return gpu.cuda_context_bytes, gpu.fragmentation_fraction


def with_memory_overheads(gpu, context_bytes: float | None, fragmentation: float | None):
    r0, f0 = memory_overheads(gpu)
    return replace(gpu, cuda_context_bytes=r0 if context_bytes is None else context_bytes,
                   fragmentation_fraction=f0 if fragmentation is None else fragmentation)


# ---- what the cluster (profile values, or calibrated ones) says each parameter is

def _ic(cluster, target: str):
    a, _, b = target.partition(",")
    ic = cluster.interconnect(a, b)
    if ic is None:
        raise KeyError(target)
    return ic, (cluster.group(a), cluster.group(b))


def current_value(cluster, key: Key) -> float:
    """The attained figure `key` stands for, as `cluster` gives it now (SI units)."""
    if key.scope == "gpus":
        gpu = next(g.gpu for g in cluster.node_groups if base_gpu_name(g.gpu) == key.target)
        if key.field == "compute_time_scale":
            return gpu.compute_time_scale
        reserve, frag = memory_overheads(gpu)
        return reserve if key.field == "cuda_context" else frag
    if key.scope == "node_groups":
        g = cluster.group(key.target)
        return {"scale_up_bus_bandwidth": lambda: g.intra_node_bandwidth_bytes_per_s * g.gpu.efficiency.scale_up,
                "scale_up_latency": lambda: g.gpu.scale_up_latency_s,
                "scale_out_bus_bandwidth": lambda: g.node_egress_bytes_per_s * g.gpu.efficiency.network,
                "nic_latency": lambda: g.nic_latency_s}[key.field]()
    ic, pair = _ic(cluster, key.target)
    if key.field == "bus_bandwidth":
        return ic.bandwidth_bytes_per_s * min(g.gpu.efficiency.network for g in pair)
    return ic.latency_s


def line_rate(cluster, key: Key) -> float | None:
    """The datasheet figure a bandwidth parameter is bounded by (bytes/s), None for others."""
    if key.scope == "node_groups" and key.field == "scale_up_bus_bandwidth":
        return cluster.group(key.target).intra_node_bandwidth_bytes_per_s
    if key.scope == "node_groups" and key.field == "scale_out_bus_bandwidth":
        return cluster.group(key.target).node_egress_bytes_per_s
    if key.scope == "interconnect" and key.field == "bus_bandwidth":
        return _ic(cluster, key.target)[0].bandwidth_bytes_per_s
    return None


def bounds(cluster, key: Key) -> tuple[float, float]:
    """Physically possible values of a parameter (lower bound exclusive of 0)."""
    if key.field == "compute_time_scale":
        gpu = next(g.gpu for g in cluster.node_groups if base_gpu_name(g.gpu) == key.target)
        e = gpu.efficiency
        # below this some kernel class would run faster than its datasheet peak
        return max(e.matmul, e.memory_bandwidth, e.flash_attention), MAX_COMPUTE_TIME_SCALE
    if key.field == "fragmentation_fraction":
        return 0.0, MAX_FRAGMENTATION_FRACTION
    if key.field == "cuda_context":
        gpu = next(g.gpu for g in cluster.node_groups if base_gpu_name(g.gpu) == key.target)
        return 0.0, gpu.memory_bytes
    if UNITS[key.field] == "time":
        return 0.0, MAX_LATENCY_S
    return 0.0, MAX_BUS_OVER_LINE_RATE * line_rate(cluster, key)


CALIBRATED_TAG = " (calibrated: "


def base_gpu_name(gpu) -> str:
    """The profile name of a GPU, without the calibrated tag a calibrated copy carries."""
    return gpu.name.split(CALIBRATED_TAG, 1)[0]


def all_keys(cluster) -> list[Key]:
    """Every parameter a cluster has, in a stable order."""
    keys, seen = [], set()
    for g in cluster.node_groups:
        name = base_gpu_name(g.gpu)
        if name not in seen:
            seen.add(name)
            keys += [Key("gpus", name, f) for f in GPU_FIELDS]
    for g in cluster.node_groups:
        keys += [Key("node_groups", g.name, f) for f in GROUP_FIELDS]
    for ic in cluster.interconnects:
        keys += [Key("interconnect", f"{ic.a},{ic.b}", f) for f in INTERCONNECT_FIELDS]
    return keys


def apply_calibration(cluster, cal: Calibration):
    """The cluster with every calibrated value in place: per node group a calibrated copy of its
    GPU profile, and interconnects rescaled so that each keeps its own attained bandwidth (its
    calibrated one, or the one it had) when a group's network efficiency changes."""
    vals = cal.as_dict()
    if not vals:
        return cluster
    ic_target = {}
    for ic in cluster.interconnects:
        k = Key("interconnect", f"{ic.a},{ic.b}", "bus_bandwidth")
        ic_target[(ic.a, ic.b)] = vals[k].value if k in vals else current_value(cluster, k)
    groups = []
    for g in cluster.node_groups:
        name = base_gpu_name(g.gpu)
        got = {k.field: v.value for k, v in vals.items()
               if (k.scope == "gpus" and k.target == name) or (k.scope == "node_groups" and k.target == g.name)}
        if not got:
            groups.append(g)
            continue
        eff = g.gpu.efficiency
        if "scale_up_bus_bandwidth" in got:
            eff = replace(eff, scale_up=got["scale_up_bus_bandwidth"] / g.intra_node_bandwidth_bytes_per_s)
        if "scale_out_bus_bandwidth" in got:
            eff = replace(eff, network=got["scale_out_bus_bandwidth"] / g.node_egress_bytes_per_s)
        gpu = with_memory_overheads(g.gpu, got.get("cuda_context"), got.get("fragmentation_fraction"))
        gpu = replace(gpu, name=f"{name}{CALIBRATED_TAG}{g.name})", efficiency=eff,
                      compute_time_scale=got.get("compute_time_scale", g.gpu.compute_time_scale),
                      scale_up_latency_s=got.get("scale_up_latency", g.gpu.scale_up_latency_s))
        groups.append(replace(g, gpu=gpu, nic_latency_s=got.get("nic_latency", g.nic_latency_s)))
    out = replace(cluster, node_groups=tuple(groups))
    links = []
    for ic in cluster.interconnects:
        eff = min(out.group(ic.a).gpu.efficiency.network, out.group(ic.b).gpu.efficiency.network)
        lat = vals.get(Key("interconnect", f"{ic.a},{ic.b}", "latency"))
        links.append(replace(ic, bandwidth_bytes_per_s=ic_target[(ic.a, ic.b)] / eff,
                             latency_s=lat.value if lat else ic.latency_s))
    return replace(out, interconnects=tuple(links))


# ---- YAML text <-> values

def format_value(field: str, v: float) -> Any:
    unit = UNITS[field]
    if unit == "bandwidth":
        return f"{v / 1e9:.4g} GB/s"
    if unit == "time":
        return f"{v * 1e6:.4g} us"
    if unit == "size":
        return f"{v / 2**30:.4g} GiB"
    return float(f"{v:.5g}")


def parse_value(field: str, raw: Any, source: str, where: str) -> float:
    unit = UNITS[field]
    try:
        if unit == "bandwidth":
            return parse_bandwidth(raw)
        if unit == "time":
            return parse_time(raw)
        if unit == "size":
            return parse_size(raw)
    except UnitError as exc:
        raise SpecError(source, where, str(exc)) from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise SpecError(source, where, f"found {raw!r}, expected a number")
    return float(raw)


def _parse_sources(raw: Any, source: str, where: str) -> tuple[Source, ...]:
    from ..yamlio import check_fields
    if not isinstance(raw, list) or not raw:
        raise SpecError(source, where, "expected a non-empty list of {file, lines, date, what, sha256}")
    out = []
    for i, s in enumerate(raw):
        check_fields(s, source, f"{where}[{i}]", SOURCE_FIELDS, {"file", "lines", "date"})
        for k in s:
            if not isinstance(s[k], (str, int)) or isinstance(s[k], bool):
                raise SpecError(source, f"{where}[{i}].{k}", f"found {s[k]!r}, expected text")
        out.append(Source(file=str(s["file"]), lines=str(s["lines"]), date=str(s["date"]),
                          what=str(s.get("what", "")), sha256=str(s.get("sha256", ""))))
    return tuple(out)


def _entries(data: Any, source: str, where: str, fields: tuple[str, ...]) -> dict:
    from ..yamlio import check_fields
    return check_fields(data, source, where, set(fields), set())


def parse_calibration(data: Any, source: str, cluster) -> Calibration:
    """Validate a `calibration:` block against the (uncalibrated) cluster it belongs to."""
    from ..yamlio import check_fields, suggest
    check_fields(data, source, "calibration", BLOCK_FIELDS, set())
    values, left = [], []

    def entry(key: Key, raw: Any, where: str):
        check_fields(raw, source, where, ENTRY_FIELDS, set())
        if ("value" in raw) == ("left_at_profile" in raw):
            raise SpecError(source, where, "expected either value (with from) or left_at_profile (with the reason)")
        if "left_at_profile" in raw:
            if not isinstance(raw["left_at_profile"], str):
                raise SpecError(source, f"{where}.left_at_profile", "expected the reason as text")
            left.append((key, raw["left_at_profile"]))
            return
        v = parse_value(key.field, raw["value"], source, f"{where}.value")
        lo, hi = bounds(cluster, key)
        if not (lo < v <= hi) and not (key.field == "fragmentation_fraction" and v == 0.0):
            shown = format_value(key.field, lo), format_value(key.field, hi)
            raise SpecError(source, f"{where}.value", f"found {raw['value']!r}, expected a value in "
                            f"({shown[0]}, {shown[1]}]")
        if "from" not in raw:
            raise SpecError(source, f"{where}.from", "required: where the value was measured")
        values.append((key, Value(v, _parse_sources(raw["from"], source, f"{where}.from"))))

    gpu_names = sorted({base_gpu_name(g.gpu) for g in cluster.node_groups})
    gpus = data.get("gpus") or {}
    if not isinstance(gpus, dict):
        raise SpecError(source, "calibration.gpus", "expected a mapping of GPU profile name -> values")
    for name, fields in gpus.items():
        if name not in gpu_names:
            raise SpecError(source, f"calibration.gpus.{name}",
                            f"no node group uses this GPU profile{suggest(str(name), gpu_names)}; used: {', '.join(gpu_names)}")
        for f, raw in _entries(fields, source, f"calibration.gpus.{name}", GPU_FIELDS).items():
            entry(Key("gpus", name, f), raw, f"calibration.gpus.{name}.{f}")
    groups = data.get("node_groups") or {}
    if not isinstance(groups, dict):
        raise SpecError(source, "calibration.node_groups", "expected a mapping of node group name -> values")
    names = [g.name for g in cluster.node_groups]
    for name, fields in groups.items():
        if name not in names:
            raise SpecError(source, f"calibration.node_groups.{name}", f"unknown node group{suggest(str(name), names)}")
        for f, raw in _entries(fields, source, f"calibration.node_groups.{name}", GROUP_FIELDS).items():
            entry(Key("node_groups", name, f), raw, f"calibration.node_groups.{name}.{f}")
    links = data.get("interconnect") or []
    if not isinstance(links, list):
        raise SpecError(source, "calibration.interconnect", "expected a list of {between, bus_bandwidth, latency}")
    for i, ic in enumerate(links):
        where = f"calibration.interconnect[{i}]"
        check_fields(ic, source, where, {"between", *INTERCONNECT_FIELDS}, {"between"})
        between = ic["between"]
        if (not isinstance(between, list) or len(between) != 2
                or not all(isinstance(x, str) for x in between) or cluster.interconnect(*between) is None):
            raise SpecError(source, f"{where}.between", f"found {between!r}, expected two node groups the "
                            "cluster's interconnect joins")
        link = cluster.interconnect(*between)
        for f in INTERCONNECT_FIELDS:
            if f in ic:
                entry(Key("interconnect", f"{link.a},{link.b}", f), ic[f], f"{where}.{f}")
    created = data.get("created", "")
    notes = data.get("notes", "")
    for k, v in (("created", created), ("notes", notes), ("tool", data.get("tool", ""))):
        if not isinstance(v, str):
            raise SpecError(source, f"calibration.{k}", f"found {v!r}, expected text")
    cal = Calibration(values=tuple(values), left_at_profile=tuple(left), created=created, notes=notes)
    _check_usable_memory(cluster, cal, source)
    return cal


def _check_usable_memory(cluster, cal: Calibration, source: str) -> None:
    for g in cluster.node_groups:
        name = base_gpu_name(g.gpu)
        r = cal.get(Key("gpus", name, "cuda_context"))
        gpu = with_memory_overheads(g.gpu, r.value if r else None, None)
        if gpu.cuda_context_bytes + gpu.nccl_bytes_per_communicator >= gpu.memory_bytes:
            raise SpecError(source, f"calibration.gpus.{name}", "cuda_context leaves no memory for tensors")


def calibration_to_dict(cal: Calibration, cluster, tool: str = "planner calibrate") -> dict:
    """The YAML form of a calibration (every parameter of the cluster: a value with its sources,
    or left_at_profile with the reason). `cluster` is the uncalibrated one (profile values)."""
    vals = cal.as_dict()
    left = dict(cal.left_at_profile)
    out: dict = {"created": cal.created, "tool": tool}
    if cal.notes:
        out["notes"] = cal.notes
    gpus: dict = {}
    groups: dict = {}
    links: dict = {}
    for key in all_keys(cluster):
        prof = format_value(key.field, current_value(cluster, key))
        if key in vals:
            v = vals[key]
            e = {"value": format_value(key.field, v.value), "profile": prof,
                 "from": [{k: x for k, x in (("file", s.file), ("lines", s.lines), ("date", s.date),
                                             ("what", s.what), ("sha256", s.sha256)) if x}
                          for s in v.sources]}
        elif key in left:
            e = {"profile": prof, "left_at_profile": left[key]}
        else:
            continue
        if key.scope == "gpus":
            gpus.setdefault(key.target, {})[key.field] = e
        elif key.scope == "node_groups":
            groups.setdefault(key.target, {})[key.field] = e
        else:
            links.setdefault(key.target, {"between": key.target.split(",")})[key.field] = e
    if gpus:
        out["gpus"] = gpus
    if groups:
        out["node_groups"] = groups
    if links:
        out["interconnect"] = list(links.values())
    return out
