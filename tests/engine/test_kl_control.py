"""The KL controller inside the trainer: it reads the penalty's KL in its own units, once per rollout.

A policy trained with a large learning rate drifts from its reference, so its per-token KL rises from 0
(first rollout: policy = reference) to well above a small target; RL4LMs's controller must then lower
beta once (KL below target) and raise it on every later iteration, each time by exactly RL4LMs's factor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import engine


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/kl_coef" in r]


def _run(small_config, tmp_path, kl: dict, name: str, n_iters: int = 4) -> list[dict]:
    # The exact estimator ("full") is never negative and has no sampling noise, so the direction of
    # the KL is unambiguous. Measured (fp32, seed 0): per-token KL 0 at the first rollout, 0.056 at the
    # fourth (bf16 runs drift further: 2-9): 56x the 0.001 target once the policy has moved.
    cfg = small_config(
        model={"mixed_precision": "no"},  # fp32 on CPU: exact and ~10x faster than bf16 autocast there
        task={"args": {"n_samples": 32}},
        rollout={"max_new_tokens": 4, "batch_size": 8},
        algorithm={"learning_rate": 5e-2, "n_epochs": 4, "minibatch_size": 4},
        kl={**kl, "estimator": "full"},
        train={
            "n_iters": n_iters,
            "prompts_per_iter": 8,
            "output_dir": str(tmp_path / name),
            "log_samples": 0,
        },
    )
    engine.train(cfg)
    return _rows(tmp_path / name)


def test_rl4lms_adaptive_controller_moves_beta_with_the_per_token_kl(small_config, tmp_path):
    target = 0.001
    rows = _run(small_config, tmp_path, {"controller": "adaptive", "init_coef": 0.05, "target": target}, "a")
    kl = [r["train/kl"] for r in rows]
    beta = [r["train/kl_coef"] for r in rows]
    assert beta[0] == pytest.approx(0.05)
    assert kl[0] == pytest.approx(0.0, abs=1e-5)  # first rollout: the policy is its reference
    assert kl[-1] > 5 * target and all(k >= 0 for k in kl)  # the policy drifts, the KL (per token) sees it
    for i in range(len(rows) - 1):  # RL4LMs's rule, exactly, on the logged per-token KL
        err = min(max((kl[i] - target) / target, -0.2), 0.2)
        assert beta[i + 1] == pytest.approx(beta[i] * (1 + 0.1 * err), rel=1e-6)
    assert beta[1] < beta[0]  # KL 0 < target: beta falls by 2 %
    for i in range(len(rows) - 1):  # and every later step moves the way the KL says
        assert (beta[i + 1] > beta[i]) == (kl[i] > target)
    assert beta[-1] > beta[1] > 0  # KL above target: beta rises again
    # the logged KL is the per-token mean of the per-episode sums' tokens
    for r in rows:
        assert r["train/kl_episode"] == pytest.approx(r["train/kl"] * r["train/episode_length"], rel=1e-4)


def test_ziegler_controller_reads_the_per_episode_kl_sum(small_config, tmp_path):
    target, horizon = 0.05, 64
    kl_cfg = {"controller": "ziegler", "init_coef": 0.05, "target": target, "horizon": horizon}
    rows = _run(small_config, tmp_path, kl_cfg, "z", n_iters=3)
    beta = [r["train/kl_coef"] for r in rows]
    for i in range(len(rows) - 1):
        err = min(max(rows[i]["train/kl_episode"] / target - 1.0, -0.2), 0.2)
        assert beta[i + 1] == pytest.approx(beta[i] * (1 + err * 8 / horizon), rel=1e-6)
    assert beta[-1] > beta[1]
