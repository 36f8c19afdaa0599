"""``PPO.update`` itself: approx-KL early stop, gradient accumulation, the entropy bonus, the fp16 scaler.

Every test starts from a real rollout of the builtin tiny GPT-2 (fp32, CPU) and runs the real update;
the only addition is a subclass that records what each minibatch saw. The pure loss functions are
checked by hand in test_ppo_math.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from engine.algorithms.ppo import PPO, masked_mean
from engine.config import AlgorithmConfig
from engine.models.policy import entropy_from_logprobs, processed_logprobs
from engine.rollout import RolloutBatch
from tests.engine.ppo_setup import flat_params, rollout


def mean_entropy(policy: Any, batch: RolloutBatch, temperature: float) -> float:
    with torch.no_grad():
        logits, _ = policy.forward_tokens(batch.model_inputs(), want_values=True)
        ent = entropy_from_logprobs(processed_logprobs(logits, temperature, None))
    return float(masked_mean(ent, batch.gen_mask))


class Recording(PPO):
    """PPO that records, for every minibatch it evaluates, the approx-KL it saw and the parameters
    at that moment (i.e. after all optimizer steps taken so far)."""

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.kls: list[float] = []
        self.snapshots: list[torch.Tensor] = []

    def minibatch_loss(self, policy, batch, idx, *args, **kwargs):
        self.snapshots.append(flat_params(policy))
        loss, stats = super().minibatch_loss(policy, batch, idx, *args, **kwargs)
        self.kls.append(float(stats["policy/approx_kl"]))
        return loss, stats


def run_update(policy, batch, adv, ret, algo_cls=PPO, optimizer=None, shuffle_seed=1, **kw) -> tuple:
    cfg = AlgorithmConfig(**{"n_epochs": 1, "minibatch_size": 8, "learning_rate": 1e-3, **kw})
    algo = algo_cls(cfg)
    opt = optimizer(policy) if optimizer else torch.optim.AdamW(policy.parameters(), lr=cfg.learning_rate)
    stats = algo.update(
        policy, opt, batch, advantages=adv, returns=ret, generator=torch.Generator().manual_seed(shuffle_seed)
    )
    return algo, stats


# ---------------------------------------------------------------------------------------------------
# approx-KL early stop


def test_target_kl_stops_before_the_minibatch_that_exceeds_it(tiny_dirs):
    """SB3/RL4LMs semantics: a minibatch whose approx-KL exceeds 1.5 × target_kl is not applied, and
    the update ends there. The threshold is placed between the KL of the j-th minibatch and the largest
    KL before it (measured in an identical run without target_kl), so the stop must happen exactly at j
    and the parameters must be those after j - 1 steps."""
    policy, batch, adv, ret = rollout(tiny_dirs)
    opts = {"n_epochs": 4, "minibatch_size": 2}

    probe_policy = copy.deepcopy(policy)
    probe, stats = run_update(probe_policy, batch, adv, ret, Recording, **opts)
    assert stats["policy/n_updates"] == 16 and stats["policy/early_stopped"] == 0.0
    # pick the minibatch (not the first: its KL is 0) with the clearest jump over everything before it
    jumps = [(probe.kls[j] / max(max(probe.kls[:j]), 1e-12), j) for j in range(2, len(probe.kls))]
    ratio, j = max(jumps)
    assert ratio > 2.0, probe.kls  # learning rate 1e-3 on 2-episode minibatches moves the policy a lot
    threshold = (max(probe.kls[:j]) * probe.kls[j]) ** 0.5  # strictly between the two
    target_kl = threshold / 1.5

    stopped_policy = copy.deepcopy(policy)
    algo, stats = run_update(stopped_policy, batch, adv, ret, Recording, target_kl=target_kl, **opts)
    assert len(algo.kls) == j + 1, (algo.kls, j)  # evaluated up to and including minibatch j
    assert algo.kls == pytest.approx(probe.kls[: j + 1], rel=1e-5, abs=1e-8)  # same trajectory until then
    assert stats["policy/early_stopped"] == 1.0 and stats["policy/n_updates"] == j
    # the stopping minibatch's gradient was discarded: parameters are the probe's after j steps
    assert torch.equal(flat_params(stopped_policy), probe.snapshots[j])
    assert not torch.equal(probe.snapshots[j], probe.snapshots[j - 1])  # and steps before it were taken

    # a target KL above every minibatch's never stops
    calm = copy.deepcopy(policy)
    _, stats = run_update(calm, batch, adv, ret, target_kl=max(probe.kls) * 10, **opts)
    assert stats["policy/early_stopped"] == 0.0 and stats["policy/n_updates"] == 16


def test_target_kl_inside_an_accumulation_group_discards_the_whole_group(tiny_dirs):
    """With grad_accumulation = 2, a stop on the second minibatch of a group must not apply the first
    minibatch's (already accumulated) gradient either."""
    opts = {"n_epochs": 4, "minibatch_size": 2, "grad_accumulation": 2}
    # The scenario needs a second minibatch of a group (odd index) whose KL clearly exceeds everything
    # before it; whether a rollout has one depends on its tokens, so take the first seed that does.
    seen = []
    for seed in range(6):
        policy, batch, adv, ret = rollout(tiny_dirs, seed=seed)
        probe, stats = run_update(copy.deepcopy(policy), batch, adv, ret, Recording, **opts)
        assert stats["policy/n_updates"] == 8
        jumps = [(probe.kls[j] / max(max(probe.kls[:j]), 1e-12), j) for j in range(3, len(probe.kls), 2)]
        ratio, j = max(jumps)
        seen.append(probe.kls)
        if ratio > 1.2:
            break
    else:
        pytest.fail(f"no rollout of seeds 0-5 has a clear KL jump on a group's second minibatch: {seen}")
    target_kl = (max(probe.kls[:j]) * probe.kls[j]) ** 0.5 / 1.5

    stopped = copy.deepcopy(policy)
    algo, stats = run_update(stopped, batch, adv, ret, Recording, target_kl=target_kl, **opts)
    assert len(algo.kls) == j + 1 and stats["policy/early_stopped"] == 1.0
    assert stats["policy/n_updates"] == (j - 1) // 2  # only the complete groups before j
    assert torch.equal(flat_params(stopped), probe.snapshots[j - 1])  # the group's first half not applied


