"""Actor-critic policy over a HuggingFace LM, for causal and encoder-decoder models.

The value head sits on the policy's own trunk by default, so one forward pass yields both the
token distribution and the values (RL4LMs and several peers keep a second full model as critic,
which doubles memory and compute). A separate critic remains available for comparison.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from engine.models.head import HeadLogits, head_token_logits, plain_head_weight


def hidden_size_of(lm: Any) -> int:
    out = lm.get_output_embeddings()
    if out is not None and hasattr(out, "in_features"):
        return int(out.in_features)
    cfg = lm.config
    for attr in ("hidden_size", "d_model", "n_embd"):
        if getattr(cfg, attr, None):
            return int(getattr(cfg, attr))
    raise ValueError("cannot infer the hidden size of the model")


class ValueHead(nn.Module):
    """A linear value estimate per position; zero-initialised so early advantages are the raw returns."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)


def decoder_prefix(decoder_start_id: int | Sequence[int] | None) -> list[int]:
    """The decoder tokens every episode starts from: the start token, then a forced BOS if the model has one."""
    if decoder_start_id is None:
        raise ValueError("encoder-decoder model without decoder_start_token_id or pad_token_id in its config")
    if isinstance(decoder_start_id, int):
        return [decoder_start_id]
    return [int(t) for t in decoder_start_id]


def forced_bos_of(lm: Any) -> int | None:
    """``forced_bos_token_id`` (BART/mBART): the first decoder token is forced, so it is no action.

    transformers 5 keeps it on the generation config; older checkpoints on the model config.
    """
    for cfg in (getattr(lm, "generation_config", None), getattr(lm, "config", None)):
        value = getattr(cfg, "forced_bos_token_id", None) if cfg is not None else None
        if value is not None:
            return int(value)
    return None


def decoder_start_of(lm: Any, is_seq2seq: bool) -> int | list[int] | None:
    """What generation and scoring feed the decoder first: the start token, or [start, forced BOS]."""
    cfg = lm.config
    start = getattr(cfg, "decoder_start_token_id", None)
    if start is None:
        start = getattr(cfg, "pad_token_id", None)
    forced = forced_bos_of(lm) if is_seq2seq else None
    if forced is None or start is None:
        return start
    return [int(start), forced]


