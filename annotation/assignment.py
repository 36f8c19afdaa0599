"""Handing items to annotators and taking their judgments: next item, record, skip, undo, reclaim.

The one subtle part is ``next_item``: many annotators ask for work at once, and no item may get
more judgments than the campaign's overlap. The slot is reserved in the same transaction that
picks the item, on a row locked with ``SELECT ... FOR UPDATE SKIP LOCKED`` (concurrent callers
take different rows instead of queueing on one), guarded by ``slots_taken < overlap`` and by a
unique (item, annotator) constraint. A judgment is accepted only with the token of an open
assignment that belongs to the submitting user, so replays and tampered posts are refused.

In an adaptive campaign (``Campaign.assignment_mode``) the same query orders the eligible rows by
how informative their pair of systems is (``annotation.active.pair_scores`` on one aggregate query of
the human judgments) instead of least-judged first; everything else — the lock, the guarded slot
update, the eligibility rules, the random sides — is the same code path. With probability
``ANNOTATION_ADAPTIVE_EXPLORE`` (default 0.1) a request follows the uniform order, so every pair
keeps being sampled and gold items keep being served.

A skipped item gives its slot back at once (someone else may take it) and comes back to the same
annotator once, at the end of their queue, if it still has a free slot then; skipping it a second
time is final for that annotator. So a skip never silently shrinks the campaign.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, Count, Exists, F, IntegerField, OuterRef, Q, Value, When
from django.utils import timezone

from annotation import active
from annotation.errors import AnnotationError, Rejected
from annotation.invites import is_member
from annotation.models import (
    Assignment,
    AssignmentMode,
    AssignmentStatus,
    Campaign,
    CampaignKind,
    CampaignStatus,
    Item,
    Judgment,
    Membership,
    Pairing,
    new_token,
)

ASSIGNMENT_LEASE = timedelta(hours=2)
# How many times a skipped item is offered again to the annotator who skipped it.
SKIP_COMEBACKS = 1
# Adaptive campaigns rank at most this many pairs in the item query (k = 50 systems has 1,225);
# items of pairs beyond it come after them, least-judged first.
ADAPTIVE_PAIRS_RANKED = 300


def adaptive_explore() -> float:
    """Share of an adaptive campaign's requests that follow the uniform order (exploration floor)."""
    return float(getattr(settings, "ANNOTATION_ADAPTIVE_EXPLORE", active.DEFAULT_EXPLORE))


def pair_ranking(camp: Campaign) -> list[tuple[str, str]]:
    """The campaign's pairs of systems, most informative first, from one aggregate query of its
    human judgments (gold items left out, as in the ranking). AI judges' verdicts are not counted:
    they judge every item anyway, and the humans' choice of work must not depend on them."""
    rows = (
        Judgment.objects.filter(campaign=camp, item__gold="")
        .exclude(item__system_b="")
        .order_by()
        .values_list("item__system_a", "item__system_b", "choice")
        .annotate(n=Count("id"))
    )
    scores = active.pair_scores(active.win_matrix(rows, camp.systems))
    pairs = active.pair_order(scores, camp.systems)
    if camp.pairing == Pairing.VS_BASELINE:  # only pairs the campaign has items for take ranks
        pairs = [p for p in pairs if camp.baseline_system in p]
    return pairs[:ADAPTIVE_PAIRS_RANKED]


def _pair_rank_expression(pairs: list[tuple[str, str]]) -> Case:
    """SQL ``CASE`` giving each item the rank of its pair (either stored order of the two systems)."""
    whens = []
    for rank, (a, b) in enumerate(pairs):
        whens.append(When(Q(system_a=a, system_b=b) | Q(system_a=b, system_b=a), then=Value(rank)))
    return Case(*whens, default=Value(len(pairs)), output_field=IntegerField())


