"""JSON Schemas (draft 2020-12) of the three spec files, for editors (YAML language servers
validate and complete with them; see docs/specs.md, 'Editor support').

The loaders stay the authority (ranges, cross-field rules, units); the schemas describe the
same fields and are checked against the loaders' field sets in tests/test_schema.py.
"""

from __future__ import annotations

from .cluster import (MAX_PRICE_PER_GPU_HOUR, MAX_SCALE_UP_DOMAIN_GPUS, REQUIRED_CLUSTER_FIELDS, REQUIRED_GROUP_FIELDS,
                      REQUIRED_INTERCONNECT_FIELDS)
from .hardware import DTYPES, EFF_REQUIRED_FIELDS, PROFILE_REQUIRED_FIELDS
from .model import NORMALIZATIONS, POSITION_EMBEDDINGS, REQUIRED_MODEL_FIELDS

_NUM = r"[0-9]*\.?[0-9]+([eE][+-]?[0-9]+)?"
BANDWIDTH = {"type": "string", "pattern": rf"^\s*{_NUM}\s*([kKmMgGtT]?b/s|[KMGT]bps|[KMGT]?B/s|GBps|[KMGT]iB/s)\s*$",
             "description": "bandwidth with units: '400 Gb/s' (bits), '450 GB/s' (bytes)"}
TIME = {"type": "string", "pattern": rf"^\s*{_NUM}\s*(ns|us|µs|ms|s)\s*$", "description": "time with units: '5 us'"}
SIZE = {"type": "string", "pattern": rf"^\s*{_NUM}\s*([KMGT]?B|[KMGT]iB)\s*$",
        "description": "size with units: '80 GB' (1e9 bytes), '2 TiB' (2^40 bytes)"}
NAME = {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"}
TEXT = {"type": "string"}


def _int(desc: str, minimum: int = 1) -> dict:
    return {"type": "integer", "minimum": minimum, "description": desc}


def _bool(desc: str) -> dict:
    return {"type": "boolean", "description": desc}


def _fraction(desc: str) -> dict:
    return {"type": "number", "minimum": 0, "maximum": 1, "description": desc}


MODEL_PROPERTIES = {
    "name": {**NAME, "description": "model name"},
    "num_layers": _int("decoder layers (--num-layers)"),
    "hidden_size": _int("model width h (--hidden-size)"),
    "num_attention_heads": _int("query heads a (--num-attention-heads)"),
    "vocab_size": _int("tokenizer vocabulary; padded to 128 x tp as Megatron does"),
    "num_query_groups": _int("K/V heads for GQA/MQA (--num-query-groups); default num_attention_heads"),
    "kv_channels": _int("head dimension (--kv-channels); default hidden_size / num_attention_heads"),
    "ffn_hidden_size": _int("MLP width (--ffn-hidden-size); default 4h, or 8h/3 rounded to 64 with SwiGLU"),
    "swiglu": _bool("gated SwiGLU MLP (3 matrices instead of 2)"),
    "normalization": {"enum": list(NORMALIZATIONS), "description": "LayerNorm or RMSNorm"},
    "untie_embeddings_and_output_weights": _bool("separate output layer (--untie-embeddings-and-output-weights)"),
    "position_embedding_type": {"enum": list(POSITION_EMBEDDINGS), "description": "Megatron --position-embedding-type"},
    "max_position_embeddings": _int("learned position table size (--max-position-embeddings)"),
    "add_bias_linear": _bool("biases in linear layers (Megatron default true)"),
    "add_qkv_bias": _bool("bias on the QKV projection only (Qwen2)"),
    "qk_layernorm": _bool("norms on queries and keys (Qwen3)"),
    "attention_dropout": _fraction("attention dropout probability (keeps a mask when > 0)"),
    "hidden_dropout": _fraction("hidden dropout probability (keeps masks when > 0)"),
    "num_experts": _int("routed experts per MoE layer (--num-experts); absent for dense models"),
    "moe_router_topk": _int("experts per token (--moe-router-topk)"),
    "moe_ffn_hidden_size": _int("expert MLP width (--moe-ffn-hidden-size)"),
    "moe_shared_expert_intermediate_size": _int("shared-expert MLP width (--moe-shared-expert-intermediate-size)"),
    "moe_layer_freq": {"oneOf": [{"type": "integer", "minimum": 1},
                                 {"type": "array", "items": {"enum": [0, 1]}},
                                 {"type": "string", "pattern": r"^\(?\s*\[[01](,\s*[01])*\](\s*\*\s*[0-9]+)?"
                                                               r"(\s*\+\s*\[[01](,\s*[01])*\](\s*\*\s*[0-9]+)?)*\s*\)?$"}],
                       "description": "which layers are MoE (--moe-layer-freq): k, a 0/1 list, or '([0]*3+[1]*58)'"},
    "moe_capacity_factor": {"type": "number", "exclusiveMinimum": 0,
                            "description": "token-dropping capacity factor (--moe-expert-capacity-factor)"},
    "multi_latent_attention": _bool("DeepSeek MLA (--multi-latent-attention)"),
    "q_lora_rank": _int("MLA query low-rank width (--q-lora-rank)"),
    "kv_lora_rank": _int("MLA key/value low-rank width (--kv-lora-rank)"),
    "qk_head_dim": _int("MLA non-rotary query/key head dim (--qk-head-dim)"),
    "qk_pos_emb_head_dim": _int("MLA rotary head dim (--qk-pos-emb-head-dim)"),
    "v_head_dim": _int("MLA value head dim (--v-head-dim)"),
    "moe_router_num_groups": _int("expert groups for node-limited routing (--moe-router-num-groups)"),
    "moe_router_group_topk": _int("groups a token may reach (--moe-router-group-topk)"),
    "mtp_num_layers": _int("multi-token-prediction layers after the decoder (--mtp-num-layers)", minimum=0),
    "window_size": _int("sliding-window attention: keys within this many tokens (--window-size)"),
    "window_attn_skip_freq": {"oneOf": [{"type": "integer", "minimum": 1}, {"type": "array", "items": {"enum": [0, 1]}},
                                        {"type": "string"}],
                              "description": "which layers use the window (--window-attn-skip-freq): every k-th full, or a 0/1 list (1 = window)"},
    "make_vocab_size_divisible_by": _int("vocabulary padded to a multiple of this x TP (--make-vocab-size-divisible-by; 128)", minimum=1),
    "source": {**TEXT, "description": "where the figures come from"},
    "notes": TEXT,
}

GROUP_PROPERTIES = {
    "name": {**NAME, "description": "node group name (stages are placed on groups by name)"},
    "nodes": _int("nodes in this group"),
    "gpus_per_node": _int("GPUs per node"),
    "scale_up_domain_gpus": _int("GPUs sharing one NVLink fabric across consecutive nodes (trays), a multiple of "
                                 "gpus_per_node; default gpus_per_node. A GB200 NVL72 rack of 4-GPU trays whose "
                                 "jobs use 64 of its 72 GPUs: 64") | {"maximum": MAX_SCALE_UP_DOMAIN_GPUS},
    "gpu": {**NAME, "description": "bundled hardware profile name (planner gpus), or a profile YAML path"},
    "nics_per_node": _int("scale-out NICs per node"),
    "nic_bandwidth": {**BANDWIDTH, "description": "line rate of one NIC, e.g. '400 Gb/s'"},
    "intra_node_bandwidth": {**BANDWIDTH, "description": "per GPU per direction on the scale-up fabric; "
                                                         "default the profile's scale_up_bandwidth"},
    "nic_latency": {**TIME, "description": "per message across nodes; default 5 us"},
    "host_memory": {**SIZE, "description": "host DRAM per node (for optimizer offload)"},
    "price_per_gpu_hour": {"type": "number", "minimum": 0, "maximum": MAX_PRICE_PER_GPU_HOUR,
                           "description": "USD per GPU-hour (optional): $ per million tokens, $ to a token "
                                          "budget and plan --objective cost"},
}
INTERCONNECT_PROPERTIES = {
    "between": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 2,
                "description": "the two node groups this link joins"},
    "bandwidth": {**BANDWIDTH, "description": "per node, per direction, between the groups"},
    "latency": TIME,
}
_SOURCE = {"type": "object", "additionalProperties": False, "required": ["file", "lines", "date"],
           "properties": {"file": TEXT, "lines": TEXT, "date": TEXT, "what": TEXT, "sha256": TEXT}}


