"""Evaluation: generate on a split with the evaluation decoding settings, then score.

Used during training (every ``train.eval_every`` iterations) and on its own through
``engine.evaluate`` / ``python -m engine eval``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.algorithms.base import Algorithm
from engine.config import RunConfig
from engine.data import load_task
from engine.metrics import build_metrics, compute_all
from engine.models.loading import (
    autocast_dtype,
    detect_kind,
    load_lm,
    load_tokenizer,
    resolve_device,
    resolve_model_path,
)
from engine.models.policy import decoder_start_of
from engine.models.precision import autocast
from engine.registry import algorithms
from engine.rewards import build_reward
from engine.rollout import (
    SamplingSpec,
    decode_generations,
    generate,
    prompt_padding_side,
    tokenize_prompts,
)


@dataclass
class PolicyContext:
    """The evaluated policy, for metrics that score the model itself rather than its generations
    (RL4LMs's perplexity: the policy's perplexity on the reference texts)."""

    lm: Any
    is_seq2seq: bool
    tokenizer: Any
    device: Any


@torch.no_grad()
def generate_texts(
    lm: Any,
    is_seq2seq: bool,
    tokenizer: Any,
    prompts: list[str],
    gen_cfg: Any,
    max_prompt_length: int,
    device: Any,
    autocast_dtype: torch.dtype | None,
    seed: int = 0,
    decoder_start_id: int | list[int] | None = None,
    masking_lm: Any | None = None,
    nlpo: Any | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Decode prompts in batches (``on_batch(done, total)`` after each: long evaluations show progress); beam search goes through HF ``generate``, the rest through our cached loop.

    With ``masking_lm`` and ``nlpo`` (an NLPOConfig) the generation is NLPO's masked one, as RL4LMs
    evaluates an NLPO policy; beam search cannot apply the mask and is then refused.
    """
    out: list[str] = []
    gen = torch.Generator(device=device).manual_seed(seed)
    masked = masking_lm is not None and nlpo is not None
    spec = SamplingSpec.from_config(
        gen_cfg, tokenizer.eos_token_id, nlpo if masked else None, special_ids=tokenizer.all_special_ids
    )
    if masked and gen_cfg.num_beams > 1:
        raise ValueError(
            "eval.generation.num_beams > 1 cannot apply NLPO's action mask: use num_beams 1, or set "
            "algorithm.nlpo.masked_eval: false to evaluate the unmasked policy with beam search"
        )
    side = prompt_padding_side(is_seq2seq)
    was_training = lm.training
    lm.eval()
    for start in range(0, len(prompts), gen_cfg.batch_size):
        chunk = prompts[start : start + gen_cfg.batch_size]
        ids, mask = tokenize_prompts(tokenizer, chunk, max_prompt_length, device, side)
        if gen_cfg.num_beams > 1:
            with autocast(device, autocast_dtype):
                res = lm.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=gen_cfg.max_new_tokens,
                    min_new_tokens=gen_cfg.min_new_tokens or None,
                    num_beams=gen_cfg.num_beams,
                    do_sample=gen_cfg.do_sample,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
            new = res if is_seq2seq else res[:, ids.shape[1] :]
            out.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
            if on_batch is not None:
                on_batch(len(out), len(prompts))
            continue
        g = generate(
            lm,
            is_seq2seq,
            ids,
            mask,
            spec,
            tokenizer.pad_token_id,
            decoder_start_id,
            masking_lm=masking_lm if masked else None,
            generator=gen,
            autocast_dtype=autocast_dtype,
            record_support=False,
        )
        out.extend(decode_generations(tokenizer, g.gen_ids, g.gen_mask))
        if on_batch is not None:
            on_batch(len(out), len(prompts))
    lm.train(was_training)
    return out


