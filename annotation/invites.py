"""Who may annotate a campaign: members, invite links, and sign-up through an invite.

An invite link is a bearer secret, so it is short-lived and narrow by default: it expires after
``ANNOTATION_INVITE_DAYS`` (3) days, admits one person (``max_uses=1``), and can be revoked from
the campaign page. The link carries the token in the URL *fragment* (``/annotate/join/#<token>``),
which browsers never send to the server, so it cannot land in the web server's access log; the
join page posts it, keeps it in the session and continues on the clean URL ``/annotate/join/``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import get_password_validators, validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from annotation.errors import AnnotationError
from annotation.models import Campaign, CampaignStatus, Invite, Membership
from webapp.access import role_of

MAX_INVITE_DAYS = 90
MAX_INVITE_USES = 10_000

# Sign-up through an invite always runs Django's standard validators (whatever the project lists
# too): an invite link is the one way strangers create accounts, so "12345678" must not pass.
SIGNUP_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 8}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]


def default_invite_days() -> float:
    return float(getattr(settings, "ANNOTATION_INVITE_DAYS", 3))


def annotator_group() -> Group:
    return Group.objects.get_or_create(name="annotator")[0]


def add_member(camp: Campaign, user: Any, invite: Invite | None = None) -> Membership:
    m, _ = Membership.objects.get_or_create(campaign=camp, user=user, defaults={"invite": invite})
    return m


def is_member(camp: Campaign, user: Any) -> bool:
    return Membership.objects.filter(campaign=camp, user=user).exists()


def campaigns_for_annotator(user: Any) -> list[Campaign]:
    return list(
        Campaign.objects.filter(memberships__user=user, status=CampaignStatus.ACTIVE)
        .order_by("-created")
        .distinct()
    )


def create_invite(
    camp: Campaign, user: Any = None, max_uses: int | None = 1, days: float | None = None
) -> Invite:
    """A new link: single use and a few days by default; ``max_uses=None`` means unlimited."""
    if max_uses is not None and not 1 <= int(max_uses) <= MAX_INVITE_USES:
        raise AnnotationError(f"max uses must be between 1 and {MAX_INVITE_USES}")
    days = default_invite_days() if days is None else float(days)
    if not 0 < days <= MAX_INVITE_DAYS:
        raise AnnotationError(f"an invite must expire within 1 to {MAX_INVITE_DAYS} days")
    return Invite.objects.create(
        campaign=camp,
        created_by=user if getattr(user, "is_authenticated", False) else None,
        max_uses=max_uses,
        expires_at=timezone.now() + timedelta(days=days),
    )


def revoke_invite(camp: Campaign, invite_id: int | None) -> Invite:
    inv = Invite.objects.filter(campaign=camp, pk=invite_id).first()
    if inv is None:
        raise AnnotationError("no such invite link in this campaign")
    Invite.objects.filter(pk=inv.pk).update(active=False, revoked_at=timezone.now())
    inv.refresh_from_db()
    return inv


def live_invites(camp: Campaign) -> list[Invite]:
    """Links that would still admit someone (for the campaign page)."""
    now = timezone.now()
    return [
        inv
        for inv in camp.invites.filter(active=True).order_by("-created")
        if (inv.expires_at is None or inv.expires_at > now)
        and (inv.max_uses is None or inv.uses < inv.max_uses)
    ]


def invite_for_token(token: str) -> Invite:
    """The invite a token opens, or the reason it does not (revoked, expired, used up, closed)."""
    inv = Invite.objects.select_related("campaign").filter(token=str(token or "")).first() if token else None
    if inv is None:
        raise AnnotationError("this invite link is not valid")
    if not inv.active:
        raise AnnotationError("this invite link was revoked")
    if inv.expires_at is not None and inv.expires_at <= timezone.now():
        raise AnnotationError("this invite link has expired; ask for a new one")
    if inv.max_uses is not None and inv.uses >= inv.max_uses:
        raise AnnotationError("this invite link has been used up")
    if inv.campaign.status == CampaignStatus.CLOSED:
        raise AnnotationError("this campaign is closed")
    return inv


def accept_invite(token: str, user: Any) -> Membership:
    """Join the invite's campaign; a user without any role becomes an annotator (never more)."""
    with transaction.atomic():
        inv = Invite.objects.select_for_update().filter(token=str(token or "")).first()
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


def _signup_validators() -> list[Any]:
    names = {v["NAME"] for v in SIGNUP_PASSWORD_VALIDATORS}
    extra = [v for v in getattr(settings, "AUTH_PASSWORD_VALIDATORS", []) if v.get("NAME") not in names]
    return get_password_validators(SIGNUP_PASSWORD_VALIDATORS + extra)


def signup_with_invite(token: str, username: str, password: str) -> Any:
    """Create an annotator-only account from an invite link and join the campaign."""
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
        validate_password(password, User(username=username), password_validators=_signup_validators())
    except ValidationError as exc:
        raise AnnotationError(" ".join(exc.messages)) from None
    with transaction.atomic():
        user = User.objects.create_user(username=username, password=password)
        user.groups.add(annotator_group())
        accept_invite(token, user)
    return user
