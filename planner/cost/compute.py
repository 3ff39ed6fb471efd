"""Compute time of one layer for one micro-batch on one GPU, from its operations.

FLOPs: a GEMM of (M x K) @ (K x N) costs 2 M N K FLOPs (forward); backward costs twice that
(input gradient + weight gradient). Attention scores and AV cost 4 s_q s_k b a d (forward);
the causal mask halves the work of fused (flash) kernels, which skip masked blocks; unfused
kernels compute all of it. These reproduce Narayanan et al. 2021 eq. 3 (tests/test_flops.py).

Time: each operation is a kernel of cost/kernels.py (a GEMM's roofline, a memory-bound pass,
a quantization pass); elementwise kernels (norms, activations, residual/dropout, softmax,
RoPE, MoE permutation) are priced by the bytes they stream. Small per-GPU GEMMs at high TP thus
run below peak, and GPUs with a high FLOP/byte ratio (H100 vs A100) lose more to memory-bound
ops.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidStrategy
from ..specs.hardware import GPUProfile
from ..specs.model import ModelSpec
from ..strategy import Strategy
from .activations import attention_on_gpu, expert_tokens_per_rank
from .kernels import (BYTES_16BIT, FP8_CAST_BYTES, gemm_dtype, gemm_time, high_precision_dtype, quantization_pass,
                      stream_time)
from .moe_schedule import MoENodes, ScheduleNode

# Flash-attention backward does 5 matmuls to the forward's 2 (it recomputes P): 2.5x forward FLOPs
# (Dao 2023, FlashAttention-2, sec. 3.1). Unfused attention backward is 2x forward, like GEMMs.
FLASH_BACKWARD_FACTOR = 2.5
# SMs the MoE dispatcher's all-to-all kernels hold while they run (cost/moe_schedule.py charges
# them to the compute beside them):
# - alltoall dispatcher, NCCL: an all-to-all is grouped send / recv, one CTA per p2p channel it
#   spreads over, and with a peer per rank it spreads over all of them. NCCL makes the p2p
#   channels pow2Up(min(its collective channels, NCCL_MAX_P2P_NCHANNELS)) (nccl src/graph/paths.cc
#   ncclTopoComputeP2pChannels, NVIDIA/nccl 5067397); NCCL's init logs on 8 x H100 SXM
#   (p5.48xlarge, NVLink + NVSwitch) read "24 coll channels, ..., 32 p2p channels, 32 p2p
#   channels per peer", on 2 nodes (IB) the same 32 p2p channels. Blackwell and the other
#   profiles are taken alike (no published log found: uncertain).
NCCL_ALL_TO_ALL_CTAS = 32
# - flex dispatcher, DeepEP: Megatron sets Buffer.set_num_sms(moe_flex_dispatcher_num_sms, or 20
#   when unset: "DeepEP's historical mcore default", megatron/core/transformer/moe/
#   token_dispatcher.py, Megatron-LM d98e8a6; DeepEP's legacy Buffer.num_sms = 20 likewise).
#   Strategy.moe_flex_dispatcher_num_sms carries a set count (HybridEP's default is resolved
#   when the flags are read, planner/megatron/strategy_from_flags.py).
DEEPEP_DEFAULT_NUM_SMS = 20


@dataclass(frozen=True)
class LayerTime:
    """Seconds for one layer, one micro-batch, on one GPU (compute only, no communication)."""
    forward: float
    backward_input: float     # input-gradient part (B of zero-bubble schedules)
    backward_weight: float    # weight-gradient part (W)
    recompute: float          # extra forward work in backward under recomputation
    core_attention_forward: float  # the part selective recompute repeats
    column_parallel_gemm_forward: float  # forward GEMMs of the column-parallel linears (QKV, fc1):
    # their backward TP collectives overlap their own wgrad/dgrad GEMMs (cost/parallel.py)
    flops_forward: float      # hardware FLOPs of the forward pass
    host_forward: float = 0.0   # host seconds to issue the forward's kernels (0 under a CUDA graph)
    host_backward: float = 0.0  # host seconds to issue the backward's (and recompute's) kernels
    # with --tp-comm-overlap: per TP-split GEMM in forward order (QKV, out-proj, fc1, fc2 or the
    # shared expert's), (its time whole, its time as tp chunks of m / tp rows): userbuffers run
    # it chunk by chunk while the ring exchange brings the next chunk
    tp_overlap_gemms: tuple = ()
    tp_degree: int = 1
    # a MoE layer as the units its schedule places on the GPU's streams (cost/moe_schedule.py)
    moe_nodes: MoENodes | None = None
    # forward GPU seconds by part (qkv, core_attn, router, permute, experts_fc1, ...): what
    # --explain shows; they add up to `forward`
    parts_forward: tuple[tuple[str, float], ...] = ()

    @property
    def total(self) -> float:
        return self.forward + self.backward_input + self.backward_weight + self.recompute


# The MoE layer's parts by schedule node: the routed experts (the "mlp" node, between dispatch
# and combine) and what the combine node runs after its all-to-all (combine_postprocess's
# unpermutation, the mlp bias-dropout-add); every other part is the pre-dispatch node
# (attention, pre-MLP norm, shared expert, router, dispatch preprocess's permutation).
MOE_EXPERT_PARTS = ("experts_fc1", "moe_act", "experts_fc2")
MOE_POST_COMBINE_PARTS = ("unpermute", "residual_mlp")


def attention_head_dims(model: ModelSpec):
    if model.multi_latent_attention:
        return model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
    return model.kv_channels, model.kv_channels


# Kernels the host issues per forward module when a layer runs eagerly (PyTorch ops, Megatron
# and Transformer Engine modules; counted from their forward paths at Megatron-LM d98e8a6 / TE
# d0067d0, a planner estimate): a TE linear launches its GEMM plus its cast/amax bookkeeping; a
# grouped linear launches one cuBLAS GEMM per local expert (multi_stream_cublas_gemm in
# transformer_engine/common/gemm/cublaslt_gemm.cu; the CUTLASS grouped kernel is opt-in,
# NVTE_USE_CUTLASS_GROUPED_GEMM, Hopper bf16 only) and under fp8 quantizes each expert's rows
# separately; the router's softmax /
# top-k / aux-loss ops and the token permutation are many small kernels. The backward issues
# about twice the forward's (dgrad and wgrad per GEMM, a backward per elementwise op). An
# all-to-all is one NCCL kernel.
HOST_KERNELS = {"te_linear": 3, "te_linear_fp8": 6, "norm": 1, "rope": 2, "attention": 3, "residual": 1,
                "activation": 1, "router": 14, "permute": 8, "unpermute": 6, "all_to_all": 1}
HOST_BACKWARD_PER_FORWARD_KERNEL = 2.0


class _Parts:
    """Accumulates one layer's forward seconds, FLOPs and host kernels by named part."""

    def __init__(self, gpu: GPUProfile, dtype: str, fp8: bool, cast_bytes: float = FP8_CAST_BYTES,
                 cast_kernels: int = 1, high_dtype: str | None = None):
        # fp8: the linears quantize (fp8 or fp4); cast_bytes / cast_kernels: one quantization's
        # bytes per element and kernels (the recipe's); high_dtype: GEMMs TE does not quantize
        self.gpu, self.dt, self.fp8 = gpu, dtype, fp8
        self.cast_bytes, self.cast_kernels = cast_bytes, cast_kernels
        self.high_dt = high_dtype or dtype
        self.quantized_outputs = 0.0   # elements of the quantized linears' outputs (their gradients)
        self.quantized_linears = 0     # quantized linear kernels (one output gradient each)
        self.time: dict[str, float] = {}
        self.gemm: dict[str, float] = {}   # GEMM share of each part (dgrad and wgrad repeat it)
        self.flops = 0.0
        self.kernels: dict[str, float] = {}
        self.gpu_kernels: dict[str, float] = {}   # kernels whose fixed cost the times include

    def _add(self, part: str, seconds: float, kernels: float, gemm: bool, gpu_kernels: float = 0.0) -> None:
        self.time[part] = self.time.get(part, 0.0) + seconds
        self.kernels[part] = self.kernels.get(part, 0.0) + kernels
        self.gpu_kernels[part] = self.gpu_kernels.get(part, 0.0) + gpu_kernels
        if gemm:
            self.gemm[part] = self.gemm.get(part, 0.0) + seconds

    def charge_kernels(self) -> None:
        """Every kernel a part launches costs the GPU its fixed kernel_overhead (launch and tail),
        also the small ones the roofline terms do not price (a TE linear's casts and amax
        bookkeeping, the router's and the permutation's many ops): the kernel counts the host
        issues (HOST_KERNELS) beyond those the part's times already include. They are
        elementwise work, so the backward repeats them twice (layer_time)."""
        per = self.gpu.efficiency.kernel_overhead_s * self.gpu.compute_time_scale
        for part, k in self.kernels.items():
            extra = k - self.gpu_kernels.get(part, 0.0)
            if extra > 0:
                self.time[part] = self.time.get(part, 0.0) + extra * per

    def linear(self, part: str, m: float, n: float, k: float, batch: float = 1, grouped: bool = False,
               quantized: bool = True) -> None:
        """A (TE) linear layer: its GEMM(s); under fp8 its input is quantized unless a fused
        norm produced it in fp8 (quantize_input=False is passed for those). quantized=False: a
        GEMM outside TE's quantized linears (the router), in high_dt."""
        dt = self.dt if quantized else self.high_dt
        self._add(part, gemm_time(self.gpu, dt, m, n, k, batch), 0.0, True, 1.0)
        self.flops += 2.0 * m * n * k * batch
        if quantized:
            self.quantized_outputs += m * n * batch
            self.quantized_linears += 1
        host = HOST_KERNELS["te_linear_fp8" if self.fp8 and quantized else "te_linear"]
        if grouped:
            host += batch - 1          # one cuBLAS GEMM per expert (TE multi_stream_cublas_gemm)
            if self.fp8:
                host += 2 * batch      # per-expert quantization of the grouped inputs
        self.kernels[part] = self.kernels.get(part, 0.0) + host

    def stream(self, part: str, nbytes: float, kernels: int, host: float | None = None) -> None:
        self._add(part, stream_time(self.gpu, nbytes, kernels), kernels if host is None else host, False, kernels)

    def quantize(self, part: str, elements: float) -> None:
        """Quantization of a 16-bit tensor of `elements` for a quantized GEMM: the recipe's
        cast_bytes per element in cast_kernels kernels (quantization_pass)."""
        self.stream(part, elements * self.cast_bytes, kernels=self.cast_kernels)

    def total(self, parts=None) -> float:
        return sum(v for k, v in self.time.items() if parts is None or k in parts)

    def host(self, parts=None) -> float:
        return sum(v for k, v in self.kernels.items() if parts is None or k in parts)


