"""Decode steps from prepacked weights (engine.models.packing): the same episodes as the default
matmul, the modules restored afterwards, and the packing really used where it applies."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import engine.rollout as rollout
from engine.models import packing
from engine.rollout import SamplingSpec, generate, tokenize_prompts

pytestmark = pytest.mark.skipif(not packing._available(), reason="this torch build has no oneDNN")

PROMPTS = [
    "The movie was long and",
    "A much longer prompt with clearly more tokens than the other one",
    "Yes",
]


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_packed_decode_generates_the_same_episodes(make_policy, kind, monkeypatch):
    policy, tok = make_policy(kind)
    policy.eval()
    side = "right" if kind == "seq2seq" else "left"
    pi, pm = tokenize_prompts(tok, PROMPTS, 32, torch.device("cpu"), side)
    spec = SamplingSpec(max_new_tokens=16, eos_id=tok.eos_token_id, top_k=40)
    noise = torch.rand(len(PROMPTS), 16, generator=torch.Generator().manual_seed(5))
    start = getattr(policy, "decoder_start_id", None)
    packed_calls = []
    real = packing.packed_decode_linears

    def counting(lm, rows, enabled=True):
        cm = real(lm, rows, enabled)

        class Wrap:
            def __enter__(self):
                n = cm.__enter__()
                packed_calls.append(n)
                return n

            def __exit__(self, *exc):
                return cm.__exit__(*exc)

        return Wrap()

    monkeypatch.setattr(rollout, "packed_decode_linears", counting)
    runs = []
    for pack in (False, True):
        monkeypatch.setattr(rollout, "worth_packing", lambda lm, steps, _p=pack: _p)
        runs.append(
            generate(policy.lm, kind == "seq2seq", pi, pm, spec, tok.pad_token_id, start, noise=noise)
        )
    plain, packed = runs
    assert packed_calls[0] == 0 and packed_calls[1] > 0  # the LM head at least (GPT-2's blocks are Conv1D)
    assert torch.equal(plain.gen_ids, packed.gen_ids) and torch.equal(plain.gen_mask, packed.gen_mask)
    assert torch.allclose(plain.sample_logprobs, packed.sample_logprobs, atol=1e-5)
    # every module has its own forward again (nothing left on the instances)
    assert not [m for m in policy.lm.modules() if isinstance(m, nn.Linear) and "forward" in m.__dict__]


def test_packed_linear_answers_like_the_module_and_falls_back_outside_decode():
    torch.manual_seed(0)
    lin = nn.Linear(64, 300)
    x = torch.randn(4, 1, 64)
    want = lin(x)
    with torch.no_grad(), packing.packed_decode_linears(lin, rows=4) as n:
        assert n == 1
        assert torch.allclose(lin(x), want, atol=1e-5)
        big = torch.randn(9, 64)  # more rows than packed for (a prefill): the module's own forward
        assert torch.allclose(lin(big), big @ lin.weight.T + lin.bias, atol=1e-5)
    with packing.packed_decode_linears(lin, rows=4):  # with gradients on: never the packed path
        y = lin(x)
        assert y.requires_grad
    assert "forward" not in lin.__dict__
    assert not packing.worth_packing(lin, steps=48)  # far below MIN_PARAMS: not worth the packing
