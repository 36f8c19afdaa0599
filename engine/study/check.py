"""The learning check (``python -m engine study check``): does one trained run beat its baseline
beyond the noise? Run before the grid, so a budget that does not learn is found in one run, not in
eighteen (docs/reproduction.md, "The learning check")."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from engine.study.charts import svg_chart
from engine.study.common import (
    PERPLEXITY,
    SENTIMENT,
    SENTIMENT_CONTINUATION,
    SENTIMENT_VADER,
    TEST_FILE,
    StudyError,
    mean_std,
)
from engine.study.reading import curve_points


def _window(points: list[tuple[int, float]], first: int, last: int) -> list[float]:
    return [v for s, v in points if first <= s <= last]


def learning_check(run_dir: str | Path, baseline_dir: str | Path, window: int = 5) -> dict[str, Any]:
    """Does one trained run beat its baseline beyond the noise? (issue #24 §2, before the grid).

    Test sentiment: the per-prompt difference of the two runs' scores on the same test prompts (the
    runs share prompts, so the paired difference removes the prompts' own sentiment), its mean and
    standard error, and how many standard errors apart they are. Training reward: the mean of the
    first and of the last ``window`` iterations, each with its standard error over iterations. Also the
    last KL, β and parameter drift, and the policy perplexity of both runs."""
    run_dir, baseline_dir = Path(run_dir), Path(baseline_dir)
    out: dict[str, Any] = {"run": str(run_dir), "baseline": str(baseline_dir)}
    tests = []
    for d in (run_dir, baseline_dir):
        path = d / TEST_FILE
        if not path.exists():
            raise StudyError(f"{d}: no {TEST_FILE} (the run has no test evaluation yet)")
        tests.append(json.loads(path.read_text()))
    for key in (SENTIMENT, SENTIMENT_CONTINUATION, SENTIMENT_VADER, PERPLEXITY):
        a, b = (t["metrics"].get(key) for t in tests)
        if a is not None and b is not None:
            out.setdefault("test", {})[key] = {"run": a, "baseline": b, "diff": a - b}
    by_prompt = [{r["sample_id"]: r.get("metrics", {}) for r in t["samples"]} for t in tests]
    for key in (SENTIMENT, SENTIMENT_CONTINUATION, SENTIMENT_VADER):
        diffs = [
            m[key] - by_prompt[1][sid][key]
            for sid, m in by_prompt[0].items()
            if key in m and key in by_prompt[1].get(sid, {})
        ]
        if len(diffs) >= 2:
            mean, sd = mean_std(diffs)
            se = sd / math.sqrt(len(diffs))
            out.setdefault("paired", {})[key] = {
                "n": len(diffs),
                "mean_diff": mean,
                "se": se,
                "z": mean / se if se > 0 else float("inf"),
            }
    pts = curve_points(run_dir)
    reward = pts.get("train/reward_mean", [])
    if reward:
        steps = [s for s, _ in reward]
        first, last = (
            _window(reward, steps[0], steps[0] + window - 1),
            _window(reward, steps[-1] - window + 1, steps[-1]),
        )
        fm, fs = mean_std(first)
        lm, ls = mean_std(last)
        se = math.sqrt((fs or 0) ** 2 / len(first) + (ls or 0) ** 2 / len(last))
        out["train_reward"] = {
            "first": fm,
            "first_sd": fs,
            "last": lm,
            "last_sd": ls,
            "window": window,
            "rise": lm - fm,
            "z": (lm - fm) / se if se > 0 else None,
            "iterations": len(reward),
        }
    for key in ("train/kl", "train/kl_coef", "policy/param_drift", "time/iteration_s"):
        if pts.get(key):
            out.setdefault("last", {})[key] = pts[key][-1][1]
    iter_s = [v for _, v in pts.get("time/iteration_s", [])]
    if iter_s:
        out["mean_iteration_s"] = sum(iter_s) / len(iter_s)
    return out


#: The curves two runs are compared by (issue #24's critic check: reward, KL and policy perplexity, plus
#: how much of the return the critic explains): (metric key, chart title, file stem).
COMPARE_CURVES: tuple[tuple[str, str, str], ...] = (
    ("train/reward_mean", "Training reward (mean per iteration)", "reward"),
    ("train/kl", "KL to the reference model (per token, nats)", "kl"),
    ("eval/" + PERPLEXITY, "Policy perplexity on validation references", "perplexity"),
    ("value/explained_var", "Critic: explained variance of the returns", "explained_var"),
    ("eval/" + SENTIMENT, "Validation sentiment", "sentiment"),
)


def comparison_figures(runs: dict[str, str | Path], out_dir: str | Path, prefix: str = "") -> dict[str, str]:
    """One SVG per curve of :data:`COMPARE_CURVES` with each run's series overlaid (legend: the keys
    of ``runs``), written as ``out_dir/<prefix><stem>.svg``; returns ``{stem: path}``. Why: the critic
    check's verdict rests on curves over training, not on the final numbers alone, and docs/reproduction.md
    shows them as images."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    points = {label: curve_points(Path(d)) for label, d in runs.items()}
    written: dict[str, str] = {}
    for key, title, stem in COMPARE_CURVES:
        series = {}
        for label, pts in points.items():
            if pts.get(key):
                steps = [s for s, _ in pts[key]]
                series[label] = {
                    "steps": steps,
                    "mean": [v for _, v in pts[key]],
                    "std": [0.0] * len(steps),
                    "n": [1] * len(steps),
                }
        if not series:
            continue
        path = out_dir / f"{prefix}{stem}.svg"
        path.write_text(svg_chart(title, {"cells": series}))
        written[stem] = str(path)
    return written
