"""The launch reader on scripts in the shapes Megatron-LM's own examples use (tests/fixtures/,
written for these tests), the flag table, the layout grammar, and the values each flag puts
into the model and strategy. Expected values are worked out by hand from the scripts and from
Megatron's code (cited), not produced by the reader."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner.errors import InvalidStrategy, SpecError
from planner.megatron import emit
from planner.megatron.flags import list_expression, parse_flags, table
from planner.megatron.launch import InvalidLaunch, parse_file, parse_text, parse_words
from planner.megatron.layout import LayoutError, layout_problems, parse_layout, split_chunk_layers
from planner.megatron.rules import megatron_violations
from planner.library import load_cluster_ref, load_model_ref
from planner.strategy import Strategy

FIX = Path(__file__).parent / "fixtures"
BASE = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
        "--max-position-embeddings 2048 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 64 --bf16")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, env=env)


def _flags(extra: str = "", world: int = 8, base: str = BASE):
    return parse_words((base + " " + extra).split(), "t", world_size=world)


# ---- scripts in the shapes of Megatron-LM's examples ---------------------------------------

def test_arrays_defaults_and_a_conditional_append():
    L = parse_file(FIX / "train_arrays.sh", env={})
    s, m = L.strategy, L.model
    # torchrun --nnodes ${NUM_NODES:-2} --nproc_per_node 8
    assert L.world_size == 16 and (s.tp, s.pp, s.dp) == (2, 2, 4)
    assert (m.num_layers, m.hidden_size, m.num_query_groups, m.ffn_hidden_size) == (32, 4096, 8, 14336)
    assert s.seq_length == 8192 and m.vocab_size == 128256        # the MOCK branch's --vocab-size
    assert s.precision == "fp8" and s.fp8_param_gather and s.grad_reduce_in_bf16   # DTYPE_ARGS+=( ... )
    assert s.zero_stage == 1 and s.overlap_grad_reduce and s.overlap_param_gather  # TRAINING_ARGS+=("${DDP_ARGS[@]}")
    assert s.fused_attention and dict(L.script_env)["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    # every cross-entropy implementation keeps the same fp32 tensor: read, no cost
    assert {"--lr", "--mock-data", "--tokenizer-type", "--save", "--load", "--cross-entropy-loss-fusion"} <= set(L.no_cost)
    assert not L.unpriced
    said = " ".join(L.notes)
    assert "took that branch" in said and "cannot be decided" in said      # the fp8 branch; the -f guard
    assert parse_file(FIX / "train_arrays.sh", env={"NUM_NODES": "4"}).world_size == 32


def test_a_script_argument_picks_the_other_branch_and_the_vocabulary_is_then_asked_for():
    with pytest.raises(SpecError, match=r"--vocab-size.*HuggingFaceTokenizer --tokenizer-model org/SomeModel.*--model"):
        parse_file(FIX / "train_arrays.sh", env={}, settings={"1": "ckpt", "2": "org/SomeModel"})
    L = parse_file(FIX / "train_arrays.sh", env={}, settings={"1": "ckpt", "2": "org/SomeModel"},
                   vocab_model=load_model_ref("llama3-8b"))
    assert L.model.vocab_size == load_model_ref("llama3-8b").vocab_size and "--model" in " ".join(L.notes)


def test_sbatch_here_document_with_srun_bash_c():
    L = parse_file(FIX / "sbatch_heredoc_fsdp.sh", env={})
    s, m = L.strategy, L.model
    assert L.world_size == 32 and "4 nodes x 8" in L.world_from        # #SBATCH --nodes=4 --ntasks-per-node=8
    assert (s.tp, s.ep, s.etp, s.dp) == (1, 8, 1, 32) and s.zero_stage == 3   # optim_grads_params
    assert dict(L.script_env)["CUDA_DEVICE_MAX_CONNECTIONS"] is None    # unset in the FSDP branch
    assert s.recompute == "selective" and s.recompute_modules == ("mlp", "moe", "layernorm")
    assert m.num_experts == 64 and m.moe_layer_pattern == (0,) + (1,) * 15
    assert (m.moe_router_num_groups, m.moe_router_group_topk, m.mtp_num_layers) == (8, 4, 1)
    assert s.moe_token_dispatcher_type == "alltoall" and s.moe_grouped_gemm
    assert m.vocab_size == load_model_ref("deepseek-v3").vocab_size     # --tokenizer-model deepseek-ai/DeepSeek-V3
    assert not megatron_violations(L)


def test_srun_python_takes_the_world_from_sbatch_headers_and_slurm_variables():
    L = parse_file(FIX / "sbatch_srun_python.sh", env={})
    assert L.world_size == 16 and L.strategy.dp == 8                    # 2 nodes x 8 tasks, tp 2
    L = parse_file(FIX / "sbatch_srun_python.sh", env={"SLURM_NNODES": "4", "SLURM_NTASKS_PER_NODE": "8"})
    assert L.world_size == 32                                           # the job's own variables win


def test_case_block_argument_loop_and_srun_torchrun():
    L = parse_file(FIX / "srun_torchrun_case.sh", env={})
    s, m = L.strategy, L.model
    # SLURM_NNODES from #SBATCH --nodes=4; PP=$(( NNODES / 2 )); the 'small' case branch
    assert L.world_size == 32 and (s.tp, s.pp, s.dp) == (8, 2, 2)
    assert (m.num_layers, m.hidden_size, s.global_batch_size) == (16, 2048, 256)
    assert any("case" in n and "small" in n for n in L.notes)


def test_uv_run_distributed_run_and_a_layout_with_groups_and_mtp():
    L = parse_file(FIX / "uv_distributed_run_layout.sh", env={})
    s = L.strategy
    assert L.world_size == 32 and (s.tp, s.pp, s.dp, s.vpp) == (4, 4, 2, 2)
    # Et*3|(t*4|)*6t*3mL: stages Ettt, tttt x 6, tttmL; stage k is chunk k // 4 of rank k % 4
    assert s.chunk_layers == (3, 4, 4, 4, 4, 4, 4, 3) and s.layers_per_stage == (7, 8, 8, 7)
    assert L.model.mtp_num_layers == 1 and s.schedule == "interleaved"
    assert not megatron_violations(L)


def test_nothing_is_executed_and_unknown_values_are_named(tmp_path):
    marker = tmp_path / "ran"
    f = tmp_path / "l.sh"
    f.write_text(f"TP=$(touch {marker}; echo 2)\nX=`touch {marker}`\n"
                 f"torchrun --nproc-per-node 8 pretrain_gpt.py {BASE} --tensor-model-parallel-size $TP "
                 "--data-path $(ls /data)\n")
    with pytest.raises(SpecError, match=r"--tensor-model-parallel-size: its value depends on \$\(touch"):
        parse_file(f, env={})
    assert not marker.exists()
    f.write_text(f"torchrun --nproc-per-node 8 pretrain_gpt.py {BASE} --tensor-model-parallel-size $TP "
                 "--data-path $(ls /data)\n")
    with pytest.raises(SpecError, match=r"depends on TP.*--set TP=VALUE"):
        parse_file(f, env={})
    L = parse_file(f, env={}, settings={"TP": "2"})
    assert L.strategy.tp == 2 and L.unknown_values[0][0] == "--data-path"      # no-cost: said, not fatal


def test_set_replaces_a_value_the_script_computes_by_running_something(tmp_path):
    f = tmp_path / "l.sh"
    f.write_text(f'NNODES=$(scontrol show hostnames | wc -l)\ntorchrun --nnodes "$NNODES" --nproc-per-node 8 '
                 f"pretrain_gpt.py {BASE}\n")
    assert parse_file(f, env={}).world_size is None
    L = parse_file(f, env={}, settings={"NNODES": "3"})
    assert L.world_size == 24 and any("--set NNODES=3" in n for n in L.notes)


def test_fragments_and_tools_are_not_launches(tmp_path):
    f = tmp_path / "model.sh"
    f.write_text('MODEL_ARGS=" --num-layers 48 --hidden-size 2048 "\n')
    with pytest.raises(SpecError, match="no Megatron-LM launch found.*MODEL_ARGS"):
        parse_file(f, env={})
    f.write_text("srun python3 tools/checkpoint/convert.py --a b\n")
    with pytest.raises(SpecError, match="no Megatron-LM training launch"):
        parse_file(f, env={})
    f.write_text("torchrun --nproc-per-node 8 pretrain_t5.py --num-layers 12\n")
    with pytest.raises(SpecError, match=r"pretrain_t5.py: T5 \(encoder-decoder\) is not a decoder-only GPT model; "
                       "the planner reads pretrain_gpt.py launches"):
        parse_file(f, env={})


# ---- the flag table and argparse behaviour -------------------------------------------------

def test_table_names_its_commit_and_classifies_every_flag():
    t = table()
    assert re.fullmatch(r"[0-9a-f]{40}", t.commit) and t.date.startswith("2026-")
    assert len(t.flags) > 800 and {f.cost for f in t.flags} == {"model", "strategy", "no-cost", "unmodelled"}
    assert all(f.why for f in t.flags if f.cost == "unmodelled")
    # Megatron's own defaults, as the table read them (arguments.py / transformer_config.py)
    d = {f.dest: f.default for f in t.flags}
    assert d["attention_backend"] == "auto" and d["moe_token_dispatcher_type"] == "allgather"
    assert d["recompute_modules"] is None and d["fp8_recipe"] == "delayed" and d["moe_grouped_gemm"] is False


def test_every_flag_the_rules_and_the_emitter_name_is_in_the_table():
    import inspect
    src = Path(__file__).parent.parent / "planner" / "megatron"
    names = set()
    for text in ((src / "rules.py").read_text(), inspect.getsource(emit.megatron_args)):
        names |= set(re.findall(r'(--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)', text))
    missing = sorted(n for n in names if n not in table())
    assert not missing, missing
    # and everything the emitter writes for plans that use the contract fields
    m = load_model_ref("deepseek-v3")
    s = Strategy(tp=8, pp=8, dp=16, ep=64, etp=1, vpp=2, recompute="selective", recompute_modules=("mlp", "moe"),
                 offload_optimizer=True, optimizer_offload_fraction=0.5, grad_reduce_in_bf16=True,
                 exp_avg_dtype="bf16", precision="fp8", fp8_recipe="blockwise", fp8_param_gather=True,
                 cpu_offloading_num_layers=0, delay_wgrad_compute=True, global_batch_size=1024, seq_length=4096,
                 layers_per_stage=(7, 8, 8, 8, 8, 8, 7, 7))
    for w in emit.megatron_args(m, s):
        if w.startswith("--"):
            assert w in table(), w


def test_every_modelled_flag_is_read_and_every_flag_read_is_modelled():
    """The classification and the launch reader (launch.py and the model/strategy readers it
    calls) agree: a flag classified model/strategy is mapped, and the reader reads no flag the table calls no-cost or unmodelled (except the tokenizer it
    needs for the vocabulary and the flags read only to say something about them)."""
    megatron = Path(__file__).parent.parent / "planner" / "megatron"
    src = "".join((megatron / name).read_text()
                  for name in ("launch.py", "model_from_flags.py", "strategy_from_flags.py"))
    t = table()
    read = set(re.findall(r'"(\w+)"', src)) & set(t.by_dest)
    modelled = {f.dest for f in t.flags if f.cost in ("model", "strategy")}
    assert modelled - read == set()
    told_only = {"tokenizer_type", "tokenizer_model", "merge_file", "vocab_file", "hybrid_layer_pattern", "is_hybrid_model"}
    assert {d for d in read if d in t.by_dest} - modelled - told_only == set()


@pytest.mark.parametrize("extra,rule,text", [
    ("--hiden-size 4096", "unknown-flag", "did you mean '--hidden-size'"),
    ("--fp8-format fp4", "flag-value", "expected one of e4m3, hybrid"),
    ("--recompute-granularity banana", "flag-value", "expected one of full, selective"),
    ("--bf16=1", "flag-takes-no-value", "takes no value"),
    ("--tensor-model-parallel-size", "flag-missing-value", "expected one value"),
    ("--tensor-model-parallel-size two", "flag-value", "expected an integer"),
    ("--recompute-modules --bf16", "flag-missing-value", "at least one value"),
    ("--num-layer 8", "unknown-flag", "did you mean '--num-layers'"),   # allow_abbrev=False
    ("extra-word", "unknown-flag", "unrecognized argument"),
])
def test_argparse_refusals_are_invalid_launches(extra, rule, text):
    with pytest.raises(InvalidLaunch) as exc:
        _flags(extra)
    assert any(r == rule and text in m for r, m in exc.value.problems), exc.value.problems


def test_argparse_forms_megatron_accepts():
    pf = parse_flags("--seq-length=4096 --lr -1e-3 --recompute-modules mlp moe --no-rl-persist-cuda-graphs "
                     "--window-size 127,0 --moe-layer-freq ([0]*1+[1]*3)*2".split())
    assert not pf.errors and not pf.unrecognized
    v = pf.values
    assert v["seq_length"] == 4096 and v["lr"] == -1e-3 and v["recompute_modules"] == ["mlp", "moe"]
    assert v["rl_persist_cuda_graphs"] is False and v["window_size"] == (127, 0)
    assert v["moe_layer_freq"] == [0, 1, 1, 1, 0, 1, 1, 1]
    assert list_expression("[0]*3+[1]*2") == [0, 0, 0, 1, 1]
    with pytest.raises(ValueError):
        list_expression("__import__('os')")


def test_cli_check_typo_exits_1_with_did_you_mean_and_bad_input_exits_2(tmp_path):
    f = tmp_path / "typo.sh"
    f.write_text(f"torchrun --nproc-per-node 8 pretrain_gpt.py {BASE} --hiden-size 4096\n")
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(f))
    assert r.returncode == 1 and "did you mean '--hidden-size'" in r.stdout and "Traceback" not in r.stderr
    f.write_text("torchrun pretrain_gpt.py --num-layers 'unclosed\n")
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(f))
    assert r.returncode == 2 and "unclosed single quote" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ---- flags -> contract fields (defaults: Megatron's) -----------------------------------------

def test_training_state_dtypes_offload_and_recompute_modules():
    s = _flags().strategy
    assert (s.grad_reduce_in_bf16, s.main_grads_dtype, s.exp_avg_dtype, s.offload_optimizer) == (False, "fp32", "fp32", False)
    assert s.recompute_modules == ("core_attn",) and s.cpu_offloading_num_layers == 0
    L = _flags("--grad-reduce-in-bf16 --use-precision-aware-optimizer --main-grads-dtype bf16 --main-params-dtype fp16 "
               "--exp-avg-dtype fp8 --exp-avg-sq-dtype bf16 --use-distributed-optimizer --optimizer-cpu-offload "
               "--optimizer-offload-fraction 0.25 --recompute-granularity selective --recompute-modules mlp layernorm "
               "--cpu-offloading-num-layers 2")
    s = L.strategy
    assert s.grad_reduce_in_bf16 and (s.main_grads_dtype, s.main_params_dtype, s.exp_avg_dtype, s.exp_avg_sq_dtype) == \
        ("bf16", "fp16", "fp8", "bf16")
    assert s.offload_optimizer and s.optimizer_offload_fraction == 0.25
    assert s.recompute == "selective" and s.recompute_modules == ("mlp", "layernorm") and s.cpu_offloading_num_layers == 2
    assert not megatron_violations(L)
    # optimizer_config.py / arguments.py: these need the precision-aware optimizer
    v = {x.rule for x in megatron_violations(_flags("--exp-avg-dtype bf16 --optimizer-cpu-offload"))}
    assert {"dtype-needs-precision-aware", "cpu-offload-needs-precision-aware"} <= v


@pytest.mark.parametrize("flags,rule", [
    ("--fp8-format hybrid --fp8-param-gather", "fp8-param-gather-needs-dist-opt"),
    ("--use-precision-aware-optimizer", "precision-aware-needs-dist-opt")])
def test_fp8_param_gather_and_the_precision_aware_optimizer_need_the_distributed_optimizer(flags, rule):
    """arguments.py (--fp8-param-gather) and get_megatron_optimizer (the precision-aware
    optimizer) refuse them without the distributed optimizer; Megatron-FSDP turns it on."""
    assert rule in {x.rule for x in megatron_violations(_flags(flags))}
    for with_it in ("--use-distributed-optimizer", "--use-megatron-fsdp --ckpt-format fsdp_dtensor"):
        assert rule not in {x.rule for x in megatron_violations(_flags(flags + " " + with_it))}


def test_attention_backend_and_transformer_impl():
    L = _flags()
    assert L.strategy.fused_attention and any("auto" in n for n in L.notes)        # Megatron's default, said
    assert not _flags("--attention-backend unfused").strategy.fused_attention
    assert _flags("--attention-backend flash").strategy.fused_attention
    assert not _flags("--transformer-impl local").strategy.fused_attention      # DotProductAttention
    assert any("no effect" in n for n in _flags("--use-flash-attn").notes)


def test_fp8_and_moe_execution_flags():
    s = _flags("--fp8-format hybrid --fp8-recipe mxfp8 --fp8-param-gather").strategy
    assert (s.precision, s.fp8_recipe, s.fp8_param_gather) == ("fp8", "mxfp8", True)
    moe = "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8"
    s = _flags(moe).strategy
    # Megatron's defaults: allgather dispatcher, no grouped GEMM (transformer_config.py)
    assert (s.moe_token_dispatcher_type, s.moe_grouped_gemm, s.moe_pad_expert_input_to_capacity) == ("allgather", False, False)
    L = _flags(moe + " --moe-token-dispatcher-type flex --moe-grouped-gemm --moe-expert-capacity-factor 1.25 "
               "--moe-pad-expert-input-to-capacity --overlap-moe-expert-parallel-comm --delay-wgrad-compute")
    s = L.strategy
    assert (s.moe_token_dispatcher_type, s.moe_grouped_gemm, s.moe_pad_expert_input_to_capacity) == ("flex", True, True)
    assert s.overlap_moe_expert_parallel_comm and s.delay_wgrad_compute and L.model.moe_capacity_factor == 1.25


def test_mlp_variants_set_gating_and_parameter_counts():
    h, ffn = 1024, 4096
    plain = _flags(f"--ffn-hidden-size {ffn}").model
    sq = _flags(f"--ffn-hidden-size {ffn} --squared-relu").model
    qg = _flags("--quick-geglu").model
    sw = _flags("--swiglu").model
    assert not sq.swiglu and sq.dense_mlp_params == plain.dense_mlp_params == 2 * h * ffn + ffn + h
    # --quick-geglu is gated; validate_args sizes the default ffn from --swiglu only: 4h
    assert qg.swiglu and qg.ffn_hidden_size == 4 * h and qg.dense_mlp_params == 3 * h * 4 * h + 2 * 4 * h + h
    assert sw.ffn_hidden_size == int((4 * h * 2 / 3) / 64) * 64
    assert "mlp-activation" in {v.rule for v in megatron_violations(_flags("--swiglu --squared-relu"))}


def test_model_fields_mtp_window_router_groups_and_vocab_padding():
    m = _flags("--position-embedding-type rope --mtp-num-layers 2 --window-size 127,0 --make-vocab-size-divisible-by 3232").model
    assert m.mtp_num_layers == 2 and m.window_size == 127 and m.padded_vocab_size(1) == 3232 * 10
    m = _flags("--num-experts 64 --moe-router-topk 6 --moe-router-num-groups 8 --moe-router-group-topk 4").model
    assert (m.moe_router_num_groups, m.moe_router_group_topk) == (8, 4)
    assert "mtp-position-embedding" in {v.rule for v in megatron_violations(_flags("--mtp-num-layers 1"))}


def test_unmodelled_flags_are_listed_and_fp32_training_is_said():
    L = _flags("--distribute-saved-activations --fp32-residual-connection")
    assert [f for f, _ in L.unpriced] == ["--distribute-saved-activations", "--fp32-residual-connection"]
    L = parse_words(BASE.replace("--bf16", "").split(), "t", world_size=8)
    assert any("fp32" in why for _, why in L.unpriced)


# ---- pipeline layouts -------------------------------------------------------------------------

def test_layout_grammar_groups_commas_mtp_and_empty_stages():
    lay = parse_layout("Et*3|(t*4|)*30t*3L", 8)
    assert len(lay.stages) == 32 and lay.vpp == 4 and sum(lay.chunk_layers) == 126
    # rank 0 holds stages 0, 8, 16, 24: 3 + 4 + 4 + 4; rank 7 holds 7, 15, 23, 31: 4 + 4 + 4 + 3
    assert lay.per_rank == (15, 16, 16, 16, 16, 16, 16, 15)
    assert parse_layout("Et|t,t|tL", 3).chunk_layers == parse_layout("Et|tt|tL", 3).chunk_layers == (1, 2, 1)
    lay = parse_layout("E|t*4|t*4|t*3mL", 4)
    assert lay.per_rank == (0, 4, 4, 3) and layout_problems(lay, 11, 1) == []
    assert layout_problems(parse_layout("EtE|tL", 2), 2, 0)                  # E twice
    assert layout_problems(parse_layout("Et|mtL", 2), 2, 1)                  # MTP before a decoder layer
    assert layout_problems(parse_layout("Etm|t|t|tL", 2), 4, 1)              # MTP not in the last chunk
    with pytest.raises(LayoutError, match="not divisible"):
        parse_layout("Et|t|tL", 2)
    with pytest.raises(LayoutError, match="invalid layer character"):
        parse_layout("Et*2x|tL", 2)


def test_uneven_first_last_and_account_for_embedding_loss_as_megatron_splits():
    # transformer_block.get_num_layers_to_build: (30 + 2) / 4 = 8 per rank, 4 per chunk; the
    # first chunk of rank 0 and the last chunk of rank 3 give one layer to embedding / loss
    chunks, problems = split_chunk_layers(30, 4, 2, None, None, True, True)
    assert not problems and chunks == (3, 4, 4, 4, 4, 4, 4, 3)
    s = _flags("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 "
               "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
               base=BASE.replace("--num-layers 8", "--num-layers 30"), world=8).strategy
    assert s.chunk_layers == (3, 4, 4, 4, 4, 4, 4, 3) and s.layers_per_stage == (7, 8, 8, 7)
    s = _flags("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 "
               "--decoder-last-pipeline-num-layers 6", base=BASE.replace("--num-layers 8", "--num-layers 30")).strategy
    assert s.layers_per_stage == (6, 9, 9, 6) and s.chunk_layers is None
    assert not split_chunk_layers(30, 4, 1, 7, 7, False, False)[1]           # 16 over 2 middle ranks: fine
    assert split_chunk_layers(31, 4, 1, 7, 7, False, False)[1]               # 17 over 2: refused


@pytest.mark.parametrize("kw", [
    dict(pp=4, dp=2, layers_per_stage=(7, 9, 9, 7)),
    dict(pp=2, dp=4, vpp=2, layers_per_stage=(15, 17), chunk_layers=(7, 8, 8, 9)),
    dict(pp=4, dp=2, layers_per_stage=(0, 11, 11, 10), chunk_layers=(0, 11, 11, 10)),
    dict(pp=4, dp=2, vpp=2, global_batch_size=64),
    dict(tp=2, pp=2, dp=2, recompute="full", recompute_num_layers=2),
])
def test_emitted_layout_round_trips_to_the_same_strategy(kw):
    m = load_model_ref("llama3-8b")
    s = Strategy(seq_length=4096, **{"global_batch_size": 64, **kw})
    args = emit.checked_args(m, s)
    back = parse_words(args, "emitted", world_size=s.world_size)
    assert back.strategy == s
    if s.chunk_layers or s.layers_per_stage:
        lay = args[args.index("--pipeline-model-parallel-layout") + 1]
        assert parse_layout(lay, s.pp).chunk_layers == emit.stage_chunk_layers(m, s)


# ---- runtime rules (req. 7) ---------------------------------------------------------------------

def test_sequence_parallel_needs_the_rank_sequence_divisible_by_tp():
    base = BASE.replace("--seq-length 2048", "--seq-length 2052").replace("2048", "4096")
    v = {x.rule for x in megatron_violations(_flags("--tensor-model-parallel-size 8 --sequence-parallel", base=base))}
    assert "sp-seq-divisible-by-tp" in v
    ok = _flags("--tensor-model-parallel-size 8 --sequence-parallel", world=8)
    assert "sp-seq-divisible-by-tp" not in {x.rule for x in megatron_violations(ok)}


def test_vpp_layer_divisibility_without_a_layout():
    L = _flags("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 3", world=8)
    assert "vpp-layers" in {v.rule for v in megatron_violations(L)}   # 8 / 2 = 4 layers per rank, not / 3


# ---- one verdict: check and estimate on the same file -------------------------------------------

def test_check_and_estimate_agree_and_use_the_cluster_without_torchrun(tmp_path):
    f = tmp_path / "flags.args"
    f.write_text(BASE.replace(" --", "\n--") + "\n--tensor-model-parallel-size 2\n")
    r1 = _cli("check", "--cluster", "dgx-h100-x16", "--megatron-args", str(f), "--json")
    r2 = _cli("estimate", "--cluster", "dgx-h100-x16", "--megatron-args", str(f), "--json")
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr, r2.stderr)
    c, e = json.loads(r1.stdout), json.loads(r2.stdout)
    gpus = load_cluster_ref("dgx-h100-x16").num_gpus
    assert c["world_size"] == gpus == e["plan"]["world_size"] and c["step_time_s"] == e["time"]["step_s"]
    r3 = _cli("estimate", "--cluster", "dgx-h100-x16", "--megatron-args", str(f), "--world-size", "8", "--json")
    assert json.loads(r3.stdout)["plan"]["world_size"] == 8


def test_verbose_lists_no_cost_flags_and_unpriced_flags_are_always_listed(tmp_path):
    f = tmp_path / "l.sh"
    f.write_text(f"torchrun --nproc-per-node 8 pretrain_gpt.py {BASE} --lr 1e-4 --distribute-saved-activations\n")
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(f))
    assert r.returncode == 0 and "not priced: --distribute-saved-activations" in r.stdout and "--lr" not in r.stdout
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(f), "--verbose")
    assert "no effect on memory or step time: --num-layers" not in r.stdout and "--lr" in r.stdout
    r = _cli("estimate", "--cluster", "dgx-h100-x8", "--megatron-args", str(f))
    assert "not priced: --distribute-saved-activations" in r.stdout


def test_the_placement_priced_is_said(tmp_path):
    f = tmp_path / "l.sh"
    f.write_text("# planner: stage-node-groups=gpu-a,gpu-b\n"
                 f"torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py {BASE} --pipeline-model-parallel-size 2\n")
    r = _cli("check", "--cluster", "dgx-h100-x16", "--megatron-args", str(f))
    assert "gpu-a, gpu-b" in r.stdout and "does not have" in r.stdout
    f.write_text(f"torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py {BASE} --pipeline-model-parallel-size 2\n")
    r = _cli("check", "--cluster", "h100-a100-lab", "--megatron-args", str(f), "--json")
    assert "does not say which hosts each stage" in json.loads(r.stdout)["placement"]


def test_invalid_launch_from_the_reader_is_one_line_per_problem(tmp_path):
    f = tmp_path / "l.sh"
    f.write_text(f"torchrun --nproc-per-node 8 pretrain_gpt.py {BASE} --hiden-size 1 --fp8-format fp4\n")
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(f), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["valid"] is False and len(doc["violations"]) == 2


def test_shell_syntax_the_reader_refuses_is_one_line(tmp_path):
    for text in ("A=(1 2\n", "if true; then\n", "echo ${A\n"):
        with pytest.raises(SpecError):
            parse_text(text, "x.sh", env={})


def test_invalid_strategy_raised_for_model_args():
    with pytest.raises(InvalidStrategy):
        _flags("--num-experts 8 --moe-router-topk 9")


def test_a_2023_style_script_of_quoted_flag_strings_with_the_gpt2_bpe_files():
    """Flags in quoted strings, $((...)) arithmetic and module/conda lines, as user scripts of the
    Megatron-LM 2023 era write them; --vocab-file with --merge-file is GPT-2's BPE: 50,257 tokens."""
    L = parse_file(FIX / "train_strings_2023.sh", env={})
    s, m = L.strategy, L.model
    assert L.world_size == 2 and (s.tp, s.pp, s.dp) == (1, 1, 2)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.vocab_size) == (24, 1024, 16, 50257)
    assert s.precision == "fp16" and s.zero_stage == 1 and s.micro_batch_size == 2 and s.num_microbatches == 8
    assert any("stock GPT-2 BPE" in n and "gpt2-vocab.json" in n for n in L.notes)
    # an explicit --vocab-size wins over the assumption
    assert parse_words((BASE + " --merge-file m.txt --vocab-file v.json").split(), "t", world_size=8).model.vocab_size == 32000
    assert parse_words((BASE.replace("--vocab-size 32000", "--tokenizer-type GPT2BPETokenizer")).split(), "t",
                       world_size=8).model.vocab_size == 50257


