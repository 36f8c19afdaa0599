"""Sentiment score of the generations (GRUE IMDB): VADER, or a learned classifier's P(label).

The scorers are the reward side's (``engine.rewards``: ``sentiment_vader`` and ``learned``), built
through the registry so that the metric and the training reward score texts identically.

* ``variant="vader"`` (default, works offline): ``(compound + 1) / 2`` in [0, 1];
  key ``semantic/sentiment_vader``.
* ``variant="tfidf"``: P(positive) of the shipped IMDB TF-IDF + logistic-regression classifier
  (``engine.rewards.tfidf_sentiment``, 0.90 test accuracy; a learned classifier like RL4LMs's, runnable
  offline); ``include_prompt`` default True, as RL4LMs's learned metric; key ``semantic/sentiment_tfidf``,
  with ``include_prompt: false`` ``semantic/sentiment_tfidf_continuation`` (both columns fit one run).
* ``variant="learned"``: softmax probability of ``label_index`` of any HF sequence-classification
  model (``model_path``), RL4LMs's ``semantic/learned_automodel_metric`` (its IMDB sentiment metric).
  ``include_prompt`` (default True for learned, as RL4LMs's ``include_prompt_for_eval``) scores
  prompt + generation. With no IMDB classifier on the hub offline, train one first
  (see docs/metrics.md).
"""

from __future__ import annotations

from typing import Any

from engine.metrics.base import Metric, MetricError, MetricResult, check_inputs, mean
from engine.registry import metrics, rewards

KEYS = {
    "vader": "semantic/sentiment_vader",
    "tfidf": "semantic/sentiment_tfidf",
    "learned": "semantic/learned_automodel_metric",
}
SCORERS = {"vader": "sentiment_vader", "tfidf": "sentiment_tfidf", "learned": "learned"}


@metrics.register(
    "sentiment", "sentiment of the generations: VADER (offline) or a learned classifier's P(label)"
)
class Sentiment(Metric):
    def __init__(self, variant: str = "vader", include_prompt: bool | None = None, **scorer_args: Any):
        if variant not in KEYS:
            raise MetricError(f"sentiment: variant must be one of {sorted(KEYS)}, got {variant!r}")

        self.variant = variant
        self.key = self.reward_key = KEYS[variant]
        self.include_prompt = (variant != "vader") if include_prompt is None else include_prompt
        if variant == "tfidf" and not self.include_prompt:
            self.key = self.reward_key = KEYS[variant] + "_continuation"
        if variant == "learned" and "model_path" not in scorer_args:
            raise MetricError(
                "sentiment: variant 'learned' needs model_path (an HF sequence-classification dir)"
            )
        self.scorer = rewards.build(SCORERS[variant], **scorer_args)

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta)
        texts = [p + g for p, g in zip(prompts, generations)] if self.include_prompt else list(generations)
        per = [float(s) for s in self.scorer(list(prompts), texts, references, meta)]
        return {self.key: (per, mean(per))}
