"""NLPO: the refreshed masking policy is the one that restricts generation, and the update uses it."""

from __future__ import annotations

import pytest
import torch

from engine.algorithms.nlpo import NLPO
from engine.config import AlgorithmConfig, GenerationConfig
from engine.data.base import Sample
from engine.evaluation import generate_texts
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
    # the policy's own (unmasked, full-vocabulary) distribution gives lower log-probs of the same tokens
    # wherever the mask and top-k/top-p cut mass away: the mask matters here
    valid = batch.gen_mask.bool()
    cut = batch.logprobs - batch.kl_logprobs
    assert bool((cut[valid] > 1e-3).all()), cut
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


def _suppress(lm, token: int, by: float = 30.0):
    """Make ``token`` very unlikely under ``lm`` (so that a top-p mask of it would drop the token)."""

    def hook(module, args, out):
        out = out.clone()
        out[..., token] -= by
        return out

    return lm.get_output_embeddings().register_forward_hook(hook)


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_special_tokens_stay_in_the_masked_action_space(make_policy, kind):
    """RL4LMs always unmasks the tokenizer's special tokens, so an NLPO episode can always end: a top-p
    mask that would drop EOS keeps it, and a policy that wants to stop does stop."""
    policy, tok = make_policy(kind)
    eos = tok.eos_token_id
    algo = NLPO(AlgorithmConfig(id="nlpo", nlpo={"top_mask": 0.3, "min_tokens_to_keep": 5}))
    algo.setup(policy)
    masker = algo.masking_model()
    handle_mask = _suppress(masker, eos)  # the masking policy puts no mass on EOS: top-p drops it
    # the policy itself strongly prefers to end the episode
    handle_pol = _suppress(policy.lm, eos, by=-30.0)
    samples = [Sample(id=str(i), prompt=p, references=[]) for i, p in enumerate(PROMPTS)]
    try:
        gen_cfg = GenerationConfig(max_new_tokens=6)
        keep = SamplingSpec.from_config(gen_cfg, eos, algo.cfg.nlpo, special_ids=tok.all_special_ids)
        assert eos in keep.mask_keep_ids
        without = SamplingSpec.from_config(gen_cfg, eos, algo.cfg.nlpo)  # control: no special tokens kept

        def rollout(spec):
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
                masking_lm=masker,
            )

        control = rollout(without)
        assert not bool(control.support[:, 0, eos].any())  # the mask alone would exclude EOS
        assert control.gen_mask[:, :2].all()  # ... so no episode can end at once
        batch = rollout(keep)
        assert bool(batch.support[:, 0, eos].all())
        assert batch.gen_ids[:, 0].tolist() == [eos] * len(PROMPTS)  # EOS sampled: episodes end
        assert batch.gen_mask.sum(1).tolist() == [1.0] * len(PROMPTS)
        assert torch.isfinite(batch.logprobs[:, 0]).all()
    finally:
        handle_mask.remove()
        handle_pol.remove()


