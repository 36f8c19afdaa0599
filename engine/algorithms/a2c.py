"""A2C (Mnih et al. 2016) as RL4LMs runs it: SB3's synchronous advantage actor-critic on the token MDP.

One gradient step per rollout on the whole batch: no ratio, no clipping, no epochs. RL4LMs's A2C
(``rl4lms/algorithms/a2c``) inherits SB3's defaults, which the config reproduces: RMSprop
(alpha 0.99, eps 1e-5), GAE lambda 1.0 (the n-step return), no advantage normalisation, value loss
``vf_coef * MSE(V, R)`` (SB3's ``F.mse_loss``: no 1/2), gradient norm clipped to 0.5. Rollout,
KL-shaped rewards and GAE are the trainer's, shared with PPO.

The batch is split into chunks of ``minibatch_size`` episodes only to bound memory: every chunk's
loss is divided by the batch's total token count and the gradients are accumulated, so the single
optimizer step is the step on the token mean over the whole rollout, as SB3's ``batch_size=None``.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.algorithms.base import ActorCriticAlgorithm, UpdateInputs
from engine.algorithms.common import backward, clip_and_step, finite, minibatch_inputs
from engine.models.policy import entropy_from_logprobs, gather_logprobs, processed_logprobs
from engine.models.precision import autocast
from engine.registry import algorithms


def a2c_loss(
    logprobs: torch.Tensor,
    values: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    vf_coef: float,
    ent_coef: float,
    n_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-mean(A log pi) + vf_coef * mean((V - R)^2) - ent_coef * mean(H)`` over valid tokens.

    ``n_tokens`` is the denominator of the means (default: the valid tokens of this batch); a chunk
    of a larger batch passes the whole batch's count so that summed chunk losses equal the batch loss.
    """
    n = mask.sum().clamp(min=1.0) if n_tokens is None else n_tokens
    policy = -(advantages * logprobs * mask).sum() / n
    value = ((values - returns) ** 2 * mask).sum() / n
    ent = (entropy * mask).sum() / n
    loss = policy + vf_coef * value - ent_coef * ent
    return loss, {"loss/policy": policy, "loss/value": value, "policy/entropy": ent, "loss/total": loss}


@algorithms.register("a2c", "Advantage actor-critic (RL4LMs/SB3 A2C): one RMSprop step per rollout.")
class A2C(ActorCriticAlgorithm):
    def make_optimizer(self, params: list[Any]) -> torch.optim.Optimizer | None:
        a2c = self.cfg.a2c
        if a2c.optimizer != "rmsprop":
            return None  # the trainer's AdamW (RL4LMs: use_rms_prop: false)
        return torch.optim.RMSprop(
            params,
            lr=self.cfg.learning_rate,
            alpha=a2c.rms_prop_alpha,
            eps=a2c.rms_prop_eps,
            weight_decay=self.cfg.weight_decay,
        )

    def learn(self, policy: Any, optimizer: Any, batch: Any, inputs: UpdateInputs) -> dict[str, float]:
        """One optimizer step on the token-mean A2C loss of the whole rollout."""
        cfg = self.cfg
        device = batch.gen_ids.device
        n_tokens = batch.gen_mask.sum().clamp(min=1.0)
        sums: dict[str, float] = {}
        was_training = policy.training
        policy.eval()  # dropout off, as in RL4LMs (its policy is never switched to train mode)
        optimizer.zero_grad(set_to_none=True)
        for idx in torch.arange(len(batch), device=device).split(cfg.minibatch_size):
            loss, stats = self.chunk_loss(policy, batch, idx, inputs, n_tokens)
            backward(loss, inputs.scaler)
            for k, v in stats.items():  # chunk losses are already shares of the batch mean: add them
                sums[k] = sums.get(k, 0.0) + float(v.detach())
        params = [p for p in policy.parameters() if p.requires_grad]
        gnorm = clip_and_step(params, optimizer, inputs.scaler, cfg.max_grad_norm)
        optimizer.zero_grad(set_to_none=True)
        policy.train(was_training)
        sums["policy/grad_norm"] = float(gnorm)
        sums["policy/n_updates"] = 1.0
        return finite(sums)

    def chunk_loss(
        self, policy: Any, batch: Any, idx: torch.Tensor, inputs: UpdateInputs, n_tokens: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The A2C loss of rows ``idx`` as their share of the whole batch's token mean."""
        cfg = self.cfg
        mb, tsl, support = minibatch_inputs(batch, idx)
        with autocast(mb["gen_ids"].device, inputs.autocast_dtype):
            logits, values = policy.forward_tokens(mb, want_values=True)
        # Log-probs of the distribution sampled from; the entropy is the full tempered distribution's.
        logp_all = processed_logprobs(logits, inputs.temperature, support)
        # Padding columns out before the product: a pad outside the support is -inf, and -inf * 0 = NaN.
        logp = torch.where(mb["gen_mask"] > 0, gather_logprobs(logp_all, mb["gen_ids"]), 0.0)
        full = logp_all if support is None else processed_logprobs(logits, inputs.temperature, None)
        del logits, logp_all
        with torch.set_grad_enabled(cfg.ent_coef > 0):  # otherwise only a statistic
            entropy = entropy_from_logprobs(full)
        del full
        return a2c_loss(
            logp,
            values.float(),
            entropy,
            inputs.advantages[idx][:, tsl],
            inputs.returns[idx][:, tsl],
            mb["gen_mask"],
            cfg.vf_coef,
            cfg.ent_coef,
            n_tokens,
        )
