"""Cluster spec: node groups (identical GPUs and NICs within a group) and optional slower
interconnects between groups (another fabric, another site)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..units import UnitError, parse_bandwidth, parse_size, parse_time
from ..yamlio import check_fields, get_float, get_int, get_str, load_file
from ..bundled import bundled_profile_names
from .hardware import GPUProfile, load_bundled_profile, load_profile

# Default NIC latency when the spec gives none: typical one-way RDMA latency of InfiniBand/RoCE
# through one switch tier is 2-5 us (NVIDIA ConnectX-7 datasheet quotes sub-microsecond adapter
# latency; switch hops and NCCL protocol overhead dominate). A planner assumption.
DEFAULT_NIC_LATENCY_S = 5e-6
MAX_NODES_PER_GROUP = 100_000
MAX_GPUS_PER_NODE = 72   # an NVL72 rack is the largest scale-up domain shipped today
# scale_up_domain_gpus: GPUs sharing one NVLink fabric across several nodes (trays), e.g. a
# GB200 NVL72 rack of 18 four-GPU trays. NVIDIA has announced NVL576 (Vera Rubin Ultra) as the
# largest domain; a larger value is a typo for a cluster size.
MAX_SCALE_UP_DOMAIN_GPUS = 576
# USD per GPU-hour. Cloud list prices of the largest GPUs are a few dollars to a few tens of
# dollars per GPU-hour; a value above this is a price per node, per day or in cents, and is
# refused rather than priced.
MAX_PRICE_PER_GPU_HOUR = 1000.0


@dataclass(frozen=True)
class NodeGroup:
    name: str
    nodes: int
    gpus_per_node: int
    gpu: GPUProfile
    nics_per_node: int
    nic_bandwidth_bytes_per_s: float       # per NIC, line rate, per direction
    intra_node_bandwidth_bytes_per_s: float  # per GPU, per direction
    nic_latency_s: float
    host_memory_bytes: float | None
    price_per_gpu_hour: float | None = None   # USD, optional: the cost objective and $ figures
    # GPUs on one scale-up (NVLink) fabric: consecutive nodes (trays) of the group, in torchrun's
    # node order, share it. None: the node is the domain.
    scale_up_domain_gpus: int | None = None

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        """GPUs of one scale-up domain (a node unless scale_up_domain_gpus says more)."""
        return self.scale_up_domain_gpus or self.gpus_per_node

    @property
    def nodes_per_domain(self) -> int:
        return self.domain_gpus // self.gpus_per_node

    @property
    def node_egress_bytes_per_s(self) -> float:
        """All NICs of one node together, line rate, per direction."""
        return self.nics_per_node * self.nic_bandwidth_bytes_per_s


@dataclass(frozen=True)
class Interconnect:
    a: str
    b: str
    bandwidth_bytes_per_s: float   # per node, per direction, for traffic between the two groups
    latency_s: float


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    node_groups: tuple[NodeGroup, ...]
    interconnects: tuple[Interconnect, ...] = ()
    origin: str = ""

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)

    def group(self, name: str) -> NodeGroup:
        for g in self.node_groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def interconnect(self, a: str, b: str) -> Interconnect | None:
        for ic in self.interconnects:
            if {ic.a, ic.b} == {a, b}:
                return ic
        return None

    @property
    def is_heterogeneous(self) -> bool:
        return len(self.node_groups) > 1

    @property
    def is_priced(self) -> bool:
        """Every node group has a price_per_gpu_hour."""
        return all(g.price_per_gpu_hour is not None for g in self.node_groups)


GROUP_FIELDS = {"name", "nodes", "gpus_per_node", "gpu", "nics_per_node", "nic_bandwidth",
                "intra_node_bandwidth", "nic_latency", "host_memory", "price_per_gpu_hour",
                "scale_up_domain_gpus"}
REQUIRED_GROUP_FIELDS = {"name", "nodes", "gpus_per_node", "gpu", "nics_per_node", "nic_bandwidth"}
CLUSTER_FIELDS = {"name", "node_groups", "interconnect", "source", "notes", "calibration"}
REQUIRED_CLUSTER_FIELDS = {"name", "node_groups"}
INTERCONNECT_FIELDS = {"between", "bandwidth", "latency"}
REQUIRED_INTERCONNECT_FIELDS = {"between", "bandwidth"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def _unit(fn, data: dict, key: str, source: str, prefix: str):
    try:
        return fn(data[key])
    except UnitError as exc:
        raise SpecError(source, f"{prefix}.{key}", str(exc)) from None


def resolve_profile(ref: Any, source: str, fld: str) -> GPUProfile:
    """A bundled profile name, or a relative .yaml path inside the cluster file's folder."""

    if not isinstance(ref, str) or not ref:
        raise SpecError(source, fld, f"found {ref!r}, expected a hardware profile name")
    if ref.endswith((".yaml", ".yml")):
        base = Path(source).resolve().parent
        target = (base / ref).resolve()
        if Path(ref).is_absolute() or base not in target.parents:
            raise SpecError(source, fld, f"profile path {ref!r} escapes the cluster file's folder")
        return load_profile(target)
    if not _NAME.fullmatch(ref):
        raise SpecError(source, fld, f"found {ref!r}, expected a profile name like 'h100-sxm-80g'")
    names = bundled_profile_names()
    if ref not in names:
        from ..yamlio import suggest
        raise SpecError(source, fld, f"unknown GPU profile {ref!r}{suggest(ref, names)}; "
                        f"known: {', '.join(names)}")
    return load_bundled_profile(ref)


