"""The specs the cost caches key on hash their fields once (planner/hashing.py)."""

import pickle
from dataclasses import replace

from planner.library import load_bundled_profile, load_model_ref
from planner.strategy import Strategy


def test_a_cached_hash_is_the_fields_hash_and_is_not_pickled():
    for spec in (load_model_ref("qwen3-235b-a22b"), load_bundled_profile("h100-sxm-80g"), Strategy(tp=2, pp=4)):
        h = hash(spec)
        assert hash(spec) == h and "_hash" in spec.__dict__
        again = pickle.loads(pickle.dumps(spec))
        assert "_hash" not in again.__dict__     # another process hashes strings otherwise
        assert again == spec and hash(again) == h
        changed = replace(spec, name="other") if hasattr(spec, "name") else replace(spec, tp=4)
        assert changed != spec and hash(changed) != h
        assert {spec: 1}.get(again) == 1


def test_with_is_dataclasses_replace():
    """Strategy.with_ skips __init__ for speed but gives what dataclasses.replace gives: the
    same fields, __post_init__'s schedule rule, a fresh hash; unknown fields are refused."""
    import pytest
    s = Strategy(tp=2, pp=4, dp=8, micro_batch_size=2, global_batch_size=256, seq_length=4096)
    hash(s)
    for kw in ({"pp": 8}, {"vpp": 2}, {"zero_stage": 1, "overlap_param_gather": True},
               {"recompute": "full", "recompute_num_layers": 2, "layers_per_stage": (9, 8, 8, 7)},
               {"stage_node_groups": ("a", "a", "b", "b")}):
        fast, slow = s.with_(**kw), replace(s, **kw)
        assert fast == slow and hash(fast) == hash(slow) and fast.schedule == slow.schedule
        assert "_hash" not in s.with_(**kw).__dict__
    assert s.with_(vpp=2).schedule == "interleaved"
    with pytest.raises(TypeError):
        s.with_(pipeline=3)
