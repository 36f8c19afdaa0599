"""Critic-free group algorithms: GRPO, RLOO, REINFORCE++ (and its group-baseline variant).

None of them trains a value function: the baseline comes from other completions instead. The trainer
samples ``algorithm.group.group_size`` (G) completions per prompt, consecutively, so rows
``[i*G, (i+1)*G)`` of a rollout batch share a prompt; each algorithm turns the task rewards into
advantages (:meth:`GroupAlgorithm.advantages`) and all three share one clipped-ratio update.

* GRPO (Shao et al. 2024; TRL's ``GRPOTrainer``): advantage ``(r - mean_group) / (std_group + 1e-4)``
  per episode (std unbiased as ``torch.std``; ``scale_rewards: none`` is Dr. GRPO), KL to the
  reference as a *loss* term ``beta * k3`` per token.
* RLOO (Ahmadian et al. 2024; TRL's ``RLOOTrainer``): reward ``r - beta * sum_t KL_t`` per episode,
  advantage = that reward minus the mean of the other G - 1 of its group (leave-one-out).
* REINFORCE++ (Hu 2025; OpenRLHF ``advantage_estimator: reinforce``): reward ``-beta * KL_t`` on every
  token plus the task reward on the last, returns ``G_t = sum_{s>=t} gamma^(s-t) r_s``, whitened over
  all tokens of the batch. ``reinforce_pp_baseline`` (OpenRLHF ``reinforce_baseline``) first subtracts
  the group's mean task reward.

With ``beta: 0`` no reference model is loaded at all (:attr:`GroupAlgorithm.needs_reference`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine import distributed
from engine.algorithms.base import CriticFreeGroupAlgorithm, UpdateInputs
from engine.algorithms.common import add_stats, backward, clip_and_step, finite, minibatch_inputs
from engine.algorithms.ppo import kl_penalty_rewards, masked_mean, whiten
from engine.kl import kl_estimate
from engine.models.policy import token_logprobs
from engine.models.precision import autocast
from engine.registry import algorithms

#: TRL's epsilon in GRPO's std scaling: a group of equal rewards gets 0 / (0 + 1e-4) = 0, never NaN.
GRPO_STD_EPS = 1e-4


# ------------------------------------------------------------------------------- advantages (pure)


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group") -> torch.Tensor:
    """Per-episode ``r - group mean``, divided by the group's (``group``) or batch's (``batch``) std."""
    groups = rewards.view(-1, group_size)
    adv = groups - groups.mean(1, keepdim=True)
    if scale == "group":
        adv = adv / (groups.std(1, keepdim=True) + GRPO_STD_EPS)
    elif scale == "batch":
        # the std of every rank's rewards in a distributed run (groups themselves stay on one rank)
        adv = adv / (distributed.gather_rows(rewards).std() + GRPO_STD_EPS)
    elif scale != "none":
        raise ValueError(f"algorithm.group.scale_rewards: unknown value {scale!r}")
    return adv.flatten()


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per-episode ``r_i - mean_{j != i} r_j`` within each group (needs G >= 2)."""
    groups = rewards.view(-1, group_size)
    baseline = (groups.sum(1, keepdim=True) - groups) / (group_size - 1)
    return (groups - baseline).flatten()


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` over each episode's valid tokens (0 after the episode)."""
    out = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        running = (rewards[:, t] + gamma * running) * mask[:, t]
        out[:, t] = running
    return out


def reinforce_pp_advantages(
    task_rewards: torch.Tensor,
    kl: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    gamma: float,
    group_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ token advantages (returns whitened over the batch) and the per-token rewards.

    ``group_size`` set: the ``_baseline`` variant (task reward minus its group's mean first).
    """
    if group_size is not None:
        groups = task_rewards.view(-1, group_size)
        task_rewards = (groups - groups.mean(1, keepdim=True)).flatten()
    rewards, _ = kl_penalty_rewards(task_rewards, kl, mask, beta)
    returns = discounted_returns(rewards, mask, gamma)
    return whiten(returns, mask), rewards


def last_token_rewards(episode_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) rewards with each episode's reward on its last valid token (for the return statistic)."""
    out, _ = kl_penalty_rewards(episode_rewards, torch.zeros_like(mask), mask, 0.0)
    return out


# ------------------------------------------------------------------------------- loss (pure)


def group_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    kl: torch.Tensor | None,
    beta: float,
    aggregation: str,
    denominator: float | torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped-ratio loss ``-min(rho A, clip(rho) A) [+ beta KL]`` per token, aggregated.

    ``denominator`` is the whole optimizer step's count (tokens for ``token_mean``, episodes for
    ``sequence_mean``), so that the losses of accumulated minibatches add up to the step's loss.
    """
    log_ratio = (logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    per_token = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip))
    if kl is not None and beta > 0:
        per_token = per_token + beta * kl
    if aggregation == "token_mean":
        loss = (per_token * mask).sum() / denominator
    elif aggregation == "sequence_mean":
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)).sum() / denominator
    else:
        raise ValueError(f"algorithm.group.loss_aggregation: unknown value {aggregation!r}")
    stats = {
        "policy/clipfrac": masked_mean(((ratio - 1.0).abs() > clip).float(), mask).detach(),
        "policy/approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask).detach(),
        "policy/ratio_mean": masked_mean(ratio, mask).detach(),
    }
    if kl is not None:
        stats["loss/kl"] = masked_mean(kl, mask).detach()
    return loss, stats


# ------------------------------------------------------------------------------- algorithms


@torch.no_grad()
def _fill_rollout_stats(
    batch: Any,
    idx: torch.Tensor,
    tsl: slice,
    lp: torch.Tensor,
    full_lp: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
) -> None:
    """Write what the skipped scoring pass would have produced for rows ``idx`` (same parameters, same
    inputs: the update's first forward *is* that pass), so the trainer's KL and entropy metrics hold."""
    cols = slice(tsl.start, tsl.start + lp.shape[1])
    batch.logprobs[idx, cols] = lp.detach() * mask
    batch.kl_logprobs[idx, cols] = full_lp.detach() * mask
    batch.entropy[idx, cols] = entropy * mask
    if batch.has_reference:
        kl = kl_estimate(full_lp.detach(), batch.ref_logprobs[idx, cols], batch.kl_estimator)
        batch.kl[idx, cols] = kl * mask
    else:  # as the scoring pass without a reference: the policy is its own reference, KL 0
        batch.ref_logprobs[idx, cols] = full_lp.detach() * mask


class GroupAlgorithm(CriticFreeGroupAlgorithm):
    """Shared update of the critic-free algorithms; subclasses only compute advantages."""

    #: GRPO puts the KL in the loss; RLOO and REINFORCE++ put it in the reward.
    kl_in_loss = False
    default_estimator = "k1"
    needs_group = True

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        g = cfg.group.group_size
        if self.needs_group and g < 2:
            raise ValueError(
                f"algorithm.group.group_size: {cfg.id!r} compares completions of a prompt, needs >= 2"
            )
        self.group_size = g
        self.beta = float(cfg.group.beta)
        self.estimator = cfg.group.kl_estimator or self.default_estimator

    @property
    def needs_reference(self) -> bool:
        """No reference model at all when beta is 0 (the trainer skips loading or copying it)."""
        return self.beta > 0

    def optimizer_steps(self, n_episodes: int) -> int:
        """Optimizer steps one update makes on a rollout of ``n_episodes``."""
        cfg = self.cfg
        chunks = math.ceil(n_episodes / max(1, min(cfg.minibatch_size, n_episodes)))
        return cfg.n_epochs * math.ceil(chunks / max(1, cfg.grad_accumulation))

    def needs_rollout_scores(self, n_episodes: int) -> bool:
        """Whether the rollout must score the policy's log-probs before the update.

        Not when the update is one optimizer step over the whole batch (one pass, every minibatch
        accumulated into one step: TRL's ``num_iterations == 1`` with ``steps_per_generation <=
        gradient_accumulation_steps``) and the advantages need no policy KL (GRPO puts it in the loss;
        RLOO and REINFORCE++ only at beta 0): the "old" log-probs are then the update's own, detached
        (ratio exactly 1), and the update fills in the rollout's KL and entropy statistics from the same
        forward pass. That saves one policy forward over every episode per iteration, as TRL does.
        """
        if self.optimizer_steps(n_episodes) != 1:
            return True
        return not (self.kl_in_loss or self.beta == 0)

    def make_optimizer(self, params: list[Any]) -> Any | None:
        """AdamW with the fused kernel (CPU and CUDA): one pass over the parameters per step instead of a
        chain of foreach ops; same update rule and state as the trainer's default AdamW."""
        try:
            return torch.optim.AdamW(
                params, lr=self.cfg.learning_rate, weight_decay=self.cfg.weight_decay, fused=True
            )
        except (RuntimeError, ValueError):  # a device or dtype without a fused kernel
            return None

    def token_kl(self, batch: Any) -> torch.Tensor:
        """(B, T) KL of the rollout's tokens to the reference (full-vocabulary tempered log-probs)."""
        if self.beta == 0:
            return torch.zeros_like(batch.gen_mask)
        return kl_estimate(batch.kl_logprobs, batch.ref_logprobs, self.estimator) * batch.gen_mask

    def learn(self, policy: Any, optimizer: Any, batch: Any, inputs: UpdateInputs) -> dict[str, float]:
        """``n_epochs`` passes (GRPO's num_iterations) over shuffled minibatches, one step per
        ``grad_accumulation`` minibatches; the ratio is to the rollout's log-probs."""
        cfg, gc = self.cfg, self.cfg.group
        n = len(batch)
        mb = min(cfg.minibatch_size, n)
        device = batch.gen_ids.device
        params = [p for p in policy.parameters() if p.requires_grad]
        sums: dict[str, float] = {}
        counts = n_updates = 0
        was_training = policy.training
        policy.eval()  # dropout off: the first pass's ratio is exactly to the distribution sampled from
        # No scoring pass in the rollout (see needs_rollout_scores): one step, old = current, detached.
        on_policy = not batch.policy_scored
        if on_policy and self.optimizer_steps(n) != 1:
            raise RuntimeError("a rollout without policy log-probs needs a one-step update")
        for _epoch in range(cfg.n_epochs):
            perm = torch.randperm(n, generator=inputs.generator).to(device)
            chunks = list(perm.split(mb))
            for s in range(0, len(chunks), cfg.grad_accumulation):
                step = chunks[s : s + cfg.grad_accumulation]
                rows = torch.cat(step)
                if gc.loss_aggregation == "token_mean":
                    denom = batch.gen_mask[rows].sum().clamp(min=1.0)
                else:
                    denom = float(len(rows))
                optimizer.zero_grad(set_to_none=True)
                for idx in step:
                    add_stats(sums, self.minibatch_backward(policy, batch, idx, inputs, denom, on_policy))
                    counts += 1
                gnorm = clip_and_step(params, optimizer, inputs.scaler, cfg.max_grad_norm)
                sums["policy/grad_norm"] = sums.get("policy/grad_norm", 0.0) + float(gnorm) * len(step)
                n_updates += 1
        optimizer.zero_grad(set_to_none=True)
        policy.train(was_training)
        out = {k: v / max(counts, 1) for k, v in sums.items()}
        out.update({"policy/n_updates": float(n_updates), "train/kl_coef": self.beta})
        return finite(out)

    def minibatch_backward(
        self,
        policy: Any,
        batch: Any,
        idx: torch.Tensor,
        inputs: UpdateInputs,
        denom: float | torch.Tensor,
        on_policy: bool,
    ) -> dict[str, torch.Tensor]:
        """The gradient of rows ``idx``'s share of the step's loss (``denom``: the step's tokens or
        episodes); returns the minibatch's statistics."""
        gc = self.cfg.group
        kl_beta = self.beta if self.kl_in_loss else 0.0
        mb, tsl, support = minibatch_inputs(batch, idx)
        with autocast(batch.gen_ids.device, inputs.autocast_dtype):
            # A group's completions share their prompt: one prompt pass per group.
            logits, _ = policy.forward_tokens(mb, want_values=False, share_prompts=True, lazy_head=True)
        ids, mask = mb["gen_ids"], mb["gen_mask"]
        # Ratio on the distribution sampled from; KL on the full tempered one, as the rollout's.
        new_lp, full_lp, token_entropy = token_logprobs(logits, ids, inputs.temperature, support)
        del logits
        kl = None
        if kl_beta > 0:
            kl = kl_estimate(full_lp, batch.ref_logprobs[idx][:, tsl], self.estimator)
        entropy = masked_mean(token_entropy, mask)  # a statistic only (no gradient)
        if on_policy:
            old_lp = new_lp.detach()
            _fill_rollout_stats(batch, idx, tsl, new_lp, full_lp, token_entropy, mask)
        else:
            old_lp = batch.logprobs[idx][:, tsl]
        adv = inputs.advantages[idx][:, tsl]
        loss, stats = group_policy_loss(
            new_lp, old_lp, adv, mask, self.cfg.clip_range, kl, kl_beta, gc.loss_aggregation, denom
        )
        backward(loss, inputs.scaler)
        per = mask.sum().clamp(min=1.0) if gc.loss_aggregation == "token_mean" else len(idx)
        stats["loss/total"] = loss.detach() * denom / per
        stats["policy/entropy"] = entropy
        return stats


@algorithms.register(
    "grpo", "GRPO: group-normalised advantages, clipped ratio, k3 KL loss term (TRL's GRPOTrainer)."
)
class GRPO(GroupAlgorithm):
    kl_in_loss = True
    default_estimator = "k3"

    def advantages(self, task_rewards: torch.Tensor, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        adv = grpo_advantages(task_rewards, self.group_size, self.cfg.group.scale_rewards)
        mask = batch.gen_mask
        return adv[:, None] * mask, last_token_rewards(task_rewards, mask)


@algorithms.register(
    "rloo", "RLOO: leave-one-out group baseline, sequence KL in the reward (TRL's RLOOTrainer)."
)
class RLOO(GroupAlgorithm):
    def advantages(self, task_rewards: torch.Tensor, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        mask = batch.gen_mask
        episode = task_rewards - self.beta * self.token_kl(batch).sum(1)
        adv = rloo_advantages(episode, self.group_size)
        return adv[:, None] * mask, last_token_rewards(episode, mask)


@algorithms.register(
    "reinforce_pp", "REINFORCE++: token KL in the reward, batch-whitened returns (OpenRLHF)."
)
class ReinforcePP(GroupAlgorithm):
    needs_group = False

    def advantages(self, task_rewards: torch.Tensor, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return reinforce_pp_advantages(
            task_rewards, self.token_kl(batch), batch.gen_mask, self.beta, self.cfg.gamma, None
        )


@algorithms.register(
    "reinforce_pp_baseline", "REINFORCE++ with the group's mean reward subtracted first (OpenRLHF)."
)
class ReinforcePPBaseline(GroupAlgorithm):
    def advantages(self, task_rewards: torch.Tensor, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return reinforce_pp_advantages(
            task_rewards, self.token_kl(batch), batch.gen_mask, self.beta, self.cfg.gamma, self.group_size
        )
