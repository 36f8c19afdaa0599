"""The maths task (GSM8K) with its verifiable reward: the answer parser on awkward texts, the reward
values, the offline fixture, the presets, and a one-iteration run on a builtin tiny GPT-2 whose logged
samples carry the extracted answer, the gold answer and the verdict."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

import engine
from engine.config import parse_config
from engine.data import DataError, load_task
from engine.data.gsm8k import split_solution
from engine.metrics import build_metrics, compute_all
from engine.presets import list_presets, load_preset
from engine.registry import metrics, rewards, tasks
from engine.rewards import build_reward
from engine.rewards.maths import (
    answers_match,
    extract,
    extract_answer,
    format_number,
    gold_answer,
    parse_number,
)

FIXTURE = Path(engine.__file__).resolve().parent / "data" / "fixtures" / "gsm8k"

# ------------------------------------------------------------------------------------------ parser


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # thousands separators
        ("So the house cost 1,234 dollars.", "1234"),
        ("#### 1,234", "1234"),
        ("The total is 2,520,000", "2520000"),
        (r"\boxed{1{,}234}", "1234"),
        # a list is not a thousands separator
        ("pick 1,2345", "2345"),
        ("1, 2, 3", "3"),
        # units and currency
        ("He paid $12.50 in total", "12.5"),
        ("She earns 12 dollars", "12"),
        ("They walked 5 km", "5"),
        ("That is 50% of the class", "50"),
        (r"The answer is \$7", "7"),
        # negative numbers, and the minus of a subtraction that is not one
        ("The temperature fell to -5 degrees", "-5"),
        ("It ended at \u22127 points", "-7"),
        ("She owes -$3", "-3"),
        ("10-3=7", "7"),
        # decimals; a full stop is not a decimal point
        ("It weighs 0.75 kg", "0.75"),
        ("The result is 42.", "42"),
        ("18.00", "18"),
        # several numbers: the marked one wins, else the last one
        ("Janet has 16 eggs, eats 3 and bakes 4, so 16-3-4 = 9. She sells them for $2 each: 18", "18"),
        ("16 - 3 - 4 = 9 eggs\n9 * 2 = 18\n#### 18\nNext she buys 40 more.", "18"),
        ("The answer is 18. Then she buys 3 more.", "18"),
        ("Answer: $1,234.00 and 5 cents", "1234"),
        ("Answer: 16 - 3 - 4 = 9 eggs", "9"),  # a calculation after 'Answer:' is not the answer
        ("Answer: 16-3 = 13, so 13 * 2 = 26", "26"),
        (r"We get 3 + 4 = 7, so \boxed{7} and then 9", "7"),
        (
            "#### 12\n\nQuestion: Tom has 5 apples ...\nAnswer: 2 + 3 = 5\n#### 5",
            "12",
        ),  # the first answer line
        (r"first \boxed{12} but \boxed{5}", "12"),
        (r"#### 3 although the answer is 4 and \boxed{5}", "3"),  # '####' ranks first
        # boxed forms
        (r"\boxed{42}", "42"),
        (r"The final answer is $\boxed{-12.5}$.", "-12.5"),
        (r"\boxed{\frac{1}{3}}", "1/3"),
        (r"\boxed{42 \text{ dollars}}", "42"),
        # no number at all
        ("I do not know.", None),
        ("", None),
        ("#### none", None),
        ("x2 and y3", None),  # digits inside words are not numbers
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_marked_and_strict():
    assert extract("#### 42").marked and extract(r"\boxed{4}").marked and extract("the answer is 9").marked
    assert not extract("so 16 - 7 = 9").marked and extract("so 16 - 7 = 9").value == 9
    # strict (verl's strict): only the '####' line counts
    assert extract_answer("#### 1,234", "strict") == "1234"
    assert extract_answer(r"so \boxed{42}", "strict") is None
    assert extract_answer("the answer is 42", "strict") is None
    assert extract_answer("16 - 7 = 9", "strict") is None
    with pytest.raises(ValueError, match="mode"):
        extract("1", "lenient")  # type: ignore[arg-type]


def test_numbers_compare_exactly():
    assert parse_number("$1,234.50 km") == Fraction(2469, 2)
    assert answers_match("12.50", "12.5") and answers_match("18.0", "18") and answers_match("-0", "0")
    assert (
        not answers_match("12.5", "12.49999") and not answers_match(None, "3") and not answers_match("3", "x")
    )
    assert format_number(Fraction(-1, 4)) == "-0.25" and format_number(Fraction(2, 3)) == "2/3"
    assert format_number(Fraction(100)) == "100"


def test_gold_answer_sources():
    assert gold_answer(["ignored"], {"answer": "1,200"}) == 1200
    assert gold_answer(["He has 3 + 4 = 7\n#### 7"], {}) == 7  # the '####' line, not the first number
    assert gold_answer(["7"], {}) == 7
    with pytest.raises(ValueError, match="sample 3: no gold answer"):
        gold_answer(["no number"], {}, index=3)


# ------------------------------------------------------------------------------------------ reward


def _call(reward, generations, gold="18"):
    n = len(generations)
    return reward([""] * n, generations, [[f"#### {gold}"]] * n, [{"answer": gold}] * n)


def test_reward_values():
    acc = build_reward({"id": "math_accuracy"})
    gens = ["#### 18", "so 9 * 2 = 18", "#### 17", "the answer is 17", "so 17", "nothing", r"\boxed{18.0}"]
    assert _call(acc, gens) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # format reward (verl's format_score): a wrong answer in the expected form gets it, a bare number does not
    fmt = build_reward({"id": "math_accuracy", "args": {"format_reward": 0.1, "correct_reward": 2.0}})
    assert _call(fmt, gens) == [2.0, 2.0, 0.1, 0.1, 0.0, 0.0, 2.0]
    strict = build_reward({"id": "math_accuracy", "args": {"mode": "strict", "format_reward": 0.1}})
    assert _call(strict, gens) == [1.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0]
    only_format = build_reward({"id": "math_format"})
    assert _call(only_format, gens) == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    # summed with weighted_sum, as TRL adds a format reward to accuracy_reward
    both = build_reward(
        {
            "id": "weighted_sum",
            "components": [{"id": "math_accuracy", "weight": 1.0}, {"id": "math_format", "weight": 0.5}],
        }
    )
    assert _call(both, gens[:3]) == [1.5, 1.0, 0.5]


def test_reward_details_and_errors():
    acc = rewards.get("math_accuracy")()
    details = acc.sample_details(["", ""], ["#### 1,234", "no idea"], [["#### 1234"], ["#### 5"]], [{}, {}])
    assert details == [
        {"extracted": 1234.0, "gold": 1234.0, "correct": 1.0},
        {"extracted": None, "gold": 5.0, "correct": 0.0},
    ]
    with pytest.raises(ValueError, match="mode must be one of"):
        rewards.get("math_accuracy")(mode="loose")
    with pytest.raises(ValueError, match="sample 1: no gold answer"):
        acc([""] * 2, ["1", "2"], [["#### 1"], ["none"]], [{}, {}])


def test_metric_accuracy_and_format():
    (metric,) = build_metrics([{"id": "math_accuracy"}])
    gens = ["#### 18", "9 * 2 = 18", "#### 17", "no answer"]
    corpus, per_sample = compute_all([metric], [""] * 4, gens, [["#### 18"]] * 4, [{"answer": "18"}] * 4)
    assert corpus == {"math/accuracy": 0.5, "math/format": 0.5}
    assert per_sample == {"math/accuracy": [1.0, 1.0, 0.0, 0.0], "math/format": [1.0, 0.0, 1.0, 0.0]}
    assert "math_accuracy" in metrics and "math_accuracy" in rewards and "gsm8k" in tasks


# -------------------------------------------------------------------------------------------- task


def test_task_loads_offline_from_the_fixture():
    cfg = parse_config(load_preset("gsm8k_grpo_offline"))
    assert cfg.task.id == "gsm8k" and not cfg.task.args.get("hub")
    train, val = load_task(cfg.task.model_copy(update={"max_train_samples": None}), "train"), None
    val = load_task(cfg.task.model_copy(update={"max_eval_samples": None}), "validation")
    test = load_task(cfg.task.model_copy(update={"max_eval_samples": None}), "test")
    assert (len(train), len(val), len(test)) == (45, 5, 50)
    assert not {s.id for s in train} & {s.id for s in val}
    raw = {
        json.loads(line)["id"]: json.loads(line) for line in (FIXTURE / "test.jsonl").read_text().splitlines()
    }
    for s in test:
        row = raw[s.id]
        assert s.prompt == f"Question: {row['question'].strip()}\nAnswer:"
        assert s.meta["answer"] == row["answer"].rsplit("####", 1)[1].strip()
        assert s.references[0].rstrip().endswith(f"#### {s.meta['answer']}")
        assert "<<" not in s.references[0]  # calculator annotations removed by default
        assert s.meta["question"] == row["question"].strip()
    # the worked solution itself is judged correct: gold and parser agree on every fixture problem
    acc = build_reward(cfg.reward)
    gens = [s.references[0] for s in train + test]
    assert acc([s.prompt for s in train + test], gens, [s.references for s in train + test],
               [s.meta for s in train + test]) == [1.0] * 95  # fmt: skip


def test_task_arguments_and_bad_data(tmp_path):
    keep = tasks.build("gsm8k", calculator_annotations=True, prompt_template="Q: {question}\nA:").load("test")
    assert any("<<" in s.references[0] for s in keep) and keep[0].prompt.startswith("Q: ")
    with pytest.raises(DataError, match="prompt_template must contain"):
        tasks.build("gsm8k", prompt_template="no field")
    with pytest.raises(DataError, match="may only use the field"):
        tasks.build("gsm8k", prompt_template="{question} {other}")
    bad = tmp_path / "test.jsonl"
    bad.write_text(json.dumps({"question": "q?", "answer": "2 + 2 = 4"}) + "\n")
    with pytest.raises(DataError, match=r"test row 0: the answer field has no '#### <answer>' line"):
        tasks.build("gsm8k", test_path=str(bad)).load("test")
    missing = tmp_path / "m.jsonl"
    missing.write_text(json.dumps({"answer": "#### 4"}) + "\n")
    with pytest.raises(DataError, match="missing field 'question'"):
        tasks.build("gsm8k", test_path=str(missing)).load("test")
    assert split_solution("a\nb\n#### 1,200\n") == ("a\nb", "1,200")


def test_hub_path_loads_openai_gsm8k_main(monkeypatch):
    """The hub path asks datasets for ``openai/gsm8k``, config ``main`` (no network here: the call is answered
    with a real DatasetDict of the fixture's rows, which have the hub's layout), carves validation out of the
    hub's train split, and without a network says how to use local files instead."""
    import datasets

    rows = {
        split: [json.loads(line) for line in (FIXTURE / f"{split}.jsonl").read_text().splitlines()]
        for split in ("train", "test")
    }
    calls = []

    def load_dataset(*names):
        calls.append(names)
        return datasets.DatasetDict(
            {k: datasets.Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in v])
             for k, v in rows.items()}
        )  # fmt: skip

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    task = tasks.build("gsm8k", hub=True)
    train, val, test = task.load("train"), task.load("validation"), task.load("test")
    assert calls == [("openai/gsm8k", "main")] * 3
    assert (len(train), len(val), len(test)) == (45, 5, 50)
    assert test[0].meta["answer"] == rows["test"][0]["answer"].rsplit("####", 1)[1].strip()
    assert test[0].id == "test_0"  # hub rows have no id: position in the split

    def offline(*names):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"openai/gsm8k/main .*Offline\? Use local files"):
        tasks.build("gsm8k", hub=True).load("test")


