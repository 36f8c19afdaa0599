"""The annotation app's endpoints of the HTTP API (``/api/v1/campaigns…``), plugged into
``webapp.api`` through its extension point from ``AnnotationConfig.ready()`` (``plugins.register``):
the API app imports nothing from here. Authentication, limits and JSON errors are the API's
(``api_view``); docs/api.md describes the endpoints."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path

from annotation import exports
from annotation.models import Campaign
from webapp.api.auth import ApiError, api_view
from webapp.api.extensions import ApiRoutes
from webapp.api.openapi import ERRORS, id_param, json_response, query_param, ref


@api_view(methods=("GET",))
def campaigns(request: HttpRequest) -> JsonResponse:
    rows = [
        {"id": c.pk, "name": c.name, "kind": c.kind, "status": c.status, "systems": c.systems,
         "system_labels": c.system_labels, "created": c.created.isoformat()}
        for c in Campaign.objects.order_by("-id")
    ]  # fmt: skip
    return JsonResponse({"campaigns": rows})


@api_view(methods=("GET",))
def campaign_pairs(request: HttpRequest, campaign_id: int) -> JsonResponse:
    camp = Campaign.objects.filter(pk=campaign_id).first()
    if camp is None:
        raise ApiError(404, f"no campaign #{campaign_id}", "campaign_id")
    gold = request.GET.get("include_gold", "false").lower() in ("1", "true", "yes")
    source = request.GET.get("source", "human")
    if source not in ("human", "ai", "both"):
        raise ApiError(400, f"{source[:20]!r} is not one of human, ai, both", "source")
    pairs = exports.preference_pairs(camp, include_gold=gold, source=source)
    return JsonResponse({"campaign_id": camp.pk, "source": source, "pairs": pairs})


def routes() -> ApiRoutes:
    return ApiRoutes(
        patterns=[
            path("api/v1/campaigns", campaigns, name="api_campaigns"),
            path("api/v1/campaigns/<int:campaign_id>/pairs", campaign_pairs, name="api_campaign_pairs"),
        ],
        paths={
            "/campaigns": {
                "get": {"summary": "annotation campaigns", "responses": {"200": json_response({"type": "object"}), **ERRORS}},
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