def lm_forward(
    lm: Any,
    is_seq2seq: bool,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    gen_ids: torch.Tensor,
    gen_mask: torch.Tensor,
    decoder_start_id: int | Sequence[int] | None,
    want_hidden: bool,
    share_prompts: bool = False,
    lazy_head: bool = False,
    need_logits: bool = True,
) -> tuple[torch.Tensor | HeadLogits, torch.Tensor | None]:
    """One teacher-forced pass over prompt+generation: logits (and last hidden) for every generated token.

    Row t of the result is the distribution that chose ``gen_ids[:, t]``. Causal inputs are left
    padded; position ids come from the attention mask so padding never shifts positions. Encoder
    inputs are right padded (absolute learned positions, as BART's, ignore the attention mask), and
    the decoder starts from :func:`decoder_prefix` (start token, plus a forced BOS where the model has one).

    ``share_prompts`` (causal models): rows with the same prompt (a GRPO group's completions) run
    their prompt through the model once; its KV cache is then repeated per row and the completions
    attend to it (:func:`shared_prompt_forward`). The same numbers up to float rounding, with the
    prompt's share of the work divided by the group size, gradients included.

    ``lazy_head`` (causal models with a plain linear head, :func:`plain_head_weight`): return
    :class:`HeadLogits` — the head's input — instead of logits, for :func:`token_logprobs` to reduce
    without (B, T, V) temporaries. Models without such a head return logits as usual.

    ``need_logits=False`` with ``want_hidden`` (a separate critic, causal models): only the hidden
    states matter; the base model runs alone and the first element returned must not be used.
    """
    t_len = gen_ids.shape[1]
    head_weight = plain_head_weight(lm) if lazy_head and not is_seq2seq else None
    device_type = prompt_ids.device.type
    # Under autocast the head's product runs in the autocast dtype, as the logits path's would.
    compute_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if not need_logits and not is_seq2seq and want_hidden and trunk_callable(lm):
        # A critic: its trunk's last hidden state is all it needs — no head, no (B, T, V) logits, no
        # other layer's states kept (issue #30), whatever the head looks like and whatever the precision.
        head_weight, compute_dtype = lm.get_input_embeddings().weight, None  # a stand-in, never multiplied
    if is_seq2seq:
        return _seq2seq_forward(lm, prompt_ids, prompt_mask, gen_ids, gen_mask, decoder_start_id, want_hidden)
    tied = need_logits and head_weight is not None and head_weight is lm.get_input_embeddings().weight
    rows = shared_prompt_rows(prompt_ids, prompt_mask) if share_prompts else None
    if rows is not None:
        with tied_embedding_grad(lm, tied):
            return shared_prompt_forward(
                lm, prompt_ids, prompt_mask, gen_ids, gen_mask, rows, want_hidden, head_weight, compute_dtype
            )
    p_len = prompt_ids.shape[1]
    ids = torch.cat([prompt_ids, gen_ids], dim=1)
    mask = torch.cat([prompt_mask, gen_mask.to(prompt_mask.dtype)], dim=1)
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    if head_weight is not None:
        with tied_embedding_grad(lm, tied):
            out = lm.base_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        hidden = out.last_hidden_state[:, p_len - 1 : p_len + t_len - 1]
        return HeadLogits(hidden, head_weight, compute_dtype), (hidden if want_hidden else None)
    kwargs: dict[str, Any] = {}
    if _accepts(lm, "logits_to_keep"):
        kwargs["logits_to_keep"] = t_len + 1
    out = lm(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        output_hidden_states=want_hidden,
        use_cache=False,
        **kwargs,
    )
    logits = out.logits
    logits = logits[:, -(t_len + 1) : -1]
    hidden = out.hidden_states[-1][:, p_len - 1 : p_len + t_len - 1] if want_hidden else None
    return logits, hidden


_ROWS_INTO_GRAD: contextvars.ContextVar[bool] = contextvars.ContextVar("grue_rows_into_grad", default=False)


@contextlib.contextmanager
def embedding_rows_into_grad(enabled: bool = True) -> Iterator[None]:
    """Inside (an update loop whose gradients reach the parameters through ``loss.backward()``): a tied
    input embedding adds its rows straight into the weight's ``.grad`` (:class:`_EmbeddingRowsIntoGrad`).
    An opt-in because the rows bypass autograd's return values: a loop that takes its gradients from
    ``torch.autograd.grad`` (TRPO's) must not enter it."""
    token = _ROWS_INTO_GRAD.set(enabled)
    try:
        yield
    finally:
        _ROWS_INTO_GRAD.reset(token)


class _EmbeddingRowsIntoGrad(torch.autograd.Function):
    """An embedding lookup whose backward adds the looked-up rows' gradients into ``param.grad`` in
    place. Why: with a tied head the weight gets two gradients, the head's dense (V, H) product and the
    lookup's rows. Autograd sums them in its input buffer, and a sparse addend is never summed in place
    there (sparse tensors count as subclass-like): ``dense + sparse`` allocates and copies a new 113 MB
    tensor for SmolLM2 on every minibatch (a profile of the PPO update, docs/benchmarks.md). Here the
    weight enters detached — its only autograd edge is the head's, whose gradient becomes ``.grad``
    without a copy — and the rows are added into that ``.grad`` (or into a zeroed one that the head's
    gradient is then added to, whichever comes first: the sum is the same). ``anchor`` is a
    zero-element leaf that makes autograd call this backward at all."""

    @staticmethod
    def forward(
        ctx: Any, ids: torch.Tensor, weight: torch.Tensor, anchor: torch.Tensor, holder: Any
    ) -> torch.Tensor:
        param, padding_idx = holder
        ctx.save_for_backward(ids)
        ctx.param, ctx.padding_idx = param, padding_idx
        return nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[None, None, None, None]:
        (ids,) = ctx.saved_tensors
        param = ctx.param
        flat = ids.reshape(-1)
        rows = grad_out.reshape(flat.shape[0], -1).to(param.dtype)
        if ctx.padding_idx is not None:  # nn.Embedding's padding row gets no gradient
            keep = flat != ctx.padding_idx
            flat, rows = flat[keep], rows[keep]
        with torch.no_grad():
            if param.grad is None:
                param.grad = torch.zeros_like(param, memory_format=torch.contiguous_format)
            param.grad.index_add_(0, flat, rows)
        return None, None, None, None


