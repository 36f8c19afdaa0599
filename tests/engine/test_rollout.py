"""Rollout: cached generation, one-pass scoring, padding, EOS handling."""

from __future__ import annotations

import pytest
import torch

from engine.data.base import Sample
from engine.models.policy import EosBan, frozen_copy
from engine.rollout import (
    SamplingSpec,
    _scores_from_generation,
    collect,
    generate,
    score,
    tokenize_prompts,
)

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
        policy,
        frozen_copy(policy.lm),
        tok,
        _samples(),
        spec,
        32,
        8,
        torch.device("cpu"),
        generator=gen,
        scores_from_generation=False,  # the teacher-forced pass, compared with generation's numbers
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
    # an untouched copy as reference: the full-vocabulary log-probs agree and the KL is zero at the start
    assert torch.allclose(batch.ref_logprobs, batch.kl_logprobs, atol=1e-5)
    assert float(batch.kl.abs().max()) < 1e-5
    valid = batch.gen_mask.bool()
    if not spec_kw:  # nothing cut: the sampled distribution is the full one
        assert torch.allclose(batch.logprobs, batch.kl_logprobs, atol=1e-5)
        return
    # Where the support cuts mass away, the renormalised (sampled) log-prob is strictly higher than
    # the full-vocabulary one; where it cuts nothing, they agree.
    gap = batch.logprobs - batch.kl_logprobs
    if "top_k" in spec_kw:  # top-k 20 of 50k tokens cuts at every step
        assert bool((gap[valid] > 1e-3).all()), gap
    else:  # min_new_tokens 4 bans EOS at the first 4 steps only
        assert bool((gap[:, :4][valid[:, :4]] > 0).all())
        assert torch.allclose(gap[:, 4:], torch.zeros_like(gap[:, 4:]), atol=1e-5)


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
        sc = score(policy, None, single, None, 1.0, None)
        assert torch.allclose(sc.logprobs, batch.logprobs[row : row + 1], atol=1e-4)
        assert torch.allclose(sc.values, batch.values[row : row + 1], atol=1e-4)


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


# ---- the KL penalty is computed on the full vocabulary (issue 8, defect 1) -------------------------


