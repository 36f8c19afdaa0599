"""Rollout: cached generation, one-pass scoring, padding, EOS handling."""

from __future__ import annotations

import pytest
import torch

from engine.data.base import Sample
from engine.models.policy import EosBan, frozen_copy
from engine.rollout import SamplingSpec, collect, generate, score, tokenize_prompts

PROMPTS = [
    "<|endoftext|>",
    "The movie was long and",
    "A much longer prompt that has clearly more tokens than the others, really",
]


def _samples(prompts=PROMPTS):
    return [Sample(id=str(i), prompt=p, references=["1 2 3"]) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
@pytest.mark.parametrize(
    "spec_kw",
    [{}, {"min_new_tokens": 4}, {"top_k": 20, "top_p": 0.8, "temperature": 0.7, "min_new_tokens": 3}],
    ids=["plain", "minlen", "topk-topp-temp-minlen"],
)
def test_scored_logprobs_equal_sampling_logprobs(make_policy, kind, spec_kw):
    policy, tok = make_policy(kind)
    spec = SamplingSpec(max_new_tokens=8, eos_id=tok.eos_token_id, **spec_kw)
    gen = torch.Generator().manual_seed(3)
    batch = collect(
        policy, frozen_copy(policy.lm), tok, _samples(), spec, 32, 8, torch.device("cpu"), generator=gen
    )
    assert batch.gen_ids.shape[0] == 3
    assert (batch.support is None) == (not spec_kw)
    if "top_k" not in spec_kw:  # min_new_tokens alone is stored compactly, without a (B, T, V) mask
        assert batch.support is None or isinstance(batch.support, EosBan)
    else:
        # every sampled token lies inside the recorded action space, and top-k really restricted it
        chosen = batch.support.gather(-1, batch.gen_ids.unsqueeze(-1)).squeeze(-1)
        assert bool(chosen[batch.gen_mask.bool()].all())
        assert int(batch.support[batch.gen_mask.bool()].sum(-1).max()) <= 20
    # the scoring pass reproduces the generation-time log-probs of the processed distribution
    assert torch.allclose(batch.logprobs, batch.sample_logprobs, atol=1e-4)
    # an untouched copy as reference: KL is exactly zero at the start
    assert torch.allclose(batch.ref_logprobs, batch.logprobs, atol=1e-5)
    if spec_kw:
        # the restricted distribution differs from the raw one: scoring must not fall back to raw logits
        raw = collect(
            policy,
            None,
            tok,
            _samples(),
            SamplingSpec(max_new_tokens=8, eos_id=tok.eos_token_id),
            32,
            8,
            torch.device("cpu"),
            generator=torch.Generator().manual_seed(3),
        )
        assert raw.support is None


def test_left_padding_uses_correct_positions(make_policy):
    policy, tok = make_policy("causal")
    spec = SamplingSpec(max_new_tokens=6, eos_id=None)
    batch = collect(
        policy,
        None,
        tok,
        _samples(),
        spec,
        32,
        8,
        torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
    )
    assert batch.prompt_mask[1, 0] == 0  # the short prompt is left padded
    for row in (0, 1):
        ids, mask = tokenize_prompts(tok, [PROMPTS[row]], 32, torch.device("cpu"))
        single = {
            "prompt_ids": ids,
            "prompt_mask": mask,
            "gen_ids": batch.gen_ids[row : row + 1],
            "gen_mask": batch.gen_mask[row : row + 1],
        }
        lp, _, v = score(policy, None, single, None, 1.0, None)
        assert torch.allclose(lp, batch.logprobs[row : row + 1], atol=1e-4)
        assert torch.allclose(v, batch.values[row : row + 1], atol=1e-4)


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_episode_ends_at_eos_and_later_tokens_are_masked(make_policy, kind):
    policy, tok = make_policy(kind)
    eos = tok.eos_token_id
    assert tok.pad_token_id == eos  # pad shares EOS's id: masks must come from lengths, not ids
    head = policy.lm.get_output_embeddings()

    def boost_eos(module, args, out):  # make EOS likely so that episodes end at different lengths
        out = out.clone()
        out[..., eos] += 9.0
        return out

    handle = head.register_forward_hook(boost_eos)
    spec = SamplingSpec(max_new_tokens=12, eos_id=eos, min_new_tokens=2)
    batch = collect(
        policy,
        None,
        tok,
        _samples(PROMPTS * 4),
        spec,
        32,
        12,
        torch.device("cpu"),
        generator=torch.Generator().manual_seed(1),
    )
    handle.remove()
    lengths = batch.gen_mask.sum(1).long()
    ended_early = 0
    for row in range(len(batch)):
        n = int(lengths[row])
        assert n >= 2  # min_new_tokens forbids EOS before step 2
        assert bool(batch.gen_mask[row, :n].all()) and not bool(batch.gen_mask[row, n:].any())
        toks = batch.gen_ids[row, :n].tolist()
        assert eos not in toks[:-1]  # the episode stops at its first EOS
        if n < batch.gen_ids.shape[1] and toks[-1] == eos:
            ended_early += 1
        assert torch.all(batch.logprobs[row, n:] == 0) and torch.all(batch.values[row, n:] == 0)
    assert ended_early > 0
    assert (lengths == batch.gen_ids.shape[1]).any() or ended_early == len(batch)


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_generation_uses_kv_cache_and_scoring_is_one_forward(make_policy, kind):
    policy, tok = make_policy(kind)
    ref = frozen_copy(policy.lm)
    calls = {"policy": [], "ref": []}

    def hook(name):
        def _h(module, args, kwargs):
            ids = kwargs.get("input_ids") if kind == "causal" else kwargs.get("decoder_input_ids")
            calls[name].append(None if ids is None else ids.shape[1])

        return _h

    h1 = policy.lm.register_forward_pre_hook(hook("policy"), with_kwargs=True)
    h2 = ref.register_forward_pre_hook(hook("ref"), with_kwargs=True)
    try:
        ids, mask = tokenize_prompts(tok, PROMPTS, 32, torch.device("cpu"))
        g = generate(
            policy.lm,
            policy.is_seq2seq,
            ids,
            mask,
            SamplingSpec(max_new_tokens=7, eos_id=None),
            tok.pad_token_id,
            policy.decoder_start_id,
            generator=torch.Generator().manual_seed(0),
        )
        n_steps = g.gen_ids.shape[1]
        assert n_steps == 7
        # one call for the prompt, then one single-token call per further step
        assert len(calls["policy"]) == n_steps
        assert all(n == 1 for n in calls["policy"][1:])
        calls["policy"].clear()
        inputs = {"prompt_ids": ids, "prompt_mask": mask, "gen_ids": g.gen_ids, "gen_mask": g.gen_mask}
        score(policy, ref, inputs, None, 1.0, None)
        assert len(calls["policy"]) == 1 and len(calls["ref"]) == 1
    finally:
        h1.remove()
        h2.remove()


def test_bf16_autocast_scoring_keeps_fp32_master_weights(make_policy):
    policy, tok = make_policy("causal")
    spec = SamplingSpec(max_new_tokens=5, eos_id=tok.eos_token_id)
    batch = collect(
        policy,
        None,
        tok,
        _samples(),
        spec,
        32,
        8,
        torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
        autocast_dtype=torch.bfloat16,
    )
    assert batch.logprobs.dtype == torch.float32 and torch.isfinite(batch.logprobs).all()
    assert all(p.dtype == torch.float32 for p in policy.parameters())
    # bf16 scoring stays close to the generation-time distribution
    assert (batch.logprobs - batch.sample_logprobs).abs().max() < 0.5
