"""Model-based metrics: BERTScore (MiniLM), perplexity (builtin tiny GPT-2), sentiment, intent accuracy."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.metrics import MetricError
from engine.metrics.bertscore import greedy_match
from engine.metrics.intent import DEFAULT_MODEL_DIR, IntentClassifier, dialogue_examples, main, read_jsonl
from engine.registry import metrics

SAMPLE = Path(__file__).parents[2] / "engine" / "metrics" / "assets" / "dailydialog_sample"


@pytest.fixture(scope="module")
def bertscore():
    return metrics.build("bertscore")


# ---- BERTScore ----------------------------------------------------------------------------------


def test_greedy_matching_hand_checked_on_tiny_vectors():
    cand = [[1.0, 0.0], [0.0, 2.0]]  # normalised: e1, e2
    ref = [[3.0, 0.0]]  # e1
    # each candidate token's best match: e1->1, e2->0 => P = 1/2; the reference token's best: 1 => R = 1
    p, r, f = greedy_match(cand, ref)
    assert (p, r) == pytest.approx((0.5, 1.0)) and f == pytest.approx(2 / 3)
    # weights (idf): the unmatched token weighs 3 => P = (1*1 + 3*0) / 4
    p, _, _ = greedy_match(cand, ref, cand_w=[1.0, 3.0])
    assert p == pytest.approx(0.25)
    ref2 = [[1.0, 0.0], [1.0, 1.0]]  # e1, (e1+e2)/sqrt2
    p, r, _ = greedy_match(cand, ref2)
    s = 1 / math.sqrt(2)
    assert p == pytest.approx((1 + s) / 2) and r == pytest.approx((1 + s) / 2)


def test_bertscore_identity_and_ordering(bertscore):
    ref = "A man is playing a guitar on stage."
    gens = [ref, "A person plays the guitar at a concert.", "The stock market fell sharply on Monday."]
    res = bertscore.compute([""] * 3, gens, [[ref]] * 3, [{}] * 3)
    f = res["semantic/bert_score"][0]
    assert f[0] == pytest.approx(1.0, abs=1e-5)
    assert f[0] > f[1] > f[2]
    assert res["semantic/bert_score_precision"][0][0] == pytest.approx(1.0, abs=1e-5)
    # several references: the best one counts
    multi = bertscore.compute([""], [gens[2]], [[ref, gens[2]]], [{}])
    assert multi["semantic/bert_score"][0][0] == pytest.approx(1.0, abs=1e-5)


IDF_REFS = [["the cat sat on the mat"], ["the dog ran in the park"], ["the bird sang in the tree"]]


def test_bertscore_idf_weights_rare_tokens_and_follows_the_formula(bertscore):
    """idf = log((M + 1) / (df + 1)) over the M = 3 references: "the" (in all three) weighs 0, "in" (two)
    log(4/3), the rest log 2. So with idf a candidate that matches only "the" loses precision, and one
    that matches the rare words but skips "the"/"in" gains recall."""
    idf = metrics.build("bertscore", idf=True)
    gens = ["the the fish swam", "dog park", "a bird sang in a tree"]
    plain = bertscore.compute([""] * 3, gens, IDF_REFS, [{}] * 3)
    weighted = idf.compute([""] * 3, gens, IDF_REFS, [{}] * 3)
    p_plain, p_idf = plain["semantic/bert_score_precision"][0], weighted["semantic/bert_score_precision"][0]
    r_plain, r_idf = plain["semantic/bert_score_recall"][0], weighted["semantic/bert_score_recall"][0]
    assert p_idf[0] < p_plain[0] - 0.02, (p_plain[0], p_idf[0])  # its exact matches were the weightless "the"
    assert r_idf[1] > r_plain[1] + 0.02, (r_plain[1], r_idf[1])  # the unmatched "the", "in" weigh little

    # the idf score of a pair is greedy matching with exactly those weights
    tok = idf.tokenizer
    df = {}
    for (ref,) in IDF_REFS:
        for t in set(tok(ref, add_special_tokens=False)["input_ids"]):
            df[t] = df.get(t, 0) + 1
    special = set(tok.all_special_ids)

    def w(ids: list[int]) -> list[float]:
        return [0.0 if t in special else math.log(4 / (df.get(t, 0) + 1)) for t in ids]

    the = tok("the", add_special_tokens=False)["input_ids"][0]
    assert w([the]) == [0.0]
    (g_vec, g_ids), (r_vec, r_ids) = idf.embed([gens[2], IDF_REFS[2][0]])
    p, r, f = greedy_match(g_vec, r_vec, w(g_ids), w(r_ids))
    assert (p_idf[2], r_idf[2], weighted["semantic/bert_score"][0][2]) == pytest.approx((p, r, f), abs=1e-5)
    # an exact copy still scores 1 with idf weights
    same = idf.compute(
        ["", ""], ["the cat sat on the mat", "stocks fell"], [["the cat sat on the mat"], ["a"]], [{}, {}]
    )
    assert same["semantic/bert_score"][0][0] == pytest.approx(1.0, abs=1e-5)


def test_bertscore_layer_selects_the_hidden_state(bertscore):
    """Different layers give different scores on a paraphrase; the offline default is layer 4."""
    gen, ref = ["A person plays the guitar at a concert."], [["A man is playing a guitar on stage."]]
    scores = {
        layer: metrics.build("bertscore", layer=layer).compute([""], gen, ref, [{}])["semantic/bert_score"][
            0
        ][0]
        for layer in (1, 4, 6)
    }
    default = bertscore.compute([""], gen, ref, [{}])["semantic/bert_score"][0][0]
    assert default == scores[4]
    assert abs(scores[1] - scores[4]) > 1e-3 and abs(scores[6] - scores[4]) > 1e-3, scores
    assert all(0 < v < 1 for v in scores.values()), scores


def test_bertscore_errors():
    with pytest.raises(MetricError, match="layer 99 out of range"):
        metrics.build("bertscore", layer=99)
    with pytest.raises(MetricError, match="cannot load encoder"):
        metrics.build("bertscore", model="/nonexistent/encoder")


# ---- perplexity ---------------------------------------------------------------------------------


def test_perplexity_of_generations_equals_exp_mean_nll():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.models.builtin import builtin_model_dir

    m = metrics.build("generation_perplexity")  # default: builtin:tiny-gpt2
    gens = ["Hello world, this is a test.", "The movie was great"]
    res = m.compute(["ignored prompt", "x"], gens, [["a reference that must not be scored"], []], [{}, {}])
    per, corpus = res["fluency_metrics/generation_perplexity"]

    path = builtin_model_dir("builtin:tiny-gpt2")
    tok, lm = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    total_nll, total_n = 0.0, 0
    for g, got in zip(gens, per):
        ids = torch.tensor([[tok.eos_token_id] + tok(g)["input_ids"]])
        with torch.no_grad():
            loss = lm(ids, labels=ids).loss.item()  # mean NLL of the generation tokens after BOS
        n = ids.shape[1] - 1
        assert got == pytest.approx(math.exp(loss), rel=1e-4)
        total_nll += loss * n
        total_n += n
    assert corpus == pytest.approx(math.exp(total_nll / total_n), rel=1e-4)


def test_perplexity_conditioning_and_empty_generation():
    from transformers import AutoModelForCausalLM

    from engine.models.builtin import builtin_model_dir

    plain = metrics.build("generation_perplexity")
    cond = metrics.build("generation_perplexity", condition_on_prompt=True)
    args = (["Once upon a time", "p"], ["there was a king", ""], [[], []], [{}, {}])
    a, b = (
        plain.compute(*args)["fluency_metrics/generation_perplexity"],
        cond.compute(*args)["fluency_metrics/generation_perplexity"],
    )
    assert a[0][0] != pytest.approx(b[0][0])
    # an empty generation is the model ending at once: 1 / P(EOS | BOS)
    lm = AutoModelForCausalLM.from_pretrained(builtin_model_dir("builtin:tiny-gpt2")).eval()
    eos = plain.eos
    with torch.no_grad():
        logp = torch.log_softmax(lm(torch.tensor([[plain.bos]])).logits[0, -1], dim=-1)[eos].item()
    assert a[0][1] == pytest.approx(math.exp(-logp), rel=1e-4)


# Every metric on two samples: an empty generation and one equal to its reference. Values derived by hand
# where the definition gives them directly (an exact match scores the maximum, an empty generation the
# minimum), the rest recorded on 2026-12-01 from this code (fp32, CPU; the model-based ones from the
# builtin tiny GPT-2 and the shipped MiniLM) and cross-checked against the reference libraries or by hand
# in test_metric_parity.py / test_metrics_textbook.py. (empty, exact match, corpus) per key:
EVERY_METRIC = {
    # 6 tokens "it is on the table ." all distinct; the empty generation has none
    "diversity_metrics/distinct-1": (0.0, 1.0, 1.0),
    "diversity_metrics/distinct-2": (0.0, 1.0, 1.0),
    "diversity_metrics/entropy-1": (0.0, math.log2(6), math.log2(6)),
    "diversity_metrics/mean_pred_length": (0.0, 6.0, 3.0),
    "diversity_metrics/msttr-100": (0.0, 1.0, 1.0),  # fewer than 100 tokens: the TTR, 6 / 6
    "diversity_metrics/vocab_size-1": (0.0, 6.0, 6.0),
    "fluency_metrics/generation_perplexity": (25886.579566816257, 47897.81229978043, 43867.0460912864),
    "intent/accuracy": (0.0, 1.0, 0.5),
    "lexical/bleu": (0.0, 1.0, 0.513417119032592),
    "lexical/chrf": (0.0, 1.0, 0.5555555555555556),
    # exact match: cosine 1 at every order (the shared "it is" has IDF 0, the rest do not), x 10
    "lexical/cider": (0.0, 10.0, 5.0),
    # exact match: one chunk of 6 matches, penalty 0.5 * (1/6)^3
    "lexical/meteor": (0.0, 1.0 - 0.5 / 6**3, (1.0 - 0.5 / 6**3) / 2),
    "lexical/rouge_l_max": (0.0, 1.0, 0.5),
    "lexical/rouge_rouge1": (0.0, 1.0, 0.5),
    "lexical/rouge_rouge2": (0.0, 1.0, 0.5),
    "lexical/rouge_rougeL": (0.0, 1.0, 0.5),
    "lexical/rouge_rougeLsum": (0.0, 1.0, 0.5),
    "lexical/sacrebleu": (0.0, 1.0, 0.31140322391459785),
    # edits / reference words: 4 insertions for "It is there .<EOU>", none for the match; corpus 4 / 10
    "lexical/ter": (1.0, 0.0, 0.4),
    "math/accuracy": (0.0, 0.0, 0.0),  # gold 42, no number generated
    "math/format": (0.0, 0.0, 0.0),
    "semantic/bert_score": (0.0, 1.0, 0.5),  # identical texts: identical embeddings
    "semantic/bert_score_precision": (0.0, 1.0, 0.5),
    "semantic/bert_score_recall": (0.21317462623119354, 1.0, 0.6065873131155968),
    "semantic/sentiment_vader": (0.5, 0.5, 0.5),  # neutral: compound 0 -> (0 + 1) / 2
    "table_to_text/parent_overall_f_score": (0.0, 0.18595139444249914, 0.09297569722124957),
    "table_to_text/parent_overall_precision": (0.0, 1.0, 0.5),
    "table_to_text/parent_overall_recall": (9.999999999999997e-06, 0.10250629213149762, 0.05125814606574881),
}
MODEL_BASED = ("fluency_metrics/", "semantic/bert_score", "intent/")


def test_every_metric_gives_its_known_values_and_serves_as_reward():
    import json as _json

    from engine.metrics import build_metrics, compute_all
    from engine.registry import rewards

    table = _json.loads((SAMPLE.parent / "totto_dev_example.json").read_text())
    prompts = ["Hello . <EOU>Where is it ? <EOU>", "x <EOU>"]
    gens = ["", "It is on the table ."]
    refs = [["It is there .<EOU>"], ["It is on the table ."]]
    # "answer": the gold number the maths metric (math_accuracy) compares against.
    meta = [{"intent": [1], "raw_table": table, "answer": "42"}] * 2
    ids = [
        i
        for i in metrics.ids()
        # perplexity (RL4LMs's) scores the evaluated policy, corpus only: tests/engine/test_policy_perplexity.py
        # gold wraps a reward (engine/metrics/gold.py) and needs one: checked against CIDEr below
        if i not in ("bert_score", "sacre_bleu", "causal_perplexity", "perplexity", "parent_totto", "gold")
    ]
    specs = [{"id": i} for i in ids]
    specs.append({"id": "gold", "args": {"reward": {"id": "metric", "args": {"metric_id": "cider"}}}})
    corpus, per = compute_all(build_metrics(specs), prompts, gens, refs, meta)
    # gold is the wrapped reward's per-sample values and their mean (not the corpus metric)
    assert per.pop("gold") == pytest.approx(per["lexical/cider"], rel=1e-9)
    assert corpus.pop("gold") == pytest.approx(sum(per["lexical/cider"]) / 2, rel=1e-9)
    assert set(corpus) == set(EVERY_METRIC), sorted(set(corpus) ^ set(EVERY_METRIC))
    for key, (empty, match, whole) in EVERY_METRIC.items():
        tol = {"rel": 1e-4, "abs": 1e-5} if key.startswith(MODEL_BASED) else {"rel": 1e-9, "abs": 1e-12}
        assert per[key] == pytest.approx([empty, match], **tol), key
        assert corpus[key] == pytest.approx(whole, **tol), key
    reward = rewards.build("metric", metric_id="cider")
    assert reward(prompts, gens, refs, meta) == pytest.approx(per["lexical/cider"])


# ---- sentiment ----------------------------------------------------------------------------------


def test_sentiment_vader_orders_texts():
    m = metrics.build("sentiment")
    res = m.compute(
        ["", ""], ["What a wonderful, moving film.", "Awful, boring and painful."], [[], []], [{}, {}]
    )
    pos, neg = res["semantic/sentiment_vader"][0]
    assert 0.5 < pos <= 1.0 and 0.0 <= neg < 0.5


def test_sentiment_learned_is_the_classifier_probability(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from engine.metrics.bertscore import minilm_dir

    torch.manual_seed(0)
    clf = AutoModelForSequenceClassification.from_pretrained(minilm_dir(), num_labels=2)
    tok = AutoTokenizer.from_pretrained(minilm_dir())
    clf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    m = metrics.build("sentiment", variant="learned", model_path=str(tmp_path), device="cpu")
    prompts, gens = ["This film", "The plot"], [" was a delight.", " made no sense."]
    res = m.compute(prompts, gens, [[], []], [{}, {}])
    clf.eval()
    with torch.no_grad():
        enc = tok([p + g for p, g in zip(prompts, gens)], return_tensors="pt", padding=True)
        want = torch.softmax(clf(**enc).logits, dim=-1)[:, 1].tolist()
    assert res["semantic/learned_automodel_metric"][0] == pytest.approx(want, abs=1e-5)
    with pytest.raises(MetricError, match="needs model_path"):
        metrics.build("sentiment", variant="learned")


# ---- intent accuracy ----------------------------------------------------------------------------


def test_intent_trainer_learns_well_above_chance(tmp_path, capsys):
    assert (
        main(["train", "--data", str(SAMPLE), "--out", str(tmp_path / "clf"), "--max-features", "8000"]) == 0
    )
    report = json.loads((tmp_path / "clf" / "config.json").read_text())["training"]
    assert report["eval_utterances"] == 977
    assert report["eval_accuracy"] > report["majority_baseline"] + 0.15
    assert "held-out accuracy" in capsys.readouterr().out
    # the saved arrays reload into a classifier that predicts the same labels
    clf = IntentClassifier.load(tmp_path / "clf")
    texts, labels = dialogue_examples(read_jsonl(SAMPLE / "test.jsonl"))
    acc = sum(p == y for p, y in zip(clf.predict(texts), labels)) / len(labels)
    assert acc == pytest.approx(report["eval_accuracy"], abs=1e-4)


def test_shipped_intent_model_accuracy_on_held_out_fixture():
    clf = IntentClassifier.load(DEFAULT_MODEL_DIR)
    texts, labels = dialogue_examples(read_jsonl(SAMPLE / "test.jsonl"))
    acc = sum(p == y for p, y in zip(clf.predict(texts), labels)) / len(labels)
    assert acc > 0.7  # majority class is 0.38 on this sample


def test_intent_accuracy_metric_uses_meta_intent_or_reference():
    m = metrics.build("intent_accuracy")
    prompts = ["Hi there . <EOU>Where is the station ? <EOU>"] * 2
    gens = ["It is next to the bank on Main Street .", "Where do you want to go ?"]
    meta = [{"intent": [1]}, {"intent": [1]}]  # the reference answers (inform)
    res = m.compute(prompts, gens, [["It's over there .<EOU>"]] * 2, meta)
    assert res["intent/accuracy"] == ([1.0, 0.0], 0.5)
    # no act in meta: the reference's predicted act is the target
    res = m.compute(prompts, gens, [["Do you mean the train station ?"]] * 2, [{}, {}])
    assert res["intent/accuracy"][0] == [0.0, 1.0]
    with pytest.raises(MetricError, match=r"meta\[0\].intent: act 7"):
        m.compute(prompts[:1], gens[:1], [["x"]], [{"intent": [7]}])
    with pytest.raises(MetricError, match="config.json not found"):
        metrics.build("intent_accuracy", model_dir="/nonexistent")


def test_intent_cli_usage_and_bad_data(tmp_path):
    out = subprocess.run([sys.executable, "-m", "engine.metrics.intent"], capture_output=True, text=True)
    assert out.returncode == 2 and "usage" in out.stderr
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"dialog": ["a", "b"], "act": [1, 9]}\n')
    assert main(["train", "--data", str(bad), "--out", str(tmp_path / "o")]) == 1
