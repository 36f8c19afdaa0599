"""TRPO (Schulman et al. 2015) as RL4LMs runs it: SB3-contrib's TRPO on the token MDP.

Per rollout: (1) the surrogate gradient ``g`` of ``mean(A * pi/pi_old)``; (2) the step direction
``x ~ F^-1 g`` by conjugate gradient, where ``F v`` is the Hessian-vector product of the mean
per-token ``KL(pi || pi_old)`` (the Fisher matrix at ``pi = pi_old``) plus ``cg_damping * v``;
(3) the largest step ``sqrt(2 target_kl / x.Fx) * x`` of the quadratic model, shrunk by
``line_search_shrinking_factor`` until the true mean KL is below ``target_kl`` *and* the surrogate
improved, or reverted after ``line_search_max_iter`` tries; (4) the value function regressed
separately (``n_critic_updates`` epochs of minibatch MSE steps with the trainer's optimizer) while
the policy's parameters stay fixed. Defaults are SB3-contrib's (RL4LMs passes them through).

The actor is the LM's parameters. With ``model.value_head: shared`` the trunk belongs to the actor,
so the critic update moves only the value head (SB3-contrib drops the gradients of parameters shared
with the actor, "otherwise it defeats the purpose of the KL constraint"); a separate critic is fitted
whole. Both the KL and the surrogate use the distribution actually sampled from (temperature, top-k,
top-p, NLPO mask: the rollout's stored support), and both steps run with dropout off, so the line
search compares the exact same function it measured (RL4LMs's policy also stays in eval mode). That
KL is over the *rollout's* support: tokens outside it can still enter the next rollout's top-k, which
no KL of the two distributions bounds (docs/engine.md, "TRPO", measures it on the tiny GPT-2).

Second derivatives need attention kernels that support double backward: the natural-gradient
forward runs under PyTorch's math SDPA kernel. The whole (sub-sampled) batch is one graph, as in
SB3-contrib: memory grows with ``train.prompts_per_iter / trpo.sub_sampling_factor``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine import distributed
from engine.algorithms.base import ActorCriticAlgorithm, UpdateInputs
from engine.algorithms.common import backward, minibatch_inputs
from engine.algorithms.ppo import masked_mean
from engine.models.policy import entropy_from_logprobs, gather_logprobs, processed_logprobs
from engine.models.precision import autocast
from engine.registry import algorithms

_LOG_ZERO = -1e30  # excluded tokens (-inf) clamp here: p = 0 there, and log p - log q = 0, never NaN


def flat_grad(y: torch.Tensor, params: list[torch.Tensor], **kwargs: Any) -> torch.Tensor:
    """d y / d params as one flat vector (zeros for parameters y does not depend on)."""
    grads = torch.autograd.grad(y, params, allow_unused=True, **kwargs)
    return torch.cat(
        [(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)]
    )


def _rank_mean_vector(v: torch.Tensor) -> torch.Tensor:
    """A flat gradient averaged over ranks (itself for one process)."""
    if not distributed.is_active():
        return v
    return distributed.all_sum(v) / distributed.current().world_size


def mean_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over valid tokens of the exact KL(new || old) of two (B, T, V) log-prob tensors."""
    new, old = logp.clamp(min=_LOG_ZERO), old_logp.clamp(min=_LOG_ZERO)
    return masked_mean((new.exp() * (new - old)).sum(-1), mask)


def conjugate_gradient(
    matvec: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    max_steps: int,
    residual_tol: float = 1e-10,
) -> torch.Tensor:
    """Approximate solution of ``A x = b`` for symmetric positive definite ``A`` given as ``matvec``."""
    x = torch.zeros_like(b)
    r, p = b.clone(), b.clone()
    rr = r @ r
    for _ in range(max_steps):
        if rr < residual_tol:
            break
        ap = matvec(p)
        alpha = rr / (p @ ap)
        x += alpha * p
        r -= alpha * ap
        rr_new = r @ r
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def backtracking_line_search(
    evaluate: Callable[[float], tuple[float, float]],
    objective_before: float,
    target_kl: float,
    shrink: float,
    max_iter: int,
) -> dict[str, float]:
    """Try step fractions 1, shrink, shrink^2, ...; accept the first with KL < target and a better objective.

    ``evaluate(fraction)`` applies that fraction of the full step and returns ``(objective, kl)``.
    """
    fraction, first_kl = 1.0, float("nan")
    for i in range(max_iter):
        objective, kl = evaluate(fraction)
        if i == 0:
            first_kl = kl
        if kl < target_kl and objective > objective_before:
            return {
                "accepted": 1.0,
                "fraction": fraction,
                "tries": i + 1,
                "kl": kl,
                "objective": objective,
                "full_step_kl": first_kl,
            }
        fraction *= shrink
    return {
        "accepted": 0.0,
        "fraction": 0.0,
        "tries": max_iter,
        "kl": 0.0,
        "objective": objective_before,
        "full_step_kl": first_kl,
    }