def _reclaim_expired(camp: Campaign) -> int:
    """Give back slots of assignments whose lease ran out (abandoned tabs)."""
    now = timezone.now()
    n = 0
    with transaction.atomic():
        stale = list(
            Assignment.objects.select_for_update(skip_locked=True)
            .filter(campaign=camp, status=AssignmentStatus.OPEN, expires_at__lt=now)
            .values_list("pk", "item_id")[:100]
        )
        for pk, item_id in stale:
            if Assignment.objects.filter(pk=pk, status=AssignmentStatus.OPEN).update(
                status=AssignmentStatus.EXPIRED
            ):
                Item.objects.filter(pk=item_id, slots_taken__gt=0).update(slots_taken=F("slots_taken") - 1)
                n += 1
    return n


def _check_can_annotate(camp: Campaign, user: Any) -> None:
    if camp.status != CampaignStatus.ACTIVE:
        raise AnnotationError("this campaign is not active")
    if not is_member(camp, user):
        raise Rejected("you are not an annotator of this campaign")


def next_item(camp: Campaign, user: Any, seed: int | None = None) -> Assignment | None:
    """The user's open assignment, or a newly reserved slot on the least-judged eligible item
    (adaptive campaigns: on an eligible item of the most informative pair, see the module docstring).

    Eligible: in this campaign, fewer than ``overlap`` slots taken, never assigned to this user.
    When none is left, an item this user skipped comes back (see the module docstring).
    Returns None when nothing is left for this user.
    """
    _check_can_annotate(camp, user)
    now = timezone.now()
    current = (
        Assignment.objects.select_related("item")
        .filter(campaign=camp, annotator=user, status=AssignmentStatus.OPEN)
        .order_by("id")
        .first()
    )
    if current is not None and (current.expires_at is None or current.expires_at > now):
        return current
    seen = Assignment.objects.filter(campaign=camp, annotator=user).values("item_id")
    eligible = Item.objects.filter(campaign=camp, slots_taken__lt=camp.overlap).exclude(pk__in=seen)
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    ordering: tuple[str, ...] = ("slots_taken", "order", "id")
    if (
        camp.assignment_mode == AssignmentMode.ADAPTIVE
        and camp.kind == CampaignKind.PAIRWISE
        and rng.random() >= adaptive_explore()
    ):
        eligible = eligible.annotate(pair_rank=_pair_rank_expression(pair_ranking(camp)))
        ordering = ("pair_rank", *ordering)
    reclaimed = False
    for attempt in range(6):
        # First passes skip rows other annotators hold; if everything eligible is locked at
        # this instant, later passes wait for the locks instead of reporting "nothing left".
        # (A waited-for row that filled up meanwhile is dropped by PostgreSQL's re-check and
        # LIMIT 1 then returns nothing, hence the exists() check on every pass.)
        skip = attempt < 2
        try:
            with transaction.atomic():
                _soft_commit()
                item = eligible.select_for_update(skip_locked=skip).order_by(*ordering).first()
                if item is None:
                    if eligible.exists():
                        continue
                    stale = Assignment.objects.filter(
                        campaign=camp, status=AssignmentStatus.OPEN, expires_at__lt=now
                    )
                    if not reclaimed and stale.exists():
                        # Abandoned reservations only matter once nothing else is left.
                        raise _Reclaim
                    break
                updated = Item.objects.filter(pk=item.pk, slots_taken__lt=camp.overlap).update(
                    slots_taken=F("slots_taken") + 1
                )
                if not updated:
                    continue
                a = Assignment.objects.create(
                    campaign=camp, item=item, annotator=user, left_is_a=rng.random() < 0.5,
                    served_at=now, expires_at=now + ASSIGNMENT_LEASE,
                )  # fmt: skip
                a.item = item
                return a
        except IntegrityError:
            # The same user in two tabs raced for the same item; try again.
            continue
        except _Reclaim:
            reclaimed = True
            _reclaim_expired(camp)
            continue
    return _serve_skipped(camp, user, now)