# Parts each --recompute-modules entry re-runs (megatron/core/transformer/transformer_layer.py,
# attention.py, mlp.py, moe/moe_layer.py, experts.py, multi_latent_attention.py)
RECOMPUTE_PARTS = {
    "core_attn": ("core_attn",),
    "mlp": ("norm_mlp", "fc1", "act", "fc2"),
    "moe": ("norm_mlp", "router", "permute", "experts_fc1", "moe_act", "experts_fc2", "unpermute", "shared"),
    "moe_act": ("moe_act",),
    "layernorm": ("norm_attn", "norm_mlp"),
    "mla_up_proj": ("mla_up", "rope"),
    "shared_experts": ("shared",),
}


def attention_keys_per_query(model: ModelSpec, seq_length: int) -> float:
    """Mean keys a causal query attends to: (s + 1) / 2, or with a sliding window of w keys
    (--window-size) (w + 1) - w (w + 1) / (2 s) once s >= w; averaged over the layers when only
    some use the window (--window-attn-skip-freq)."""
    s = seq_length
    w = model.window_size
    full = (s + 1) / 2
    if not w or w >= s:
        return full
    windowed = (w + 1) - w * (w + 1) / (2 * s)
    pat = model.window_attention_pattern
    share = sum(pat) / len(pat) if pat else 1.0
    return share * windowed + (1 - share) * full


