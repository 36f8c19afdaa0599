"""Everything that changes or summarises annotation state; views and tasks stay thin.

The one subtle part is ``next_item``: many annotators ask for work at once, and no item may get
more judgments than the campaign's overlap. The slot is reserved in the same transaction that
picks the item, on a row locked with ``SELECT ... FOR UPDATE SKIP LOCKED`` (concurrent callers
take different rows instead of queueing on one), guarded by ``slots_taken < overlap`` and by a
unique (item, annotator) constraint. A judgment is accepted only with the token of an open
assignment that belongs to the submitting user, so replays and tampered posts are refused.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from itertools import combinations
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, F, OuterRef
from django.utils import timezone

from annotation import stats
from annotation.models import (
    DEFAULT_AXES,
    Assignment,
    AssignmentStatus,
    Campaign,
    CampaignKind,
    CampaignStatus,
    Choice,
    Invite,
    Item,
    Judgment,
    Membership,
    Pairing,
    RewardModel,
    RewardModelStatus,
)

ASSIGNMENT_LEASE = timedelta(hours=2)
MAX_UPLOAD_LINES = 20000


class AnnotationError(Exception):
    """A request the service refuses; the message is safe to show to the user."""


class UploadError(AnnotationError):
    def __init__(self, message: str, line: int | None = None, field: str | None = None):
        where = f"line {line}" if line else ""
        if field:
            where += f"{', ' if where else ''}field '{field}'"
        super().__init__(f"{where}: {message}" if where else message)
        self.line, self.field = line, field


class Rejected(AnnotationError):
    """A duplicate, replayed or tampered submission."""


def run_system(run_id: int) -> str:
    return f"run:{run_id}"


# --------------------------------------------------------------------------------------------------
# Creating campaigns
# --------------------------------------------------------------------------------------------------


def _clean_axes(axes: Any) -> list[dict[str, Any]]:
    if not axes:
        return [dict(a) for a in DEFAULT_AXES]
    out = []
    for i, ax in enumerate(axes):
        if not isinstance(ax, dict) or not str(ax.get("name", "")).strip():
            raise AnnotationError(f"axes[{i}]: needs a name")
        labels = ax.get("labels") or []
        if len(labels) != 5 or not all(isinstance(x, str) and x.strip() for x in labels):
            raise AnnotationError(f"axes[{i}] ({ax.get('name')}): needs 5 anchored labels, one per score 1–5")
        out.append({"name": str(ax["name"]).strip(), "labels": [str(x) for x in labels]})
    return out


def parse_axes_text(text: str) -> list[dict[str, Any]]:
    """Form syntax, one axis per line: ``name: label1 | label2 | label3 | label4 | label5``."""
    axes = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if ":" not in line:
            raise AnnotationError(f"axes line {n}: expected 'name: label 1 | ... | label 5'")
        name, rest = line.split(":", 1)
        axes.append({"name": name.strip(), "labels": [x.strip() for x in rest.split("|")]})
    return _clean_axes(axes)


def axes_to_text(axes: list[dict[str, Any]]) -> str:
    return "\n".join(f"{a['name']}: {' | '.join(a['labels'])}" for a in axes)


def _pairs(systems: list[str], pairing: str, baseline: str) -> list[tuple[str, str]]:
    if pairing == Pairing.VS_BASELINE:
        if baseline not in systems:
            raise AnnotationError(f"baseline system {baseline!r} is not one of the campaign's systems")
        return [(baseline, s) for s in systems if s != baseline]
    return list(combinations(systems, 2))


def _new_campaign(name: str, kind: str, user: Any, **kw: Any) -> Campaign:
    if kind not in CampaignKind.values:
        raise AnnotationError(f"kind must be one of {CampaignKind.values}")
    overlap = int(kw.get("overlap") or 3)
    if overlap < 1:
        raise AnnotationError("overlap must be at least 1")
    return Campaign.objects.create(
        name=(name or "").strip() or "campaign",
        kind=kind,
        instructions=kw.get("instructions") or "",
        examples=kw.get("examples") or [],
        axes=_clean_axes(kw.get("axes")) if kind == CampaignKind.LIKERT else [],
        overlap=overlap,
        pairing=kw.get("pairing") or Pairing.ALL_PAIRS,
        baseline_system=kw.get("baseline_system") or "",
        source=kw.get("source", "runs"),
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )


def _metrics_of(sample: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    if sample.reward is not None:
        out["reward"] = float(sample.reward)
    for k, v in (sample.metrics or {}).items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[str(k)] = float(v)
    return out


def _prompt_key(sample_id: str, prompt: str) -> str:
    """Generations are matched on the prompt text itself: sample ids ("0", "1", ...) are not
    unique across data sets, and the same prompt must show the same text to annotators anyway."""
    return "sha1:" + hashlib.sha1(prompt.encode("utf-8")).hexdigest()


def latest_eval_samples(run: Any, split: str | None = None) -> dict[str, Any]:
    """A run's generations at its last evaluation: {prompt key: Sample}.

    Default split: the non-train split with the most samples at its last step (the final
    evaluation generations); ``split="train"`` takes the last logged training samples.
    """
    from webapp.runs.models import Sample

    qs = Sample.objects.filter(run=run)
    if split:
        qs = qs.filter(split=split)
    else:
        splits = list(qs.exclude(split="train").values_list("split", flat=True).distinct())
        qs = qs.filter(split__in=splits) if splits else qs
    last = qs.order_by("-step").values_list("step", flat=True).first()
    if last is None:
        return {}
    out: dict[str, Any] = {}
    for s in qs.filter(step=last).order_by("id"):
        out.setdefault(_prompt_key(s.sample_id, s.prompt), s)
    return out


@transaction.atomic
def create_campaign_from_runs(
    name: str,
    run_ids: Sequence[int],
    *,
    kind: str = CampaignKind.PAIRWISE,
    user: Any = None,
    split: str | None = None,
    pairing: str = Pairing.ALL_PAIRS,
    baseline_run: int | None = None,
    overlap: int = 3,
    max_items: int | None = None,
    instructions: str = "",
    axes: Any = None,
    seed: int = 0,
) -> Campaign:
    """Items from the generations of ≥2 runs on the same prompts (matched by sample id or prompt)."""
    from webapp.runs.models import Run

    run_ids = list(dict.fromkeys(int(r) for r in run_ids))
    min_runs = 2 if kind == CampaignKind.PAIRWISE else 1
    if len(run_ids) < min_runs:
        raise AnnotationError(f"choose at least {min_runs} runs for a {kind} campaign")
    runs = {r.pk: r for r in Run.objects.filter(pk__in=run_ids)}
    missing = [r for r in run_ids if r not in runs]
    if missing:
        raise AnnotationError(f"unknown run ids: {missing}")
    per_run = {}
    for rid in run_ids:
        samples = latest_eval_samples(runs[rid], split)
        if not samples:
            raise AnnotationError(
                f"run #{rid} ({runs[rid].name}) has no samples{' in split ' + split if split else ''}"
            )
        per_run[rid] = samples
    common = set.intersection(*(set(s) for s in per_run.values()))
    if not common:
        raise AnnotationError(
            "the selected runs share no prompts (generations are matched on identical prompt text)"
        )
    keys = sorted(common)
    rng = random.Random(seed)
    if max_items and len(keys) > max_items:
        keys = sorted(rng.sample(keys, max_items))
    systems = [run_system(r) for r in run_ids]
    labels = {run_system(r): f"#{r} {runs[r].name}" for r in run_ids}
    baseline = run_system(baseline_run) if baseline_run else ""
    camp = _new_campaign(
        name, kind, user, overlap=overlap, pairing=pairing, baseline_system=baseline,
        instructions=instructions, axes=axes, source="runs",
    )  # fmt: skip
    camp.systems, camp.system_labels = systems, labels
    camp.save(update_fields=["systems", "system_labels"])
    items = []
    order = 0
    for key in keys:
        first = per_run[run_ids[0]][key]
        if kind == CampaignKind.PAIRWISE:
            for sa, sb in _pairs(systems, pairing, baseline):
                if rng.random() < 0.5:
                    sa, sb = sb, sa  # which system is stored as "A" is random too (kappa paradox)
                a, b = per_run[int(sa[4:])][key], per_run[int(sb[4:])][key]
                items.append(
                    Item(
                        campaign=camp, order=order, key=key[:300], prompt=first.prompt, references=first.references or [],
                        system_a=sa, output_a=a.generation, metrics_a=_metrics_of(a), sample_a=a,
                        system_b=sb, output_b=b.generation, metrics_b=_metrics_of(b), sample_b=b,
                    )
                )  # fmt: skip
                order += 1
        else:
            for s in systems:
                a = per_run[int(s[4:])][key]
                items.append(
                    Item(
                        campaign=camp, order=order, key=key[:300], prompt=first.prompt, references=first.references or [],
                        system_a=s, output_a=a.generation, metrics_a=_metrics_of(a), sample_a=a,
                    )
                )  # fmt: skip
                order += 1
    rng.shuffle(items)
    for i, it in enumerate(items):
        it.order = i
    Item.objects.bulk_create(items)
    return camp


def _parse_upload_line(obj: Any, lineno: int, kind: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise UploadError("expected a JSON object", lineno)
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UploadError("missing or empty (a non-empty string is required)", lineno, "prompt")
    outputs = obj.get("outputs")
    if isinstance(outputs, list):
        conv = {}
        for j, o in enumerate(outputs):
            if not isinstance(o, dict):
                raise UploadError(
                    "each output must be an object with 'system' and 'text'", lineno, f"outputs[{j}]"
                )
            sys_id, text = o.get("system"), o.get("text")
            if not isinstance(sys_id, str) or not sys_id.strip():
                raise UploadError("missing system id", lineno, f"outputs[{j}].system")
            if not isinstance(text, str):
                raise UploadError("must be a string", lineno, f"outputs[{j}].text")
            if sys_id in conv:
                raise UploadError(f"duplicate system id {sys_id!r}", lineno, f"outputs[{j}].system")
            conv[sys_id] = text
        outputs = conv
    if not isinstance(outputs, dict):
        raise UploadError(
            "must map system id -> output text (or be a list of {system, text})", lineno, "outputs"
        )
    for sys_id, text in outputs.items():
        if not isinstance(text, str):
            raise UploadError("output text must be a string", lineno, f"outputs.{sys_id}")
    need = 2 if kind == CampaignKind.PAIRWISE else 1
    if len(outputs) < need:
        raise UploadError(f"needs at least {need} outputs for a {kind} campaign", lineno, "outputs")
    refs = obj.get("references", [])
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise UploadError("must be a list of strings", lineno, "references")
    metrics = obj.get("metrics", {})
    if not isinstance(metrics, dict):
        raise UploadError("must map system id -> {metric: number}", lineno, "metrics")
    for sys_id, m in metrics.items():
        if sys_id not in outputs:
            raise UploadError(f"system {sys_id!r} has no output", lineno, f"metrics.{sys_id}")
        if not isinstance(m, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in m.values()
        ):
            raise UploadError("must be an object of numbers", lineno, f"metrics.{sys_id}")
    gold = obj.get("gold")
    if gold is not None:
        if kind != CampaignKind.PAIRWISE:
            raise UploadError("gold answers are supported for pairwise campaigns only", lineno, "gold")
        if len(outputs) != 2:
            raise UploadError("a gold item must have exactly 2 outputs", lineno, "gold")
        if gold not in outputs and gold not in ("tie", "both_bad"):
            raise UploadError("must be one of the line's system ids, 'tie' or 'both_bad'", lineno, "gold")
    item_id = obj.get("id", "")
    if not isinstance(item_id, str | int):
        raise UploadError("must be a string or integer", lineno, "id")
    return {
        "id": str(item_id),
        "prompt": prompt,
        "outputs": outputs,
        "references": refs,
        "metrics": metrics,
        "gold": gold,
    }


def parse_upload(data: bytes | str, kind: str) -> list[dict[str, Any]]:
    """Validate a whole JSONL upload before anything is written; the first error names line and field."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UploadError(f"file is not UTF-8 text (byte {exc.start})") from None
    rows = []
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        if len(rows) >= MAX_UPLOAD_LINES:
            raise UploadError(f"too many lines (limit {MAX_UPLOAD_LINES})", lineno)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UploadError(f"invalid JSON ({exc.msg} at column {exc.colno})", lineno) from None
        rows.append(_parse_upload_line(obj, lineno, kind))
    if not rows:
        raise UploadError("the file holds no items")
    return rows


