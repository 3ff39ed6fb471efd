"""Issue 29: --pipeline-model-parallel-layout strings are accepted or refused exactly as
Megatron-LM accepts or refuses them, and an accepted layout whose stages hold no decoder layer
(`E|t|...|tL`: the first virtual stage holds only the embedding) is priced, not refused by a
second, stricter check of chunk_layers.

Expected acceptance is Megatron-LM's own, read from
megatron/core/transformer/pipeline_parallel_layer_layout.py (PipelineParallelLayerLayout:
parse_str_to_list, __init__, validate_layer_layout) at NVIDIA/Megatron-LM commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (same rules at 00caa53af30912914981c86f39db123961678bbd):
',' is cosmetic; `(...)*N` then `x*N` unroll; '|' splits stages, which may be empty; the
stage count is divisible by pp; the flattened layout (stage order) starts with E and ends
with L, each exactly once; decoder layers == num_layers; MTP layers == mtp_num_layers (0 when
unset) and after every decoder layer; MTP only in a rank's last virtual stage, all in one.
"""

import json
import math
from dataclasses import replace

import pytest

from _cli import one_error_line, run_main

from planner.errors import InvalidStrategy
from planner.library import load_model_ref
from planner.megatron import emit
from planner.megatron.layout import LayoutError, layout_problems, layout_string, parse_layout
from planner.strategy import Strategy, check_structure

# (layout, pp, num_layers, mtp_num_layers, Megatron accepts it)
LAYOUTS = [
    ("Et*4|t*4|t*4|t*4L", 4, 16, 0, True),
    ("E,t,t,t,t|t*4|t*4|t*4,L", 4, 16, 0, True),          # commas are cosmetic
    ("E|(t|)*31tL", 3, 32, 0, True),                        # first virtual stage: the embedding alone
    ("E|(t|)*31tL", 11, 32, 0, True),
    ("E|(t|)*31tL", 1, 32, 0, True),
    ("E|(t|)*31tL", 2, 32, 0, False),                       # 33 stages, not divisible by pp = 2
    ("E|t*8|t*8|t*8L", 4, 24, 0, True),                     # a whole rank with no decoder layer
    ("Et*8|t*8|t*8|L", 4, 24, 0, True),                     # the loss alone in the last stage
    ("Et*8||t*8|t*8L", 4, 24, 0, True),                     # an empty stage in the middle
    ("Et*16|t*0|t*0|t*0L", 4, 16, 0, True),                 # x*0 unrolls to nothing
    ("E|(t*4|)*30L", 4, 120, 0, True),                      # repeats: 32 stages, vpp 8
    ("E|(t*4|)*30L", 8, 120, 0, True),
    ("E|(t*4|)*30L", 5, 120, 0, False),
    ("Et*3|(t*4|)*6t*3mL", 4, 30, 1, True),                # tests/fixtures/uv_distributed_run_layout.sh
    ("Et*4|t*4|t*4|t*4mL", 4, 16, 1, True),
    ("Et*4|t*4|t*4|t*4|||m|L", 4, 16, 1, True),             # MTP standalone: last virtual stage of rank 2
    ("Et*4|t*4|t*4|t*4m||||L", 4, 16, 1, False),            # MTP in a virtual stage that is not the rank's last
    ("Et*4|t*4|t*4m|t*4L", 4, 16, 1, False),                # a decoder layer after the MTP layer
    ("Et*8|t*8|m|mL", 2, 16, 2, False),                     # MTP layers split over two stages
    ("Et*8|t*8|t*8|t*8L", 4, 32, 1, False),                 # mtp_num_layers 1, no m in the layout
    ("Et*8|t*8|t*8|t*8mL", 4, 32, 0, False),                # an m without mtp_num_layers
    ("Et*8|Et*8|t*8|t*8L", 4, 32, 0, False),                # two embeddings
    ("tEt*7|t*8|t*8|t*8L", 4, 32, 0, False),                # the first layer is not the embedding
    ("Et*8|t*8|t*8|t*8", 4, 32, 0, False),                  # no loss
    ("Et*8|t*8|t*8|t*8LL", 4, 32, 0, False),                # two losses
    ("Et*8|t*8|t*8|Lt*8", 4, 32, 0, False),                 # the last layer is not the loss
    ("Et*8|t*8|t*8|t*7L", 4, 32, 0, False),                 # 31 decoder layers, num_layers 32
    ("E", 1, 0, 0, False),
    ("EL", 1, 0, 0, True),                                  # (num_layers 0: the layout alone allows it)
    ("", 1, 0, 0, False),                                   # Megatron: IndexError on flatten_layout[0]
    ("et*4L", 1, 4, 0, False),                              # layer characters are case-sensitive
    ("Et*4 L", 1, 4, 0, False),                             # so is a space
    ("E((t|)*2)*2L", 1, 4, 0, False),                       # groups do not nest
]


def megatron_accepts(text: str, pp: int, num_layers: int, mtp: int) -> bool:
    try:
        lay = parse_layout(text, pp)
    except LayoutError:
        return False
    return not layout_problems(lay, num_layers, mtp)


