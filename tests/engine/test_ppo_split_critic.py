"""Issue #30: with a separate critic each PPO minibatch backpropagates the policy's loss before the
critic's forward (``PPO.split_minibatch``), so the policy's activations are freed before the critic's
exist. The two losses share no parameter: every gradient, parameter and statistic must be bitwise those
of the joint loss's one backward. Real updates of the builtin tiny GPT-2 (fp32, CPU) on a real rollout.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from engine.algorithms.base import UpdateInputs
from engine.algorithms.ppo import PPO
from engine.config import AlgorithmConfig
from engine.trainer import _add_drift_sums
from tests.engine.ppo_setup import flat_params, random_value_head, rollout, run_update


class JointPPO(PPO):
    """PPO as before the split: one loss over policy and critic, one backward."""

    def backprops_policy_first(self, policy: Any) -> bool:
        return False


def test_split_backward_gives_the_joint_loss_gradients(tiny_dirs):
    """One minibatch (of a step of two): every gradient and statistic of ``split_minibatch`` is bitwise
    those of ``minibatch_loss``'s joint backward, and the policy's backward has run (every policy
    gradient exists) when the critic's forward starts."""
    policy, batch, adv, ret = rollout(tiny_dirs, "separate")
    random_value_head(policy)
    algo = PPO(AlgorithmConfig(ent_coef=0.01))
    assert algo.backprops_policy_first(policy)
    joint, split = copy.deepcopy(policy), copy.deepcopy(policy)
    idx = torch.tensor([0, 2, 5, 7])
    loss, s_joint = algo.minibatch_loss(joint, batch, idx, adv, ret, 1.0, None)
    (loss / 2).backward()

    seen = []
    lm_params = [p for p in split.lm.parameters() if p.requires_grad]
    split.critic.register_forward_pre_hook(lambda *_: seen.append(all(p.grad is not None for p in lm_params)))
    inputs = UpdateInputs(advantages=adv, returns=ret)
    s_split, stop = algo.split_minibatch(split, batch, idx, adv, inputs, 2)
    assert not stop and seen == [True]
    assert split.critic.get_input_embeddings().weight.grad.abs().sum() > 0
    for (name, a), b in zip(joint.named_parameters(), split.parameters(), strict=True):
        assert a.grad is not None and torch.equal(a.grad, b.grad), name
    assert {k: float(v) for k, v in s_split.items()} == {k: float(v) for k, v in s_joint.items()}


@pytest.mark.parametrize("kw", [{}, {"grad_accumulation": 2, "ent_coef": 0.01}, {"target_kl": 1e-4}])
def test_ppo_update_with_a_separate_critic_equals_the_joint_order(tiny_dirs, kw):
    """Whole updates (8 optimizer steps; with accumulation; with an approx-KL stop mid-way): the split
    order leaves bitwise the parameters and statistics of the joint loss."""
    policy, batch, adv, ret = rollout(tiny_dirs, "separate")
    joint, split = copy.deepcopy(policy), copy.deepcopy(policy)
    s_joint = run_update(joint, batch, adv, ret, JointPPO, **kw)
    s_split = run_update(split, batch, adv, ret, PPO, **kw)
    assert s_split == s_joint
    if "target_kl" in kw:
        assert s_split["policy/early_stopped"] == 1.0 and s_split["policy/n_updates"] >= 1
    assert not torch.equal(flat_params(split), flat_params(policy))
    assert torch.equal(flat_params(split), flat_params(joint))


def test_param_drift_sums_in_blocks_equal_the_whole_tensor_sums():
    """``policy/param_drift``'s fp64 sums, taken a block at a time (no whole-tensor fp64 copies after
    the update), equal the whole-tensor sums up to fp64 rounding, with a block that splits the tensor
    unevenly."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(37, 29, generator=g), torch.randn(37, 29, generator=g)
    sums = torch.zeros(2, dtype=torch.float64)
    _add_drift_sums(sums, a, b, block=100)
    whole = [torch.sum((a.double() - b.double()) ** 2), torch.sum(b.double() ** 2)]
    assert sums.tolist() == pytest.approx([float(w) for w in whole], rel=1e-14)
