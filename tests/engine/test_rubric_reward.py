"""Rubric rewards: parsing with errors that name the field, aggregation, the judge cache, the judges
(a real local LM, a real HTTP endpoint behind the SSRF guard, the deterministic stub), and learning.

The learning test uses the stub judge, a registered judge backend whose scores are known in advance
(a criterion scores the share of digits or of distinct words), so that a rising rubric reward means the
policy learned what the rubric asks, not that a language-model judge happened to drift.
"""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import engine
from engine.netguard import AddressNotAllowed
from engine.rewards import build_reward
from engine.rewards.rubric import Criterion, Rubric, RubricError, parse_rubric
from engine.rewards.rubric_judges import (
    ENDPOINTS_ENV,
    EndpointRubricJudge,
    LocalRubricJudge,
    StubRubricJudge,
    build_judge,
    parse_scores,
)
from engine.rewards.rubric_reward import RubricReward, check_args

CRITERIA = [
    {"name": "numeric", "description": "Is the answer made of numbers?", "weight": 3},
    {"name": "varied", "description": "Are the words distinct?", "scale": {"min": 0, "max": 4}},
]
STUB = {"backend": "stub", "features": {"varied": "distinct"}}


def _rubric_reward(**over: Any) -> RubricReward:
    return RubricReward(**{"criteria": CRITERIA, "judge": STUB, **over})


# ------------------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("args", "field", "words"),
    [
        ({}, "reward.args.criteria", "non-empty list"),
        ({"criteria": "be nice"}, "reward.args.criteria", "non-empty list"),
        ({"criteria": ["x"]}, "reward.args.criteria[0]", "mapping"),
        ({"criteria": [{"description": "d"}]}, "reward.args.criteria[0].name", "start with a letter"),
        ({"criteria": [{"name": "a b", "description": "d"}]}, "reward.args.criteria[0].name", "letters"),
        ({"criteria": [{"name": "a"}]}, "reward.args.criteria[0].description", "non-empty string"),
        (
            {"criteria": [{"name": "a", "description": "d"}, {"name": "a", "description": "e"}]},
            "reward.args.criteria[1].name",
            "used twice",
        ),
        (
            {"criteria": [{"name": "a", "description": "d", "weight": -1}]},
            "reward.args.criteria[0].weight",
            "positive",
        ),
        (
            {"criteria": [{"name": "a", "description": "d", "weight": "2"}]},
            "reward.args.criteria[0].weight",
            "positive",
        ),
        (
            {"criteria": [{"name": "a", "description": "d", "wieght": 2}]},
            "reward.args.criteria[0].wieght",
            "unknown key",
        ),
        (
            {"criteria": [{"name": "a", "description": "d", "scale": {"min": 1, "max": 10}}]},
            "reward.args.criteria[0].scale",
            "max <= 9",
        ),
        (
            {"criteria": [{"name": "a", "description": "d", "scale": {"min": 3, "max": 3}}]},
            "reward.args.criteria[0].scale",
            "min < max",
        ),
        (
            {"criteria": [{"name": "a", "description": "d", "scale": {"min": 1.5, "max": 5}}]},
            "reward.args.criteria[0].scale.min",
            "whole number",
        ),
        (
            {"criteria": [{"name": "a", "description": "d", "scale": {"labels": {7: "great"}}}]},
            "reward.args.criteria[0].scale.labels.7",
            "outside the scale 1..5",
        ),
        (
            {"criteria": [{"name": "a", "description": "d", "scale": {"labels": {"top": "great"}}}]},
            "reward.args.criteria[0].scale.labels.top",
            "must be a score",
        ),
        (
            {"criteria": [{"name": "a", "description": "d"}], "instructions": 3},
            "reward.args.instructions",
            "string",
        ),
    ],
)
def test_malformed_rubrics_name_the_field(args, field, words):
    with pytest.raises(RubricError) as err:
        parse_rubric(args)
    assert str(err.value).startswith(field + ":"), str(err.value)
    assert words in str(err.value)
    # the launch checks' form of the same error: (field, message), nothing loaded
    [(got_field, message)] = check_args(args)
    assert got_field == field and words in message


