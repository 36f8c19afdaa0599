"""A learned IMDB sentiment reward that ships with the repository: TF-IDF + logistic regression.

Why: RL4LMs's IMDB reward and sentiment metric are a *learned* classifier (``lvwerra/distilbert-imdb``,
P(positive) of prompt + continuation). That model cannot be downloaded here, and VADER, the lexicon
fallback, is a weak stand-in (0.69 accuracy on IMDB test reviews): a policy can please it with a few
words it happens to know. A linear model over word uni- and bigrams, trained on the full IMDB train
split (25,000 reviews), reaches ~0.9 test accuracy, weighs about a megabyte as JSON and scores a text in
microseconds, so it can be shipped, read without pickle (no code in the file) and used on any CPU.

The featuriser is defined here once and used by both the trainer (``engine.tools.train_tfidf_sentiment``)
and the scorer, so the shipped weights always meet the features they were trained on:
lowercase, ``<br />`` to space, tokens ``\\b\\w\\w+\\b`` (scikit-learn's default pattern), uni- and bigrams,
sublinear term frequency ``1 + log tf``, smoothed idf ``log((1 + n) / (1 + df)) + 1``, L2-normalised.
P(positive) = sigmoid(w · x + b).

Reward id ``sentiment_tfidf`` (args: ``model``, a shipped model name; ``score``: positive | negative);
metric ``sentiment`` with ``variant: tfidf`` (key ``semantic/sentiment_tfidf``; with ``include_prompt``
false, the continuation alone: ``semantic/sentiment_tfidf_continuation``). The shipped model's
provenance and accuracy: ``engine/rewards/assets/PROVENANCE.md``.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

from engine.registry import rewards

ASSETS = Path(__file__).resolve().parent / "assets"
#: Shipped models by name (never a user path: the web app builds rewards from configs).
MODELS = {"imdb": ASSETS / "imdb_tfidf_lr.json.gz"}
FORMAT = "grue-tfidf-logreg/1"

_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
_TOKEN = re.compile(r"(?u)\b\w\w+\b")


def tokens(text: str) -> list[str]:
    """Unigrams and bigrams of a text, in order (the features before counting)."""
    words = _TOKEN.findall(_BREAK.sub(" ", text).lower())
    return words + [f"{a} {b}" for a, b in zip(words, words[1:])]


class TfidfLogReg:
    """Scores texts with a fixed vocabulary, idf weights and a logistic regression over them."""

    def __init__(self, vocab: list[str], idf: list[float], coef: list[float], intercept: float):
        if not (len(vocab) == len(idf) == len(coef)):
            raise ValueError("tfidf model: vocab, idf and coef must have the same length")
        self.index = {t: i for i, t in enumerate(vocab)}
        self.idf = idf
        self.coef = coef
        self.intercept = float(intercept)

    @classmethod
    def load(cls, path: str | Path) -> TfidfLogReg:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: not a {FORMAT} file (format {data.get('format')!r})")
        return cls(data["vocab"], data["idf"], data["coef"], data["intercept"])

    def features(self, text: str) -> dict[int, float]:
        """Sparse L2-normalised TF-IDF vector of ``text``."""
        counts = Counter(i for i in (self.index.get(t) for t in tokens(text)) if i is not None)
        vec = {i: (1.0 + math.log(c)) * self.idf[i] for i, c in counts.items()}
        norm = math.sqrt(sum(v * v for v in vec.values()))
        return {i: v / norm for i, v in vec.items()} if norm > 0 else {}

    def logit(self, text: str) -> float:
        return self.intercept + sum(self.coef[i] * v for i, v in self.features(text).items())

    def prob_positive(self, texts: list[str]) -> list[float]:
        out = []
        for t in texts:
            z = self.logit(t)
            out.append(1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z)))
        return out


@lru_cache(maxsize=4)
def load_model(name: str = "imdb") -> TfidfLogReg:
    if name not in MODELS:
        raise ValueError(f"sentiment_tfidf: unknown model {name!r}; shipped models: {', '.join(MODELS)}")
    return TfidfLogReg.load(MODELS[name])


class TfidfSentiment:
    """P(positive) of the shipped TF-IDF logistic regression (``score="negative"``: 1 − that).

    Scores the texts it is given: with the reward's ``include_prompt: true`` (RL4LMs's IMDB setting)
    that is prompt + continuation, otherwise the continuation alone."""

    def __init__(self, model: str = "imdb", score: str = "positive"):
        if score not in ("positive", "negative"):
            raise ValueError("sentiment_tfidf: score must be 'positive' or 'negative'")
        self.model = load_model(model)
        self.score = score

    def __call__(self, prompts, generations, references=None, meta=None) -> list[float]:
        p = self.model.prob_positive(list(generations))
        return p if self.score == "positive" else [1.0 - x for x in p]


rewards.add(
    "sentiment_tfidf",
    TfidfSentiment,
    "P(positive) of the shipped IMDB TF-IDF + logistic-regression classifier (0.9 test accuracy)",
)
