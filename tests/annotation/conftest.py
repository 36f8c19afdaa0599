"""Factories for annotation tests: runs with evaluation samples, users, campaigns."""

from __future__ import annotations

import json
from typing import Any

import pytest

POSITIVE = [
    "wonderful",
    "delightful",
    "brilliant",
    "excellent",
    "charming",
    "superb",
    "lovely",
    "great",
    "moving",
]
NEGATIVE = ["awful", "terrible", "boring", "dreadful", "horrible", "dull", "painful", "bad", "weak"]


def make_user(username: str, group: str | None = "annotator") -> Any:
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user(username, f"{username}@example.org", "pw-" + username + "-123")
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def make_run(
    name: str,
    prompts: list[str],
    outputs: list[str],
    rewards: list[float] | None = None,
    step: int = 10,
    split: str = "validation",
) -> Any:
    from webapp.runs.models import Run, Sample

    run = Run.objects.create(name=name, status="succeeded", config={})
    # An older evaluation and some training samples that must NOT be used (latest eval only).
    Sample.objects.bulk_create(
        [Sample(run=run, step=step - 5, split=split, sample_id=f"p{i}", prompt=p, generation="old " + o)
         for i, (p, o) in enumerate(zip(prompts, outputs))]
        + [Sample(run=run, step=step, split="train", sample_id=f"t{i}", prompt=p, generation="train")
           for i, p in enumerate(prompts)]
        + [Sample(run=run, step=step, split=split, sample_id=f"p{i}", prompt=p, generation=o,
                  reward=(rewards[i] if rewards else None), metrics={"length": float(len(o.split()))})
           for i, (p, o) in enumerate(zip(prompts, outputs))]
    )  # fmt: skip
    return run


def sentiment_upload(n: int, systems: tuple[str, str] = ("pos", "neg"), gold: int = 0) -> str:
    """JSONL: system 'pos' writes positive reviews, 'neg' negative ones (a synthetic preference)."""
    lines = []
    for i in range(n):
        subj = ["The movie", "The plot", "The acting", "This film", "The ending", "The script"][i % 6]
        good = f"{subj} was {POSITIVE[i % len(POSITIVE)]} and {POSITIVE[(i * 7 + 3) % len(POSITIVE)]}."
        bad = f"{subj} was {NEGATIVE[i % len(NEGATIVE)]} and {NEGATIVE[(i * 5 + 1) % len(NEGATIVE)]}."
        lines.append(
            {"id": f"r{i}", "prompt": f"Review {i}:", "outputs": {systems[0]: good, systems[1]: bad},
             "metrics": {systems[0]: {"positivity": 1.0, "len": len(good)}, systems[1]: {"positivity": 0.0, "len": len(bad)}}}
        )  # fmt: skip
    for g in range(gold):
        lines.append(
            {
                "prompt": f"Attention {g}",
                "outputs": {"good": "A fine, clear answer.", "bad": "zzzz"},
                "gold": "good",
            }
        )
    return "\n".join(json.dumps(x) for x in lines) + "\n"


@pytest.fixture
def make_annotators(db: Any):
    def _make(n: int, prefix: str = "ann") -> list[Any]:
        return [make_user(f"{prefix}{i}") for i in range(n)]

    return _make


@pytest.fixture
def two_runs(db: Any) -> tuple[Any, Any]:
    prompts = [f"Prompt number {i}:" for i in range(6)]
    good = make_run("good-run", prompts, [f"a {POSITIVE[i]} answer" for i in range(6)], rewards=[1.0] * 6)
    bad = make_run("bad-run", prompts, [f"a {NEGATIVE[i]} answer" for i in range(6)], rewards=[0.0] * 6)
    return good, bad
