"""Adaptive campaigns on the real PostgreSQL: the informative pair is served first, and the
guarantees of uniform campaigns hold (no over-assignment under concurrent annotators, nobody gets an
item twice, random sides, AI judges' verdicts do not steer the choice)."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from typing import Any

import pytest
from django.db import connection
from django.db.models import F

from annotation import active, assignment, campaigns, invites, uploads
from annotation.models import AIJudge, AIJudgment, Assignment, AssignmentStatus, Campaign, Item, Judgment
from tests.annotation.conftest import make_user

SYSTEMS = ("s1", "s2", "s3")


def three_system_upload(n: int) -> str:
    return "\n".join(
        json.dumps({"id": f"p{i}", "prompt": f"Prompt {i}", "outputs": {s: f"{s} says {i}" for s in SYSTEMS}})
        for i in range(n)
    )


def judge(item: Item, user: Any, winner: str | None) -> None:
    """A finished judgment as next_item + record_judgment leave it (slot and count included)."""
    choice = "tie" if winner is None else ("a" if item.system_a == winner else "b")
    a = Assignment.objects.create(
        campaign=item.campaign, item=item, annotator=user, status=AssignmentStatus.DONE
    )
    Judgment.objects.create(campaign=item.campaign, item=item, annotator=user, assignment=a, choice=choice)
    Item.objects.filter(pk=item.pk).update(
        slots_taken=F("slots_taken") + 1, judgment_count=F("judgment_count") + 1
    )


def pair_of(item: Item) -> frozenset[str]:
    return frozenset((item.system_a, item.system_b))


def lopsided_campaign(mode: str) -> tuple[Campaign, Any]:
    """s1 met s2 (5-4) and s3 (4-5) on 9 of 10 prompts each, one item of each of those pairs is still
    unjudged; s2 and s3 never met, and each of their 10 items is reserved by another annotator (an
    open assignment: one slot taken, no judgment yet). Uniform serves an unjudged item, an s1 pair;
    the informative comparison is s2 vs s3, the two systems known only through s1."""
    camp = uploads.create_campaign_from_upload(
        "lopsided", three_system_upload(10), overlap=3, assignment_mode=mode
    )
    judges = [make_user(f"early{i}") for i in range(2)]
    holder, fresh = make_user("holder"), make_user("fresh")
    for u in [*judges, holder, fresh]:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    by_pair: dict[frozenset[str], list[Item]] = {}
    for it in camp.items.order_by("order"):
        by_pair.setdefault(pair_of(it), []).append(it)
    for k, it in enumerate(by_pair[frozenset(("s1", "s2"))][:9]):
        judge(it, judges[k % 2], "s1" if k < 5 else "s2")
    for k, it in enumerate(by_pair[frozenset(("s1", "s3"))][:9]):
        judge(it, judges[k % 2], "s1" if k < 4 else "s3")
    for it in by_pair[frozenset(("s2", "s3"))]:
        Assignment.objects.create(campaign=camp, item=it, annotator=holder)
        Item.objects.filter(pk=it.pk).update(slots_taken=F("slots_taken") + 1)
    return camp, fresh


@pytest.mark.django_db(transaction=True)
def test_adaptive_serves_the_informative_pair_where_uniform_serves_the_least_judged(settings):
    settings.ANNOTATION_ADAPTIVE_EXPLORE = 0.0
    camp, fresh = lopsided_campaign("adaptive")
    # The server's ranking is the pure function's on the same judgments (s2 vs s3 first).
    rows = [(j.item.system_a, j.item.system_b, j.choice, 1) for j in Judgment.objects.select_related("item")]
    expected = active.pair_order(active.pair_scores(active.win_matrix(rows, camp.systems)), camp.systems)
    assert assignment.pair_ranking(camp) == expected
    assert frozenset(expected[0]) == frozenset(("s2", "s3"))

    a = assignment.next_item(camp, fresh)
    assert pair_of(a.item) == frozenset(("s2", "s3"))
    assert a.item.slots_taken == 1  # already reserved once: adaptive passed over the free s1 items
    a.item.refresh_from_db()
    assert a.item.slots_taken == 2  # the slot is reserved in the same transaction

    # The same data in a uniform campaign: the least-judged item, an s1 pair.
    camp_u, fresh_u = lopsided_campaign_uniform()
    a_u = assignment.next_item(camp_u, fresh_u)
    assert "s1" in pair_of(a_u.item) and a_u.item.slots_taken == 0


def lopsided_campaign_uniform() -> tuple[Campaign, Any]:
    Campaign.objects.all().delete()
    from django.contrib.auth.models import User

    User.objects.filter(username__in=["early0", "early1", "holder", "fresh"]).delete()
    return lopsided_campaign("uniform")


@pytest.mark.django_db(transaction=True)
def test_exploration_floor_follows_the_uniform_order(settings):
    settings.ANNOTATION_ADAPTIVE_EXPLORE = 1.0  # every request explores
    camp, fresh = lopsided_campaign("adaptive")
    a = assignment.next_item(camp, fresh)
    assert "s1" in pair_of(a.item) and a.item.slots_taken == 0


@pytest.mark.django_db(transaction=True)
def test_ai_judges_do_not_steer_the_humans_choice(settings):
    settings.ANNOTATION_ADAPTIVE_EXPLORE = 0.0
    camp, _ = lopsided_campaign("adaptive")
    before = assignment.pair_ranking(camp)
    judge_row = AIJudge.objects.create(campaign=camp, name="robot", prompt_template="{prompt}")
    for it in camp.items.all():  # the AI says s3 wins everything, twice per item
        for a_first in (True, False):
            AIJudgment.objects.create(
                judge=judge_row, campaign=camp, item=it, a_first=a_first,
                choice="a" if it.system_a == "s3" else "b" if it.system_b == "s3" else "tie",
            )  # fmt: skip
    assert assignment.pair_ranking(camp) == before


@pytest.mark.django_db(transaction=True)
def test_concurrent_annotators_in_an_adaptive_campaign_never_over_assign():
    n_users, overlap = 8, 2
    camp = uploads.create_campaign_from_upload(
        "adaptive race", three_system_upload(8), overlap=overlap, assignment_mode="adaptive"
    )
    users = [make_user(f"racer{i}") for i in range(n_users)]
    for u in users:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    barrier = threading.Barrier(n_users)
    accepted: list[tuple[int, int]] = []
    sides: list[bool] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(user: Any, seed: int) -> None:
        rng = random.Random(seed)
        try:
            barrier.wait()
            while (a := assignment.next_item(camp, user)) is not None:
                # s1 is much better than s2 and s3, which are even: the adaptive rule keeps choosing.
                winner = "s1" if "s1" in pair_of(a.item) else rng.choice(["s2", "s3"])
                winner_left = (a.item.system_a == winner) == a.left_is_a
                assignment.record_judgment(
                    user, a.token, item_id=a.item_id, choice="left" if winner_left else "right"
                )
                with lock:
                    accepted.append((user.pk, a.item_id))
                    sides.append(a.left_is_a)
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
    assert sorted(stored) == sorted(accepted)
    assert len(set(stored)) == len(stored)  # nobody judged an item twice
    per_item = Counter(i for _, i in stored)
    items = list(Item.objects.filter(campaign=camp))
    for item in items:
        assert per_item[item.pk] == item.judgment_count <= overlap
        assert item.slots_taken == item.judgment_count
    # Adaptive changes the order, not the capacity: every slot was used in the end.
    assert all(it.judgment_count == overlap for it in items)
    # Blind sides: both placements occurred (the chance of one side only is 2 · 2^-48).
    assert 0 < sum(sides) < len(sides)


@pytest.mark.django_db
def test_api_reads_and_changes_the_assignment_mode(client, researcher):
    from webapp.api.auth import create_token

    camp = uploads.create_campaign_from_upload("via api", three_system_upload(2), overlap=1)
    likert = uploads.create_campaign_from_upload("likert", three_system_upload(1), kind="likert", overlap=1)
    auth = {"HTTP_AUTHORIZATION": "Bearer " + create_token(researcher, "t")[1]}
    listed = client.get("/api/v1/campaigns", **auth).json()["campaigns"]
    assert {c["id"]: c["assignment_mode"] for c in listed} == {camp.pk: "uniform", likert.pk: "uniform"}

    def post(pk: int, body: dict) -> Any:
        return client.post(
            f"/api/v1/campaigns/{pk}", data=json.dumps(body), content_type="application/json", **auth
        )

    r = post(camp.pk, {"assignment_mode": "adaptive"})
    assert r.status_code == 200 and r.json()["assignment_mode"] == "adaptive"
    camp.refresh_from_db()
    assert camp.assignment_mode == "adaptive"
    assert client.get(f"/api/v1/campaigns/{camp.pk}", **auth).json()["assignment_mode"] == "adaptive"
    bad = post(camp.pk, {"assignment_mode": "greedy"})
    assert bad.status_code == 400 and bad.json()["field"] == "assignment_mode"
    refused = post(likert.pk, {"assignment_mode": "adaptive"})
    assert refused.status_code == 400 and "pairwise" in refused.json()["error"]
    assert post(camp.pk, {"overlap": 9}).status_code == 400
    camp.refresh_from_db()
    assert camp.assignment_mode == "adaptive" and camp.overlap == 1


@pytest.mark.django_db
def test_a_baseline_campaign_ranks_only_its_baseline_pairs():
    camp = uploads.create_campaign_from_upload(
        "vs s1", three_system_upload(2), overlap=1, pairing="vs_baseline", baseline_system="s1",
        assignment_mode="adaptive",
    )  # fmt: skip
    ranked = assignment.pair_ranking(camp)
    assert sorted(map(frozenset, ranked), key=sorted) == [frozenset(("s1", "s2")), frozenset(("s1", "s3"))]
    assert {pair_of(it) for it in camp.items.all()} == set(map(frozenset, ranked))
