"""Collective times on the links a group crosses (cost/comm.py), against hand arithmetic."""

import pytest

from planner.library import load_cluster_ref


def test_an_all_to_all_leaves_through_the_nics_not_the_rings_nvlink_cap():
    """A ring across DGX H800 nodes is capped by the H800's NVLink (200 GB/s x 0.8 = 160 GB/s per
    GPU, below the node's 8 x 400 Gb/s x 0.92 = 368 GB/s), but an all-to-all's off-node bytes
    leave each GPU through its own NIC: 46 GB/s, not 160 / 8 = 20 GB/s. 32 ranks on 4 nodes
    sending 1 GB each: 3/4 of it off-node (750 MB / 46 GB/s = 16.3 ms), 7/32 on NVLink
    (219 MB / (160 GB/s x 0.925, NCCL's all-to-all share of a ring) = 1.5 ms); latency two NIC
    latencies (5 us) and 0.82 us for each of 31 peers."""
    from planner.cost.comm import collective_time, group_link
    cluster = load_cluster_ref("h800-x256")
    link = group_link(list(cluster.node_groups), 32, 1, cluster)
    assert link.bandwidth_bytes_per_s == pytest.approx(160e9)
    t = collective_time("all-to-all", 1e9, 32, link)
    assert link.latency_s == pytest.approx(5e-6)
    assert t == pytest.approx(0.75e9 / 46e9 + 2 * 5e-6 + 31 * 0.82e-6, rel=1e-6)


def test_an_all_to_all_inside_a_node_at_nccls_measured_share_with_a_latency_per_peer():
    """8 H100 ranks on one node, 1 GB each: 7/8 of it over NVLink at 450 GB/s x 0.8 (the ring
    efficiency) x 0.925 = 333 GB/s (nccl-tests alltoall_perf busbw on H100: 335-338 GB/s,
    NVIDIA/nccl#2169), plus 2 x 3 us + 7 x 0.82 us."""
    from planner.cost.comm import collective_time, group_link
    cluster = load_cluster_ref("dgx-h100-x8")
    link = group_link(list(cluster.node_groups), 8, 1, cluster)
    t = collective_time("all-to-all", 1e9, 8, link)
    assert t == pytest.approx(0.875e9 / 333e9 + 6e-6 + 7 * 0.82e-6, rel=1e-6)
