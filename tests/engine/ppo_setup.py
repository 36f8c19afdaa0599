"""The PPO update tests' common start: a real rollout of the builtin tiny GPT-2 (fp32, CPU) and the
helpers that compare what an update did to it.

Why one module: the update, clip-in-step and split-critic tests all train on the same seeded rollout
(8 prompts, 6 sampled tokens each, reward = share of even token ids on the last token, whitened GAE);
written once, a change to that setup reaches every test that relies on it.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.algorithms.ppo import PPO, gae, whiten
from engine.config import AlgorithmConfig
from engine.data.base import Sample
from engine.models.loading import load_lm, load_tokenizer
from engine.models.policy import ActorCritic
from engine.rollout import RolloutBatch, SamplingSpec, collect

CPU = torch.device("cpu")


def rollout(
    tiny_dirs: dict[str, str], value_head: str = "shared", seed: int = 0, temperature: float = 1.0, n: int = 8
) -> tuple[ActorCritic, RolloutBatch, torch.Tensor, torch.Tensor]:
    """``(policy, batch, advantages, returns)``: n episodes of 6 tokens (no EOS, so all equally long).

    The task reward is the share of even token ids, placed on the last token as the trainer does;
    advantages are GAE, whitened.
    """
    torch.manual_seed(seed)
    policy = ActorCritic(load_lm(tiny_dirs["causal"], "causal"), False, value_head)
    tok = load_tokenizer(tiny_dirs["causal"])
    samples = [Sample(str(i), f"{i} {i + 1} {i + 2} and", []) for i in range(n)]
    spec = SamplingSpec(max_new_tokens=6, eos_id=None, temperature=temperature)
    batch = collect(
        policy, None, tok, samples, spec, 16, n, CPU, generator=torch.Generator().manual_seed(seed)
    )
    assert bool((batch.gen_mask.sum(1) == 6).all())
    rewards = torch.zeros_like(batch.logprobs)
    rewards[:, -1] = (batch.gen_ids % 2 == 0).float().mean(1)
    adv, ret = gae(rewards, batch.values, batch.gen_mask, 1.0, 0.95)
    return policy, batch, whiten(adv, batch.gen_mask), ret


def flat_params(policy: Any) -> torch.Tensor:
    """Every parameter, flattened into one detached copy (to compare policies after updates)."""
    return torch.cat([p.detach().reshape(-1).clone() for p in policy.parameters()])


def fused_adamw(policy: Any, lr: float = 1e-3) -> torch.optim.Optimizer:
    """PPO's own optimizer (``PPO.make_optimizer``): AdamW with the fused kernel, weight decay on."""
    cfg = AlgorithmConfig(learning_rate=lr, weight_decay=0.01)
    opt = PPO(cfg).make_optimizer([p for p in policy.parameters() if p.requires_grad])
    assert opt is not None and opt.param_groups[0]["fused"]
    return opt


def random_value_head(policy: Any) -> None:
    """A random value head, so that gradient reaches a separate critic's trunk (the initial head is zero)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        w = policy.value_head.linear.weight
        w.copy_(torch.randn(w.shape, generator=g))


def run_update(
    policy: Any, batch: RolloutBatch, adv: torch.Tensor, ret: torch.Tensor, cls: type = PPO, **kw: Any
) -> dict:
    """A whole update (2 epochs of minibatches of 2 unless ``kw`` says otherwise) with PPO's own fused
    AdamW and a seeded minibatch order; returns the update's statistics."""
    cfg = AlgorithmConfig(**{"n_epochs": 2, "minibatch_size": 2, "learning_rate": 1e-3, **kw})
    return cls(cfg).update(
        policy, fused_adamw(policy), batch, advantages=adv, returns=ret,
        generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
