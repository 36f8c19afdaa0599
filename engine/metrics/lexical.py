"""N-gram overlap metrics: ROUGE (rouge-score), BLEU, SacreBLEU, chrF, TER (sacrebleu), ROUGE-L-max.

Keys follow RL4LMs (``lexical/...``) so that results line up with the paper's tables. sacrebleu
scores are divided by 100 like RL4LMs does, so every lexical metric lies in [0, 1].
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from engine.metrics.base import Metric, MetricError, MetricResult, check_inputs, mean
from engine.registry import metrics

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+")


def _sentences_per_line(text: str) -> str:
    # rougeLsum treats newlines as sentence boundaries; plain text rarely has them.
    return "\n".join(s for s in _SENT_SPLIT.split(text.strip()) if s)


@metrics.register("rouge", "ROUGE-1/2/L/Lsum F-measure (rouge-score, Porter stemmer)")
class Rouge(Metric):
    """ROUGE F-measures; corpus value is the mean of the per-sample F-measures.

    ``use_single_ref=True`` scores against the first reference only, as RL4LMs does; otherwise the
    best-scoring reference counts (rouge-score's ``score_multi``).
    """

    reward_key = "lexical/rouge_rouge1"

    def __init__(
        self,
        rouge_types: list[str] | tuple[str, ...] = ROUGE_TYPES,
        use_stemmer: bool = True,
        use_single_ref: bool = True,
        split_sentences: bool = True,
    ):
        from rouge_score import rouge_scorer

        bad = [t for t in rouge_types if t not in ROUGE_TYPES and not re.fullmatch(r"rouge\d", t)]
        if bad:
            raise MetricError(f"rouge: unknown rouge_types {bad}; use {list(ROUGE_TYPES)}")
        self.rouge_types = list(rouge_types)
        self.use_single_ref = use_single_ref
        self.split_sentences = split_sentences
        self._scorer = rouge_scorer.RougeScorer(self.rouge_types, use_stemmer=use_stemmer)
        self.reward_key = f"lexical/rouge_{self.rouge_types[0]}"

    def _prep(self, text: str) -> str:
        return _sentences_per_line(text) if self.split_sentences else text

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta, need_references=True)
        per: dict[str, list[float]] = {t: [] for t in self.rouge_types}
        for gen, refs in zip(generations, references):
            targets = [self._prep(r) for r in (refs[:1] if self.use_single_ref else refs)]
            scores = self._scorer.score_multi(targets, self._prep(gen))
            for t in self.rouge_types:
                per[t].append(scores[t].fmeasure)
        return {f"lexical/rouge_{t}": (per[t], mean(per[t])) for t in self.rouge_types}


@metrics.register("rouge_l_max", "ROUGE-L F-measure, maximum over the references (NarrativeQA)")
class RougeLMax(Metric):
    """Max over references of ROUGE-L F, the NarrativeQA reward of RL4LMs (UnifiedQA's evaluation)."""

    reward_key = "lexical/rouge_l_max"

    def __init__(self, use_stemmer: bool = True):
        from rouge_score import rouge_scorer

        self._scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=use_stemmer)

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta, need_references=True)
        scores = [
            max(self._scorer.score(r, gen)["rougeL"].fmeasure for r in refs)
            for gen, refs in zip(generations, references)
        ]
        return {"lexical/rouge_l_max": (scores, mean(scores))}


def _ngrams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def compute_bleu(
    hyps: list[list[str]], refs: list[list[list[str]]], max_order: int = 4, smooth: bool = False
) -> float:
    """Corpus BLEU (Papineni et al. 2002) as in the TensorFlow NMT script that HF ``bleu`` wraps.

    Brevity penalty uses the shortest reference; ``smooth`` adds one to numerator and denominator of
    every order (Lin and Och 2004), which keeps single sentences from scoring 0.
    """
    matches = [0] * max_order
    possible = [0] * max_order
    hyp_len = ref_len = 0
    for hyp, rs in zip(hyps, refs):
        ref_len += min(len(r) for r in rs)
        hyp_len += len(hyp)
        for n in range(1, max_order + 1):
            h = _ngrams(hyp, n)
            maxref: Counter = Counter()
            for r in rs:
                maxref |= _ngrams(r, n)
            matches[n - 1] += sum((h & maxref).values())
            possible[n - 1] += max(len(hyp) - n + 1, 0)
    precisions = []
    for i in range(max_order):
        if smooth:
            precisions.append((matches[i] + 1.0) / (possible[i] + 1.0))
        else:
            precisions.append(matches[i] / possible[i] if possible[i] > 0 else 0.0)
    if min(precisions) <= 0:
        return 0.0
    geo = math.exp(sum(math.log(p) / max_order for p in precisions))
    if hyp_len == 0:
        return 0.0
    ratio = hyp_len / ref_len if ref_len else math.inf
    bp = 1.0 if ratio > 1.0 else math.exp(1 - 1.0 / ratio)
    return geo * bp