def cuda_graph_parts(s: Strategy, moe: bool) -> set | None:
    """Parts whose kernels a CUDA graph replays (no host cost): all with --cuda-graph-scope
    full_iteration; per layer (--cuda-graph-impl local / transformer_engine, scope attn, mlp,
    moe_router, moe_preprocess, or the whole layer). None: no graph. A dropless MoE layer's expert
    part has data-dependent shapes and is never captured (megatron/core/transformer/cuda_graphs.py)."""
    if s.cuda_graph_impl == "none":
        return None
    scope = set(s.cuda_graph_scope) or {"full"}
    if "full_iteration" in scope:
        return {"*"}
    parts = set()
    if scope & {"full", "attn"}:
        parts |= {"norm_attn", "qkv", "mla_up", "rope", "qk_norm", "core_attn", "proj", "residual_attn"}
    if scope & {"full", "mlp"} and not moe:
        parts |= {"norm_mlp", "fc1", "act", "fc2", "residual_mlp"}
    if moe and scope & {"full", "moe_router", "moe"}:
        parts |= {"norm_mlp", "router"}
    if moe and scope & {"full", "moe_preprocess", "moe"}:
        parts |= {"permute"}
    if moe and s.moe_pad_expert_input_to_capacity and scope & {"full", "moe"}:
        parts |= {"experts_fc1", "moe_act", "experts_fc2", "unpermute", "shared", "residual_mlp"}
    return parts


@dataclass(frozen=True)
class _Shapes:
    """One layer's shapes on one rank for one micro-batch (layer_time's blocks share them)."""
    t: int              # TP degree
    M: float            # tokens through TP-sharded GEMMs on this rank (s/cp x b)
    M_sp: float         # tokens through norms and dropout (SP splits them over TP)
    s_q: float          # queries per sequence on this rank (s / cp)
    h: int
    a_loc: float        # attention heads on this rank
    g_loc: float        # query groups on this rank
    dqk: int
    dv: int
    fp8: bool           # the TE linears quantize their inputs (fp8 or NVFP4)
    fp4: bool
    norm_bytes: float   # a norm: read its input, write its output
    res_bytes: float    # bias-dropout-add


