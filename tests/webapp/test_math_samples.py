"""The run page's samples table shows each generation's per-sample scores: for the maths task, the
extracted answer, the gold answer and whether it was correct (what the engine's maths reward adds to
every logged row), both in the first HTML and in the rows the websocket delivers."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from engine.evaluation import reward_details
from engine.rewards import build_reward
from webapp.runs import ingest, queries, services

pytestmark = pytest.mark.django_db

GSM8K = {
    "name": "maths",
    "model": {"name_or_path": "builtin:tiny-gpt2"},
    "task": {"id": "gsm8k"},
    "reward": {"id": "math_accuracy"},
    "train": {"n_iters": 1, "prompts_per_iter": 2},
}


def test_run_page_shows_extracted_gold_and_correct(researcher_client: Client, researcher: Any) -> None:
    run = services.create_run(GSM8K, user=researcher, name="maths")
    reward = build_reward(GSM8K["reward"])
    gens = ["9 * 2 = 18\n#### 18", "<b>I think</b> 1,250.5", "no idea"]
    refs = [["#### 18"], ["#### 1,250"], ["#### 7"]]
    meta = [{"answer": "18"}, {"answer": "1,250"}, {"answer": "7"}]
    scores = reward([""] * 3, gens, refs, meta)
    details = reward_details(reward, [""] * 3, gens, refs, meta)
    rows = [
        {"sample_id": f"s{i}", "prompt": "Q", "generation": g, "references": r, "reward": s, "metrics": d}
        for i, (g, r, s, d) in enumerate(zip(gens, refs, scores, details))
    ]
    ingest.ingest_samples(run.pk, 1, "train", rows)
    html = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert "correct 1 · extracted 18 · gold 18<" in html
    assert "correct 0 · extracted 1250.5 · gold 1250<" in html
    assert "correct 0 · extracted — · gold 7<" in html  # no number: a dash, never 'None'
    assert "&lt;b&gt;I think&lt;/b&gt;" in html and "<b>I think" not in html
    # the live path (websocket catch-up rows) carries the same numbers for run_live.js to draw
    live = queries.samples_after(run.pk, 0)
    # (sorted by name on the page: PostgreSQL's jsonb does not keep the engine's key order)
    assert [r["metrics"] for r in live] == [
        {"extracted": 18.0, "gold": 18.0, "correct": 1.0},
        {"extracted": 1250.5, "gold": 1250.0, "correct": 0.0},
        {"extracted": None, "gold": 7.0, "correct": 0.0},
    ]
    assert [r["reward"] for r in live] == [1.0, 0.0, 0.0]