def test_gpus_without_fused_attention_kernels_are_priced_unfused(tmp_path):
    """V100 (sm70) has neither FlashAttention-2 nor cuDNN fused attention: `auto` runs the unfused
    softmax, which keeps the s x s scores (Korthikanti's 5 a s^2 b term); an A100 runs fused."""
    from dataclasses import replace
    from planner.estimate import estimate
    from planner.specs.cluster import cluster_from_dict

    def one(gpu):
        return cluster_from_dict({"name": gpu, "node_groups": [{"name": "n", "nodes": 1, "gpus_per_node": 2, "gpu": gpu,
                                                                "nics_per_node": 1, "nic_bandwidth": "100 Gb/s"}]}, "t")
    L = parse_file(FIX / "train_strings_2023.sh", env={})
    v100, a100 = one("v100-sxm2-32g"), one("a100-sxm-40g")
    assert L.strategy.fused_attention
    on_v100 = estimate(L.model, v100, L.strategy)
    unfused = estimate(L.model, v100, replace(L.strategy, fused_attention=False))
    assert on_v100.memory[0].total == unfused.memory[0].total and on_v100.step_time_s == unfused.step_time_s
    # unfused keeps Korthikanti's 5 a s^2 b bytes per layer (softmax out 2, dropout mask 1, dropout
    # out 2; --attention-dropout defaults to 0.1) where fused keeps the fp32 log-sum-exp, 4 a s b
    fused_a100 = estimate(L.model, a100, L.strategy).memory[0].activations
    unfused_a100 = estimate(L.model, a100, replace(L.strategy, fused_attention=False)).memory[0].activations
    seq, b, a = 2048, 2, 16
    assert unfused_a100 - fused_a100 == 24 * (5 * a * seq * seq * b - 4 * a * seq * b)
    assert on_v100.memory[0].activations == unfused_a100
    cluster = tmp_path / "v100.yaml"
    cluster.write_text("name: v\nnode_groups:\n  - {name: n, nodes: 1, gpus_per_node: 2, gpu: v100-sxm2-32g, "
                       "nics_per_node: 1, nic_bandwidth: 100 Gb/s}\n")
    r = _cli("check", "--cluster", str(cluster), "--megatron-args", str(FIX / "train_strings_2023.sh"))
    assert "no fused attention kernels below sm80" in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("script,env,on", [
    ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n", {}, True),
    ("export PYTORCH_ALLOC_CONF='max_split_size_mb:128,expandable_segments:True'\n", {}, True),
    ("", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),         # the job's environment / --set
    ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False\n", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, False),
    ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n", {}, False),          # set but not exported: not the job's
    ("", {}, False),
])
def test_the_allocator_setting_the_training_process_gets(script, env, on):
    text = script + "torchrun --nproc-per-node 8 pretrain_gpt.py " + BASE
    L = parse_text(text, "t.sh", env=env)
    assert L.strategy.expandable_segments is on
    assert any(n.startswith("allocator: " + ("expandable segments" if on else "PyTorch's default")) for n in L.notes)