def layer_time(model: ModelSpec, s: Strategy, gpu: GPUProfile, moe: bool) -> LayerTime:
    """Seconds of one transformer layer (dense, or MoE with `moe`) for one micro-batch on one
    GPU: its forward by part, input- and weight-gradient backward, recompute, the host time to
    issue it, the MoE units the schedule places (cost/moe_schedule.py) and the GEMMs TP comm
    overlap pairs with its collectives."""
    s = attention_on_gpu(s, gpu)
    dt = gemm_dtype(s, gpu)
    cast_bytes, cast_kernels = quantization_pass(s, dt)
    t, b = s.tp, s.micro_batch_size
    s_q = s.seq_length / s.cp
    M = s_q * b
    M_sp = M / t if s.sp else M
    h = model.hidden_size
    dqk, dv = attention_head_dims(model)
    x = _Shapes(t=t, M=M, M_sp=M_sp, s_q=s_q, h=h, a_loc=model.num_attention_heads / t,
                g_loc=max(model.num_query_groups / t, 1.0), dqk=dqk, dv=dv, fp8=dt in ("fp8", "fp4"),
                fp4=dt == "fp4", norm_bytes=2 * BYTES_16BIT * M_sp * h,
                res_bytes=(3 * BYTES_16BIT + (1 if model.hidden_dropout > 0 else 0)) * M_sp * h)
    P = _Parts(gpu, dt, x.fp8, cast_bytes, cast_kernels, high_precision_dtype(s, gpu))
    core, core_bwd = _attention_block(P, model, s, gpu, dt, x)
    _mlp_block(P, model, s, gpu, moe, x)
    P.stream("residual_mlp", x.res_bytes, 1, HOST_KERNELS["residual"])
    P.charge_kernels()
    fwd = P.total()
    gemm_fwd = sum(P.gemm.values())
    elementwise = fwd - gemm_fwd - core
    # backward: each GEMM's dgrad and wgrad take its forward time (under fp8 the output
    # gradients are quantized too); elementwise ops about twice their forward
    grad_quant = 0.0
    if x.fp8:
        # every quantized TE linear quantizes its output gradient for its dgrad and wgrad GEMMs
        # (TransformerEngine module/base.py grad_output_preprocess, with the recipe's grad-output
        # quantizer; under NVFP4 with the Hadamard transform and stochastic rounding,
        # NVFP4BlockScaling fp4_quant_bwd_grad): Megatron's linears are separate TE modules (the
        # activation between fc1 and fc2 is Megatron's), so no grad-output cast is fused away
        grad_quant = stream_time(gpu, P.quantized_outputs * cast_bytes, cast_kernels * P.quantized_linears)
    b_input = gemm_fwd + core_bwd + 2 * elementwise + grad_quant
    b_weight = gemm_fwd
    rec_parts = recomputed_parts(s)
    recompute = P.total(rec_parts) if rec_parts is None or rec_parts else 0.0
    graphed = cuda_graph_parts(s, moe)
    host_f, host_b = _host_seconds(P, gpu, graphed, rec_parts)
    nodes = None
    if moe:
        host_s = 0.0 if graphed is not None and "*" in graphed else gpu.efficiency.host_launch_overhead_s
        # dropless routing: the host waits for the token counts (alltoall / flex dispatchers)
        synced = s.moe_token_dispatcher_type != "allgather" and not s.moe_pad_expert_input_to_capacity
        # a full recompute re-runs the whole forward, all-to-alls included: the schedule adds it
        # as a forward of its own (cost/parallel.py moe_layer_seconds), so the units leave it out
        nodes = MoENodes(*_moe_nodes(P, core, core_bwd, grad_quant, set() if rec_parts is None else rec_parts,
                                     graphed, host_s),
                         host_a2a_s=HOST_KERNELS["all_to_all"] * host_s, synced=synced,
                         shared_forward_s=P.gemm.get("shared", 0.0), comm_sm_share=comm_sm_share(s, gpu))
    col_parts = ("qkv", "mla_up", "fc1", "shared")
    return LayerTime(forward=fwd, backward_input=b_input, backward_weight=b_weight,
                     recompute=recompute, core_attention_forward=core, flops_forward=P.flops,
                     column_parallel_gemm_forward=sum(P.gemm.get(k, 0.0) for k in col_parts),
                     host_forward=host_f, host_backward=host_b,
                     tp_overlap_gemms=_tp_overlap_gemms(model, s, gpu, dt, moe, x),
                     tp_degree=t, moe_nodes=nodes, parts_forward=tuple(P.time.items()))


