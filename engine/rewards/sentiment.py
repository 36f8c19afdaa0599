"""Lexicon sentiment reward (VADER): needs no model download, so IMDB runs offline out of the box.

VADER's compound score lies in [-1, 1]; the default reward maps it to ``(compound + 1) / 2`` so that it
reads like the P(positive) of a learned classifier (GRUE's IMDB reward) and mixes with it on one scale.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from engine.registry import rewards

_HTML_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)


@lru_cache(maxsize=1)
def _analyzer() -> Any:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def vader_scores(texts: list[str]) -> list[dict[str, float]]:
    """VADER's neg/neu/pos/compound per text (IMDB's ``<br />`` tags become spaces first)."""
    sia = _analyzer()
    return [sia.polarity_scores(_HTML_BREAK.sub(" ", t)) for t in texts]


class VaderSentiment:
    """Positive sentiment of the text by VADER: ``(compound + 1) / 2`` in [0, 1] (``score="positive"``),
    the raw compound in [-1, 1] (``"compound"``), or ``"negative"`` = 1 − positive (to steer the other way)."""

    def __init__(self, score: str = "positive"):
        if score not in ("positive", "compound", "negative"):
            raise ValueError("sentiment_vader: score must be 'positive', 'compound' or 'negative'")
        self.score = score

    def __call__(self, prompts, generations, references=None, meta=None) -> list[float]:
        out = []
        for s in vader_scores(list(generations)):
            c = s["compound"]
            out.append(
                c if self.score == "compound" else (c + 1) / 2 if self.score == "positive" else (1 - c) / 2
            )
        return out


rewards.register("sentiment_vader")(VaderSentiment)