@transaction.atomic
def create_campaign_from_upload(
    name: str,
    data: bytes | str,
    *,
    kind: str = CampaignKind.PAIRWISE,
    user: Any = None,
    pairing: str = Pairing.ALL_PAIRS,
    baseline_system: str = "",
    overlap: int = 3,
    instructions: str = "",
    axes: Any = None,
    seed: int = 0,
) -> Campaign:
    """JSONL lines ``{"prompt", "outputs": {system: text}, "references"?, "metrics"?, "gold"?, "id"?}``.

    All-or-nothing: the file is validated completely first and the campaign is created in one
    transaction, so a malformed file imports nothing.
    """
    rows = parse_upload(data, kind)
    systems = list(dict.fromkeys(s for r in rows if r["gold"] is None for s in r["outputs"]))
    if pairing == Pairing.VS_BASELINE and baseline_system not in systems:
        raise AnnotationError(
            f"baseline system {baseline_system!r} does not occur in the upload (systems: {systems})"
        )
    camp = _new_campaign(
        name, kind, user, overlap=overlap, pairing=pairing, baseline_system=baseline_system,
        instructions=instructions, axes=axes, source="upload",
    )  # fmt: skip
    camp.systems, camp.system_labels = systems, {s: s for s in systems}
    camp.save(update_fields=["systems", "system_labels"])
    rng = random.Random(seed)
    items = []
    for n, r in enumerate(rows):
        key = r["id"] or _prompt_key("", r["prompt"])
        outs = r["outputs"]
        line_systems = list(outs)
        if r["gold"] is not None:
            sa, sb = line_systems
            gold = "a" if r["gold"] == sa else "b" if r["gold"] == sb else r["gold"]
            items.append(
                Item(campaign=camp, key=f"gold:{key}"[:300], prompt=r["prompt"], references=r["references"],
                     system_a=sa, output_a=outs[sa], system_b=sb, output_b=outs[sb], gold=gold)
            )  # fmt: skip
            continue
        if kind == CampaignKind.PAIRWISE:
            present = [s for s in systems if s in outs]
            if pairing == Pairing.VS_BASELINE:
                if baseline_system not in outs:
                    raise UploadError(f"baseline system {baseline_system!r} has no output", n + 1, "outputs")
                pairs = [(baseline_system, s) for s in present if s != baseline_system]
            else:
                pairs = list(combinations(present, 2))
            for sa, sb in pairs:
                if rng.random() < 0.5:
                    sa, sb = sb, sa
                items.append(
                    Item(
                        campaign=camp, key=key[:300], prompt=r["prompt"], references=r["references"],
                        system_a=sa, output_a=outs[sa], metrics_a=r["metrics"].get(sa, {}),
                        system_b=sb, output_b=outs[sb], metrics_b=r["metrics"].get(sb, {}),
                    )
                )  # fmt: skip
        else:
            for s, text in outs.items():
                items.append(
                    Item(campaign=camp, key=key[:300], prompt=r["prompt"], references=r["references"],
                         system_a=s, output_a=text, metrics_a=r["metrics"].get(s, {}))
                )  # fmt: skip
    rng.shuffle(items)
    for i, it in enumerate(items):
        it.order = i
    Item.objects.bulk_create(items)
    return camp


