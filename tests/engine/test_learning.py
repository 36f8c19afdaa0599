"""Learning, not just running: PPO and NLPO raise the reward and beat a negative control; SFT lowers the loss.

The reward is ``digit_fraction`` on the synthetic task: a random tiny model starts near 0.02 (about 3%
of GPT-2 tokens contain a digit) and a working policy-gradient learner drives it towards 1. The
negative control is the same run with the rewards shuffled across the batch (same distribution and
update sizes, no relation to the generation): it must not rise, and the real run must clear it by a
wide margin. NLPO runs with a mask that really restricts the vocabulary (``top_mask: 0.1``: 7.5 % of the
vocabulary at every step, logged as ``rollout/support_frac`` and asserted).

Runs are fp32 on CPU (bf16 autocast on CPU is both slower and less reproducible). The comment above
``RL`` records what the settings gave over several seeds while the thresholds were chosen.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

import engine
from engine.algorithms.sft import build_sft_batch
from engine.registry import rewards
from engine.rewards.synthetic import digit_fraction

CONTROL_REWARD = "test_shuffled_digit_fraction"


class ShuffledDigitFraction:
    """digit_fraction of the batch, handed out in a random order: a reward with no signal."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def __call__(self, prompts: list[str], generations: list[str], references: Any, meta: Any) -> list[float]:
        scores = [digit_fraction(g) for g in generations]
        self.rng.shuffle(scores)
        return scores


if CONTROL_REWARD not in rewards.ids():
    rewards.add(CONTROL_REWARD, ShuffledDigitFraction, "test only: digit_fraction shuffled across the batch")


def _series(run_dir: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in rows if key in r]


N_ITERS = 10
RL = {
    "model": {"mixed_precision": "no"},
    "task": {"args": {"n_samples": 64}},
    "reward": {"id": "digit_fraction"},
    "rollout": {"max_new_tokens": 4, "batch_size": 32},
    "algorithm": {"learning_rate": 5e-2, "n_epochs": 4, "minibatch_size": 16},
    "kl": {"controller": "fixed", "init_coef": 0.0},
    "train": {
        "n_iters": N_ITERS,
        "prompts_per_iter": 32,
        "eval_every": 0,
        "log_samples": 0,
        "save_final_model": False,
    },
}
# NLPO: PPO's settings with a mask that really restricts the action space: the top 10 % of the masking
# policy's mass (the random tiny model is nearly uniform: 7.5 % of the vocabulary, so 92.5 % of the tokens
# are cut at every step), never fewer than RL4LMs's 100 tokens, refreshed every 20 iterations as RL4LMs
# does, so never within a run here (why a frequent refresh fails: below).
NLPO_MASK = {"top_mask": 0.1, "min_tokens_to_keep": 100, "mask_update_interval": 20}

# Measured while choosing the thresholds (fp32 CPU, torch 2.13, one thread, these settings; "first" = mean of
# the first two iterations, "last" = mean of the last three; the tests run seed 0):
#   PPO  digit_fraction  seeds 0,1,2,3: first 0.025/0.022/0.028/0.055, last 0.55/0.95/1.00/0.99
#                        (seed 0 with two threads, as pytest runs it: last 0.89)
#   PPO  shuffled        seeds 0,1,2:   first 0.025/0.022/0.026,       last 0.028/0.000/0.000
#   NLPO digit_fraction  seeds 0-4: first 0.012/0.022/0.024/0.032/0.030, last 0.92/0.65/0.82/0.84/0.64
#   NLPO shuffled        seeds 0-4: first 0.021/0.020/0.027/0.024/0.010, last 0.014/0.017/0.002/0.003/0.009
#   NLPO action space: 7.5 % of the vocabulary at every rollout (NLPO_MASK; one thread, 37-47 s of CPU a run).
# Re-measured on 2026-12-01 after the sampler changed (inverse transform with the batch generator's
# uniforms instead of torch.multinomial, so every seeded run samples other tokens; docs/engine.md):
#   PPO  digit_fraction  seeds 0-3: first 0.031/0.028/0.035/0.038, last 1.00/1.00/0.96/0.98
#   PPO  shuffled        seeds 0,1: first 0.017/0.023,             last 0.019/0.019
#   NLPO digit_fraction  seeds 0-7: first 0.029/0.020/0.011/0.030/0.019/0.034/0.026/0.022,
#                                   last  0.95/1.00/0.00/0.68/0.52/0.83/0.97/0.75
#                        (seed 2 is the absorbing state described below: the fixed mask offered too few
#                        digits at the start)
#   NLPO shuffled        seeds 0,1: first 0.019/0.015,             last 0.012/0.023
# Earlier settings (lr 2e-2, 8 iterations, bf16) left PPO seed 2 at 0.02 after 12 iterations: the take-off
# iteration varies a lot between seeds.


