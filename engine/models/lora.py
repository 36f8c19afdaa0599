"""LoRA adapters (PEFT) on the policy, for every algorithm.

The adapter is injected into the loaded model in place, so ``policy.lm`` stays the plain Hugging Face
model (rollout, scoring, ``generate`` and evaluation need no change) with LoRA layers inside it; the
PEFT wrapper is kept beside it only to switch the adapter off and to save it. Consequences:

- the reference model is the same weights with the adapter disabled (:func:`adapter_disabled`), so no
  second copy of the model is held in memory;
- only the adapter's and the value head's parameters are trainable (the base weights are frozen);
- a checkpoint stores the trainable tensors only (:func:`trainable_state`), a resume loads them back onto
  a freshly built model with the same adapter;
- the final model is written merged (a plain HF model) or as an adapter directory (``adapter_config.json``
  naming the base model), which :func:`load_adapter_dir` merges back on load.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

#: Where the PEFT wrapper is kept on the model: set through ``__dict__`` so that torch does not
#: register it as a submodule (the wrapper contains the model, which would make a cycle).
_PEFT_ATTR = "_grue_peft_model"
ADAPTER_CONFIG = "adapter_config.json"


def apply_lora(lm: Any, lora_cfg: Any) -> Any:
    """Inject a LoRA adapter into ``lm`` (in place) and freeze its base weights; returns ``lm``."""
    from peft import LoraConfig, get_peft_model

    targets: list[str] | str | None = list(lora_cfg.target_modules) or None  # None: PEFT's default
    if targets == ["all-linear"]:
        targets = "all-linear"  # PEFT's keyword, not a module name
    config = LoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=targets,
        bias="none",
    )
    try:
        peft_model = get_peft_model(lm, config)
    except ValueError as exc:
        raise ValueError(f"model.lora.target_modules: {exc}") from None
    lm.__dict__[_PEFT_ATTR] = peft_model
    return lm


def is_lora(lm: Any) -> bool:
    return _PEFT_ATTR in getattr(lm, "__dict__", {})


def peft_model_of(lm: Any) -> Any:
    if not is_lora(lm):
        raise ValueError("the model has no LoRA adapter (model.lora is not set)")
    return lm.__dict__[_PEFT_ATTR]


@contextlib.contextmanager
def adapter_disabled(lm: Any) -> Iterator[Any]:
    """The base model's behaviour (the reference policy) for the duration of the block."""
    with peft_model_of(lm).disable_adapter():
        yield lm


class AdapterDisabledReference(torch.nn.Module):
    """A reference model that is the policy's own base weights: calls run with the adapter off.

    Rollout scoring takes a ``ref_lm`` it calls like a model; this gives it one without a copy. It is
    not registered as a submodule of anything, so the weights are counted and saved once."""

    def __init__(self, lm: Any):
        super().__init__()
        self.__dict__["lm"] = lm  # not a submodule: no second entry in state dicts
        self.config = lm.config

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad(), adapter_disabled(self.lm):
            return self.lm(*args, **kwargs)

    def get_output_embeddings(self) -> Any:
        return self.lm.get_output_embeddings()


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a LoRA checkpoint needs: trainable parameters (adapter, value head) and buffers."""
    names = {n for n, p in module.named_parameters() if p.requires_grad}
    return {k: v for k, v in module.state_dict().items() if k in names}


def load_trainable_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load :func:`trainable_state` back; a key set that does not match (other r or targets) is an error."""
    expected = {n for n, p in module.named_parameters() if p.requires_grad}
    got = set(state)
    if got != expected:
        missing, extra = sorted(expected - got)[:5], sorted(got - expected)[:5]
        raise ValueError(
            "checkpoint does not match this run's LoRA adapter (model.lora changed since it was written?): "
            f"missing {missing}, unexpected {extra}"
        )
    module.load_state_dict(state, strict=False)


def merged_copy(lm: Any) -> Any:
    """A plain HF model with the adapter merged into the weights; the training model is untouched."""
    peft_copy = copy.deepcopy(peft_model_of(lm))
    return peft_copy.merge_and_unload()


def save_lora_model(lm: Any, out: Path, mode: str) -> None:
    """``merged``: a plain HF model; ``adapter``: PEFT's adapter files (base model named inside)."""
    if mode == "merged":
        merged_copy(lm).save_pretrained(str(out))
    elif mode == "adapter":
        peft_model_of(lm).save_pretrained(str(out))
    else:
        raise ValueError(f"model.lora.save: unknown mode {mode!r}; use 'merged' or 'adapter'")


def is_adapter_dir(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / ADAPTER_CONFIG).exists() and not (p / "config.json").exists()


def adapter_base(path: str | Path) -> str:
    """The base model an adapter directory was trained on (``base_model_name_or_path``)."""
    cfg_file = Path(path) / ADAPTER_CONFIG
    try:
        base = json.loads(cfg_file.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{cfg_file}: not a readable adapter config ({exc})") from None
    if not base:
        raise ValueError(f"{cfg_file}: base_model_name_or_path is empty; cannot tell which model to adapt")
    return str(base)


def load_adapter_dir(base_lm: Any, path: str | Path) -> Any:
    """``base_lm`` with the adapter of ``path`` merged in (a plain HF model, as a merged save gives)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base_lm, str(path)).merge_and_unload()
