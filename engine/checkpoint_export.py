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
from pathlib import Path
from typing import Any

from engine.config import parse_config
from engine.models.loading import detect_kind, load_lm, load_tokenizer, resolve_model_path

__all__ = ["CheckpointExportError", "export_checkpoint"]

STATE_FILE = "state.pt"
LM_PREFIX = "lm."
HEAD_PREFIX = "value_head."


class CheckpointExportError(ValueError):
    """A checkpoint that cannot become a model directory; the message says why."""


def export_checkpoint(config: Mapping[str, Any], checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``out_dir`` (replaced atomically: a half-written export never looks complete) with the
    checkpoint's policy as a Hugging Face model; returns it."""
    import torch
    from safetensors.torch import save_file

    cfg = parse_config(dict(config))
    if cfg.model.lora.enabled:
        raise CheckpointExportError(
            "this run trained a LoRA adapter: its checkpoints hold only the adapter, so they cannot be "
            "exported as a whole model here; use the run's final model (train.save_model)"
        )
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
    policy = state.get("policy") if isinstance(state, Mapping) else None
    if not isinstance(policy, Mapping) or not any(k.startswith(LM_PREFIX) for k in policy):
        raise CheckpointExportError(f"{state_path}: holds no policy weights")
    path = resolve_model_path(cfg.model.name_or_path, cfg.model.gguf_file)
    kind = detect_kind(path, cfg.model.type, cfg.model.revision)
    lm = load_lm(path, kind, cfg.model.revision)
    lm_state = {k[len(LM_PREFIX) :]: v for k, v in policy.items() if k.startswith(LM_PREFIX)}
    missing, unexpected = lm.load_state_dict(lm_state, strict=False)
    if unexpected or [m for m in missing if not _tied(lm, m)]:
        raise CheckpointExportError(
            f"{ckpt.name}: its weights do not fit the run's model {cfg.model.name_or_path!r} "
            f"(missing {list(missing)[:3]}, unexpected {list(unexpected)[:3]})"
        )
    tok_path = resolve_model_path(cfg.tokenizer.name_or_path) if cfg.tokenizer.name_or_path else path
    tok = load_tokenizer(tok_path, pad_as_eos=cfg.tokenizer.pad_token_as_eos_token)
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    lm.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    head = {k[len(HEAD_PREFIX) :]: v.contiguous() for k, v in policy.items() if k.startswith(HEAD_PREFIX)}
    if head:
        save_file(head, str(tmp / "value_head.safetensors"))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return out


def _tied(lm: Any, name: str) -> bool:
    """A weight absent from the checkpoint because it is tied to another (GPT-2's ``lm_head``)."""
    return name.endswith("lm_head.weight") and bool(getattr(lm.config, "tie_word_embeddings", False))