def test_the_allocator_setting_on_the_launch_command():
    L = parse_text("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun --nproc-per-node 8 pretrain_gpt.py "
                   + BASE, "t.sh", env={})
    assert L.strategy.expandable_segments


def test_an_unquoted_array_expansion_splits_a_quoted_value_as_bash_does():
    """Megatron-LM's gpt3 175B example passes --step-batch-size-schedule "0:16 2.4B:320 ..." in an
    array it expands unquoted (${TRAINING_ARGS[@]}): bash splits the value, argparse takes '0:16'
    and refuses the rest. Quoted ("${ARR[@]}"), the value stays one word."""
    head = 'ARGS=(\n    --step-batch-size-schedule "0:16 2.4B:320 4.8B:624"\n)\ntorchrun --nproc-per-node 8 pretrain_gpt.py '
    with pytest.raises(InvalidLaunch) as exc:
        parse_text(head + "${ARGS[@]} " + BASE, "t.sh", env={})
    (rule, msg), = exc.value.problems
    assert rule == "unknown-flag" and msg.startswith("'2.4B:320' '4.8B:624': 2 unrecognized arguments")
    assert "after --step-batch-size-schedule, which takes one value" in msg and '"${ARR[@]}"' in msg
    L = parse_text(head + '"${ARGS[@]}" ' + BASE, "t.sh", env={})
    assert L.raw["step_batch_size_schedule"] == "0:16 2.4B:320 4.8B:624"


