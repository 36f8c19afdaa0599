"""Annotation pages. Thin: parse the request, call the service modules, render.

Two audiences with a hard wall between them: researchers (``researcher_required``) manage
campaigns and see results; annotators (``annotator_required`` + campaign membership) see only
the item in front of them, never system ids, runs, metrics or anyone else's judgments. A
campaign that a user is not a member of answers 404, so its existence is not revealed.
"""

from __future__ import annotations

import json
import math
from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_POST

from annotation import (
    ai_judges,
    assignment,
    campaigns,
    dpo,
    exports,
    invites,
    results,
    reward_models,
    uploads,
)
from annotation.errors import AnnotationError, UploadError
from annotation.models import (
    AXES_PRESETS,
    DEFAULT_AXES,
    AIJudge,
    AIJudgeKind,
    Campaign,
    CampaignKind,
    CampaignStatus,
    Pairing,
    RewardModel,
)
from annotation.pairs import preference_pairs
from webapp.access import annotator_required, is_researcher, researcher_required, role_of
from webapp.runs.models import Run


def _clean(obj: Any) -> Any:
    """JSON for the page: NaN/inf become null, tuple keys become strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def _wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


# ------------------------------------------------------------------------------------ annotators


@annotator_required
def home(request: HttpRequest) -> HttpResponse:
    rows = []
    for c in invites.campaigns_for_annotator(request.user):
        rows.append({"campaign": c, "progress": assignment.progress_for(c, request.user)})
    return render(request, "annotation/home.html", {"rows": rows, "researcher": is_researcher(request.user)})


INVITE_SESSION_KEY = "annotation_invite_token"


def join_legacy(request: HttpRequest, token: str) -> HttpResponse:
    """Old-style link with the token in the path: keep the token in the session and continue on the
    clean URL (this first request is in the access log; new links put the token in the fragment)."""
    request.session[INVITE_SESSION_KEY] = token
    return redirect("annotation:join")


@sensitive_post_parameters("password", "token")
@never_cache
def join(request: HttpRequest) -> HttpResponse:
    """Invite links ``/annotate/join/#<token>``: the page posts the fragment's token (browsers never
    send fragments, so it is in no access log), which is kept in the session; a logged-in user then
    joins, a visitor creates an annotator-only account."""
    if request.method == "POST" and "token" in request.POST:
        request.session[INVITE_SESSION_KEY] = request.POST.get("token", "").strip()
        return redirect("annotation:join")
    token = request.session.get(INVITE_SESSION_KEY, "")
    if not token:
        return render(request, "annotation/join.html", {"ask_code": True})
    try:
        inv = invites.invite_for_token(token)
    except AnnotationError as exc:
        request.session.pop(INVITE_SESSION_KEY, None)
        return render(request, "annotation/join.html", {"error": str(exc), "ask_code": True}, status=404)
    if request.method == "POST":
        try:
            if request.user.is_authenticated:
                invites.accept_invite(token, request.user)
            else:
                user = invites.signup_with_invite(
                    token, request.POST.get("username", ""), request.POST.get("password", "")
                )
                login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        except AnnotationError as exc:
            return render(
                request, "annotation/join.html",
                {"invite": inv, "error": str(exc), "username": request.POST.get("username", "")}, status=400,
            )  # fmt: skip
        request.session.pop(INVITE_SESSION_KEY, None)
        return redirect("annotation:annotate", pk=inv.campaign_id)
    return render(request, "annotation/join.html", {"invite": inv})


def _member_campaign(request: HttpRequest, pk: int) -> Campaign:
    camp = get_object_or_404(Campaign, pk=pk)
    if not invites.is_member(camp, request.user):
        raise Http404("no such campaign")
    return camp


@annotator_required
def annotate(request: HttpRequest, pk: int) -> HttpResponse:
    camp = _member_campaign(request, pk)
    if camp.status != CampaignStatus.ACTIVE:
        return render(request, "annotation/annotate_closed.html", {"campaign": camp})
    a = assignment.next_item(camp, request.user)
    progress = assignment.progress_for(camp, request.user)
    ctx: dict[str, Any] = {
        "campaign": camp,
        "progress": progress,
        "pairwise": camp.kind == CampaignKind.PAIRWISE,
    }
    if a is None:
        return render(request, "annotation/annotate_done.html", ctx)
    ctx["item"] = assignment.display_item(a)
    ctx["axes"] = [
        {"name": ax["name"], "options": [(i + 1, label) for i, label in enumerate(ax["labels"])]}
        for ax in camp.axes
    ]
    ctx["examples"] = camp.examples if isinstance(camp.examples, list) else []
    return render(request, "annotation/annotate.html", ctx)


@annotator_required
@require_POST
def submit(request: HttpRequest, pk: int) -> HttpResponse:
    camp = _member_campaign(request, pk)
    scores = {}
    for ax in camp.axes:
        if f"score_{ax['name']}" in request.POST:
            scores[ax["name"]] = request.POST.get(f"score_{ax['name']}")
    try:
        seconds = float(request.POST.get("seconds", ""))
    except ValueError:
        seconds = None
    try:
        item_id = int(request.POST.get("item_id", ""))
    except ValueError:
        item_id = -1
    try:
        assignment.record_judgment(
            request.user, request.POST.get("token", ""), item_id=item_id, choice=request.POST.get("choice"),
            scores=scores, rationale=request.POST.get("rationale", ""), seconds=seconds,
        )  # fmt: skip
    except AnnotationError as exc:
        if _wants_json(request):
            return JsonResponse({"ok": False, "error": str(exc)}, status=409)
        messages.error(request, f"Not saved: {exc}")
        return redirect("annotation:annotate", pk=camp.pk)
    if _wants_json(request):
        return JsonResponse({"ok": True})
    return redirect("annotation:annotate", pk=camp.pk)


@annotator_required
@require_POST
def skip(request: HttpRequest, pk: int) -> HttpResponse:
    camp = _member_campaign(request, pk)
    try:
        assignment.skip_item(request.user, request.POST.get("token", ""))
    except AnnotationError as exc:
        messages.error(request, str(exc))
    return redirect("annotation:annotate", pk=camp.pk)


@annotator_required
@require_POST
def undo(request: HttpRequest, pk: int) -> HttpResponse:
    camp = _member_campaign(request, pk)
    try:
        a = assignment.undo_last(camp, request.user)
    except AnnotationError as exc:
        messages.error(request, str(exc))
    else:
        if a is None:
            messages.info(request, "Nothing to undo.")
        else:
            messages.info(request, "Your last judgment was withdrawn; judge the item again.")
    return redirect("annotation:annotate", pk=camp.pk)


# ------------------------------------------------------------------------------------ researchers


@researcher_required
def campaign_list(request: HttpRequest) -> HttpResponse:
    rows = campaigns.campaign_counts(list(Campaign.objects.all()[:500]))
    return render(request, "annotation/campaign_list.html", {"rows": rows})


def _int(value: Any, default: int | None = None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _float(value: Any, default: float | None = None) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def _settings_from_post(post: Any) -> dict[str, Any]:
    kind = post.get("kind", CampaignKind.PAIRWISE)
    out: dict[str, Any] = {
        "kind": kind,
        "overlap": _int(post.get("overlap"), 3),
        "pairing": post.get("pairing", Pairing.ALL_PAIRS),
        "assignment_mode": post.get("assignment_mode", "uniform"),
        "instructions": post.get("instructions", ""),
    }
    if kind == CampaignKind.LIKERT:
        preset = post.get("axes_preset", "")
        if preset:
            if preset not in AXES_PRESETS:
                raise AnnotationError(f"unknown axes preset {preset!r}")
            out["axes"] = AXES_PRESETS[preset]
        elif post.get("axes", "").strip():
            out["axes"] = campaigns.parse_axes_text(post["axes"])
    return out


def _runs_with_samples() -> list[Any]:
    return list(
        Run.objects.annotate(n_samples=Count("samples")).filter(n_samples__gt=0).order_by("-created")[:300]
    )


@researcher_required
def campaign_new(request: HttpRequest) -> HttpResponse:
    ctx: dict[str, Any] = {
        "runs": _runs_with_samples(),
        "default_axes": campaigns.axes_to_text(DEFAULT_AXES),
        "axes_presets": sorted(AXES_PRESETS),
        "post": request.POST,
        "selected": [],
    }
    if request.method == "POST":
        run_ids = [r for r in (_int(x) for x in request.POST.getlist("runs")) if r is not None]
        ctx["selected"] = run_ids
        try:
            kw = _settings_from_post(request.POST)
            camp = campaigns.create_campaign_from_runs(
                request.POST.get("name", ""), run_ids, user=request.user,
                split=request.POST.get("split") or None, baseline_run=_int(request.POST.get("baseline")),
                max_items=_int(request.POST.get("max_items")), **kw,
            )  # fmt: skip
        except AnnotationError as exc:
            ctx["error"] = str(exc)
            return render(request, "annotation/campaign_new.html", ctx, status=400)
        how = campaigns.describe_match(camp.build_report, camp.system_labels)
        messages.success(request, f"Campaign created with {camp.items.count()} items. Inputs: {how}")
        return redirect("annotation:campaign_detail", pk=camp.pk)
    return render(request, "annotation/campaign_new.html", ctx)


@researcher_required
def campaign_upload(request: HttpRequest) -> HttpResponse:
    ctx: dict[str, Any] = {
        "default_axes": campaigns.axes_to_text(DEFAULT_AXES),
        "axes_presets": sorted(AXES_PRESETS),
        "post": request.POST,
    }
    if request.method == "POST":
        f = request.FILES.get("file")
        try:
            if f is None:
                raise UploadError("choose a JSONL file to upload")
            if f.size > uploads.max_upload_bytes():
                raise UploadError(
                    f"file too large: {f.size:,} bytes (limit {uploads.max_upload_bytes():,}); split it"
                )
            kw = _settings_from_post(request.POST)
            camp = uploads.create_campaign_from_upload(
                request.POST.get("name", ""), f.read(), user=request.user,
                baseline_system=request.POST.get("baseline", "").strip(), **kw,
            )  # fmt: skip
        except AnnotationError as exc:
            ctx["error"] = f"Nothing was imported. {exc}"
            return render(request, "annotation/campaign_upload.html", ctx, status=400)
        messages.success(request, f"Campaign created with {camp.items.count()} items.")
        return redirect("annotation:campaign_detail", pk=camp.pk)
    return render(request, "annotation/campaign_upload.html", ctx)


def _ai_judge_action(request: HttpRequest, camp: Campaign, action: str) -> None:
    """The campaign page's AI-judge forms (researchers only, like the whole page)."""
    if action == "add_ai_judge":
        judge = ai_judges.create_judge(
            camp, name=request.POST.get("ai_name", ""), kind=request.POST.get("ai_kind", AIJudgeKind.LOCAL),
            model=request.POST.get("ai_model", ""), base_url=request.POST.get("ai_base_url", ""),
            api_key=request.POST.get("ai_api_key", ""), prompt_template=request.POST.get("ai_template", ""),
            user=request.user,
        )  # fmt: skip
        messages.success(request, f"AI judge {judge.name} added: run it to judge the items.")
        return
    judge = camp.ai_judges.filter(pk=_int(request.POST.get("judge_id"), -1)).first()
    if judge is None:
        raise AnnotationError("no such AI judge in this campaign")
    if action == "run_ai_judge":
        ai_judges.start_judging(judge)
        messages.success(request, f"AI judge {judge.name} queued: each item is judged twice, sides swapped.")
    elif action == "cancel_ai_judge":
        ai_judges.cancel_judging(judge)
        messages.success(request, f"AI judge {judge.name}: cancelling (the items already judged are kept).")
    elif action == "delete_ai_judge":
        ai_judges.delete_judge(judge)
        messages.success(request, f"AI judge {judge.name} and its judgments deleted.")


