"""DPO and IPO: offline preference optimisation from (prompt, chosen, rejected) pairs.

No rollout and no reward model: the policy is pushed to raise the log-probability of the chosen
response relative to the rejected one, measured against a frozen reference (the starting policy;
with LoRA, the same model with its adapter disabled). Definitions follow Rafailov et al. (DPO),
Azar et al. (IPO) and TRL's ``DPOTrainer``:

- implicit reward of a response: ``beta * (log pi(y|x) - log pi_ref(y|x))``;
- ``h = (log pi(y_c) - log pi_ref(y_c)) - (log pi(y_r) - log pi_ref(y_r))``;
- sigmoid (DPO): ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)`` on summed token log-probs;
- IPO: ``(h - 1 / (2 beta))^2`` on per-token mean log-probs (TRL averages over the response for IPO).

Each iteration takes ``train.prompts_per_iter`` pairs (the trainer's seeded per-epoch order, so a
resume continues the same sequence) and makes one optimizer step, accumulating gradients over
chunks of ``algorithm.minibatch_size`` pairs. It reads the trainer only through
:class:`engine.algorithms.base.TrainerView`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F

from engine import distributed
from engine.algorithms.base import OfflinePreferenceAlgorithm, TrainerView
from engine.algorithms.common import backward, clip_and_step
from engine.registry import algorithms


def response_batch(
    tokenizer: Any,
    prompts: list[str],
    responses: list[str],
    is_seq2seq: bool,
    max_prompt_length: int,
    max_response_length: int,
    device: Any,
) -> dict[str, torch.Tensor]:
    """Prompt and response tensors laid out exactly as rollouts lay out prompt and generation, so the
    same teacher-forced pass (``lm_forward``) scores a preference pair and a sampled episode alike."""
    from engine.rollout import prompt_padding_side, tokenize_prompts

    prompt_ids, prompt_mask = tokenize_prompts(
        tokenizer, prompts, max_prompt_length, device, padding_side=prompt_padding_side(is_seq2seq)
    )
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    rows = [
        tokenizer(r, add_special_tokens=False)["input_ids"][:max_response_length] + [eos] for r in responses
    ]
    length = max(len(r) for r in rows)
    gen_ids = torch.full((len(rows), length), pad, dtype=torch.long)
    gen_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        gen_ids[i, : len(r)] = torch.tensor(r)
        gen_mask[i, : len(r)] = 1
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "gen_ids": gen_ids.to(device),
        "gen_mask": gen_mask.to(device),
    }


def sequence_logps(
    lm: Any, is_seq2seq: bool, decoder_start_id: Any, batch: dict[str, torch.Tensor], average: bool = False
) -> torch.Tensor:
    """log pi(response | prompt) per row: the sum (or, ``average``, the mean) of its tokens' log-probs."""
    from engine.models.policy import lm_forward

    logits, _ = lm_forward(
        lm,
        is_seq2seq,
        batch["prompt_ids"],
        batch["prompt_mask"],
        batch["gen_ids"],
        batch["gen_mask"],
        decoder_start_id,
        want_hidden=False,
    )
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch["gen_ids"].unsqueeze(-1)).squeeze(-1)
    mask = batch["gen_mask"].to(logp.dtype)
    total = (logp * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1.0) if average else total


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair losses and the implicit rewards of chosen and rejected (detached)."""
    chosen_ratio = policy_chosen - ref_chosen
    rejected_ratio = policy_rejected - ref_rejected
    h = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"algorithm.dpo.loss_type: unknown loss {loss_type!r}; use 'sigmoid' or 'ipo'")
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


def reference_context(policy: Any, ref_lm: Any | None) -> tuple[Any, Any]:
    """(model, context-manager factory) that scores under the reference: the frozen copy when there is one,
    else the policy itself with its LoRA adapter switched off (no second copy in memory)."""
    if ref_lm is not None:
        return ref_lm, contextlib.nullcontext
    from engine.models.lora import adapter_disabled, is_lora

    if not is_lora(policy.lm):
        raise RuntimeError("DPO needs a reference model: a frozen copy of the start policy or a LoRA adapter")
    return policy.lm, lambda: adapter_disabled(policy.lm)


@algorithms.register("dpo", "DPO / IPO: offline preference optimisation on (prompt, chosen, rejected) pairs.")
class DPO(OfflinePreferenceAlgorithm):
    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.dpo = cfg.dpo

    def pair_logps(
        self,
        lm: Any,
        policy: Any,
        tokenizer: Any,
        samples: list[Any],
        max_prompt_length: int,
        device: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) log-probs of a chunk: one concatenated forward of 2N rows, as TRL."""
        prompts = [s.prompt for s in samples] * 2
        responses = [s.meta["chosen"] for s in samples] + [s.meta["rejected"] for s in samples]
        batch = response_batch(
            tokenizer,
            prompts,
            responses,
            policy.is_seq2seq,
            max_prompt_length,
            self.dpo.max_response_length,
            device,
        )
        logps = sequence_logps(
            lm, policy.is_seq2seq, policy.decoder_start_id, batch, average=self.dpo.loss_type == "ipo"
        )
        n = len(samples)
        return logps[:n], logps[n:]

    def offline_iteration(self, trainer: TrainerView) -> dict[str, float]:
        """One optimizer step on the iteration's pairs; returns its metrics (the trainer logs them)."""
        cfg = trainer.cfg
        samples = trainer.prompts_for(trainer.iteration)
        lo, hi = distributed.share(len(samples), "train.prompts_per_iter")  # this rank's pairs
        samples = samples[lo:hi]
        for s in samples:
            if "chosen" not in s.meta or "rejected" not in s.meta:
                raise ValueError(
                    f"algorithm 'dpo' needs preference pairs, but task {cfg.task.id!r} sample {s.id!r} has no "
                    "chosen/rejected: use task.id 'preference_pairs' with task.args.path"
                )
        policy, opt = trainer.policy, trainer.optimizer
        policy.train()
        opt.zero_grad(set_to_none=True)
        chunk = max(1, cfg.algorithm.minibatch_size)
        parts: dict[str, list[torch.Tensor]] = {"loss": [], "chosen": [], "rejected": []}
        ref_model, ref_ctx = reference_context(policy, trainer.ref_lm)
        for start in range(0, len(samples), chunk):
            part = samples[start : start + chunk]
            args = (policy, trainer.tokenizer, part, cfg.tokenizer.max_prompt_length, trainer.device)
            with torch.no_grad(), ref_ctx(), trainer.autocast():
                ref_c, ref_r = self.pair_logps(ref_model, *args)
            with trainer.autocast():
                pol_c, pol_r = self.pair_logps(policy.lm, *args)
            losses, r_c, r_r = dpo_loss(
                pol_c, pol_r, ref_c, ref_r, self.dpo.beta, self.dpo.loss_type, self.dpo.label_smoothing
            )
            # the step's gradient is that of the mean over all pairs
            backward(losses.sum() / len(samples), trainer.scaler)
            parts["loss"].append(losses.detach())
            parts["chosen"].append(r_c)
            parts["rejected"].append(r_r)
        params = [p for p in policy.parameters() if p.requires_grad]
        # DDP's mean over ranks (equal shares: the global mean)
        grad_norm = clip_and_step(params, opt, trainer.scaler, cfg.algorithm.max_grad_norm)
        opt.zero_grad(set_to_none=True)
        losses = distributed.gather_rows(torch.cat(parts["loss"]))
        chosen = distributed.gather_rows(torch.cat(parts["chosen"]))
        rejected = distributed.gather_rows(torch.cat(parts["rejected"]))
        return {
            "train/loss": float(losses.mean()),
            "rewards/chosen": float(chosen.mean()),
            "rewards/rejected": float(rejected.mean()),
            "rewards/margin": float((chosen - rejected).mean()),
            "rewards/accuracy": float((chosen > rejected).float().mean()),
            "train/grad_norm": float(grad_norm),
        }