def _attention_block(P: "_Parts", model: ModelSpec, s: Strategy, gpu: GPUProfile, dt: str, x: _Shapes):
    """The attention block's forward into P: input norm, QKV (or MLA's down/up projections),
    QK norm, RoPE, core attention, out-projection, residual. (core forward, core backward) s."""
    M, h, a_loc, g_loc, dqk, dv, s_q = x.M, x.h, x.a_loc, x.g_loc, x.dqk, x.dv, x.s_q
    b = s.micro_batch_size
    # input norm (fused into the QKV linear by TE, still one pass)
    P.stream("norm_attn", x.norm_bytes, 1, HOST_KERNELS["norm"])
    if x.fp4:
        # NVFP4 with Hadamard transforms: TE's norm does not emit NVFP4 itself (normalization.cpp
        # Impl::UNFUSED), its 16-bit output is quantized by the NVFP4 cast
        P.quantize("qkv", M * h)
    if model.multi_latent_attention:
        if model.q_lora_rank:
            P.linear("qkv", M, model.q_lora_rank, h)
            P.linear("mla_up", M, a_loc * dqk, model.q_lora_rank)
        else:
            P.linear("mla_up", M, a_loc * dqk, h)
        P.linear("qkv", M, model.kv_lora_rank + model.qk_pos_emb_head_dim, h)
        P.linear("mla_up", M, a_loc * (model.qk_head_dim + dv), model.kv_lora_rank)
        P.stream("norm_attn", 2 * BYTES_16BIT * M * ((model.q_lora_rank or 0) + model.kv_lora_rank), 2)
    else:
        P.linear("qkv", M, (a_loc + 2 * g_loc) * model.kv_channels, h)
    if model.qk_layernorm:
        P.stream("qk_norm", 2 * BYTES_16BIT * M * (a_loc + g_loc) * dqk, 2)
    if model.position_embedding_type == "rope":
        P.stream("rope", 2 * BYTES_16BIT * M * (a_loc + g_loc) * dqk, 2, HOST_KERNELS["rope"])
    # core attention (per rank: s/cp queries; CP load-balances causality)
    keys = attention_keys_per_query(model, s.seq_length)
    if s.fused_attention:
        # flash / cuDNN: causal blocks above the diagonal skipped; 2 GEMM-like passes forward
        attn_flops = 4.0 * s_q * keys * b * a_loc * (dqk + dv) / 2
        core = gpu.compute_time_scale * (attn_flops / (gpu.peak(dt if dt not in ("fp8", "fp4") else "bf16")
                                                       * gpu.efficiency.flash_attention)
                                         + gpu.efficiency.kernel_overhead_s)
        P._add("core_attn", core, HOST_KERNELS["attention"], False, 1.0)
        core_bwd = core * FLASH_BACKWARD_FACTOR
    else:
        # two batched GEMMs per (micro-batch, local head): QK^T (s_q x d) @ (d x s_k) and
        # AV (s_q x s_k) @ (s_k x d_v) over all keys, + fused scale-mask-softmax (+ dropout)
        attn_flops = 4.0 * s_q * s.seq_length * b * a_loc * (dqk + dv) / 2
        heads = b * a_loc
        core = (gemm_time(gpu, P.high_dt, s_q, s.seq_length, dqk, batch=heads)
                + gemm_time(gpu, P.high_dt, s_q, dv, s.seq_length, batch=heads))
        score_elems = s_q * s.seq_length * b * a_loc
        bytes_sm = BYTES_16BIT * 2 * score_elems + (5 * score_elems if model.attention_dropout > 0 else 0)
        core += stream_time(gpu, bytes_sm, kernels=2)
        P._add("core_attn", core, HOST_KERNELS["attention"] + 2, False, 4.0)
        core_bwd = 2 * core
    P.flops += attn_flops
    if x.fp8:
        P.quantize("proj", M * a_loc * dv)   # the attention output feeds the out-projection
    P.linear("proj", M, h, a_loc * dv)
    P.stream("residual_attn", x.res_bytes, 1, HOST_KERNELS["residual"])
    return core, core_bwd


def _mlp_block(P: "_Parts", model: ModelSpec, s: Strategy, gpu: GPUProfile, moe: bool, x: _Shapes) -> None:
    """The MLP block's forward into P: norm, then fc1 / activation / fc2, or for a MoE layer the
    router, permutation, grouped expert GEMMs, unpermutation and the shared expert."""
    M_sp, h = x.M_sp, x.h
    glu = 2 if model.swiglu else 1
    P.stream("norm_mlp", x.norm_bytes, 1, HOST_KERNELS["norm"])
    if not moe:
        _tp_mlp(P, x, model.ffn_hidden_size, glu, ("fc1", "act", "fc2"))
        return
    T = expert_tokens_per_rank(model, s)   # routed token copies on this rank
    e_loc = model.num_experts / s.ep
    f = model.moe_ffn_hidden_size / s.expert_tp
    P.linear("router", M_sp, model.num_experts, h, quantized=not x.fp4)
    P.stream("router", (BYTES_16BIT + 4) * M_sp * model.num_experts * 3, 4, HOST_KERNELS["router"])
    P.stream("permute", 2 * BYTES_16BIT * T * h, 2, HOST_KERNELS["permute"])
    # grouped GEMMs over the local experts: e_loc GEMMs of T / e_loc tokens in one kernel
    # (TE GroupedLinear), plus one kernel overhead per further expert for its tiles' setup
    per_expert_s = (e_loc - 1) * gpu.efficiency.kernel_overhead_s * gpu.compute_time_scale
    if x.fp8:
        P.quantize("experts_fc1", T * h)
    P.linear("experts_fc1", T / e_loc, f * glu, h, batch=e_loc, grouped=True)
    P._add("experts_fc1", per_expert_s, 0.0, True, e_loc - 1)
    P.stream("moe_act", BYTES_16BIT * T * f * (glu + 1), 1, HOST_KERNELS["activation"])
    if x.fp8:
        P.quantize("experts_fc2", T * f)
    P.linear("experts_fc2", T / e_loc, h, f, batch=e_loc, grouped=True)
    P._add("experts_fc2", per_expert_s, 0.0, True, e_loc - 1)
    P.stream("unpermute", 2 * BYTES_16BIT * T * h, 2, HOST_KERNELS["unpermute"])
    if model.moe_shared_expert_intermediate_size:
        _tp_mlp(P, x, model.moe_shared_expert_intermediate_size, glu, ("shared",) * 3)