def _serve_skipped(camp: Campaign, user: Any, now: Any) -> Assignment | None:
    """Reopen the user's oldest skipped assignment whose item still has a free slot."""
    with transaction.atomic():
        skipped = (
            Assignment.objects.select_for_update(skip_locked=True)
            .filter(campaign=camp, annotator=user, status=AssignmentStatus.SKIPPED, skips__lte=SKIP_COMEBACKS)
            .order_by("id")
        )
        for a in skipped:
            if Item.objects.filter(pk=a.item_id, slots_taken__lt=camp.overlap).update(
                slots_taken=F("slots_taken") + 1
            ):
                a.status = AssignmentStatus.OPEN
                a.token = new_token()
                a.served_at = now
                a.expires_at = now + ASSIGNMENT_LEASE
                a.save(update_fields=["status", "token", "served_at", "expires_at"])
                return Assignment.objects.select_related("item").get(pk=a.pk)
    return None


class _Reclaim(Exception):
    """Leave the item transaction, give back expired slots, then look again."""


def _soft_commit() -> None:
    """A reservation is soft state: after a crash it is simply gone and the annotator gets another
    item, while judgments (separate transactions) stay fully durable. Not waiting for the WAL flush
    here halves the fsyncs of a round trip (see docs/benchmarks.md)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SET LOCAL synchronous_commit TO OFF")


def _shown_to_choice(shown: str, left_is_a: bool) -> str:
    """Screen choice ('left'/'right'/'tie'/'both_bad') → stored choice in system terms."""
    if shown in ("tie", "both_bad"):
        return shown
    if shown == "left":
        return "a" if left_is_a else "b"
    if shown == "right":
        return "b" if left_is_a else "a"
    raise Rejected(f"unknown choice {shown!r}; expected left, right, tie or both_bad")


def record_judgment(
    user: Any,
    token: str,
    *,
    item_id: int | None = None,
    choice: str | None = None,
    scores: dict[str, Any] | None = None,
    rationale: str = "",
    seconds: float | None = None,
) -> Judgment:
    """Store one judgment for an open assignment of ``user``.

    Rejected: unknown/replayed token (assignment not open), a token of another user, an ``item_id``
    that is not the assignment's item, a closed campaign, invalid choice/scores.
    """
    with transaction.atomic():
        a = (
            Assignment.objects.select_for_update(of=("self",))
            .select_related("item", "campaign")
            .filter(token=str(token or ""))
            .annotate(
                member=Exists(
                    Membership.objects.filter(campaign=OuterRef("campaign"), user=OuterRef("annotator"))
                )
            )
            .first()
        )
        if a is None or a.annotator_id != user.pk:
            raise Rejected("this item is not assigned to you")
        if a.status != AssignmentStatus.OPEN:
            raise Rejected("this item was already submitted or skipped (duplicate submission)")
        if item_id is not None and int(item_id) != a.item_id:
            raise Rejected("the submitted item does not match your assignment")
        camp = a.campaign
        if camp.status != CampaignStatus.ACTIVE:
            raise Rejected("this campaign is not active")
        if not a.member:  # removed from the campaign since the item was served
            raise Rejected("you are not an annotator of this campaign")
        stored_choice = ""
        clean_scores: dict[str, int] = {}
        if camp.kind == CampaignKind.PAIRWISE:
            stored_choice = _shown_to_choice(choice or "", a.left_is_a)
        else:
            scores = scores or {}
            for ax in camp.axes:
                v = scores.get(ax["name"])
                try:
                    iv = int(v)
                except (TypeError, ValueError):
                    raise Rejected(f"score for '{ax['name']}' is missing") from None
                if not 1 <= iv <= 5:
                    raise Rejected(f"score for '{ax['name']}' must be 1–5")
                clean_scores[ax["name"]] = iv
            extra = set(scores) - {ax["name"] for ax in camp.axes}
            if extra:
                raise Rejected(f"unknown axes: {sorted(extra)}")
        elapsed = (timezone.now() - (a.served_at or a.created)).total_seconds()
        secs = elapsed if seconds is None else max(0.0, min(float(seconds), elapsed + 1.0))
        try:
            j = Judgment.objects.create(
                campaign=camp, item=a.item, annotator=user, assignment=a, choice=stored_choice,
                left_is_a=a.left_is_a, scores=clean_scores, rationale=(rationale or "")[:5000], seconds=secs,
            )  # fmt: skip
        except IntegrityError:
            raise Rejected("you already judged this item") from None
        a.status = AssignmentStatus.DONE
        a.save(update_fields=["status"])
        Item.objects.filter(pk=a.item_id).update(judgment_count=F("judgment_count") + 1)
    return j


def skip_item(user: Any, token: str) -> None:
    """Give the slot back now; the item comes back to this user at the end of their queue (once)."""
    with transaction.atomic():
        a = Assignment.objects.select_for_update().filter(token=str(token or "")).first()
        if a is None or a.annotator_id != user.pk:
            raise Rejected("this item is not assigned to you")
        if a.status != AssignmentStatus.OPEN:
            raise Rejected("this item is no longer open")
        a.status = AssignmentStatus.SKIPPED
        a.skips += 1
        a.save(update_fields=["status", "skips"])
        Item.objects.filter(pk=a.item_id, slots_taken__gt=0).update(slots_taken=F("slots_taken") - 1)


def undo_last(camp: Campaign, user: Any) -> Assignment | None:
    """Withdraw the user's last judgment in this campaign; the item comes back to them next.

    The slot stays reserved (the assignment reopens with a fresh token and lease), so undo can
    never push an item over its overlap. Any other open assignment of the user is given back.
    """
    _check_can_annotate(camp, user)
    with transaction.atomic():
        j = (
            Judgment.objects.select_for_update(of=("self",))
            .filter(campaign=camp, annotator=user)
            .select_related("assignment")
            .order_by("-id")
            .first()
        )
        if j is None:
            return None
        for other in Assignment.objects.select_for_update().filter(
            campaign=camp, annotator=user, status=AssignmentStatus.OPEN
        ):
            # The item shown after the judgment being undone goes back to the pool (not "seen").
            Item.objects.filter(pk=other.item_id, slots_taken__gt=0).update(slots_taken=F("slots_taken") - 1)
            other.delete()
        a = j.assignment
        item_id = j.item_id
        j.delete()
        Item.objects.filter(pk=item_id, judgment_count__gt=0).update(judgment_count=F("judgment_count") - 1)
        now = timezone.now()
        a.status = AssignmentStatus.OPEN
        a.token = new_token()
        a.served_at = now
        a.expires_at = now + ASSIGNMENT_LEASE
        a.save(update_fields=["status", "token", "served_at", "expires_at"])
    return a


def progress_for(camp: Campaign, user: Any) -> dict[str, int]:
    """'12 of 50': done by this user, and done + what is still available to them."""
    done = Judgment.objects.filter(campaign=camp, annotator=user).count()
    seen = Assignment.objects.filter(campaign=camp, annotator=user).values("item_id")
    available = Item.objects.filter(campaign=camp, slots_taken__lt=camp.overlap).exclude(pk__in=seen).count()
    open_now = Assignment.objects.filter(campaign=camp, annotator=user, status=AssignmentStatus.OPEN).count()
    coming_back = Assignment.objects.filter(
        campaign=camp, annotator=user, status=AssignmentStatus.SKIPPED, skips__lte=SKIP_COMEBACKS,
        item__slots_taken__lt=camp.overlap,
    ).count()  # fmt: skip
    return {"done": done, "total": done + open_now + available + coming_back, "skipped": coming_back}


def display_item(a: Assignment) -> dict[str, Any]:
    """What an annotator may see: no system ids, no metrics, no run links."""
    it = a.item
    if it.system_b or it.output_b:
        left, right = (it.output_a, it.output_b) if a.left_is_a else (it.output_b, it.output_a)
    else:
        left, right = it.output_a, ""
    return {"token": a.token, "item_id": it.pk, "prompt": it.prompt, "left": left, "right": right}
