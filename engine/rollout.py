"""Rollouts: batched generation with the KV cache, then one scoring pass.

Generation runs our own incremental loop (prompt once, then one cached step per token for the
whole batch) so that every step's *processed* distribution (temperature, top-k, top-p, NLPO mask,
min length) is known exactly. Its support is stored and re-applied when scoring and updating, so
the PPO ratio compares the same distributions that produced the samples. After generation, one
teacher-forced forward pass per model scores every generated token at once (policy log-probs and
values, reference log-probs) -- never one forward per token.

Two distributions per step, on purpose: the *sampled* one (restricted to the support, renormalised)
gives the PPO ratio; the *full-vocabulary* one at the sampling temperature gives the KL penalty and
the entropy statistic, for policy and reference alike, so that cutting the support (top-k, top-p, the
NLPO mask) never hides how far the policy moved from the reference.

Prompts of causal models are left padded (generation continues after the last prompt token);
prompts of encoder-decoder models are right padded (BART's learned absolute positions ignore the
attention mask, so left padding would shift every position of a short prompt).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from engine.kl import kl_estimate
from engine.models.packing import packed_decode_linears, worth_packing
from engine.models.policy import (
    ActorCritic,
    EosBan,
    _accepts,
    cache_kwarg,
    cache_of,
    decoder_prefix,
    entropy_from_logprobs,
    full_logprobs,
    gather_logprobs,
    kl_from_logprobs,
    prefill_distinct,
    restrict_logprobs,
    shared_prompt_rows,
    token_logprobs,
)
from engine.models.precision import autocast


@dataclass
class SamplingSpec:
    """How one step's logits become the sampling distribution."""

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_new_tokens: int = 0
    max_new_tokens: int = 20
    eos_id: int | None = None
    mask_top_p: float | None = None  # NLPO: keep this top-p mass of the masking policy
    mask_min_tokens: int = 1
    #: NLPO: tokens never masked (the tokenizer's special tokens, EOS included, as RL4LMs), so an
    #: episode can always end.
    mask_keep_ids: tuple[int, ...] = ()

    @classmethod
    def from_config(
        cls, gen: Any, eos_id: int | None, nlpo: Any | None = None, special_ids: Any = ()
    ) -> SamplingSpec:
        return cls(
            do_sample=gen.do_sample,
            temperature=gen.temperature,
            top_k=gen.top_k,
            top_p=gen.top_p,
            min_new_tokens=gen.min_new_tokens,
            max_new_tokens=gen.max_new_tokens,
            eos_id=eos_id,
            mask_top_p=nlpo.top_mask if nlpo is not None else None,
            mask_min_tokens=nlpo.min_tokens_to_keep if nlpo is not None else 1,
            mask_keep_ids=tuple(sorted({int(i) for i in special_ids})) if nlpo is not None else (),
        )

    def needs_full_support(self, with_mask: bool) -> bool:
        """True when the action space must be stored per step as a (B, T, V) mask."""
        return self.top_k > 0 or self.top_p < 1.0 or (with_mask and self.mask_top_p is not None)


#: First slice of the most likely tokens ``top_p_keep`` looks at (grown 4x until it holds the set).
TOP_P_FIRST_SLICE = 256


def top_p_keep(logits: torch.Tensor, top_p: float, min_keep: int = 1) -> torch.Tensor:
    """Boolean mask of the smallest set of most likely tokens holding ``top_p`` mass (>= min_keep).

    A token is kept when the mass of the tokens ranked above it is below ``top_p`` (HF's top-p rule;
    ``top_p`` >= 1 keeps every token, which summing 50,000 rounded probabilities need not).
    Why a slice: sorting the whole vocabulary at every decode step was a quarter of an NLPO rollout of
    a tiny model on CPU (50,257 tokens x 32 rows: ~90 ms a step), while the kept set is usually a few
    hundred tokens. So the k most likely tokens are taken (``topk``) and k grows (at least 4x, and past
    the fewest tokens that can hold the missing mass) until, in every row, the slice's last token is past
    the cut; past an eighth of the vocabulary a full sort is cheaper.
    The probabilities are the logits less the whole row's log-sum-exp and the mass above a token is the
    cumulative sum up to the token before it, so a slice gives bit for bit the set the full sort gives
    (ties at the cut aside, which either order breaks arbitrarily).
    """
    v = logits.shape[-1]
    if top_p >= 1.0:
        return torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    n_min = max(1, min_keep)
    k = max(n_min, TOP_P_FIRST_SLICE)
    while True:
        if 8 * k > v:
            k = v
            top, idx = torch.sort(logits, dim=-1, descending=True)
        else:
            top, idx = torch.topk(logits, k, dim=-1)  # descending
        cum = torch.exp(top - lse).cumsum(-1)
        before = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], dim=-1)  # mass ranked above
        keep_sorted = before < top_p
        keep_sorted[..., :n_min] = True
        if k == v or not bool(keep_sorted[..., -1].any()):
            break
        # every token left has at most the slice's last probability: at least this many more are needed
        # (none can be told when that probability is 0, a banned token kept by min_keep: sort)
        short = float(((top_p - cum[..., -1]) / torch.exp(top[..., -1] - lse[..., 0])).max())
        k = max(4 * k, int(1.25 * (k + short)) + 1) if math.isfinite(short) else v
    keep = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    keep.scatter_(-1, idx, keep_sorted)
    return keep


