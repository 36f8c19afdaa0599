"""Learned reward: any HuggingFace sequence-classification model directory (or hub id when online).

With several labels the reward is the softmax probability of ``label_index`` (e.g. P(positive) of an
IMDB sentiment classifier, as in GRUE). With one label (``num_labels == 1``) it is the raw score: that is
how Bradley–Terry reward models trained from human pairwise judgments are read, since only differences
of their scores are meaningful. Models are cached per (path, device, precision) so that the policy's
reward and an evaluation metric share one copy.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from engine.registry import rewards

_CACHE: dict[tuple[str, str, str], tuple[Any, Any]] = {}
_LOCK = threading.Lock()


def resolve_device(device: str = "auto") -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _looks_local(path: str) -> bool:
    return path.startswith(("/", ".", "~")) or Path(path).expanduser().exists()


def load_classifier(model_path: str, device: str = "cpu", precision: str = "fp32") -> tuple[Any, Any]:
    """(tokenizer, model) in eval mode, loaded once per (path, device, precision)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = str(Path(model_path).expanduser().resolve()) if _looks_local(model_path) else model_path
    key = (path, device, precision)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        if _looks_local(model_path) and not Path(path).is_dir():
            raise FileNotFoundError(
                f"learned reward: model directory not found: {path} — give reward.args.model_path a directory "
                "saved with save_pretrained (config.json, weights, tokenizer), e.g. one written by "
                "`python -m engine.tools.train_sentiment`"
            )
        try:
            tok = AutoTokenizer.from_pretrained(path)
            model = AutoModelForSequenceClassification.from_pretrained(path)
        except OSError as exc:
            raise FileNotFoundError(
                f"learned reward: cannot load a sequence-classification model from {model_path!r} ({exc}). "
                "Offline? Use a local directory for reward.args.model_path."
            ) from exc
        tok.truncation_side = "left"  # as RL4LMs: the end of a continuation matters most
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token or tok.unk_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tok.pad_token_id
        model.to(device).eval()
        _CACHE[key] = (tok, model)
        return tok, model


class LearnedReward:
    """P(label_index) of a sequence classifier, or its raw score when it has a single output."""

    def __init__(
        self,
        model_path: str,
        label_index: int | str = 1,
        batch_size: int = 32,
        max_length: int = 512,
        device: str = "auto",
        precision: str = "auto",
    ):
        if precision not in ("auto", "fp32", "bf16"):
            raise ValueError("learned: precision must be 'auto', 'fp32' or 'bf16'")
        self.device = resolve_device(device)
        import torch

        if precision == "auto":
            cuda_bf16 = self.device.startswith("cuda") and torch.cuda.is_bf16_supported()
            precision = "bf16" if cuda_bf16 else "fp32"
        self.precision = precision
        self.tokenizer, self.model = load_classifier(model_path, self.device, precision)
        self.num_labels = int(self.model.config.num_labels)
        if isinstance(label_index, str):
            label2id = {str(k).lower(): int(v) for k, v in (self.model.config.label2id or {}).items()}
            if label_index.lower() not in label2id:
                raise ValueError(
                    f"learned: label {label_index!r} not in the model's labels {sorted(label2id)}"
                )
            label_index = label2id[label_index.lower()]
        if self.num_labels > 1 and not 0 <= label_index < self.num_labels:
            raise ValueError(
                f"learned: label_index {label_index} out of range for a model with {self.num_labels} labels "
                f"({self.model.config.id2label})"
            )
        self.label_index = int(label_index)
        self.batch_size = batch_size
        self.max_length = min(
            max_length, getattr(self.tokenizer, "model_max_length", max_length) or max_length
        )

    def scores(self, texts: list[str]) -> list[float]:
        # Lazy on purpose: importing engine.rewards imports every reward module, and it stays torch-free.
        import torch

        from engine.models.precision import autocast

        out: list[float] = []
        amp = torch.bfloat16 if self.precision == "bf16" else None
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[i : i + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
            ).to(self.device)
            with torch.inference_mode(), autocast(self.device, amp):
                logits = self.model(**enc).logits.float()
            if self.num_labels == 1:
                out.extend(logits[:, 0].tolist())
            else:
                out.extend(torch.softmax(logits, dim=-1)[:, self.label_index].tolist())
        return out

    def __call__(self, prompts, generations, references=None, meta=None) -> list[float]:
        return self.scores(list(generations))


rewards.register("learned")(LearnedReward)


class RL4LMsLearnedReward(LearnedReward):
    """RL4LMs's ``learned_reward`` arguments (model_name, label_ix, include_prompt_for_eval=True)."""

    def __init__(self, model_name: str, label_ix: int = 1, include_prompt_for_eval: bool = True, **kw: Any):
        super().__init__(model_path=model_name, label_index=label_ix, **kw)
        self.include_prompt = include_prompt_for_eval

    def __call__(self, prompts, generations, references=None, meta=None) -> list[float]:
        texts = [p + g for p, g in zip(prompts, generations)] if self.include_prompt else list(generations)
        return self.scores(texts)


rewards.add(
    "learned_reward", RL4LMsLearnedReward, "RL4LMs id: learned classifier reward (model_name, label_ix)"
)
rewards.add("learned_batched_reward", RL4LMsLearnedReward, "RL4LMs id: alias of learned_reward")