# --------------------------------------------------------------------------------------------------
# Lifecycle, members, invites
# --------------------------------------------------------------------------------------------------


def start_problems(camp: Campaign) -> list[str]:
    """Why a campaign cannot start yet (empty when it can)."""
    problems = []
    n_items = camp.items.filter(gold="").count()
    if n_items == 0:
        problems.append("the campaign has no items to judge (gold items alone are not enough)")
    members = camp.memberships.count()
    if members < camp.overlap:
        problems.append(
            f"not enough annotators: {members} joined, but each item needs {camp.overlap} judgments from different "
            f"annotators (overlap {camp.overlap}); invite {camp.overlap - members} more or lower the overlap"
        )
    if camp.kind == CampaignKind.LIKERT and not camp.axes:
        problems.append("a Likert campaign needs at least one axis")
    return problems


def start_campaign(camp: Campaign) -> Campaign:
    """Draft/closed → active, if ``start_problems`` finds nothing; ``camp`` is refreshed in place."""
    with transaction.atomic():
        locked = Campaign.objects.select_for_update().get(pk=camp.pk)
        if locked.status != CampaignStatus.ACTIVE:
            problems = start_problems(locked)
            if problems:
                raise AnnotationError("Cannot start: " + "; ".join(problems) + ".")
            locked.status = CampaignStatus.ACTIVE
            locked.started_at = locked.started_at or timezone.now()
            locked.closed_at = None
            locked.save()
    camp.refresh_from_db()
    return camp