@contextlib.contextmanager
def tied_embedding_grad(lm: Any, tied: bool) -> Iterator[None]:
    """Inside, with ``tied`` (the lazy head's weight is the input embedding's, and grad is on): the
    input embedding does not make a dense (V, H) gradient — a zeroed 113 MB tensor for SmolLM2 on every
    minibatch, then added into the head's. In an update loop that opted in
    (:func:`embedding_rows_into_grad`) it adds its rows into the weight's ``.grad`` in place
    (:class:`_EmbeddingRowsIntoGrad`); elsewhere its backward yields a sparse gradient, which autograd
    adds to the head's dense one (out of place, one copy). Only for a tied weight: alone, a sparse
    ``.grad`` would reach optimizers (fused AdamW) that refuse it."""
    emb = lm.get_input_embeddings()
    if not (tied and torch.is_grad_enabled() and type(emb) is nn.Embedding and emb.weight.requires_grad):
        yield
        return
    plain = type(emb.weight.data) is torch.Tensor and emb.max_norm is None and not emb.scale_grad_by_freq
    if _ROWS_INTO_GRAD.get() and plain:
        weight = emb.weight
        holder = (weight, emb.padding_idx)

        def lookup(ids: torch.Tensor) -> torch.Tensor:
            anchor = torch.empty(0, device=ids.device, requires_grad=True)
            return _EmbeddingRowsIntoGrad.apply(ids, weight.detach(), anchor, holder)

        emb.forward = lookup  # an instance attribute shadows nn.Embedding.forward until deleted
        try:
            yield
        finally:
            del emb.forward
        return
    before = emb.sparse
    emb.sparse = True
    try:
        yield
    finally:
        emb.sparse = before