@metrics.register("bleu", "Corpus BLEU-4 on whitespace tokens (per sample: smoothed sentence BLEU)")
class Bleu(Metric):
    """RL4LMs's ``lexical/bleu``: unsmoothed corpus BLEU on whitespace tokens.

    Per sample: smoothed (add-one) sentence BLEU, since unsmoothed sentence BLEU is 0 for most short
    outputs and would be useless as a reward.
    """

    reward_key = "lexical/bleu"

    def __init__(self, max_order: int = 4, smooth: bool = False):
        self.max_order, self.smooth = max_order, smooth

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta, need_references=True)
        hyps = [g.split() for g in generations]
        refs = [[r.split() for r in rs] for rs in references]
        per = [compute_bleu([h], [r], self.max_order, smooth=True) for h, r in zip(hyps, refs)]
        corpus = compute_bleu(hyps, refs, self.max_order, smooth=self.smooth)
        return {"lexical/bleu": (per, corpus)}


def _ref_streams(references: list[list[str]]) -> list[list[str]]:
    """sacrebleu wants one stream per reference position; pad short lists with their first reference.

    A duplicated reference changes neither BLEU's clipped counts nor closest-length, chrF's or TER's
    best-reference choice, so padding is exact.
    """
    k = max(len(r) for r in references)
    padded = [list(r) + [r[0]] * (k - len(r)) for r in references]
    return [[p[j] for p in padded] for j in range(k)]


class _SacreMetric(Metric):
    key = ""

    def _make(self, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __init__(self, **kwargs: Any):
        self._corpus_metric: Any = None  # a ``_make`` that needs other settings for the corpus sets it
        try:
            self._metric = self._make(**kwargs)
        except (TypeError, KeyError, ValueError) as exc:
            raise MetricError(f"{self.key}: bad sacrebleu arguments {kwargs}: {exc!r}") from exc
        if self._corpus_metric is None:
            self._corpus_metric = self._metric
        self.reward_key = self.key

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta, need_references=True)
        corpus = self._corpus_metric.corpus_score(list(generations), _ref_streams(references)).score / 100.0
        per = [self._metric.sentence_score(g, list(r)).score / 100.0 for g, r in zip(generations, references)]
        return {self.key: (per, corpus)}


@metrics.register("sacrebleu", "SacreBLEU (sacrebleu, 13a tokenizer by default), divided by 100")
class SacreBleu(_SacreMetric):
    """Corpus SacreBLEU; per sample: sacrebleu's sentence BLEU (exp smoothing, effective order).

    Arguments go to ``sacrebleu.BLEU`` (e.g. ``tokenize="intl"`` as in RL4LMs's translation configs).
    """

    key = "lexical/sacrebleu"

    def _make(self, **kwargs: Any) -> Any:
        from sacrebleu.metrics import BLEU

        # effective_order only makes sense for sentences; corpus BLEU keeps all orders.
        self._corpus_metric = BLEU(**{k: v for k, v in kwargs.items() if k != "effective_order"})
        return BLEU(**{"effective_order": True, **kwargs})


@metrics.register("chrf", "chrF (sacrebleu), divided by 100")
class ChrF(_SacreMetric):
    """Character n-gram F-score (Popović 2015); args go to ``sacrebleu.CHRF`` (``word_order=2`` = chrF++)."""

    key = "lexical/chrf"

    def _make(self, **kwargs: Any) -> Any:
        from sacrebleu.metrics import CHRF

        return CHRF(**kwargs)


@metrics.register("ter", "Translation edit rate (sacrebleu), divided by 100; lower is better")
class Ter(_SacreMetric):
    """TER (Snover et al. 2006); the translation reward is ``1 - TER`` (wrapped by the reward side)."""

    key = "lexical/ter"

    def _make(self, **kwargs: Any) -> Any:
        from sacrebleu.metrics import TER

        return TER(**kwargs)


for _alias, _cls in (("sacre_bleu", SacreBleu),):
    metrics.add(_alias, _cls, f"alias of {_cls.__name__} (RL4LMs id)")
