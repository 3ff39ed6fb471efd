"""Model spec: a dense or MoE decoder-only transformer, named with Megatron-LM's argument names.

Parameter counts follow the layer structure of Megatron-Core's GPT model (the same terms as
megatron/training/theoretical_memory_usage.py in NVIDIA/Megatron-LM), plus the small terms that
file leaves out (biases, learned position embeddings), so that published counts are matched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..errors import SpecError
from ..hashing import hash_once, state_without_hash
from ..yamlio import check_fields, get_bool, get_float, get_int, get_str

NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")
# Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by (default 128) times
# the TP degree (megatron/training/tokenizer: _vocab_size_with_padding).
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128


@dataclass(frozen=True)
class ModelSpec:
    # the cost caches key on it: hash the fields once (planner/hashing.py)
    __hash__ = hash_once
    __getstate__ = state_without_hash

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    num_query_groups: int
    kv_channels: int
    ffn_hidden_size: int
    swiglu: bool = False
    normalization: str = "LayerNorm"
    untie_embeddings_and_output_weights: bool = False
    position_embedding_type: str = "learned_absolute"
    max_position_embeddings: int = 2048
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    attention_dropout: float = 0.1   # Megatron's default
    hidden_dropout: float = 0.1      # Megatron's default
    # MoE
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_pattern: tuple[int, ...] = ()   # 1 = MoE layer, per layer; () for dense models
    moe_capacity_factor: float | None = None
    # node-limited routing (--moe-router-num-groups / --moe-router-group-topk): experts are split
    # into groups (one per node in DeepSeek-V3) and a token reaches at most group_topk of them
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    # multi-token prediction (--mtp-num-layers): extra transformer layers after the last one
    mtp_num_layers: int = 0
    # sliding-window attention (--window-size): keys within this many tokens before the query
    window_size: int | None = None
    # --window-attn-skip-freq: which layers use the window (1) and which attend to all keys (0):
    # every k-th layer is full for an int k, or a 0/1 list per layer; () = every layer windowed
    window_attention_pattern: tuple[int, ...] = ()
    # --make-vocab-size-divisible-by: the embedding is padded to a multiple of this x TP
    make_vocab_size_divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY
    # Multi-latent attention (DeepSeek-V2/V3)
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None
    source: str = ""
    origin: str = ""   # the file it came from, for messages

    # ---- derived structure -------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @cached_property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_pattern)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def gated_linear_units(self) -> int:
        """Number of h x ffn matrices in an MLP: 3 for SwiGLU (gate, up, down), else 2."""
        return 3 if self.swiglu else 2

    @property
    def norm_params(self) -> int:
        """Parameters of one norm over h: weight (+ bias for LayerNorm)."""
        return self.hidden_size * (1 if self.normalization == "RMSNorm" else 2)

    def padded_vocab_size(self, tp: int) -> int:
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    def is_moe_layer(self, i: int) -> bool:
        return bool(self.moe_layer_pattern) and bool(self.moe_layer_pattern[i])

    @cached_property
    def layer_kinds(self) -> tuple[bool, ...]:
        """The layer kinds the model has: False = dense, True = MoE."""
        return tuple(moe for moe, n in ((False, self.num_dense_layers), (True, self.num_moe_layers)) if n)

    @cached_property
    def _moe_prefix(self) -> tuple[int, ...]:
        out, n = [0], 0
        for i in range(self.num_layers):
            n += 1 if self.is_moe_layer(i) else 0
            out.append(n)
        return tuple(out)

    def num_moe_layers_in(self, start: int, end: int) -> int:
        """MoE layers among layer indices [start, end), in O(1) (the search asks this often)."""
        return self._moe_prefix[end] - self._moe_prefix[start]

    # ---- parameters per layer, split by how they are placed -------------------------------
    @cached_property
    def attention_params(self) -> int:
        """Attention weights (+ biases), sharded over TP. Includes MLA low-rank norms."""
        h, a = self.hidden_size, self.num_attention_heads
        if self.multi_latent_attention:
            qk, rope, v = self.qk_head_dim, self.qk_pos_emb_head_dim, self.v_head_dim
            if self.q_lora_rank is None:
                q = h * a * (qk + rope)
            else:
                q = self.q_lora_rank * (h + a * (qk + rope) + 1)  # down, up, q-norm weight
            kv = self.kv_lora_rank * (h + a * (qk + v) + 1) + h * rope
            out = a * v * h
            return q + kv + out + (h if self.add_bias_linear else 0)
        d, g = self.kv_channels, self.num_query_groups
        qkv_out = (a + 2 * g) * d
        params = h * qkv_out + a * d * h
        if self.add_bias_linear or self.add_qkv_bias:
            params += qkv_out
        if self.add_bias_linear:
            params += h
        if self.qk_layernorm:
            params += 2 * d * (1 if self.normalization == "RMSNorm" else 2)
        return params

    def _mlp_params(self, ffn: int) -> int:
        h = self.hidden_size
        params = self.gated_linear_units * h * ffn
        if self.add_bias_linear:
            params += ffn * (2 if self.swiglu else 1) + h
        return params

    @cached_property
    def dense_mlp_params(self) -> int:
        return self._mlp_params(self.ffn_hidden_size)

    @cached_property
    def expert_params(self) -> int:
        """One routed expert."""
        return self._mlp_params(self.moe_ffn_hidden_size or 0) if self.is_moe else 0

    @cached_property
    def shared_expert_params(self) -> int:
        s = self.moe_shared_expert_intermediate_size
        return self._mlp_params(s) if (self.is_moe and s) else 0

    @cached_property
    def router_params(self) -> int:
        return self.hidden_size * self.num_experts if self.is_moe else 0

    @property
    def layer_norm_params(self) -> int:
        """The two per-layer norms (replicated over TP in Megatron)."""
        return 2 * self.norm_params

    def layer_params(self, i: int, active: bool = False) -> int:
        base = self.attention_params + self.layer_norm_params
        if self.is_moe_layer(i):
            n = self.moe_router_topk if active else self.num_experts
            return base + self.router_params + self.shared_expert_params + n * self.expert_params
        return base + self.dense_mlp_params

    def embedding_params(self, tp: int | None = None) -> int:
        v = self.vocab_size if tp is None else self.padded_vocab_size(tp)
        return v * self.hidden_size

    @property
    def position_embedding_params(self) -> int:
        if self.position_embedding_type == "learned_absolute":
            return self.max_position_embeddings * self.hidden_size
        return 0

    def total_params(self, active: bool = False) -> int:
        n = sum(self.layer_params(i, active) for i in range(self.num_layers))
        n += self.norm_params  # final norm
        emb = self.embedding_params()
        n += emb * (2 if self.untie_embeddings_and_output_weights else 1)
        n += self.position_embedding_params
        return n

    @cached_property
    def parameters(self) -> int:
        return self.total_params(False)

    @cached_property
    def active_parameters(self) -> int:
        return self.total_params(True)


MODEL_FIELDS = {
    "name", "num_layers", "hidden_size", "num_attention_heads", "vocab_size", "num_query_groups",
    "kv_channels", "ffn_hidden_size", "swiglu", "normalization",
    "untie_embeddings_and_output_weights", "position_embedding_type", "max_position_embeddings",
    "add_bias_linear", "add_qkv_bias", "qk_layernorm", "attention_dropout", "hidden_dropout",
    "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "moe_capacity_factor", "multi_latent_attention", "q_lora_rank",
    "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "moe_router_num_groups",
    "moe_router_group_topk", "mtp_num_layers", "window_size", "window_attn_skip_freq", "make_vocab_size_divisible_by", "source", "notes",
}
REQUIRED_MODEL_FIELDS = {"name", "num_layers", "hidden_size", "num_attention_heads", "vocab_size"}

MAX_LAYERS = 10_000
MAX_WIDTH = 1_000_000


def parse_moe_layer_freq(value: Any, num_layers: int, source: str, fld: str = "moe_layer_freq") -> tuple[int, ...]:
    """Megatron's --moe-layer-freq: an int k (every k-th layer is MoE, starting at layer 0),
    a list of 0/1 per layer, or the string form '([0]*3+[1]*58)' (also the list forms of
    --window-attn-skip-freq, named by `fld`)."""
    if value is None:
        value = 1
    if isinstance(value, bool):
        raise SpecError(source, fld, f"found {value!r}, expected an int, a 0/1 list or '([0]*k+[1]*n)'")
    if isinstance(value, int):
        if value < 1:
            raise SpecError(source, fld, f"found {value}, expected an integer >= 1")
        return tuple(1 if i % value == 0 else 0 for i in range(num_layers))
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        if text.startswith("(") and text.endswith(")"):
            text = text[1:-1]
        pattern: list[int] = []
        for term in text.split("+"):
            m = re.fullmatch(r"\[([01](?:,[01])*)\](?:\*([0-9]{1,6}))?", term)
            if not m:
                raise SpecError(source, fld, f"found {value!r}, expected e.g. '([0]*3+[1]*58)'")
            pattern.extend([int(x) for x in m.group(1).split(",")] * int(m.group(2) or 1))
        value = pattern
    if isinstance(value, list):
        if not all(v in (0, 1) and not isinstance(v, bool) for v in value):
            raise SpecError(source, fld, "expected a list of 0 and 1, one per layer")
        if len(value) != num_layers:
            raise SpecError(source, fld, f"has {len(value)} entries, expected num_layers = {num_layers}")
        return tuple(value)
    raise SpecError(source, fld, f"found {value!r}, expected an int, a 0/1 list or '([0]*k+[1]*n)'")


def _attention_fields(data: dict, source: str, h: int) -> dict:
    """Heads, query groups (GQA) and head width, Megatron's default kv_channels = h / heads."""
    a = get_int(data, "num_attention_heads", source, maximum=MAX_WIDTH)
    g = get_int(data, "num_query_groups", source, default=a, maximum=MAX_WIDTH)
    if a % g != 0:
        raise SpecError(source, "num_query_groups",
                        f"found {g}, expected a divisor of num_attention_heads ({a})")
    kv = get_int(data, "kv_channels", source, maximum=MAX_WIDTH)
    if kv is None:
        if h % a != 0:
            raise SpecError(source, "hidden_size",
                            f"found {h}, not divisible by num_attention_heads ({a}); "
                            "set kv_channels explicitly")
        kv = h // a
    return {"num_attention_heads": a, "num_query_groups": g, "kv_channels": kv}


