"""Sweeps (engine/sweep.py, ``python -m engine sweep``): expansion by hand, errors naming the key,
and a real two-run grid trained through the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.cli import main
from engine.sweep import SweepError, load_sweep
from tests.engine.conftest import BASE_CONFIG


def _write(tmp_path: Path, **sweep: Any) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"config": BASE_CONFIG, "output_dir": str(tmp_path / "out"), **sweep}))
    return path


def test_grid_is_the_product_in_file_order(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        name="g",
        parameters={
            "algorithm.learning_rate": {"values": [0.001, 0.01]},
            "train.seed": {"values": [0, 1, 2]},
        },
    )
    sweep = load_sweep(path)
    assert [r["values"] for r in sweep.runs] == [
        {"algorithm.learning_rate": lr, "train.seed": s} for lr in (0.001, 0.01) for s in (0, 1, 2)
    ]
    assert [r["name"] for r in sweep.runs][:2] == ["g-000", "g-001"]
    run = sweep.runs[4]  # lr 0.01, seed 1
    assert run["config"]["algorithm"]["learning_rate"] == 0.01 and run["config"]["train"]["seed"] == 1
    assert run["config"]["train"]["output_dir"] == str(tmp_path / "out" / "run-004")
    assert run["config"]["rollout"]["max_new_tokens"] == BASE_CONFIG["rollout"]["max_new_tokens"]  # base kept


def test_random_draws_are_seeded_and_in_range(tmp_path: Path) -> None:
    params = {
        "algorithm.learning_rate": {"min": 1e-5, "max": 1e-2, "log": True},
        "train.seed": {"values": [7, 8]},
    }
    a = load_sweep(_write(tmp_path, method="random", count=20, seed=3, parameters=params))
    b = load_sweep(_write(tmp_path, method="random", count=20, seed=3, parameters=params))
    c = load_sweep(_write(tmp_path, method="random", count=20, seed=4, parameters=params))
    values = [r["values"] for r in a.runs]
    assert values == [r["values"] for r in b.runs] and values != [r["values"] for r in c.runs]
    lrs = [v["algorithm.learning_rate"] for v in values]
    assert all(1e-5 <= x <= 1e-2 for x in lrs)
    # log-uniform: the draws spread over the decades (a uniform draw would put ~all of them above 1e-3)
    assert sum(x < 1e-3 for x in lrs) >= 5
    assert {v["train.seed"] for v in values} == {7, 8}
    assert not any(math.isnan(x) for x in lrs)


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        (
            {"parameters": {"algorithm.learning_rate": {"min": 0.1, "max": 1}}},
            r"parameters.algorithm.learning_rate: a grid needs",
        ),
        ({"parameters": {"algorithm.nope": {"values": [1]}}}, r"algorithm.nope: unknown key"),
        ({"parameters": {"train.n_iters": {"values": [-1]}}}, r"train.n_iters"),
        ({"method": "random", "parameters": {"train.seed": {"values": [1]}}}, r"count: method random needs"),
        (
            {"parameters": {"train.seed": {"values": []}}},
            r"parameters.train.seed.values: expected a non-empty list",
        ),
        ({"parameters": {"train.seed": [1, 2]}}, r"parameters.train.seed: expected"),
        ({"methd": "grid", "parameters": {"train.seed": {"values": [1]}}}, r"unknown key\(s\) methd"),
    ],
)
def test_bad_sweeps_name_the_key(tmp_path: Path, sweep: dict[str, Any], message: str) -> None:
    with pytest.raises(SweepError, match=message):
        load_sweep(_write(tmp_path, **sweep))


def test_cli_runs_a_grid_and_writes_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = {**BASE_CONFIG, "train": {**BASE_CONFIG["train"], "n_iters": 1, "save_final_model": False}}
    path = tmp_path / "sweep.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "cli",
                "config": base,
                "metric": "train/reward_mean",
                "output_dir": str(tmp_path / "out"),
                "parameters": {"train.seed": {"values": [0, 1]}},
            }
        )
    )
    assert main(["sweep", str(path), "--dry-run"]) == 0
    assert not (tmp_path / "out" / "run-000").exists()  # a dry run trains nothing
    assert main(["sweep", str(path)]) == 0
    summary = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [r["values"] for r in summary["runs"]] == [{"train.seed": 0}, {"train.seed": 1}]
    assert all(r["status"] == "succeeded" for r in summary["runs"])
    for r in summary["runs"]:
        last = [json.loads(x) for x in (Path(r["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        reward = [x["train/reward_mean"] for x in last if "train/reward_mean" in x][-1]
        assert r["metric"] == pytest.approx(reward)  # the reported metric is the run's final one
    out = capsys.readouterr().out
    assert "cli-000" in out and "cli-001" in out and "train/reward_mean" in out
