"""Many annotators at once against the real PostgreSQL: no item over its overlap, no lost judgment.

Each thread has its own database connection and commits for real (transaction=True), so the
row locks, SKIP LOCKED and the conditional slot update are what keep the counts right.
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
from django.db import connection
from django.db.models import Sum

from annotation import assignment, campaigns, invites, uploads
from annotation.models import Assignment, Item, Judgment
from tests.annotation.conftest import make_user, sentiment_upload


@pytest.mark.django_db(transaction=True)
def test_concurrent_annotators_never_over_assign_and_lose_nothing():
    n_users, n_prompts, overlap = 16, 25, 3
    camp = uploads.create_campaign_from_upload("race", sentiment_upload(n_prompts), overlap=overlap)
    users = [make_user(f"racer{i}") for i in range(n_users)]
    for u in users:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    barrier = threading.Barrier(n_users)
    accepted: list[tuple[int, int]] = []
    skipped: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(user, seed):
        rng = random.Random(seed)
        try:
            barrier.wait()
            while (a := assignment.next_item(camp, user)) is not None:
                if rng.random() < 0.1:
                    assignment.skip_item(user, a.token)
                    with lock:
                        skipped.append((user.pk, a.item_id))
                    continue
                assignment.record_judgment(
                    user, a.token, item_id=a.item_id, choice=rng.choice(["left", "right", "tie"])
                )
                with lock:
                    accepted.append((user.pk, a.item_id))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(u, i)) for i, u in enumerate(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors

    stored = list(Judgment.objects.values_list("annotator_id", "item_id"))
    assert sorted(stored) == sorted(accepted)  # every accepted submission is stored, nothing extra
    assert len(set(stored)) == len(stored)  # nobody judged an item twice
    per_item = Counter(i for _, i in stored)
    for item in Item.objects.filter(campaign=camp):
        assert per_item[item.pk] == item.judgment_count <= overlap
        assert item.slots_taken == item.judgment_count  # no leaked reservations
    # A slot freed by a late skip may come back after everyone else had found nothing left and
    # stopped; annotators who come back later pick it up, and then every item reaches its overlap.
    late = 0
    for u in users:
        while (a := assignment.next_item(camp, u)) is not None:
            assignment.record_judgment(u, a.token, item_id=a.item_id, choice="tie")
            late += 1
    assert late <= len(skipped)  # nobody was told "nothing left" while a free slot existed for them
    per_item = Counter(Judgment.objects.values_list("item_id", flat=True))
    assert all(per_item[it.pk] == overlap == it.judgment_count for it in Item.objects.filter(campaign=camp))
    assert Judgment.objects.count() == n_prompts * overlap
    assert not Assignment.objects.filter(status="open").exists()
    # Every skip is recorded; a skipped item came back to its annotator at most once.
    assert len(skipped) == Assignment.objects.aggregate(n=Sum("skips"))["n"]
    assert not Assignment.objects.filter(skips__gt=2).exists()