def process_step(
    logits: torch.Tensor, spec: SamplingSpec, step: int, mask_logits: torch.Tensor | None = None
) -> torch.Tensor:
    """Processed logits (temperature applied, excluded tokens at -inf) of one generation step."""
    x = logits.float()
    if mask_logits is not None and spec.mask_top_p is not None:
        keep = top_p_keep(mask_logits.float(), spec.mask_top_p, spec.mask_min_tokens)
        if spec.mask_keep_ids:
            keep[:, list(spec.mask_keep_ids)] = True
        x = x.masked_fill(~keep, float("-inf"))
    if step < spec.min_new_tokens and spec.eos_id is not None:
        x[:, spec.eos_id] = float("-inf")
    if spec.temperature != 1.0:
        x = x / spec.temperature
    if spec.top_k > 0:
        k = min(spec.top_k, x.shape[-1])
        kth = torch.topk(x, k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if spec.top_p < 1.0:
        keep = top_p_keep(x, spec.top_p, 1)
        x = x.masked_fill(~keep, float("-inf"))
    return x


@dataclass
class Generated:
    gen_ids: torch.Tensor  # (B, T) generated tokens, pad after the episode ended
    gen_mask: torch.Tensor  # (B, T) 1 for tokens of the episode (up to and including EOS)
    support: torch.Tensor | EosBan | None  # (B, T, V) bool action space per step; EosBan; None = full vocab
    sample_logprobs: torch.Tensor  # (B, T) log-prob of each token under the processed distribution
    #: With ``generate(policy_scores=True)``: the policy's scores read off the decode steps (the
    #: full-vocabulary tempered log-prob and entropy of each token, and the last hidden state of the
    #: state that chose it), so that the scoring pass need not run the policy again.
    kl_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


class _GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values live in a buffer sized for the whole episode: a step
    writes its token in place, where ``DynamicLayer`` concatenates (copies) the whole cache. At 16
    episodes of ~110 tokens on SmolLM2 the copies were ~0.6 s of a 48-token generation. Made from a
    filled ``DynamicLayer`` by :func:`_preallocate`; anything that replaced ``keys`` behind its back
    (crop, reorder) makes it concatenate again."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, m = self._filled, key_states.shape[-2]
        own = self.keys.data_ptr() == self._kbuf.data_ptr() and self.keys.shape[-2] == n
        if not own or n + m > self._kbuf.shape[-2]:
            return super().update(key_states, value_states, *args, **kwargs)
        self._kbuf[..., n : n + m, :] = key_states
        self._vbuf[..., n : n + m, :] = value_states
        self._filled = n + m
        self.keys = self._kbuf[..., : n + m, :]
        self.values = self._vbuf[..., : n + m, :]
        return self.keys, self.values


def _preallocate(cache: Any, extra: int) -> None:
    """Room for ``extra`` more tokens in every plain (full-attention) layer of a DynamicCache."""
    for layer in getattr(cache, "layers", None) or []:
        if type(layer) is not DynamicLayer or not layer.is_initialized or layer.keys.dim() != 4:
            continue  # sliding-window and other special layers keep their own update
        k, v = layer.keys, layer.values
        n = k.shape[-2]
        kb = k.new_empty(*k.shape[:-2], n + extra, k.shape[-1])
        vb = v.new_empty(*v.shape[:-2], n + extra, v.shape[-1])
        kb[..., :n, :] = k
        vb[..., :n, :] = v
        layer.__class__ = _GrowingLayer
        layer._kbuf, layer._vbuf, layer._filled = kb, vb, n
        layer.keys, layer.values = kb[..., :n, :], vb[..., :n, :]


class _IncrementalLM:
    """Feeds one model step by step with its KV cache, for causal and encoder-decoder LMs alike."""

    def __init__(
        self,
        lm: Any,
        is_seq2seq: bool,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        start_id,
        share_prompts: bool = False,
        room: int = 0,
        want_hidden: bool = False,
    ):
        self.lm, self.is_seq2seq = lm, is_seq2seq
        self.mask = prompt_mask
        self.want_hidden = want_hidden
        self.hidden: torch.Tensor | None = None
        hs = {"output_hidden_states": True} if want_hidden else {}
        if is_seq2seq:
            self.encoder_outputs = lm.get_encoder()(input_ids=prompt_ids, attention_mask=prompt_mask)
            prefix = decoder_prefix(start_id)  # start token (+ forced BOS): given, not chosen
            start = torch.tensor(prefix, dtype=prompt_ids.dtype, device=prompt_ids.device).expand(
                prompt_ids.shape[0], -1
            )
            out = lm(
                encoder_outputs=self.encoder_outputs,
                attention_mask=prompt_mask,
                decoder_input_ids=start,
                use_cache=True,
                **hs,
            )
        else:
            pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
            self.next_pos = pos[:, -1:] + 1
            extra = (
                {"logits_to_keep": 1} if _accepts(lm, "logits_to_keep") else {}
            )  # prefill: last position only
            rows = shared_prompt_rows(prompt_ids, prompt_mask) if share_prompts else None
            if rows is not None:  # each distinct prompt prefilled once, its cache repeated per row
                out = prefill_distinct(lm, prompt_ids, prompt_mask, pos, rows, **hs)
                out.logits = out.logits[:, -1:][rows[1]]
                if want_hidden:
                    out.hidden_states = (out.hidden_states[-1][:, -1:][rows[1]],)
            else:
                out = lm(
                    input_ids=prompt_ids,
                    attention_mask=prompt_mask,
                    position_ids=pos,
                    use_cache=True,
                    **extra,
                    **hs,
                )
        self.cache_kw = cache_kwarg(lm)
        self.past = cache_of(out)
        if room:
            _preallocate(self.past, room)
        self._read(out)

    def _read(self, out: Any) -> None:
        self.logits = out.logits[:, -1]
        if self.want_hidden:
            states = out.decoder_hidden_states if self.is_seq2seq else out.hidden_states
            self.hidden = states[-1][:, -1]

    def step(self, tokens: torch.Tensor) -> None:
        tok = tokens[:, None]
        if self.is_seq2seq:
            out = self.lm(
                encoder_outputs=self.encoder_outputs,
                attention_mask=self.mask,
                decoder_input_ids=tok,
                **{self.cache_kw: self.past},
                use_cache=True,
                output_hidden_states=self.want_hidden,
            )
        else:
            self.mask = torch.cat([self.mask, torch.ones_like(tok, dtype=self.mask.dtype)], dim=1)
            out = self.lm(
                input_ids=tok,
                attention_mask=self.mask,
                position_ids=self.next_pos,
                **{self.cache_kw: self.past},
                use_cache=True,
                output_hidden_states=self.want_hidden,
            )
            self.next_pos = self.next_pos + 1
        self.past = cache_of(out)
        self._read(out)


@torch.no_grad()
def generate(
    lm: Any,
    is_seq2seq: bool,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    spec: SamplingSpec,
    pad_id: int,
    decoder_start_id: int | None = None,
    masking_lm: Any | None = None,
    generator: torch.Generator | None = None,
    autocast_dtype: torch.dtype | None = None,
    record_support: bool = True,
    noise: torch.Tensor | None = None,
    share_prompts: bool = False,
    policy_scores: bool = False,
) -> Generated:
    """Sample a batch of episodes; an episode ends at EOS or after ``max_new_tokens``.

    ``policy_scores``: also read the policy's scores off the decode steps (``Generated.kl_logprobs``,
    ``entropy``, ``hidden``), for :func:`collect` to skip the policy's scoring pass.

    ``noise`` (B, max_new_tokens) uniforms in [0, 1): row i's token at step t is drawn by inverse
    transform sampling with ``noise[i, t]`` instead of from ``generator``, so an episode depends on
    its own noise only, not on which other episodes share its batch (see :func:`sample_noise`).

    ``share_prompts``: rows with the same prompt (a group's completions) are prefilled once.
    """
    device = prompt_ids.device
    bsz = prompt_ids.shape[0]
    with autocast(device, autocast_dtype):
        room = spec.max_new_tokens  # cache room for the episode (written in place, not concatenated)
        pol = _IncrementalLM(
            lm, is_seq2seq, prompt_ids, prompt_mask, decoder_start_id, share_prompts, room, policy_scores
        )
        msk = (
            _IncrementalLM(
                masking_lm, is_seq2seq, prompt_ids, prompt_mask, decoder_start_id, share_prompts, room
            )
            if masking_lm is not None
            else None
        )
        keep_support = record_support and spec.needs_full_support(masking_lm is not None)
        # Decode steps multiply bsz rows by every weight: from weights packed once (engine.models.packing).
        pack = autocast_dtype is None and worth_packing(lm, spec.max_new_tokens)
        with contextlib.ExitStack() as decode_linears:
            decode_linears.enter_context(packed_decode_linears(lm, bsz, pack))
            if masking_lm is not None:
                decode_linears.enter_context(packed_decode_linears(masking_lm, bsz, pack))
            return _decode(pol, msk, spec, pad_id, generator, noise, keep_support, record_support)


def _decode(
    pol: _IncrementalLM,
    msk: _IncrementalLM | None,
    spec: SamplingSpec,
    pad_id: int,
    generator: torch.Generator | None,
    noise: torch.Tensor | None,
    keep_support: bool,
    record_support: bool,
) -> Generated:
    """The decode loop of :func:`generate` (from the prefilled models to the episodes)."""
    tokens, masks, supports, logps = [], [], [], []
    kl_lps: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    hiddens: list[torch.Tensor] = []
    alive = torch.ones(pol.logits.shape[0], dtype=torch.bool, device=pol.logits.device)
    for step in range(spec.max_new_tokens):
        x = process_step(pol.logits, spec, step, msk.logits if msk is not None else None)
        logp = torch.log_softmax(x, dim=-1)
        if spec.do_sample:
            # Inverse transform sampling, one uniform per row: torch.multinomial draws an exponential
            # per vocabulary entry (16 x 49k per SmolLM2 step, ~18 ms on a CPU, 0.9 s of a 48-token
            # generation); the cumulative sum costs ~1 ms.
            u = noise[:, step] if noise is not None else _uniforms(x.shape[0], generator, x.device)
            tok = inverse_cdf_sample(logp.exp(), u)
        else:
            tok = logp.argmax(-1)
        tok = torch.where(alive, tok, torch.full_like(tok, pad_id))
        tokens.append(tok)
        masks.append(alive.clone())
        logps.append(logp.gather(1, tok[:, None]).squeeze(1).masked_fill(~alive, 0.0))
        if pol.want_hidden:  # the full tempered distribution, as the scoring pass's kl_logprobs/entropy
            full = torch.log_softmax(pol.logits.float() / spec.temperature, dim=-1)
            kl_lps.append(full.gather(1, tok[:, None]).squeeze(1).masked_fill(~alive, 0.0))
            entropies.append(entropy_from_logprobs(full).masked_fill(~alive, 0.0))
            hiddens.append(pol.hidden)
        if keep_support:
            # A finished row's pad token was never sampled: its action space is the whole
            # vocabulary, so the pad's restricted log-prob is finite (not -inf, which times the
            # 0 of gen_mask is NaN in every later ratio, loss and TRPO gradient).
            supports.append(torch.isfinite(x) | ~alive[:, None])
        if spec.eos_id is not None:
            alive = alive & (tok != spec.eos_id)
        if not bool(alive.any()) or step == spec.max_new_tokens - 1:
            break
        pol.step(tok)
        if msk is not None:
            msk.step(tok)
    gen_ids = torch.stack(tokens, dim=1)
    gen_mask = torch.stack(masks, dim=1).float()
    support: torch.Tensor | EosBan | None = None
    if keep_support:
        support = torch.stack(supports, dim=1)
    elif record_support and spec.min_new_tokens > 0 and spec.eos_id is not None:
        support = EosBan(spec.eos_id, spec.min_new_tokens)
    if not pol.want_hidden:
        return Generated(gen_ids, gen_mask, support, torch.stack(logps, dim=1))
    return Generated(
        gen_ids,
        gen_mask,
        support,
        torch.stack(logps, dim=1),
        torch.stack(kl_lps, dim=1),
        torch.stack(entropies, dim=1),
        torch.stack(hiddens, dim=1),
    )


def sample_noise(seeds: list[int], steps: int, device: Any) -> torch.Tensor:
    """(len(seeds), steps) uniforms, row i from a generator seeded by ``seeds[i]``.

    The trainer seeds row i with ``(train.seed, iteration, global index of the sample)``: a sample's
    tokens are then the same whether the batch is generated in one chunk, in several chunks
    (``rollout.batch_size``) or by several processes (engine.distributed).
    """
    rows = [torch.rand(steps, generator=torch.Generator().manual_seed(int(s))) for s in seeds]
    return torch.stack(rows).to(device)


def _uniforms(n: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """``n`` uniforms in [0, 1) from ``generator`` (on its device) or the global stream."""
    if generator is None:
        return torch.rand(n, device=device)
    return torch.rand(n, generator=generator, device=generator.device).to(device)


def inverse_cdf_sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids with P(id) = probs[id]: the first id whose cumulative probability exceeds ``u``·total.

    Ids of probability 0 are never returned (a rounding edge at the top falls back to the most
    likely token).
    """
    cdf = probs.double().cumsum(-1)  # fp32 sums of 49k terms would misplace the rarest tokens' bins
    target = (u.to(cdf.device, cdf.dtype) * cdf[:, -1]).unsqueeze(1)
    tok = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)
    ok = probs.gather(1, tok[:, None]).squeeze(1) > 0
    return torch.where(ok, tok, probs.argmax(-1))


@dataclass
class RolloutBatch:
    """Episodes of one iteration, padded to common prompt/generation lengths."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    gen_ids: torch.Tensor
    gen_mask: torch.Tensor
    support: torch.Tensor | EosBan | None
    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    values: torch.Tensor
    sample_logprobs: torch.Tensor
    #: (B, T) policy log-prob of each token under the full-vocabulary tempered distribution
    kl_logprobs: torch.Tensor | None = None
    #: (B, T) per-token KL estimate the penalty uses (``kl.estimator``), 0 after the episode
    kl: torch.Tensor | None = None
    #: (B, T) entropy of the policy's full-vocabulary tempered distribution
    entropy: torch.Tensor | None = None
    #: False when the rollout skipped the policy's scoring pass (a one-step critic-free update scores
    #: in its own forward): ``logprobs``, ``kl_logprobs``, ``kl`` and ``entropy`` are zeros until the
    #: update fills them in, ``values`` stay zeros
    policy_scored: bool = True
    #: True when ``ref_logprobs`` come from a reference model (else they are the policy's own)
    has_reference: bool = True
    #: the per-token estimator of ``kl`` (``kl.estimator``)
    kl_estimator: str = "k1"
    prompts: list[str] = field(default_factory=list)
    generations: list[str] = field(default_factory=list)
    references: list[list[str]] = field(default_factory=list)
    meta: list[dict] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)

    def model_inputs(self, idx: torch.Tensor | slice | None = None) -> dict[str, torch.Tensor]:
        sel = (lambda t: t) if idx is None else (lambda t: t[idx])
        out = {
            "prompt_ids": sel(self.prompt_ids),
            "prompt_mask": sel(self.prompt_mask),
            "gen_ids": sel(self.gen_ids),
            "gen_mask": sel(self.gen_mask),
        }
        return out

    def __len__(self) -> int:
        return self.gen_ids.shape[0]


def prompt_padding_side(is_seq2seq: bool) -> str:
    """Causal prompts are left padded (generation follows the last prompt token); encoder prompts
    right padded (absolute learned positions, as BART's, ignore the attention mask)."""
    return "right" if is_seq2seq else "left"


def tokenize_prompts(
    tokenizer: Any, prompts: list[str], max_length: int, device, padding_side: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded, truncated prompts; an empty prompt becomes one BOS/EOS token.

    ``padding_side`` overrides the tokenizer's (see :func:`prompt_padding_side`); None keeps it.
    """
    fixed = [p if p else (tokenizer.bos_token or tokenizer.eos_token or "") for p in prompts]
    saved = tokenizer.padding_side
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    try:
        enc = tokenizer(fixed, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    finally:
        tokenizer.padding_side = saved
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if ids.shape[1] == 0:
        raise ValueError("prompts tokenized to nothing and the tokenizer has no BOS/EOS token")
    return ids.to(device), mask.to(device)


def _pad_to(t: torch.Tensor, length: int, value: Any, left: bool) -> torch.Tensor:
    extra = length - t.shape[1]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[1] = extra
    pad = torch.full(shape, value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def cat_padded(parts: list[torch.Tensor], value: Any, left: bool) -> torch.Tensor:
    length = max(p.shape[1] for p in parts)
    return torch.cat([_pad_to(p, length, value, left) for p in parts], dim=0)


@dataclass
class Scored:
    """What the scoring pass returns for a batch of episodes; every (B, T) tensor is 0 after the episode."""

    logprobs: torch.Tensor  # sampled (support-restricted) distribution: the PPO ratio's
    ref_logprobs: torch.Tensor  # reference, full vocabulary at the sampling temperature
    values: torch.Tensor
    kl_logprobs: torch.Tensor  # policy, full vocabulary at the sampling temperature
    kl: torch.Tensor  # per-token KL estimate of the penalty
    entropy: torch.Tensor  # entropy of the policy's full tempered distribution

    @classmethod
    def masked(cls, mask: torch.Tensor, *fields: torch.Tensor) -> Scored:
        """The fields in declaration order, each times ``mask`` (values in fp32)."""
        return cls(*(f.float() * mask if i == 2 else f * mask for i, f in enumerate(fields)))


@torch.no_grad()
def reference_logprobs(
    ref_lm: Any,
    policy: ActorCritic,
    inputs: dict[str, torch.Tensor],
    temperature: float,
    autocast_dtype,
    share_prompts: bool = False,
) -> torch.Tensor:
    """(B, T) reference log-probs of the generated tokens (full vocabulary at the sampling temperature),
    masked; no (B, T, V) log-softmax is kept (log p = x_a - logsumexp x)."""
    device = inputs["gen_ids"].device
    with autocast(device, autocast_dtype):
        r_logits, _ = policy.lm_forward_batch(
            ref_lm, inputs, want_hidden=False, share_prompts=share_prompts, lazy_head=True
        )
    _, ref_lp, _ = token_logprobs(r_logits, inputs["gen_ids"], temperature, None, want_entropy=False)
    return ref_lp * inputs["gen_mask"]


@torch.no_grad()
def score(
    policy: ActorCritic,
    ref_lm: Any | None,
    inputs: dict[str, torch.Tensor],
    support: torch.Tensor | EosBan | None,
    temperature: float,
    autocast_dtype: torch.dtype | None,
    kl_estimator: str = "k1",
    share_prompts: bool = False,
) -> Scored:
    """One forward per model over all generated tokens.

    At most two (B, T, V) tensors live at once: the policy's full log-probs and, for the ``full``
    estimator only, the reference's. Without a (B, T, V) support mask and with a sampled KL estimator,
    no (B, T, V) log-softmax is made at all (:func:`_score_from_head`).
    """
    device = inputs["gen_ids"].device
    ids = inputs["gen_ids"]
    if kl_estimator != "full" and not isinstance(support, torch.Tensor):
        return _score_from_head(
            policy, ref_lm, inputs, support, temperature, autocast_dtype, kl_estimator, share_prompts
        )
    with autocast(device, autocast_dtype):
        logits, values = policy.forward_tokens(inputs, want_values=True, share_prompts=share_prompts)
    full = full_logprobs(logits, temperature)
    del logits
    kl_lp = gather_logprobs(full, ids)
    logp = kl_lp if support is None else gather_logprobs(restrict_logprobs(full, support), ids)
    entropy = entropy_from_logprobs(full)
    if kl_estimator != "full":
        del full
    kl = None
    if ref_lm is not None:
        with autocast(device, autocast_dtype):
            r_logits, _ = policy.lm_forward_batch(
                ref_lm, inputs, want_hidden=False, share_prompts=share_prompts
            )
        r_full = full_logprobs(r_logits, temperature)
        del r_logits
        ref_lp = gather_logprobs(r_full, ids)
        if kl_estimator == "full":
            kl = kl_from_logprobs(full, r_full)
            del full
        del r_full
    else:  # no reference (tests, zero-shot): no penalty
        ref_lp = kl_lp.clone()
        kl = torch.zeros_like(kl_lp)
        if kl_estimator == "full":
            del full
    if kl is None:
        kl = kl_estimate(kl_lp, ref_lp, kl_estimator)
    mask = inputs["gen_mask"]
    return Scored.masked(mask, logp, ref_lp, values, kl_lp, kl, entropy)


def _score_from_head(
    policy: ActorCritic,
    ref_lm: Any | None,
    inputs: dict[str, torch.Tensor],
    support: EosBan | None,
    temperature: float,
    autocast_dtype: torch.dtype | None,
    kl_estimator: str,
    share_prompts: bool,
) -> Scored:
    """:func:`score` through the fused head (:func:`token_logprobs` of :class:`HeadLogits`): the
    policy's and the reference's log-probs as ``x_a - logsumexp(x)`` from one logits buffer each,
    reduced in place. Why: the log-softmax path makes half a dozen fresh (B, T, V) tensors per model
    (~150 MB each for SmolLM2 at 16 x 48 tokens), which on a CPU cost more in page faults than the
    arithmetic in them. The same numbers up to float rounding; models without a plain head get the
    logits from :func:`token_logprobs` as before."""
    device = inputs["gen_ids"].device
    ids = inputs["gen_ids"]
    with autocast(device, autocast_dtype):
        head, values = policy.forward_tokens(
            inputs, want_values=True, share_prompts=share_prompts, lazy_head=True
        )
    logp, kl_lp, entropy = token_logprobs(head, ids, temperature, support)
    del head
    return _with_reference(
        policy,
        ref_lm,
        inputs,
        (logp, kl_lp, values, entropy),
        temperature,
        autocast_dtype,
        kl_estimator,
        share_prompts,
    )


def _with_reference(
    policy: ActorCritic,
    ref_lm: Any | None,
    inputs: dict[str, torch.Tensor],
    policy_scores: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    temperature: float,
    autocast_dtype: torch.dtype | None,
    kl_estimator: str,
    share_prompts: bool,
) -> Scored:
    """:class:`Scored` from the policy's (sampled log-prob, full log-prob, value, entropy) per token: the
    reference's pass (:func:`reference_logprobs`) and the KL estimate added, everything masked."""
    logp, kl_lp, values, entropy = policy_scores
    mask = inputs["gen_mask"]
    if ref_lm is not None:
        ref_lp = reference_logprobs(ref_lm, policy, inputs, temperature, autocast_dtype, share_prompts)
        kl = kl_estimate(kl_lp, ref_lp, kl_estimator)
    else:  # no reference (tests, zero-shot): no penalty
        ref_lp = kl_lp.clone()
        kl = torch.zeros_like(kl_lp)
    return Scored.masked(mask, logp, ref_lp, values, kl_lp, kl, entropy)


def collect(
    policy: ActorCritic,
    ref_lm: Any | None,
    tokenizer: Any,
    samples: list[Any],
    spec: SamplingSpec,
    max_prompt_length: int,
    batch_size: int,
    device,
    generator: torch.Generator | None = None,
    masking_lm: Any | None = None,
    autocast_dtype: torch.dtype | None = None,
    timings: dict[str, float] | None = None,
    kl_estimator: str = "k1",
    score_policy: bool = True,
    sample_seeds: list[int] | None = None,
    share_prompts: bool = False,
    scores_from_generation: bool | None = None,
    score_context: Callable[[], AbstractContextManager[Any]] | None = None,
) -> RolloutBatch:
    """Generate and score episodes for ``samples`` in chunks of ``batch_size`` prompts.

    ``score_context``: entered around each chunk's scoring pass only (``model.compile``'s compiled
    blocks, :mod:`engine.models.compiled`); generation runs outside it.

    ``scores_from_generation``: read the policy's scores off the decode steps (:func:`_scores_from_generation`;
    None: the default, on for causal LMs in fp32).

    ``score_policy=False`` skips the policy's scoring pass (only the reference, if any, scores): for an
    update that scores in its own forward (see ``RolloutBatch.policy_scored``). The ``full`` KL
    estimator needs both whole distributions at once, so it always scores.

    ``sample_seeds`` (one per sample): per-sample sampling noise (:func:`sample_noise`) instead of
    ``generator``, so the episodes do not depend on the chunking.

    ``share_prompts``: a prompt that several episodes of a chunk share (a group's G completions) goes
    through each model once, in generation and scoring (:func:`engine.models.policy.lm_forward`).
    """
    score_policy = score_policy or kl_estimator == "full"
    from_generation = _scores_from_generation(
        scores_from_generation, policy, score_policy, autocast_dtype, kl_estimator
    )
    timings = timings if timings is not None else {}
    timings.update({k: timings.get(k, 0.0) for k in ("generate", "score")})
    side = prompt_padding_side(policy.is_seq2seq)
    chunks: list[_Chunk] = []
    was_training = policy.training
    policy.eval()
    for start in range(0, len(samples), batch_size):
        chunk = samples[start : start + batch_size]
        t0 = time.perf_counter()
        pi, pm = tokenize_prompts(tokenizer, [s.prompt for s in chunk], max_prompt_length, device, side)
        seeds = sample_seeds[start : start + batch_size] if sample_seeds is not None else None
        g = generate(
            policy.lm, policy.is_seq2seq, pi, pm, spec, tokenizer.pad_token_id, policy.decoder_start_id,
            masking_lm=masking_lm, generator=generator, autocast_dtype=autocast_dtype,
            noise=sample_noise(seeds, spec.max_new_tokens, device) if seeds is not None else None,
            share_prompts=share_prompts, policy_scores=from_generation,
        )  # fmt: skip
        t1 = time.perf_counter()
        inputs = {"prompt_ids": pi, "prompt_mask": pm, "gen_ids": g.gen_ids, "gen_mask": g.gen_mask}
        with score_context() if score_context is not None else contextlib.nullcontext():
            sc = _score_chunk(
                policy,
                ref_lm,
                inputs,
                g,
                spec.temperature,
                autocast_dtype,
                kl_estimator,
                share_prompts,
                score_policy,
            )
        timings["generate"] += t1 - t0
        timings["score"] += time.perf_counter() - t1
        chunks.append(_Chunk(pi, pm, g, sc))
    policy.train(was_training)
    return _assemble(chunks, samples, tokenizer, side, score_policy, ref_lm is not None, kl_estimator)


def _scores_from_generation(
    asked: bool | None,
    policy: ActorCritic,
    score_policy: bool,
    autocast_dtype: torch.dtype | None,
    kl_estimator: str,
) -> bool:
    """Whether :func:`collect` reads the policy's log-probs, entropy and hidden states (hence shared-head
    values) off the decode steps that sampled the tokens, so that only the reference (and a separate
    critic) run a scoring pass: the same numbers as the policy's teacher-forced pass up to float rounding
    (a KV-cached step multiplies the same weights by the same activations). By default (``asked``
    None) for causal LMs, on request for encoder-decoders — their first decode step (the decoder prefix
    through the cache) differed from its teacher-forced row by ~1e-3 in log-prob on the tiny T5. In fp32
    only: bf16 decode steps differ from a bf16 teacher-forced pass by bf16 rounding, which would move the
    first minibatch's PPO ratio away from 1. Never for the ``full`` KL estimator (it needs the whole
    distributions) or when the policy is not scored at all. The price of the default: the policy's and
    the reference's log-probs come from different kernels, so the first iteration's KL is rounding
    (~1e-7 per token), not exactly 0; the whole suite passed with it on (issue #30)."""
    if asked is None:
        asked = not policy.is_seq2seq
    asked = asked and autocast_dtype is None
    return asked and score_policy and kl_estimator != "full"


@dataclass
class _Chunk:
    """One chunk of a rollout: its prompts, what generation produced and what scoring added."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    generated: Generated
    scored: Scored


@torch.no_grad()
def _score_chunk(
    policy: ActorCritic,
    ref_lm: Any | None,
    inputs: dict[str, torch.Tensor],
    g: Generated,
    temperature: float,
    autocast_dtype: torch.dtype | None,
    kl_estimator: str,
    share_prompts: bool,
    score_policy: bool,
) -> Scored:
    """The scoring pass of one chunk; without ``score_policy`` only the reference scores (if there is
    one) and the policy's fields stay zeros for the update to fill in. When generation read the
    policy's scores (``g.hidden``, ``generate(policy_scores=True)``), only the reference and a
    separate critic run: the values come from the value head on the stored hidden states (or the
    critic's own pass). Why: the policy's teacher-forced pass repeats the work its decode steps just
    did (~1.6 s of a 16-episode SmolLM2 iteration in fp32, issue #30)."""
    if score_policy and g.hidden is not None:
        if policy.critic is None:
            values = policy.value_head(g.hidden)
        else:
            with autocast(inputs["gen_ids"].device, autocast_dtype):
                values = policy.critic_values(inputs, share_prompts=share_prompts)
        scores = (g.sample_logprobs, g.kl_logprobs, values, g.entropy)
        return _with_reference(
            policy, ref_lm, inputs, scores, temperature, autocast_dtype, kl_estimator, share_prompts
        )
    if score_policy:
        return score(
            policy, ref_lm, inputs, g.support, temperature, autocast_dtype, kl_estimator, share_prompts
        )
    zeros = torch.zeros_like(g.gen_mask)
    ref_lp = (
        reference_logprobs(ref_lm, policy, inputs, temperature, autocast_dtype, share_prompts)
        if ref_lm is not None
        else zeros
    )
    return Scored(zeros, ref_lp, zeros, zeros.clone(), zeros.clone(), zeros.clone())


def _cat_support(supports: list[Any], t_max: int) -> Any:
    """The chunks' supports as one: (B, T, V) masks padded with "every token allowed" to ``t_max``
    steps, or the chunks' common EosBan / None (the same spec made every chunk's)."""
    support = supports[0]
    if not isinstance(support, torch.Tensor):
        return support
    sups = []
    for s in supports:
        if s.shape[1] < t_max:
            fill = torch.ones(s.shape[0], t_max - s.shape[1], s.shape[2], dtype=torch.bool, device=s.device)
            s = torch.cat([s, fill], 1)
        sups.append(s)
    return torch.cat(sups, dim=0)


def _assemble(
    chunks: list[_Chunk],
    samples: list[Any],
    tokenizer: Any,
    side: str,
    policy_scored: bool,
    has_reference: bool,
    kl_estimator: str,
) -> RolloutBatch:
    """The chunks as one batch padded to common lengths, with the samples' texts and the decoded generations."""
    pad_id = tokenizer.pad_token_id
    gens = [c.generated for c in chunks]
    scored = [c.scored for c in chunks]
    t_max = max(g.gen_ids.shape[1] for g in gens)
    gen_ids = cat_padded([g.gen_ids for g in gens], pad_id, left=False)
    gen_mask = cat_padded([g.gen_mask for g in gens], 0.0, left=False)
    texts = decode_generations(tokenizer, gen_ids, gen_mask)

    def right_padded(name: str) -> torch.Tensor:
        return cat_padded([getattr(sc, name) for sc in scored], 0.0, left=False)

    # prompts of one batch share the padding side of their chunks (left: causal, right: encoder)
    return RolloutBatch(
        prompt_ids=cat_padded([c.prompt_ids for c in chunks], pad_id, left=side == "left"),
        prompt_mask=cat_padded([c.prompt_mask for c in chunks], 0, left=side == "left"),
        gen_ids=gen_ids,
        gen_mask=gen_mask,
        support=_cat_support([g.support for g in gens], t_max),
        logprobs=right_padded("logprobs"),
        ref_logprobs=right_padded("ref_logprobs"),
        values=right_padded("values"),
        sample_logprobs=cat_padded([g.sample_logprobs for g in gens], 0.0, left=False),
        kl_logprobs=right_padded("kl_logprobs"),
        kl=right_padded("kl"),
        entropy=right_padded("entropy"),
        policy_scored=policy_scored,
        has_reference=has_reference,
        kl_estimator=kl_estimator,
        prompts=[s.prompt for s in samples],
        generations=texts,
        references=[list(s.references) for s in samples],
        meta=[dict(s.meta) for s in samples],
        ids=[str(s.id) for s in samples],
    )


def decode_generations(tokenizer: Any, gen_ids: torch.Tensor, gen_mask: torch.Tensor) -> list[str]:
    lengths = gen_mask.sum(1).long().tolist()
    return [tokenizer.decode(row[:n].tolist(), skip_special_tokens=True) for row, n in zip(gen_ids, lengths)]