@pytest.mark.parametrize(
    ("judge", "field", "words"),
    [
        ({"backend": "oracle"}, "reward.args.judge.backend", "registered: local, endpoint, stub"),
        ({"backend": "local", "modle": "smollm2"}, "reward.args.judge.modle", "unknown option"),
        ({"backend": "local", "batch_size": 0}, "reward.args.judge.batch_size", "from 1 to 256"),
        ({"backend": "endpoint"}, "reward.args.judge.endpoint", "non-empty string"),
        (
            {"backend": "endpoint", "endpoint": "x", "url": "http://10.0.0.1"},
            "reward.args.judge.url",
            "unknown",
        ),
        ({"backend": "stub", "features": {"a": "vibes"}}, "reward.args.judge.features.a", "digits, length"),
        ("smollm2", "reward.args.judge", "mapping"),
    ],
)
def test_malformed_judges_name_the_field(judge, field, words):
    [(got_field, message)] = check_args({"criteria": CRITERIA, "judge": judge})
    assert got_field == field and words in message, message


def test_unknown_rubric_argument_and_bad_cache_size_are_named():
    assert check_args({"criteria": CRITERIA, "weights": [1]})[0][0] == "reward.args.weights"
    assert check_args({"criteria": CRITERIA, "cache_size": 0})[0][0] == "reward.args.cache_size"
    assert check_args({"criteria": CRITERIA, "judge": STUB}) == []
    assert check_args(CRITERIA, "reward.components[1].args")[0][0] == "reward.components[1].args"


def test_build_reward_reports_a_malformed_rubric_by_field():
    bad = [{"name": "ok", "description": "d"}, {"name": "bad", "description": "d", "weight": 0}]
    with pytest.raises(RubricError, match=r"^reward\.args\.criteria\[1\]\.weight: must be a positive number"):
        build_reward({"id": "rubric", "args": {"criteria": bad, "judge": STUB}})


def test_labels_and_defaults_parse():
    rubric = parse_rubric(
        {
            "criteria": [
                {
                    "name": "kind",
                    "description": " polite ",
                    "scale": {"min": 0, "max": 2, "labels": {"0": "rude", 2: "kind"}},
                },
                {"name": "short", "description": "brief"},
            ],
            "instructions": "Grade replies.",
        }
    )
    kind, short = rubric.criteria
    assert kind == Criterion("kind", "polite", 1.0, 0, 2, ((0, "rude"), (2, "kind")))
    assert (short.low, short.high, short.weight, short.labels) == (1, 5, 1.0, ())
    assert rubric.instructions == "Grade replies."


# -------------------------------------------------------------------------------------- aggregation


def test_aggregate_is_the_weighted_mean_of_normalised_scores():
    rubric = Rubric(
        (Criterion("a", "d", weight=3, low=1, high=5), Criterion("b", "d", weight=1, low=0, high=4)), ""
    )
    assert rubric.aggregate({"a": 5, "b": 0}) == pytest.approx(0.75)
    assert rubric.aggregate({"a": 1, "b": 4}) == pytest.approx(0.25)
    assert rubric.aggregate({"a": 3, "b": 2}) == pytest.approx(0.5)
    assert rubric.aggregate({"a": 9, "b": -3}) == pytest.approx(0.75)  # clipped to the scale's ends


def test_reward_values_follow_the_stub_judge():
    reward = build_reward({"id": "rubric", "args": {"criteria": CRITERIA, "judge": STUB}})
    got = reward(["p", "p", "p"], ["1 2 3", "cat cat", ""], None, None)
    # "1 2 3": all digits (numeric 5 -> 1), distinct (varied 4 -> 1); "cat cat": numeric 1 -> 0,
    # distinct 0.5 -> varied 2 -> 0.5; "": both features 0
    assert got == pytest.approx([1.0, (3 * 0 + 1 * 0.5) / 4, 0.0])


# ------------------------------------------------------------------------------------------ caching


def test_each_generation_is_judged_once():
    reward = _rubric_reward()
    judge: StubRubricJudge = reward.judge
    prompts, gens = ["p"] * 4, ["1 2", "a b", "1 2", "a b"]
    first = reward(prompts, gens, None, None)
    assert reward.judged == 2 and reward.cache_hits == 2 and judge.calls == 1
    assert first[0] == first[2] and first[1] == first[3]
    # the run page's per-sample scores and a second batch come from the cache: no new judge call
    details = reward.sample_details(prompts[:2], gens[:2], None, None)
    assert details == [
        {"rubric/numeric": 5.0, "rubric/varied": 4.0},
        {"rubric/numeric": 1.0, "rubric/varied": 4.0},
    ]
    assert reward(["p", "p"], ["a b", "new 3"], None, None)[0] == first[1]
    assert judge.calls == 2 and reward.judged == 3  # only "new 3" went to the judge
    # the prompt is part of what the judge sees, so the same text after another prompt is new
    reward(["q"], ["1 2"], None, None)
    assert reward.judged == 4


