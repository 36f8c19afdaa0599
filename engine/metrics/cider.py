"""CIDEr-D (Vedantam, Zitnick and Parikh, CVPR 2015), implemented from the paper.

For n = 1..4 every sentence becomes a TF-IDF vector g^n over its n-grams, with
``tf = count`` and ``idf = log(N / max(1, df))`` where N is the number of samples and df the number
of samples whose reference set contains the n-gram (IDF comes from the references of the evaluated
corpus, as in the paper and the coco-caption code). CIDEr-D_n between candidate c and reference s:

    10 * exp(-(l_c - l_s)^2 / (2 sigma^2)) * sum_k min(g_k(c), g_k(s)) * g_k(s) / (|g(c)| |g(s)|)

averaged over the references, then averaged over n with uniform weights; sigma = 6. The min() clips
candidate n-gram weights at the reference's (the "D" variant's defence against repetition) and the
Gaussian penalises length differences. The sentence score is multiplied by 10 as in the paper.
Corpus score = mean of the per-sample scores.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from engine.metrics.base import Metric, MetricResult, check_inputs, mean, simple_tokenize
from engine.registry import metrics


def _counts(tokens: list[str], max_n: int) -> list[Counter]:
    return [
        Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)) for n in range(1, max_n + 1)
    ]


def _vec(counts: list[Counter], df: Counter, log_n: float) -> tuple[list[dict], list[float]]:
    vecs, norms = [], []
    for c in counts:
        v = {g: tf * (log_n - math.log(max(1.0, df[g]))) for g, tf in c.items()}
        vecs.append(v)
        norms.append(math.sqrt(sum(x * x for x in v.values())))
    return vecs, norms


def cider_d(
    candidates: Sequence[list[str]],
    references: Sequence[Sequence[list[str]]],
    max_n: int = 4,
    sigma: float = 6.0,
) -> list[float]:
    """Per-sample CIDEr-D of tokenised candidates against tokenised reference lists."""
    ref_counts = [[_counts(r, max_n) for r in refs] for refs in references]
    df: Counter = Counter()
    for rc in ref_counts:
        seen = set()
        for per_ref in rc:
            for c in per_ref:
                seen.update(c)
        df.update(seen)
    log_n = math.log(float(len(candidates))) if candidates else 0.0
    scores = []
    for cand, rc, refs in zip(candidates, ref_counts, references):
        vc, nc = _vec(_counts(cand, max_n), df, log_n)
        total = 0.0
        for r_counts, r_tokens in zip(rc, refs):
            vr, nr = _vec(r_counts, df, log_n)
            delta = len(cand) - len(r_tokens)
            penalty = math.exp(-(delta**2) / (2 * sigma**2))
            sim = 0.0
            for n in range(max_n):
                val = sum(min(w, vr[n][g]) * vr[n][g] for g, w in vc[n].items() if g in vr[n])
                if nc[n] != 0 and nr[n] != 0:
                    val /= nc[n] * nr[n]
                sim += val * penalty
            total += sim / max_n
        scores.append(10.0 * total / len(refs) if refs else 0.0)
    return scores


@metrics.register("cider", "CIDEr-D (sigma 6, clipped, x10), IDF from the evaluated references")
class CiderD(Metric):
    """CIDEr-D on lowercased word tokens with punctuation dropped (as coco-caption's tokenizer does)."""

    reward_key = "lexical/cider"

    def __init__(self, max_n: int = 4, sigma: float = 6.0):
        self.max_n, self.sigma = max_n, sigma

    @staticmethod
    def _tok(text: str) -> list[str]:
        return [t for t in simple_tokenize(text) if any(ch.isalnum() for ch in t)]

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta, need_references=True)
        per = cider_d(
            [self._tok(g) for g in generations],
            [[self._tok(r) for r in refs] for refs in references],
            self.max_n,
            self.sigma,
        )
        return {"lexical/cider": (per, mean(per))}
