"""Resolving and loading models: hub names, local directories, GGUF files and builtin tiny models.

GGUF checkpoints are imported once into a plain safetensors directory in the cache (outside the
repo), because transformers dequantises GGUF on every load (slow) and refuses to save such a model.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from engine.config import RIGHT_PADDING_CAUSAL
from engine.models.builtin import builtin_model_dir, cache_root, is_builtin, publish_dir


class ModelLoadError(RuntimeError):
    """A model or tokenizer that cannot be loaded; the message says what to do."""


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except Exception:  # pragma: no cover - cosmetic only
        pass


def _offline_hint(name: str, exc: BaseException) -> ModelLoadError:
    return ModelLoadError(
        f"could not load model {name!r}: it is not a local directory or file, and the HuggingFace hub "
        f"could not be reached ({type(exc).__name__}). If this machine is offline, download the model "
        "elsewhere and set model.name_or_path to its local directory, point it to a .gguf file "
        "(imported automatically), or use a builtin model such as 'builtin:tiny-gpt2'."
    )


def gguf_cache_dir(gguf_path: Path) -> Path:
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:12]
    return cache_root() / "gguf" / f"{gguf_path.stem}-{key}"


def import_gguf(gguf_path: str | Path, out_dir: str | Path | None = None, force: bool = False) -> Path:
    """Convert a GGUF checkpoint into a safetensors directory (fp32) with its tokenizer; idempotent."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    src = Path(gguf_path).expanduser()
    if not src.is_file():
        raise ModelLoadError(f"GGUF file not found: {src}")
    out = Path(out_dir).expanduser() if out_dir else gguf_cache_dir(src)
    if (out / "config.json").exists() and any(out.glob("*.safetensors")) and not force:
        return out
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            str(src.parent), gguf_file=src.name, dtype=torch.float32
        )
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    except Exception as exc:
        raise ModelLoadError(f"cannot import GGUF file {src}: {type(exc).__name__}: {exc}") from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    # save_pretrained refuses a GGUF-loaded model: rebuild the plain class and copy the weights in.
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.to(torch.float32)
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".gguf-"))
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    if out.exists() and force:
        shutil.rmtree(out)
    publish_dir(tmp, out)
    return out


def resolve_model_path(name_or_path: str, gguf_file: str | None = None) -> str:
    """Turn a config's model reference into something ``from_pretrained`` accepts."""
    if is_builtin(name_or_path):
        return str(builtin_model_dir(name_or_path))
    p = Path(name_or_path).expanduser()
    if gguf_file:
        return str(import_gguf(p / gguf_file))
    if p.suffix == ".gguf":
        return str(import_gguf(p))
    if p.exists():
        return str(p)
    if name_or_path.startswith((".", "/", "~")):
        raise ModelLoadError(f"model path does not exist: {p}")
    return name_or_path


def detect_kind(path: str, requested: str = "auto", revision: str | None = None) -> str:
    if requested != "auto":
        return requested
    from transformers import AutoConfig

    from engine.models.lora import adapter_base, is_adapter_dir  # torch-bound: loaded with the model

    if is_adapter_dir(path):  # a LoRA run's model saved as an adapter: the base model's family
        path = adapter_base(path)

    try:
        cfg = AutoConfig.from_pretrained(path, revision=revision)
    except OSError as exc:
        raise _offline_hint(path, exc) from exc
    return "seq2seq" if getattr(cfg, "is_encoder_decoder", False) else "causal"


def load_lm(path: str, kind: str, revision: str | None = None) -> Any:
    """Load the LM in fp32 (master weights); autocast handles the low precision compute."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from engine.models.lora import adapter_base, is_adapter_dir, load_adapter_dir  # torch-bound

    _quiet_transformers()
    if is_adapter_dir(path):  # LoRA adapter directory: its base model with the adapter merged in
        return load_adapter_dir(load_lm(adapter_base(path), kind), path)
    cls = AutoModelForSeq2SeqLM if kind == "seq2seq" else AutoModelForCausalLM
    try:
        model = cls.from_pretrained(path, revision=revision, dtype=torch.float32)
    except OSError as exc:
        raise _offline_hint(path, exc) from exc
    disable_dropout(model)
    # bf16 training on a CPU: attention in fp32 (its bf16 backward is the slow kernel); otherwise SDPA
    from engine.models.attention import use_fp32_attention_backward

    use_fp32_attention_backward(model)
    return model


def load_tokenizer(
    path: str,
    padding_side: str = "left",
    truncation_side: str = "left",
    pad_as_eos: bool = True,
    kind: str | None = None,
):
    """Load a tokenizer with the run's padding settings.

    ``kind`` (``causal`` / ``seq2seq``) checks the padding side against the model family: causal
    prompts must be left padded (right padding is rejected, naming the field); encoder-decoder
    prompts are right padded whatever ``padding_side`` says (see ``engine.rollout.prompt_padding_side``).
    """
    from transformers import AutoTokenizer

    if kind == "causal" and padding_side == "right":
        raise ValueError(RIGHT_PADDING_CAUSAL)
    if kind == "seq2seq":
        padding_side = "right"
    _quiet_transformers()
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise _offline_hint(path, exc) from exc
    tok.padding_side = padding_side
    tok.truncation_side = truncation_side
    if tok.pad_token is None:
        if pad_as_eos and tok.eos_token is not None:
            tok.pad_token = tok.eos_token
        else:
            tok.add_special_tokens({"pad_token": "<pad>"})
    return tok


def disable_dropout(model: Any) -> None:
    """Dropout makes the rollout policy differ from the scored one, which biases PPO ratios: turn it off."""
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        # functional dropout reads float attributes (T5's ``self.dropout``, Llama's ``attention_dropout``)
        for attr, value in list(vars(m).items()):
            if "dropout" in attr.lower() and isinstance(value, float):
                setattr(m, attr, 0.0)
    cfg = getattr(model, "config", None)
    if cfg is not None:
        for attr in list(vars(cfg)):
            if "dropout" in attr and isinstance(getattr(cfg, attr), float):
                setattr(cfg, attr, 0.0)


def resolve_device(device: str = "auto"):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def autocast_dtype(mixed_precision: str, device) -> Any:
    """The autocast dtype for ``mixed_precision`` on ``device`` (None = full fp32)."""
    import torch

    if mixed_precision == "no":
        return None
    if mixed_precision == "fp16":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    if mixed_precision == "bf16":
        return torch.bfloat16
    # auto
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else None


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (oneDNN with AVX-512 BF16 / AMX).

    Without it PyTorch falls back to a scalar, single-threaded bf16 GEMM: measured on an AVX2-only
    AMD EPYC VM, a (1792 x 576) @ (576 x 1536) product took 2.99 CPU-s in bf16 against 0.068 s in fp32
    (44x), which made ``mixed_precision: auto`` the slowest choice there. ``auto`` then stays in fp32.
    """
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # an op missing from this build: do not guess
        return False
