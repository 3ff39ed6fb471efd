"""Communication: which links a parallel group crosses, and what a collective costs there.

Rank order is Megatron's default 'tp-cp-ep-dp-pp' (megatron/core/parallel_state.py): TP is
innermost (consecutive ranks), then CP, then DP; PP is outermost, so each pipeline stage owns a
contiguous block of tp*cp*dp ranks, laid on whole nodes of one node group.

A group of n ranks whose members sit j to a scale-up domain spans k = n / j domains. The domain
is a node unless the node group declares `scale_up_domain_gpus` (an NVL72 rack of 4-GPU trays:
D GPUs on one NVLink fabric, consecutive nodes in torchrun's order). Inside one domain a group
runs on the scale-up fabric. Across domains a ring is bounded by its slowest link (formulas.md):
the domain's NICs (the sum over its nodes) are shared by the D/j groups of that axis that
communicate at the same time, so the group's share is nics x rate x (D / G) x j / D =
nics x rate x j / G with G GPUs per node. An `interconnect` between node groups caps it
further. Times are alpha-beta: ring all-reduce 2(n-1)/n M / B + 2(n-1) alpha (a tree's
2 log2(n) alpha beyond 16 ranks, as NCCL switches), all-gather / reduce-scatter (n-1)/n M / B,
all-to-all the off-node share over the NIC share (its on-domain share at NCCL's measured
all-to-all efficiency, with a latency per peer), send/recv M / B + alpha.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..specs.cluster import ClusterSpec, NodeGroup

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
TREE_THRESHOLD_RANKS = 16
# NCCL's all-to-all on one NVLink fabric attains less than its rings: nccl-tests alltoall_perf
# bus bandwidth at 4-17 GB per rank is 74-76% of the NVLink line rate (H100 x4 74-75%, NCCL
# 2.30.4, NVIDIA/nccl#2169; GB200 x8 73-74%, GB300 x8 75-76%, B300 x8 75%, GB200 / GB300 x64
# 69-74%: oracle-quickstart/oci-gpu-quickstarts nvidia/{GB200,GB300,B300}/README-*.md) where
# the profiles' ring efficiency (`scale_up`) is 0.8, as NCCL's own topology model prices
# NVLink (src/graph/topo.h: 82% of line rate on Hopper, 80% on Blackwell). An all-to-all
# inside a domain runs at this share of the ring's bandwidth (0.74 / 0.80).
ALL_TO_ALL_SCALE_UP_SHARE = 0.925
# and pays a latency that grows with its peers (one send and one receive per peer): NCCL's
# all-to-all of tiny messages takes 11.75 us on 8 GB200 and 28.2-34.7 us on 32 (NVIDIA/nccl
# contrib/custom_algos/alltoall/README.md, NCCL baseline, CUDA graph): 2 x the profile's
# 3 us scale-up latency plus 0.82 us per peer fits both ((31.5 - 11.75) / (31 - 7) peers).
ALL_TO_ALL_LATENCY_PER_PEER_S = 0.82e-6


@dataclass(frozen=True)
class Link:
    """The fabric a group runs on: bus bandwidth per rank (bytes/s) and per-step latency (s)."""
    bandwidth_bytes_per_s: float
    latency_s: float
    bound_by: str          # what limits it, e.g. "nvlink h100", "nic a100 (4 x 200 Gb/s)"
    ranks_per_node: int    # ranks per scale-up domain (a node unless the group declares a domain)
    nodes: int             # scale-up domains spanned
    intra_bandwidth_bytes_per_s: float   # for all-to-all's on-domain share
    # the NIC share of the group's ranks on one node before a ring's cap by the scale-up fabric
    # (bandwidth_bytes_per_s): an all-to-all's off-node share leaves through the NICs directly
    nic_bandwidth_bytes_per_s: float | None = None


def group_link(groups: list[NodeGroup], n: int, stride: int, cluster: ClusterSpec) -> Link:
    """Link model of a group of n ranks at rank stride `stride`, whose nodes come from `groups`
    (one entry per distinct node group spanned). j ranks per scale-up domain (of D GPUs), k
    domains; with no declared domain D is the node."""
    G = min(g.gpus_per_node for g in groups)
    D = min(g.domain_gpus for g in groups)
    if stride >= D:
        j = 1
    else:
        j = max(1, min(n, D // stride))
    k = math.ceil(n / j)
    intra = min(g.intra_node_bandwidth_bytes_per_s * g.gpu.efficiency.scale_up for g in groups)
    intra_lat = max(g.gpu.scale_up_latency_s for g in groups)
    if k == 1:
        name = groups[0].name
        return Link(intra, intra_lat, f"scale-up {name}", j, 1, intra)
    best = None
    for g in groups:
        share = g.node_egress_bytes_per_s * g.gpu.efficiency.network * j / g.gpus_per_node
        cand = (share, f"NICs {g.name} ({g.nics_per_node} x {g.nic_bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s per node)",
                g.nic_latency_s)
        if best is None or cand[0] < best[0]:
            best = cand
    bw, why, lat = best
    names = [g.name for g in groups]
    for i in range(len(names)):
        for jx in range(i + 1, len(names)):
            ic = cluster.interconnect(names[i], names[jx])
            if ic is not None:
                share = ic.bandwidth_bytes_per_s * min(g.gpu.efficiency.network for g in groups) * j / G
                lat = max(lat, ic.latency_s)
                if share < bw:
                    bw, why = share, f"interconnect {names[i]}-{names[jx]} ({ic.bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s per node)"
    return Link(min(bw, intra) if j > 1 else bw, lat, why, j, k, intra, nic_bandwidth_bytes_per_s=bw)


def collective_time(kind: str, message_bytes: float, n: int, link: Link) -> float:
    """Seconds for one collective over n ranks. message_bytes is the full tensor (for
    all-gather: the gathered result; for all-to-all: what one rank sends in total)."""
    if n <= 1 or message_bytes <= 0:
        return 0.0
    B, a = link.bandwidth_bytes_per_s, link.latency_s
    steps = 2 * (n - 1) if n <= TREE_THRESHOLD_RANKS else 2 * math.ceil(math.log2(n))
    if kind == "all-reduce":
        return 2 * (n - 1) / n * message_bytes / B + steps * a
    if kind in ("all-gather", "reduce-scatter"):
        return (n - 1) / n * message_bytes / B + steps / 2 * a
    if kind == "all-to-all":
        # uniform destinations: (j - 1)/n of what a rank sends stays on its node
        on_node = (link.ranks_per_node - 1) / n * message_bytes
        off_node = (n - link.ranks_per_node) / n * message_bytes
        return hierarchical_all_to_all_time(on_node, off_node, link)
    if kind == "send-recv":
        return message_bytes / B + a
    raise ValueError(kind)


def collective_time_affine(kind: str, n: int, link: Link, at_bytes: float) -> tuple[float, float]:
    """(seconds per byte, fixed seconds) of collective_time for messages > 0 bytes: it is affine
    in the message size (a bandwidth term and the latency of its steps), read off collective_time
    itself at at_bytes and twice that (> 0), so a caller pricing many sizes at once stays with
    this function's terms."""
    t1, t2 = collective_time(kind, at_bytes, n, link), collective_time(kind, 2 * at_bytes, n, link)
    return (t2 - t1) / at_bytes, 2 * t1 - t2


