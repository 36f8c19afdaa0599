"""RL4LMs's perplexity (the paper's column): the evaluated POLICY's perplexity on the reference texts.

It must follow the policy (RL that degrades the LM raises it) and ignore the generations; the fixed-LM
fluency of generations stays available as ``generation_perplexity``.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.evaluation import PolicyContext, score_generations
from engine.metrics import MetricError
from engine.registry import metrics

REFS = [
    ["The film was a delight from start to finish, with a warm cast and a clever script."],
    ["I would watch it again.", "A second reference for the same prompt, also scored."],
    ["Numbers: 1 2 3 4 5 6 7 8 9 10"],
]


def _hand_rl4lms(lm, tok, texts: list[str], stride: int, window: int) -> float:
    """RL4LMs ``Perplexity.compute``: HF's sliding-window recipe on the blank-line-joined references."""
    ids = tok("\n\n".join(texts), return_tensors="pt").input_ids
    nlls, end = [], 0
    for i in range(0, ids.size(1), stride):
        begin = max(i + stride - window, 0)
        end = min(i + stride, ids.size(1))
        trg_len = end - i
        x = ids[:, begin:end]
        target = x.clone()
        target[:, :-trg_len] = -100
        with torch.no_grad():
            nlls.append(lm(x, labels=target).loss * trg_len)
    return torch.exp(torch.stack(nlls).sum() / end).item()


def test_policy_perplexity_is_rl4lms_sliding_window_on_references(make_policy):
    policy, tok = make_policy("causal")
    m = metrics.build("perplexity", stride=8, max_length=16)
    m.bind_policy(policy.lm, False, tok, torch.device("cpu"))
    gens = ["whatever", "the generations", "do not count"]
    (per, value) = m.compute(["p1", "p2", "p3"], gens, REFS, [{}, {}, {}])["fluency_metrics/perplexity"]
    assert per is None  # corpus value only, as RL4LMs
    flat = [r for refs in REFS for r in refs]
    assert value == pytest.approx(_hand_rl4lms(policy.lm, tok, flat, 8, 16), rel=1e-5)
    # generations play no part
    other = m.compute(["p1", "p2", "p3"], ["x", "y", "z"], REFS, [{}, {}, {}])
    assert other["fluency_metrics/perplexity"][1] == pytest.approx(value, rel=1e-6)
    # RL4LMs's id maps to the same metric
    assert metrics.get("causal_perplexity") is metrics.get("perplexity")


class _NoTrimming(torch.nn.Module):
    """A causal LM whose forward takes no ``logits_to_keep`` (a wrapper, an older model class)."""

    def __init__(self, lm):
        super().__init__()
        self.lm, self.config = lm, lm.config

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids)


@pytest.mark.parametrize("stride,window", [(3, 16), (8, 16), (16, 16), (5, 7), (512, 1024)])
def test_policy_perplexity_matches_the_recipe_with_and_without_logit_trimming(make_policy, stride, window):
    """Windows that overlap by any amount, a last window shorter than the stride, a single window that
    holds the whole text: the value is HF's labels-and-loss recipe whether the model computes logits for
    the scored positions only (``logits_to_keep``) or for every position."""
    policy, tok = make_policy("causal")
    flat = [r for refs in REFS for r in refs]
    expected = _hand_rl4lms(policy.lm, tok, flat, stride, window)
    for lm in (policy.lm, _NoTrimming(policy.lm)):
        m = metrics.build("perplexity", stride=stride, max_length=window)
        m.bind_policy(lm, False, tok, torch.device("cpu"))
        value = m.compute(["p1", "p2", "p3"], ["a", "b", "c"], REFS, None)["fluency_metrics/perplexity"][1]
        assert value == pytest.approx(expected, rel=1e-5)


def test_policy_perplexity_follows_the_policy_through_evaluation(make_policy):
    """Scored through the evaluation's metric set: it is the evaluated policy's, so it moves with it."""
    from engine.data.base import Sample

    policy, tok = make_policy("causal")
    samples = [Sample(id=str(i), prompt=f"p{i}", references=r) for i, r in enumerate(REFS)]
    comps = [{"id": "perplexity", "args": {}}]
    ctx = PolicyContext(policy.lm, False, tok, torch.device("cpu"))
    before, _ = score_generations(samples, ["a", "b", "c"], None, comps, policy=ctx)
    # the random tiny model is near-uniform: perplexity close to the vocabulary size
    assert 0.5 * len(tok) < before["fluency_metrics/perplexity"] < 2 * len(tok)
    with torch.no_grad():  # "degrade" the LM: scale up its logits in a random direction
        g = torch.Generator().manual_seed(0)
        for p in policy.lm.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    after, _ = score_generations(samples, ["a", "b", "c"], None, comps, policy=ctx)
    assert after["fluency_metrics/perplexity"] > 2 * before["fluency_metrics/perplexity"]
    assert math.isfinite(after["fluency_metrics/perplexity"])


def test_policy_perplexity_seq2seq_scores_references_given_prompts(make_policy):
    policy, tok = make_policy("seq2seq")
    m = metrics.build("perplexity")
    m.bind_policy(policy.lm, True, tok, torch.device("cpu"))
    prompts = ["p1", "p2", "p3"]
    value = m.compute(prompts, ["", "", ""], REFS, None)["fluency_metrics/perplexity"][1]
    total, count = 0.0, 0
    for p, refs in zip(prompts, REFS):
        for r in refs:
            labels = tok([r], return_tensors="pt").input_ids
            with torch.no_grad():
                loss = policy.lm(**tok([p], return_tensors="pt"), labels=labels).loss
            total += float(loss) * labels.shape[1]
            count += labels.shape[1]
    assert value == pytest.approx(math.exp(total / count), rel=1e-5)


def test_unbound_policy_perplexity_names_the_fix():
    m = metrics.build("perplexity")
    with pytest.raises(MetricError, match="generation_perplexity"):
        m.compute(["p"], ["g"], [["r"]], None)
    # with a fixed model it scores that model (same numbers as bound to it)
    fixed = metrics.build("perplexity", model="builtin:tiny-gpt2", stride=8, max_length=16)
    value = fixed.compute(["p"], ["g"], [["a short reference text for the fixed model"]], None)
    assert math.isfinite(value["fluency_metrics/perplexity"][1])
