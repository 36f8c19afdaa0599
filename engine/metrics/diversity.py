"""Diversity statistics of the generations, as RL4LMs reports them (GEM-metrics definitions).

Texts are lowercased and split into words and punctuation marks. Over the whole corpus:

* ``distinct-n``: distinct n-grams / total n-grams (Li et al. 2016), n = 1, 2;
* ``entropy-1``: Shannon entropy (bits) of the unigram distribution;
* ``vocab_size-1``: number of distinct unigrams;
* ``msttr-W``: mean segmental type-token ratio (Johnson 1944): the concatenated tokens are cut into
  consecutive segments of W tokens (default 100), the last partial one dropped, and their TTRs averaged
  (with fewer than W tokens in all: the TTR of those tokens, where GEM-metrics gives NaN, so that the
  value stays a number for charts and JSON);
* ``mean_pred_length``: mean tokens per generation.

Diversity is a corpus property; the per-sample values are the same statistics within one generation
(msttr: the type-token ratio of the whole generation), which is what a per-sample reward can use.
"""

from __future__ import annotations

import math
from collections import Counter

from engine.metrics.base import Metric, MetricResult, check_inputs, simple_tokenize
from engine.registry import metrics

PREFIX = "diversity_metrics/"


def ngram_stats(token_lists: list[list[str]], n: int) -> tuple[Counter, int]:
    freqs: Counter = Counter()
    total = 0
    for toks in token_lists:
        for i in range(len(toks) - n + 1):
            freqs[tuple(toks[i : i + n])] += 1
            total += 1
    return freqs, total


def entropy(freqs: Counter) -> float:
    total = sum(freqs.values())
    return -sum(c / total * math.log2(c / total) for c in freqs.values()) if total else 0.0


def msttr(token_lists: list[list[str]], window: int) -> float:
    flat = [t for toks in token_lists for t in toks]
    ttrs = [len(set(flat[i : i + window])) / window for i in range(0, len(flat) - window + 1, window)]
    if not ttrs:
        return len(set(flat)) / len(flat) if flat else 0.0
    return sum(ttrs) / len(ttrs)


def _stats(token_lists: list[list[str]], window: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in (1, 2):
        freqs, total = ngram_stats(token_lists, n)
        out[f"distinct-{n}"] = len(freqs) / total if total else 0.0
        if n == 1:
            out["entropy-1"] = entropy(freqs)
            out["vocab_size-1"] = float(len(freqs))
    out[f"msttr-{window}"] = msttr(token_lists, window)
    lengths = [len(t) for t in token_lists]
    out["mean_pred_length"] = sum(lengths) / len(lengths) if lengths else 0.0
    return out


@metrics.register("diversity", "distinct-1/2, MSTTR, unigram entropy, vocabulary size, mean length")
class Diversity(Metric):
    reward_key = PREFIX + "distinct-1"

    def __init__(self, window_size: int = 100):
        self.window = int(window_size)

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta)
        toks = [simple_tokenize(g) for g in generations]
        corpus = _stats(toks, self.window)
        per: dict[str, list[float]] = {k: [] for k in corpus}
        for t in toks:
            s = _stats([t], self.window)
            s[f"msttr-{self.window}"] = len(set(t)) / len(t) if t else 0.0
            for k in per:
                per[k].append(s[k])
        return {PREFIX + k: (per[k], corpus[k]) for k in corpus}