def _tp_mlp(P: "_Parts", x: _Shapes, f: int, glu: int, parts: tuple[str, str, str]) -> None:
    """A TP-sharded MLP of width f (the dense MLP, or a MoE layer's shared expert) on the layer's
    M tokens, its fc1 / activation / fc2 charged to `parts`: fc1 (gated: 2 f / t wide), the
    activation streaming its input and output, fc2; under fp8 fc2's input is quantized (fc1's
    comes fused from the norm), under NVFP4 fc1's too."""
    M, h, t = x.M, x.h, x.t
    fc1, act, fc2 = parts
    if x.fp4:
        P.quantize(fc1, M * h)
    P.linear(fc1, M, f * glu / t, h)
    P.stream(act, BYTES_16BIT * M * f / t * (glu + 1), 1, HOST_KERNELS["activation"])
    if x.fp8:
        P.quantize(fc2, M * f / t)
    P.linear(fc2, M, h, f / t)


def recomputed_parts(s: Strategy):
    """The parts of a layer its backward recomputes: None for all of them (full recompute),
    else those of the selective modules (RECOMPUTE_PARTS)."""
    if s.recompute == "full":
        return None
    parts: set = set()
    if s.recompute == "selective":
        for mod in s.recompute_modules:
            parts |= set(RECOMPUTE_PARTS.get(mod, ()))
    return parts


def _host_seconds(P: "_Parts", gpu: GPUProfile, graphed, rec_parts) -> tuple[float, float]:
    """Host seconds to issue the layer's kernels, forward and backward (with what it
    recomputes), less what CUDA graphs replay."""
    if graphed is not None and "*" in graphed:
        return 0.0, 0.0
    eager = None if graphed is None else [k for k in P.kernels if k not in graphed]
    host_f = P.host(eager) * gpu.efficiency.host_launch_overhead_s
    host_b = host_f * HOST_BACKWARD_PER_FORWARD_KERNEL
    if rec_parts is None:
        host_b += host_f
    elif rec_parts:
        host_b += P.host([k for k in rec_parts if eager is None or k in eager]) * gpu.efficiency.host_launch_overhead_s
    return host_f, host_b


def _tp_overlap_gemms(model: ModelSpec, s: Strategy, gpu: GPUProfile, dt: str, moe: bool, x: _Shapes) -> tuple:
    """With --tp-comm-overlap: (whole, chunked) forward seconds of the GEMMs TE userbuffers pairs
    with TP collectives (QKV, out-projection, fc1, fc2 or the shared expert's), in that order."""
    t, M, h = x.t, x.M, x.h
    if not (s.tp_comm_overlap and t > 1 and s.sp):
        return ()
    glu = 2 if model.swiglu else 1
    shapes = [(M, (x.a_loc + 2 * x.g_loc) * model.kv_channels, h), (M, h, x.a_loc * x.dv)]
    if not moe:
        shapes += [(M, model.ffn_hidden_size * glu / t, h), (M, h, model.ffn_hidden_size / t)]
    elif model.moe_shared_expert_intermediate_size:
        fs = model.moe_shared_expert_intermediate_size
        shapes += [(M, fs * glu / t, h), (M, h, fs / t)]
    return tuple((gemm_time(gpu, dt, m, n, k), t * gemm_time(gpu, dt, m / t, n, k)) for m, n, k in shapes)


