"""Attention for training under bf16 autocast on a CPU: scaled dot-product attention in fp32.

Why: PyTorch's CPU flash-attention kernel is fast forward in bf16 but its bf16 backward is not. A
torch.profiler trace of one PPO epoch of SmolLM2-135M with a separate critic (bf16 autocast on an Intel
Xeon with AMX, docs/benchmarks.md) spent 3.1 s of 17.7 CPU-s in
``_scaled_dot_product_flash_attention_for_cpu_backward``; the same kernel in fp32 took 0.76 s. The
matmuls around it stay in bf16 (where AMX is fast); only the attention itself — q, k, v up-cast, the
output cast back — runs in fp32, which is also the more precise of the two.

Applied only where it pays: on the CPU, with gradients enabled (a training forward), to low-precision
inputs. Generation and scoring (no gradients) and every CUDA run keep the ordinary SDPA path.
"""

from __future__ import annotations

from typing import Any

import torch

#: The name the models are switched to (``transformers.AttentionInterface``).
NAME = "grue_sdpa"


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    low = query.dtype in (torch.bfloat16, torch.float16)
    if not (low and query.device.type == "cpu" and torch.is_grad_enabled()):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    bias = kwargs.get("position_bias")
    if bias is not None and bias.is_floating_point():  # T5's relative bias joins the mask: same dtype
        kwargs["position_bias"] = bias.float()
    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(query.dtype), weights


def register() -> None:
    """Make :data:`NAME` known to transformers (idempotent), with SDPA's mask builder: without it
    transformers builds no padding mask for an unknown implementation name, and a left-padded prompt
    attends to its padding (tiny GPT-2: logits 0.37 off the same prompt alone, 2e-7 with the mask)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def use_fp32_attention_backward(lm: Any) -> bool:
    """Switch an SDPA model (and its submodels) to :data:`NAME`; others are left as they are (eager,
    flash-attention, a model without the attention interface). Returns whether it switched."""
    config = getattr(lm, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    try:
        lm.set_attn_implementation(NAME)
    except (ValueError, AttributeError, TypeError, ImportError):
        return False
    return getattr(lm.config, "_attn_implementation", None) == NAME