def _window_fields(data: dict, source: str, L: int) -> dict:
    """Sliding-window attention: the window and which layers use it."""
    window = get_int(data, "window_size", source, maximum=100_000_000)
    full_pattern: tuple[int, ...] = ()
    if data.get("window_attn_skip_freq") is not None:
        if window is None:
            raise SpecError(source, "window_attn_skip_freq", "set, but window_size is not")
        # megatron/core/transformer/utils.py is_layer_window_attention: layer i (from 1) uses the
        # window unless i % k == 0; a list gives 1 for a windowed layer
        skip = data["window_attn_skip_freq"]
        if isinstance(skip, int) and not isinstance(skip, bool) and skip >= 1:
            full_pattern = tuple(0 if (i + 1) % skip == 0 else 1 for i in range(L))
        else:
            full_pattern = parse_moe_layer_freq(skip, L, source, fld="window_attn_skip_freq")
    return {"window_size": window, "window_attention_pattern": full_pattern}


def _moe_fields(data: dict, source: str, L: int, ffn: int) -> dict:
    """Experts, routing (top-k, group-limited routing), expert and shared-expert widths, which
    layers are MoE; on a dense model every MoE field is refused."""
    num_experts = get_int(data, "num_experts", source, maximum=100_000)
    topk = get_int(data, "moe_router_topk", source, default=2, maximum=100_000)
    moe_ffn = get_int(data, "moe_ffn_hidden_size", source, maximum=10 * MAX_WIDTH)
    shared = get_int(data, "moe_shared_expert_intermediate_size", source, maximum=10 * MAX_WIDTH)
    cf = get_float(data, "moe_capacity_factor", source, minimum=0.01, maximum=1000.0)
    n_groups = get_int(data, "moe_router_num_groups", source, maximum=100_000)
    group_topk = get_int(data, "moe_router_group_topk", source, maximum=100_000)
    pattern: tuple[int, ...] = ()
    if num_experts is not None:
        if (n_groups is None) != (group_topk is None):
            raise SpecError(source, "moe_router_group_topk" if n_groups else "moe_router_num_groups",
                            "moe_router_num_groups and moe_router_group_topk go together")
        if n_groups is not None:
            if num_experts % n_groups:
                raise SpecError(source, "moe_router_num_groups",
                                f"found {n_groups}, expected a divisor of num_experts ({num_experts})")
            if group_topk > n_groups:
                raise SpecError(source, "moe_router_group_topk",
                                f"found {group_topk}, expected <= moe_router_num_groups ({n_groups})")
        if topk > num_experts:
            raise SpecError(source, "moe_router_topk",
                            f"found {topk}, expected <= num_experts ({num_experts})")
        if moe_ffn is None:
            moe_ffn = ffn  # Megatron: moe_ffn_hidden_size defaults to ffn_hidden_size
        pattern = parse_moe_layer_freq(data.get("moe_layer_freq"), L, source)
    else:
        for fld in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq",
                    "moe_capacity_factor", "moe_router_num_groups", "moe_router_group_topk"):
            if data.get(fld) is not None:
                raise SpecError(source, fld, "set, but num_experts is not: expected num_experts for a MoE model")
    return {"num_experts": num_experts, "moe_router_topk": topk if num_experts else 2,
            "moe_ffn_hidden_size": moe_ffn, "moe_shared_expert_intermediate_size": shared,
            "moe_layer_pattern": pattern, "moe_capacity_factor": cf,
            "moe_router_num_groups": n_groups if num_experts else None,
            "moe_router_group_topk": group_topk if num_experts else None}