# ---- the vocabulary from the tokenizer a launch names (planner/megatron/tokenizers.py) -------

NO_VOCAB = BASE.replace("--vocab-size 32000 ", "")


def _tokenizer_json(path: Path, vocab, added=()) -> Path:
    """A Hugging Face tokenizer.json: model.vocab (a token -> id map, or Unigram's list of
    [piece, score]) and added_tokens."""
    path.write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": vocab},
                                "added_tokens": [{"id": i, "content": c, "special": True} for i, c in added]}))
    return path


@pytest.mark.parametrize("tokenizer,vocab", [
    # HF config.json "vocab_size", equal to len(tokenizer), which Megatron pads (huggingface_tokenizer.py)
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B", 128256),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-3.2-1B-Instruct", 128256),
    ("--tokenizer-type SFTTokenizer --tokenizer-model nvidia/Llama-3.1-70B-Instruct-FP8", 128256),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model mistralai/Mistral-7B-v0.1", 32000),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model mistralai/Mistral-7B-Instruct-v0.3", 32768),
    ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model openai-community/gpt2", 50257),
    # the type fixes it: Llama 2's tokenizer.model has 32,000 pieces; TikTokenizer's default is
    # 2**17 (tiktoken_tokenizer.py DEFAULT_TIKTOKEN_MAX_VOCAB); GPT-2 BPE's vocab.json 50,257
    ("--tokenizer-type Llama2Tokenizer --tokenizer-model /nowhere/tokenizer.model", 32000),
    ("--tokenizer-type TikTokenizer --tokenizer-model /nowhere/tiktoken.json", 131072),
    ("--tokenizer-type GPT2BPETokenizer", 50257),
    ("--vocab-file /nowhere/gpt2-vocab.json --merge-file /nowhere/gpt2-merges.txt", 50257),
    ("--merge-file /nowhere/gpt2-merges.txt", 50257),
])
def test_the_vocabulary_of_a_well_known_tokenizer_comes_from_the_table(tokenizer, vocab):
    L = parse_words((NO_VOCAB + " " + tokenizer).split(), "t", world_size=8)
    assert L.model.vocab_size == vocab
    said = [n for n in L.notes if n.startswith(f"vocabulary {vocab}: ")]
    assert len(said) == 1 and "add --vocab-size if yours differs" in said[0] and "None" not in said[0]