def close_campaign(camp: Campaign) -> Campaign:
    Campaign.objects.filter(pk=camp.pk).update(status=CampaignStatus.CLOSED, closed_at=timezone.now())
    camp.refresh_from_db()
    return camp


def update_settings(camp: Campaign, **kw: Any) -> Campaign:
    """Overlap may change while active only upwards (lowering it could strand judged slots)."""
    if "overlap" in kw and kw["overlap"] is not None:
        ov = int(kw["overlap"])
        if ov < 1:
            raise AnnotationError("overlap must be at least 1")
        if camp.status != CampaignStatus.DRAFT and ov < camp.overlap:
            raise AnnotationError("overlap can only be raised once a campaign has started")
        camp.overlap = ov
    for field in ("name", "instructions"):
        if kw.get(field) is not None:
            setattr(camp, field, kw[field])
    if kw.get("axes") is not None and camp.kind == CampaignKind.LIKERT:
        camp.axes = _clean_axes(kw["axes"])
    if kw.get("examples") is not None:
        camp.examples = kw["examples"]
    camp.save()
    return camp


def annotator_group() -> Group:
    return Group.objects.get_or_create(name="annotator")[0]


def add_member(camp: Campaign, user: Any, invite: Invite | None = None) -> Membership:
    m, _ = Membership.objects.get_or_create(campaign=camp, user=user, defaults={"invite": invite})
    return m


def create_invite(camp: Campaign, user: Any = None, max_uses: int | None = None) -> Invite:
    return Invite.objects.create(campaign=camp, created_by=user, max_uses=max_uses)


def invite_for_token(token: str) -> Invite:
    inv = Invite.objects.select_related("campaign").filter(token=token).first()
    if inv is None or not inv.active:
        raise AnnotationError("this invite link is not valid")
    if inv.max_uses is not None and inv.uses >= inv.max_uses:
        raise AnnotationError("this invite link has been used up")
    if inv.campaign.status == CampaignStatus.CLOSED:
        raise AnnotationError("this campaign is closed")
    return inv


def accept_invite(token: str, user: Any) -> Membership:
    """Join the invite's campaign; a user without any role becomes an annotator (never more)."""
    from webapp.access import role_of

    with transaction.atomic():
        inv = Invite.objects.select_for_update().filter(token=token).first()
        if inv is None:
            raise AnnotationError("this invite link is not valid")
        invite_for_token(token)
        if role_of(user) is None:
            user.groups.add(annotator_group())
        existed = Membership.objects.filter(campaign=inv.campaign, user=user).exists()
        m = add_member(inv.campaign, user, inv)
        if not existed:
            Invite.objects.filter(pk=inv.pk).update(uses=F("uses") + 1)
    return m


