"""PPO building blocks against values computed by hand (numbers in the comments)."""

import math

import pytest
import torch

from engine.algorithms.ppo import (
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
    gae,
    kl_shaped_rewards,
    normalize_minibatch,
    whiten,
)
from engine.kl import (
    AdaptiveKLController,
    FixedKLController,
    ZieglerKLController,
    build_kl_controller,
    kl_estimate,
)
from engine.registry import UnknownComponentError, kl_controllers


def test_gae_full_episode_and_truncated_episode():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 1.0, 5.0]])  # 5.0 is garbage after the episode ended
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # row 0: d2 = 1-0.7 = 0.3; d1 = 0.9*0.7-0.6 = 0.03 -> A1 = 0.03+0.72*0.3 = 0.246;
    #        d0 = 0.9*0.6-0.5 = 0.04 -> A0 = 0.04+0.72*0.246 = 0.21712
    # row 1: terminal after t=1: A1 = 2-1 = 1; A0 = (0.9*1-1) + 0.72*1 = 0.62; A2 masked = 0
    expected = torch.tensor([[0.21712, 0.246, 0.3], [0.62, 1.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.71712, 0.846, 1.0], [1.62, 2.0, 0.0]]), atol=1e-6)


def test_gae_lambda_one_gamma_one_is_monte_carlo_return_minus_value():
    rewards = torch.tensor([[1.0, -1.0, 3.0]])
    values = torch.tensor([[0.2, 0.4, 0.1]])
    mask = torch.ones(1, 3)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(ret, torch.tensor([[3.0, 2.0, 3.0]]))
    assert torch.allclose(adv, torch.tensor([[2.8, 1.6, 2.9]]))


def test_whiten_uses_only_masked_entries():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = whiten(x, mask)
    s = math.sqrt(2.0 / 3.0)  # population std of 1, 2, 3
    assert torch.allclose(out, torch.tensor([[-1 / s, 0.0, 1 / s, 0.0]]), atol=1e-5)
    assert torch.allclose(
        whiten(x, mask, shift_mean=False)[0, :3], torch.tensor([-1 / s, 0.0, 1 / s]) + 2.0, atol=1e-5
    )


def test_clipped_policy_loss_positive_and_negative_advantages():
    logp = torch.log(torch.tensor([[1.5, 0.5]]))
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    loss, stats = clipped_policy_loss(logp, old, torch.ones(1, 2), mask, clip=0.2)
    # max(-1.5, -1.2) = -1.2 ; max(-0.5, -0.8) = -0.5 ; mean = -0.85
    assert loss.item() == pytest.approx(-0.85)
    assert stats["clipfrac"].item() == pytest.approx(1.0)
    k3 = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert stats["approx_kl"].item() == pytest.approx(k3, rel=1e-5)
    loss_neg, _ = clipped_policy_loss(logp, old, -torch.ones(1, 2), mask, clip=0.2)
    # max(1.5, 1.2) = 1.5 ; max(0.5, 0.8) = 0.8 ; mean = 1.15
    assert loss_neg.item() == pytest.approx(1.15)


def test_clipped_policy_loss_ignores_masked_tokens_and_has_unit_ratio_gradient():
    logp = torch.tensor([[0.0, 5.0]], requires_grad=True)
    loss, stats = clipped_policy_loss(
        logp, torch.zeros(1, 2), torch.tensor([[2.0, 100.0]]), torch.tensor([[1.0, 0.0]]), 0.2
    )
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(-2.0)  # d(-A*ratio)/dlogp at ratio 1
    assert logp.grad[0, 1].item() == 0.0


def test_value_loss_clipping():
    values = torch.tensor([[1.0, 3.0]])
    old = torch.tensor([[0.5, 2.0]])
    returns = torch.tensor([[2.0, 2.0]])
    mask = torch.ones(1, 2)
    loss, frac = clipped_value_loss(values, old, returns, mask, clip=0.2)
    # unclipped errors 1, 1; clipped values 0.7, 2.2 -> errors 1.69, 0.04; max -> 1.69, 1 -> mean = 1.345
    # (no factor 1/2: SB3's F.mse_loss, which RL4LMs's PPO uses)
    assert loss.item() == pytest.approx(1.345)
    assert frac.item() == pytest.approx(0.5)
    loss_nc, _ = clipped_value_loss(values, old, returns, mask, clip=None)
    assert loss_nc.item() == pytest.approx(1.0)


