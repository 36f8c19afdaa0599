"""``study check``: the paired test-sentiment difference and the training-reward rise, by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engine.cli import main as cli_main
from engine.study import SENTIMENT, StudyError, learning_check


def _run(d: Path, scores: list[float], rewards: list[float] | None = None) -> Path:
    d.mkdir(parents=True)
    samples = [{"sample_id": f"p{i}", "metrics": {SENTIMENT: s}} for i, s in enumerate(scores)]
    mean = sum(scores) / len(scores)
    (d / "test_results.json").write_text(json.dumps({"metrics": {SENTIMENT: mean}, "samples": samples}))
    lines = [
        {"step": i + 1, "train/reward_mean": r, "policy/param_drift": 0.001 * (i + 1)}
        for i, r in enumerate(rewards or [])
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def test_paired_difference_and_reward_rise(tmp_path):
    base = _run(tmp_path / "zero", [0.1, 0.5, 0.9, 0.3])
    # per-prompt differences 0.2, 0.1, 0.0, 0.3: mean 0.15, sample sd sqrt(0.05/3), se = sd / 2
    run = _run(tmp_path / "ppo", [0.3, 0.6, 0.9, 0.6], rewards=[0.4, 0.5, 0.6, 0.9, 1.0, 0.8])
    out = learning_check(run, base, window=2)
    paired = out["paired"][SENTIMENT]
    se = math.sqrt(0.05 / 3) / 2
    assert paired["n"] == 4
    assert paired["mean_diff"] == pytest.approx(0.15)
    assert paired["se"] == pytest.approx(se)
    assert paired["z"] == pytest.approx(0.15 / se)
    assert out["test"][SENTIMENT]["diff"] == pytest.approx(0.15)
    # first two iterations 0.4, 0.5 (mean 0.45, sd sqrt(0.005)); last two 1.0, 0.8 (mean 0.9, sd sqrt(0.02))
    tr = out["train_reward"]
    assert (tr["first"], tr["last"], tr["rise"]) == pytest.approx((0.45, 0.9, 0.45))
    assert tr["z"] == pytest.approx(0.45 / math.sqrt(0.005 / 2 + 0.02 / 2))
    assert out["last"]["policy/param_drift"] == pytest.approx(0.006)


def test_a_run_without_a_test_evaluation_is_named(tmp_path, capsys):
    base = _run(tmp_path / "zero", [0.5, 0.5])
    (tmp_path / "ppo").mkdir()
    with pytest.raises(StudyError, match="ppo: no test_results.json"):
        learning_check(tmp_path / "ppo", base)
    run = _run(tmp_path / "ppo2", [0.6, 0.7])
    assert cli_main(["study", "check", str(run), "--baseline", str(base)]) == 0
    assert json.loads(capsys.readouterr().out)["paired"][SENTIMENT]["mean_diff"] == pytest.approx(0.15)


def test_comparison_figures_overlay_both_runs(tmp_path, capsys):
    """The critic check's figures: each curve drawn once per run, in two colours, legend = the labels."""
    base = _run(tmp_path / "shared", [0.5, 0.6], rewards=[0.1, 0.2, 0.3])
    run = _run(tmp_path / "separate", [0.6, 0.7], rewards=[0.1, 0.4, 0.9])
    figs = tmp_path / "figs"
    code = cli_main(
        ["study", "check", str(run), "--baseline", str(base), "--figures", str(figs)]
        + ["--labels", "separate <critic>", "shared", "--figure-prefix", "critic-"]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    # only the reward curve has data in both runs; the other curves have no points and no file
    assert set(out["figures"]) == {"reward"}
    svg = (figs / "critic-reward.svg").read_text()
    assert svg.count("<polyline") == 2
    assert 'stroke="#1f77b4"' in svg and 'stroke="#d62728"' in svg
    assert "separate &lt;critic&gt;" in svg and ">shared<" in svg  # labels escaped
    with pytest.raises(SystemExit):  # argparse: --labels takes exactly two
        cli_main(
            ["study", "check", str(run), "--baseline", str(base), "--figures", str(figs), "--labels", "a"]
        )