@pytest.mark.parametrize("text,pp,num_layers,mtp,ok", LAYOUTS)
def test_layout_acceptance_is_megatrons(text, pp, num_layers, mtp, ok):
    assert megatron_accepts(text, pp, num_layers, mtp) is ok


def _model(num_layers, mtp):
    m = load_model_ref("llama3-8b")
    return replace(m, num_layers=num_layers, mtp_num_layers=mtp)


@pytest.mark.parametrize("text,pp,num_layers,mtp,ok", [c for c in LAYOUTS if c[-1] and c[2] > 0 and c[1] > 1])
def test_an_accepted_layout_passes_the_structure_check_once_and_emits_back(text, pp, num_layers, mtp, ok):
    lay = parse_layout(text, pp)
    m = _model(num_layers, mtp)
    s = Strategy(tp=1, pp=pp, dp=1, vpp=lay.vpp, micro_batch_size=1, global_batch_size=4 * pp, seq_length=4096,
                 layers_per_stage=lay.per_rank, chunk_layers=lay.chunk_layers)
    check_structure(s, m)     # stages with 0 decoder layers are Megatron's, not an error
    out = emit.layout_string(m, s)
    again = parse_layout(out, pp)
    assert again.chunk_layers == lay.chunk_layers and not layout_problems(again, num_layers, mtp), out
    assert layout_string(lay.chunk_layers, mtp) == out


def test_chunk_layers_are_checked_once_with_one_rule():
    m = _model(32, 0)
    base = dict(tp=1, pp=4, dp=1, vpp=2, micro_batch_size=1, global_batch_size=8, seq_length=4096)
    check_structure(Strategy(**base, layers_per_stage=(7, 8, 8, 9), chunk_layers=(0, 4, 4, 4, 7, 4, 4, 5)), m)
    for chunks, per_rank in (((-1, 4, 4, 4, 8, 4, 4, 5), (7, 8, 8, 9)),      # a negative count
                             ((0, 4, 4, 4, 7, 4, 4, 4), (7, 8, 8, 9)),       # sums that are not the split
                             ((0, 4, 4, 4, 7, 4, 4), (7, 8, 8, 9))):         # not pp x vpp counts
        with pytest.raises(InvalidStrategy, match="chunk-layers|layer-split"):
            check_structure(Strategy(**base, layers_per_stage=per_rank, chunk_layers=chunks), m)


def _launch(tmp_path, layout, pp, nodes, gbs, num_layers=32):
    f = tmp_path / "train.sh"
    f.write_text(f"""#!/bin/bash
LAYOUT='{layout}'
torchrun --nproc_per_node 4 --nnodes {nodes} pretrain_gpt.py \\
    --num-layers {num_layers} --hidden-size 4096 --num-attention-heads 32 --group-query-attention \\
    --num-query-groups 8 --ffn-hidden-size 14336 --vocab-size 128256 --seq-length 4096 \\
    --max-position-embeddings 8192 --position-embedding-type rope --normalization RMSNorm --swiglu \\
    --untie-embeddings-and-output-weights --disable-bias-linear \\
    --micro-batch-size 1 --global-batch-size {gbs} --tensor-model-parallel-size 4 \\
    --pipeline-model-parallel-size {pp} --pipeline-model-parallel-layout "$LAYOUT" \\
    --use-distributed-optimizer --bf16
""")
    return f


@pytest.mark.parametrize("layout,pp,nodes,gbs", [
    ("E|(t|)*31tL", 3, 3, 255),        # vpp 11: the first virtual stage of rank 0 is the embedding alone
    ("E|(t|)*31tL", 11, 11, 253),      # vpp 3
    ("E|t*8|t*8|t*8|t*8L", 5, 5, 250),  # pp 5, vpp 1: pipeline rank 0 holds no decoder layer
])
def test_estimate_prices_a_layout_with_an_embedding_only_stage(tmp_path, layout, pp, nodes, gbs):
    f = _launch(tmp_path, layout, pp, nodes, gbs)
    for cmd in ("estimate", "check"):
        rc, out, err = run_main([cmd, "--cluster", "dgx-h100-x8", "--megatron-args", str(f)])
        assert rc in (0, 1) and "Traceback" not in err and not err.startswith("error"), (cmd, rc, out, err)
        assert "chunk-layers" not in out + err and "INVALID" not in out, out
    rc, out, err = run_main(["estimate", "--cluster", "dgx-h100-x8", "--megatron-args", str(f), "--json"])
    assert rc in (0, 1), err
    stages = json.loads(out)["memory"]["per_stage"]
    assert len(stages) == pp and sum(st["layers"] for st in stages) == 32, stages
    assert all(math.isfinite(st["total_bytes"]) and st["total_bytes"] > 0 for st in stages), stages
    if layout.startswith("E|t*8"):
        assert stages[0]["layers"] == 0 and stages[0]["activations"] >= 0, stages[0]


def test_a_layout_megatron_refuses_is_an_invalid_launch(tmp_path):
    f = _launch(tmp_path, "Et*8|Et*8|t*8|t*8L", 4, 4, 256)
    rc, out, err = run_main(["estimate", "--cluster", "dgx-h100-x8", "--megatron-args", str(f)])
    assert rc == 1, (rc, out, err)
    assert "embedding (E) must appear exactly once" in one_error_line(err)