def test_minibatch_advantage_normalisation_is_sb3s():
    """(A - mean) / (sample std + 1e-8) over the valid tokens of the minibatch, padding at 0."""
    adv = torch.tensor([[1.0, 2.0, 99.0], [3.0, 6.0, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    out = normalize_minibatch(adv, mask)
    # valid 1, 2, 3, 6: mean 3, deviations -2 -1 0 3, sample variance 14/3
    std = (14 / 3) ** 0.5
    expected = torch.tensor([[-2 / std, -1 / std, 0.0], [0.0, 3 / std, 0.0]])
    assert torch.allclose(out, expected, atol=1e-6)
    # one valid token: centred, not divided by a zero spread
    single = normalize_minibatch(torch.tensor([[5.0, 1.0]]), torch.tensor([[1.0, 0.0]]))
    assert single.tolist() == [[0.0, 0.0]]


def test_kl_shaped_rewards_put_task_reward_on_last_valid_token():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-2.0, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards, kl = kl_shaped_rewards(torch.tensor([2.0, 1.0]), logp, ref, mask, beta=0.5)
    assert torch.allclose(kl, torch.tensor([[0.5, 0.0, -1.0], [1.0, 0.0, 0.0]]))
    assert torch.allclose(rewards, torch.tensor([[-0.25, 0.0, 2.5], [-0.5, 1.0, 0.0]]))


def test_explained_variance():
    target = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3)
    assert explained_variance(target, target, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(target, 2.0), target, mask) == pytest.approx(0.0)


def test_adaptive_kl_controller_is_rl4lms_rule_by_hand():
    """RL4LMs's KLController.step: beta *= 1 + 0.1 * clip((KL - target) / target, -0.2, 0.2), once per
    rollout, on the per-token mean KL; the number of episodes plays no part."""
    ctl = AdaptiveKLController(init_coef=0.1, target=0.1)
    assert ctl.update(0.3, n_steps=10) == pytest.approx(0.1 * 1.02)  # (0.3-0.1)/0.1 = 2 -> clipped to 0.2
    assert ctl.update(0.3, n_steps=10_000) == pytest.approx(0.1 * 1.02**2)  # rises again, same factor
    ctl = AdaptiveKLController(init_coef=0.1, target=0.1)
    assert ctl.update(0.0, n_steps=10) == pytest.approx(0.1 * 0.98)  # (0-0.1)/0.1 = -1 -> clipped to -0.2
    ctl = AdaptiveKLController(init_coef=0.1, target=0.1)
    assert ctl.update(0.11, n_steps=1) == pytest.approx(0.1 * (1 + 0.1 * 0.1))  # within the clip
    ctl = AdaptiveKLController(init_coef=0.1, target=0.1)
    assert ctl.update(0.095, n_steps=1) == pytest.approx(0.1 * (1 - 0.1 * 0.05))
    assert AdaptiveKLController.unit == "token"
    state = ctl.state_dict()
    other = AdaptiveKLController(init_coef=5.0, target=3.0)
    other.load_state_dict(state)
    assert (other.value, other.target) == (ctl.value, 0.1)
    assert other.update(0.2, 1) == pytest.approx(ctl.update(0.2, 1))
    with pytest.raises(ValueError, match="kl.target"):
        AdaptiveKLController(target=None)


def test_ziegler_kl_controller_updates_by_hand():
    """Ziegler et al.: per-episode KL sum, moving in proportion to n_episodes / horizon."""
    ctl = ZieglerKLController(init_coef=0.1, target=1.0, horizon=100)
    assert ctl.update(2.0, n_steps=10) == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))  # error clipped to +0.2
    ctl = ZieglerKLController(init_coef=0.1, target=1.0, horizon=100)
    assert ctl.update(0.5, n_steps=10) == pytest.approx(0.1 * (1 - 0.2 * 10 / 100))  # clipped to -0.2
    ctl = ZieglerKLController(init_coef=0.1, target=1.0, horizon=100)
    assert ctl.update(1.1, n_steps=10) == pytest.approx(0.1 * (1 + 0.1 * 10 / 100))
    assert ZieglerKLController.unit == "episode"
    state = ctl.state_dict()
    other = ZieglerKLController(init_coef=5.0, target=3.0, horizon=7)
    other.load_state_dict(state)
    assert (other.value, other.target, other.horizon) == (ctl.value, 1.0, 100)
    assert other.update(1.1, 10) == pytest.approx(ctl.update(1.1, 10))


