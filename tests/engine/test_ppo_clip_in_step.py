"""Issue #30: the gradient clip inside the fused AdamW step (``common.clip_inside_step``) gives the
parameters of ``clip_grad_norm_`` followed by the step, up to fp32 rounding (bitwise when nothing is
clipped). The steps are real PPO minibatch steps of the builtin tiny GPT-2 (fp32, CPU) on a real rollout.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from engine.algorithms.common import clip_and_step, folds_clip
from engine.algorithms.ppo import PPO
from engine.config import AlgorithmConfig
from tests.engine.ppo_setup import flat_params, fused_adamw, rollout

# ---------------------------------------------------------------------------------------------------
# the clip inside the fused step


def clipped_steps(policy: Any, batch: Any, adv: torch.Tensor, ret: torch.Tensor, fold: bool, max_norm: float):
    """Three optimizer steps on PPO minibatch losses; ``fold``: through ``clip_and_step`` (the clip in
    the fused step), else ``clip_grad_norm_`` and the step as before. Returns the norms seen."""
    algo = PPO(AlgorithmConfig(max_grad_norm=max_norm))
    opt = fused_adamw(policy)
    params = [p for p in policy.parameters() if p.requires_grad]
    norms = []
    for rows in ([0, 1, 2, 3], [4, 5, 6, 7], [1, 3, 5, 7]):
        opt.zero_grad(set_to_none=True)
        loss, _ = algo.minibatch_loss(policy, batch, torch.tensor(rows), adv, ret, 1.0, None)
        loss.backward()
        if fold:
            assert folds_clip(opt, params)
            norms.append(float(clip_and_step(params, opt, None, max_norm)))
        else:
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm)))
            opt.step()
        assert getattr(opt, "grad_scale", None) is None  # the slot is left as found
    return norms


@pytest.mark.parametrize("value_head", ["shared", "separate"])
def test_clip_inside_the_fused_step_equals_clip_then_step(tiny_dirs, value_head):
    """SB3/RL4LMs's clip (coefficient min(1, max_norm / (norm + 1e-6))) folded into the fused AdamW
    step as its ``grad_scale``: after three clipped steps the parameters equal those of
    ``clip_grad_norm_`` + step within fp32 rounding, and the reported norms are the same."""
    policy, batch, adv, ret = rollout(tiny_dirs, value_head)
    old, new = copy.deepcopy(policy), copy.deepcopy(policy)
    n_old = clipped_steps(old, batch, adv, ret, fold=False, max_norm=0.05)
    n_new = clipped_steps(new, batch, adv, ret, fold=True, max_norm=0.05)
    assert min(n_old) > 0.05  # every step was clipped, so the folded coefficient was used
    assert n_new == pytest.approx(n_old, rel=1e-5)
    moved = (flat_params(old) - flat_params(policy)).abs().max()
    assert moved > 1e-3  # three real steps
    assert torch.allclose(flat_params(new), flat_params(old), rtol=1e-5, atol=1e-6)


def test_clip_inside_the_fused_step_is_bitwise_when_nothing_is_clipped(tiny_dirs):
    """Below the clip norm the coefficient is 1 and the kernel divides by exactly 1: bitwise the same."""
    policy, batch, adv, ret = rollout(tiny_dirs, "separate")
    old, new = copy.deepcopy(policy), copy.deepcopy(policy)
    n_old = clipped_steps(old, batch, adv, ret, fold=False, max_norm=1e6)
    clipped_steps(new, batch, adv, ret, fold=True, max_norm=1e6)
    assert max(n_old) < 1e6
    assert torch.equal(flat_params(new), flat_params(old))


def test_only_a_fused_adam_with_fp32_gradients_takes_the_folded_clip(tiny_dirs):
    """The trainer's default (foreach) AdamW, other optimizers and an fp16 scaler's step keep
    ``clip_grad_norm_``; so do fp16 gradients (the kernel would round the divisor to fp16)."""
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    assert folds_clip(torch.optim.AdamW([p], fused=True), [p])
    assert folds_clip(torch.optim.Adam([p], fused=True), [p])
    assert not folds_clip(torch.optim.AdamW([p]), [p])
    assert not folds_clip(torch.optim.SGD([p], lr=0.1), [p])
    busy = torch.optim.AdamW([p], fused=True)
    busy.grad_scale = torch.tensor(2.0)  # GradScaler's slot in use
    assert not folds_clip(busy, [p])
    h = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    h.grad = torch.ones(3, dtype=torch.float16)
    assert not folds_clip(torch.optim.AdamW([h], fused=True), [h])
