"""Shared pieces of the metrics: the result type, input checks and a download-free tokenizer."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.models.builtin import builtin_model_dir

MetricResult = dict[str, tuple[list[float] | None, float]]


class MetricError(ValueError):
    """Bad metric input or a missing asset; the message names the field or the fix."""


class Metric:
    """Base class: subclasses implement ``compute``; ``__call__`` lets any metric act as a reward.

    The reward view returns the per-sample scores of ``reward_key`` (default: the first key that has
    per-sample scores), so a metric can be plugged into ``rewards`` without a wrapper class.
    """

    reward_key: str | None = None

    def compute(
        self,
        prompts: list[str],
        generations: list[str],
        references: list[list[str]],
        meta: list[dict[str, Any]] | None = None,
    ) -> MetricResult:
        raise NotImplementedError

    def __call__(
        self,
        prompts: list[str],
        generations: list[str],
        references: list[list[str]],
        meta: list[dict[str, Any]] | None = None,
    ) -> list[float]:
        result = self.compute(prompts, generations, references, meta)
        keys = [self.reward_key] if self.reward_key else [k for k, (s, _) in result.items() if s is not None]
        if not keys or keys[0] not in result or result[keys[0]][0] is None:
            raise MetricError(f"{type(self).__name__}: no per-sample scores to use as a reward")
        return list(result[keys[0]][0])  # type: ignore[arg-type]


def check_inputs(
    prompts: Sequence[str],
    generations: Sequence[str],
    references: Sequence[Sequence[str]],
    meta: Sequence[dict[str, Any]] | None = None,
    need_references: bool = False,
) -> None:
    """Fail early with the index of the offending sample instead of deep inside a library."""
    n = len(generations)
    if len(prompts) != n:
        raise MetricError(f"prompts has {len(prompts)} items but generations has {n}")
    if len(references) != n:
        raise MetricError(f"references has {len(references)} items but generations has {n}")
    if meta is not None and len(meta) != n:
        raise MetricError(f"meta has {len(meta)} items but generations has {n}")
    for i, g in enumerate(generations):
        if not isinstance(g, str):
            raise MetricError(f"generations[{i}] is {type(g).__name__}, expected str")
    for i, refs in enumerate(references):
        if isinstance(refs, str) or not all(isinstance(r, str) for r in refs):
            raise MetricError(f"references[{i}] must be a list of strings")
        if need_references and not refs:
            raise MetricError(f"references[{i}] is empty; this metric needs at least one reference")


_TOKEN_RE = re.compile(r"\w+(?:[-'’]\w+)*|[^\w\s]", re.UNICODE)


def simple_tokenize(text: str, lower: bool = True) -> list[str]:
    """Words and single punctuation marks; needs no NLTK download (punkt is not available offline)."""
    toks = _TOKEN_RE.findall(text)
    return [t.lower() for t in toks] if lower else toks


def mean(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def cache_dir() -> Path:
    """Project cache ($GRUE_CACHE, default ~/.cache/grue-studio), shared with the builtin models."""
    return Path(os.environ.get("GRUE_CACHE") or Path.home() / ".cache" / "grue-studio")


def resolve_model_path(name_or_path: str) -> str:
    """Map ``builtin:*`` names to their local directory (engine.models.builtin), else return as is."""
    if name_or_path.startswith("builtin:"):
        return str(builtin_model_dir(name_or_path))
    return name_or_path


def resolve_device(device: str) -> str:
    """'auto' = CUDA when available (metrics with models run on the evaluation GPU), else CPU."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


_MODEL_CACHE: dict[tuple[Any, ...], Any] = {}


def cached_load(key: tuple[Any, ...], loader: Any) -> Any:
    """Load a frozen scoring model once per process: evaluation rebuilds its metrics at every eval step."""
    if key not in _MODEL_CACHE:
        if len(_MODEL_CACHE) >= 4:  # a few encoders at most; drop the oldest
            _MODEL_CACHE.pop(next(iter(_MODEL_CACHE)))
        _MODEL_CACHE[key] = loader()
    return _MODEL_CACHE[key]
