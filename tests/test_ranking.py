"""validation/ranking.py: the ranking sets load with a source per row, the rank statistic and the wrong-pair rule
against hand-worked examples, and the printed rho of a set against its printed rows."""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from validation import ranking  # noqa: E402


def test_sets_load_and_every_row_has_a_source():
    data = ranking.load()
    assert len(data["sets"]) >= 6
    for s in data["sets"]:
        assert len(s["rows"]) >= 2, s["id"]
        for r in s["rows"]:
            if "bridge_row" in r:   # the measured figure and its source live in megatron_bridge_perf.yaml
                src = data["perf"][r["bridge_row"]]["source"]
            else:
                src = r["source"]
            assert "@" in src or "@" in s["source"], (s["id"], r["id"])   # a repository at a commit
    for skipped in data["skipped"]:
        assert skipped["what"] and skipped["why"]


def test_spearman_hand_worked():
    # ranks x 1 2 3 4, ranks y 1 3 2 4: sum d^2 = 2, rho = 1 - 6*2 / (4*(16-1)) = 0.8
    assert ranking.spearman([10, 20, 30, 40], [1, 3, 2, 4]) == pytest.approx(0.8)
    # ties: y ranks 1.5 1.5 3 against 1 2 3: cov 1.5 / sqrt(2 * 1.5) = 0.8660
    assert ranking.spearman([1, 2, 3], [1, 1, 2]) == pytest.approx(1.5 / 3 ** 0.5)
    assert ranking.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert ranking.spearman([1, 2], [5, 5]) is None          # one side all ties: undefined
    assert ranking.spearman([1], [2]) is None


def test_wrong_pairs_hand_worked():
    rows = [{"id": "a", "predicted_tokens_per_s_per_gpu": 200.0, "measured_tokens_per_s_per_gpu": 100.0, "breakdown": {}},
            {"id": "b", "predicted_tokens_per_s_per_gpu": 150.0, "measured_tokens_per_s_per_gpu": 120.0, "breakdown": {}},
            {"id": "c", "predicted_tokens_per_s_per_gpu": 100.0, "measured_tokens_per_s_per_gpu": 110.0, "breakdown": {}}]
    got = {(p["predicted_faster"], p["measured_faster"]): p for p in ranking.wrong_pairs(rows)}
    # a over b: measured 120/100 - 1 = 20% slower (flagged); a over c: 110/100 - 1 = 10% (not flagged); b over c: right order
    assert set(got) == {("a", "b"), ("a", "c")}
    assert got[("a", "b")]["measured_slower_pct"] == pytest.approx(20.0) and got[("a", "b")]["flagged"]
    assert got[("a", "c")]["measured_slower_pct"] == pytest.approx(10.0) and not got[("a", "c")]["flagged"]


def test_edit_flags():
    text = "torchrun --nnodes 8 pretrain_gpt.py --tp 1 --enable-cuda-graph --cuda-graph-scope full --bf16"
    got = ranking.edit_flags(text, {"--nnodes": 32, "--tp": 2, "--vpp": 4}, ["--sequence-parallel"],
                             ["--enable-cuda-graph", "--cuda-graph-scope"])
    assert got == "torchrun --nnodes 32 pretrain_gpt.py --tp 2 --bf16 --vpp 4 --sequence-parallel"
    got = ranking.edit_flags(text, {"--cuda-graph-scope": ["attn", "moe_router"]}, [], [])
    assert got == "torchrun --nnodes 8 pretrain_gpt.py --tp 1 --enable-cuda-graph --cuda-graph-scope attn moe_router --bf16"
    with pytest.raises(ranking.RankingDataError, match="not in the launch"):
        ranking.edit_flags(text, {}, [], ["--absent"])


def test_bad_set_is_one_line_error(tmp_path):
    doc = yaml.safe_load(ranking.RANKING.read_text())
    doc["sets"][0]["rows"] = doc["sets"][0]["rows"][:1]
    bad = tmp_path / "moe_ranking.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ranking.RankingDataError, match=r"rows: 1 row\(s\); expected at least 2"):
        ranking.load(bad)


def _ranks(values):
    """Average ranks by counting (independent of ranking._ranks): rank = #smaller + (#equal + 1) / 2."""
    return [sum(w < v for w in values) + (sum(w == v for w in values) + 1) / 2 for v in values]


def test_printed_rho_matches_printed_rows(capsys):
    ranking.main([])
    out = capsys.readouterr().out
    block = out.split("== qwen3_235b_a22b-h100x256-modelzoo")[1].split("==")[0]
    rows = re.findall(r"^   (\S+)\s+(\d+)\s+(\d+)\s+\d", block, flags=re.M)
    assert len(rows) == 5
    measured = [float(m) for _, m, _ in rows]
    predicted = [float(p) for _, _, p in rows]
    rho = statistics.correlation(_ranks(predicted), _ranks(measured))
    printed = float(re.search(r"Spearman rho ([+-]\d\.\d\d)", block).group(1))
    assert printed == pytest.approx(rho, abs=0.005)
