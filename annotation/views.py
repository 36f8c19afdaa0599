"""Annotation pages. Thin: parse the request, call ``annotation.services``, render.

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
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from annotation import services
from annotation.models import AXES_PRESETS, Campaign, CampaignKind, CampaignStatus, Pairing, RewardModel
from webapp.access import annotator_required, is_researcher, researcher_required, role_of


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
    for c in services.campaigns_for_annotator(request.user):
        rows.append({"campaign": c, "progress": services.progress_for(c, request.user)})
    return render(request, "annotation/home.html", {"rows": rows, "researcher": is_researcher(request.user)})


def join(request: HttpRequest, token: str) -> HttpResponse:
    """Invite link: a logged-in user joins; a visitor creates an annotator-only account."""
    try:
        inv = services.invite_for_token(token)
    except services.AnnotationError as exc:
        return render(request, "annotation/join.html", {"error": str(exc)}, status=404)
    if request.method == "POST":
        try:
            if request.user.is_authenticated:
                services.accept_invite(token, request.user)
            else:
                user = services.signup_with_invite(
                    token, request.POST.get("username", ""), request.POST.get("password", "")
                )
                login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        except services.AnnotationError as exc:
            return render(
                request, "annotation/join.html",
                {"invite": inv, "error": str(exc), "username": request.POST.get("username", "")}, status=400,
            )  # fmt: skip
        return redirect("annotation:annotate", pk=inv.campaign_id)
    return render(request, "annotation/join.html", {"invite": inv})


def _member_campaign(request: HttpRequest, pk: int) -> Campaign:
    camp = get_object_or_404(Campaign, pk=pk)
    if not services.is_member(camp, request.user):
        raise Http404("no such campaign")
    return camp


@annotator_required
def annotate(request: HttpRequest, pk: int) -> HttpResponse:
    camp = _member_campaign(request, pk)
    if camp.status != CampaignStatus.ACTIVE:
        return render(request, "annotation/annotate_closed.html", {"campaign": camp})
    a = services.next_item(camp, request.user)
    progress = services.progress_for(camp, request.user)
    ctx: dict[str, Any] = {
        "campaign": camp,
        "progress": progress,
        "pairwise": camp.kind == CampaignKind.PAIRWISE,
    }
    if a is None:
        return render(request, "annotation/annotate_done.html", ctx)
    ctx["item"] = services.display_item(a)
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
        services.record_judgment(
            request.user, request.POST.get("token", ""), item_id=item_id, choice=request.POST.get("choice"),
            scores=scores, rationale=request.POST.get("rationale", ""), seconds=seconds,
        )  # fmt: skip
    except services.AnnotationError as exc:
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
        services.skip_item(request.user, request.POST.get("token", ""))
    except services.AnnotationError as exc:
        messages.error(request, str(exc))
    return redirect("annotation:annotate", pk=camp.pk)


@annotator_required
@require_POST
def undo(request: HttpRequest, pk: int) -> HttpResponse:
    camp = _member_campaign(request, pk)
    try:
        a = services.undo_last(camp, request.user)
    except services.AnnotationError as exc:
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
    rows = services.campaign_counts(list(Campaign.objects.all()[:500]))
    return render(request, "annotation/campaign_list.html", {"rows": rows})


def _int(value: Any, default: int | None = None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _settings_from_post(post: Any) -> dict[str, Any]:
    kind = post.get("kind", CampaignKind.PAIRWISE)
    out: dict[str, Any] = {
        "kind": kind,
        "overlap": _int(post.get("overlap"), 3),
        "pairing": post.get("pairing", Pairing.ALL_PAIRS),
        "instructions": post.get("instructions", ""),
    }
    if kind == CampaignKind.LIKERT:
        preset = post.get("axes_preset", "")
        if preset:
            if preset not in AXES_PRESETS:
                raise services.AnnotationError(f"unknown axes preset {preset!r}")
            out["axes"] = AXES_PRESETS[preset]
        elif post.get("axes", "").strip():
            out["axes"] = services.parse_axes_text(post["axes"])
    return out


def _runs_with_samples() -> list[Any]:
    from django.db.models import Count

    from webapp.runs.models import Run

    return list(
        Run.objects.annotate(n_samples=Count("samples")).filter(n_samples__gt=0).order_by("-created")[:300]
    )


@researcher_required
def campaign_new(request: HttpRequest) -> HttpResponse:
    ctx: dict[str, Any] = {
        "runs": _runs_with_samples(),
        "default_axes": services.axes_to_text(services.DEFAULT_AXES),
        "axes_presets": sorted(AXES_PRESETS),
        "post": request.POST,
        "selected": [],
    }
    if request.method == "POST":
        run_ids = [r for r in (_int(x) for x in request.POST.getlist("runs")) if r is not None]
        ctx["selected"] = run_ids
        try:
            kw = _settings_from_post(request.POST)
            camp = services.create_campaign_from_runs(
                request.POST.get("name", ""), run_ids, user=request.user,
                split=request.POST.get("split") or None, baseline_run=_int(request.POST.get("baseline")),
                max_items=_int(request.POST.get("max_items")), **kw,
            )  # fmt: skip
        except services.AnnotationError as exc:
            ctx["error"] = str(exc)
            return render(request, "annotation/campaign_new.html", ctx, status=400)
        messages.success(request, f"Campaign created with {camp.items.count()} items.")
        return redirect("annotation:campaign_detail", pk=camp.pk)
    return render(request, "annotation/campaign_new.html", ctx)


@researcher_required
def campaign_upload(request: HttpRequest) -> HttpResponse:
    ctx: dict[str, Any] = {
        "default_axes": services.axes_to_text(services.DEFAULT_AXES),
        "axes_presets": sorted(AXES_PRESETS),
        "post": request.POST,
    }
    if request.method == "POST":
        f = request.FILES.get("file")
        try:
            if f is None:
                raise services.UploadError("choose a JSONL file to upload")
            if f.size > 50 * 1024 * 1024:
                raise services.UploadError("file too large (limit 50 MB)")
            kw = _settings_from_post(request.POST)
            camp = services.create_campaign_from_upload(
                request.POST.get("name", ""), f.read(), user=request.user,
                baseline_system=request.POST.get("baseline", "").strip(), **kw,
            )  # fmt: skip
        except services.AnnotationError as exc:
            ctx["error"] = f"Nothing was imported. {exc}"
            return render(request, "annotation/campaign_upload.html", ctx, status=400)
        messages.success(request, f"Campaign created with {camp.items.count()} items.")
        return redirect("annotation:campaign_detail", pk=camp.pk)
    return render(request, "annotation/campaign_upload.html", ctx)


@researcher_required
def campaign_detail(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    if request.method == "POST":
        action = request.POST.get("action", "")
        try:
            if action == "start":
                services.start_campaign(camp)
                messages.success(request, "Campaign started: annotators can now judge items.")
            elif action == "close":
                services.close_campaign(camp)
                messages.success(request, "Campaign closed.")
            elif action == "invite":
                inv = services.create_invite(camp, request.user, _int(request.POST.get("max_uses")))
                messages.success(
                    request,
                    f"Invite link created: {request.build_absolute_uri(reverse('annotation:join', args=[inv.token]))}",
                )
            elif action == "add_member":
                User = get_user_model()
                user = User.objects.filter(username=request.POST.get("username", "").strip()).first()
                if user is None:
                    raise services.AnnotationError("no user with that name")
                if role_of(user) is None:
                    user.groups.add(services.annotator_group())
                services.add_member(camp, user)
                messages.success(request, f"{user.username} added.")
            elif action == "remove_member":
                camp.memberships.filter(user_id=_int(request.POST.get("user_id"))).delete()
                messages.success(request, "Annotator removed (their judgments are kept).")
            elif action == "settings":
                kw: dict[str, Any] = {
                    "name": request.POST.get("name"),
                    "instructions": request.POST.get("instructions"),
                    "overlap": _int(request.POST.get("overlap")),
                }
                if camp.kind == CampaignKind.LIKERT and request.POST.get("axes", "").strip():
                    kw["axes"] = services.parse_axes_text(request.POST["axes"])
                if request.POST.get("examples", "").strip():
                    try:
                        ex = json.loads(request.POST["examples"])
                    except json.JSONDecodeError as exc:
                        raise services.AnnotationError(
                            f"examples: invalid JSON ({exc.msg}, line {exc.lineno})"
                        ) from None
                    if not isinstance(ex, list):
                        raise services.AnnotationError("examples: expected a JSON list")
                    kw["examples"] = ex
                services.update_settings(camp, **kw)
                messages.success(request, "Settings saved.")
        except services.AnnotationError as exc:
            messages.error(request, str(exc))
        return redirect("annotation:campaign_detail", pk=camp.pk)
    ctx = {
        "campaign": camp,
        "problems": services.start_problems(camp) if camp.status == CampaignStatus.DRAFT else [],
        "members": camp.memberships.select_related("user").order_by("joined"),
        "invites": camp.invites.filter(active=True).order_by("-created"),
        "n_items": camp.items.count(),
        "n_gold": camp.items.exclude(gold="").count(),
        "n_judgments": camp.judgments.count(),
        "reward_models": camp.reward_models.all(),
        "axes_text": services.axes_to_text(camp.axes) if camp.axes else "",
        "examples_text": json.dumps(camp.examples, indent=1) if camp.examples else "",
        "systems": [(s, camp.label(s)) for s in camp.systems],
        "n_pairs": len(services.preference_pairs(camp)) if camp.kind == CampaignKind.PAIRWISE else 0,
        "join_base": request.build_absolute_uri("/annotate/join/"),
    }
    return render(request, "annotation/campaign_detail.html", ctx)


@researcher_required
def campaign_results(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    res = services.campaign_results(camp)
    return render(
        request, "annotation/results.html",
        {"campaign": camp, "res": res, "res_json": _clean(res)},
    )  # fmt: skip


@researcher_required
def campaign_results_json(request: HttpRequest, pk: int) -> JsonResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    return JsonResponse(_clean(services.campaign_results(camp)))


@researcher_required
def export_jsonl(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    resp = HttpResponse(services.export_jsonl(camp), content_type="application/jsonl; charset=utf-8")
    resp["Content-Disposition"] = f'attachment; filename="campaign-{camp.pk}-pairs.jsonl"'
    return resp


@researcher_required
def export_csv(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)
    resp = HttpResponse(services.export_csv(camp), content_type="text/csv; charset=utf-8")
    resp["Content-Disposition"] = f'attachment; filename="campaign-{camp.pk}-judgments.csv"'
    return resp


@researcher_required
@require_POST
def train_reward_model(request: HttpRequest, pk: int) -> HttpResponse:
    camp = get_object_or_404(Campaign, pk=pk)

    def num(name: str, default: float) -> float:
        try:
            return float(request.POST.get(name, default))
        except (TypeError, ValueError):
            return default

    req = services.TrainRequest(
        name=request.POST.get("name", "").strip() or f"{camp.name} RM",
        backbone=request.POST.get("backbone", "minilm").strip() or "minilm",
        epochs=num("epochs", 3.0),
        learning_rate=num("learning_rate", 5e-5),
        batch_size=int(num("batch_size", 16)),
        max_length=int(num("max_length", 128)),
        include_prompt=bool(request.POST.get("include_prompt")),
    )
    try:
        rm = services.create_reward_model(camp, req, user=request.user)
    except Exception as exc:  # noqa: BLE001 - PathNotAllowed and AnnotationError are shown alike
        messages.error(request, f"Cannot train: {exc}")
        return redirect("annotation:campaign_detail", pk=camp.pk)
    messages.success(request, f"Training reward model #{rm.pk} queued.")
    return redirect("annotation:reward_models")


@researcher_required
def reward_models(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "annotation/reward_models.html",
        {"models": RewardModel.objects.select_related("campaign")[:200]},
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
                "error": rm.error,
            }
        )
    )


@researcher_required
def leaderboard(request: HttpRequest) -> HttpResponse:
    return render(request, "annotation/leaderboard.html", {"boards": services.leaderboard()})