def test_a_given_vocab_size_wins_over_the_tokenizer():
    # TikTokenizer takes --vocab-size when given (build_tokenizer.py passes it on)
    L = parse_words((BASE + " --tokenizer-type TikTokenizer --tokenizer-model t.json").split(), "t", world_size=8)
    assert L.model.vocab_size == 32000


def test_a_llama_style_script_names_its_tokenizer_by_hugging_face_id():
    L = parse_file(FIX / "train_llama_hf_tokenizer.sh", env={})
    assert L.model.vocab_size == 128256 and L.world_size == 8       # meta-llama/Meta-Llama-3-8B
    assert any("Llama 3's tokenizer (--tokenizer-model meta-llama/Meta-Llama-3-8B)" in n for n in L.notes)
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(FIX / "train_llama_hf_tokenizer.sh"))
    assert r.returncode in (0, 1) and "vocabulary 128256" in r.stdout, r.stdout + r.stderr


def test_a_local_tokenizer_json_is_counted_with_its_added_tokens(tmp_path):
    """len(tokenizer): 5 vocabulary ids plus 3 added tokens, one of which reuses id 4 -> 7."""
    folder = tmp_path / "my-tokenizer"
    folder.mkdir()
    _tokenizer_json(folder / "tokenizer.json", {"a": 0, "b": 1, "c": 2, "d": 3, "<eos>": 4},
                    added=[(4, "<eos>"), (5, "<pad>"), (6, "<sep>")])
    for value in (folder, folder / "tokenizer.json"):            # the folder, or the file itself
        L = parse_file(FIX / "train_llama_hf_tokenizer.sh", env={}, settings={"TOKENIZER_MODEL": str(value)})
        assert L.model.vocab_size == 7
        assert any(n.startswith("vocabulary 7: counted in ") and "tokenizer.json (--tokenizer-model)" in n
                   for n in L.notes)
    # a Unigram model's vocab is a list of [piece, score]
    _tokenizer_json(folder / "tokenizer.json", [["<unk>", 0.0], ["a", -1.0], ["b", -2.0]], added=[(3, "<s>")])
    assert parse_file(FIX / "train_llama_hf_tokenizer.sh", env={},
                      settings={"TOKENIZER_MODEL": str(folder)}).model.vocab_size == 4


