"""Log-probs of chosen tokens straight from the last hidden states, without (B, T, V) temporaries.

Why: an update needs only three numbers per generated token from the LM head — the chosen token's
logit, the log-sum-exp over the vocabulary (and, for the ``min_new_tokens`` EOS ban, the EOS logit) —
yet the usual path (``logits = lm_head(h)``, then ``logsumexp``/``gather`` and their autograd
backward) allocates half a dozen fresh (B, T, V) tensors. With SmolLM2's 49k vocabulary and 16 × 48
tokens each is ~150 MB, and on a CPU a fresh buffer of that size costs more in page faults (~45 ms
on the benchmark VM) than the arithmetic done in it (~7 ms in place). :class:`HeadLogits` keeps the
head's input instead of its output; :func:`head_token_logits` computes the logits once into one buffer,
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


class _HeadTokenLogits(torch.autograd.Function):
    """log-sum-exp over the vocabulary of ``(hidden @ weight.T) * scale`` row by row, the (scaled)
    logit of each row's token and, optionally, of one fixed token (EOS) in every row, and (no
    gradient) the entropy. The logits buffer is kept for the backward, which overwrites it with the
    gradient of the logits (``softmax · g_lse`` plus the chosen and EOS tokens' gradients scattered into
    it) before the two matrix products. Why the chosen logits are read here rather than as dot products
    with rows of ``weight``: the backward of such an indexing is a zeroed (V, H) gradient per index —
    113 MB for SmolLM2, fresh pages each time — plus an add into the head's gradient; folding them into
    the logits gradient leaves one (V, H) gradient per minibatch. With a ``compute_dtype`` (autocast)
    the buffer and both products are in that dtype and each row block is reduced in fp32."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        tokens: torch.Tensor | None,
        eos_id: int | None,
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

        def read(column: torch.Tensor) -> torch.Tensor:
            # the logits path's numbers: a low-precision logit, then ``.float()``, then the scale
            return column.float() * scale if low else column.clone()

        empty = torch.zeros(0, dtype=torch.float32, device=x.device)
        chosen = read(x.gather(1, tokens.view(n, 1)).view(n)) if tokens is not None else empty
        eos = read(x[:, eos_id]) if eos_id is not None else empty
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
        ctx.save_for_backward(hidden, weight, lse, tokens if tokens is not None else empty)
        ctx.operands = (h, w) if low else None  # the low-precision copies the backward multiplies with
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.low = low
        ctx.logits = x
        ctx.scale = scale
        ctx.has_tokens = tokens is not None
        ctx.eos_id = eos_id
        if entropy is None:
            entropy = empty
        ctx.mark_non_differentiable(entropy)
        return lse, chosen, eos, entropy

    @staticmethod
    def backward(ctx: Any, grad_lse: torch.Tensor, grad_chosen: Any, grad_eos: Any, _grad_entropy: Any):
        hidden, weight, lse, tokens = ctx.saved_tensors
        x = ctx.logits
        if x is None:
            raise RuntimeError("the fused head's backward runs once (its logits buffer becomes the gradient)")
        ctx.logits = None
        if ctx.operands is not None:
            hidden, weight = ctx.operands
            ctx.operands = None
        # d lse / d x = softmax(x); d chosen / d x = one-hot; d x / d (hidden @ W.T) = scale
        g = (grad_lse * ctx.scale).unsqueeze(-1)
        n = x.shape[0]

        def add_tokens(block: torch.Tensor, r: int) -> None:
            rows = slice(r, r + block.shape[0])
            if ctx.has_tokens and grad_chosen is not None:
                idx = tokens[rows].view(-1, 1)
                block.scatter_add_(1, idx, (grad_chosen[rows] * ctx.scale).view(-1, 1).to(block.dtype))
            if ctx.eos_id is not None and grad_eos is not None:
                block[:, ctx.eos_id] += (grad_eos[rows] * ctx.scale).to(block.dtype)

        if ctx.low:  # fp32 per row block, written back into the low-precision buffer
            step = max(1, _BLOCK_FLOATS // max(x.shape[1], 1))
            for r in range(0, n, step):
                xb = x[r : r + step].float()
                if ctx.scale != 1.0:
                    xb.mul_(ctx.scale)
                xb.sub_(lse[r : r + step].unsqueeze(-1)).exp_().mul_(g[r : r + step])
                add_tokens(xb, r)
                x[r : r + step].copy_(xb)
        else:
            x.sub_(lse.unsqueeze(-1)).exp_().mul_(g)
            add_tokens(x, 0)
        with torch.autocast(x.device.type, enabled=False):
            grad_hidden = (x @ weight).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
            grad_weight = (x.t() @ hidden).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None, None, None


def head_token_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor | None,
    scale: float = 1.0,
    want_entropy: bool = False,
    compute_dtype: torch.dtype | None = None,
    eos_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(log-sum-exp, chosen logit or None, EOS logit or None, entropy or None) for each row of
    ``hidden`` (..., H); the logits are ``(hidden @ weight.T) * scale``, the product in
    ``compute_dtype`` where given (autocast), the reduction in fp32; ``tokens`` has ``hidden``'s
    leading shape. Differentiable in ``hidden`` and ``weight`` through all three logit outputs."""
    lead = hidden.shape[:-1]
    flat_tokens = tokens.reshape(-1) if tokens is not None else None
    lse, chosen, eos, entropy = _HeadTokenLogits.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, flat_tokens, eos_id, scale, want_entropy, compute_dtype
    )
    return (
        lse.view(lead),
        chosen.view(lead) if tokens is not None else None,
        eos.view(lead) if eos_id is not None else None,
        entropy.view(lead) if want_entropy else None,
    )