def reward_details(
    reward_fn: Any | None,
    prompts: list[str],
    generations: list[str],
    references: list[list[str]],
    meta: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Per-sample numbers a reward offers for the samples table (``sample_details``: e.g. the maths reward's
    extracted answer, gold answer and verdict), or empty dicts; they join each row's ``metrics``."""
    details = getattr(getattr(reward_fn, "inner", reward_fn), "sample_details", None)
    if details is None:
        return [{} for _ in generations]
    return [dict(d) for d in details(prompts, generations, references, meta)]


def score_generations(
    samples: list[Any],
    generations: list[str],
    reward_fn: Any | None,
    metric_components: list[Any],
    policy: PolicyContext | None = None,
    timings: dict[str, float] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Corpus metrics (reward mean/std + configured metrics) and per-sample rows for the sink.

    ``policy`` is handed to metrics that score the evaluated model itself (``bind_policy``);
    ``timings`` receives wall seconds under ``reward`` and each metric's first key (``compute_all``).
    """
    prompts = [s.prompt for s in samples]
    refs = [list(s.references) for s in samples]
    meta = [dict(s.meta) for s in samples]
    corpus: dict[str, float] = {}
    per_sample: dict[str, list[float]] = {}
    rewards: list[float] | None = None
    if reward_fn is not None:
        started = time.perf_counter()
        rewards = [float(r) for r in reward_fn(prompts, generations, refs, meta)]
        if timings is not None:
            timings["reward"] = time.perf_counter() - started
        corpus["reward_mean"] = sum(rewards) / max(len(rewards), 1)
        mean = corpus["reward_mean"]
        corpus["reward_std"] = math.sqrt(sum((r - mean) ** 2 for r in rewards) / max(len(rewards), 1))
    if metric_components:
        objs = build_metrics(metric_components)
        if policy is not None:
            for obj in objs:
                if hasattr(obj, "bind_policy"):
                    obj.bind_policy(policy.lm, policy.is_seq2seq, policy.tokenizer, policy.device)
        c, ps = compute_all(objs, prompts, generations, refs, meta, timings=timings)
        corpus.update({k: float(v) for k, v in c.items()})
        per_sample.update(ps)
    extra = reward_details(reward_fn, prompts, generations, refs, meta)
    rows = []
    for i, s in enumerate(samples):
        row: dict[str, Any] = {
            "sample_id": str(s.id),
            "prompt": s.prompt,
            "generation": generations[i],
            "references": list(s.references),
            "reward": rewards[i] if rewards is not None else None,
        }
        m = {**extra[i], **{k: v[i] for k, v in per_sample.items() if v is not None and i < len(v)}}
        if m:
            row["metrics"] = m
        rows.append(row)
    return corpus, rows


def uses_masked_generation(cfg: RunConfig) -> bool:
    """Whether this config's evaluation generates through a masking policy: an NLPO config is evaluated
    through the masked generation, as RL4LMs does (``algorithm.nlpo.masked_eval``).

    The capability is read as declared on the registered algorithm class (``engine/algorithms/base.py``),
    not probed: an unknown id or a user's factory function, which declares nothing before it is built,
    gets the base ``Algorithm``'s default (no masking)."""
    registered = algorithms.get(cfg.algorithm.id) if cfg.algorithm.id in algorithms else None
    algo_cls = registered if isinstance(registered, type) and issubclass(registered, Algorithm) else Algorithm
    return algo_cls.uses_masking_policy and cfg.algorithm.nlpo.masked_eval


def evaluate(
    config: RunConfig,
    split: str | None = None,
    model_path: str | None = None,
    output: str | Path | None = None,
    max_samples: int | None = None,
    sink: Any | None = None,
    with_reward: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Evaluate ``model_path`` (default: the config's model) on ``split``; optionally write a results JSON.

    ``progress`` receives a line per generated batch and per scoring phase: a test evaluation of
    hundreds of prompts takes minutes on a CPU and should not look hung. The result's ``timings_s``
    says where those minutes went (generation, the reward, each metric)."""
    cfg = config
    split = split or cfg.eval.split
    path = resolve_model_path(
        model_path or cfg.model.name_or_path, None if model_path else cfg.model.gguf_file
    )
    kind = detect_kind(path, cfg.model.type, cfg.model.revision)
    tok_path = (
        path
        if model_path
        else (cfg.tokenizer.name_or_path and resolve_model_path(cfg.tokenizer.name_or_path)) or path
    )
    tok = load_tokenizer(
        tok_path,
        cfg.tokenizer.padding_side,
        cfg.tokenizer.truncation_side,
        cfg.tokenizer.pad_token_as_eos_token,
        kind=kind,
    )
    device = resolve_device(cfg.model.device)
    amp = autocast_dtype(cfg.model.mixed_precision, device)
    lm = load_lm(path, kind, cfg.model.revision).to(device)
    samples = load_task(cfg.task, split)
    if max_samples is not None:
        samples = samples[:max_samples]
    start = decoder_start_of(lm, kind == "seq2seq")
    # The model on disk is the last policy, so it is its own masking policy here (training: the current mask).
    masked = uses_masked_generation(cfg)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    gens = generate_texts(
        lm,
        kind == "seq2seq",
        tok,
        [s.prompt for s in samples],
        cfg.eval.generation,
        cfg.tokenizer.max_prompt_length,
        device,
        amp,
        seed=cfg.train.seed,
        decoder_start_id=start,
        masking_lm=lm if masked else None,
        nlpo=cfg.algorithm.nlpo if masked else None,
        on_batch=(lambda done, total: progress(f"generated {done}/{total}")) if progress else None,
    )
    timings["generate"] = time.perf_counter() - started
    if progress is not None:
        progress(f"scoring {len(gens)} generations: reward and {len(cfg.eval.metrics)} metrics")
    reward_fn = build_reward(cfg.reward) if with_reward else None
    corpus, rows = score_generations(
        samples,
        gens,
        reward_fn,
        list(cfg.eval.metrics),
        policy=PolicyContext(lm, kind == "seq2seq", tok, device),
        timings=timings,
    )
    result = eval_results(split, model_path or cfg.model.name_or_path, corpus, rows, timings)
    if sink is not None:
        sink.metrics(0, {f"eval/{k}": v for k, v in corpus.items()})
        sink.samples(0, split, rows)
    if output is not None:
        write_eval_results(output, result)
    return result


def eval_results(
    split: str,
    model: str,
    corpus: dict[str, float],
    rows: list[dict[str, Any]],
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The results document of ``python -m engine eval --output`` and of a run's ``eval_results.json``:
    one shape for both, so tools that compare evaluations read either. ``timings_s`` (wall seconds of
    generation, reward and each metric) is there when the caller measured them."""
    doc = {"split": split, "n_samples": len(rows), "model": model, "metrics": corpus, "samples": rows}
    if timings:
        doc["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    return doc


def write_eval_results(path: str | Path, result: dict[str, Any]) -> Path:
    """Write a results document atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return path