def test_a_local_tokenizer_file_that_is_not_one_is_refused_naming_it(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match=r"tokenizer.json: --tokenizer-model: not JSON .*expected a Hugging Face "
                                        r"tokenizer.json or a GPT-2 vocab.json"):
        parse_file(FIX / "train_llama_hf_tokenizer.sh", env={}, settings={"TOKENIZER_MODEL": str(bad)})
    bad.write_text(json.dumps({"model": {"type": "BPE"}}))
    with pytest.raises(SpecError, match="tokenizer.json: --tokenizer-model: no vocabulary in it"):
        parse_file(FIX / "train_llama_hf_tokenizer.sh", env={}, settings={"TOKENIZER_MODEL": str(bad)})


def test_a_gpt3_style_script_asks_for_the_argument_that_names_its_vocab_file(tmp_path):
    """examples/gpt3 passes --vocab-file $VOCAB_FILE with VOCAB_FILE=$3 and no default: the file
    could be counted if given, so the one-line error names the flag, the variable, the
    script argument and the --set that gives it."""
    script = FIX / "train_gpt_vocab_from_args.sh"
    want = (r"--vocab-size: absent, and --vocab-file is \$VOCAB_FILE, set from the script's argument \$2: "
            r"add --set 2=PATH \(the GPT-2 vocab.json\) or --vocab-size N")
    with pytest.raises(SpecError, match=want):
        parse_file(script, env={})
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(script))
    assert r.returncode == 2 and re.search(want, r.stderr) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "None" not in r.stderr
    # given, a vocab.json here is counted; a path that is not here is the stock GPT-2 file
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({f"t{i}": i for i in range(1000)}))
    L = parse_file(script, env={}, settings={"2": str(vocab)})
    assert L.model.vocab_size == 1000 and any("counted in" in n and "(--vocab-file)" in n for n in L.notes)
    assert parse_file(script, env={}, settings={"2": "/nowhere/gpt2-vocab.json"}).model.vocab_size == 50257
    r = _cli("check", "--cluster", "dgx-h100-x8", "--megatron-args", str(script), "--set", f"2={vocab}")
    assert r.returncode in (0, 1) and "vocabulary 1000: counted in" in r.stdout, r.stdout + r.stderr