def signup_with_invite(token: str, username: str, password: str) -> Any:
    """Create an annotator-only account from an invite link and join the campaign."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    User = get_user_model()
    invite_for_token(token)
    username = (username or "").strip()
    if not username:
        raise AnnotationError("choose a user name")
    try:
        User.username_validator(username)
        User._meta.get_field("username").run_validators(username)
    except ValidationError as exc:
        raise AnnotationError(" ".join(exc.messages)) from None
    if User.objects.filter(username__iexact=username).exists():
        raise AnnotationError("this user name is taken")
    try:
        validate_password(password)
    except ValidationError as exc:
        raise AnnotationError(" ".join(exc.messages)) from None
    with transaction.atomic():
        user = User.objects.create_user(username=username, password=password)
        user.groups.add(annotator_group())
        accept_invite(token, user)
    return user


def campaigns_for_annotator(user: Any) -> list[Campaign]:
    return list(
        Campaign.objects.filter(memberships__user=user, status=CampaignStatus.ACTIVE)
        .order_by("-created")
        .distinct()
    )


def is_member(camp: Campaign, user: Any) -> bool:
    return Membership.objects.filter(campaign=camp, user=user).exists()


# --------------------------------------------------------------------------------------------------
# Assignment and judgments
# --------------------------------------------------------------------------------------------------


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
    """The user's open assignment, or a newly reserved slot on the least-judged eligible item.

    Eligible: in this campaign, fewer than ``overlap`` slots taken, never assigned to this user.
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
                item = (
                    eligible.select_for_update(skip_locked=skip)
                    .order_by("slots_taken", "order", "id")
                    .first()
                )
                if item is None:
                    if eligible.exists():
                        continue
                    stale = Assignment.objects.filter(
                        campaign=camp, status=AssignmentStatus.OPEN, expires_at__lt=now
                    )
                    if not reclaimed and stale.exists():
                        # Abandoned reservations only matter once nothing else is left.
                        raise _Reclaim
                    return None
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
    return None


class _Reclaim(Exception):
    """Leave the item transaction, give back expired slots, then look again."""


def _soft_commit() -> None:
    """A reservation is soft state: after a crash it is simply gone and the annotator gets another
    item, while judgments (separate transactions) stay fully durable. Not waiting for the WAL flush
    here halves the fsyncs of a round trip (see docs/benchmarks.md)."""
    from django.db import connection

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
    """Give the slot back; the item is not offered to this user again."""
    with transaction.atomic():
        a = Assignment.objects.select_for_update().filter(token=str(token or "")).first()
        if a is None or a.annotator_id != user.pk:
            raise Rejected("this item is not assigned to you")
        if a.status != AssignmentStatus.OPEN:
            raise Rejected("this item is no longer open")
        a.status = AssignmentStatus.SKIPPED
        a.save(update_fields=["status"])
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
        a.token = Invite._meta.get_field("token").default()
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
    return {"done": done, "total": done + open_now + available}


def display_item(a: Assignment) -> dict[str, Any]:
    """What an annotator may see: no system ids, no metrics, no run links."""
    it = a.item
    if it.system_b or it.output_b:
        left, right = (it.output_a, it.output_b) if a.left_is_a else (it.output_b, it.output_a)
    else:
        left, right = it.output_a, ""
    return {"token": a.token, "item_id": it.pk, "prompt": it.prompt, "left": left, "right": right}


# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------


def _judgment_rows(camp: Campaign) -> list[dict[str, Any]]:
    return list(
        Judgment.objects.filter(campaign=camp)
        .select_related("item")
        .values(
            "id", "annotator_id", "annotator__username", "item_id", "choice", "scores", "seconds", "rationale",
            "left_is_a", "created", "item__system_a", "item__system_b", "item__gold", "item__prompt",
            "item__output_a", "item__output_b", "item__metrics_a", "item__metrics_b", "item__key",
        )
        .order_by("id")
    )  # fmt: skip