def _seq2seq_forward(
    lm: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    gen_ids: torch.Tensor,
    gen_mask: torch.Tensor,
    decoder_start_id: int | Sequence[int] | None,
    want_hidden: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`lm_forward` of an encoder-decoder: the decoder reads the :func:`decoder_prefix`, then the
    generated tokens shifted by one; the rows of the prefix's forced tokens are cut off."""
    prefix = decoder_prefix(decoder_start_id)
    start = torch.tensor(prefix, dtype=gen_ids.dtype, device=gen_ids.device).expand(gen_ids.shape[0], -1)
    dec_in = torch.cat([start, gen_ids[:, :-1]], dim=1)
    dec_mask = torch.cat([torch.ones_like(start), gen_mask[:, :-1].to(start.dtype)], dim=1)
    out = lm(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        decoder_input_ids=dec_in,
        decoder_attention_mask=dec_mask,
        output_hidden_states=want_hidden,
        use_cache=False,
    )
    skip = len(prefix) - 1  # rows of the forced prefix tokens choose nothing
    hidden = out.decoder_hidden_states[-1][:, skip:] if want_hidden else None
    return out.logits[:, skip:], hidden


def shared_prompt_rows(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first row of each distinct prompt, index of each row's prompt among them)`` when some rows
    share a prompt; None when every row's prompt differs (nothing to share)."""
    n = prompt_ids.shape[0]
    if n < 2:
        return None
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
    if distinct.shape[0] == n:
        return None
    rows = torch.arange(n, device=prompt_ids.device)
    first = torch.full((distinct.shape[0],), n, dtype=torch.long, device=prompt_ids.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return first, inverse


def cache_of(out: Any) -> Any:
    """transformers 5 renamed ``past_key_values`` to ``cache``; accept both."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def cache_kwarg(lm: Any) -> str:
    return "cache" if _accepts(lm, "cache") else "past_key_values"


def prefill_distinct(
    lm: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    position_ids: torch.Tensor,
    rows: tuple[torch.Tensor, torch.Tensor],
    **kwargs: Any,
) -> Any:
    """Each distinct prompt through a causal ``lm`` once (``rows`` from :func:`shared_prompt_rows`;
    last position's logits only where the model allows), then its KV cache repeated per row (an
    index, so gradients sum back into the one pass). The output's logits and hidden states stay one
    per distinct prompt: index them with ``rows[1]``. Generation's prefill and
    :func:`shared_prompt_forward` both start here."""
    first, inverse = rows
    extra: dict[str, Any] = {"logits_to_keep": 1} if _accepts(lm, "logits_to_keep") else {}
    out = lm(
        input_ids=prompt_ids[first],
        attention_mask=prompt_mask[first],
        position_ids=position_ids[first],
        use_cache=True,
        **extra,
        **kwargs,
    )
    cache_of(out).batch_select_indices(inverse)
    return out


def shared_prompt_forward(
    lm: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    gen_ids: torch.Tensor,
    gen_mask: torch.Tensor,
    rows: tuple[torch.Tensor, torch.Tensor],
    want_hidden: bool,
    head_weight: torch.Tensor | None = None,
    compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor | HeadLogits, torch.Tensor | None]:
    """``lm_forward`` of a causal LM with each distinct prompt run once (``rows`` from
    :func:`shared_prompt_rows`). The prompt pass yields the KV cache and the distribution of the first
    generated token; the cache is repeated per row (an index, so gradients sum back into the one
    prompt pass) and the completions run on top of it. A group of G completions then costs one
    prompt + G completions instead of G prompts + G completions (GRPO's prompts are ~55 of ~105
    tokens on the IMDB workload). With ``head_weight`` (``lm_forward``'s ``lazy_head``) both passes
    run the base model and the result is :class:`HeadLogits`."""
    inverse = rows[1]
    model = lm if head_weight is None else lm.base_model
    pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = prefill_distinct(
        model, prompt_ids, prompt_mask, pos, rows, output_hidden_states=want_hidden and head_weight is None
    )
    cache = cache_of(out)
    if head_weight is not None:
        hidden = out.last_hidden_state[:, -1:][inverse]
        logits = None
    else:
        logits = out.logits[:, -1:][inverse]
        hidden = out.hidden_states[-1][:, -1:][inverse] if want_hidden else None
    if gen_ids.shape[1] > 1:  # the last token's own distribution chooses nothing
        mask = torch.cat([prompt_mask, gen_mask[:, :-1].to(prompt_mask.dtype)], dim=1)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, prompt_ids.shape[1] :]
        out = model(
            input_ids=gen_ids[:, :-1],
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            output_hidden_states=want_hidden and head_weight is None,
            **{cache_kwarg(model): cache},
        )
        if head_weight is not None:
            hidden = torch.cat([hidden, out.last_hidden_state], dim=1)
        else:
            logits = torch.cat([logits, out.logits], dim=1)
            if want_hidden:
                hidden = torch.cat([hidden, out.hidden_states[-1]], dim=1)
    if head_weight is not None:
        return HeadLogits(hidden, head_weight, compute_dtype), (hidden if want_hidden else None)
    return logits, hidden


_ACCEPTS: dict[tuple[type, str], bool] = {}


def _accepts(lm: Any, name: str) -> bool:
    key = (type(lm), name)
    if key not in _ACCEPTS:
        try:
            _ACCEPTS[key] = name in inspect.signature(lm.forward).parameters
        except (TypeError, ValueError):
            _ACCEPTS[key] = False
    return _ACCEPTS[key]


def trunk_callable(lm: Any) -> bool:
    """Whether ``lm.base_model`` alone gives the last hidden state ``lm`` would: a causal LM with a
    separate base model and no hooks on the root (FSDP2 all-gathers the root group — embeddings, final
    norm — in such a hook; then the whole model must run)."""
    base = getattr(lm, "base_model", lm)
    if base is lm or lm._forward_pre_hooks or lm._forward_hooks:
        return False
    weight = getattr(lm.get_input_embeddings(), "weight", None)
    return weight is not None and type(weight.data) is torch.Tensor


class ActorCritic(nn.Module):
    """Policy LM + value head (shared trunk) or + separate critic LM with its own head."""

    def __init__(self, lm: Any, is_seq2seq: bool, value_head: str = "shared", critic_lm: Any | None = None):
        super().__init__()
        self.lm = lm
        self.is_seq2seq = is_seq2seq
        self.value_mode = value_head
        if value_head == "separate":
            self.critic = critic_lm if critic_lm is not None else copy.deepcopy(lm)
        else:
            self.critic = None
        self.value_head = ValueHead(hidden_size_of(self.critic if self.critic is not None else lm))
        #: The decoder prefix: an int (start token), or [start, forced BOS] for BART-like models.
        self.decoder_start_id = decoder_start_of(lm, is_seq2seq)

    def lm_forward_batch(
        self, lm: Any, batch: dict[str, torch.Tensor], want_hidden: bool, **kwargs: Any
    ) -> tuple[torch.Tensor | HeadLogits, torch.Tensor | None]:
        """:func:`lm_forward` of ``lm`` over a batch's prompts and generations, with this policy's model
        kind and decoder prefix: the one place that spells the call out for the policy, its separate
        critic and the reference (``engine.rollout``), which share both. ``kwargs``: ``share_prompts``,
        ``lazy_head``, ``need_logits`` (see :func:`lm_forward`)."""
        return lm_forward(
            lm,
            self.is_seq2seq,
            batch["prompt_ids"],
            batch["prompt_mask"],
            batch["gen_ids"],
            batch["gen_mask"],
            self.decoder_start_id,
            want_hidden,
            **kwargs,
        )

    def forward_tokens(
        self,
        batch: dict[str, torch.Tensor],
        want_values: bool = True,
        share_prompts: bool = False,
        lazy_head: bool = False,
    ):
        """Logits (B, T, V) for the generated tokens and values (B, T) of the states that chose them.
        ``share_prompts``, ``lazy_head``: see :func:`lm_forward`."""
        shared = want_values and self.critic is None
        logits, hidden = self.lm_forward_batch(
            self.lm, batch, want_hidden=shared, share_prompts=share_prompts, lazy_head=lazy_head
        )
        values = None
        if want_values:
            if self.critic is None:
                values = self.value_head(hidden)
            else:
                values = self.critic_values(batch, share_prompts=share_prompts)
        return logits, values

    def critic_values(self, batch: dict[str, torch.Tensor], share_prompts: bool = False) -> torch.Tensor:
        """A separate critic's values (B, T): its own pass, so that PPO can run it after the policy's
        backward (``PPO.split_minibatch``) as well as inside :meth:`forward_tokens`."""
        _, c_hidden = self.lm_forward_batch(
            self.critic,
            batch,
            want_hidden=True,
            share_prompts=share_prompts,
            # The critic needs its trunk's last hidden state only: the base model runs alone and never
            # computes the critic's (B, T, V) logits or keeps every layer's states, in any precision
            # and for any head.
            lazy_head=True,
            need_logits=False,
        )
        return self.value_head(c_hidden)


def frozen_copy(lm: Any) -> Any:
    """A frozen, gradient-free copy used as reference or masking policy."""
    ref = copy.deepcopy(lm)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


@dataclass(frozen=True)
class EosBan:
    """A compact support: the whole vocabulary except EOS during the first ``steps`` steps.

    ``min_new_tokens`` alone needs no (B, T, V) mask; this keeps its scoring as cheap as no mask.
    """

    eos_id: int
    steps: int


def processed_logprobs(
    logits: torch.Tensor, temperature: float, support: torch.Tensor | EosBan | None
) -> torch.Tensor:
    """Log-probs of the distribution actually sampled from: temperature, then restriction to ``support``."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    if isinstance(support, EosBan):
        n = min(support.steps, x.shape[-2])
        if n > 0:
            if x is logits:  # never modify the caller's tensor in place
                x = x.clone()
            x[..., :n, support.eos_id] = float("-inf")
    elif support is not None:
        x = x.masked_fill(~support, float("-inf"))
    return torch.log_softmax(x, dim=-1)


def gather_logprobs(logp: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The log-prob of each taken action, from (B, T, V) log-probs and (B, T) actions; it lives with
    ``processed_logprobs``/``full_logprobs`` because every caller gathers from one of those."""
    return logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def full_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of the whole vocabulary at the sampling temperature, before any top-k/top-p/NLPO cut.

    The KL penalty and the reported entropy use this distribution: a truncated support would drop
    the reference's mass outside it (with ``top_k: 1`` the KL would be 0 however far the policy moved).
    """
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    return torch.log_softmax(x, dim=-1)


def restrict_logprobs(full: torch.Tensor, support: torch.Tensor | EosBan | None) -> torch.Tensor:
    """The sampled (renormalised) distribution from full log-probs: log p(a) - log p(support)."""
    if support is None:
        return full
    if isinstance(support, EosBan):
        n = min(support.steps, full.shape[-2])
        if n == 0:
            return full
        x = full.clone()
        x[..., :n, support.eos_id] = float("-inf")
    else:
        x = full.masked_fill(~support, float("-inf"))
    return x - torch.logsumexp(x, dim=-1, keepdim=True)


def entropy_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)


def kl_from_logprobs(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Exact KL(pi || pi_ref) per position over the vocabulary (the ``full`` estimator)."""
    p = logp.exp()
    return (p * (logp - ref_logp).masked_fill(p == 0, 0.0)).sum(-1)


def _normaliser_without(
    x_token: torch.Tensor, lse: torch.Tensor, exact: Callable[[], torch.Tensor]
) -> torch.Tensor:
    """log sum_{v != token} exp(x_v) from the full log-sum-exp: lse + log(1 - p_token), given the
    token's logit ``x_token``. No pass over the vocabulary (the two-slice log-sum-exp it replaces read
    the (B, T, V) logits twice more, forward and backward: ~0.5 s of a GRPO update on SmolLM2). Where
    p_token > 1/2 the subtraction would lose precision; those rows (rare: EOS is banned because the
    model wants to stop) take ``exact()``, the slice log-sum-exp over the vocabulary."""
    log_p = x_token - lse
    half = -math.log(2.0)
    # clamped: the rows replaced below must not carry log1p(-1) = -inf (its gradient is NaN, and
    # torch.where passes NaN gradients of the branch it does not take)
    out = lse + torch.log1p(-torch.exp(log_p.clamp(max=half)))
    risky = log_p > half
    if bool(risky.any()):
        out = torch.where(risky, exact(), out)
    return out


def _logsumexp_without(x: torch.Tensor, token: int) -> torch.Tensor:
    """log sum_{v != token} exp(x_v) over the last dimension, exactly (two slices)."""
    parts = [x[..., :token], x[..., token + 1 :]]
    return torch.logsumexp(
        torch.stack([torch.logsumexp(p, dim=-1) for p in parts if p.shape[-1]], dim=-1), dim=-1
    )


def token_logprobs(
    logits: torch.Tensor | HeadLogits,
    actions: torch.Tensor,
    temperature: float,
    support: torch.Tensor | EosBan | None,
    want_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(sampled-distribution log-prob, full-vocabulary log-prob, entropy) of each taken action.

    Same values as ``gather_logprobs(restrict_logprobs(full_logprobs(...)))``, ``gather_logprobs(full)``
    and ``entropy_from_logprobs(full)``, but with one fp32 (B, T, V) copy of the logits instead of a
    log-softmax, a restricted copy and their backward buffers: ``log p(a) = x_a - logsumexp(x)``, and for
    :class:`EosBan` the restricted normaliser is ``lse + log(1 - p_eos)`` (``_normaliser_without``, no
    further pass over the vocabulary). With a vocabulary of 49k and 16 x 48 tokens each saved (B, T, V)
    pass is ~150 MB of memory traffic, which the update of a 135M model pays on every minibatch. The entropy (a statistic,
    no gradient) costs one more pass. A (B, T, V) support mask (top-k, top-p, NLPO) takes the general path.

    ``logits`` may be :class:`HeadLogits` (the LM head's input, from ``lm_forward(lazy_head=True)``):
    then no (B, T, V) tensor is allocated beyond the one the fused head reduces in place
    (:mod:`engine.models.head`); a (B, T, V) support mask materialises the logits first.
    """
    if isinstance(logits, HeadLogits):
        if support is None or isinstance(support, EosBan):
            return _head_token_logprobs(logits, actions, temperature, support, want_entropy)
        logits = logits.materialize()
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    lse = torch.logsumexp(x, dim=-1)
    chosen = x.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    full_lp = chosen - lse
    if support is None:
        sampled = full_lp
    elif isinstance(support, EosBan):
        n = min(support.steps, x.shape[-2])
        sampled = full_lp
        if n > 0:
            eos = support.eos_id
            banned = _normaliser_without(
                x[..., :n, eos], lse[..., :n], lambda: _logsumexp_without(x[..., :n, :], eos)
            )
            sampled = torch.cat([chosen[..., :n] - banned, full_lp[..., n:]], dim=-1)
    else:
        sampled = gather_logprobs(restrict_logprobs(x - lse.unsqueeze(-1), support), actions)
    entropy = None
    if want_entropy:
        with torch.no_grad():
            xd, lsed = x.detach(), lse.detach()
            p = torch.exp(xd - lsed.unsqueeze(-1))
            # H = lse - sum_v p_v x_v as a batched dot product (no (B, T, V) product buffer)
            entropy = lsed - (p.unsqueeze(-2) @ xd.unsqueeze(-1)).squeeze(-1).squeeze(-1)
            if not bool(torch.isfinite(entropy).all()):  # a logit of -inf: p_v x_v = 0 * -inf
                entropy = lsed - torch.where(p > 0, p * xd, torch.zeros((), dtype=p.dtype)).sum(-1)
    return sampled, full_lp, entropy


def _head_token_logprobs(
    head: HeadLogits,
    actions: torch.Tensor,
    temperature: float,
    support: EosBan | None,
    want_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`token_logprobs` from the head's input: the log-sum-exp (and entropy), the chosen and the
    EOS logits all from one pass of :func:`head_token_logits`."""
    scale = 1.0 / temperature
    hidden, weight, dtype = head.hidden, head.weight, head.compute_dtype
    n = min(support.steps, hidden.shape[-2]) if isinstance(support, EosBan) else 0
    eos = support.eos_id if isinstance(support, EosBan) and n > 0 else None
    lse, chosen, x_eos, entropy = head_token_logits(hidden, weight, actions, scale, want_entropy, dtype, eos)
    if entropy is not None:
        entropy = entropy.detach()
    full_lp = chosen - lse
    sampled = full_lp
    if eos is not None:
        h = hidden[..., :n, :]

        def exact() -> torch.Tensor:  # rare: rows where p(EOS) > 1/2
            return _logsumexp_without(HeadLogits(h, weight, dtype).materialize().float() * scale, eos)

        banned = _normaliser_without(x_eos[..., :n], lse[..., :n], exact)
        sampled = torch.cat([chosen[..., :n] - banned, full_lp[..., n:]], dim=-1)
    return sampled, full_lp, entropy
