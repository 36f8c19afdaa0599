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
    every rank clips and steps on the same gradient; unscaling before clipping so the norm is the true one.
    A fused Adam(W) takes the clip inside its step (:func:`clip_inside_step`): no separate scaling pass."""
    distributed.sync_gradients(params)
    if scaler is None and folds_clip(optimizer, params):
        return clip_inside_step(params, optimizer, max_grad_norm)
    if scaler is not None:
        scaler.unscale_(optimizer)
    gnorm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return gnorm


def folds_clip(optimizer: Any, params: list[torch.Tensor]) -> bool:
    """Whether the clip can ride in ``optimizer``'s step: a fused ``torch.optim.Adam``/``AdamW`` (whose
    kernel divides each gradient by its ``grad_scale`` tensor in the same pass that reads it), fp32
    gradients (the kernel rounds the divisor to the parameter's dtype), and no scale already set (an
    fp16 ``GradScaler`` uses the same slot)."""
    if not isinstance(optimizer, torch.optim.Adam) or getattr(optimizer, "grad_scale", None) is not None:
        return False
    if not all(g.get("fused") for g in optimizer.param_groups):
        return False
    return all(p.grad is None or p.grad.dtype == torch.float32 for p in params)


def clip_inside_step(params: list[torch.Tensor], optimizer: Any, max_grad_norm: float) -> torch.Tensor:
    """``clip_grad_norm_(params, max_grad_norm)`` then ``optimizer.step()``, with the scaling pass folded
    into the fused step. Why: with a separate critic the gradients are 1 GB; clipping read them once for
    the norm and then read and wrote them again to scale them, on every optimizer step.

    The norm is torch's own (``get_total_norm``: one foreach reduction per device and dtype) and the
    coefficient SB3's and RL4LMs's, c = min(1, max_norm / (norm + 1e-6)). The fused kernel divides each
    gradient by ``grad_scale`` = 1 / c and writes the result back into ``.grad`` before Adam's moments
    and (Adam's coupled) weight decay read it; AdamW's decoupled decay does not read the gradient. So the
    step is the clipped step up to rounding (g / (1/c) instead of g · c; bitwise when c = 1), and a
    non-finite norm makes the same NaN/zero gradients as the multiplication. ``found_inf`` stays unset:
    the step is never skipped, as with ``clip_grad_norm_``. Returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        optimizer.step()
        return torch.tensor(0.0)
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    coef = torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0)
    optimizer.grad_scale = torch.reciprocal(coef).to(torch.float32)
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale
    return norm


def add_stats(sums: dict[str, float], stats: dict[str, Any]) -> None:
    """Add one minibatch's statistics (tensors or numbers) to the running sums."""
    for k, v in stats.items():
        sums[k] = sums.get(k, 0.0) + float(v)


def finite(stats: dict[str, float]) -> dict[str, float]:
    """The statistics with every infinity turned into NaN (JSON and the charts take NaN as "no value")."""
    return {k: (v if math.isfinite(v) else float("nan")) for k, v in stats.items()}
