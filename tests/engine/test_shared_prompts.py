"""Shared prompt passes (``share_prompts``): a group's completions run their common prompt through the
model once. The numbers must be those of the plain pass, gradients included, or GRPO's ratio, KL and
update would silently change."""

from __future__ import annotations

import torch

from engine.data.base import Sample
from engine.models.policy import frozen_copy, lm_forward, shared_prompt_rows
from engine.rollout import SamplingSpec, collect, generate, tokenize_prompts

PROMPTS = ["The movie was long and", "A much longer prompt with clearly more tokens than the other one"]


def _group_batch(tok, group=3):
    """Two prompts x ``group`` completions (left padded, as causal rollouts are), completions of
    different lengths (one ends early: pad after its end)."""
    prompts = [p for p in PROMPTS for _ in range(group)]
    pi, pm = tokenize_prompts(tok, prompts, 32, torch.device("cpu"), "left")
    g = torch.Generator().manual_seed(0)
    gen_ids = torch.randint(0, tok.vocab_size, (len(prompts), 7), generator=g)
    gen_mask = torch.ones(len(prompts), 7)
    gen_mask[1, 4:] = 0
    gen_ids[1, 4:] = tok.pad_token_id if tok.pad_token_id is not None else 0
    return pi, pm, gen_ids, gen_mask


def test_rows_sharing_a_prompt_are_found():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])  # row 3: same ids, other mask
    first, inverse = shared_prompt_rows(ids, mask)
    assert [int(first[i]) for i in inverse] == [0, 0, 2, 3]
    assert shared_prompt_rows(ids[2:], mask[2:]) is None  # nothing shared: the plain pass is used


def test_shared_prompt_pass_equals_the_plain_pass_with_gradients(make_policy):
    policy, tok = make_policy("causal")
    policy.eval()
    pi, pm, gen_ids, gen_mask = _group_batch(tok)
    weights = torch.randn(gen_ids.shape[0], gen_ids.shape[1], 1, generator=torch.Generator().manual_seed(1))
    grads, outs = [], []
    for share in (False, True):
        policy.zero_grad(set_to_none=True)
        logits, hidden = lm_forward(
            policy.lm, False, pi, pm, gen_ids, gen_mask, None, want_hidden=True, share_prompts=share
        )
        loss = (torch.log_softmax(logits, -1).mean(-1, keepdim=True) * weights * gen_mask[..., None]).sum()
        loss = loss + hidden.pow(2).mean()
        loss.backward()
        outs.append((logits.detach(), hidden.detach()))
        grads.append({n: p.grad.clone() for n, p in policy.lm.named_parameters() if p.grad is not None})
    (l0, h0), (l1, h1) = outs
    assert l0.shape == l1.shape == (6, 7, l0.shape[-1]) and h0.shape == h1.shape
    assert torch.allclose(l0, l1, atol=1e-5) and torch.allclose(h0, h1, atol=1e-5)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name, g in grads[0].items():  # the prompt pass's gradient sums over the group's rows
        assert torch.allclose(g, grads[1][name], atol=1e-5, rtol=1e-4), name


def test_shared_prefill_generates_the_same_episodes(make_policy):
    policy, tok = make_policy("causal")
    policy.eval()
    prompts = [p for p in PROMPTS for _ in range(4)]
    pi, pm = tokenize_prompts(tok, prompts, 32, torch.device("cpu"), "left")
    spec = SamplingSpec(max_new_tokens=6, eos_id=tok.eos_token_id, top_k=30)
    noise = torch.rand(len(prompts), 6, generator=torch.Generator().manual_seed(2))
    plain, shared = (
        generate(policy.lm, False, pi, pm, spec, tok.eos_token_id, noise=noise, share_prompts=s)
        for s in (False, True)
    )
    assert torch.equal(plain.gen_ids, shared.gen_ids) and torch.equal(plain.gen_mask, shared.gen_mask)
    assert torch.allclose(plain.sample_logprobs, shared.sample_logprobs, atol=1e-5)
    assert torch.equal(plain.support, shared.support)


def test_a_grouped_rollout_scores_as_the_plain_one(make_policy):
    """``collect`` with shared prompts (the trainer's setting for group algorithms): the same
    episodes, and the scores (policy, reference, KL) agree with the plain pass."""
    policy, tok = make_policy("causal")
    ref = frozen_copy(policy.lm)
    samples = [Sample(id=str(i), prompt=p, references=[""]) for i, p in enumerate(PROMPTS) for _ in range(3)]
    spec = SamplingSpec(max_new_tokens=6, eos_id=tok.eos_token_id)
    batches = [
        collect(
            policy,
            ref,
            tok,
            samples,
            spec,
            32,
            8,
            torch.device("cpu"),
            sample_seeds=list(range(len(samples))),
            share_prompts=share,
        )  # fmt: skip
        for share in (False, True)
    ]
    a, b = batches
    assert torch.equal(a.gen_ids, b.gen_ids)
    for field in ("logprobs", "ref_logprobs", "kl_logprobs", "values", "entropy"):
        assert torch.allclose(getattr(a, field), getattr(b, field), atol=1e-5), field
