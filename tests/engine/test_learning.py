"""Learning, not just running: PPO and NLPO raise the reward; SFT lowers the loss (causal and seq2seq).

The reward is ``digit_fraction`` on the synthetic task: a random tiny model starts near 0.02 (about 3%
of GPT-2 tokens contain a digit) and a working policy-gradient learner drives it towards 1.
Seeds are fixed, so each run is deterministic; the margins leave room for numerical differences.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import engine
from engine.algorithms.sft import build_sft_batch


def _series(run_dir: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in rows if key in r]


RL = {
    "task": {"args": {"n_samples": 64}},
    "reward": {"id": "digit_fraction"},
    "rollout": {"max_new_tokens": 4, "batch_size": 32},
    "algorithm": {"learning_rate": 2e-2, "n_epochs": 4, "minibatch_size": 16},
    "kl": {"controller": "fixed", "init_coef": 0.0},
    "train": {
        "n_iters": 8,
        "prompts_per_iter": 32,
        "eval_every": 0,
        "log_samples": 0,
        "save_final_model": False,
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "nlpo"])
def test_rl_raises_mean_reward(small_config, tmp_path, algo):
    over = json.loads(json.dumps(RL))
    over["algorithm"]["id"] = algo
    over["algorithm"]["nlpo"] = {"top_mask": 0.9, "min_tokens_to_keep": 100, "mask_update_interval": 1}
    over["train"]["output_dir"] = str(tmp_path / algo)
    engine.train(small_config(**over))
    rewards = _series(tmp_path / algo, "train/reward_mean")
    assert len(rewards) == 8
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert first < 0.1
    assert last > first + 0.25, rewards


@pytest.mark.parametrize("model", ["builtin:tiny-gpt2", "builtin:tiny-t5"])
def test_sft_lowers_loss(small_config, tmp_path, model):
    cfg = small_config(
        model={"name_or_path": model},
        algorithm={"id": "sft"},
        supervised={"enabled": True, "learning_rate": 3e-3, "batch_size": 8, "max_steps": 12, "epochs": 10},
        train={"output_dir": str(tmp_path / "sft"), "n_iters": 0},
    )
    summary = engine.train(cfg)
    losses = _series(tmp_path / "sft", "sft/loss")
    assert len(losses) == 12 and summary["sft_steps"] == 12
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    assert Path(summary["model_dir"], "config.json").exists()


def test_sft_batch_excludes_prompt_tokens_for_causal(make_policy):
    _, tok = make_policy("causal")
    batch = build_sft_batch(
        tok, [("The film", "1 2 3"), ("A much longer prompt here", "4")], False, 32, 16, "cpu"
    )
    prompt_len = len(tok("The film")["input_ids"])
    target = tok("1 2 3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    labels = batch["labels"][0]
    assert torch.all(labels[:prompt_len] == -100)
    assert labels[prompt_len : prompt_len + len(target)].tolist() == target
    assert torch.all(labels[prompt_len + len(target) :] == -100)
    seq = build_sft_batch(tok, [("The film", "1 2 3")], True, 32, 16, "cpu")
    assert seq["labels"][0].tolist() == target  # seq2seq: labels are the reference only