def campaign_results(camp: Campaign, n_bootstrap: int = 1000) -> dict[str, Any]:
    """Everything the results page shows, in plain JSON-able values."""
    rows = _judgment_rows(camp)
    real = [r for r in rows if not r["item__gold"]]
    out: dict[str, Any] = {
        "kind": camp.kind,
        "n_judgments": len(rows),
        "n_items": camp.items.filter(gold="").count(),
        "n_items_complete": camp.items.filter(gold="", judgment_count__gte=camp.overlap).count(),
        "systems": camp.systems,
        "labels": {s: camp.label(s) for s in camp.systems},
    }
    ann_names = {r["annotator_id"]: r["annotator__username"] for r in rows}
    if camp.kind == CampaignKind.PAIRWISE:
        comps = [(r["item__system_a"], r["item__system_b"], r["choice"]) for r in real]
        out["win_rates"] = stats.win_rate_matrix(comps, camp.systems)
        out["bradley_terry"] = stats.bradley_terry(comps, camp.systems, n_bootstrap=n_bootstrap)
        out["choice_counts"] = dict(Counter(r["choice"] for r in real))
        # Position bias: how often the LEFT output won among decided judgments.
        decided = [r for r in real if r["choice"] in ("a", "b")]
        left_wins = sum(1 for r in decided if (r["choice"] == "a") == r["left_is_a"])
        out["left_win_rate"] = left_wins / len(decided) if decided else None
        labels_by_item: dict[int, list[str]] = defaultdict(list)
        by_ann: dict[int, dict[int, str]] = defaultdict(dict)
        for r in rows:
            labels_by_item[r["item_id"]].append(r["choice"])
            by_ann[r["annotator_id"]][r["item_id"]] = r["choice"]
        multi = [v for v in labels_by_item.values() if len(v) >= 2]
        out["agreement"] = {
            "fleiss_kappa": stats.fleiss_kappa(stats.ratings_to_table(multi, list(Choice.values)))
            if multi
            else None,
            "krippendorff_alpha": stats.krippendorff_alpha(multi, "nominal"),
            "krippendorff_level": "nominal",
            "cohen": [
                {**c, "a": ann_names[c["a"]], "b": ann_names[c["b"]]}
                for c in stats.pairwise_cohen(by_ann, min_common=2)
            ],
            "n_multi": len(multi),
        }
        ann_rows = [
            {"annotator": r["annotator__username"], "item": r["item_id"], "label": r["choice"], "seconds": r["seconds"],
             "gold": r["item__gold"] or None}
            for r in rows
        ]  # fmt: skip
        # Metric–human agreement on items whose judgments have a majority a/b decision.
        per_item: dict[int, dict[str, Any]] = {}
        for r in real:
            d = per_item.setdefault(
                r["item_id"], {"labels": [], "ma": r["item__metrics_a"], "mb": r["item__metrics_b"]}
            )
            d["labels"].append(r["choice"])
        pairs = []
        for d in per_item.values():
            maj = stats.majority_label(d["labels"])
            names = set(d["ma"] or {}) & set(d["mb"] or {})
            pairs.append({"human": maj, "metrics": {n: (d["ma"][n], d["mb"][n]) for n in names}})
        out["metric_agreement"] = stats.metric_human_agreement(pairs)
    else:
        triples = []
        for r in real:
            for ax, v in (r["scores"] or {}).items():
                triples.append((r["item__system_a"], ax, v))
        out["likert"] = stats.likert_means(triples)
        out["axes"] = [a["name"] for a in camp.axes]
        agreement = {}
        for ax in out["axes"]:
            units: dict[int, list[int]] = defaultdict(list)
            by_ann: dict[int, dict[int, int]] = defaultdict(dict)
            for r in rows:
                if ax in (r["scores"] or {}):
                    units[r["item_id"]].append(r["scores"][ax])
                    by_ann[r["annotator_id"]][r["item_id"]] = r["scores"][ax]
            multi = [v for v in units.values() if len(v) >= 2]
            agreement[ax] = {
                "krippendorff_alpha": stats.krippendorff_alpha(multi, "ordinal", values=[1, 2, 3, 4, 5]),
                "fleiss_kappa": stats.fleiss_kappa(stats.ratings_to_table(multi, [1, 2, 3, 4, 5]))
                if multi
                else None,
                "cohen": [
                    {**c, "a": ann_names[c["a"]], "b": ann_names[c["b"]]}
                    for c in stats.pairwise_cohen(by_ann, 2)
                ],
                "n_multi": len(multi),
            }
        out["agreement"] = {"per_axis": agreement, "krippendorff_level": "ordinal"}
        ann_rows = []
        for r in rows:
            sc = r["scores"] or {}
            ann_rows.append(
                {"annotator": r["annotator__username"], "item": r["item_id"],
                 "label": tuple(sc.get(a) for a in out["axes"]), "seconds": r["seconds"], "gold": None}
            )  # fmt: skip
        # Metric–human agreement for Likert: pairs of systems on the same prompt, mean score per axis.
        item_scores: dict[int, dict[str, Any]] = {}
        for r in real:
            d = item_scores.setdefault(
                r["item_id"],
                {"key": r["item__key"], "sys": r["item__system_a"], "m": r["item__metrics_a"], "s": []},
            )
            d["s"].append(sum((r["scores"] or {}).values()) / max(1, len(r["scores"] or {})))
        by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for d in item_scores.values():
            by_key[d["key"]].append(d)
        pairs = []
        for group in by_key.values():
            for x, y in combinations(group, 2):
                mx, my = sum(x["s"]) / len(x["s"]), sum(y["s"]) / len(y["s"])
                human = "a" if mx > my else "b" if my > mx else None
                names = set(x["m"] or {}) & set(y["m"] or {})
                pairs.append({"human": human, "metrics": {n: (x["m"][n], y["m"][n]) for n in names}})
        out["metric_agreement"] = stats.metric_human_agreement(pairs)
    out["annotators"] = stats.annotator_stats(ann_rows)
    return out


def human_eval_for_run(run: Any) -> list[dict[str, Any]]:
    """Human-evaluation results of every started campaign that judged this run (for run pages)."""
    system = run_system(run.pk)
    out = []
    for camp in Campaign.objects.exclude(status=CampaignStatus.DRAFT).filter(systems__contains=[system]):
        if not camp.judgments.exists():
            continue
        res = campaign_results(camp, n_bootstrap=200)
        entry: dict[str, Any] = {
            "campaign_id": camp.pk, "campaign": camp.name, "kind": camp.kind, "status": camp.status,
            "n_judgments": res["n_judgments"], "n_systems": len(camp.systems),
        }  # fmt: skip
        if camp.kind == CampaignKind.PAIRWISE:
            bt = res["bradley_terry"]
            i = bt["systems"].index(system)
            entry.update(rating=bt["rating"][i], low=bt["low"][i], high=bt["high"][i], rank=bt["rank"][i])
            ov = next(o for o in res["win_rates"]["overall"] if o["system"] == system)
            entry.update(win_rate=ov["rate"], win_low=ov["low"], win_high=ov["high"])
        else:
            entry["likert"] = {ax: res["likert"].get(ax, {}).get(system) for ax in res["axes"]}
        out.append(entry)
    return out


