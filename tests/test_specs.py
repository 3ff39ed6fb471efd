import json

import pytest

from planner.errors import SpecError
from planner.library import bundled_cluster_names, bundled_model_names, bundled_profile_names, load_cluster_ref, load_model_ref
from planner.specs.cluster import cluster_from_dict
from planner.specs.hf import model_from_hf
from planner.specs.model import model_from_dict
from planner.units import UnitError, parse_bandwidth, parse_size, parse_time
from planner.yamlio import load_text


@pytest.mark.parametrize("name", bundled_model_names())
def test_every_bundled_model_loads(name):
    m = load_model_ref(name)
    assert m.parameters > 0 and m.active_parameters <= m.parameters
    assert m.source


@pytest.mark.parametrize("name", bundled_cluster_names())
def test_every_bundled_cluster_loads(name):
    assert load_cluster_ref(name).num_gpus > 0


def test_at_least_ten_profiles_and_models():
    assert len(bundled_profile_names()) >= 10
    assert len(bundled_model_names()) >= 10


# Published parameter counts (model cards / papers), checked within 1%.
PUBLISHED = {
    "llama3-8b": (8.03e9, None), "llama3-70b": (70.6e9, None), "llama3.1-405b": (405.9e9, None),
    "mixtral-8x7b": (46.7e9, 12.9e9), "mixtral-8x22b": (141e9, 39e9), "deepseek-v3": (671e9, 37e9),
    "qwen2.5-72b": (72.7e9, None), "qwen3-235b-a22b": (235e9, 22e9), "gpt-neox-20b": (20.55e9, None),
    "gpt3-175b": (175e9, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published(name):
    total, active = PUBLISHED[name]
    m = load_model_ref(name)
    assert abs(m.parameters / total - 1) < 0.01
    if active:
        # DeepSeek-V3's 37B is rounded down in the report; allow 2% there
        assert abs(m.active_parameters / active - 1) < (0.02 if name == "deepseek-v3" else 0.01)


def test_units():
    assert parse_bandwidth("400 Gb/s") == 50e9
    assert parse_bandwidth("50 GB/s") == 50e9
    assert parse_bandwidth("100 Mb/s") == 12.5e6
    assert parse_time("5 us") == pytest.approx(5e-6)
    assert parse_size("2 GiB") == 2 * 2**30
    for bad in (400, "400", "400 furlongs", "-3 Gb/s", True):
        with pytest.raises(UnitError):
            parse_bandwidth(bad)


def test_relations_checked():
    base = {"name": "x", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 8, "vocab_size": 100}
    with pytest.raises(SpecError, match="num_query_groups"):
        model_from_dict({**base, "num_query_groups": 3}, "m.yaml")
    with pytest.raises(SpecError, match="hidden_size"):
        model_from_dict({**base, "hidden_size": 60}, "m.yaml")
    with pytest.raises(SpecError, match="moe_router_topk"):
        model_from_dict({**base, "num_experts": 4, "moe_router_topk": 5}, "m.yaml")
    with pytest.raises(SpecError, match="num_layers"):
        model_from_dict({**base, "num_layers": 0}, "m.yaml")
    with pytest.raises(SpecError, match="did you mean 'hidden_size'"):
        model_from_dict({**base, "hiden_size": 3}, "m.yaml")


def test_cluster_errors_name_field():
    good = {"name": "c", "node_groups": [{"name": "a", "nodes": 1, "gpus_per_node": 8, "gpu": "h100-sxm-80g",
                                          "nics_per_node": 8, "nic_bandwidth": "400 Gb/s"}]}
    assert cluster_from_dict(good, "c.yaml").num_gpus == 8
    bad = json.loads(json.dumps(good))
    bad["node_groups"][0]["nic_bandwidth"] = 400
    with pytest.raises(SpecError, match=r"c.yaml: node_groups\[0\].nic_bandwidth"):
        cluster_from_dict(bad, "c.yaml")
    bad = json.loads(json.dumps(good))
    bad["node_groups"][0]["gpu"] = "h100-sxm-8g"
    with pytest.raises(SpecError, match="did you mean"):
        cluster_from_dict(bad, "c.yaml")
    bad["node_groups"][0]["gpu"] = "../../etc/passwd.yaml"
    with pytest.raises(SpecError, match="escapes"):
        cluster_from_dict(bad, "c.yaml")


def test_yaml_is_safe_and_bounded():
    with pytest.raises(SpecError, match="not valid YAML"):
        load_text("!!python/object/apply:os.system ['true']", "x.yaml")
    laughs = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]\n"
        for i in range(8))
    with pytest.raises(SpecError):
        load_text(laughs, "laughs.yaml")


def test_hf_configs_map():
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
             "tie_word_embeddings": False, "hidden_act": "silu"}
    m = model_from_hf(llama, "config.json")
    assert abs(m.parameters / 8.03e9 - 1) < 0.01
    mix = {**llama, "model_type": "mixtral", "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}
    m = model_from_hf(mix, "config.json")
    assert abs(m.parameters / 46.7e9 - 1) < 0.01 and abs(m.active_parameters / 12.9e9 - 1) < 0.01
    ds = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
          "num_attention_heads": 128, "num_hidden_layers": 61, "num_key_value_heads": 128, "vocab_size": 129280,
          "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
          "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
          "v_head_dim": 128, "max_position_embeddings": 163840, "hidden_act": "silu"}
    m = model_from_hf(ds, "config.json")
    assert abs(m.parameters / 671e9 - 1) < 0.01
    q3 = {"model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
          "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 94,
          "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8, "hidden_act": "silu"}
    m = model_from_hf(q3, "config.json")
    assert abs(m.parameters / 235e9 - 1) < 0.01 and abs(m.active_parameters / 22e9 - 1) < 0.02
    with pytest.raises(SpecError, match="model_type"):
        model_from_hf({**llama, "model_type": "bert"}, "config.json")


def test_a_null_field_is_a_field_left_out():
    """`num_query_groups: null` (or a bare `num_query_groups:`) is the field left out: its
    default (one group per head), not a crash (found by the mutated-spec fuzz test)."""
    base = {"name": "m", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 8, "ffn_hidden_size": 1024,
            "vocab_size": 1000, "max_position_embeddings": 512}
    assert model_from_dict({**base, "num_query_groups": None}, "m.yaml") == model_from_dict(base, "m.yaml")
    with pytest.raises(SpecError, match="num_query_groups"):
        model_from_dict({**base, "num_query_groups": 3}, "m.yaml")
