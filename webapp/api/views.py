"""The API's endpoints (``/api/v1/``) and the token settings page. Views are thin: they parse and
check input, then call ``webapp.runs.services`` (create), ``webapp.runs.lifecycle`` (status),
``webapp.api.ingest`` (event batches) and ``webapp.runs.queries`` (reads); other apps add
endpoints through ``webapp.api.extensions`` (the annotation app's campaigns)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views import defaults
from django.views.decorators.http import require_http_methods

from webapp.access import researcher_required
from webapp.api import auth, ingest
from webapp.api.auth import ApiError, api_view, json_body
from webapp.api.models import ApiToken
from webapp.api.openapi import schema
from webapp.runs import lifecycle, protocol, services
from webapp.runs.errors import ConfigInvalid, ServiceError
from webapp.runs.models import MetricPoint, Run, RunStatus

API_STATUSES = ("running", "succeeded", "failed", "cancelled")
MAX_LIST = 500


def _run_json(run: Run, *, full: bool = False) -> dict[str, Any]:
    status = protocol.status_message(run)
    status.pop("type")
    out = {
        "id": run.pk,
        "name": run.name,
        "project": run.project.name if run.project_id else None,
        "algorithm": run.algorithm,
        "task": run.task,
        "model": run.model_name,
        "tags": run.tags,
        "created": run.created.isoformat(),
        "created_by": run.created_by.username if run.created_by_id else None,
        "remote": lifecycle.is_remote(run),
        "last_metrics": run.last_metrics,
        **status,
        "url": f"/runs/{run.pk}/",
    }
    if full:
        out.update(config=run.config, summary=run.summary, notes=run.notes)
    return out


def _get_run(pk: int) -> Run:
    run = Run.objects.select_related("project", "created_by").filter(pk=pk).first()
    if run is None:
        raise ApiError(404, f"no run #{pk}", "run_id")
    return run


def _writable_remote_run(request: HttpRequest, pk: int) -> Run:
    run = _get_run(pk)
    user = request.api_user
    if run.created_by_id != user.pk and not user.is_superuser:
        raise ApiError(403, f"run #{pk} belongs to another user; only its creator streams into it", "run_id")
    return run


def _int_param(request: HttpRequest, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.GET.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "must be an integer", name) from None
    if not lo <= value <= hi:
        raise ApiError(400, f"must be between {lo} and {hi}", name)
    return value


# --------------------------------------------------------------------------- runs


@api_view(methods=("GET", "POST"), write=False)
def runs(request: HttpRequest) -> JsonResponse:
    if request.method == "POST":
        return _create_run(request)
    qs: QuerySet[Run] = Run.objects.select_related("project", "created_by").order_by("-id")
    status = request.GET.get("status")
    if status:
        if status not in RunStatus.values:
            raise ApiError(400, f"unknown status; one of {', '.join(RunStatus.values)}", "status")
        qs = qs.filter(status=status)
    for name in ("task", "algorithm"):
        if request.GET.get(name):
            qs = qs.filter(**{name: request.GET[name]})
    if request.GET.get("project"):
        qs = qs.filter(project__name=request.GET["project"])
    if request.GET.get("tag"):
        qs = qs.filter(tags__contains=[request.GET["tag"]])
    limit = _int_param(request, "limit", 100, 1, MAX_LIST)
    offset = _int_param(request, "offset", 0, 0, 10**9)
    total = qs.count()
    rows = [_run_json(r) for r in qs[offset : offset + limit]]
    return JsonResponse({"count": total, "offset": offset, "limit": limit, "runs": rows})


def _create_run(request: HttpRequest) -> JsonResponse:
    auth._rate_limit(f"u{request.api_user.pk}")
    auth.read_body(request)
    data = json_body(request)
    for name, value in data.items():
        ingest.refuse_nul(value, name)
    config = data.get("config")
    if not isinstance(config, dict):
        raise ApiError(400, "the run's config is required, as an object", "config")
    launch = data.get("launch", False)
    if not isinstance(launch, bool):
        raise ApiError(400, "must be true or false", "launch")
    remote = data.get("remote", False)
    if not isinstance(remote, bool):
        raise ApiError(400, "must be true or false", "remote")
    if remote and launch:
        raise ApiError(
            400, "a run for the server's workers reads the server's files: launch it without remote", "remote"
        )
    kwargs: dict[str, Any] = {"user": request.api_user}
    for name in ("name", "project", "notes"):
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise ApiError(400, "must be a string", name)
        if value:
            kwargs[name] = value
    tags = data.get("tags")
    if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)):
        raise ApiError(400, "must be a list of strings", "tags")
    kwargs["tags"] = tags
    try:
        if launch:
            run = lifecycle.launch_run(config, **kwargs)
        else:  # remote: its paths are on the client's machine (services.validate_config)
            run = services.create_run(config, local_paths=not remote, **kwargs)
    except ConfigInvalid as exc:
        errors = getattr(exc, "errors", None) or [("config", str(exc))]
        first_field = errors[0][0]
        return JsonResponse(
            {
                "error": str(exc),
                "field": f"config.{first_field}" if first_field and first_field != "(root)" else "config",
                "errors": [{"field": f"config.{f}", "message": m} for f, m in errors],
            },
            status=400,
        )
    except ServiceError as exc:
        raise ApiError(503 if "broker" in str(exc).lower() else 409, str(exc)) from None
    run = _get_run(run.pk)
    return JsonResponse(_run_json(run, full=True), status=201)


@api_view(methods=("GET",))
def run_detail(request: HttpRequest, run_id: int) -> JsonResponse:
    return JsonResponse(_run_json(_get_run(run_id), full=True))


@api_view(methods=("POST",), write=True)
def run_events(request: HttpRequest, run_id: int) -> JsonResponse:
    run = _writable_remote_run(request, run_id)
    if not lifecycle.is_remote(run):
        raise ApiError(
            409,
            f"run #{run_id} is not streamed through the API: set its status to 'running' first "
            "(a run a worker executes is recorded by that worker)",
            "run_id",
        )
    data = json_body(request)
    host = run.worker_host[len(lifecycle.REMOTE_PREFIX) :]
    result = ingest.store_batch(run.pk, data.get("batch_id"), data.get("events"), host)
    # Any batch, even an empty one, is the remote run's heartbeat (webapp.watchdog marks silent runs lost).
    Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(heartbeat_at=timezone.now())
    return JsonResponse(
        {"run_id": run.pk, "batch_id": data["batch_id"], "duplicate": result.duplicate,
         "events": result.events, "points": result.points, "points_sent": result.points_sent}
    )  # fmt: skip


@api_view(methods=("POST",), write=True)
def run_status(request: HttpRequest, run_id: int) -> JsonResponse:
    run = _writable_remote_run(request, run_id)
    data = json_body(request)
    for name, value in data.items():
        ingest.refuse_nul(value, name)
    status = data.get("status")
    if status not in API_STATUSES:
        raise ApiError(400, f"one of {', '.join(API_STATUSES)}", "status")
    if status == "running":
        if lifecycle.is_remote(run) and run.status in (RunStatus.RUNNING, RunStatus.LOST):
            return JsonResponse(_run_json(_get_run(run_id)))  # a re-sent start
        host = data.get("host") or "client"
        if not isinstance(host, str) or len(host) > 150:
            raise ApiError(400, "must be a string of at most 150 characters", "host")
        if lifecycle.start_remote(run.pk, host) is None:
            raise ApiError(
                409, f"run #{run_id} is {run.status}; only a draft run can start remotely", "status"
            )
        return JsonResponse(_run_json(_get_run(run_id)))
    if not lifecycle.is_remote(run):
        raise ApiError(409, f"run #{run_id} is not a remote run; its worker sets its status", "run_id")
    if run.status == status:
        return JsonResponse(_run_json(run))  # a re-sent end
    if run.status not in (RunStatus.RUNNING, RunStatus.LOST):
        raise ApiError(409, f"run #{run_id} already ended as {run.status}", "status")
    if status == "failed":
        error = data.get("error") or "failed on the client"
        if not isinstance(error, str):
            raise ApiError(400, "must be a string", "error")
        lifecycle.fail(run.pk, error, str(data.get("traceback") or ""))
    else:
        summary = data.get("summary") or {}
        if not isinstance(summary, dict):
            raise ApiError(400, "must be an object", "summary")
        lifecycle.finish(run.pk, {**summary, "stopped": status == "cancelled", "model_dir": None})
    return JsonResponse(_run_json(_get_run(run_id)))


@api_view(methods=("GET",))
def run_metrics(request: HttpRequest, run_id: int) -> JsonResponse:
    """Every point of the run (or of ``keys``), step order per key: the data, not a chart's sample."""
    run = _get_run(run_id)
    qs = MetricPoint.objects.filter(run_id=run.pk)
    keys = [k for k in request.GET.get("keys", "").split(",") if k]
    if keys:
        qs = qs.filter(key__in=keys)
    series: dict[str, dict[str, list[Any]]] = {}
    for key, step, value, time in qs.order_by("key", "step").values_list("key", "step", "value", "time"):
        s = series.setdefault(key, {"steps": [], "values": [], "times": []})
        s["steps"].append(step)
        s["values"].append(protocol.clean_float(value))
        s["times"].append(time.isoformat())
    return JsonResponse({"run_id": run.pk, "series": series})