def _perturbed(policy, scale: float = 0.3, seed: int = 7) -> None:
    """Move the policy away from its reference, as training would."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for p in policy.lm.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def _hand_full_logprobs(lm, policy, prompt: str, gen_ids: list[int], tok, temperature: float):
    """Full-vocabulary log-softmax(logits / T) rows for each generated token, one unpadded sequence."""
    ids = torch.tensor([tok(prompt)["input_ids"] + gen_ids])
    n_prompt = ids.shape[1] - len(gen_ids)
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[0, n_prompt - 1 : -1]
    return torch.log_softmax(logits / temperature, dim=-1)


@pytest.mark.parametrize("estimator", ["k1", "k3", "full"])
def test_kl_with_top_k_1_is_the_full_vocabulary_kl(make_policy, estimator):
    """With ``top_k: 1`` the sampled distributions of any two models are the same point mass, so a KL
    taken on them is 0 however far the policy moved; the penalty must use the full distributions."""
    from engine.algorithms.ppo import PPO
    from engine.config import AlgorithmConfig

    policy, tok = make_policy("causal")
    ref = frozen_copy(policy.lm)
    _perturbed(policy)
    temperature = 0.7
    spec = SamplingSpec(max_new_tokens=5, eos_id=None, top_k=1, temperature=temperature)
    batch = collect(
        policy,
        ref,
        tok,
        _samples(),
        spec,
        32,
        8,
        torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
        kl_estimator=estimator,
    )
    assert torch.allclose(batch.logprobs, torch.zeros_like(batch.logprobs))  # the sampled dist: a point mass
    for row, prompt in enumerate(PROMPTS):
        n = int(batch.gen_mask[row].sum())
        gen = batch.gen_ids[row, :n].tolist()
        lp = _hand_full_logprobs(policy.lm, policy, prompt, gen, tok, temperature)
        rlp = _hand_full_logprobs(ref, policy, prompt, gen, tok, temperature)
        tok_lp = lp.gather(-1, torch.tensor(gen)[:, None]).squeeze(-1)
        tok_rlp = rlp.gather(-1, torch.tensor(gen)[:, None]).squeeze(-1)
        if estimator == "k1":
            expected = tok_lp - tok_rlp
        elif estimator == "k3":
            r = torch.exp(tok_rlp - tok_lp)
            expected = (r - 1) - torch.log(r)
        else:
            expected = (lp.exp() * (lp - rlp)).sum(-1)
        assert torch.allclose(batch.kl[row, :n], expected, atol=1e-4), (batch.kl[row, :n], expected)
        assert torch.allclose(batch.kl_logprobs[row, :n], tok_lp, atol=1e-4)
        assert torch.allclose(batch.ref_logprobs[row, :n], tok_rlp, atol=1e-4)
    # The policy moved: the penalty sees it (k3 and full are non-negative per token; k1 on average).
    valid = batch.gen_mask.bool()
    assert float(batch.kl[valid].mean()) > 0.05
    if estimator != "k1":
        assert bool((batch.kl[valid] >= -1e-6).all())
    # ... while the PPO ratio still compares the distributions actually sampled from: 1 at the start.
    algo = PPO(AlgorithmConfig(minibatch_size=3))
    idx = torch.arange(len(batch))
    zeros = torch.zeros_like(batch.logprobs)
    _, stats = algo.minibatch_loss(policy, batch, idx, zeros, zeros, temperature, None)
    assert float(stats["policy/ratio_mean"]) == pytest.approx(1.0, abs=1e-5)
    assert float(stats["policy/approx_kl"]) < 1e-6
    # The reported entropy is the full distribution's (a point mass would have entropy 0).
    assert float(stats["policy/entropy"]) > 1.0
    assert float(batch.entropy[valid].min()) > 1.0


# ---- padding: causal prompts left, encoder prompts right; forced BOS (issue 8, defect 3) -----------


def _tiny_bart(tok, forced_bos: int | None = None):
    from transformers import BartConfig, BartForConditionalGeneration

    from engine.models.loading import disable_dropout
    from engine.models.policy import ActorCritic

    eos = tok.eos_token_id
    cfg = BartConfig(
        vocab_size=len(tok),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        init_std=0.2,  # larger than BART's 0.02, so the encoder (and its positions) visibly matter
        pad_token_id=eos,
        bos_token_id=eos,
        eos_token_id=eos,
        decoder_start_token_id=eos,
    )
    torch.manual_seed(0)
    lm = BartForConditionalGeneration(cfg).eval()
    disable_dropout(lm)
    if forced_bos is not None:
        lm.generation_config.forced_bos_token_id = forced_bos
    return ActorCritic(lm, True)


def _first_token(policy, tok, prompts):
    ids, mask = tokenize_prompts(
        tok, prompts, 32, torch.device("cpu"), "right" if policy.is_seq2seq else "left"
    )
    g = generate(
        policy.lm,
        policy.is_seq2seq,
        ids,
        mask,
        SamplingSpec(max_new_tokens=3, eos_id=None, do_sample=False),
        tok.pad_token_id,
        policy.decoder_start_id,
    )
    return g.gen_ids[:, 0], g.sample_logprobs[:, 0]


@pytest.mark.parametrize("model", ["causal", "bart"])
def test_batched_and_single_generation_agree_on_the_first_token(make_policy, model):
    """A short prompt in a batch must see the same first-step distribution as alone. Causal: the
    tokenizer asks for right padding (it is overridden: prompts are left padded). BART: learned
    absolute positions ignore the attention mask, so its prompts must not be left padded."""
    policy, tok = make_policy("causal")
    if model == "bart":
        policy = _tiny_bart(tok)
    else:
        tok.padding_side = "right"
    samples = _samples()
    # through the rollout collector (prompts padded by the model kind, whatever the tokenizer says)
    batch = collect(
        policy,
        None,
        tok,
        samples,
        SamplingSpec(max_new_tokens=3, eos_id=None, do_sample=False),
        32,
        8,
        torch.device("cpu"),
    )
    for row in range(len(PROMPTS)):
        alone = collect(
            policy,
            None,
            tok,
            [samples[row]],
            SamplingSpec(max_new_tokens=3, eos_id=None, do_sample=False),
            32,
            8,
            torch.device("cpu"),
        )
        assert int(alone.gen_ids[0, 0]) == int(batch.gen_ids[row, 0])
        assert float(alone.sample_logprobs[0, 0]) == pytest.approx(
            float(batch.sample_logprobs[row, 0]), abs=1e-5
        )
        assert float(alone.logprobs[0, 0]) == pytest.approx(float(batch.logprobs[row, 0]), abs=1e-5)
    # through evaluation's generation
    from engine.config import GenerationConfig
    from engine.evaluation import generate_texts

    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=3, batch_size=8)
    together = generate_texts(
        policy.lm, policy.is_seq2seq, tok, PROMPTS, gen_cfg, 32, torch.device("cpu"), None,
        decoder_start_id=policy.decoder_start_id,
    )  # fmt: skip
    alone = [
        generate_texts(
            policy.lm, policy.is_seq2seq, tok, [p], gen_cfg, 32, torch.device("cpu"), None,
            decoder_start_id=policy.decoder_start_id,
        )[0]
        for p in PROMPTS
    ]  # fmt: skip
    assert together == alone


def test_right_padding_is_rejected_for_causal_models(tiny_dirs):
    from engine.config import ConfigError, parse_config
    from engine.models.loading import load_tokenizer

    with pytest.raises(ValueError, match="padding_side: 'right' is not allowed for a causal model"):
        load_tokenizer(tiny_dirs["causal"], padding_side="right", kind="causal")
    with pytest.raises(ConfigError, match="padding_side"):
        parse_config({"model": {"type": "causal"}, "tokenizer": {"padding_side": "right"}})
    # encoder-decoder prompts are right padded whatever the config says
    assert load_tokenizer(tiny_dirs["seq2seq"], padding_side="left", kind="seq2seq").padding_side == "right"


def test_forced_bos_token_is_honoured_by_the_generation_loop(make_policy):
    """BART-like models force their first decoder token (``forced_bos_token_id``): generation and
    scoring must condition on [start, forced BOS], and the forced token is no action of the policy."""
    _, tok = make_policy("causal")
    forced = tok(" Hello")["input_ids"][0]
    policy = _tiny_bart(tok, forced_bos=forced)
    assert policy.decoder_start_id == [tok.eos_token_id, forced]
    first, first_lp = _first_token(policy, tok, PROMPTS)
    ids, mask = tokenize_prompts(tok, PROMPTS, 32, torch.device("cpu"), "right")
    dec = torch.tensor([[tok.eos_token_id, forced]] * len(PROMPTS))
    with torch.no_grad():
        logits = policy.lm(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits[:, -1]
    expected = torch.log_softmax(logits, -1)
    assert torch.equal(first, expected.argmax(-1))
    assert torch.allclose(first_lp, expected.gather(1, first[:, None]).squeeze(1), atol=1e-5)
    # the teacher-forced scoring pass sees the same prefix
    batch = collect(
        policy,
        None,
        tok,
        _samples(),
        SamplingSpec(max_new_tokens=4, eos_id=None),
        32,
        8,
        torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.allclose(batch.logprobs, batch.sample_logprobs, atol=1e-5)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_score_from_the_fused_head_equals_the_log_softmax_path(make_policy, estimator):
    """Without a (B, T, V) support, ``score`` reduces the head's logits in place; written as the
    equivalent (B, T, V) mask, the same EOS ban takes the log-softmax path. Every field agrees."""
    policy, tok = make_policy("causal")
    with torch.no_grad():  # a reference that differs from the policy, so the KL is not zero
        ref = frozen_copy(policy.lm)
        for p in ref.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel() % 97)))
    spec = SamplingSpec(max_new_tokens=6, min_new_tokens=3, eos_id=tok.eos_token_id, temperature=0.8)
    pi, pm = tokenize_prompts(tok, PROMPTS, 32, torch.device("cpu"), "left")
    g = generate(policy.lm, False, pi, pm, spec, tok.pad_token_id, generator=torch.Generator().manual_seed(5))
    assert isinstance(g.support, EosBan)
    inputs = {"prompt_ids": pi, "prompt_mask": pm, "gen_ids": g.gen_ids, "gen_mask": g.gen_mask}
    mask = torch.ones(*g.gen_ids.shape, policy.lm.get_output_embeddings().weight.shape[0], dtype=torch.bool)
    mask[:, : g.support.steps, g.support.eos_id] = False
    fused = score(policy, ref, inputs, g.support, 0.8, None, estimator)
    plain = score(policy, ref, inputs, mask, 0.8, None, estimator)
    assert float(fused.kl.abs().max()) > 1e-4
    for field in ("logprobs", "ref_logprobs", "values", "kl_logprobs", "kl", "entropy"):
        assert torch.allclose(getattr(fused, field), getattr(plain, field), atol=1e-5), field


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_decode_step_scores_are_the_default_only_where_they_equal_the_scoring_pass(make_policy, kind):
    """By default a causal LM in fp32 reads its scores off generation; an encoder-decoder (first step
    ~1e-3 off), bf16 autocast (bf16 rounding), the ``full`` estimator (whole distributions) and an
    unscored policy keep the teacher-forced pass; an explicit request still decides."""
    policy, _ = make_policy(kind)
    causal = kind == "causal"
    assert _scores_from_generation(None, policy, True, None, "k1") is causal
    assert _scores_from_generation(None, policy, True, None, "k3") is causal
    assert _scores_from_generation(None, policy, True, torch.bfloat16, "k1") is False
    assert _scores_from_generation(None, policy, True, None, "full") is False
    assert _scores_from_generation(None, policy, False, None, "k1") is False
    assert _scores_from_generation(True, policy, True, None, "k1") is True  # on request, seq2seq too
    assert _scores_from_generation(True, policy, True, torch.bfloat16, "k1") is False
    assert _scores_from_generation(False, policy, True, None, "k1") is False


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])  # seq2seq: on request only, not by default
@pytest.mark.parametrize(
    "spec_kw",
    [{"min_new_tokens": 3, "temperature": 0.8}, {"top_k": 20, "temperature": 0.7}],
    ids=["minlen-temp", "topk-temp"],
)
@pytest.mark.parametrize("share", [False, True])
def test_policy_scores_read_off_generation_equal_the_scoring_pass(make_policy, kind, spec_kw, share):
    """In fp32 ``collect`` takes the policy's log-probs, entropy and (shared head) values from the
    decode steps and runs only the reference; the teacher-forced pass gives the same numbers."""
    policy, tok = make_policy(kind)
    with torch.no_grad():  # a value head that is not ~0, so the values comparison means something
        policy.value_head.linear.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    ref = frozen_copy(policy.lm)
    spec = SamplingSpec(max_new_tokens=7, eos_id=tok.eos_token_id, **spec_kw)
    prompts = PROMPTS + PROMPTS[1:] if share and kind == "causal" else PROMPTS
    batches = [
        collect(
            policy,
            ref,
            tok,
            _samples(prompts),
            spec,
            32,
            8,
            torch.device("cpu"),
            generator=torch.Generator().manual_seed(9),
            kl_estimator="k3",
            share_prompts=share,
            scores_from_generation=from_generation,
        )
        for from_generation in (True, False)
    ]
    read, forced = batches
    assert torch.equal(read.gen_ids, forced.gen_ids) and float(read.values.abs().max()) > 1e-3
    # an encoder-decoder's first decode step differs from its teacher-forced row by ~1e-3 (the reason
    # collect scores it again by default); every later step agrees as a causal LM's do
    cols = slice(1, None) if kind == "seq2seq" else slice(None)
    for field in ("logprobs", "ref_logprobs", "values", "kl_logprobs", "kl", "entropy"):
        a, b = getattr(read, field)[:, cols], getattr(forced, field)[:, cols]
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), field
