"""Pieces the on-policy update loops share: a minibatch's inputs, the backward pass, the clipped
optimizer step and the statistics' bookkeeping. Written once here so that PPO, A2C, TRPO, the group
algorithms and DPO cannot drift apart in the order of gradient sync, unscaling, clipping and stepping.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine import distributed


def minibatch_inputs(batch: Any, idx: torch.Tensor) -> tuple[dict[str, torch.Tensor], slice, Any]:
    """Minibatch inputs without columns that are padding for every selected episode; returns
    (inputs, the generation columns kept, the stored support of those rows and columns)."""
    inputs = batch.model_inputs(idx)
    t_max = max(1, int(inputs["gen_mask"].sum(1).max().item()))
    pm = inputs["prompt_mask"]
    used = (pm.sum(0) > 0).nonzero().flatten()  # causal prompts are left padded, encoder prompts right
    first, last = (int(used.min()), int(used.max()) + 1) if used.numel() else (0, pm.shape[1])
    inputs = {
        "prompt_ids": inputs["prompt_ids"][:, first:last],
        "prompt_mask": pm[:, first:last],
        "gen_ids": inputs["gen_ids"][:, :t_max],
        "gen_mask": inputs["gen_mask"][:, :t_max],
    }
    support = batch.support[idx][:, :t_max] if isinstance(batch.support, torch.Tensor) else batch.support
    return inputs, slice(0, t_max), support


def backward(loss: torch.Tensor, scaler: Any | None) -> None:
    """``loss.backward()``, through fp16's gradient scaler when there is one."""
    (scaler.scale(loss) if scaler is not None else loss).backward()


def clip_and_step(
    params: list[torch.Tensor], optimizer: Any, scaler: Any | None, max_grad_norm: float
) -> torch.Tensor:
    """DDP's gradient mean over ranks, then (fp16) unscaling, clipping to ``max_grad_norm`` and the
    optimizer step; returns the unscaled gradient norm before clipping. The sync comes first so that
    every rank clips and steps on the same gradient; unscaling before clipping so the norm is the true one."""
    distributed.sync_gradients(params)
    if scaler is not None:
        scaler.unscale_(optimizer)
    gnorm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return gnorm


def add_stats(sums: dict[str, float], stats: dict[str, Any]) -> None:
    """Add one minibatch's statistics (tensors or numbers) to the running sums."""
    for k, v in stats.items():
        sums[k] = sums.get(k, 0.0) + float(v)


def finite(stats: dict[str, float]) -> dict[str, float]:
    """The statistics with every infinity turned into NaN (JSON and the charts take NaN as "no value")."""
    return {k: (v if math.isfinite(v) else float("nan")) for k, v in stats.items()}
