"""Attention in fp32 for bf16 training on the CPU (``engine.models.attention``).

The swap must change nothing but the attention's precision: fp32 runs are bit-identical to SDPA, a bf16
training forward gets SDPA's fp32 result rounded to bf16, and a forward without gradients (generation,
scoring) is SDPA's own bf16 computation.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.models.attention import NAME, _attention
from engine.models.builtin import builtin_model_dir
from engine.models.loading import load_lm


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, 7, 16, generator=g).to(dtype).requires_grad_() for _ in range(3)]


def test_bf16_training_attention_is_fp32_sdpa_rounded_to_bf16():
    q, k, v = _qkv(torch.bfloat16)
    out, _ = _attention(_Module(), q, k, v, None)
    assert out.dtype == torch.bfloat16
    ref, _ = sdpa_attention_forward(_Module(), q.float(), k.float(), v.float(), None)
    assert torch.equal(out, ref.to(torch.bfloat16))
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()
    with torch.no_grad():  # generation and scoring keep bf16 SDPA
        plain, _ = sdpa_attention_forward(_Module(), q, k, v, None)
        assert torch.equal(_attention(_Module(), q, k, v, None)[0], plain)


def test_fp32_is_plain_sdpa():
    q, k, v = _qkv(torch.float32)
    assert torch.equal(
        _attention(_Module(), q, k, v, None)[0], sdpa_attention_forward(_Module(), q, k, v, None)[0]
    )


def test_loaded_models_use_it_and_train_under_autocast_as_with_sdpa():
    """``load_lm`` switches an SDPA model; under bf16 autocast its loss and gradients stay those of
    SDPA's to bf16 rounding, and in fp32 they are identical."""
    path = str(builtin_model_dir("builtin:tiny-gpt2"))
    ids = torch.tensor([[464, 3807, 373, 890, 290, 3665, 13, 50256]])
    results = {}
    for impl in (NAME, "sdpa"):
        torch.manual_seed(0)
        lm = load_lm(path, "causal")
        assert lm.config._attn_implementation == NAME
        if impl == "sdpa":
            lm.set_attn_implementation("sdpa")
        for amp in (False, True):
            lm.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                logits = lm(input_ids=ids).logits
            loss = torch.log_softmax(logits.float(), -1)[0, :-1].gather(-1, ids[0, 1:, None]).mean()
            loss.backward()
            grads = torch.cat([p.grad.flatten() for p in lm.parameters() if p.grad is not None])
            results[impl, amp] = (loss.detach(), grads)
    assert torch.equal(results[NAME, False][0], results["sdpa", False][0])
    assert torch.equal(results[NAME, False][1], results["sdpa", False][1])
    (l1, g1), (l2, g2) = results[NAME, True], results["sdpa", True]
    assert torch.allclose(l1, l2, atol=0.02 * float(l2.abs()))
    assert torch.allclose(g1, g2, atol=0.05 * float(g2.abs().max()))
