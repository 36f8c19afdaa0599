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

import math
from typing import Any

import torch

from engine import distributed
from engine.algorithms.base import Algorithm
from engine.algorithms.ppo import _trim
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
class A2C(Algorithm):
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

    def update(
        self,
        policy: Any,
        optimizer: Any,
        batch: Any,
        advantages: torch.Tensor | None = None,
        returns: torch.Tensor | None = None,
        temperature: float = 1.0,
        autocast_dtype: torch.dtype | None = None,
        scaler: Any | None = None,
        **_: Any,
    ) -> dict[str, float]:
        """One optimizer step on the token-mean A2C loss of the whole rollout."""
        cfg = self.cfg
        device = batch.gen_ids.device
        n_tokens = batch.gen_mask.sum().clamp(min=1.0)
        sums: dict[str, float] = {}
        was_training = policy.training
        policy.eval()  # dropout off, as in RL4LMs (its policy is never switched to train mode)
        optimizer.zero_grad(set_to_none=True)
        for idx in torch.arange(len(batch), device=device).split(cfg.minibatch_size):
            inputs, tsl, support = _trim(batch, idx)
            with autocast(device, autocast_dtype):
                logits, values = policy.forward_tokens(inputs, want_values=True)
            # Log-probs of the distribution sampled from; the entropy is the full tempered distribution's.
            logp_all = processed_logprobs(logits, temperature, support)
            # Padding columns out before the product: a pad outside the support is -inf, and -inf * 0 = NaN.
            logp = torch.where(inputs["gen_mask"] > 0, gather_logprobs(logp_all, inputs["gen_ids"]), 0.0)
            full = logp_all if support is None else processed_logprobs(logits, temperature, None)
            del logits, logp_all
            with torch.set_grad_enabled(cfg.ent_coef > 0):  # otherwise only a statistic
                entropy = entropy_from_logprobs(full)
            del full
            loss, stats = a2c_loss(
                logp,
                values.float(),
                entropy,
                advantages[idx][:, tsl],
                returns[idx][:, tsl],
                inputs["gen_mask"],
                cfg.vf_coef,
                cfg.ent_coef,
                n_tokens,
            )
            (scaler.scale(loss) if scaler is not None else loss).backward()
            for k, v in stats.items():  # chunk losses are already shares of the batch mean: add them
                sums[k] = sums.get(k, 0.0) + float(v.detach())
        params = [p for p in policy.parameters() if p.requires_grad]
        distributed.sync_gradients(params)  # DDP's mean over ranks, before unscaling and clipping
        if scaler is not None:
            scaler.unscale_(optimizer)
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        policy.train(was_training)
        sums["policy/grad_norm"] = float(gnorm)
        sums["policy/n_updates"] = 1.0
        return {k: (v if math.isfinite(v) else float("nan")) for k, v in sums.items()}
