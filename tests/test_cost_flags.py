"""Each cost-relevant launch setting moves memory or time the way its source says, by the amount
its source gives where one exists (Megatron-LM d98e8a6, Transformer Engine d0067d0; the
sources are cited next to each formula in planner/cost/)."""

import pytest

from planner.cost import activations as act
from planner.cost.memory import bytes_per_param, fp8_weight_cache_bytes, stage_memory
from planner.estimate import estimate
from planner.library import load_bundled_profile, load_cluster_ref, load_model_ref
from planner.placement import placement_of
from planner.strategy import Strategy

H100 = load_bundled_profile("h100-sxm-80g")
B200 = load_bundled_profile("b200-sxm-180g")
LLAMA = load_model_ref("llama3-70b")
MIXTRAL = load_model_ref("mixtral-8x22b")
CLUSTER = load_cluster_ref("dgx-h100-x16")
BASE = Strategy(tp=8, pp=4, dp=4, micro_batch_size=1, global_batch_size=256, seq_length=8192, recompute="none",
                zero_stage=1)


def mem(s, model=LLAMA, stage=0, gpu=H100):
    return stage_memory(model, s, placement_of(s), stage, gpu)


def test_bytes_per_param_follow_the_launch_dtypes():
    # dist_optimizer.md: bf16 params + fp32 grads + fp32 master and moments = 2 + 4 + 12
    assert bytes_per_param(BASE) == {"parameters": 2, "gradients": 4, "optimizer": 12}
    # --grad-reduce-in-bf16: a bf16 grad buffer
    assert bytes_per_param(BASE.with_(grad_reduce_in_bf16=True))["gradients"] == 2
    # precision-aware optimizer, bf16 moments; TE FusedAdam keeps the fp32 master as 16-bit
    # remainders beside the bf16 weight (store_param_remainders)
    pa = BASE.with_(use_precision_aware_optimizer=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16",
                    main_grads_dtype="bf16")
    assert bytes_per_param(pa) == {"parameters": 2, "gradients": 2, "optimizer": 2 + 2 + 2}
    # fp8 primary weights (--fp8-param-gather): 1-byte parameters
    assert bytes_per_param(BASE.with_(precision="fp8", fp8_param_gather=True))["parameters"] == 1


def test_grad_reduce_in_bf16_halves_the_gradient_buffer():
    a, b = mem(BASE), mem(BASE.with_(grad_reduce_in_bf16=True))
    assert b.gradients == pytest.approx(a.gradients / 2) and b.total < a.total


def test_fp8_weight_cache_by_architecture():
    fp8 = BASE.with_(precision="fp8", fp8_recipe="tensorwise")
    assert fp8_weight_cache_bytes(fp8, H100) == 2.0          # Hopper: row-wise copy + transpose
    assert fp8_weight_cache_bytes(fp8, B200) == 1.0          # Blackwell: one copy
    assert fp8_weight_cache_bytes(fp8.with_(fp8_recipe="mxfp8"), B200) == pytest.approx(2 * (1 + 1 / 32))
    assert fp8_weight_cache_bytes(fp8.with_(fp8_param_gather=True), H100) == 1.0
    # fp8 without fp8 primary weights costs memory; with them it saves the bf16 copy
    plain, cached, primary = mem(BASE), mem(fp8), mem(fp8.with_(fp8_param_gather=True))
    assert cached.parameters > plain.parameters > primary.parameters


def test_fp8_stores_wgrad_inputs_in_one_byte():
    s = BASE.with_(sequence_parallel=True)
    sbh = 8192 * 8192 / 8   # s b h / tp, SP
    f = LLAMA.ffn_hidden_size
    bf16 = act.layer_bytes(LLAMA, s, False, "none")
    fp8 = act.layer_bytes(LLAMA, s.with_(precision="fp8", fp8_recipe="tensorwise"), False, "none")
    # two norm outputs (s b h / tp each) and the fc2 input (s b f / tp) drop from 2 bytes to 1
    assert bf16 - fp8 == pytest.approx(2 * sbh + 8192 * f / 8)
    # delayed scaling keeps an extra fp8 copy of the out-projection input (a d / tp per token)
    delayed = act.layer_bytes(LLAMA, s.with_(precision="fp8", fp8_recipe="delayed"), False, "none")
    assert delayed - fp8 == pytest.approx(8192 * LLAMA.num_attention_heads * LLAMA.kv_channels / 8)


