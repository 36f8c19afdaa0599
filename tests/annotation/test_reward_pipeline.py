"""Judgments → export → reward model trained by a REAL Celery worker → offered to the launch form.

Three simulated annotators prefer the positive review of each pair (one of them is noisy); the
MiniLM reward model trained on the exported pairs must rank unseen positive texts above negative
ones (held-out pairs are on items it never saw), and the engine's ``learned`` reward must load it.
"""

from __future__ import annotations

import json
import random

import pytest

from annotation import assignment, campaigns, exports, invites, reward_models, uploads
from annotation.models import RewardModel
from tests.annotation.conftest import make_user, sentiment_upload


@pytest.mark.django_db(transaction=True)
def test_judgments_train_a_reward_model_in_the_worker(celery_worker, wait_for, runs_dir):
    camp = uploads.create_campaign_from_upload("rm", sentiment_upload(40), overlap=3)
    users = [make_user(f"rater{i}") for i in range(3)]
    for u in users:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    rng = random.Random(0)
    for k, u in enumerate(users):
        while (a := assignment.next_item(camp, u)) is not None:
            pos_shown_left = (a.item.system_a == "pos") == a.left_is_a
            choice = "left" if pos_shown_left else "right"
            if k == 2 and rng.random() < 0.15:  # a noisy annotator
                choice = rng.choice(["tie", "left" if choice == "right" else "right"])
            assignment.record_judgment(u, a.token, item_id=a.item_id, choice=choice)

    pairs = [json.loads(x) for x in exports.export_jsonl(camp).splitlines()]
    assert len(pairs) > 100 and sum(p["meta"]["system_chosen"] == "pos" for p in pairs) / len(pairs) > 0.9

    req = reward_models.TrainRequest(
        name="sentiment RM", epochs=1.0, batch_size=16, max_length=24, learning_rate=1e-4
    )
    rm = reward_models.create_reward_model(camp, req)
    wait_for(lambda: RewardModel.objects.get(pk=rm.pk).status in ("succeeded", "failed"), timeout=420,
             interval=0.5, what="reward model training")  # fmt: skip
    rm.refresh_from_db()
    assert rm.status == "succeeded", rm.error + "\n" + celery_worker.log()[-3000:]
    assert rm.progress == 1.0 and rm.metrics["heldout_pairs"] >= 15
    assert rm.path.startswith(str(runs_dir))  # written under the runs dir (inside the allowed roots)
    assert rm.metrics["heldout_accuracy"] >= 0.8  # chance is 0.5
    # Reported with its count and Wilson interval; enough held-out pairs to be a measurement.
    n = rm.metrics["heldout_pairs"]
    assert rm.metrics["heldout_n"] == n and not rm.metrics["heldout_too_small"]
    assert rm.metrics["heldout_low"] < rm.metrics["heldout_accuracy"] <= rm.metrics["heldout_high"]

    choice = next(c for c in reward_models.reward_choices() if c["id"] == f"learned-rm-{rm.pk}")
    assert choice["config"] == {"id": "learned", "args": {"model_path": rm.path, "label_index": 0}}
    assert "sentiment RM" in choice["label"] and f"n={n}" in choice["label"]

    from engine.registry import rewards

    reward = rewards.build("learned", **choice["config"]["args"])
    good, bad = reward(
        ["", ""],
        ["The soundtrack was superb and lovely.", "The soundtrack was dreadful and dull."],
        [[], []],
        [{}, {}],
    )
    assert good > bad