def _calibrated(value: dict, desc: str) -> dict:
    """One calibrated parameter: a value with where it was measured, or why it was left alone."""
    return {"type": "object", "additionalProperties": False, "description": desc,
            "properties": {"value": value, "profile": {"description": "the profile's value (informational)"},
                           "from": {"type": "array", "minItems": 1, "items": _SOURCE},
                           "left_at_profile": {**TEXT, "description": "why no input constrains it"}}}


_RATIO = {"type": "number", "exclusiveMinimum": 0}
CALIBRATION_PROPERTIES = {
    "created": TEXT, "tool": TEXT, "notes": TEXT,
    "gpus": {"type": "object", "description": "per GPU profile name",
             "additionalProperties": {"type": "object", "additionalProperties": False, "properties": {
                 "compute_time_scale": _calibrated(_RATIO, "measured / modelled compute time"),
                 "cuda_context": _calibrated(SIZE, "fixed memory outside the allocator's tensors (context, kernels)"),
                 "fragmentation_fraction": _calibrated({"type": "number", "minimum": 0, "maximum": 0.5},
                                                       "caching-allocator loss, fraction of capacity")}}},
    "node_groups": {"type": "object", "description": "per node group name",
                    "additionalProperties": {"type": "object", "additionalProperties": False, "properties": {
                        "scale_up_bus_bandwidth": _calibrated(BANDWIDTH, "NCCL bus bandwidth per GPU in a node"),
                        "scale_up_latency": _calibrated(TIME, "per message inside a node"),
                        "scale_out_bus_bandwidth": _calibrated(BANDWIDTH, "NCCL bus bandwidth per node across nodes"),
                        "nic_latency": _calibrated(TIME, "per message across nodes")}}},
    "interconnect": {"type": "array", "items": {
        "type": "object", "additionalProperties": False, "required": ["between"], "properties": {
            "between": INTERCONNECT_PROPERTIES["between"],
            "bus_bandwidth": _calibrated(BANDWIDTH, "per node, between the two groups"),
            "latency": _calibrated(TIME, "per message between the two groups")}}},
}
CLUSTER_PROPERTIES = {
    "name": {**NAME, "description": "cluster name"},
    "node_groups": {"type": "array", "minItems": 1,
                    "items": {"type": "object", "properties": GROUP_PROPERTIES, "additionalProperties": False,
                              "required": sorted(REQUIRED_GROUP_FIELDS)}},
    "interconnect": {"type": "array",
                     "items": {"type": "object", "properties": INTERCONNECT_PROPERTIES,
                               "additionalProperties": False, "required": sorted(REQUIRED_INTERCONNECT_FIELDS)}},
    "source": TEXT,
    "notes": TEXT,
    "calibration": {"type": "object", "properties": CALIBRATION_PROPERTIES, "additionalProperties": False,
                    "description": "fitted by `planner calibrate` from the cluster's own logs and nccl-tests"},
}