def comm_sm_share(s: Strategy, gpu: GPUProfile) -> float:
    """Share of the GPU's SMs the MoE dispatcher's all-to-all kernels take while they run
    (their SMs / the GPU's sm_count); 0 for a profile without sm_count, and for the allgather
    dispatcher, which nothing overlaps (Megatron refuses both EP overlaps with it,
    transformer_config.py)."""
    if gpu.sm_count is None or s.moe_token_dispatcher_type == "allgather":
        return 0.0
    if s.moe_token_dispatcher_type == "flex":
        sms = s.moe_flex_dispatcher_num_sms or DEEPEP_DEFAULT_NUM_SMS
    else:
        sms = NCCL_ALL_TO_ALL_CTAS
    if sms >= gpu.sm_count:
        raise InvalidStrategy("moe-dispatcher-sms", f"moe_flex_dispatcher_num_sms {sms} leaves none of {gpu.name}'s "
                              f"{gpu.sm_count} SMs to the GEMMs; expected fewer than {gpu.sm_count}")
    return sms / gpu.sm_count


def _moe_nodes(P: "_Parts", core: float, core_bwd: float, grad_quant: float, rec_parts, graphed,
               host_s: float) -> tuple[ScheduleNode, ScheduleNode, ScheduleNode]:
    """A MoE layer's (pre-dispatch, experts, post-combine) units from its parts, with the
    backward rules layer_time applies to the whole layer (a GEMM's dgrad and wgrad each take its
    forward time, elementwise work twice its forward, the fused attention's backward
    FLASH_BACKWARD_FACTOR); the output-gradient quantizations of fp8 split between the
    attention block and the experts. The units add up to the layer's LayerTime (less a full
    recompute, which rec_parts leaves out)."""
    parts = set(P.time) | set(P.kernels)
    experts = set(MOE_EXPERT_PARTS) & parts
    post = set(MOE_POST_COMBINE_PARTS) & parts
    pre = parts - experts - post
    out = []
    for names, quant in ((pre, grad_quant / 2), (experts, grad_quant / 2), (post, 0.0)):
        fwd = P.total(names)
        gemm = sum(P.gemm.get(k, 0.0) for k in names)
        c, c_bwd = (core, core_bwd) if "core_attn" in names else (0.0, 0.0)
        recomputed = names & rec_parts
        rec = P.total(recomputed) if recomputed else 0.0
        eager = [k for k in names if graphed is None or k not in graphed]
        host_f = P.host(eager) * host_s
        host_rec = P.host([k for k in recomputed if k in eager]) * host_s if recomputed else 0.0
        out.append(ScheduleNode(forward_s=fwd, backward_s=gemm + c_bwd + 2 * (fwd - gemm - c) + quant + rec,
                                weight_s=gemm, host_forward_s=host_f,
                                host_backward_s=host_f * HOST_BACKWARD_PER_FORWARD_KERNEL + host_rec))
    return tuple(out)


def output_layer_time(model: ModelSpec, s: Strategy, gpu: GPUProfile) -> tuple[float, float]:
    """(forward, backward) seconds of final norm + output projection + cross entropy. Under
    nvfp4 the output layer is not a TE quantized linear: bf16 (high_precision_dtype)."""
    dt = high_precision_dtype(s, gpu)
    M = s.seq_length / s.cp * s.micro_batch_size
    v_loc = model.padded_vocab_size(s.tp) / s.tp
    h = model.hidden_size
    f = gemm_time(gpu, dt, M, v_loc, h)
    ce = stream_time(gpu, (BYTES_16BIT + 4 + 4) * M * v_loc, kernels=3)   # upcast, softmax, loss
    return f + ce, 2 * f + ce   # backward: input-grad and weight-grad GEMMs, softmax grad


def mtp_time(model: ModelSpec, s: Strategy, gpu: GPUProfile, layer: LayerTime) -> tuple[float, float]:
    """(forward, backward) seconds of the multi-token-prediction modules on the last stage: each
    runs its two norms, the 2h -> h projection, one decoder layer of the model's last kind and
    the shared output layer with its loss again (Megatron multi_token_prediction.py)."""
    M = s.seq_length / s.cp * s.micro_batch_size
    h = model.hidden_size
    proj = gemm_time(gpu, gemm_dtype(s, gpu), M, h / s.tp, 2 * h)
    norms = stream_time(gpu, 2 * 2 * BYTES_16BIT * M * h, kernels=2)
    of, ob = output_layer_time(model, s, gpu)
    k = model.mtp_num_layers
    fwd = k * (proj + norms + layer.forward + of)
    bwd = k * (2 * proj + 2 * norms + layer.backward_input + layer.backward_weight + layer.recompute + ob)
    return fwd, bwd


def embedding_time(model: ModelSpec, s: Strategy, gpu: GPUProfile) -> tuple[float, float]:
    """(forward, backward) seconds of the embedding lookup (gather) and its gradient (scatter)."""
    M = s.seq_length / s.cp * s.micro_batch_size
    f = stream_time(gpu, 2 * BYTES_16BIT * M * model.hidden_size, kernels=2)
    return f, 2 * f