@sensitive_post_parameters("ai_api_key")
def _campaign_action(request: HttpRequest, camp: Campaign, action: str) -> None:
    """One POSTed action of the campaign page (start, close, invites, members, settings, AI judges);
    an ``AnnotationError`` becomes the page's error message."""
    if action.endswith("_ai_judge"):
        _ai_judge_action(request, camp, action)
    elif action == "start":
        campaigns.start_campaign(camp)
        messages.success(request, "Campaign started: annotators can now judge items.")
    elif action == "close":
        campaigns.close_campaign(camp)
        messages.success(request, "Campaign closed.")
    elif action == "invite":
        max_uses = _int(request.POST.get("max_uses"), 1)
        days = _float(request.POST.get("days"))
        inv = invites.create_invite(camp, request.user, max_uses=max_uses, days=days)
        messages.success(
            request,
            f"Invite link created (single use unless you chose more, expires {inv.expires_at:%Y-%m-%d %H:%M} UTC): "
            "copy it from the list below.",
        )
    elif action == "revoke_invite":
        invites.revoke_invite(camp, _int(request.POST.get("invite_id")))
        messages.success(request, "Invite link revoked: it no longer admits anyone.")
    elif action == "add_member":
        User = get_user_model()
        user = User.objects.filter(username=request.POST.get("username", "").strip()).first()
        if user is None:
            raise AnnotationError("no user with that name")
        if role_of(user) is None:
            user.groups.add(invites.annotator_group())
        invites.add_member(camp, user)
        messages.success(request, f"{user.username} added.")
    elif action == "remove_member":
        camp.memberships.filter(user_id=_int(request.POST.get("user_id"))).delete()
        messages.success(request, "Annotator removed (their judgments are kept).")
    elif action == "settings":
        kw: dict[str, Any] = {
            "name": request.POST.get("name"),
            "instructions": request.POST.get("instructions"),
            "overlap": _int(request.POST.get("overlap")),
            "assignment_mode": request.POST.get("assignment_mode"),
        }
        if camp.kind == CampaignKind.LIKERT and request.POST.get("axes", "").strip():
            kw["axes"] = campaigns.parse_axes_text(request.POST["axes"])
        if request.POST.get("examples", "").strip():
            try:
                ex = json.loads(request.POST["examples"])
            except json.JSONDecodeError as exc:
                raise AnnotationError(f"examples: invalid JSON ({exc.msg}, line {exc.lineno})") from None
            if not isinstance(ex, list):
                raise AnnotationError("examples: expected a JSON list")
            kw["examples"] = ex
        campaigns.update_settings(camp, **kw)
        messages.success(request, "Settings saved.")