def test_nlpo_evaluation_is_masked_by_default(make_policy):
    """As RL4LMs, an NLPO policy is evaluated through its masked generation (``nlpo.masked_eval``)."""
    policy, tok = make_policy("causal")
    cfg = AlgorithmConfig(id="nlpo", nlpo={"top_mask": 0.05, "min_tokens_to_keep": 1})
    assert cfg.nlpo.masked_eval is True
    masker = frozen_copy(policy.lm)
    _perturb(policy.lm, 0.3, 3)  # the evaluated policy no longer agrees with its masking policy
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=4, batch_size=8)
    args = (policy.lm, False, tok, PROMPTS, gen_cfg, 32, torch.device("cpu"), None)
    masked = generate_texts(*args, masking_lm=masker, nlpo=cfg.nlpo)
    unmasked = generate_texts(*args)
    assert masked != unmasked
    # masked greedy decoding picks, at the first step, the policy's best token within the masker's top-p set
    ids, mask = tokenize_prompts(tok, PROMPTS, 32, torch.device("cpu"))
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        pol_logits = policy.lm(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
    keep = _first_step_keep(masker, policy, tok, 0.05, 1)
    keep[:, tok.all_special_ids] = True
    best = pol_logits.masked_fill(~keep, float("-inf")).argmax(-1)
    firsts = [tok.decode([int(t)], skip_special_tokens=True) for t in best]
    assert all(text.startswith(first) for text, first in zip(masked, firsts))
    with pytest.raises(ValueError, match="num_beams"):
        generate_texts(
            policy.lm, False, tok, PROMPTS, GenerationConfig(do_sample=False, num_beams=2), 32,
            torch.device("cpu"), None, masking_lm=masker, nlpo=cfg.nlpo,
        )  # fmt: skip


def _perturb(lm, scale: float, seed: int) -> None:
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for p in lm.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def _top_p_by_full_sort(logits: torch.Tensor, top_p: float, min_keep: int) -> torch.Tensor:
    """The rule written out on a full sort of the vocabulary: kept when the mass ranked above < top_p."""
    ranked, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.exp(ranked - torch.logsumexp(logits, -1, keepdim=True)).cumsum(-1)
    above = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], dim=-1)
    keep = above < top_p
    keep[..., :min_keep] = True
    return torch.zeros_like(keep).scatter(-1, order, keep)


def test_top_p_set_by_hand():
    # probabilities 0.5, 0.3, 0.15, 0.05 (shuffled in the vocabulary): the masses ranked above are 0, 0.5,
    # 0.8, 0.95, so p 0.45 keeps one token, 0.6 two, 0.81 three, and 1.0 all four
    logits = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log()
    for p, kept in ((0.45, [1]), (0.6, [1, 3]), (0.81, [0, 1, 3]), (1.0, [0, 1, 2, 3])):
        assert top_p_keep(logits, p, 1)[0].nonzero().flatten().tolist() == kept, p
    assert top_p_keep(logits, 0.45, 3)[0].nonzero().flatten().tolist() == [0, 1, 3]  # min_keep


@pytest.mark.parametrize("scale", [0.3, 1.0, 3.0, 10.0])
def test_top_p_set_from_a_slice_equals_the_full_sort(scale):
    # GPT-2's vocabulary, flat to peaked rows: the set is found in a top-k slice grown until every row's
    # cut lies inside it (from 1 to ~42,000 tokens here, so every growth path and the full-sort fallback
    # run), and must be the full sort's set exactly; a row with banned (-inf) tokens included. Float64:
    # 50,257 float32 normals hold equal values, and which of two tied tokens at the cut a sort keeps is
    # arbitrary
    g = torch.Generator().manual_seed(int(scale * 10))
    logits = torch.randn(6, 50257, generator=g, dtype=torch.float64) * scale
    logits[0, :20000] = float("-inf")
    for p in (0.05, 0.3, 0.9, 0.99):
        for min_keep in (1, 100, 5000):
            got = top_p_keep(logits, p, min_keep)
            assert torch.equal(got, _top_p_by_full_sort(logits, p, min_keep)), (p, min_keep)
            assert int(got.sum(-1).min()) >= min_keep


def test_top_p_set_of_rows_with_banned_tokens_and_min_keep_past_them():
    # top-p after top-k (the sampler's order): 40 finite logits, the rest -inf. min_keep 300 keeps banned
    # tokens in the slice, whose last probability is then 0; the set is still the full sort's.
    g = torch.Generator().manual_seed(3)
    logits = torch.full((4, 50257), float("-inf"), dtype=torch.float64)
    logits[:, :40] = torch.randn(4, 40, generator=g, dtype=torch.float64)
    for p, min_keep in ((0.5, 1), (0.999999, 1), (0.5, 300), (0.999999, 300)):
        got = top_p_keep(logits, p, min_keep)
        assert torch.equal(got, _top_p_by_full_sort(logits, p, min_keep)), (p, min_keep)
        assert int(got[:, 40:].sum(-1).max()) == max(0, min_keep - 40)  # banned tokens only by min_keep
