"""Log-probs of chosen tokens straight from the last hidden states, without (B, T, V) temporaries.

Why: an update needs only three numbers per generated token from the LM head — the chosen token's
logit, the log-sum-exp over the vocabulary (and, for the ``min_new_tokens`` EOS ban, the EOS logit) —
yet the usual path (``logits = lm_head(h)``, then ``logsumexp``/``gather`` and their autograd
backward) allocates half a dozen fresh (B, T, V) tensors. With SmolLM2's 49k vocabulary and 16 × 48
tokens each is ~150 MB, and on a CPU a fresh buffer of that size costs more in page faults (~45 ms
on the benchmark VM) than the arithmetic done in it (~7 ms in place). :class:`HeadLogits` keeps the
head's input instead of its output; :func:`head_logsumexp` computes the logits once into one buffer,
reduces it in row blocks small enough for the allocator to reuse, and in the backward turns that same
buffer into the gradient in place (``softmax · grad``) before the two matrix products. The chosen and
EOS logits are dot products with single rows of the head's weight, left to ordinary autograd.

Same values as the logits path up to float rounding; used only for a plain bias-free linear head with
fp32 weights (:func:`plain_head_weight`), everything else keeps the logits path. Under autocast
(``compute_dtype`` bf16/fp16) the head's products run in that dtype as autocast's ``nn.Linear`` would,
the logits buffer is kept in it (half the bytes), and each row block is reduced in fp32 — the numbers of
the logits path under autocast (low-precision logits, then ``.float()``), to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# Model types whose causal-LM head is exactly ``hidden @ lm_head.weight.T`` on the base model's last
# hidden state (no bias, scaling or soft-capping); others keep the logits path.
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "gpt2", "mistral", "qwen2", "qwen3", "smollm3"})

# Row blocks of the (N, V) logits reduced at once: ~8 MB of fp32, below glibc's largest mmap threshold
# (32 MB), so each block's temporaries come back from the heap instead of fresh zeroed pages.
_BLOCK_FLOATS = 1 << 21


def plain_head_weight(lm: Any) -> torch.Tensor | None:
    """The weight of ``lm``'s output head when logits are exactly ``hidden @ weight.T`` in fp32 on the
    base model's last hidden state; None otherwise (then callers take the logits path)."""
    config = getattr(lm, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    get = getattr(lm, "get_output_embeddings", None)
    head = get() if get is not None else None
    if type(head) is not nn.Linear or head.bias is not None or head.weight.dtype != torch.float32:
        return None
    if getattr(lm, "base_model", lm) is lm:
        return None
    # The lazy path calls the base model, not ``lm``: hooks on ``lm`` itself would be skipped. FSDP2
    # (resources.strategy fsdp) all-gathers the root group — embeddings, tied head, final norm — in
    # such a hook, and its parameters are sharded DTensors outside it.
    if lm._forward_pre_hooks or lm._forward_hooks or type(head.weight.data) is not torch.Tensor:
        return None
    return head.weight


@dataclass
class HeadLogits:
    """Logits not yet computed: ``hidden @ weight.T`` for hidden (B, T, H); ``compute_dtype`` is the
    autocast dtype the head's product runs in (None: the tensors' own dtype, fp32)."""

    hidden: torch.Tensor
    weight: torch.Tensor
    compute_dtype: torch.dtype | None = None

    def materialize(self) -> torch.Tensor:
        return _product(self.hidden, self.weight, self.compute_dtype)


def _product(hidden: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype | None) -> torch.Tensor:
    """``hidden @ weight.T`` in ``compute_dtype`` (autocast's linear: both operands cast, output in that
    dtype), or in the tensors' dtype; autocast itself is off so the dtype is exactly the one asked for."""
    with torch.autocast(hidden.device.type, enabled=False):
        if compute_dtype is None:
            return hidden @ weight.t()
        return hidden.to(compute_dtype) @ weight.to(compute_dtype).t()


class _HeadLogSumExp(torch.autograd.Function):
    """log-sum-exp over the vocabulary of ``(hidden @ weight.T) * scale``, row by row, and (no
    gradient) the entropy of that distribution. The logits buffer is kept for the backward, which
    overwrites it with the gradient of the logits. With a ``compute_dtype`` (autocast) the buffer and
    both products are in that dtype and each row block is reduced in fp32."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        scale: float,
        want_entropy: bool,
        compute_dtype: torch.dtype | None,
    ):
        low = compute_dtype is not None and compute_dtype != torch.float32
        h = hidden.to(compute_dtype) if low else hidden
        w = weight.to(compute_dtype) if low else weight
        with torch.autocast(hidden.device.type, enabled=False):
            x = h @ w.t()  # (N, V): the only (N, V) allocation of forward and backward
        if scale != 1.0 and not low:
            x.mul_(scale)
        n, v = x.shape
        lse = torch.empty(n, dtype=torch.float32 if low else x.dtype, device=x.device)
        entropy = torch.empty_like(lse) if want_entropy else None
        step = max(1, _BLOCK_FLOATS // max(v, 1))
        for r in range(0, n, step):
            xb = x[r : r + step]
            if low:  # the block in fp32, as the logits path's ``.float()`` of low-precision logits
                xb = xb.float()
                if scale != 1.0:
                    xb.mul_(scale)
            m = xb.amax(dim=-1, keepdim=True)
            e = torch.sub(xb, m).exp_()
            s = e.sum(dim=-1)
            lse[r : r + step] = m.squeeze(-1) + s.log()
            if entropy is not None:
                # H = lse - sum_v p_v x_v, as a batched dot product (no product buffer)
                ex = (e.unsqueeze(-2) @ xb.unsqueeze(-1)).squeeze(-1).squeeze(-1)
                entropy[r : r + step] = lse[r : r + step] - ex / s
        ctx.save_for_backward(hidden, weight, lse)
        ctx.operands = (h, w) if low else None  # the low-precision copies the backward multiplies with
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.low = low
        ctx.logits = x
        ctx.scale = scale
        if entropy is None:
            entropy = torch.zeros(0, dtype=lse.dtype, device=x.device)
        ctx.mark_non_differentiable(entropy)
        return lse, entropy

    @staticmethod
    def backward(ctx: Any, grad_lse: torch.Tensor, _grad_entropy: Any):
        hidden, weight, lse = ctx.saved_tensors
        x = ctx.logits
        if x is None:
            raise RuntimeError("head_logsumexp's backward runs once (its logits buffer becomes the gradient)")
        ctx.logits = None
        if ctx.operands is not None:
            hidden, weight = ctx.operands
            ctx.operands = None
        # d lse / d x = softmax(x); d x / d (hidden @ W.T) = scale
        g = (grad_lse * ctx.scale).unsqueeze(-1)
        if ctx.low:  # fp32 per row block, written back into the low-precision buffer
            step = max(1, _BLOCK_FLOATS // max(x.shape[1], 1))
            for r in range(0, x.shape[0], step):
                xb = x[r : r + step].float()
                if ctx.scale != 1.0:
                    xb.mul_(ctx.scale)
                x[r : r + step].copy_(xb.sub_(lse[r : r + step].unsqueeze(-1)).exp_().mul_(g[r : r + step]))
        else:
            x.sub_(lse.unsqueeze(-1)).exp_().mul_(g)
        with torch.autocast(x.device.type, enabled=False):
            grad_hidden = (x @ weight).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
            grad_weight = (x.t() @ hidden).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None


def head_logsumexp(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    scale: float = 1.0,
    want_entropy: bool = False,
    compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-sum-exp, entropy or None) over the vocabulary for each row of ``hidden`` (..., H); the
    logits are ``(hidden @ weight.T) * scale``, the product in ``compute_dtype`` where given (autocast),
    the reduction in fp32. Differentiable in ``hidden`` and ``weight``."""
    lead = hidden.shape[:-1]
    lse, entropy = _HeadLogSumExp.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, scale, want_entropy, compute_dtype
    )
    return lse.view(lead), (entropy.view(lead) if want_entropy else None)


def head_logits_at(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor | int,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The logit of ``tokens`` (same leading shape as ``hidden`` without H, or one token id for every
    row) as a dot product with single rows of the head's weight: no (B, T, V) tensor. With a
    ``compute_dtype`` (autocast) the operands and the result are rounded to it as autocast's linear
    rounds them, so the chosen logit and :func:`head_logsumexp` see the same logits."""
    rows = weight[tokens]
    if compute_dtype is None or compute_dtype == torch.float32:
        return hidden @ rows if isinstance(tokens, int) else (hidden * rows).sum(-1)
    h, w = hidden.to(compute_dtype).float(), rows.to(compute_dtype).float()
    out = h @ w if isinstance(tokens, int) else (h * w).sum(-1)
    return out.to(compute_dtype).float()
