"""Issue #30, memory: ``algorithm.clip_grad_per_model`` clips the policy's and the separate critic's
gradients each by its own norm and steps each model before the other's backward (OpenRLHF's and verl's
design), so only one model's gradients are alive. Real updates of the builtin tiny GPT-2 (fp32, CPU) on
a real rollout; the joint clip (RL4LMs / SB3, TRL) stays the default.
"""

from __future__ import annotations

import copy

import pytest
import torch

from engine.config import ConfigError, parse_config
from tests.engine.ppo_setup import flat_params, random_value_head, rollout
from tests.engine.ppo_setup import run_update as run


@pytest.mark.parametrize("kw", [{}, {"grad_accumulation": 2, "ent_coef": 0.01}, {"target_kl": 1e-4}])
def test_without_clipping_the_per_model_update_is_the_joint_one(tiny_dirs, kw):
    """When no norm reaches the clip the two orders apply the same gradients: the parameters after 8
    optimizer steps (with accumulation; with an approx-KL stop mid-way) are bitwise the joint update's,
    and so is every statistic but the norms (per model here, one over both there)."""
    policy, batch, adv, ret = rollout(tiny_dirs, "separate")
    random_value_head(policy)
    joint, per_model = copy.deepcopy(policy), copy.deepcopy(policy)
    s_joint = run(joint, batch, adv, ret, max_grad_norm=1e9, **kw)
    s_per = run(per_model, batch, adv, ret, max_grad_norm=1e9, clip_grad_per_model=True, **kw)
    assert "value/grad_norm" in s_per and "value/grad_norm" not in s_joint
    norms = ("policy/grad_norm", "value/grad_norm")
    assert {k: v for k, v in s_per.items() if k not in norms} == {
        k: v for k, v in s_joint.items() if k not in norms
    }
    if "target_kl" in kw:
        assert s_per["policy/early_stopped"] == 1.0 and s_per["policy/n_updates"] >= 1
    assert not torch.equal(flat_params(per_model), flat_params(policy))
    assert torch.equal(flat_params(per_model), flat_params(joint))


def test_the_two_norms_split_the_joint_norm(tiny_dirs):
    """One optimizer step over the whole batch: both orders see the same gradients, so the policy's and
    the critic's norms satisfy p² + c² = joint² (Pythagoras over disjoint parameters)."""
    policy, batch, adv, ret = rollout(tiny_dirs, "separate")
    random_value_head(policy)
    one_step = {"n_epochs": 1, "minibatch_size": len(batch), "max_grad_norm": 1e-3}
    s_joint = run(copy.deepcopy(policy), batch, adv, ret, **one_step)
    s_per = run(copy.deepcopy(policy), batch, adv, ret, clip_grad_per_model=True, **one_step)
    p, c = s_per["policy/grad_norm"], s_per["value/grad_norm"]
    assert p > 1e-3 and c > 1e-3  # both models were clipped
    assert (p**2 + c**2) ** 0.5 == pytest.approx(s_joint["policy/grad_norm"], rel=1e-5)


def test_the_policy_no_longer_depends_on_the_critics_gradient(tiny_dirs):
    """Clipped per model, the policy's trajectory is that of a joint update whose critic gets no gradient
    (vf_coef 0: then the joint norm is the policy's); clipped jointly, a critic gradient shrinks the
    policy's steps, so the policy differs."""
    policy, batch, adv, ret = rollout(tiny_dirs, "separate")
    random_value_head(policy)
    clip = {"max_grad_norm": 0.05}
    per_model, joint, no_critic = (copy.deepcopy(policy) for _ in range(3))
    run(per_model, batch, adv, ret, clip_grad_per_model=True, **clip)
    run(joint, batch, adv, ret, **clip)
    run(no_critic, batch, adv, ret, vf_coef=0.0, **clip)
    lm = lambda p: torch.cat([t.detach().reshape(-1) for t in p.lm.parameters()])  # noqa: E731
    moved = float((lm(no_critic) - lm(policy)).abs().max())
    # the same steps up to rounding (the norms are sums over other tensor lists), which Adam's division
    # by its second moment carries through 8 steps: seen ~2e-6 against ~8e-3 moved
    assert float((lm(per_model) - lm(no_critic)).abs().max()) < 1e-3 * moved
    # the random value head's gradient is ~1000x the policy's: the joint clip all but stops the policy
    assert float((lm(joint) - lm(no_critic)).abs().max()) > 0.5 * moved


def test_only_one_models_gradients_are_alive_at_a_time(tiny_dirs):
    """The memory the option is for: whenever a critic gradient is accumulated no policy gradient
    exists, and the other way round."""
    policy, batch, adv, ret = rollout(tiny_dirs, "separate")
    random_value_head(policy)
    lm_params = [p for p in policy.lm.parameters() if p.requires_grad]
    critic_params = [p for p in policy.critic.parameters() if p.requires_grad]
    seen: dict[str, list[bool]] = {"policy": [], "critic": []}
    lm_params[0].register_post_accumulate_grad_hook(
        lambda _p: seen["policy"].append(all(q.grad is None for q in critic_params))
    )
    critic_params[0].register_post_accumulate_grad_hook(
        lambda _p: seen["critic"].append(all(q.grad is None for q in lm_params))
    )
    run(policy, batch, adv, ret, clip_grad_per_model=True)
    assert len(seen["policy"]) == len(seen["critic"]) == 8  # 2 epochs x 4 minibatches
    assert all(seen["policy"]) and all(seen["critic"])


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({}, "needs model.value_head 'separate'"),
        ({"algorithm": {"id": "a2c", "clip_grad_per_model": True}}, "applies to 'ppo' and 'nlpo'"),
    ],
)
def test_the_option_is_refused_where_there_is_one_model_or_another_optimizer(over, needle):
    data = {"algorithm": {"id": "ppo", "clip_grad_per_model": True}, **over}
    if "model" not in over and data["algorithm"]["id"] != "ppo":
        data["model"] = {"value_head": "separate"}
    with pytest.raises(ConfigError, match="clip_grad_per_model") as err:
        parse_config(data)
    assert needle in str(err.value)