def hierarchical_all_to_all_time(on_node_bytes: float, off_node_bytes: float, link: Link) -> float:
    """Seconds for an all-to-all in which each rank sends `on_node_bytes` to ranks of its own node
    (over the scale-up fabric) and `off_node_bytes` to other nodes; every GPU of a node sends its
    off-node share through the node's NICs at once, so each gets 1/j of the group's NIC share.
    Both parts run concurrently; the slower one sets the time, plus a latency of two link
    latencies and ALL_TO_ALL_LATENCY_PER_PEER_S per peer. "Node" here is the link's
    scale-up domain (group_link): a rack's trays send their off-rack share through their own
    NICs, the sum of which is the domain's."""
    intra = link.intra_bandwidth_bytes_per_s * ALL_TO_ALL_SCALE_UP_SHARE
    peers = link.ranks_per_node * link.nodes - 1
    a = 2 * link.latency_s + peers * ALL_TO_ALL_LATENCY_PER_PEER_S
    if link.nodes == 1 or off_node_bytes <= 0:
        return on_node_bytes / intra + a
    per_gpu_nic = (link.nic_bandwidth_bytes_per_s or link.bandwidth_bytes_per_s) / link.ranks_per_node
    return max(on_node_bytes / intra, off_node_bytes / per_gpu_nic) + a


def p2p_link(a: NodeGroup, b: NodeGroup, same_node: bool, cluster: ClusterSpec) -> Link:
    """Link between two pipeline stages: every GPU of a node sends to the next stage at once,
    so each gets 1/G of the node's NICs. `same_node`: both stages in one scale-up domain (a node,
    or the group's scale_up_domain_gpus), on the scale-up fabric."""
    if same_node:
        bw = a.intra_node_bandwidth_bytes_per_s * a.gpu.efficiency.scale_up
        return Link(bw, a.gpu.scale_up_latency_s, f"scale-up {a.name}", a.domain_gpus, 1, bw)
    share = min(g.node_egress_bytes_per_s * g.gpu.efficiency.network / g.gpus_per_node for g in (a, b))
    why = f"NICs {a.name if a.node_egress_bytes_per_s / a.gpus_per_node <= b.node_egress_bytes_per_s / b.gpus_per_node else b.name}"
    lat = max(a.nic_latency_s, b.nic_latency_s)
    if a.name != b.name:
        ic = cluster.interconnect(a.name, b.name)
        if ic is not None:
            ics = ic.bandwidth_bytes_per_s * a.gpu.efficiency.network / min(a.gpus_per_node, b.gpus_per_node)
            lat = max(lat, ic.latency_s)
            if ics < share:
                share, why = ics, f"interconnect {a.name}-{b.name}"
    return Link(share, lat, why, 1, 2, share)