EFFICIENCY_PROPERTIES = {
    "matmul": _fraction("large-GEMM achieved / peak tensor TFLOP/s"),
    "memory_bandwidth": _fraction("streaming kernels achieved / peak HBM bandwidth"),
    "kernel_overhead": {**TIME, "description": "fixed cost per kernel (launch + tail wave)"},
    "scale_up": _fraction("NCCL bus bandwidth / scale-up link rate"),
    "network": _fraction("NCCL bus bandwidth / NIC line rate"),
    "flash_attention": _fraction("fused attention achieved / peak TFLOP/s"),
    "matmul_fp8": _fraction("large fp8 GEMM achieved / fp8 peak TFLOP/s (default: matmul)"),
    "matmul_fp4": _fraction("large NVFP4 GEMM achieved / fp4 peak TFLOP/s (default: matmul_fp8, then matmul)"),
    "gemm_tile": _int("GEMM output tile edge, elements: work on partial tiles is wasted (default 128)"),
    "gemm_k_fill": _int("per-tile pipeline fill + epilogue, in K-loop elements (default 0)", minimum=0),
    "host_launch_overhead": {**TIME, "description": "host CPU time to issue one kernel from eager PyTorch (default 0)"},
}
PROFILE_PROPERTIES = {
    "name": {**NAME, "description": "profile name"},
    "vendor": TEXT,
    "memory": {**SIZE, "description": "device memory as CUDA/HIP reports it (torch total_memory, a few hundred MiB below nvidia-smi)"},
    "memory_bandwidth": {**BANDWIDTH, "description": "peak HBM bandwidth"},
    "peak_tflops": {"type": "object", "additionalProperties": False, "minProperties": 1,
                    "properties": {d: {"type": "number", "exclusiveMinimum": 0} for d in DTYPES},
                    "description": "dense tensor-core peak per dtype, TFLOP/s, no sparsity"},
    "scale_up_bandwidth": {**BANDWIDTH, "description": "per GPU, per direction (NVLink / xGMI / PCIe peer)"},
    "scale_up_latency": TIME,
    "pcie_bandwidth": {**BANDWIDTH, "description": "host link, per direction"},
    "cuda_context": {**SIZE, "description": "CUDA context with the kernels PyTorch/TE/cuDNN/NCCL load"},
    "nccl_memory_per_communicator": {**SIZE, "description": "NCCL buffers of one communicator"},
    "fragmentation_fraction": {"type": "number", "minimum": 0, "maximum": 0.5,
                               "description": "caching allocator: reserved beyond allocated, as a fraction of allocated"},
    "compute_capability": {"type": "number", "minimum": 1, "description": "CUDA compute capability (e.g. 9.0 for H100)"},
    "sm_count": _int("streaming multiprocessors (AMD: compute units), e.g. 132 for H100 SXM; absent: SMs taken by "
                     "communication kernels are not charged to the GEMMs beside them"),
    "efficiency": {"type": "object", "properties": EFFICIENCY_PROPERTIES, "additionalProperties": False,
                   "required": sorted(EFF_REQUIRED_FIELDS)},
    "source": TEXT,
    "uncertain": {"type": "array", "items": TEXT, "description": "fields not measured, only estimated"},
    "notes": TEXT,
}


def _document(title: str, properties: dict, required) -> dict:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, "type": "object",
            "properties": properties, "required": sorted(required), "additionalProperties": False}


def schema(kind: str) -> dict:
    """The JSON Schema of a spec kind: model | cluster | profile."""
    if kind == "model":
        return _document("planner model spec", MODEL_PROPERTIES, REQUIRED_MODEL_FIELDS)
    if kind == "cluster":
        return _document("planner cluster spec", CLUSTER_PROPERTIES, REQUIRED_CLUSTER_FIELDS)
    if kind == "profile":
        return _document("planner hardware profile", PROFILE_PROPERTIES, PROFILE_REQUIRED_FIELDS)
    raise KeyError(kind)

