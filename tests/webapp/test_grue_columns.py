"""Issue 26.8: the GRUE board has columns for every algorithm the engine trains (A2C, TRPO, GRPO, DPO
always; RLOO, REINFORCE++ and "Supervised +" ones once a run fills them), and a DPO run on preference
pairs joins the row of the metric it evaluated. Pure functions on plain run records."""

from __future__ import annotations

from typing import Any

from webapp.grue.leaderboard import FIXED_COLUMNS, build_board, column_label, pairs_row


def record(pk: int, task: str, alg: str, metrics: dict[str, float], sft: bool = False) -> dict[str, Any]:
    config = {"task": {"id": task}, "algorithm": {"id": alg}, "supervised": {"enabled": sft}}
    return {"id": pk, "name": f"r{pk}", "task": task, "config": config, "metrics": metrics, "model": "m"}


def test_fixed_and_filled_columns() -> None:
    board = build_board([])
    assert [a["id"] for a in board["algorithms"]] == list(FIXED_COLUMNS)
    assert [a["label"] for a in board["algorithms"]][-4:] == ["A2C", "TRPO", "GRPO", "DPO"]
    runs = [
        record(1, "synthetic_increasing_numbers", "grpo", {"reward_mean": 0.8}),
        record(2, "synthetic_increasing_numbers", "rloo", {"reward_mean": 0.6}),
        record(3, "synthetic_increasing_numbers", "trpo", {"reward_mean": 0.5}, sft=True),
    ]
    board = build_board(runs)
    ids = [a["id"] for a in board["algorithms"]]
    assert ids == [*FIXED_COLUMNS, "rloo", "supervised_trpo"]
    assert column_label("supervised_trpo") == "Supervised + TRPO"
    row = next(r for r in board["tasks"] if r["task"] == "synthetic_increasing_numbers")
    by_alg = {c["algorithm"]: c for c in row["cells"]}
    assert by_alg["grpo"]["run"]["id"] == 1 and by_alg["rloo"]["run"]["id"] == 2
    assert by_alg["supervised_trpo"]["run"]["id"] == 3 and by_alg["trpo"]["run"] is None
    assert by_alg["grpo"]["score"] == 1.0 and by_alg["supervised_trpo"]["score"] == 0.0


def test_a_dpo_run_on_pairs_joins_the_row_of_its_metric() -> None:
    assert pairs_row({"semantic/sentiment_vader": 0.3}) == "imdb"
    assert pairs_row({"lexical/rouge_l_max": 0.2}) == "narrative_qa"
    assert pairs_row({"reward_mean": 0.1}) is None  # every run has a reward: it names no task
    board = build_board([record(7, "preference_pairs", "dpo", {"semantic/sentiment_vader": 0.3})])
    imdb = next(r for r in board["tasks"] if r["task"] == "imdb")
    assert next(c for c in imdb["cells"] if c["algorithm"] == "dpo")["run"]["id"] == 7
