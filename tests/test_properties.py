"""Property-based tests: loaders and the Megatron parser never crash on random input (they
either load or raise SpecError), and cost-model invariants hold."""

import json
import os

from hypothesis import HealthCheck, given, settings, strategies as st

from planner.megatron.launch import parse_text
from planner.emit.report import estimate_to_dict
from planner.errors import PlannerError, SpecError
from planner.estimate import layer_time_of, time_key, estimate
from planner.library import load_cluster_ref, load_model_ref
from planner.specs.model import model_from_dict
from planner.strategy import Strategy
from planner.yamlio import load_text

LLAMA = load_model_ref("llama3-8b")
CLUSTER = load_cluster_ref("dgx-h100-x8")
FLAGS = ["--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--vocab-size",
         "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
         "--global-batch-size", "--swiglu", "--bf16", "--fp16", "--recompute-granularity", "--foo"]
# shell the launch reader interprets (found hangs in the parser once: every input must end)
SHELL = ["if", "then", "fi", "else", "case", "esac", "in", "for", "do", "done", "while", "A=(", ")", "(",
         "${X:-", "}", "<<EOF", "EOF", "\n", "$((1+", "))", "[[", "]]", "[", "]", "bash -c", "source", "torchrun",
         "pretrain_gpt.py", "A+=(", '"${A[@]}"', "$A", "export", "X=1", ";;", "*)", "&&", "||", "{", "|", "f()",
         "$1", "$(", "`", "'", '"', "#SBATCH --nodes=2", "srun"]


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_yaml_loader_never_crashes(text):
    try:
        data = load_text(text, "x.yaml")
        model_from_dict(data, "x.yaml")
    except SpecError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(FLAGS), st.sampled_from(SHELL), st.integers(-3, 5000).map(str),
                          st.text(max_size=8)), max_size=30))
def test_megatron_parser_never_crashes(words):
    try:
        parse_text(" ".join(words), "launch.sh", env={}, default_world_size=16)
    except PlannerError:
        pass


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), mbs=st.sampled_from([1, 2]),
       rec=st.sampled_from(["none", "selective", "full"]), z=st.sampled_from([0, 1, 2, 3]))
def test_step_time_never_beats_compute_and_json_is_deterministic(tp, pp, mbs, rec, z):
    dp = 64 // (tp * pp)
    s = Strategy(tp=tp, pp=pp, dp=dp, micro_batch_size=mbs, global_batch_size=dp * mbs * 8,
                 seq_length=2048, recompute=rec, zero_stage=z)
    e = estimate(LLAMA, CLUSTER, s)
    gpu = CLUSTER.node_groups[0].gpu
    per_layer = layer_time_of(LLAMA, time_key(s), gpu, False).total
    bound = per_layer * (LLAMA.num_layers / pp) * s.num_microbatches
    assert e.step_time_s >= bound * (1 - 1e-9)
    a = json.dumps(estimate_to_dict(e), sort_keys=True)
    b = json.dumps(estimate_to_dict(estimate(LLAMA, CLUSTER, s)), sort_keys=True)
    assert a == b


_PLAN_DOC = None


def _plan_doc():
    global _PLAN_DOC
    if _PLAN_DOC is None:
        s = Strategy(tp=2, pp=2, dp=16, vpp=2, micro_batch_size=1, global_batch_size=128, seq_length=4096)
        _PLAN_DOC = estimate_to_dict(estimate(LLAMA, CLUSTER, s))
    return json.loads(json.dumps(_PLAN_DOC))


_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=True),
                  st.text(max_size=6), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


# FUZZ_EXAMPLES=2000 for a deeper run than CI's
@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 150)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["plan", "stage", "drop"]), st.integers(0, 40), _JUNK), min_size=1, max_size=4))
def test_plan_json_mutations_never_crash(tmp_path_factory, mutations):
    """#7: a hand-edited plan JSON is either accepted or refused with SpecError (exit 2) or
    InvalidStrategy (exit 1): never another exception."""
    from planner.megatron.check import strategy_from_plan_json
    from planner.errors import InvalidStrategy
    doc = _plan_doc()
    plan = doc["plan"]
    keys = sorted(k for k in plan if k != "stages")
    for where, k, junk in mutations:
        if where == "plan":
            plan[keys[k % len(keys)]] = junk
        elif where == "stage":
            st_ = plan["stages"][k % len(plan["stages"])]
            st_[sorted(st_)[k % len(st_)]] = junk
        else:
            plan.pop(keys[k % len(keys)], None)
    f = tmp_path_factory.mktemp("plan") / "plan.json"
    f.write_text(json.dumps(doc))
    try:
        s = strategy_from_plan_json(str(f))
        estimate(LLAMA, CLUSTER, s)
    except (SpecError, InvalidStrategy):
        pass
