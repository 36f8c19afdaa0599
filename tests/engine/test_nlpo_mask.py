"""NLPO: the refreshed masking policy is the one that restricts generation, and the update uses it."""

from __future__ import annotations

import pytest
import torch

from engine.algorithms.nlpo import NLPO
from engine.config import AlgorithmConfig
from engine.data.base import Sample
from engine.models.policy import frozen_copy
from engine.rollout import SamplingSpec, collect, tokenize_prompts, top_p_keep

PROMPTS = ["<|endoftext|>", "I liked this film because", "Numbers: 1 2 3"]


def _first_step_keep(lm, policy, tok, top_mask, min_keep):
    """The top-p set of ``lm``'s first-step distribution, computed independently of generation."""
    ids, mask = tokenize_prompts(tok, PROMPTS, 32, torch.device("cpu"))
    with torch.no_grad():
        if policy.is_seq2seq:
            start = torch.full((len(PROMPTS), 1), policy.decoder_start_id)
            logits = lm(input_ids=ids, attention_mask=mask, decoder_input_ids=start).logits[:, -1]
        else:
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = lm(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
    return top_p_keep(logits.float(), top_mask, min_keep)


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_mask_refresh_changes_the_generation_mask(make_policy, kind):
    policy, tok = make_policy(kind)
    cfg = AlgorithmConfig(
        id="nlpo", nlpo={"top_mask": 0.3, "min_tokens_to_keep": 5, "mask_update_interval": 2}
    )
    algo = NLPO(cfg)
    algo.setup(policy)
    initial = frozen_copy(policy.lm)
    with torch.no_grad():  # the policy moves away from the masking snapshot (as training would do)
        g = torch.Generator().manual_seed(7)
        for p in policy.lm.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    spec = SamplingSpec(max_new_tokens=5, eos_id=None, mask_top_p=0.3, mask_min_tokens=5)
    samples = [Sample(id=str(i), prompt=p, references=[]) for i, p in enumerate(PROMPTS)]

    def rollout():
        return collect(
            policy,
            None,
            tok,
            samples,
            spec,
            32,
            8,
            torch.device("cpu"),
            generator=torch.Generator().manual_seed(0),
            masking_lm=algo.masking_model(),
        )

    algo.on_iteration_start(1, policy)  # not a refresh iteration
    before = rollout()
    assert torch.equal(before.support[:, 0], _first_step_keep(initial, policy, tok, 0.3, 5))
    algo.on_iteration_start(2, policy)  # refresh: the masking policy becomes the current policy
    assert algo.n_refreshes == 1 and algo.refreshed_at == 2
    after = rollout()
    current_keep = _first_step_keep(policy.lm, policy, tok, 0.3, 5)
    assert torch.equal(after.support[:, 0], current_keep)
    assert not torch.equal(after.support[:, 0], before.support[:, 0])
    algo.on_iteration_start(3, policy)
    assert algo.n_refreshes == 1
    # the action space is restricted but never below min_tokens_to_keep
    sizes = after.support[after.gen_mask.bool()].sum(-1)
    assert int(sizes.min()) >= 5 and int(sizes.max()) < len(tok)


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_masked_logprobs_consistent_between_sampling_scoring_and_update(make_policy, kind):
    policy, tok = make_policy(kind)
    cfg = AlgorithmConfig(id="nlpo", minibatch_size=4, nlpo={"top_mask": 0.5, "min_tokens_to_keep": 10})
    algo = NLPO(cfg)
    algo.setup(policy)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in policy.lm.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    spec = SamplingSpec(
        max_new_tokens=6,
        eos_id=tok.eos_token_id,
        top_k=200,
        top_p=0.9,
        temperature=0.8,
        mask_top_p=0.5,
        mask_min_tokens=10,
    )
    samples = [Sample(id=str(i), prompt=p, references=[]) for i, p in enumerate(PROMPTS)]
    batch = collect(
        policy,
        frozen_copy(policy.lm),
        tok,
        samples,
        spec,
        32,
        8,
        torch.device("cpu"),
        generator=torch.Generator().manual_seed(5),
        masking_lm=algo.masking_model(),
    )
    assert torch.allclose(batch.logprobs, batch.sample_logprobs, atol=1e-4)
    # the policy's own (unmasked) distribution gives different log-probs: the mask matters here
    raw = collect(
        policy,
        None,
        tok,
        samples,
        SamplingSpec(max_new_tokens=6, eos_id=tok.eos_token_id),
        32,
        8,
        torch.device("cpu"),
        generator=torch.Generator().manual_seed(5),
    )
    assert raw.support is None
    # the update's first forward pass sees the same masked distribution: ratio 1, no KL
    idx = torch.arange(len(batch))
    zeros = torch.zeros_like(batch.logprobs)
    _, stats = algo.minibatch_loss(policy, batch, idx, zeros, zeros, spec.temperature, None)
    assert float(stats["policy/approx_kl"]) < 1e-6
    assert float(stats["policy/ratio_mean"]) == pytest.approx(1.0, abs=1e-4)
    unmasked = batch.support
    batch.support = None
    _, stats_raw = algo.minibatch_loss(policy, batch, idx, zeros, zeros, spec.temperature, None)
    batch.support = unmasked
    assert float(stats_raw["policy/ratio_mean"]) < 0.999  # without the mask the ratio would be biased