@api_view(methods=("GET",))
def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(schema())


# --------------------------------------------------------------------------- settings page


@researcher_required
@require_http_methods(["GET", "POST"])
def tokens_page(request: HttpRequest) -> HttpResponse:
    """Create and revoke one's API tokens; a new token is shown once, on the response to its creation."""
    new_token = None
    if request.method == "POST":
        if request.POST.get("revoke"):
            try:
                token_id = int(request.POST["revoke"])
            except ValueError:
                token_id = -1
            if auth.revoke_token(request.user, token_id):
                messages.success(request, "Token revoked: requests with it are refused from now on.")
            else:
                messages.error(request, "No such active token of yours.")
            return HttpResponseRedirect(request.path)
        _row, new_token = auth.create_token(request.user, request.POST.get("name", ""))
    rows = ApiToken.objects.filter(user=request.user)
    resp = render(request, "api/tokens.html", {"tokens": rows, "new_token": new_token})
    resp["Cache-Control"] = "no-store"  # the page holding a new token is never cached
    return resp


# --------------------------------------------------------------------------- errors outside the views


def _api_path(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler400``: the API's JSON shape under ``/api/`` (a client parses every error the same way)."""
    if _api_path(request):
        return ApiError(400, "bad request").response()
    return defaults.bad_request(request, exception)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler404``: an unknown API path answers JSON naming it, not the site's HTML page."""
    if _api_path(request):
        return ApiError(404, f"no API endpoint {request.path}", "path").response()
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: a failure before an API view ran (a middleware, a database outage while it
    read the session) still answers JSON; ``api_view`` handles those raised inside views."""
    if _api_path(request):
        return ApiError(500, "internal server error (logged on the server)").response()
    return defaults.server_error(request)
