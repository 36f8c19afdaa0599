"""Llama-style MLPs with the lean SwiGLU (engine/models/mlp.py): bitwise the same values and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.models.mlp import use_lean_swiglu


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
    )
    return LlamaForCausalLM(cfg)


def _logits_and_grads(model: torch.nn.Module, ids: torch.Tensor, bf16: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=ids).logits
    logits.float().square().mean().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_lean_swiglu_is_bitwise_the_module_it_replaces(bf16: bool, threads: int):
    plain = _model()
    lean = copy.deepcopy(plain)
    assert use_lean_swiglu(lean) == 2
    assert use_lean_swiglu(lean) == 0  # idempotent
    ids = torch.randint(0, 300, (3, 17))
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        want_logits, want_grads = _logits_and_grads(plain, ids, bf16)
        got_logits, got_grads = _logits_and_grads(lean, ids, bf16)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(got_logits, want_logits)
    assert all(torch.equal(g, w) for g, w in zip(got_grads, want_grads, strict=True))


def test_lean_swiglu_keeps_fewer_activations_and_survives_deepcopy():
    model = _model()
    use_lean_swiglu(model)
    critic = copy.deepcopy(model)  # a separate critic is a deep copy of the policy
    assert type(critic.model.layers[0].mlp) is type(model.model.layers[0].mlp)
    mlp = critic.model.layers[0].mlp
    x = torch.randn(2, 5, 64, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        mlp(x)
    wide = {t.data_ptr() for t in saved if t.numel() == 2 * 5 * 160}  # (tokens x intermediate) activations
    assert len(wide) == 3  # gate, up, and down_proj's input; autograd alone keeps silu(gate) too

    plain = _model().model.layers[0].mlp
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        plain(x)
    assert len({t.data_ptr() for t in saved if t.numel() == 2 * 5 * 160}) == 4
