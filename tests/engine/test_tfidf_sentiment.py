"""The shipped IMDB sentiment classifier (the study's reward), its metric columns and the study's data."""

from __future__ import annotations

import math

import pytest

from engine.data.sources import DataError, read_records
from engine.metrics.sentiment import Sentiment
from engine.registry import rewards, tasks
from engine.rewards.tfidf_sentiment import TfidfLogReg, load_model, tokens


def test_featuriser_by_hand():
    assert tokens("A great<br />film, GREAT film!") == [
        "great",
        "film",
        "great",
        "film",
        "great film",
        "film great",
        "great film",
    ]
    # vocab: great (idf 2), film (idf 1), "great film" (idf 3); "film great" unknown
    m = TfidfLogReg(["film", "great", "great film"], [1.0, 2.0, 3.0], [0.5, 1.0, 2.0], -1.0)
    f = m.features("great film great film")
    # counts: great 2, film 2, "great film" 2 -> (1 + ln 2) * idf, L2-normalised
    tf = 1 + math.log(2)
    raw = [tf * 1.0, tf * 2.0, tf * 3.0]
    norm = math.sqrt(sum(v * v for v in raw))
    assert f == pytest.approx({0: raw[0] / norm, 1: raw[1] / norm, 2: raw[2] / norm})
    z = -1.0 + (0.5 * raw[0] + 1.0 * raw[1] + 2.0 * raw[2]) / norm
    assert m.prob_positive(["great film great film"]) == pytest.approx([1 / (1 + math.exp(-z))])
    assert m.prob_positive(["nothing known here"]) == pytest.approx([1 / (1 + math.exp(1.0))])


def test_shipped_model_accuracy_on_the_study_test_reviews():
    """0.908 on the 500 shipped test reviews (0.9048 on all 25,000: engine/rewards/assets/PROVENANCE.md)."""
    model = load_model("imdb")
    rows = read_records("engine/data/fixtures/imdb_large/test.jsonl")
    probs = model.prob_positive([r["text"] for r in rows])
    correct = sum((p >= 0.5) == bool(r["label"]) for p, r in zip(probs, rows))
    assert correct == 454  # of 500
    pos, neg = model.prob_positive(
        [
            "This movie was wonderful, the acting was great and I loved it.",
            "Terrible, boring, the worst film I have ever seen. Awful acting.",
        ]
    )
    assert pos > 0.99 and neg < 0.001


def test_reward_and_metric_columns():
    fn = rewards.build("sentiment_tfidf")
    neg = rewards.build("sentiment_tfidf", score="negative")
    texts = ["a wonderful, moving film", "a dull and stupid mess"]
    p = fn([""] * 2, texts)
    assert p[0] > 0.5 > p[1]
    assert neg([""] * 2, texts) == pytest.approx([1 - x for x in p])
    with pytest.raises(ValueError, match="shipped models: imdb"):
        rewards.build("sentiment_tfidf", model="../../etc/passwd")
    prompts = ["I hated the first hour. ", "I hated the first hour. "]
    gens = ["Then it became wonderful and moving.", "Then it got worse and worse, awful."]
    whole = Sentiment(variant="tfidf").compute(prompts, gens, [[""], [""]])
    cont = Sentiment(variant="tfidf", include_prompt=False).compute(prompts, gens, [[""], [""]])
    assert set(whole) == {"semantic/sentiment_tfidf"}
    assert set(cont) == {"semantic/sentiment_tfidf_continuation"}
    assert whole["semantic/sentiment_tfidf"][0] == pytest.approx(
        fn([""] * 2, [p + g for p, g in zip(prompts, gens)])
    )
    assert cont["semantic/sentiment_tfidf_continuation"][0] == pytest.approx(fn([""] * 2, gens))


def test_study_fixture_is_chosen_by_name_only():
    task = tasks.build("imdb", fixture="imdb_large")
    assert (len(task.load("train")), len(task.load("validation")), len(task.load("test"))) == (800, 200, 500)
    labels = [s.meta["label"] for s in task.load("test")]
    assert labels.count(1) == labels.count(0) == 250
    sft = tasks.build("imdb_seq2seq", fixture="imdb_large")
    assert all(s.meta["label"] == 1 for s in sft.load("train"))
    for bad in ("..", "/etc", "imdb_large/../imdb", "commongen"):
        with pytest.raises(DataError, match="task.args.fixture must be one of imdb, imdb_large"):
            tasks.build("imdb", fixture=bad)
    with pytest.raises(DataError, match="not both"):
        tasks.build("imdb", fixture="imdb_large", hub=True)
