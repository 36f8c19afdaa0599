"""The annotation app's endpoints of the HTTP API (``/api/v1/campaigns…``), plugged into
``webapp.api`` through its extension point from ``AnnotationConfig.ready()`` (``plugins.register``):
the API app imports nothing from here. Authentication, limits and JSON errors are the API's
(``api_view``); docs/api.md describes the endpoints."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path

from annotation import campaigns as campaign_service
from annotation.errors import AnnotationError
from annotation.models import AssignmentMode, Campaign
from annotation.pairs import preference_pairs
from webapp.api.auth import ApiError, api_view, json_body
from webapp.api.extensions import ApiRoutes
from webapp.api.openapi import ERRORS, id_param, json_response, query_param, ref


def _campaign_json(c: Campaign) -> dict:
    return {"id": c.pk, "name": c.name, "kind": c.kind, "status": c.status, "systems": c.systems,
            "system_labels": c.system_labels, "assignment_mode": c.assignment_mode,
            "created": c.created.isoformat()}  # fmt: skip


@api_view(methods=("GET",))
def campaigns(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"campaigns": [_campaign_json(c) for c in Campaign.objects.order_by("-id")]})


@api_view(methods=("GET", "POST"), write=False)
def campaign_detail(request: HttpRequest, campaign_id: int) -> JsonResponse:
    """GET one campaign; POST ``{"assignment_mode": "uniform" | "adaptive"}`` changes how its items
    are chosen (allowed at any time: the choice depends only on earlier judgments)."""
    camp = Campaign.objects.filter(pk=campaign_id).first()
    if camp is None:
        raise ApiError(404, f"no campaign #{campaign_id}", "campaign_id")
    if request.method == "POST":
        data = json_body(request)
        unknown = sorted(set(data) - {"assignment_mode"})
        if unknown:
            raise ApiError(400, "only assignment_mode can be changed here", str(unknown[0])[:50])
        if not isinstance(data.get("assignment_mode"), str) or not data["assignment_mode"]:
            raise ApiError(400, "required: uniform or adaptive", "assignment_mode")
        try:
            campaign_service.update_settings(
                camp, assignment_mode=str(data.get("assignment_mode") or "")[:50]
            )
        except AnnotationError as exc:
            raise ApiError(400, str(exc), "assignment_mode") from None
    return JsonResponse(_campaign_json(camp))


@api_view(methods=("GET",))
def campaign_pairs(request: HttpRequest, campaign_id: int) -> JsonResponse:
    camp = Campaign.objects.filter(pk=campaign_id).first()
    if camp is None:
        raise ApiError(404, f"no campaign #{campaign_id}", "campaign_id")
    gold = request.GET.get("include_gold", "false").lower() in ("1", "true", "yes")
    source = request.GET.get("source", "human")
    if source not in ("human", "ai", "both"):
        raise ApiError(400, f"{source[:20]!r} is not one of human, ai, both", "source")
    pairs = preference_pairs(camp, include_gold=gold, source=source)
    return JsonResponse({"campaign_id": camp.pk, "source": source, "pairs": pairs})


def routes() -> ApiRoutes:
    return ApiRoutes(
        patterns=[
            path("api/v1/campaigns", campaigns, name="api_campaigns"),
            path("api/v1/campaigns/<int:campaign_id>", campaign_detail, name="api_campaign_detail"),
            path("api/v1/campaigns/<int:campaign_id>/pairs", campaign_pairs, name="api_campaign_pairs"),
        ],
        paths={
            "/campaigns": {
                "get": {"summary": "annotation campaigns", "responses": {"200": json_response({"type": "object"}), **ERRORS}},
            },
            "/campaigns/{campaign_id}": {
                "get": {"summary": "one campaign", "parameters": [id_param("campaign_id")],
                        "responses": {"200": json_response({"type": "object"}), **ERRORS}},
                "post": {
                    "summary": "change how the campaign's items are chosen (uniform or adaptive, pairwise only)",
                    "parameters": [id_param("campaign_id")],
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object", "required": ["assignment_mode"],
                        "properties": {"assignment_mode": {"type": "string", "enum": list(AssignmentMode.values)}}}}}},
                    "responses": {"200": json_response({"type": "object"}), **ERRORS},
                },
            },
            "/campaigns/{campaign_id}/pairs": {
                "get": {
                    "summary": "decided pairwise judgments as preference pairs",
                    "parameters": [id_param("campaign_id"),
                                   query_param("include_gold", {"type": "boolean"}, "also gold (control) items"),
                                   query_param("source", {"type": "string", "enum": ["human", "ai", "both"]},
                                               "human judgments (default), AI judges' verdicts, or both")],
                    "responses": {"200": json_response({"type": "object", "properties": {
                        "pairs": {"type": "array", "items": ref("Pair")}}}), **ERRORS},
                },
            },
        },
        schemas={
            "Pair": {
                "type": "object",
                "properties": {"prompt": {"type": "string"}, "chosen": {"type": "string"},
                               "rejected": {"type": "string"}, "meta": {"type": "object"}},
            },
        },
    )  # fmt: skip
