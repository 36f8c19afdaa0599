"""Checks of a schema-valid config against what this installation has: registered component ids and
the model's context length.

Why beside the schema and not in it: the schema (``engine.config``) describes any run, and stays
importable without the components; these checks need the registries and the model's size. Without
them an unknown task id or a ``max_new_tokens`` of 10^6 passes validation, is queued, and fails on a
worker (``UnknownComponentError`` after the model loaded; ``IndexError`` in the position embedding
after 23 s). The web app's one validator (``webapp.runs.services.validate_config``: launch form, YAML
view and API) reports these errors together with the schema's and the path rules', each naming its
field. Free of torch and transformers: it reads a local model's ``config.json`` as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine import registry
from engine.models.builtin import BUILTIN_MODELS, BUILTIN_PREFIX

_POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")


def component_errors(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(field, message)`` for every component id of ``cfg`` that no registry holds."""
    errors: list[tuple[str, str]] = []

    def check(field: str, value: Any, reg: registry.Registry[Any]) -> None:
        if isinstance(value, str) and value not in reg:
            known = ", ".join(reg.ids())
            errors.append((field, f"unknown {reg.kind} id {value!r}; registered: {known}"))

    check("task.id", (cfg.get("task") or {}).get("id"), registry.tasks)
    sft_task = (cfg.get("supervised") or {}).get("task")
    if isinstance(sft_task, Mapping):
        check("supervised.task.id", sft_task.get("id"), registry.tasks)
    reward = cfg.get("reward") or {}
    check("reward.id", reward.get("id"), registry.rewards)
    for i, comp in enumerate(reward.get("components") or []):
        if isinstance(comp, Mapping):
            check(f"reward.components[{i}].id", comp.get("id"), registry.rewards)
    check("algorithm.id", (cfg.get("algorithm") or {}).get("id"), registry.algorithms)
    for i, metric in enumerate((cfg.get("eval") or {}).get("metrics") or []):
        if isinstance(metric, Mapping):
            check(f"eval.metrics[{i}].id", metric.get("id"), registry.metrics)
    return errors


def model_context(name_or_path: str, *, local_files: bool = True) -> tuple[int | None, bool]:
    """``(positions, encoder_decoder)`` of a builtin model or (``local_files``) a local model
    directory; positions is None when unknown (a hub id not on disk, a GGUF file, relative position
    encodings, a path on another machine)."""
    if name_or_path.startswith(BUILTIN_PREFIX):
        spec = BUILTIN_MODELS.get(name_or_path[len(BUILTIN_PREFIX) :]) or {}
        return spec.get("n_positions"), spec.get("kind") == "seq2seq"
    if not local_files:
        return None, False
    config = Path(name_or_path).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except (OSError, ValueError):
        return None, False
    if not isinstance(data, dict):
        return None, False
    positions = next((data[k] for k in _POSITION_KEYS if isinstance(data.get(k), int)), None)
    return positions, bool(data.get("is_encoder_decoder"))


def size_errors(cfg: Mapping[str, Any], *, local_files: bool = True) -> list[tuple[str, str]]:
    """Generation lengths that do not fit the model's context: a causal model holds the prompt and the
    generation in one window (``tokenizer.max_prompt_length + max_new_tokens``); an encoder-decoder
    holds each on its side. ``local_files=False``: read no model directory (builtins only)."""
    model = cfg.get("model") or {}
    name = model.get("name_or_path")
    if not isinstance(name, str):
        return []
    positions, enc_dec = model_context(name, local_files=local_files)
    if not positions:
        return []
    enc_dec = enc_dec or model.get("type") == "seq2seq"
    prompt = int((cfg.get("tokenizer") or {}).get("max_prompt_length") or 0)
    errors: list[tuple[str, str]] = []
    if prompt > positions:
        errors.append(
            (
                "tokenizer.max_prompt_length",
                f"{prompt} is more than the model's context ({positions} positions, {name})",
            )
        )
    room = positions if enc_dec else positions - prompt
    for field, section in (
        ("rollout.max_new_tokens", cfg.get("rollout") or {}),
        ("eval.generation.max_new_tokens", (cfg.get("eval") or {}).get("generation") or {}),
    ):
        new = section.get("max_new_tokens")
        if isinstance(new, int) and new > room:
            where = "" if enc_dec else f" with tokenizer.max_prompt_length {prompt}"
            errors.append(
                (field, f"{new} tokens do not fit: at most {max(room, 0)}{where} in the model's context "
                        f"of {positions} positions ({name})")
            )  # fmt: skip
    return errors


def launch_errors(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every component and size error of a schema-valid config (empty when it can run here)."""
    return component_errors(cfg) + size_errors(cfg)
