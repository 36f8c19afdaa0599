"""PPO for language models on the token-level MDP (Ramamurthy et al. 2023, Schulman et al. 2017).

Pure tensor functions (GAE, whitening, clipped losses) are separate from the update loop so they
can be checked against hand-computed values.
"""

from __future__ import annotations

from typing import Any

import torch

from engine import distributed
from engine.algorithms.base import ActorCriticAlgorithm, UpdateInputs
from engine.algorithms.common import add_stats, backward, clip_and_step, finite, minibatch_inputs
from engine.models.policy import (
    EosBan,
    entropy_from_logprobs,
    full_logprobs,
    gather_logprobs,
    restrict_logprobs,
    token_logprobs,
)
from engine.models.precision import autocast
from engine.registry import algorithms


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Population variance of the masked entries."""
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask)


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise the masked entries to zero mean, unit (population) variance; masked-out entries become 0.

    In a distributed run the mean and variance are those of every rank's batch (engine.distributed).
    """
    if distributed.is_active():
        mean, var = distributed.masked_moments(x, mask)
    else:
        mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def normalize_minibatch(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """SB3's per-minibatch advantage normalisation, ``(A - mean) / (std + 1e-8)``, over valid tokens.

    The standard deviation is the sample one (n − 1, as ``torch.std``) and ``eps`` is added to it, not
    to the variance: RL4LMs's PPO is SB3's, which normalises each minibatch this way. A minibatch with a
    single valid token has no spread; it is centred only. Masked-out entries become 0."""
    n = mask.sum()
    mean = (x * mask).sum() / n.clamp(min=1)
    centred = (x - mean) * mask
    if float(n) < 2:
        return centred
    std = torch.sqrt((centred**2).sum() / (n - 1))
    return centred / (std + eps)


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over (B, T) episodes; the state after the last valid token is terminal."""
    bsz, t_len = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros(bsz, dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(t_len)):
        if t + 1 < t_len:
            next_nonterminal = mask[:, t + 1]
            next_value = values[:, t + 1] * next_nonterminal
        else:
            next_nonterminal = torch.zeros_like(last)
            next_value = torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * next_nonterminal * last
        adv[:, t] = last * mask[:, t]
    returns = (adv + values) * mask
    return adv, returns


def kl_shaped_rewards(
    task_rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards -beta*(log pi - log pi_ref) plus the task reward on each episode's last token.

    The k1 estimator on given log-probs; the trainer passes its chosen estimate to
    :func:`kl_penalty_rewards`. Returns (rewards (B, T), per-token KL estimate (B, T)).
    """
    return kl_penalty_rewards(task_rewards, logprobs - ref_logprobs, mask, beta)


def kl_penalty_rewards(
    task_rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards -beta*KL_t plus the task reward on each episode's last token (RL4LMs's shaping).

    Returns (rewards (B, T), the masked per-token KL (B, T)).
    """
    kl = kl * mask
    rewards = -beta * kl
    lengths = mask.sum(1).long()
    last = (lengths - 1).clamp(min=0)
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    rewards[rows, last] += task_rewards.to(rewards.dtype) * (lengths > 0).to(rewards.dtype)
    return rewards * mask, kl


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (to minimise), with clip fraction and the k3 approximate KL."""
    # where, not "* mask": a padded position may hold -inf (a token outside a stored top-k support), and
    # -inf * 0 is NaN, which would poison the loss and, through it, every parameter (issue #8).
    log_ratio = torch.where(mask.bool(), logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    loss = masked_mean(torch.maximum(loss1, loss2), mask)
    clipfrac = masked_mean(((ratio - 1.0).abs() > clip).float(), mask)
    approx_kl = masked_mean((ratio - 1.0) - log_ratio, mask)
    return loss, {
        "clipfrac": clipfrac.detach(),
        "approx_kl": approx_kl.detach(),
        "ratio": masked_mean(ratio, mask).detach(),
    }


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mean((V - R)^2)`` over valid tokens, or ``mean(max((V - R)^2, (V_clipped - R)^2))`` with a clip
    range; returns (loss, fraction of clipped values).

    No factor ½: RL4LMs's PPO is SB3's, whose value loss is ``F.mse_loss`` (A2C and TRPO here use the
    same), so ``vf_coef`` weighs the same quantity as there. With clipping, the pessimistic max of the
    two errors (PPO2 / TRL) is kept; SB3 takes the clipped prediction's error alone (docs/engine.md)."""
    err = (values - returns) ** 2
    if clip is None:
        return masked_mean(err, mask), torch.zeros((), device=values.device)
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    err_clipped = (v_clipped - returns) ** 2
    loss = masked_mean(torch.maximum(err, err_clipped), mask)
    return loss, masked_mean((err_clipped > err).float(), mask).detach()


def explained_variance(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    var_t = masked_var(target, mask)
    if float(var_t) == 0.0:
        return float("nan")
    return float(1.0 - masked_var(target - pred, mask) / var_t)


@algorithms.register("ppo", "Proximal Policy Optimization with a value head and KL-penalised rewards.")
class PPO(ActorCriticAlgorithm):
    def make_optimizer(self, params: list[Any]) -> Any | None:
        """AdamW with the fused kernel (CPU and CUDA): one pass over the parameters per step instead of a
        chain of foreach ops — with a separate critic that is 270M parameters on each of the 16 steps of
        an IMDB iteration. Same update rule and state as the trainer's default AdamW. Sharded (FSDP,
        DTensor) parameters keep the trainer's default."""
        if any(type(p.data) is not torch.Tensor for p in params):
            return None
        try:
            return torch.optim.AdamW(
                params, lr=self.cfg.learning_rate, weight_decay=self.cfg.weight_decay, fused=True
            )
        except (RuntimeError, ValueError):  # a device or dtype without a fused kernel
            return None

    @property
    def whitens_per_minibatch(self) -> bool:
        return bool(self.cfg.whiten_advantages and self.cfg.advantage_normalization == "minibatch")

    def minibatch_loss(
        self,
        policy: Any,
        batch: Any,
        idx: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        temperature: float,
        autocast_dtype: torch.dtype | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One minibatch's loss (policy, value and entropy terms in one graph) and its statistics."""
        cfg = self.cfg
        terms = self.policy_terms(
            policy, batch, idx, advantages, temperature, autocast_dtype, want_values=True
        )
        v_loss, vclip = self.value_terms(terms.pop("values"), batch, idx, returns, terms)
        loss = terms["pg_loss"] + cfg.vf_coef * v_loss - cfg.ent_coef * terms["entropy"]
        return loss, self.minibatch_stats(terms, v_loss, vclip)

    def policy_terms(
        self,
        policy: Any,
        batch: Any,
        idx: torch.Tensor,
        advantages: torch.Tensor,
        temperature: float,
        autocast_dtype: torch.dtype | None,
        want_values: bool,
    ) -> dict[str, Any]:
        """The policy's forward over one minibatch: its clipped loss ``pg_loss``, ``entropy``, the ratio
        statistics, the generation columns ``tsl``, and (``want_values``) the values of the same pass."""
        cfg = self.cfg
        inputs, tsl, support = minibatch_inputs(batch, idx)
        device = inputs["gen_ids"].device
        # Entropy as a statistic only and no (B, T, V) support mask: the log-probs come straight from
        # the LM head's input (engine/models/head.py), no (B, T, V) temporaries.
        lazy = cfg.ent_coef == 0 and (support is None or isinstance(support, EosBan))
        with autocast(device, autocast_dtype):
            logits, values = policy.forward_tokens(inputs, want_values=want_values, lazy_head=lazy)
        mask = inputs["gen_mask"]
        # The ratio uses the distribution sampled from (restricted to the stored support); the entropy
        # is the full tempered distribution's, the same one the KL penalty is computed on.
        if lazy:
            new_lp, _, token_entropy = token_logprobs(logits, inputs["gen_ids"], temperature, support)
            del logits
            entropy = masked_mean(token_entropy, mask)
        else:
            full = full_logprobs(logits, temperature)
            del logits
            new_lp = gather_logprobs(restrict_logprobs(full, support), inputs["gen_ids"])
            if cfg.ent_coef > 0:
                entropy = masked_mean(entropy_from_logprobs(full), mask)
            else:  # only a statistic: no graph through the (B, T, V) entropy terms
                with torch.no_grad():
                    entropy = masked_mean(entropy_from_logprobs(full.detach()), mask)
            del full
        old_lp = batch.logprobs[idx][:, tsl]
        adv = advantages[idx][:, tsl]
        pg_loss, pg_stats = clipped_policy_loss(new_lp, old_lp, adv, mask, cfg.clip_range)
        return {
            "pg_loss": pg_loss,
            "entropy": entropy,
            "pg_stats": pg_stats,
            "values": values,
            "tsl": tsl,
            "mask": mask,
            "inputs": inputs,
        }

    def value_terms(
        self,
        values: torch.Tensor,
        batch: Any,
        idx: torch.Tensor,
        returns: torch.Tensor,
        terms: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The clipped value loss of one minibatch's values and its clip fraction; ``terms`` (of
        :meth:`policy_terms`) give the minibatch's generation columns and mask."""
        tsl = terms["tsl"]
        return clipped_value_loss(
            values.float(),
            batch.values[idx][:, tsl],
            returns[idx][:, tsl],
            terms["mask"],
            self.cfg.clip_range_value,
        )

    def minibatch_stats(
        self, terms: dict[str, Any], v_loss: torch.Tensor, vclip: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """One minibatch's statistics; ``loss/total`` is the joint loss's value, the same expression
        however the terms were backpropagated."""
        cfg, pg_stats = self.cfg, terms["pg_stats"]
        pg_loss, entropy = terms["pg_loss"].detach(), terms["entropy"].detach()
        return {
            "loss/policy": pg_loss,
            "loss/value": v_loss.detach(),
            "loss/total": pg_loss + cfg.vf_coef * v_loss.detach() - cfg.ent_coef * entropy,
            "policy/entropy": entropy,
            "policy/approx_kl": pg_stats["approx_kl"],
            "policy/clipfrac": pg_stats["clipfrac"],
            "policy/ratio_mean": pg_stats["ratio"],
            "value/clipfrac": vclip,
        }

    def learn(self, policy: Any, optimizer: Any, batch: Any, inputs: UpdateInputs) -> dict[str, float]:
        """PPO epochs over shuffled minibatches with gradient accumulation and approx-KL early stop."""
        cfg = self.cfg
        n = len(batch)
        mb = min(cfg.minibatch_size, n)
        params = [p for p in policy.parameters() if p.requires_grad]
        sums: dict[str, float] = {}
        counts = 0
        n_updates = 0
        early = False
        per_model = bool(cfg.clip_grad_per_model) and self.backprops_policy_first(policy)
        policy.train()
        for _epoch in range(cfg.n_epochs):
            perm = torch.randperm(n, generator=inputs.generator)
            chunks = [perm[i : i + mb] for i in range(0, n, mb)]
            steps = [
                chunks[i : i + cfg.grad_accumulation] for i in range(0, len(chunks), cfg.grad_accumulation)
            ]
            for step in steps:
                if per_model:
                    counted, early = self.step_per_model(policy, optimizer, batch, step, inputs, sums)
                    counts += counted
                    if early:
                        optimizer.zero_grad(set_to_none=True)
                        break
                    n_updates += 1
                    continue
                counted, early = self.accumulate(policy, optimizer, batch, step, inputs, sums)
                counts += counted
                if early:
                    optimizer.zero_grad(set_to_none=True)
                    break
                gnorm = clip_and_step(params, optimizer, inputs.scaler, cfg.max_grad_norm)
                sums["policy/grad_norm"] = sums.get("policy/grad_norm", 0.0) + float(gnorm) * len(step)
                n_updates += 1
            if early:
                break
        optimizer.zero_grad(set_to_none=True)
        out = {k: v / max(counts, 1) for k, v in sums.items()}
        out["policy/n_updates"] = float(n_updates)
        out["policy/early_stopped"] = float(early)
        return finite(out)

    def accumulate(
        self,
        policy: Any,
        optimizer: Any,
        batch: Any,
        step: list[torch.Tensor],
        inputs: UpdateInputs,
        sums: dict[str, float],
    ) -> tuple[int, bool]:
        """The gradients of one optimizer step's minibatches (``grad_accumulation`` of them), their
        statistics added to ``sums``; returns (minibatches counted, whether approx-KL stopped the update)."""
        optimizer.zero_grad(set_to_none=True)
        advantages = self.step_advantages(batch, step, inputs)
        split = self.backprops_policy_first(policy)
        for k, idx in enumerate(step):
            idx = idx.to(batch.gen_ids.device)
            if split:
                stats, stop = self.split_minibatch(policy, batch, idx, advantages, inputs, len(step))
                add_stats(sums, stats)
                if stop:
                    return k + 1, True
                continue
            loss, stats = self.minibatch_loss(
                policy, batch, idx, advantages, inputs.returns, inputs.temperature, inputs.autocast_dtype
            )
            # As SB3: the minibatch that triggers the early stop counts in the statistics
            # (its approx_kl is the reason for stopping), but it is not applied.
            add_stats(sums, stats)
            if self.stops_early(stats["policy/approx_kl"]):
                return k + 1, True
            backward(loss / len(step), inputs.scaler)
        return len(step), False

    def step_advantages(self, batch: Any, step: list[torch.Tensor], inputs: UpdateInputs) -> torch.Tensor:
        """The advantages one optimizer step reads: SB3 normalises those of each optimizer step's
        minibatch; with gradient accumulation that is the union of the accumulated minibatches."""
        advantages = inputs.advantages
        if self.whitens_per_minibatch:
            rows = torch.cat(step).to(advantages.device)
            advantages = advantages.clone()
            advantages[rows] = normalize_minibatch(inputs.advantages[rows], batch.gen_mask[rows])
        return advantages

    def step_per_model(
        self,
        policy: Any,
        optimizer: Any,
        batch: Any,
        step: list[torch.Tensor],
        inputs: UpdateInputs,
        sums: dict[str, float],
    ) -> tuple[int, bool]:
        """One optimizer step with ``algorithm.clip_grad_per_model``: every minibatch's policy pass and
        backward, the policy clipped by its own norm and stepped, its gradients freed; then every
        minibatch's critic pass and backward, the critic clipped and stepped. Why: one norm over both
        models needs both models' gradients at once (SmolLM2-135M fp32: 1 GB); this way only one model's are
        alive. The terms and statistics are :meth:`split_minibatch`'s; the two norms are logged as
        ``policy/grad_norm`` and ``value/grad_norm``. A stopping minibatch (approx-KL) ends the step before
        either model steps, as in the joint path; the critic statistics of the step's minibatches are then
        computed without a graph. Returns (minibatches counted, whether approx-KL stopped the update)."""
        cfg, n = self.cfg, len(step)
        optimizer.zero_grad(set_to_none=True)
        advantages = self.step_advantages(batch, step, inputs)
        lm_params = [p for p in policy.lm.parameters() if p.requires_grad]
        own = {id(p) for p in lm_params}
        critic_params = [p for p in policy.parameters() if p.requires_grad and id(p) not in own]
        kept: list[tuple[torch.Tensor, dict[str, Any]]] = []
        for idx in step:
            idx = idx.to(batch.gen_ids.device)
            terms = self.policy_terms(
                policy, batch, idx, advantages, inputs.temperature, inputs.autocast_dtype, want_values=False
            )
            stop = self.stops_early(terms["pg_stats"]["approx_kl"])
            if not stop:
                backward((terms["pg_loss"] - cfg.ent_coef * terms["entropy"]) / n, inputs.scaler)
            light = {k: terms[k] for k in ("tsl", "mask", "inputs")}
            light["pg_stats"] = {k: v.detach() for k, v in terms["pg_stats"].items()}
            light["pg_loss"], light["entropy"] = terms["pg_loss"].detach(), terms["entropy"].detach()
            del terms
            kept.append((idx, light))
            if stop:
                with torch.no_grad():
                    for i, t in kept:
                        values = critic_values(policy, t["inputs"], inputs.autocast_dtype)
                        add_stats(
                            sums,
                            self.minibatch_stats(t, *self.value_terms(values, batch, i, inputs.returns, t)),
                        )
                return len(kept), True
        gnorm = clip_and_step(lm_params, optimizer, inputs.scaler, cfg.max_grad_norm)
        for p in lm_params:
            p.grad = None
        for idx, t in kept:
            values = critic_values(policy, t["inputs"], inputs.autocast_dtype)
            v_loss, vclip = self.value_terms(values, batch, idx, inputs.returns, t)
            backward(cfg.vf_coef * v_loss / n, inputs.scaler)
            add_stats(sums, self.minibatch_stats(t, v_loss, vclip))
        vnorm = clip_and_step(critic_params, optimizer, inputs.scaler, cfg.max_grad_norm)
        for p in critic_params:
            p.grad = None
        sums["policy/grad_norm"] = sums.get("policy/grad_norm", 0.0) + float(gnorm) * n
        sums["value/grad_norm"] = sums.get("value/grad_norm", 0.0) + float(vnorm) * n
        return n, False

    def stops_early(self, approx_kl: torch.Tensor) -> bool:
        """SB3's approx-KL early stop: this minibatch's KL above 1.5 × ``target_kl``. Every rank must take
        the same branch, so the decision reads the mean over ranks."""
        target = self.cfg.target_kl
        if not target:  # None (or 0): no early stop, and no collective
            return False
        return distributed.all_mean(approx_kl) > 1.5 * target

    def backprops_policy_first(self, policy: Any) -> bool:
        """Whether a minibatch backpropagates the policy's loss before the critic's forward
        (:meth:`split_minibatch`): with a separate critic. Why: one joint loss keeps both trunks'
        activations alive until its backward (estimated ~0.5 GB of SmolLM2's at minibatch 4); the two losses
        share no parameter, so two backward passes give each parameter the gradient the joint one
        would, bit for bit (the same chain of products reaches it)."""
        return getattr(policy, "critic", None) is not None

    def split_minibatch(
        self,
        policy: Any,
        batch: Any,
        idx: torch.Tensor,
        advantages: torch.Tensor,
        inputs: UpdateInputs,
        n: int,
    ) -> tuple[dict[str, torch.Tensor], bool]:
        """One minibatch with a separate critic: the policy's forward, the early-stop check, the policy's
        backward (its activations freed), then the critic's forward and backward. The terms are those of
        :meth:`minibatch_loss` (policy ``pg_loss - ent_coef·entropy``, critic ``vf_coef·value_loss``, each
        over ``n``, the minibatches of the step). A stopping minibatch (counted in the statistics, as
        SB3) is not applied: no backward, and its critic pass runs without a graph (under bf16 on the
        CPU that pass takes SDPA instead of the training attention, so that minibatch's value
        statistics may differ from a graph pass's by rounding; gradients are untouched).
        Returns (the minibatch's statistics, whether approx-KL stopped the update)."""
        cfg = self.cfg
        terms = self.policy_terms(
            policy, batch, idx, advantages, inputs.temperature, inputs.autocast_dtype, want_values=False
        )
        stop = self.stops_early(terms["pg_stats"]["approx_kl"])
        if stop:  # nothing to backpropagate: let the policy's graph go before the critic's pass
            terms["pg_loss"], terms["entropy"] = terms["pg_loss"].detach(), terms["entropy"].detach()
        else:
            backward((terms["pg_loss"] - cfg.ent_coef * terms["entropy"]) / n, inputs.scaler)
        with torch.set_grad_enabled(not stop):
            values = critic_values(policy, terms["inputs"], inputs.autocast_dtype)
            v_loss, vclip = self.value_terms(values, batch, idx, inputs.returns, terms)
        if not stop:
            backward(cfg.vf_coef * v_loss / n, inputs.scaler)
        return self.minibatch_stats(terms, v_loss, vclip), stop


def critic_values(
    policy: Any, inputs: dict[str, torch.Tensor], autocast_dtype: torch.dtype | None
) -> torch.Tensor:
    """A separate critic's values (B, T) for one minibatch's inputs: the pass ``ActorCritic.forward_tokens``
    makes for them (the critic's base model alone, no logits), without the policy's."""
    with autocast(inputs["gen_ids"].device, autocast_dtype):
        return policy.critic_values(inputs)