# ----------------------------------------------------------------------------------------- presets


def test_presets_build_task_reward_and_metrics():
    names = {p["name"] for p in list_presets() if p["task"] == "gsm8k"}
    assert {"gsm8k_ppo", "gsm8k_ppo_offline", "gsm8k_grpo", "gsm8k_grpo_offline"} <= names
    for name in ("gsm8k_ppo_offline", "gsm8k_grpo_offline", "gsm8k_grpo"):
        cfg = parse_config(load_preset(name))
        assert cfg.reward.id == "math_accuracy" and [m.id for m in cfg.eval.metrics] == ["math_accuracy"]
        assert cfg.eval.split == "test" and cfg.eval.generation.do_sample is False
        assert tasks.build(cfg.task.id, **cfg.task.args) is not None
        build_reward(cfg.reward)
        build_metrics(cfg.eval.metrics)
    offline = parse_config(load_preset("gsm8k_grpo_offline"))
    assert offline.algorithm.id == "grpo" and offline.algorithm.group.group_size == 4
    assert offline.model.name_or_path.endswith(".gguf") and offline.reward.args["format_reward"] == 0.1
    assert parse_config(load_preset("gsm8k_ppo_offline")).algorithm.id == "ppo"
    online = parse_config(load_preset("gsm8k_grpo"))
    assert online.task.args["hub"] is True and online.reward.args["format_reward"] == 0.0


