"""A training checkpoint (``checkpoints/rl-<step>/state.pt``) as a Hugging Face model directory.

Why: checkpoints hold the whole actor-critic state for resuming (``state.pt``: tensors only), which
``from_pretrained`` cannot open. The over-optimisation watch names the best checkpoint by gold
(:mod:`engine.overopt`); to download it or to start a new run from it (``model.name_or_path``), it
must be a model directory: config, weights, tokenizer, and the value head beside them, as
``Trainer.save_model`` writes at the end of a run.

The run's model is loaded as the config names it (the initial weights' architecture and tokenizer),
then the checkpoint's ``lm.*`` tensors replace its weights. Checkpoints of LoRA runs hold only the
adapter: they are refused with the reason (their merged model needs the adapter's configuration,
which the checkpoint does not store). The state is loaded with ``weights_only=True``: a pickle in a
checkpoint never runs code.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.checkpoint_layout import STATE_FILE
from engine.config import parse_config
from engine.data import load_task
from engine.models.loading import (
    autocast_dtype,
    detect_kind,
    load_lm,
    load_tokenizer,
    resolve_device,
    resolve_model_path,
)

__all__ = [
    "MASKING",
    "CheckpointExportError",
    "Regenerated",
    "export_checkpoint",
    "generate_from_checkpoint",
]

LM_PREFIX = "lm."
HEAD_PREFIX = "value_head."


class CheckpointExportError(ValueError):
    """A checkpoint that cannot become a model directory; the message says why."""


def _read_state(checkpoint_dir: str | Path) -> tuple[Path, dict[str, Any]]:
    """``(checkpoint dir, its state)``: the engine's ``state.pt`` loaded with ``weights_only=True``
    (a pickle never runs code); anything else is refused with the reason."""
    import torch

    ckpt = Path(checkpoint_dir)
    state_path = ckpt / STATE_FILE
    if not state_path.is_file():
        raise CheckpointExportError(f"{ckpt}: no {STATE_FILE} (not a checkpoint the engine wrote)")
    try:
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure: refuse, with the first line
        raise CheckpointExportError(
            f"{state_path}: not a safe checkpoint (tensors and plain values only): {str(exc).splitlines()[0][:200]}"
        ) from None
    return ckpt, state if isinstance(state, Mapping) else {}


def _run_model_with(cfg: Any, weights: Mapping[str, Any], what: str) -> tuple[Any, Path, str]:
    """``(the run's model with ``weights`` loaded, model path, kind)``; weights that do not fit the
    run's model are refused, naming ``what`` they are."""
    path = resolve_model_path(cfg.model.name_or_path, cfg.model.gguf_file)
    kind = detect_kind(path, cfg.model.type, cfg.model.revision)
    lm = load_lm(path, kind, cfg.model.revision)
    missing, unexpected = lm.load_state_dict(dict(weights), strict=False)
    if unexpected or [m for m in missing if not _tied(lm, m)]:
        raise CheckpointExportError(
            f"{what} does not fit the run's model {cfg.model.name_or_path!r} "
            f"(missing {list(missing)[:3]}, unexpected {list(unexpected)[:3]})"
        )
    return lm, path, kind


def _load_checkpoint_lm(
    config: Mapping[str, Any], checkpoint_dir: str | Path
) -> tuple[Any, Any, dict[str, Any], Path, str, Mapping[str, Any]]:
    """``(parsed config, the run's model with the checkpoint's policy weights, its value head's
    tensors, model path, kind, the checkpoint's whole state)``;
    refuses LoRA checkpoints, files that are not the engine's ``state.pt``, and weights that do not
    fit the run's model, each with the reason."""
    cfg = parse_config(dict(config))
    if cfg.model.lora.enabled:
        raise CheckpointExportError(
            "this run trained a LoRA adapter: its checkpoints hold only the adapter, so they cannot be "
            "exported as a whole model here; use the run's final model (train.save_model)"
        )
    ckpt, state = _read_state(checkpoint_dir)
    policy = state.get("policy")
    if not isinstance(policy, Mapping) or not any(k.startswith(LM_PREFIX) for k in policy):
        raise CheckpointExportError(f"{ckpt / STATE_FILE}: holds no policy weights")
    lm_state = {k[len(LM_PREFIX) :]: v for k, v in policy.items() if k.startswith(LM_PREFIX)}
    lm, path, kind = _run_model_with(cfg, lm_state, f"{ckpt.name}: its weights")
    head = {k[len(HEAD_PREFIX) :]: v.contiguous() for k, v in policy.items() if k.startswith(HEAD_PREFIX)}
    return cfg, lm, head, path, kind, state


def export_checkpoint(config: Mapping[str, Any], checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``out_dir`` (replaced atomically: a half-written export never looks complete) with the
    checkpoint's policy as a Hugging Face model; returns it."""
    from safetensors.torch import save_file

    cfg, lm, head, path, _kind, _state = _load_checkpoint_lm(config, checkpoint_dir)
    tok_path = resolve_model_path(cfg.tokenizer.name_or_path) if cfg.tokenizer.name_or_path else path
    tok = load_tokenizer(tok_path, pad_as_eos=cfg.tokenizer.pad_token_as_eos_token)
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    lm.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    if head:
        save_file(head, str(tmp / "value_head.safetensors"))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return out


#: How a re-generation sampled the policy (``Regenerated.masking``): the run's algorithm has no
#: masking policy; NLPO through the checkpoint's masking policy (as the run's evaluations); NLPO with
#: the policy as its own mask, the checkpoint holding none (as ``python -m engine eval`` evaluates a
#: model directory); NLPO unmasked because the run set ``algorithm.nlpo.masked_eval: false``.
MASKING = {
    "": "sampled as the run's evaluations (no masking policy)",
    "checkpoint": "sampled through the checkpoint's NLPO masking policy, as the run's evaluations",
    "policy": "the checkpoint holds no NLPO masking policy: sampled with the policy as its own mask, as "
    "python -m engine eval evaluates a saved model (the run's evaluations used the masking policy of "
    "that moment)",
    "off": "sampled unmasked: the run sets algorithm.nlpo.masked_eval false, as its evaluations",
}


@dataclass(frozen=True)
class Regenerated:
    """A checkpoint's new generations: the task samples (prompt, references, id), one generation each,
    and how an NLPO policy was masked (a key of :data:`MASKING`; ``""`` for other algorithms)."""

    samples: list[Any]
    generations: list[str]
    masking: str = ""

    @property
    def masking_note(self) -> str:
        return MASKING[self.masking]


def _masking_lm(cfg: Any, state: Mapping[str, Any], lm: Any, ckpt_name: str) -> tuple[Any | None, str]:
    """``(masking model or None, MASKING key)`` for sampling the checkpoint's policy as the engine's
    evaluation of the run's algorithm does (:func:`engine.evaluation.uses_masked_generation`)."""
    from engine.evaluation import uses_masked_generation

    if not uses_masked_generation(cfg):
        nlpo = cfg.algorithm.nlpo
        always = cfg.model_copy(
            update={
                "algorithm": cfg.algorithm.model_copy(
                    update={"nlpo": nlpo.model_copy(update={"masked_eval": True})}
                )
            }
        )
        return None, "off" if uses_masked_generation(always) else ""
    algo_state = state.get("algorithm")
    masker = algo_state.get("masker") if isinstance(algo_state, Mapping) else None
    if not isinstance(masker, Mapping) or not masker:
        return lm, "policy"
    masking_lm, _path, _kind = _run_model_with(cfg, masker, f"{ckpt_name}: its masking policy")
    return masking_lm, "checkpoint"


def generate_from_checkpoint(
    config: Mapping[str, Any], checkpoint_dir: str | Path, n_prompts: int, split: str | None = None
) -> Regenerated:
    """The checkpoint's policy on ``n_prompts`` prompts of the run's evaluation split, decoded with the
    run's evaluation settings and seed, and masked as the engine's evaluation of the run's algorithm.

    Why: a run's periodic evaluations store only the first ``train.log_samples`` generations, too few
    for a gold with a small standard error; re-generating from each checkpoint on more prompts gives
    every checkpoint the same larger prompt set. The prompts are the task's seeded subset of that
    size (``task.max_eval_samples`` = ``n_prompts``; the same prompts for every checkpoint). An NLPO
    policy is evaluated through its masking policy (RL4LMs's way, ``algorithm.nlpo.masked_eval``):
    the checkpoint's own (``state["algorithm"]["masker"]``, the mask of that moment), else the policy
    as its own mask, which ``Regenerated.masking`` records."""
    from engine.evaluation import generate_texts
    from engine.models.policy import decoder_start_of

    cfg, lm, _head, path, kind, state = _load_checkpoint_lm(config, checkpoint_dir)
    masking_lm, masking = _masking_lm(cfg, state, lm, Path(checkpoint_dir).name)
    tok_path = resolve_model_path(cfg.tokenizer.name_or_path) if cfg.tokenizer.name_or_path else path
    tok = load_tokenizer(
        tok_path, cfg.tokenizer.padding_side, cfg.tokenizer.truncation_side,
        cfg.tokenizer.pad_token_as_eos_token, kind=kind,
    )  # fmt: skip
    task = cfg.task.model_copy(update={"max_eval_samples": int(n_prompts)})
    samples = load_task(task, split or cfg.eval.split)[: int(n_prompts)]
    device = resolve_device(cfg.model.device)
    lm = lm.to(device)
    masking_lm = masking_lm.to(device).eval() if masking_lm is not None else None
    gens = generate_texts(
        lm, kind == "seq2seq", tok, [s.prompt for s in samples], cfg.eval.generation,
        cfg.tokenizer.max_prompt_length, device, autocast_dtype(cfg.model.mixed_precision, device),
        seed=cfg.train.seed, decoder_start_id=decoder_start_of(lm, kind == "seq2seq"),
        masking_lm=masking_lm, nlpo=cfg.algorithm.nlpo if masking_lm is not None else None,
    )  # fmt: skip
    return Regenerated(samples, gens, masking)


def _tied(lm: Any, name: str) -> bool:
    """A weight absent from the checkpoint because it is tied to another (GPT-2's ``lm_head``)."""
    return name.endswith("lm_head.weight") and bool(getattr(lm.config, "tie_word_embeddings", False))