def test_kl_estimators_by_hand():
    lp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    assert torch.allclose(kl_estimate(lp, ref, "k1"), torch.tensor([0.5, -1.0, 0.0]))
    # k3 = (r - 1) - log r, r = exp(ref - lp): r = e^-0.5, e^1, 1
    r = torch.exp(ref - lp)
    assert torch.allclose(kl_estimate(lp, ref, "k3"), (r - 1) - torch.log(r))
    assert float(kl_estimate(lp, ref, "k3")[1]) == pytest.approx(math.e - 2.0, rel=1e-5)
    with pytest.raises(ValueError, match="full"):
        kl_estimate(lp, ref, "full")


def test_fixed_kl_controller_and_registry():
    ctl = FixedKLController(init_coef=0.3)
    assert ctl.update(100.0, 64) == 0.3
    assert set(kl_controllers.ids()) >= {"fixed", "adaptive", "ziegler"}
    with pytest.raises(UnknownComponentError, match="adaptive"):
        kl_controllers.get("nope")

    class Cfg:
        controller, init_coef, target, horizon = "adaptive", 0.2, 0.5, 1000

    assert isinstance(build_kl_controller(Cfg()), AdaptiveKLController)
    Cfg.controller = "ziegler"
    assert isinstance(build_kl_controller(Cfg()), ZieglerKLController)


def test_approx_kl_includes_the_minibatch_that_stops_the_update(make_policy):
    """SB3 (and RL4LMs) record approx_kl before the early-stop check: the minibatch whose KL triggers
    the stop is in the reported statistic, though its gradient is never applied."""
    from engine.algorithms.ppo import PPO
    from engine.config import AlgorithmConfig
    from engine.data.base import Sample
    from engine.models.policy import frozen_copy
    from engine.rollout import SamplingSpec, collect

    policy, tok = make_policy("causal")
    samples = [Sample(id=str(i), prompt=p, references=[]) for i, p in enumerate(["One", "Two three", "4 5"])]
    batch = collect(
        policy,
        frozen_copy(policy.lm),
        tok,
        samples,
        SamplingSpec(max_new_tokens=5, eos_id=None),
        32,
        8,
        torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
    )
    with torch.no_grad():  # the policy has moved since the rollout: the first minibatch's KL is large
        g = torch.Generator().manual_seed(1)
        for p in policy.lm.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    algo = PPO(AlgorithmConfig(minibatch_size=3, n_epochs=2, target_kl=1e-4))
    zeros = torch.zeros_like(batch.logprobs)
    _, direct = algo.minibatch_loss(policy, batch, torch.arange(3), zeros, zeros, 1.0, None)
    assert float(direct["policy/approx_kl"]) > 1.5e-4
    before = [p.detach().clone() for p in policy.parameters()]
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    out = algo.update(policy, opt, batch, advantages=zeros, returns=zeros, generator=torch.Generator())
    assert out["policy/early_stopped"] == 1.0 and out["policy/n_updates"] == 0.0
    assert out["policy/approx_kl"] == pytest.approx(float(direct["policy/approx_kl"]), rel=1e-4)
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))  # nothing applied


def test_clipped_policy_loss_ignores_non_finite_log_probs_at_padded_positions():
    """A padded position whose stored log-prob is -inf (its token outside a top-k support) must not turn
    the loss or the gradient into NaN: found with TRPO/A2C in issue #8, same arithmetic here."""
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.9, float("-inf")]])
    adv = torch.tensor([[1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = clipped_policy_loss(logprobs, old, adv, mask, clip=0.2)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[0, 2] == 0.0
    # the same as the two unpadded positions alone
    ref, _ = clipped_policy_loss(logprobs[:, :2].detach(), old[:, :2], adv[:, :2], mask[:, :2], clip=0.2)
    assert loss.item() == pytest.approx(ref.item())
    assert all(torch.isfinite(v) for v in stats.values())