def _rl_run(
    small_config, tmp_path: Path, algo: str, reward_id: str, seed: int = 0, n_iters: int = N_ITERS
) -> tuple[list[float], list[float]]:
    over = json.loads(json.dumps(RL))
    over["algorithm"]["id"] = algo
    over["algorithm"]["nlpo"] = NLPO_MASK
    over["reward"] = {"id": reward_id}
    out = tmp_path / f"{algo}-{reward_id}-{seed}"
    over["train"].update(output_dir=str(out), seed=seed, n_iters=n_iters)
    engine.train(small_config(**over))
    return _series(out, "train/reward_mean"), _series(out, "rollout/support_frac")


def _ends(series: list[float]) -> tuple[float, float]:
    """Mean of the first two and of the last three iterations (NLPO's late rewards oscillate)."""
    return sum(series[:2]) / 2, sum(series[-3:]) / 3


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two 10-iteration runs: ~2 min on a quiet 2-core CPU, far more on a shared one
# Why NLPO's first restrictive setting (top_mask 0.1, min_tokens_to_keep 1, refresh every iteration)
# collapsed: not a bug in the mask or its renormalisation but an absorbing state. At lr 5e-2 one iteration
# moves the policy by an approx. KL of 1-4 nats, so it peaks on the tokens of a few lucky episodes, digits
# or not; the refresh makes that policy the masker, whose top 10 % is one token (support 2 = it + EOS,
# logged 4.0e-5 of the vocabulary). If it is not a digit, every episode scores 0, the whitened advantages
# are all 0, PPO takes no step (approx. KL 2e-9) and the mask never offers a digit again (seed 0: ...
# 0.61, 0.00). A floor does not save a mask refreshed from such a policy (fp32, one thread, seeds 0-4,
# "last" = mean of the last three iterations): min_tokens_to_keep 20, refresh every 2 (16 prompts x 4
# tokens, 8 its.): seeds 1, 2 at 0.00 from iteration 3; RL4LMs's 100, refresh every 2 (32 prompts x 2
# tokens): last 0.61/0.01/0.65/0.59/0.00. Not refreshed, 32 x 2 tokens, 8 its.: 0.04/0.84/0.58/1.00/0.59
# (seed 0 had not taken off). NLPO_MASK with PPO's settings (10 its.): see the measurements above.
@pytest.mark.parametrize("algo", ["ppo"])
def test_rl_raises_mean_reward_and_beats_a_shuffled_control(small_config, tmp_path, algo):
    rewards_pos, _ = _rl_run(small_config, tmp_path, algo, "digit_fraction")
    rewards_ctl, _ = _rl_run(small_config, tmp_path, algo, CONTROL_REWARD)
    assert len(rewards_pos) == len(rewards_ctl) == N_ITERS
    first_pos, last_pos = _ends(rewards_pos)
    first_ctl, last_ctl = _ends(rewards_ctl)
    assert first_pos < 0.1 and first_ctl < 0.1
    # the control has the same reward distribution but no signal: it does not rise
    assert last_ctl < first_ctl + 0.1, rewards_ctl
    # the real reward is learned, far beyond the control
    assert last_pos > first_pos + 0.3, rewards_pos
    assert last_pos > last_ctl + 0.3, (rewards_pos, rewards_ctl)