# ---------------------------------------------------------------------------------------------------
# gradient accumulation


def sgd(policy: Any) -> torch.optim.Optimizer:
    # SGD, not Adam: Adam's first step is ~lr·sign(g), which would turn fp32 rounding noise in
    # near-zero gradient entries into full-size differences.
    return torch.optim.SGD(policy.parameters(), lr=1.0)


def test_gradient_accumulation_equals_one_larger_minibatch(tiny_dirs):
    """Two accumulated minibatches of 4 give the same step as one minibatch of 8 (equal episode lengths,
    so the mean of the two halves' token means is the mean over all tokens)."""
    policy, batch, adv, ret = rollout(tiny_dirs)
    start = flat_params(policy)

    one = copy.deepcopy(policy)
    _, s_one = run_update(one, batch, adv, ret, optimizer=sgd, minibatch_size=8, max_grad_norm=1e6)
    acc = copy.deepcopy(policy)
    _, s_acc = run_update(
        acc, batch, adv, ret, optimizer=sgd, minibatch_size=4, grad_accumulation=2, max_grad_norm=1e6
    )
    two_steps = copy.deepcopy(policy)
    _, s_two = run_update(two_steps, batch, adv, ret, optimizer=sgd, minibatch_size=4, max_grad_norm=1e6)

    assert s_one["policy/n_updates"] == s_acc["policy/n_updates"] == 1 and s_two["policy/n_updates"] == 2
    moved = (flat_params(one) - start).norm()
    assert moved > 1e-3  # the step is real, so the comparison below is not between two no-ops
    diff_acc = (flat_params(acc) - flat_params(one)).norm()
    diff_two = (flat_params(two_steps) - flat_params(one)).norm()
    assert diff_acc <= 1e-4 * moved, (float(diff_acc), float(moved))
    assert torch.allclose(flat_params(acc), flat_params(one), rtol=1e-4, atol=1e-6)
    # sensitivity: two separate steps of 4 are measurably different from one step of 8
    assert diff_two > 100 * diff_acc
    # the statistics are the per-minibatch means, weighted equally: same loss as the single minibatch
    assert s_acc["loss/total"] == pytest.approx(s_one["loss/total"], rel=1e-4, abs=1e-6)