def leaderboard() -> list[dict[str, Any]]:
    """One table per started pairwise campaign: systems ordered by Bradley–Terry rating."""
    boards = []
    for camp in Campaign.objects.exclude(status=CampaignStatus.DRAFT).filter(kind=CampaignKind.PAIRWISE):
        if not camp.judgments.exists():
            continue
        res = campaign_results(camp, n_bootstrap=200)
        bt = res["bradley_terry"]
        overall = {o["system"]: o for o in res["win_rates"]["overall"]}
        rows = []
        for i, s in enumerate(bt["systems"]):
            rows.append(
                {"system": s, "label": camp.label(s), "run_id": int(s[4:]) if s.startswith("run:") else None,
                 "rating": bt["rating"][i], "low": bt["low"][i], "high": bt["high"][i], "rank": bt["rank"][i],
                 "win_rate": overall[s]["rate"], "n": overall[s]["n"]}
            )  # fmt: skip
        rows.sort(key=lambda r: -r["rating"])
        boards.append({"campaign": camp, "rows": rows, "n_judgments": res["n_judgments"]})
    return boards


# --------------------------------------------------------------------------------------------------
# Exports and reward models
# --------------------------------------------------------------------------------------------------


def preference_pairs(camp: Campaign, include_gold: bool = False) -> list[dict[str, Any]]:
    """Every decided pairwise judgment as ``{prompt, chosen, rejected, meta}`` (ties/both-bad dropped)."""
    out = []
    for r in _judgment_rows(camp):
        if r["choice"] not in ("a", "b") or (r["item__gold"] and not include_gold):
            continue
        a_won = r["choice"] == "a"
        out.append(
            {
                "prompt": r["item__prompt"],
                "chosen": r["item__output_a"] if a_won else r["item__output_b"],
                "rejected": r["item__output_b"] if a_won else r["item__output_a"],
                "meta": {
                    "campaign": camp.pk, "item": r["item_id"], "judgment": r["id"], "annotator": r["annotator_id"],
                    "system_chosen": r["item__system_a"] if a_won else r["item__system_b"],
                    "system_rejected": r["item__system_b"] if a_won else r["item__system_a"],
                    "rationale": r["rationale"], "seconds": r["seconds"], "gold": bool(r["item__gold"]),
                },
            }
        )  # fmt: skip
    return out


def export_jsonl(camp: Campaign) -> str:
    return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in preference_pairs(camp))


CSV_FIELDS = [
    "judgment", "campaign", "item", "annotator", "system_a", "system_b", "choice", "winner", "left_is_a",
    "scores", "seconds", "rationale", "gold", "created", "prompt", "output_a", "output_b",
]  # fmt: skip


