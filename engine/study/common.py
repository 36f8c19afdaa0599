"""What every step of a study shares: the files a study directory holds, the test metrics it reads,
its error, run keys and the seed statistics.

Standard library only: every other module of the package imports it and it imports none of them, so
the runner, the report and the web app read one spelling of each name."""

from __future__ import annotations

import math

STUDY_FILE = "study.json"
RESULT_FILE = "result.json"
TEST_FILE = "test_results.json"
REFERENCE_FORMAT = "grue-reference-runs/1"
# The study's sentiment (reward and verdicts): the shipped learned classifier on prompt + continuation,
# as RL4LMs's DistilBERT-IMDB metric; the continuation alone and VADER are extra columns.
SENTIMENT = "semantic/sentiment_tfidf"
SENTIMENT_CONTINUATION = "semantic/sentiment_tfidf_continuation"
SENTIMENT_VADER = "semantic/sentiment_vader"
PERPLEXITY = "fluency_metrics/perplexity"


class StudyError(ValueError):
    """A study that cannot run or be reported (unknown study or budget, a directory of another study)."""


def run_key(cell: str, seed: int) -> str:
    return f"{cell}-seed{seed}"


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1); std is None below two values."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None, None
    m = sum(vals) / len(vals)
    if len(vals) < 2:
        return m, None
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