def _mla_fields(data: dict, source: str) -> dict:
    """Multi-latent attention (DeepSeek): its low-rank and head widths, required when it is on."""
    mla = get_bool(data, "multi_latent_attention", source, default=False)
    fields = {fld: get_int(data, fld, source, maximum=MAX_WIDTH)
              for fld in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")}
    if mla:
        for fld in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            if fields[fld] is None:
                raise SpecError(source, fld, "required when multi_latent_attention is true")
    return {"multi_latent_attention": mla, **fields}


def model_from_dict(data: Any, source: str) -> ModelSpec:
    check_fields(data, source, "", MODEL_FIELDS, REQUIRED_MODEL_FIELDS)
    name = get_str(data, "name", source)
    L = get_int(data, "num_layers", source, maximum=MAX_LAYERS)
    h = get_int(data, "hidden_size", source, maximum=MAX_WIDTH)
    V = get_int(data, "vocab_size", source, maximum=100_000_000)
    attention = _attention_fields(data, source, h)
    swiglu = get_bool(data, "swiglu", source, default=False)
    ffn = get_int(data, "ffn_hidden_size", source, maximum=10 * MAX_WIDTH)
    if ffn is None:
        # Megatron's default (arguments.py validate_args): 4h, or int(8h/3 / 64) * 64 with SwiGLU.
        ffn = int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h
    max_pos = get_int(data, "max_position_embeddings", source, default=None, maximum=100_000_000)
    mtp = get_int(data, "mtp_num_layers", source, default=0, minimum=0, maximum=MAX_LAYERS)
    window = _window_fields(data, source, L)
    vocab_multiple = get_int(data, "make_vocab_size_divisible_by", source, default=MAKE_VOCAB_SIZE_DIVISIBLE_BY,
                             minimum=1, maximum=1_000_000)
    moe = _moe_fields(data, source, L, ffn)
    mla = _mla_fields(data, source)
    pos = get_str(data, "position_embedding_type", source, default="learned_absolute",
                  choices=POSITION_EMBEDDINGS)
    if max_pos is None:
        max_pos = 4096 if pos != "learned_absolute" else 2048
    return ModelSpec(
        name=name, num_layers=L, hidden_size=h, vocab_size=V, **attention,
        ffn_hidden_size=ffn, swiglu=swiglu,
        normalization=get_str(data, "normalization", source, default="LayerNorm", choices=NORMALIZATIONS),
        untie_embeddings_and_output_weights=get_bool(data, "untie_embeddings_and_output_weights", source),
        position_embedding_type=pos, max_position_embeddings=max_pos,
        add_bias_linear=get_bool(data, "add_bias_linear", source, default=True),
        add_qkv_bias=get_bool(data, "add_qkv_bias", source, default=False),
        qk_layernorm=get_bool(data, "qk_layernorm", source, default=False),
        attention_dropout=get_float(data, "attention_dropout", source, default=0.1, maximum=1.0),
        hidden_dropout=get_float(data, "hidden_dropout", source, default=0.1, maximum=1.0),
        **moe, mtp_num_layers=mtp, **window, **mla,
        make_vocab_size_divisible_by=vocab_multiple,
        source=get_str(data, "source", source, default="") or "", origin=source,
    )
