"""Scale-up domains larger than a node (GB200/GB300 NVL72 racks of 4-GPU trays, issue 30):
collectives of a group inside a rack on NVLink, a group across racks hierarchical, the search's
TP range up to the domain, emission per tray, and the bundled rack clusters and profiles."""

import pytest

from planner.cost.comm import collective_time, group_link
from planner.errors import SpecError
from planner.specs.cluster import cluster_from_dict


def _racks(domain=None, nodes=32):
    g = {"name": "gb200", "nodes": nodes, "gpus_per_node": 4, "gpu": "gb200-186g", "nics_per_node": 4,
         "nic_bandwidth": "400 Gb/s"}
    if domain is not None:
        g["scale_up_domain_gpus"] = domain
    return cluster_from_dict({"name": "racks", "node_groups": [g]}, "test")


RACKS = _racks(64)          # 2 racks x 16 trays x 4 GPUs, 64 GPUs per NVLink domain
TRAYS = _racks()            # the same GPUs as plain 4-GPU nodes


def _link(cluster, n, stride):
    return group_link(list(cluster.node_groups), n, stride, cluster)


@pytest.mark.parametrize("n,kind", [(8, "all-reduce"), (8, "all-gather"), (32, "all-to-all")],
                         ids=["tp8-ar", "tp8-ag", "ep32-a2a"])