def _set_flat(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    with torch.no_grad():
        i = 0
        for p in params:
            p.copy_(flat[i : i + p.numel()].view_as(p))
            i += p.numel()


@algorithms.register(
    "trpo", "Trust Region Policy Optimization (RL4LMs/SB3-contrib TRPO), critic fitted apart."
)
class TRPO(ActorCriticAlgorithm):
    grads_from_backward = False  # the policy's gradient comes from torch.autograd.grad (Fisher products)

    def setup(self, policy: Any) -> None:
        if getattr(policy.lm, "is_gradient_checkpointing", False):
            raise ValueError(
                "algorithm.id 'trpo' needs second derivatives (Fisher-vector products), which gradient "
                "checkpointing does not support: set model.gradient_checkpointing: false"
            )

    def learn(self, policy: Any, optimizer: Any, batch: Any, inputs: UpdateInputs) -> dict[str, float]:
        """One natural-gradient policy step, then the critic's regression with the policy fixed."""
        actor = [p for p in policy.lm.parameters() if p.requires_grad]
        was_training = policy.training
        policy.eval()  # no dropout: the line search must evaluate the function it linearised
        try:
            stats = self.policy_step(
                policy, actor, batch, inputs.advantages, inputs.temperature, inputs.autocast_dtype
            )
            stats["loss/value"] = self.critic_step(policy, actor, optimizer, batch, inputs)
        finally:
            policy.train(was_training)
        stats["policy/n_updates"] = 1.0
        return stats

    def policy_step(
        self,
        policy: Any,
        actor: list[torch.Tensor],
        batch: Any,
        advantages: torch.Tensor,
        temperature: float,
        autocast_dtype: torch.dtype | None,
    ) -> dict[str, float]:
        """Conjugate-gradient direction on the Fisher of the mean KL, then the backtracking line search."""
        t = self.cfg.trpo
        idx = torch.arange(0, len(batch), t.sub_sampling_factor, device=batch.gen_ids.device)
        inputs, tsl, support = minibatch_inputs(batch, idx)
        mask, old_lp, adv = inputs["gen_mask"], batch.logprobs[idx][:, tsl], advantages[idx][:, tsl]
        stats: dict[str, float] = {}

        def policy_terms() -> tuple[torch.Tensor, torch.Tensor]:
            """(B, T, V) log-probs of the sampled distribution and the surrogate mean(A * pi / pi_old)."""
            with sdpa_kernel(SDPBackend.MATH), autocast(inputs["gen_ids"].device, autocast_dtype):
                logits, _ = policy.forward_tokens(inputs, want_values=False)
            if "policy/entropy" not in stats:  # of the full tempered distribution, as the KL penalty's
                with torch.no_grad():
                    full = processed_logprobs(logits, temperature, None)
                    stats["policy/entropy"] = float(masked_mean(entropy_from_logprobs(full), mask))
            logp_all = processed_logprobs(logits, temperature, support)
            # Padding columns are left out before the exp, not after: a pad outside the stored support
            # has log-prob -inf, and exp(-inf - x) * 0 or -inf * 0 would make g NaN (no step at all).
            valid = mask > 0
            new_lp = torch.where(valid, gather_logprobs(logp_all, inputs["gen_ids"]), 0.0)
            ratio = torch.exp(new_lp - torch.where(valid, old_lp, 0.0))
            return logp_all, masked_mean(adv * ratio, mask)

        logp_all, objective = policy_terms()
        old_logp_all = logp_all.detach()
        direction, max_step = self.natural_step(actor, objective, logp_all, old_logp_all, mask)
        before = torch.cat([p.detach().reshape(-1) for p in actor])

        def evaluate(fraction: float) -> tuple[float, float]:
            _set_flat(actor, before + fraction * max_step * direction)
            with torch.no_grad():
                new_logp_all, new_objective = policy_terms()
                new_kl = mean_kl(new_logp_all, old_logp_all, mask)
                return distributed.all_mean(new_objective), distributed.all_mean(new_kl)

        if max_step > 0.0:
            search = backtracking_line_search(
                evaluate,
                distributed.all_mean(objective.detach()),
                t.target_kl,
                t.line_search_shrinking_factor,
                t.line_search_max_iter,
            )
        else:  # no direction (e.g. every advantage 0): nothing to search
            search = dict(
                accepted=0.0,
                fraction=0.0,
                tries=0,
                kl=0.0,
                objective=float(objective.detach()),
                full_step_kl=0.0,
            )
        if not search["accepted"]:
            _set_flat(actor, before)  # no acceptable step: keep the rollout policy
        return {
            "policy/objective": search["objective"],
            "policy/kl": search["kl"],
            "policy/full_step_kl": search["full_step_kl"],
            "policy/line_search_success": search["accepted"],
            "policy/line_search_tries": float(search["tries"]),
            "policy/step_fraction": search["fraction"],
            "policy/max_step": max_step,
            **stats,
        }

    def natural_step(
        self,
        actor: list[torch.Tensor],
        objective: torch.Tensor,
        logp_all: torch.Tensor,
        old_logp_all: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, float]:
        """(direction ``x ~ F^-1 g``, the largest step ``sqrt(2 target_kl / x.Fx)`` along it).

        Distributed: the gradient and every Fisher-vector product are averaged over ranks (the Fisher
        of the whole batch's mean KL), so every rank computes the same direction."""
        t = self.cfg.trpo
        g = _rank_mean_vector(flat_grad(objective, actor, retain_graph=True))
        grad_kl = flat_grad(mean_kl(logp_all, old_logp_all, mask), actor, create_graph=True)

        def fisher_vector(v: torch.Tensor) -> torch.Tensor:
            fv = _rank_mean_vector(flat_grad(grad_kl @ v, actor, retain_graph=True))
            return fv + t.cg_damping * v

        direction = conjugate_gradient(fisher_vector, g, t.cg_max_steps)
        curvature = float(direction @ fisher_vector(direction))
        max_step = (
            math.sqrt(2 * t.target_kl / curvature) if curvature > 0 and math.isfinite(curvature) else 0.0
        )
        return direction, max_step

    def critic_step(
        self, policy: Any, actor: list[torch.Tensor], optimizer: Any, batch: Any, inputs: UpdateInputs
    ) -> float:
        """``n_critic_updates`` epochs of minibatch MSE(V, R) steps; returns the mean value loss."""
        cfg = self.cfg
        losses = []
        for p in actor:
            p.requires_grad_(False)  # no graph through the actor: a shared trunk stays as it is
        try:
            for _epoch in range(cfg.trpo.n_critic_updates):
                perm = torch.randperm(len(batch), generator=inputs.generator).to(batch.gen_ids.device)
                for chunk in perm.split(cfg.minibatch_size):
                    mb, tsl, _ = minibatch_inputs(batch, chunk)
                    with autocast(mb["gen_ids"].device, inputs.autocast_dtype):
                        _, values = policy.forward_tokens(mb, want_values=True)
                    loss = masked_mean((values.float() - inputs.returns[chunk][:, tsl]) ** 2, mb["gen_mask"])
                    optimizer.zero_grad(set_to_none=True)
                    backward(loss, inputs.scaler)
                    distributed.sync_gradients([p for p in policy.parameters() if p.requires_grad])
                    if inputs.scaler is not None:
                        inputs.scaler.step(optimizer)
                        inputs.scaler.update()
                    else:
                        optimizer.step()
                    losses.append(float(loss.detach()))
        finally:
            for p in actor:
                p.requires_grad_(True)
            optimizer.zero_grad(set_to_none=True)
        return sum(losses) / len(losses) if losses else float("nan")