def test_unfused_attention_keeps_the_scores():
    s = BASE.with_(sequence_parallel=True, seq_length=8192)
    fused = act.layer_bytes(LLAMA, s, False, "none")
    unfused = act.layer_bytes(LLAMA, s.with_(fused_attention=False), False, "none")
    # Llama 3 has no attention dropout: the 16-bit softmax output, a s^2 b / t elements, replaces
    # the fp32 log-sum-exp
    a_loc = LLAMA.num_attention_heads / 8
    assert unfused - fused == pytest.approx(2 * a_loc * 8192 * 8192 - 4 * a_loc * 8192)


def test_selective_recompute_modules_free_what_they_rebuild():
    s = BASE.with_(sequence_parallel=True, recompute="selective")
    none = act.layer_bytes(LLAMA, s.with_(recompute="none"), False, "none")
    core = act.layer_bytes(LLAMA, s, False, "selective")
    mlp = act.layer_bytes(LLAMA, s.with_(recompute_modules=("core_attn", "mlp")), False, "selective")
    assert mlp < core < none
    # mlp frees the fc1 input (s b h / tp), the SwiGLU input (2 f) and the fc2 input (f), over tp
    f = LLAMA.ffn_hidden_size
    assert core - mlp == pytest.approx(2 * 8192 * 8192 / 8 + 2 * 8192 * 2 * f / 8 + 2 * 8192 * f / 8)
    ms = Strategy(tp=2, ep=8, etp=1, dp=16, pp=8, micro_batch_size=1, global_batch_size=512, seq_length=4096,
                  recompute="selective")
    moe_core = act.layer_bytes(MIXTRAL, ms, True, "selective")
    moe_act = act.layer_bytes(MIXTRAL, ms.with_(recompute_modules=("core_attn", "moe_act")), True, "selective")
    T = act.expert_tokens_per_rank(MIXTRAL, ms)
    assert moe_core - moe_act == pytest.approx(2 * T * MIXTRAL.moe_ffn_hidden_size)


def test_partial_optimizer_offload_lies_between_none_and_full():
    pa = BASE.with_(use_precision_aware_optimizer=True)
    none = mem(pa)
    half = mem(pa.with_(offload_optimizer=True, optimizer_offload_fraction=0.5))
    full = mem(pa.with_(offload_optimizer=True, optimizer_offload_fraction=1.0))
    assert full.optimizer == 0 and half.optimizer == pytest.approx(none.optimizer / 2)
    assert 0 == none.host_bytes < half.host_bytes < full.host_bytes


def test_activation_offloading_moves_layers_to_the_host():
    s = BASE.with_(sequence_parallel=True)
    assert mem(s.with_(cpu_offloading_num_layers=5)).activations < mem(s).activations


def test_device_capacity_and_overheads():
    m = mem(BASE)
    assert m.device_bytes == pytest.approx(79.11 * 2**30)          # the H100's CUDA total
    assert m.overhead_bytes > H100.cuda_context_bytes               # + NCCL communicators and workspaces
    assert m.capacity == pytest.approx((m.device_bytes - m.overhead_bytes) / (1 + H100.fragmentation_fraction))
    # more communicators (TP + DP + PP + tied-embedding groups vs DP only) cost more memory
    single = mem(Strategy(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=8, seq_length=2048))
    assert m.overhead_bytes > single.overhead_bytes