def test_a_group_inside_a_rack_runs_on_nvlink(n, kind):
    """TP 8 and EP 32 inside one rack: one domain, NVLink at 900 GB/s x 0.8 = 720 GB/s per GPU;
    as 4-GPU nodes without the domain the same group crosses trays: a ring on the tray's NIC
    share (4 x 50 GB/s x 0.92 x 4 / 4 = 184 GB/s), an all-to-all's off-tray bytes on each GPU's
    46 GB/s; the rack prices it several times faster."""
    link = _link(RACKS, n, 1)
    assert (link.nodes, link.ranks_per_node) == (1, n)
    assert link.bandwidth_bytes_per_s == pytest.approx(900e9 * 0.8)
    assert link.bound_by.startswith("scale-up")
    tray = _link(TRAYS, n, 1)
    assert (tray.nodes, tray.ranks_per_node) == (n // 4, 4)
    t_rack, t_tray = collective_time(kind, 1e9, n, link), collective_time(kind, 1e9, n, tray)
    assert t_rack < t_tray / 3
    # hand arithmetic: a ring all-reduce of 1 GB over 8 ranks on NVLink
    if kind == "all-reduce":
        assert t_rack == pytest.approx(2 * 7 / 8 * 1e9 / 720e9 + 2 * 7 * link.latency_s)


def test_a_group_spanning_racks_goes_hierarchical():
    """EP 128 over both racks (64 ranks per rack, 2 domains): a ring is bounded by the NICs,
    nics x rate x j / G = 4 x 50 GB/s x 0.92 x 64 / 4 = 2944 GB/s per domain share, capped by
    NVLink (720 GB/s); an all-to-all sends its off-rack half through each GPU's own NIC share
    (46 GB/s) and its on-rack share over NVLink (at NCCL's all-to-all share 0.925 of a ring's
    bandwidth), with 0.82 us per peer of latency."""
    RACKS2 = _racks(64, nodes=32)
    link = _link(RACKS2, 128, 1)
    assert (link.nodes, link.ranks_per_node) == (2, 64)
    assert link.bound_by.startswith("NICs")
    assert link.nic_bandwidth_bytes_per_s == pytest.approx(4 * 50e9 * 0.92 * 64 / 4)
    assert link.bandwidth_bytes_per_s == pytest.approx(720e9)
    t = collective_time("all-to-all", 1e9, 128, link)
    on, off = 63 / 128 * 1e9, 64 / 128 * 1e9
    assert t == pytest.approx(max(on / (720e9 * 0.925), off / 46e9) + 2 * link.latency_s + 127 * 0.82e-6)
    # DP across racks at stride 64 (one rank per domain): the NIC share of one GPU
    dp = _link(RACKS2, 2, 64)
    assert (dp.nodes, dp.ranks_per_node) == (2, 1)
    assert dp.bandwidth_bytes_per_s == pytest.approx(46e9)


def test_default_is_the_node():
    """Without scale_up_domain_gpus (or with it equal to gpus_per_node) a group's domain is its
    node, exactly as before."""
    same = _racks(4)
    assert same.node_groups[0].scale_up_domain_gpus is None
    assert same == TRAYS
    assert TRAYS.node_groups[0].domain_gpus == 4
    for n, stride in ((4, 1), (8, 1), (16, 4), (2, 64)):
        assert _link(same, n, stride) == _link(TRAYS, n, stride)


@pytest.mark.parametrize("domain,nodes,msg", [
    (6, 32, "expected a multiple of gpus_per_node (4)"),
    (64, 20, "expected whole domains"),
    (1000, 32, "expected an integer in"),
    ("64", 32, "expected an integer"),
])
def test_bad_domains_are_one_line_errors_naming_file_and_field(domain, nodes, msg):
    with pytest.raises(SpecError) as exc:
        _racks(domain, nodes)
    text = str(exc.value)
    assert "\n" not in text and "test" in text and "node_groups[0].scale_up_domain_gpus" in text and msg in text


def test_pipeline_stages_in_one_rack_talk_over_nvlink():
    """Two 32-GPU stages on the trays of one rack share its domain: their hop is on NVLink; on
    4-GPU nodes without the domain it goes through the NICs."""
    from planner.cost.parallel import stages_share_node
    from planner.strategy import Strategy
    s = Strategy(tp=8, pp=2, dp=4, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    g = [RACKS.node_groups[0]]
    assert stages_share_node(s, 0, 1, g, g)
    assert not stages_share_node(s, 0, 1, [TRAYS.node_groups[0]], [TRAYS.node_groups[0]])
    s4 = Strategy(tp=8, pp=4, dp=4, micro_batch_size=1, global_batch_size=64, seq_length=4096)
    assert not stages_share_node(s4, 1, 2, g, g)   # stage 1 ends rack 0, stage 2 starts rack 1


def test_search_space_tp_up_to_the_domain():
    from planner.library import load_model_ref
    from planner.search.space import SearchOptions, enumerate_space
    model = load_model_ref("llama3-70b")
    o = SearchOptions(global_batch_size=256, seq_length=4096)
    rack_tps = {t for t, *_ in enumerate_space(model, RACKS, o)}
    tray_tps = {t for t, *_ in enumerate_space(model, TRAYS, o)}
    assert max(tray_tps) == 4 and max(rack_tps) == 64


def test_bundled_rack_clusters_and_profiles_load():
    from planner.library import load_cluster_ref
    from planner.library import load_bundled_profile
    c = load_cluster_ref("gb200-nvl72-x4")
    g = c.node_groups[0]
    assert (c.num_gpus, g.gpus_per_node, g.domain_gpus, g.nodes_per_domain) == (256, 4, 64, 16)
    assert g.gpu.name == "gb200-186g" and g.gpu.memory_bytes == pytest.approx(184.31 * 2**30)   # as CUDA reports it
    assert g.gpu.scale_up_bandwidth_bytes_per_s == pytest.approx(900e9)
    c8 = load_cluster_ref("gb300-nvl72-x8")
    assert (c8.num_gpus, c8.node_groups[0].domain_gpus) == (512, 64)
    assert c8.node_groups[0].nic_bandwidth_bytes_per_s == pytest.approx(100e9)
    b300 = load_bundled_profile("b300-sxm-288g")
    assert b300.peak("bf16") == pytest.approx(2250e12) and b300.peak("fp8") == pytest.approx(4500e12)
    for name in ("gb200-186g", "gb300-288g", "b300-sxm-288g"):
        assert "efficiency" in load_bundled_profile(name).uncertain


def test_search_on_a_domain_is_the_brute_force_optimum():
    """Two 4-GPU nodes in one 8-GPU domain: every bound the search prunes with stays under the
    estimate (both price a hop between stages of one domain on NVLink, by the same rule) and
    the top plan is the brute-force optimum."""
    from test_search import MODEL, OPTIONS, brute_force_run, group_dict
    from planner.search.best_first import search
    g = group_dict("h100", "h100-sxm-80g", 2, 400)
    g["scale_up_domain_gpus"] = 8
    cluster = cluster_from_dict({"name": "h100-2x4-domain", "node_groups": [g]}, "test")
    best, n_fit, n_all, _ = brute_force_run(MODEL, cluster, OPTIONS)
    assert 0 < n_fit < n_all
    r = search(MODEL, cluster, OPTIONS)
    assert r.plans[0].step_time_s == pytest.approx(best.step_time_s, rel=1e-9)


def test_emitted_rack_launch_runs_per_tray_and_reads_back(tmp_path):
    """The launch of a rack plan starts 4 ranks per tray on as many trays as the plan uses, and
    `planner check` reads it back."""
    import subprocess, sys
    out = tmp_path / "plan"
    r = subprocess.run([sys.executable, "-m", "planner", "plan", "--model", "llama3-70b", "--cluster", "gb200-nvl72-x4",
                        "--global-batch-size", "1024", "--seq-length", "8192", "--top", "1", "--emit", "megatron",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    scripts = sorted(out.rglob("*.sh"))
    assert scripts
    text = scripts[0].read_text()
    assert "GPUS_PER_NODE=${GPUS_PER_NODE:-4}" in text and "NNODES=${NNODES:-64}" in text
    c = subprocess.run([sys.executable, "-m", "planner", "check", "--megatron-args", str(scripts[0]), "--model", "llama3-70b",
                        "--cluster", "gb200-nvl72-x4"], capture_output=True, text=True, timeout=300)
    assert c.returncode == 0, c.stdout + c.stderr


def test_mixed_racks_and_hopper_pod_plan_across_both():
    """The bundled GB200-beside-H100 example: a plan may put stages on both kinds, and the #1's
    estimate, run again from its strategy, gives the same step time the search reported."""
    from planner.estimate import estimate
    from planner.library import load_cluster_ref, load_model_ref
    from planner.search.best_first import search
    from planner.search.planner import SearchOptions
    c = load_cluster_ref("gb200-h100-mixed")
    assert [g.domain_gpus for g in c.node_groups] == [64, 8]
    assert c.interconnect("gb200", "h100").bandwidth_bytes_per_s == pytest.approx(100e9)
    m = load_model_ref("llama3-70b")
    r = search(m, c, SearchOptions(global_batch_size=1024, seq_length=8192, top=1))
    best = r.plans[0]
    assert {"gb200", "h100"} <= set(best.strategy.stage_node_groups)
    assert estimate(m, c, best.strategy).step_time_s == pytest.approx(best.step_time_s, rel=1e-9)


def _ep_all_to_all(cluster: str):
    """The EP all-to-all entry of `planner estimate --json` for the EP64 test launch."""
    import json, subprocess, sys
    from pathlib import Path
    launch = Path(__file__).parent / "fixtures" / "qwen3_235b_ep64.args"
    r = subprocess.run([sys.executable, "-m", "planner", "estimate", "--cluster", cluster, "--megatron-args", str(launch),
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return next(c for c in json.loads(r.stdout)["communication"] if c["axis"] == "ep")


def test_ep64_launch_all_to_all_on_nvlink_in_a_rack_and_on_nics_across_hgx_nodes(tmp_path):
    """Issue 30's check: the same EP64 launch on GB200 NVL72 racks (64-GPU domains) runs its
    token all-to-all on NVLink, on HGX B200 nodes of 8 on the NICs. Per call, by hand from the
    profiles: NVLink 5 900 GB/s per direction x scale-up efficiency 0.8 x NCCL's all-to-all share
    0.925, latency 2 x 3 us + 0.82 us per peer; across 8 nodes 56 of 64
    shares leave through one 400 Gb/s NIC per GPU x network efficiency 0.92."""
    rack = _ep_all_to_all("gb200-nvl72-x4")
    assert rack["link"] == "scale-up gb200" and rack["group_size"] == 64
    per_call = rack["time_s"] / rack["count_per_step"]
    assert per_call == pytest.approx(rack["bytes"] * 63 / 64 / (900e9 * 0.8 * 0.925) + 2 * 3e-6 + 63 * 0.82e-6,
                                     rel=0.02)
    hgx = tmp_path / "hgx-b200-x32.yaml"
    hgx.write_text("name: hgx-b200-x32\nnode_groups:\n  - {name: b200, nodes: 32, gpus_per_node: 8, "
                   "gpu: b200-sxm-180g, nics_per_node: 8, nic_bandwidth: 400 Gb/s}\n")
    nodes = _ep_all_to_all(str(hgx))
    assert nodes["link"].startswith("NICs b200")
    per_call = nodes["time_s"] / nodes["count_per_step"]
    assert per_call == pytest.approx(nodes["bytes"] * 56 / 64 / (50e9 * 0.92), rel=0.02)
    assert per_call > 10 * rack["time_s"] / rack["count_per_step"]


@pytest.mark.parametrize("gpu,bf16_tflops,per_direction_gbps", [("mi355x-288g", 2516.6, 537.6), ("h20-96g", 148, 450)])
def test_2026_profiles_carry_datasheet_figures_and_refuse_nvfp4(tmp_path, gpu, bf16_tflops, per_direction_gbps):
    """MI355X (7 Infinity Fabric links x 153.6 GB/s bidirectional / 2 = 537.6 GB/s per direction)
    and H20 (NVLink 4, 450 per direction) load with their datasheet peaks; neither runs NVIDIA's
    NVFP4 recipe, so `plan --precision nvfp4` on them is refused in one line."""
    import subprocess, sys
    from planner.library import load_bundled_profile
    p = load_bundled_profile(gpu)
    assert p.peak("bf16") == pytest.approx(bf16_tflops * 1e12)
    assert p.scale_up_bandwidth_bytes_per_s == pytest.approx(per_direction_gbps * 1e9)
    assert "efficiency" in p.uncertain
    c = tmp_path / "c.yaml"
    c.write_text(f"name: c\nnode_groups:\n  - {{name: g, nodes: 2, gpus_per_node: 8, gpu: {gpu}, nics_per_node: 8, "
                 "nic_bandwidth: 400 Gb/s}\n")
    r = subprocess.run([sys.executable, "-m", "planner", "plan", "--model", "llama3-8b", "--cluster", str(c),
                        "--global-batch-size", "64", "--seq-length", "4096", "--precision", "nvfp4"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "nvfp4" in r.stderr and gpu in r.stderr