def _cell(value: Any) -> Any:
    """Neutralise spreadsheet formulas in user/model text ("=HYPERLINK(...)" opened in Excel)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def export_csv(camp: Campaign) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_FIELDS)
    for r in _judgment_rows(camp):
        winner = (
            r["item__system_a"] if r["choice"] == "a" else r["item__system_b"] if r["choice"] == "b" else ""
        )
        w.writerow(
            [_cell(v) for v in [r["id"], camp.pk, r["item_id"], r["annotator__username"], r["item__system_a"], r["item__system_b"],
             r["choice"], winner, r["left_is_a"], json.dumps(r["scores"] or {}), r["seconds"], r["rationale"],
             r["item__gold"], r["created"].isoformat(), r["item__prompt"], r["item__output_a"], r["item__output_b"]]]
        )  # fmt: skip
    return buf.getvalue()


def reward_models_dir() -> Path:
    """Where trained reward models are written: $GRUE_REWARD_MODELS_DIR, else <runs dir>/reward_models
    (inside the allowed roots, so a launch form may point the learned reward at it)."""
    import os

    env = os.environ.get("GRUE_REWARD_MODELS_DIR")
    if env:
        return Path(env)
    return Path(getattr(settings, "RUNS_DIR", Path("var") / "runs")) / "reward_models"


@dataclass
class TrainRequest:
    name: str
    backbone: str = "minilm"
    epochs: float = 3.0
    learning_rate: float = 5e-5
    batch_size: int = 16
    max_length: int = 128
    heldout_fraction: float = 0.2
    include_prompt: bool = False


def create_reward_model(
    camp: Campaign, req: TrainRequest, user: Any = None, enqueue: bool = True
) -> RewardModel:
    """Register a reward model and queue its training (Celery) after the transaction commits."""
    if camp.kind != CampaignKind.PAIRWISE:
        raise AnnotationError("reward models are trained from pairwise judgments")
    n = len(preference_pairs(camp))
    if n < 4:
        raise AnnotationError(f"need at least 4 decided pairwise judgments to train a reward model, have {n}")
    backbone = (req.backbone or "minilm").strip()
    if backbone not in ("minilm", "default") and not backbone.startswith("builtin:"):
        from webapp.runs.services import check_path

        # A local directory typed into a form must stay inside the allowed roots; hub names have no "/" prefix.
        if backbone.startswith(("/", ".", "~")):
            backbone = str(check_path(backbone))
    with transaction.atomic():
        rm = RewardModel.objects.create(
            name=req.name or f"{camp.name} reward model", campaign=camp, backbone=backbone,
            params={k: v for k, v in req.__dict__.items() if k not in ("name", "backbone")},
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )  # fmt: skip
        rm.path = str(reward_models_dir() / f"rm-{rm.pk}")
        rm.save(update_fields=["path"])
        if enqueue:
            rm_id = rm.pk
            transaction.on_commit(lambda: _enqueue_training(rm_id))
    return rm


def _enqueue_training(rm_id: int) -> None:
    from annotation.tasks import train_reward_model

    try:
        from webapp.runs.services import run_queue

        queue = run_queue()
    except Exception:  # noqa: BLE001 - fall back to Celery's default queue
        queue = None
    try:
        res = train_reward_model.apply_async(args=[rm_id], queue=queue, retry=False)
    except Exception as exc:  # noqa: BLE001 - broker down
        RewardModel.objects.filter(pk=rm_id).update(
            status=RewardModelStatus.FAILED, error=f"could not queue: {exc}"
        )
        return
    RewardModel.objects.filter(pk=rm_id).update(task_id=res.id or "")


def run_reward_training(rm_id: int, should_stop: Any = None) -> RewardModel:
    """Train (in the current process) and record progress/metrics; used by the Celery task."""
    from engine.reward_model import parse_pairs, train_reward_model

    rm = RewardModel.objects.select_related("campaign").get(pk=rm_id)
    RewardModel.objects.filter(pk=rm_id).update(status=RewardModelStatus.RUNNING, progress=0.0, error="")
    try:
        pairs = parse_pairs(
            [json.dumps(p) for p in preference_pairs(rm.campaign)], source=f"campaign {rm.campaign_id}"
        )
        p = rm.params or {}
        last = {"t": 0.0}

        def progress(step: int, total: int, info: dict[str, Any]) -> None:
            import time

            now = time.time()
            if step == total or now - last["t"] > 0.5:
                last["t"] = now
                RewardModel.objects.filter(pk=rm_id).update(
                    progress=step / total, metrics={"step": step, "total": total, "loss": info.get("loss")}
                )

        res = train_reward_model(
            pairs, rm.path, backbone=rm.backbone, epochs=float(p.get("epochs", 3.0)),
            learning_rate=float(p.get("learning_rate", 5e-5)), batch_size=int(p.get("batch_size", 16)),
            max_length=int(p.get("max_length", 128)), heldout_fraction=float(p.get("heldout_fraction", 0.2)),
            include_prompt=bool(p.get("include_prompt", False)), progress=progress, should_stop=should_stop,
        )  # fmt: skip
    except Exception as exc:
        RewardModel.objects.filter(pk=rm_id).update(
            status=RewardModelStatus.FAILED, error=f"{type(exc).__name__}: {exc}", finished_at=timezone.now()
        )
        raise
    RewardModel.objects.filter(pk=rm_id).update(
        status=RewardModelStatus.SUCCEEDED, progress=1.0, metrics=res.to_dict(), finished_at=timezone.now()
    )
    return RewardModel.objects.get(pk=rm_id)


def learned_reward_config(rm: RewardModel) -> dict[str, Any]:
    return {"id": "learned", "args": {"model_path": rm.path, "label_index": 0}}


def reward_choices() -> list[dict[str, Any]]:
    """Trained reward models as launch-form choices: [{"label", "reward": RewardConfig dict}]."""
    out = []
    for rm in RewardModel.objects.filter(status=RewardModelStatus.SUCCEEDED).order_by("-created"):
        acc = (rm.metrics or {}).get("heldout_accuracy")
        acc_s = f", held-out acc {acc:.2f}" if isinstance(acc, int | float) else ""
        out.append(
            {"label": f"Learned reward: {rm.name} (#{rm.pk}{acc_s})", "reward": learned_reward_config(rm)}
        )
    return out


def campaign_counts(qs: Iterable[Campaign]) -> list[dict[str, Any]]:
    ids = [c.pk for c in qs]
    items = dict(
        Item.objects.filter(campaign_id__in=ids)
        .values_list("campaign_id")
        .annotate(n=Count("id"))
        .values_list("campaign_id", "n")
    )
    judg = dict(
        Judgment.objects.filter(campaign_id__in=ids)
        .values_list("campaign_id")
        .annotate(n=Count("id"))
        .values_list("campaign_id", "n")
    )
    members = dict(
        Membership.objects.filter(campaign_id__in=ids)
        .values_list("campaign_id")
        .annotate(n=Count("id"))
        .values_list("campaign_id", "n")
    )
    return [
        {
            "campaign": c,
            "items": items.get(c.pk, 0),
            "judgments": judg.get(c.pk, 0),
            "members": members.get(c.pk, 0),
        }
        for c in qs
    ]


__all__ = [
    "AnnotationError", "Rejected", "UploadError", "accept_invite", "campaign_results", "create_campaign_from_runs",
    "create_campaign_from_upload", "create_invite", "export_csv", "export_jsonl", "human_eval_for_run", "next_item",
    "record_judgment", "reward_choices", "skip_item", "start_campaign", "undo_last",
]  # fmt: skip