def test_tp_comm_overlap_and_ep_overlap_hide_communication():
    e0 = estimate(LLAMA, CLUSTER, BASE.with_(sequence_parallel=True))
    e1 = estimate(LLAMA, CLUSTER, BASE.with_(sequence_parallel=True, tp_comm_overlap=True))
    assert e1.breakdown["exposed_communication_by_axis"].get("tp", 0.0) < e0.breakdown["exposed_communication_by_axis"]["tp"]
    mc = load_cluster_ref("dgx-h100-x32")
    ms = Strategy(tp=2, pp=4, dp=32, ep=8, etp=1, vpp=2, micro_batch_size=1, global_batch_size=512, seq_length=4096,
                  recompute="none")
    a = estimate(MIXTRAL, mc, ms)
    b = estimate(MIXTRAL, mc, ms.with_(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True))
    assert b.breakdown["exposed_communication_by_axis"].get("ep", 0) < a.breakdown["exposed_communication_by_axis"]["ep"]


def test_check_verdict_has_a_margin(tmp_path):
    """`planner check` says FITS (with the model's stated margin), TIGHT (fits, but not by the
    margin: exit 0 with a warning) or DOES NOT FIT (exit 1), each with the numbers."""
    import json
    import subprocess
    import sys

    import yaml

    from planner.cost.memory import fixed_overhead_bytes, memory_uncertainty

    s = Strategy(tp=8, pp=2, dp=4, micro_batch_size=1, global_batch_size=64, seq_length=4096, recompute="none")
    launch = tmp_path / "l.sh"
    flags = ("torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py --num-layers 80 --hidden-size 8192 "
             "--ffn-hidden-size 28672 --num-attention-heads 64 --group-query-attention --num-query-groups 8 "
             "--vocab-size 128256 --swiglu --normalization RMSNorm --position-embedding-type rope "
             "--untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout 0 "
             "--hidden-dropout 0 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 "
             "--sequence-parallel --micro-batch-size 1 --global-batch-size 64 --seq-length 4096 "
             "--max-position-embeddings 8192 --use-distributed-optimizer --bf16\n")
    e = estimate(LLAMA, load_cluster_ref("dgx-h100-x8"), s)
    worst = max(e.memory, key=lambda m: m.total)
    u = memory_uncertainty(LLAMA)
    prof = yaml.safe_load(open("hardware_profiles/h100-sxm-80g.yaml"))

    def run(capacity_factor, expandable=True):
        launch.write_text(("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" if expandable else "") + flags)
        cap = worst.total * capacity_factor
        mem = cap * (1 + H100.fragmentation_fraction) + fixed_overhead_bytes(LLAMA, s, H100)
        prof["memory"] = f"{mem / 2**20:.3f} MiB"
        (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(prof))
        (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "c", "node_groups": [
            {"name": "g", "nodes": 8, "gpus_per_node": 8, "gpu": "gpu.yaml", "nics_per_node": 8,
             "nic_bandwidth": "400 Gb/s"}]}))
        args = [sys.executable, "-m", "planner.cli", "check", "--cluster", str(tmp_path / "c.yaml"),
                "--megatron-args", str(launch)]
        text = subprocess.run(args, capture_output=True, text=True)
        js = subprocess.run(args + ["--json"], capture_output=True, text=True)
        return text, json.loads(js.stdout)

    for factor, verdict, rc, word in ((1 + 2 * u, "fits", 0, "FITS"), (1 + u / 2, "tight", 0, "TIGHT"),
                                      (0.97, "does not fit", 1, "DOES NOT FIT")):
        text, doc = run(factor)
        assert text.returncode == rc and doc["verdict"] == verdict, (factor, text.stdout, text.stderr)
        assert word in text.stdout + text.stderr and "uncertainty" in text.stdout + text.stderr
    # PyTorch's default allocator: the margin adds its fragmentation spread, and TIGHT says how to drop it
    text, doc = run(1 + 2 * u, expandable=False)
    assert text.returncode == 0 and doc["verdict"] == "tight" and not doc["expandable_segments"]
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True removes that part" in text.stdout