def test_cache_is_bounded_least_recently_used_first():
    reward = _rubric_reward(cache_size=2)
    reward(["p"] * 3, ["1", "2", "3"], None, None)
    assert reward.judged == 3
    reward(["p"], ["3"], None, None)  # still cached
    assert reward.judged == 3
    reward(["p"], ["1"], None, None)  # dropped when the cache went over two entries
    assert reward.judged == 4


# ------------------------------------------------------------------------------------------- judges


def test_local_judge_batches_exactly_and_gives_expected_scores_on_the_scale():
    """A real (tiny, random) GPT-2 as the judge: scores lie on each criterion's scale, and a batch
    with left padding gives what each prompt gives alone (position ids follow the padding)."""
    rubric = parse_rubric(
        {
            "criteria": [
                {"name": "a", "description": "d"},
                {"name": "b", "description": "e", "scale": {"min": 0, "max": 2}},
            ]
        }
    )
    gens = ["short", "a much longer generation with many more tokens in it than the first", "3 4 5"]
    batched = LocalRubricJudge(model="builtin:tiny-gpt2", batch_size=8).score(rubric, ["in"] * 3, gens)
    alone = LocalRubricJudge(model="builtin:tiny-gpt2", batch_size=1).score(rubric, ["in"] * 3, gens)
    for b, s in zip(batched, alone):
        assert 1 <= b["a"] <= 5 and 0 <= b["b"] <= 2
        assert b == pytest.approx(s, abs=1e-4)
    assert len({round(b["a"], 6) for b in batched}) == 3  # the judge reads the text


def test_parse_scores_reads_the_last_json_object_on_the_scale():
    rubric = Rubric((Criterion("a", "d"), Criterion("b", "d", low=0, high=2)), "")
    assert parse_scores('Thinking {"x": 1}... final: {"a": 4, "b": "2"}', rubric) == {"a": 4.0, "b": 2.0}
    assert parse_scores('{"a": 7, "b": 1}', rubric) == {"a": None, "b": 1.0}  # 7 is off the scale
    assert parse_scores("four out of five", rubric) == {"a": None, "b": None}
    assert parse_scores('{"a": true}', rubric) == {"a": None, "b": None}