def test_gradient_accumulation_with_clipping_clips_the_summed_gradient(tiny_dirs):
    """The clip applies to the accumulated gradient, as it would to the one large minibatch."""
    policy, batch, adv, ret = rollout(tiny_dirs)
    one = copy.deepcopy(policy)
    _, s_one = run_update(one, batch, adv, ret, optimizer=sgd, minibatch_size=8, max_grad_norm=0.05)
    acc = copy.deepcopy(policy)
    _, s_acc = run_update(
        acc, batch, adv, ret, optimizer=sgd, minibatch_size=4, grad_accumulation=2, max_grad_norm=0.05
    )
    assert s_one["policy/grad_norm"] > 0.05  # clipping is active
    assert s_acc["policy/grad_norm"] == pytest.approx(s_one["policy/grad_norm"], rel=1e-4)
    step = (flat_params(one) - flat_params(policy)).norm()
    assert float(step) == pytest.approx(0.05, rel=1e-3)  # SGD lr 1: the step is the clipped gradient
    assert torch.allclose(flat_params(acc), flat_params(one), rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# entropy bonus


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_positive_entropy_coefficient_raises_entropy(tiny_dirs, seed):
    """The loss subtracts ent_coef × entropy, so a positive coefficient must push entropy up.

    Sampling at temperature 0.05 makes the random tiny model's distribution peaked (entropy ≈ 2.6-2.9
    nats instead of the near-uniform 10.8), so there is room to rise. Measured over seeds 0-2 after two
    epochs: ent_coef 0 → 1.9-2.5, ent_coef 0.1 → 5.0-6.6 (gap 2.5-4.8 nats); the test asks for 1.
    """
    temperature = 0.05
    policy, batch, adv, ret = rollout(tiny_dirs, seed=seed, temperature=temperature)
    before = mean_entropy(policy, batch, temperature)
    after = {}
    for coef in (0.0, 0.1):
        p = copy.deepcopy(policy)
        cfg = AlgorithmConfig(n_epochs=2, minibatch_size=4, learning_rate=1e-3, ent_coef=coef)
        PPO(cfg).update(
            p, torch.optim.AdamW(p.parameters(), lr=1e-3), batch, advantages=adv, returns=ret,
            generator=torch.Generator().manual_seed(1), temperature=temperature,
        )  # fmt: skip
        after[coef] = mean_entropy(p, batch, temperature)
    assert after[0.1] > after[0.0] + 1.0, (before, after)
    assert after[0.1] > before + 1.0, (before, after)


# ---------------------------------------------------------------------------------------------------
# fp16 autocast with a gradient scaler


def test_fp16_grad_scaler_path_steps_and_updates_the_scale(tiny_dirs):
    """fp16 autocast + GradScaler on the CPU (torch supports both there): every successful step grows the
    scale (growth_interval 1), parameters move and stay finite, statistics are finite."""
    policy, batch, adv, ret = rollout(tiny_dirs)
    start = flat_params(policy)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    cfg = AlgorithmConfig(n_epochs=1, minibatch_size=4, learning_rate=1e-3)
    stats = PPO(cfg).update(
        policy, torch.optim.AdamW(policy.parameters(), lr=1e-3), batch, advantages=adv, returns=ret,
        generator=torch.Generator().manual_seed(1), autocast_dtype=torch.float16, scaler=scaler,
    )  # fmt: skip
    assert stats["policy/n_updates"] == 2
    for key in ("loss/total", "loss/policy", "loss/value", "policy/approx_kl", "policy/grad_norm"):
        assert torch.isfinite(torch.tensor(stats[key])), (key, stats[key])
    after = flat_params(policy)
    assert bool(torch.isfinite(after).all()) and (after - start).norm() > 1e-3
    assert scaler.get_scale() == 1024.0 * 2**2  # two good steps, each doubling the scale
    # the unscaled gradient norm is reported, not the scaled one (1024× larger)
    assert stats["policy/grad_norm"] < 100


def test_fp16_grad_scaler_skips_a_step_with_overflowing_gradients(tiny_dirs):
    """A scale so large that the fp16 backward overflows: the scaler must skip the optimizer step (the
    parameters stay exactly as they were) and halve the scale."""
    policy, batch, adv, ret = rollout(tiny_dirs)
    start = flat_params(policy)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100, growth_interval=1000)
    cfg = AlgorithmConfig(n_epochs=1, minibatch_size=8, learning_rate=1e-3)
    stats = PPO(cfg).update(
        policy, torch.optim.AdamW(policy.parameters(), lr=1e-3), batch, advantages=adv, returns=ret,
        generator=torch.Generator().manual_seed(1), autocast_dtype=torch.float16, scaler=scaler,
    )  # fmt: skip
    assert scaler.get_scale() == 2.0**99
    assert torch.equal(flat_params(policy), start)
    assert stats["policy/n_updates"] == 1  # the update loop ran; the scaler chose to skip the step