def _numbers_in(text: str) -> set[float]:
    """Every number written in ``text`` (digits, thousands commas, a decimal part), unsigned."""
    return {float(m.replace(",", "")) for m in re.findall(r"\d[\d,]*(?:\.\d+)?", text)}


@pytest.mark.parametrize("preset", ["gsm8k_grpo_offline", "gsm8k_ppo_offline"])
def test_one_iteration_on_a_tiny_model_logs_answers(tmp_path, preset):
    cfg = load_preset(preset)
    cfg["model"] = {"name_or_path": "builtin:tiny-gpt2", "type": "causal"}
    cfg["tokenizer"]["max_prompt_length"] = 64
    cfg["rollout"].update(max_new_tokens=8, batch_size=8)
    cfg["train"].update(n_iters=1, prompts_per_iter=2, eval_every=1, save_every=0, log_samples=2)
    cfg["train"].update(output_dir=str(tmp_path / "run"), save_final_model=False)
    cfg["task"]["max_eval_samples"] = 3
    cfg["eval"]["generation"].update(max_new_tokens=8)
    engine.train(cfg)
    run = tmp_path / "run"
    points = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(p["step"] == 1 and "train/reward_mean" in p for p in points)
    accuracy = [p[k] for p in points for k in p if k.endswith("math/accuracy")]
    assert accuracy and all(0.0 <= a <= 1.0 for a in accuracy)
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r.get("split") == "train"]
    eval_rows = [r for r in rows if r.get("split") == "test"]
    assert train_rows and eval_rows
    for r in train_rows + eval_rows:
        details = r["metrics"]
        # the gold answer is the number after the reference's "####" (GSM8K's format), read here directly
        gold = float(r["references"][0].rsplit("####", 1)[1].strip().replace(",", ""))
        assert details["gold"] == gold
        # Independent of extract(): the extracted answer is one of the numbers written in the generation
        # (none written: none extracted), and it is correct exactly when it equals the gold one.
        written = _numbers_in(r["generation"])
        if not written:
            assert details["extracted"] is None and details["correct"] == 0.0
        else:
            assert details["extracted"] is None or abs(details["extracted"]) in written
        assert details["correct"] == (1.0 if details["extracted"] == gold else 0.0)
        # 1 for a correct answer; otherwise 0, or the format reward (0.1) for a marked one
        assert r["reward"] == 1.0 if details["correct"] else r["reward"] in (0.0, 0.1)
    assert all("math/accuracy" in r["metrics"] for r in eval_rows)