class _ChatServer:
    """A real OpenAI-compatible chat server on loopback that answers with fixed JSON scores."""

    def __init__(self, reply: str) -> None:
        self.prompts: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.prompts.append(body["messages"][0]["content"])
                data = json.dumps({"choices": [{"message": {"content": reply}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def chat_server() -> Iterator[_ChatServer]:
    server = _ChatServer('Scores: {"numeric": 4, "varied": 9}')
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def test_endpoint_judge_is_configured_on_the_server_and_guarded(chat_server, monkeypatch):
    monkeypatch.setenv(ENDPOINTS_ENV, json.dumps({"house": {"base_url": chat_server.url, "model": "m"}}))
    monkeypatch.delenv("GRUE_OUTBOUND_ALLOW", raising=False)
    # loopback is refused by the SSRF guard unless the deployment allows it
    with pytest.raises(AddressNotAllowed):
        build_judge({"backend": "endpoint", "endpoint": "house"})
    with pytest.raises(
        RubricError, match=r"judge\.endpoint: unknown endpoint 'elsewhere'; configured: house"
    ):
        build_judge({"backend": "endpoint", "endpoint": "elsewhere"})
    monkeypatch.setenv("GRUE_OUTBOUND_ALLOW", "127.0.0.1")
    reward = RubricReward(CRITERIA, judge={"backend": "endpoint", "endpoint": "house", "retries": 0})
    assert isinstance(reward.judge, EndpointRubricJudge)
    got = reward(["Say numbers", "Say numbers"], ["1 2", "1 2"], None, None)
    # numeric 4 -> 0.75 (weight 3); varied 9 is off its 0..4 scale -> its midpoint 2 -> 0.5 (weight 1)
    assert got == pytest.approx([(3 * 0.75 + 0.5) / 4] * 2)
    assert len(chat_server.prompts) == 1  # judged once
    assert 'Criterion "varied"' in chat_server.prompts[0] and "Say numbers" in chat_server.prompts[0]
    assert reward.sample_details(["Say numbers"], ["1 2"], None, None) == [
        {"rubric/numeric": 4.0, "rubric/varied": 2.0, "rubric/unparsed": 1.0}
    ]


# ----------------------------------------------------------------------------------------- learning

SEEDS = (0, 1, 2)
N_ITERS = 15
# Measured while choosing the settings (fp32 CPU, one thread, PPO at learning rate 5e-2 as
# test_learning.py; train/reward_mean per iteration; the stub judge's rubric: numeric (digit share,
# weight 3) + varied (distinct words, scale 0-4, weight 1), so a random policy starts near 0.26):
#   seed 0: 0.27 0.27 0.26 0.26 0.26 0.27 0.28 0.67 0.83 0.95   last three 0.82
#   seed 1: 0.27 0.26 0.27 0.31 0.30 0.55 0.69 0.81 0.81 0.81   last three 0.81
#   seed 2: 0.27 0.25 0.26 0.25 0.25 0.23 0.26 0.37 0.55 1.00   last three 0.64
# The take-off iteration varies (6 to 8), so the test asserts the median over the seeds with a margin
# of 0.25 against a measured rise of 0.55.
# At 10 iterations that was too close to the take-off: on an AMD EPYC (AVX2, 2026-12-02) the suite saw
# last-three means 0.50 / 0.86 / 0.28 for seeds 0-2 (median 0.505 < 0.51), and a sweep of seeds 0-5 at two
# threads had one seed still at 0.27 after 10 iterations. At 15 iterations seeds 0-9 reached 0.81-1.00
# (last three) with one thread and 0.80-1.00 with two, against the threshold of ~0.51.
LEARN = {
    "model": {"mixed_precision": "no"},
    "task": {"args": {"n_samples": 64}},
    "reward": {"id": "rubric", "args": {"criteria": CRITERIA, "judge": STUB}},
    "rollout": {"max_new_tokens": 4, "batch_size": 32},
    "algorithm": {"id": "ppo", "learning_rate": 5e-2, "n_epochs": 4, "minibatch_size": 16},
    "kl": {"controller": "fixed", "init_coef": 0.0},
    "train": {"n_iters": N_ITERS, "prompts_per_iter": 32, "eval_every": 0, "log_samples": 2,
              "save_final_model": False},
}  # fmt: skip


def _read(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # three 15-iteration runs: ~1 min on a quiet 2-core CPU
def test_a_tiny_policy_learns_to_raise_its_rubric_reward(small_config, tmp_path):
    firsts, lasts = [], []
    for seed in SEEDS:
        over = json.loads(json.dumps(LEARN))
        out = tmp_path / f"seed{seed}"
        over["train"].update(output_dir=str(out), seed=seed)
        engine.train(small_config(**over))
        series = [r["train/reward_mean"] for r in _read(out, "metrics.jsonl") if "train/reward_mean" in r]
        assert len(series) == N_ITERS
        firsts.append(sum(series[:2]) / 2)
        lasts.append(sum(series[-3:]) / 3)
        # the judge's per-criterion scores travel with the logged samples
        rows = _read(out, "samples.jsonl")
        assert rows and all(set(r["metrics"]) == {"rubric/numeric", "rubric/varied"} for r in rows)
    assert statistics.median(firsts) < 0.35, firsts
    assert statistics.median(lasts) > statistics.median(firsts) + 0.25, (firsts, lasts)


def test_launch_checks_name_a_malformed_rubric_before_anything_is_queued():
    from engine.launch_checks import config_errors

    bad = [{"name": "ok", "description": "d"}, {"name": "bad", "description": "d", "scale": {"max": 12}}]
    cfg = {"reward": {"id": "rubric", "args": {"criteria": bad, "judge": STUB}}}
    errors = dict(config_errors(cfg))
    assert "max <= 9" in errors["reward.args.criteria[1].scale"], errors
    comp = {
        "reward": {
            "id": "weighted_sum",
            "components": [{"id": "rubric", "args": {"criteria": CRITERIA, "judge": {"backend": "x"}}}],
        }
    }
    assert "unknown judge 'x'" in dict(config_errors(comp))["reward.components[0].args.judge.backend"]
    good = {"reward": {"id": "rubric", "args": {"criteria": CRITERIA, "judge": STUB}}}
    assert not [e for e in config_errors(good) if e[0].startswith("reward")]
