"""Lexical metrics against the packages' documented examples and hand-computed values."""

from __future__ import annotations

import math

import pytest

from engine.metrics import MetricError, build_metrics, compute_all
from engine.metrics.lexical import compute_bleu
from engine.registry import metrics

# sacrebleu's README example: two reference streams for three system sentences.
SB_REFS = [
    ["The dog bit the man.", "It was not unexpected.", "The man bit him first."],
    ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."],
]
SB_SYS = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
PER_SAMPLE_REFS = [list(r) for r in zip(*SB_REFS)]


def _run(metric_id, gens, refs, **args):
    m = metrics.build(metric_id, **args)
    return m.compute([""] * len(gens), gens, refs, [{} for _ in gens])


def test_sacrebleu_readme_values():
    res = _run("sacrebleu", SB_SYS, PER_SAMPLE_REFS)
    assert round(res["lexical/sacrebleu"][1] * 100, 2) == 48.53
    assert res["lexical/sacrebleu"][0][0] == pytest.approx(1.0)  # identical sentence
    chrf = _run("chrf", SB_SYS, PER_SAMPLE_REFS)
    assert round(chrf["lexical/chrf"][1] * 100, 2) == 59.73


def test_sacrebleu_variable_reference_count_matches_readme():
    # README: dropping the first reference of sentence 1 gives BLEU = 29.44.
    refs = [list(r) for r in PER_SAMPLE_REFS]
    refs[0] = [refs[0][1]]
    res = _run("sacre_bleu", SB_SYS, refs)
    assert round(res["lexical/sacrebleu"][1] * 100, 2) == 29.44


def test_ter_hand_computed():
    res = _run("ter", ["a b c d", "a b c d"], [["a b x d"], ["a b c d"]])
    assert res["lexical/ter"][0] == pytest.approx([0.25, 0.0])
    assert res["lexical/ter"][1] == pytest.approx(1 / 8)  # 1 edit over 8 reference words


def test_bleu_hand_computed_brevity_penalty_and_identity():
    # All n-gram precisions 1, hyp 4 words vs reference 6: BP = exp(1 - 6/4).
    assert compute_bleu([["a", "b", "c", "d"]], [[["a", "b", "c", "d", "e", "f"]]]) == pytest.approx(
        math.exp(-0.5)
    )
    res = _run("bleu", ["the cat sat on the mat"], [["the cat sat on the mat"]])
    assert res["lexical/bleu"] == ([pytest.approx(1.0)], pytest.approx(1.0))
    # No 4-gram match at all: unsmoothed corpus BLEU is 0, the smoothed per-sample value is not.
    res = _run("bleu", ["the cat sat down"], [["the cat sat on the mat"]])
    assert res["lexical/bleu"][1] == 0.0 and res["lexical/bleu"][0][0] > 0.0


def test_bleu_equals_sacrebleu_without_tokenisation_or_smoothing():
    from sacrebleu.metrics import BLEU

    gens = ["the cat is on the mat today", "there is a dog in the house"]
    refs = [["the cat sat on the mat today"], ["a dog is in the house"]]
    ours = _run("bleu", gens, refs)["lexical/bleu"][1]
    theirs = (
        BLEU(tokenize="none", smooth_method="none").corpus_score(gens, [[r[0] for r in refs]]).score / 100
    )
    assert ours == pytest.approx(theirs)


def test_rouge_readme_example_hand_computed():
    # rouge-score README: target vs prediction, Porter stemming ("jumps" -> "jump", "lazy" -> "lazi").
    res = _run(
        "rouge",
        ["The quick brown dog jumps on the log."],
        [["The quick brown fox jumps over the lazy dog"]],
    )
    p, r = 6 / 8, 6 / 9  # the x2, quick, brown, dog, jump
    assert res["lexical/rouge_rouge1"][1] == pytest.approx(2 * p * r / (p + r))
    assert res["lexical/rouge_rougeL"][1] == pytest.approx(50 / 85)  # LCS 5: the quick brown jump the
    assert set(res) == {f"lexical/rouge_{t}" for t in ("rouge1", "rouge2", "rougeL", "rougeLsum")}


def test_rouge_single_ref_vs_best_ref_and_rouge_l_max():
    gens, refs = ["a b c"], [["x y z", "a b c"]]
    assert _run("rouge", gens, refs)["lexical/rouge_rouge1"][1] == 0.0  # RL4LMs: first reference only
    assert _run("rouge", gens, refs, use_single_ref=False)["lexical/rouge_rouge1"][1] == 1.0
    res = _run("rouge_l_max", ["a b c", "a b"], [["x y z", "a b c"], ["a b c d"]])
    assert res["lexical/rouge_l_max"][0] == pytest.approx([1.0, 2 * (1.0 * 0.5) / 1.5])


def test_compute_all_flattens_and_checks():
    objs = build_metrics([{"id": "bleu"}, {"id": "chrf", "args": {}}])
    corpus, per = compute_all(objs, ["p", "q"], ["a b c", "d e"], [["a b c"], ["d e f"]], [{}, {}])
    assert set(corpus) == {"lexical/bleu", "lexical/chrf"} and len(per["lexical/chrf"]) == 2
    with pytest.raises(MetricError, match="references has 1 items"):
        compute_all(objs, ["p", "q"], ["a", "b"], [["a"]], None)
    with pytest.raises(MetricError, match="produced twice"):
        compute_all(build_metrics(["bleu", "bleu"]), ["p"], ["a"], [["a"]])
    with pytest.raises(MetricError, match=r"references\[0\] is empty"):
        compute_all(objs, ["p"], ["a"], [[]])


def test_unknown_metric_and_bad_args_are_named():
    from engine.registry import UnknownComponentError

    with pytest.raises(UnknownComponentError, match="meteor"):
        build_metrics([{"id": "no_such_metric"}])
    with pytest.raises(TypeError, match="rouge"):
        build_metrics([{"id": "rouge", "args": {"bogus": 1}}])


def test_metric_is_usable_as_reward():
    m = metrics.build("rouge", rouge_types=["rouge2"])
    assert m(["", ""], ["a b c", "x y"], [["a b c"], ["a b"]], [{}, {}]) == pytest.approx([1.0, 0.0])