def adam_step_bytes_per_param(s: Strategy) -> float:
    """Bytes Megatron's fused multi-tensor Adam streams per parameter of the rank's shard: read
    the main gradient twice (global-norm clip, then the step), read and write the master weight
    and both moments, write the model weight (2 x G + 2 x (M + m + v) + P; 34 with the default
    fp32 states and bf16 weights). G: the gradient the step reads (memory.optimizer_gradient_bytes)."""
    from .memory import bytes_per_param, optimizer_gradient_bytes
    b = bytes_per_param(s)
    return 2 * optimizer_gradient_bytes(s) + 2 * b["optimizer"] + b["parameters"]


def optimizer_time(params_local: float, gpu: GPUProfile, bytes_per_param: float = 34.0) -> float:
    """Seconds of the Adam step over `params_local` parameters (memory-bound)."""
    return stream_time(gpu, bytes_per_param * params_local, kernels=4)


# Host-side Adam for an offloaded optimizer streams the same bytes per parameter through host
# DRAM; a dual-socket server sustains ~200 GB/s (e.g. 2 x 8-channel DDR5-4800 = 614 GB/s peak,
# STREAM ~ 1/3 of that), shared by the node's GPUs. Planner assumption.
HOST_ADAM_BANDWIDTH_BYTES_PER_S = 200e9
# The offloaded share's gradients go down and its updated parameters come back in fp32
# (Megatron's HybridDeviceOptimizer keeps pinned fp32 copies, param_update_in_fp32).
OFFLOAD_TRANSFER_BYTES_PER_PARAM = 4 + 4


def optimizer_step_time(s: Strategy, placement, stage_params, per_rank: dict, group) -> float:
    """Seconds of the optimizer step of one rank: Adam over its optimizer shard on the GPU; with
    --optimizer-cpu-offload the offloaded share (--optimizer-offload-fraction) crosses PCIe both
    ways and runs Adam in host memory (the node's GPUs share the host's bandwidth), the rest
    steps on the GPU at the same time."""
    step_bytes = adam_step_bytes_per_param(s)
    shard = sum(getattr(stage_params, g) * placement.shard_factor("optimizer", g)
                for g in ("dense", "norms", "experts"))
    gpu_s = optimizer_time(shard, group.gpu, step_bytes)
    if not s.offload_optimizer:
        return gpu_s
    host = sum(getattr(stage_params, g) * placement.host_factor("optimizer", g) for g in ("dense", "norms", "experts"))
    host_s = (host * OFFLOAD_TRANSFER_BYTES_PER_PARAM / group.gpu.pcie_bandwidth_bytes_per_s
              + step_bytes * host * group.gpus_per_node / HOST_ADAM_BANDWIDTH_BYTES_PER_S)
    return max(gpu_s, host_s)


def hardware_flops_per_step(model: ModelSpec, s: Strategy, model_flops: float, recomputed_layers: int) -> float:
    """Hardware FLOPs (HFU numerator): model FLOPs plus the recomputed forward work."""
    if s.recompute == "full":
        return model_flops * (1 + recomputed_layers / model.num_layers / 3.0)   # a re-run forward is 1/3 of a layer
    if s.recompute == "selective":
        # selective recompute repeats the core-attention forward: 4 B s^2 a d per layer
        return model_flops + 4.0 * s.global_batch_size * s.seq_length ** 2 * model.num_attention_heads \
            * attention_head_dims(model)[0] * model.num_layers
    return model_flops


def model_flops_per_step(model: ModelSpec, s: Strategy) -> float:
    """Model FLOPs of one step (MFU numerator): 3x the forward FLOPs of every matmul, with the
    full (non-causal) s^2 attention term and no recomputation, as in Korthikanti et al. 2022
    (72 B s l h^2 (1 + s/6h + V/12lh) for GPT-3-style models) and Megatron-LM's own count."""
    B, S = s.global_batch_size, s.seq_length
    a = model.num_attention_heads
    dqk, dv = attention_head_dims(model)
    total = 0.0
    for i in range(model.num_layers):
        mm = model.attention_params
        if model.is_moe_layer(i):
            mm += model.router_params + model.shared_expert_params + model.moe_router_topk * model.expert_params
        else:
            mm += model.dense_mlp_params
        total += 2.0 * mm * B * S + 2.0 * B * S * S * a * (dqk + dv)
    total += 2.0 * model.embedding_params() * B * S     # output layer (logits)
    if model.mtp_num_layers:
        # each MTP module: a decoder layer of the last kind, its 2h -> h projection and the logits
        i = model.num_layers - 1
        mm = model.attention_params + (model.router_params + model.shared_expert_params
                                       + model.moe_router_topk * model.expert_params if model.is_moe_layer(i)
                                       else model.dense_mlp_params)
        per = 2.0 * (mm + 2 * model.hidden_size ** 2 + model.embedding_params()) * B * S \
            + 2.0 * B * S * S * a * (dqk + dv)
        total += model.mtp_num_layers * per
    return 3.0 * total