@researcher_required
def campaign_detail(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    if request.method == "POST":
        try:
            _campaign_action(request, camp, request.POST.get("action", ""))
        except AnnotationError as exc:
            messages.error(request, str(exc))
        return redirect("annotation:campaign_detail", pk=camp.pk)
    ctx = {
        "campaign": camp,
        "problems": campaigns.start_problems(camp) if camp.status == CampaignStatus.DRAFT else [],
        "members": camp.memberships.select_related("user").order_by("joined"),
        "invites": invites.live_invites(camp),
        "default_invite_days": invites.default_invite_days(),
        "build_text": campaigns.describe_match(camp.build_report, camp.system_labels),
        "n_items": camp.items.count(),
        "n_gold": camp.items.exclude(gold="").count(),
        "n_judgments": camp.judgments.count(),
        "axes_text": campaigns.axes_to_text(camp.axes) if camp.axes else "",
        "examples_text": json.dumps(camp.examples, indent=1) if camp.examples else "",
        "systems": [(s, camp.label(s)) for s in camp.systems],
        "n_pairs": len(preference_pairs(camp)) if camp.kind == CampaignKind.PAIRWISE else 0,
        "join_url": request.build_absolute_uri(reverse("annotation:join")),
        "reward_models": [(rm, reward_models.heldout_summary(rm.metrics)) for rm in camp.reward_models.all()],
        "ai_judges": list(camp.ai_judges.all()),
        "ai_default_template": ai_judges.DEFAULT_TEMPLATE,
        "ai_kinds": AIJudgeKind.choices,
    }
    return render(request, "annotation/campaign_detail.html", ctx)


def ai_judge_state(judge: AIJudge) -> dict[str, Any]:
    """What the progress bar polls (never the API key)."""
    return {"id": judge.pk, "name": judge.name, "status": judge.status, "n_done": judge.n_done,
            "n_total": judge.n_total, "n_errors": judge.n_errors, "progress": judge.progress,
            "eta_seconds": judge.eta_seconds, "error": judge.error, "n_judgments": judge.judgments.count()}  # fmt: skip


@researcher_required
def ai_judge_json(request: HttpRequest, pk: int, judge_id: int) -> JsonResponse:
    judge = get_object_or_404(AIJudge, pk=judge_id, campaign_id=pk)
    return JsonResponse(_clean(ai_judge_state(judge)))


@researcher_required
def campaign_preview(request: HttpRequest, pk: int) -> HttpResponse:
    """The first items as annotators will see them (control tokens as markers), with the systems
    and metrics that annotators never see, so the owner can check the campaign before inviting."""
    camp = get_object_or_404(Campaign, pk=pk)
    return render(
        request,
        "annotation/preview.html",
        {"campaign": camp, "items": campaigns.preview_items(camp, 10), "n_items": camp.items.count(),
         "pairwise": camp.kind == CampaignKind.PAIRWISE},
    )  # fmt: skip


@researcher_required
def campaign_results(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    try:
        res = results.campaign_results(camp, source=request.GET.get("source", "human"))
    except AnnotationError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    return render(
        request, "annotation/results.html",
        {"campaign": camp, "res": res, "res_json": _clean(res), "sources": ai_judges.SOURCES},
    )  # fmt: skip


@researcher_required
def campaign_results_json(request: HttpRequest, pk: int) -> JsonResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    try:
        res = results.campaign_results(camp, source=request.GET.get("source", "human"))
    except AnnotationError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse(_clean(res))


@researcher_required
def export_jsonl(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    try:
        source = ai_judges.check_source(request.GET.get("source"))
    except AnnotationError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    tail = "" if source == "human" else f"-{source}"
    return _download(exports.export_jsonl(camp, source=source), f"campaign-{camp.pk}{tail}-pairs.jsonl")


def _download(body: str, filename: str) -> HttpResponse:
    """A campaign export as a file to save (``.jsonl`` or ``.csv``, UTF-8), not a page to show."""
    kind = "application/jsonl" if filename.endswith(".jsonl") else "text/csv"
    resp = HttpResponse(body, content_type=f"{kind}; charset=utf-8")
    resp["Content-Disposition"] = f'attachment; filename="{filename}"'
    return resp


@researcher_required
def export_csv(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    return _download(exports.export_csv(camp), f"campaign-{camp.pk}-judgments.csv")


@researcher_required
def export_ai_csv(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    return _download(exports.export_ai_csv(camp), f"campaign-{camp.pk}-ai-judgments.csv")


@researcher_required
@require_POST
def train_reward_model(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)

    def num(name: str, default: float) -> float:
        try:
            return float(request.POST.get(name, default))
        except (TypeError, ValueError):
            return default

    req = reward_models.TrainRequest(
        name=request.POST.get("name", "").strip() or f"{camp.name} RM",
        backbone=request.POST.get("backbone", "minilm").strip() or "minilm",
        epochs=num("epochs", 3.0),
        learning_rate=num("learning_rate", 5e-5),
        batch_size=int(num("batch_size", 16)),
        max_length=int(num("max_length", 128)),
        include_prompt=bool(request.POST.get("include_prompt")),
        source=request.POST.get("source", "human"),
    )
    try:
        rm = reward_models.create_reward_model(camp, req, user=request.user)
    except Exception as exc:  # noqa: BLE001 - PathNotAllowed and AnnotationError are shown alike
        messages.error(request, f"Cannot train: {exc}")
        return redirect("annotation:campaign_detail", pk=camp.pk)
    messages.success(request, f"Training reward model #{rm.pk} queued.")
    return redirect("annotation:reward_models")


@researcher_required
@require_POST
def fine_tune_dpo(request: HttpRequest, pk: int) -> HttpResponse:
    """Export the campaign's pairs into the data directory and open the launch form prefilled for DPO."""
    camp = get_object_or_404(Campaign, pk=pk)
    source = request.POST.get("source", "human")
    try:
        _path, n = dpo.export_pairs(camp, source=source)
    except AnnotationError as exc:
        messages.error(request, f"Cannot fine-tune with DPO: {exc}")
        return redirect("annotation:campaign_results", pk=camp.pk)
    who = {"human": "", "ai": " (AI judges)", "both": " (humans and AI judges)"}[source]
    messages.success(request, f"{n} preference pairs{who} exported for DPO; check the settings and launch.")
    return redirect(f"{reverse('runs:launch')}?dpo_campaign={dpo.launch_value(camp, source)}")


@researcher_required
def reward_model_list(request: HttpRequest) -> HttpResponse:
    rows = [
        (rm, reward_models.heldout_summary(rm.metrics), reward_models.choice_id(rm))
        for rm in RewardModel.objects.select_related("campaign")[:200]
    ]
    return render(
        request, "annotation/reward_models.html", {"rows": rows, "launch_url": reverse("runs:launch")}
    )


@researcher_required
def reward_model_json(request: HttpRequest, pk: int) -> JsonResponse:
    rm = get_object_or_404(RewardModel, pk=pk)
    return JsonResponse(
        _clean(
            {
                "id": rm.pk,
                "status": rm.status,
                "progress": rm.progress,
                "metrics": rm.metrics,
                "heldout": reward_models.heldout_summary(rm.metrics),
                "error": rm.error,
            }
        )
    )


@researcher_required
def leaderboard(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "annotation/leaderboard.html",
        {"boards": results.leaderboard(), "min_comparisons": results.min_comparisons_to_rank()},
    )
