"""METEOR, CIDEr-D, PARENT and diversity against documented and hand-computed values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engine.metrics import MetricError
from engine.metrics.cider import cider_d
from engine.metrics.meteor import ensure_wordnet, tokenize
from engine.metrics.parent import totto_tables
from engine.registry import metrics


def _run(metric_id, gens, refs, meta=None, **args):
    m = metrics.build(metric_id, **args)
    return m.compute([""] * len(gens), gens, refs, meta or [{} for _ in gens])


# ---- METEOR -------------------------------------------------------------------------------------

NLTK_HYP = "It is a guide to action which ensures that the military always obeys the commands of the party"
NLTK_REF = "It is a guide to action that ensures that the military will forever heed Party commands"


def test_meteor_nltk_documented_example():
    # nltk.translate.meteor_score docstring: round(meteor_score([reference1], hypothesis1), 4) == 0.6944
    res = _run("meteor", [NLTK_HYP], [[NLTK_REF]])
    assert round(res["lexical/meteor"][1], 4) == 0.6944


def test_meteor_uses_wordnet_synonyms_and_best_reference():
    # auto/car share WordNet's car.n.01: 4 of 4 words match in one chunk -> (1 - 0.5 * (1/4)^3) = 0.9921875.
    # (NLTK matches synonyms on Porter stems, so pairs whose stem is not a lemma, like large/big, do not match.)
    syn = _run("meteor", ["the auto is red"], [["the car is red"]])["lexical/meteor"][1]
    other = _run("meteor", ["the bus is red"], [["the car is red"]])["lexical/meteor"][1]
    assert syn == pytest.approx(0.9921875)
    assert other < syn
    multi = _run("meteor", ["a cat sits"], [["dogs bark loudly", "a cat sits"]])["lexical/meteor"][0][0]
    assert multi > 0.9


def test_meteor_tokenizer_splits_sentences_without_punkt():
    # What nltk.word_tokenize (punkt + Treebank) gives: sentence-final periods split off, titles kept.
    text = 'Mr. Smith left the U.S. in 2001. He said: "no." Really?'
    assert tokenize(text) == [
        "Mr.", "Smith", "left", "the", "U.S.", "in", "2001", ".",
        "He", "said", ":", "``", "no", ".", "''", "Really", "?",
    ]  # fmt: skip


def test_meteor_missing_wordnet_says_how_to_install(tmp_path):
    with pytest.raises(MetricError, match="apt-get install wordnet-base wordnet-sense-index"):
        ensure_wordnet(source=tmp_path / "empty", nltk_dir=tmp_path / "nltk")


def test_wordnet_dir_is_a_copy_not_symlinks(tmp_path):
    root = ensure_wordnet(nltk_dir=tmp_path / "nltk")
    wn = root / "corpora" / "wordnet"
    assert (wn / "lexnames").is_file() and not any(p.is_symlink() for p in wn.iterdir())


# ---- CIDEr-D ------------------------------------------------------------------------------------


def test_cider_d_hand_computed():
    # Two samples, every n-gram in one sample's references only: idf = log(2) for all.
    # A: identical 2-word sentences -> cosine 1 for n=1,2, no 3/4-grams -> 10 * 2/4 = 5.
    # B: "c d" vs "c e": unigram cosine L^2 / (sqrt2 L * sqrt2 L) = 1/2, bigram 0 -> 10 * 0.5/4 = 1.25.
    res = _run("cider", ["a b", "c d"], [["a b"], ["c e"]])
    assert res["lexical/cider"][0] == pytest.approx([5.0, 1.25])
    assert res["lexical/cider"][1] == pytest.approx(3.125)


def test_cider_d_clips_repeated_ngrams():
    # "a a" vs "a b": clipped min(2L, L) * L / (2L * sqrt2 L) = 1/(2 sqrt2); unclipped would be twice that.
    scores = cider_d([["a", "a"], ["c"]], [[["a", "b"]], [["c"]]])
    assert scores[0] == pytest.approx(10 * (1 / (2 * math.sqrt(2))) / 4)
    assert scores[1] == pytest.approx(2.5)


def test_cider_d_gaussian_length_penalty():
    cands = [["a", "b", "c"], ["x", "y"]]
    refs = [[["a", "b", "c", "d", "e", "f", "g"]], [["x", "z"]]]
    wide = cider_d(cands, refs, sigma=1e9)
    narrow = cider_d(cands, refs, sigma=6.0)
    assert narrow[0] == pytest.approx(wide[0] * math.exp(-(4**2) / (2 * 36)))
    assert narrow[1] == pytest.approx(wide[1])


# ---- PARENT -------------------------------------------------------------------------------------

TABLE = {"table": [["name", "John"], ["age", "30"]]}


def test_parent_hand_computed_unigrams():
    # max_order=1, lambda=0.5. Reference "john is old"; table values {john, 30}.
    # "john is 30": every token in the reference or the table -> P = 1; R_ref = 1 (only "john" has weight);
    # table recall (1 + 1)/2 = 1 -> F = 1.
    # "john is 45": P = 2/3 ("45" neither in ref nor table); R_ref = 1; table recall 1/2 -> R = sqrt(1/2).
    res = _run(
        "parent",
        ["john is 30", "john is 45"],
        [["john is old"]] * 2,
        [TABLE, TABLE],
        max_order=1,
        lambda_weight=0.5,
    )
    p, r = 2 / 3, math.sqrt(0.5)
    assert res["table_to_text/parent_overall_precision"][0] == pytest.approx([1.0, p])
    assert res["table_to_text/parent_overall_recall"][0] == pytest.approx([1.0, r])
    assert res["table_to_text/parent_overall_f_score"][0] == pytest.approx(
        [1.0, 2 * p * r / (p + r)], abs=1e-7
    )


def test_parent_reference_recall_weighted_by_table_entailment():
    # Reference "john is 30 years old": only "john" and "30" are entailed (weights 1); "john is old" misses 30.
    # P = 1 (all tokens in the reference), R_ref = 1/2, table recall 1/2 -> R = 1/2, F = 2/3.
    res = _run("parent", ["john is old"], [["john is 30 years old"]], [TABLE], max_order=1, lambda_weight=0.5)
    assert res["table_to_text/parent_overall_f_score"][0][0] == pytest.approx(2 / 3, abs=1e-7)


def test_parent_bigrams_and_adaptive_lambda():
    # Perfect copy of the reference: all precisions and reference recalls are 1.
    res = _run("parent", ["john is 30 years old"], [["john is 30 years old"]], [TABLE])
    assert res["table_to_text/parent_overall_precision"][1] == pytest.approx(1.0)
    assert res["table_to_text/parent_overall_recall"][1] == pytest.approx(1.0)
    # Three tokens have no 4-grams: that order's precision 0 is smoothed to 1e-5 (reference implementation),
    # so P = (1 * 1 * 1 * 1e-5) ** (1/4).
    res = _run("parent", ["john is 30"], [["john is 30"]], [TABLE])
    assert res["table_to_text/parent_overall_precision"][1] == pytest.approx(1e-5**0.25)
    # Adaptive lambda: the reference mentions every table value -> lambda = 0 -> R = R_ref.
    res = _run(
        "parent", ["john is old"], [["john is 30 years old"]], [TABLE], max_order=1, lambda_weight=None
    )
    assert res["table_to_text/parent_overall_recall"][0][0] == pytest.approx(0.5)


def test_parent_reads_raw_totto_and_rejects_missing_table():
    ex = json.loads(
        (Path(__file__).parents[2] / "engine" / "metrics" / "assets" / "totto_dev_example.json").read_text()
    )
    prec, rec = totto_tables(ex)
    # recall table: the highlighted cells and the titles (ToTTo's prepare_references_for_eval.py)
    assert rec == [
        ("cell", "2015"), ("cell", "The 12"), ("cell", "Pete"), ("cell", "Denver Center"),
        ("page_title", "Colin Hanlon"), ("section_title", "Theatre credits"),
    ]  # fmt: skip
    # precision (entailment) table: every cell of the whole table, titles and section text
    assert ("header", "Year") in prec and ("cell", "Rent") in prec and ("page_title", "Colin Hanlon") in prec
    assert len(prec) > len(rec)
    ref = ex["sentence_annotations"][0]["final_sentence"]
    res = _run("parent", [ref, "the weather is nice"], [[ref], [ref]], [{"raw_table": ex}, {"raw_table": ex}])
    good, bad = res["table_to_text/parent_overall_f_score"][0]
    assert good > 0.8 > 0.1 > bad
    with pytest.raises(MetricError, match=r"meta\[0\]: PARENT needs"):
        _run("parent", ["x"], [["x"]], [{}])


# ---- diversity ----------------------------------------------------------------------------------


def test_diversity_hand_counted():
    res = _run("diversity", ["The cat the dog", "a b c"], [[], []], window_size=4)
    k = "diversity_metrics/"
    # tokens: the cat the dog | a b c  -> 7 unigrams, 6 distinct
    assert res[k + "distinct-1"][1] == pytest.approx(6 / 7)
    assert res[k + "vocab_size-1"][1] == 6
    # bigrams within sentences: the-cat, cat-the, the-dog, a-b, b-c: 5 of 5 distinct
    assert res[k + "distinct-2"][1] == 1.0
    # entropy: "the" p=2/7, five words p=1/7
    h = -(2 / 7 * math.log2(2 / 7) + 5 * (1 / 7) * math.log2(1 / 7))
    assert res[k + "entropy-1"][1] == pytest.approx(h)
    # MSTTR-4: one full segment "the cat the dog" (TTR 3/4); the 3-token rest is dropped
    assert res[k + "msttr-4"][1] == pytest.approx(0.75)
    assert res[k + "mean_pred_length"] == ([4.0, 3.0], 3.5)
    assert res[k + "distinct-1"][0] == pytest.approx([0.75, 1.0])