def cluster_from_dict(data: Any, source: str) -> ClusterSpec:
    """The cluster a spec describes, with its `calibration:` block (planner calibrate) applied."""
    cluster = base_cluster_from_dict(data, source)
    if data.get("calibration") is None:
        return cluster
    from .calibration import apply_calibration, parse_calibration
    return apply_calibration(cluster, parse_calibration(data["calibration"], source, cluster))


def base_cluster_from_dict(data: Any, source: str) -> ClusterSpec:
    """The cluster as its node groups and profiles describe it, without its calibration."""
    check_fields(data, source, "", CLUSTER_FIELDS, REQUIRED_CLUSTER_FIELDS)
    groups_raw = data["node_groups"]
    if not isinstance(groups_raw, list) or not groups_raw:
        raise SpecError(source, "node_groups", "expected a non-empty list of node groups")
    if len(groups_raw) > 64:
        raise SpecError(source, "node_groups", f"found {len(groups_raw)} groups, expected at most 64")
    groups = []
    seen = set()
    for i, g in enumerate(groups_raw):
        p = f"node_groups[{i}]"
        check_fields(g, source, p, GROUP_FIELDS, REQUIRED_GROUP_FIELDS)
        name = get_str(g, "name", source, p)
        if not _NAME.fullmatch(name):
            raise SpecError(source, f"{p}.name", f"found {name!r}, expected letters, digits, '.', '_', '-'")
        if name in seen:
            raise SpecError(source, f"{p}.name", f"duplicate node group name {name!r}")
        seen.add(name)
        gpu = resolve_profile(g["gpu"], source, f"{p}.gpu")
        intra = (_unit(parse_bandwidth, g, "intra_node_bandwidth", source, p)
                 if g.get("intra_node_bandwidth") is not None else gpu.scale_up_bandwidth_bytes_per_s)
        nodes = get_int(g, "nodes", source, p, maximum=MAX_NODES_PER_GROUP)
        gpn = get_int(g, "gpus_per_node", source, p, maximum=MAX_GPUS_PER_NODE)
        domain = None
        if g.get("scale_up_domain_gpus") is not None:
            domain = get_int(g, "scale_up_domain_gpus", source, p, maximum=MAX_SCALE_UP_DOMAIN_GPUS)
            if domain % gpn:
                raise SpecError(source, f"{p}.scale_up_domain_gpus",
                                f"found {domain}, expected a multiple of gpus_per_node ({gpn})")
            if nodes % (domain // gpn):
                raise SpecError(source, f"{p}.scale_up_domain_gpus",
                                f"found {domain} ({domain // gpn} nodes per domain), expected whole domains: "
                                f"nodes ({nodes}) a multiple of {domain // gpn}")
        groups.append(NodeGroup(
            name=name,
            nodes=nodes,
            gpus_per_node=gpn,
            gpu=gpu,
            nics_per_node=get_int(g, "nics_per_node", source, p, maximum=64),
            nic_bandwidth_bytes_per_s=_unit(parse_bandwidth, g, "nic_bandwidth", source, p),
            intra_node_bandwidth_bytes_per_s=intra,
            nic_latency_s=(_unit(parse_time, g, "nic_latency", source, p)
                           if g.get("nic_latency") is not None else DEFAULT_NIC_LATENCY_S),
            host_memory_bytes=(_unit(parse_size, g, "host_memory", source, p)
                               if g.get("host_memory") is not None else None),
            price_per_gpu_hour=get_float(g, "price_per_gpu_hour", source, p, minimum=0.0,
                                         maximum=MAX_PRICE_PER_GPU_HOUR),
            scale_up_domain_gpus=domain if domain and domain > gpn else None,
        ))
    links = []
    raw_links = data.get("interconnect") or []
    if not isinstance(raw_links, list):
        raise SpecError(source, "interconnect", "expected a list of {between, bandwidth, latency}")
    for i, ic in enumerate(raw_links):
        p = f"interconnect[{i}]"
        check_fields(ic, source, p, INTERCONNECT_FIELDS, REQUIRED_INTERCONNECT_FIELDS)
        between = ic["between"]
        if (not isinstance(between, list) or len(between) != 2
                or not all(isinstance(x, str) for x in between) or between[0] == between[1]):
            raise SpecError(source, f"{p}.between", f"found {between!r}, expected two different node group names")
        for x in between:
            if x not in seen:
                from ..yamlio import suggest
                raise SpecError(source, f"{p}.between", f"unknown node group {x!r}{suggest(x, seen)}")
        links.append(Interconnect(
            a=between[0], b=between[1],
            bandwidth_bytes_per_s=_unit(parse_bandwidth, ic, "bandwidth", source, p),
            latency_s=(_unit(parse_time, ic, "latency", source, p) if ic.get("latency") is not None
                       else DEFAULT_NIC_LATENCY_S),
        ))
    cluster = ClusterSpec(name=get_str(data, "name", source), node_groups=tuple(groups),
                          interconnects=tuple(links), origin=source)
    if cluster.num_gpus > 1_000_000:
        raise SpecError(source, "node_groups", f"{cluster.num_gpus} GPUs; expected at most 1,000,000")
    return cluster


def load_cluster(path: str | Path) -> ClusterSpec:
    return cluster_from_dict(load_file(path), str(path))
