"""Supervised fine-tuning on task references (warm start, or algorithm id "sft" on its own).

For causal models the prompt tokens are excluded from the loss: the model learns to continue the
prompt with the reference, not to reproduce the prompt.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from engine.algorithms.base import SupervisedAlgorithm
from engine.registry import algorithms


@algorithms.register("sft", "Supervised fine-tuning on the task's references only (no RL).")
class SFT(SupervisedAlgorithm):
    """The trainer's supervised phase does the work (``sft_loss`` below); nothing to declare."""


def sft_pairs(samples: list[Any]) -> list[tuple[str, str]]:
    """One (prompt, reference) pair per reference; samples without references are skipped."""
    return [(s.prompt, ref) for s in samples for ref in s.references if ref]


def sft_schedule(
    n_pairs: int, batch_size: int, epochs: float, seed: int, max_steps: int | None
) -> list[list[int]]:
    """Deterministic batches of pair indices: a fresh shuffle per epoch, so a resumed run sees the same order."""
    total = max(1, int(round(n_pairs * epochs)))
    order: list[int] = []
    epoch = 0
    while len(order) < total:
        perm = list(range(n_pairs))
        random.Random(seed * 1000003 + epoch).shuffle(perm)
        order.extend(perm)
        epoch += 1
    order = order[:total]
    batches = [order[i : i + batch_size] for i in range(0, total, batch_size)]
    if max_steps is not None:
        batches = batches[:max_steps]
    return batches


def build_sft_batch(
    tokenizer: Any,
    pairs: list[tuple[str, str]],
    is_seq2seq: bool,
    max_prompt_length: int,
    max_target_length: int,
    device: Any,
) -> dict[str, torch.Tensor]:
    """Tensors for one SFT step; labels are -100 on prompt and padding positions."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    prompts = [p if p else (tokenizer.bos_token or tokenizer.eos_token or "") for p, _ in pairs]
    targets = [
        tokenizer(t, add_special_tokens=False)["input_ids"][: max_target_length - 1] + [eos] for _, t in pairs
    ]
    if is_seq2seq:
        enc = tokenizer(
            prompts, padding=True, truncation=True, max_length=max_prompt_length, return_tensors="pt"
        )
        t_len = max(len(t) for t in targets)
        labels = torch.full((len(targets), t_len), -100, dtype=torch.long)
        for i, t in enumerate(targets):
            labels[i, : len(t)] = torch.tensor(t)
        return {
            "input_ids": enc["input_ids"].to(device),
            "attention_mask": enc["attention_mask"].to(device),
            "labels": labels.to(device),
        }
    rows, label_rows = [], []
    for p, t in zip(prompts, targets):
        p_ids = tokenizer(p, add_special_tokens=True)["input_ids"]
        if tokenizer.truncation_side == "left":
            p_ids = p_ids[-max_prompt_length:]
        else:
            p_ids = p_ids[:max_prompt_length]
        rows.append(p_ids + t)
        label_rows.append([-100] * len(p_ids) + t)
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, label_rows)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
        labels[i, : len(lab)] = torch.tensor(lab)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def sft_loss(lm: Any, is_seq2seq: bool, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean token cross-entropy of the references (prompt tokens excluded)."""
    if is_seq2seq:
        labels = batch["labels"]
        start = lm.config.decoder_start_token_id
        if start is None:
            start = lm.config.pad_token_id
        dec_in = torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1].clamp(min=0)], dim=1)
        dec_mask = torch.cat([torch.ones_like(labels[:, :1]), (labels[:, :-1] != -100).long()], dim=1)
        out = lm(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=dec_in,
            decoder_attention_mask=dec_mask,
            use_cache=False,
        )
        logits = out.logits
        target = labels
    else:
        mask = batch["attention_mask"]
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = lm(input_ids=batch["input_ids"], attention_mask=mask, position_ids=pos, use_cache=False)
        logits = out.logits[:, :-1]
        target = batch["labels"][:, 1:]
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100
    )