NLPO_SEEDS = (0, 1, 2, 3, 4)
CONTROL_SEEDS = (0, 1, 2)
NLPO_ITERS = 14
# NLPO over five seeds, 14 iterations, after PPO/NLPO moved to per-minibatch advantage normalisation (SB3,
# 2026-12-01; fp32, one thread; digit share per iteration; peak = highest iteration, last = mean of the
# last three):
#   seed 0: 0.03 ... 0.12, 0.38, 0.66, 0.83, 1.00, 0.56, 1.00, 0.03, 0.00      peak 1.00, last 0.34
#   seed 1: 0.01 for 9 iterations, then 0.13, 0.20, 0.18, 0.21, 0.26             peak 0.26, last 0.23
#   seed 2: 0.005 ... 0.12, 0.54, 0.34, 0.75, 1.00, 0.47, 0.62                   peak 1.00, last 0.70
#   seed 3: 0.03 ... 0.07, 0.51, 0.74, 0.79, 0.82, 0.80, 0.82, 0.82, 0.82        peak 0.82, last 0.82
#   seed 4: 0.04, 0.02, 0.14, 0.11, 0.34, 0.54, 0.64, 0.68, 0.76, 0.71, 0.80 x 4  peak 0.80, last 0.80
#   shuffled control, seed 0: 0.03, 0.05, 0.03, 0.02, 0.02, then 0.00 from iteration 6   peak 0.05, last 0.00
# Medians: peak 0.82, last 0.70, first 0.02. Re-measured 2026-12-02 (Intel Xeon, fp32, one thread) after PPO's
# optimizer became fused AdamW (other rounding): peaks 1.00, 0.04, 0.75, 1.00, 0.57 (median 0.75), lasts 1.00,
# 0.00, 0.75, 0.04, 0.33 (median 0.33); control 0.03 ... 0.06, 0.14, 0.16, 0.02, 0.02, 0.03, 0.00 (one random
# excursion to 0.16, last 0.02). Why one seed is not enough, and why the last iterations alone
# are not the criterion:
# - The take-off iteration varies from 3 to 10 between seeds (seed 1 only starts at 10). With the earlier
#   once-per-rollout normalisation seed 2 of 0-7 never took off: the absorbing state described above.
# - A policy that has learned can fall off again (seed 0 at iterations 11-14): once every episode scores 1,
#   the advantages are the value head's errors only, and normalising them per minibatch scales that noise
#   to unit size, so the step at lr 5e-2 is as large as a learning step in a random direction; a step that
#   leaves the digits lands in the all-zero absorbing state. This is the learning rate and the
#   normalisation at this toy scale, not a wrong sign (test_penalty_and_sign.py pins the sign).
# So the test asserts the median over five seeds of the peak (it learned at some point; the controls never
# do) and a median level over the second half of training well above the controls'.
# Measured 2026-12-03 (AMD EPYC, fp32, one thread), seeds 0-9 and controls 0-4, with the policy's rollout
# scores from a teacher-forced pass (the default until then) and read off the decode steps (the default since;
# rounding-level different):
#   teacher-forced: second-half means 0.62 0.30 0.60 0.44 0.91 0.18 0.91 0.81 0.91 0.60 (median 0.61), lasts 0.75
#            0.28 0.64 0.15 1.00 0.37 0.96 0.90 0.99 0.84; controls' second halves 0.02 0.05 0.01 0.07 0.11
#   decode-step scores: second-half means 0.34 0.32 0.52 0.23 0.41 0.90 0.92 0.71 0.68 0.72 (median 0.60),
#            lasts 0.00 0.00 0.67 0.01 0.68 1.00 1.00 0.73 0.92 0.99 (seeds 0, 1, 3 fell back after peaks of
#            0.86, 0.97, 0.56); controls' second halves 0.00 0.00 0.00 0.01 0.08
# Over every choice of 5 of the 10 seeds and 3 of the 5 controls (2,520 each), the median last-three level
# missed "controls + 0.15" in 8 % of the choices with decode-step scores (seeds 0-4 are one of them), the
# second-half criterion in none: its margin over "controls + 0.15" was at least 0.18 (0.22 teacher-forced).


@pytest.mark.slow
@pytest.mark.timeout(3600)  # eight 14-iteration NLPO runs: ~6-8 min on a quiet 2-core CPU
def test_nlpo_raises_the_median_reward_over_seeds_and_beats_a_shuffled_control(small_config, tmp_path):
    runs = [_rl_run(small_config, tmp_path, "nlpo", "digit_fraction", s, NLPO_ITERS) for s in NLPO_SEEDS]
    controls = [
        _rl_run(small_config, tmp_path, "nlpo", CONTROL_REWARD, s, NLPO_ITERS)[0] for s in CONTROL_SEEDS
    ]
    assert all(len(r) == NLPO_ITERS for r, _ in runs) and all(len(c) == NLPO_ITERS for c in controls)
    med = statistics.median
    firsts = [_ends(r)[0] for r, _ in runs]
    peaks = [max(r) for r, _ in runs]
    first_ctl = med(_ends(c)[0] for c in controls)
    last_ctl = med(_ends(c)[1] for c in controls)
    peak_ctl = med(max(c) for c in controls)
    assert med(firsts) < 0.1 and first_ctl < 0.1, (firsts, controls)
    # the controls have the same rewards without their relation to the text: they do not rise (their
    # last iterations stay near their first), and they never come near the learned peaks. A control is a
    # random walk, judged like the learners by its median over seeds (single walks touched 0.16-0.22)
    assert last_ctl < first_ctl + 0.1, controls
    # learned (median peak of seeds 0-4 measured: 0.97, and 0.75 with teacher-forced scores) ...
    assert med(peaks) > med(firsts) + 0.4, [r for r, _ in runs]
    assert med(peaks) > peak_ctl + 0.3, ([r for r, _ in runs], controls)
    # ... and far above the controls over the second half of training (the level a seed that fell back
    # after learning still shows; see the measurements above: the last three iterations alone are not a
    # stable criterion)
    assert med(_second_half(r) for r, _ in runs) > med(_second_half(c) for c in controls) + 0.15, (
        [r for r, _ in runs],
        controls,
    )
    for _, support in runs:  # the mask cut over 90 % of the vocabulary at every step of every rollout
        assert len(support) == NLPO_ITERS and 0.0 < min(support) and max(support) < 0.1, support


def _second_half(series: list[float]) -> float:
    half = series[len(series) // 2 :]
    return sum(half) / len(half)


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