def test_a_relative_vocab_file_is_found_next_to_the_script(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text((FIX / "train_gpt_vocab_from_args.sh").read_text())
    (tmp_path / "gpt2-vocab.json").write_text(json.dumps({"a": 0, "b": 1, "c": 2}))
    assert parse_file(script, env={}, settings={"2": "gpt2-vocab.json"}).model.vocab_size == 3


def test_a_tokenizer_named_by_an_unset_variable_or_a_command_is_asked_for():
    head = "torchrun --nproc-per-node 8 pretrain_gpt.py " + NO_VOCAB
    with pytest.raises(SpecError, match=r"--vocab-size: absent, and --tokenizer-model is \$TOK, which the script "
                                        r"does not set: add --set TOK=ID_OR_PATH \(a Hugging Face id or tokenizer "
                                        r"folder\) or --vocab-size N"):
        parse_text(head + " --tokenizer-type HuggingFaceTokenizer --tokenizer-model $TOK", "t.sh", env={})
    with pytest.raises(SpecError, match=r"--tokenizer-model is \$TOK_DIR, the output of `\$\(cat tok.txt\)`, not run "
                                        r"here: add --set TOK_DIR=ID_OR_PATH"):
        parse_text("TOK_DIR=$(cat tok.txt)\n" + head + " --tokenizer-type HuggingFaceTokenizer --tokenizer-model $TOK_DIR",
                   "t.sh", env={})
    with pytest.raises(SpecError, match=r"--tokenizer-type is the script's argument \$1: add --set 1=TYPE"):
        parse_text(head + " --tokenizer-type $1", "t.sh", env={})
    # Llama2Tokenizer's file is not counted (no sentencepiece here): its type sizes it, given or not
    L = parse_text("TOKENIZER_MODEL=$2\n" + head + " --tokenizer-type Llama2Tokenizer --tokenizer-model $TOKENIZER_MODEL",
                   "t.sh", env={})
    assert L.model.vocab_size == 32000


def test_without_a_tokenizer_the_vocabulary_is_asked_for_in_words():
    with pytest.raises(SpecError, match=r"--vocab-size: absent, and there is no --tokenizer-type \(nor GPT-2 "
                                        r"--vocab-file / --merge-file\) to size the vocabulary from: add --vocab-size N"):
        parse_words(NO_VOCAB.split(), "t", world_size=8)
    with pytest.raises(SpecError, match=r"--vocab-size: absent; --tokenizer-type NullTokenizer takes its vocabulary "
                                        r"from it: add --vocab-size N"):
        parse_words((NO_VOCAB + " --tokenizer-type NullTokenizer").split(), "t", world_size=8)


@pytest.mark.parametrize("entry,family", [
    ("examples/bert/pretrain_bert.py", "BERT (encoder-only)"),
    ("pretrain_mamba.py", "Mamba (state-space)"),
    ("${SOURCE}/examples/multimodal/train.py", "LLaVA-style vision-language (multimodal)"),
    ("examples/mimo/train.py", "MIMO (multimodal)"),
])
def test_other_model_families_are_refused_by_name(entry, family):
    text = f"torchrun --nproc-per-node 8 {entry} {BASE} --encoder-num-layers 4\n"
    with pytest.raises(SpecError, match=re.escape(f"{family} is not a decoder-only GPT model; the planner reads "
                                                  "pretrain_gpt.py launches")):
        parse_text(text, "t.sh", env={})


def test_a_users_own_train_py_is_read_as_gpt():
    L = parse_text(f"torchrun --nproc-per-node 8 my/train.py {BASE}\n", "t.sh", env={})
    assert L.entry == "train.py" and L.model.vocab_size == 32000


def test_the_script_folder_idiom_sources_a_neighbour(tmp_path):
    """SCRIPT_DIR="$(dirname "$(readlink -f "$0")")" (Megatron-LM's examples/post_training/modelopt)
    is the folder the script was read from, so `source ${SCRIPT_DIR}/conf.sh` is read."""
    (tmp_path / "conf.sh").write_text(f'MODEL_ARGS="{BASE}"\n')
    script = tmp_path / "train.sh"
    script.write_text('SCRIPT_DIR="$(dirname "$(readlink -f "$0")")"\nsource "${SCRIPT_DIR}/conf.sh"\n'
                      "torchrun --nproc-per-node 8 pretrain_gpt.py ${MODEL_ARGS}\n")
    L = parse_file(script, env={})
    assert L.model.num_layers == 8 and any("the script's folder" in n for n in L.notes)


def test_flags_in_a_file_sourced_by_a_script_argument_ask_for_that_argument(tmp_path):
    """examples/post_training/modelopt/train.sh sources conf/${1}.sh for the model's flags: without
    the argument the error points at that `source`; with --set 1=... it is read."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "small.sh").write_text(f'MODEL_ARGS="{BASE}"\n')
    script = tmp_path / "train.sh"
    script.write_text('SCRIPT_DIR="$(dirname "$(readlink -f "$0")")"\nsource "${SCRIPT_DIR}/conf/$1.sh"\n'
                      "torchrun --nproc-per-node 8 pretrain_gpt.py ${MODEL_ARGS}\n")
    with pytest.raises(SpecError, match=r"--num-layers: required.*`source .*conf/\$1.sh`: the path cannot be known "
                                        r"without running it; not read \(--set what its path needs\)"):
        parse_file(script, env={})
    assert parse_file(script, env={}, settings={"1": "small"}).model.num_layers == 8
