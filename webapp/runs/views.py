"""Pages and JSON endpoints of the experiment manager.

Views stay thin: they parse input with the forms in ``forms.py``, change a run's status through
``lifecycle`` (whose ``can_*`` checks also decide which buttons show), create and import through
``services`` and read through ``queries``. Other apps add panels to the run page through
``extensions``. Every view requires a researcher (annotators are sent to
the annotation app by ``researcher_required``); every state change is a POST with CSRF.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.gzip import gzip_page
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from engine.config import ConfigError, parse_config
from engine.presets import GROUP_ALGORITHMS, PREFERENCE_ALGORITHMS
from engine.sweep import SweepError
from webapp.access import researcher_required
from webapp.celery import app as celery_app
from webapp.runs import extensions, lifecycle, paths, protocol, queries, services, sweeps, workers
from webapp.runs.forms import (
    ImportRunForm,
    RunConfigForm,
    RunMetaForm,
    YamlConfigForm,
    dump_yaml,
    form_data_from_config,
    list_presets,
    load_preset,
    load_yaml_text,
    schema_fields,
    unknown_keys,
)
from webapp.runs.models import ACTIVE_STATUSES, Checkpoint, Run, RunLog, RunStatus

MAX_COMPARE = 12
LOG_TAIL = 200
NEWEST_SAMPLES = 20

# Charts of the run page: (group id, title, predicate over metric keys). The first match wins.
# Every key the engine's algorithms log has a card of its own kind (DPO's preference rewards
# included), so "Other" holds only keys of user components.
METRIC_GROUPS: list[tuple[str, str, tuple[str, ...]]] = [
    ("reward", "Reward", ("train/reward",)),
    ("kl", "KL & β", ("train/kl", "policy/approx_kl", "kl/")),
    ("loss", "Losses", ("loss/", "train/loss")),
    ("preference", "Preferences (DPO)", ("rewards/",)),
    ("entropy", "Entropy", ("policy/entropy", "train/entropy")),
    ("value", "Value", ("value/",)),
    ("train", "Training", ("train/", "policy/")),
    ("eval", "Eval metrics", ("eval/",)),
    ("time", "Time", ("time/",)),
]
#: Groups drawn as one chart per key: their quantities have different units and scales (a
#: vocabulary size of ~70 beside a reward of ~0.05 flattened the reward on a shared axis).
PER_KEY_GROUPS = frozenset({"eval", "train", "preference"})
#: Keys an algorithm without a value model logs as placeholders (zeros, NaN): not charted for it.
CRITIC_KEYS = ("value/", "loss/value")
CRITIC_FREE_ALGORITHMS = frozenset({*GROUP_ALGORITHMS, *PREFERENCE_ALGORITHMS, "sft"})


def metric_group(key: str) -> str:
    for gid, _title, prefixes in METRIC_GROUPS:
        if any(key.startswith(p) for p in prefixes):
            return gid
    return "other"


def _chart_groups() -> list[dict[str, Any]]:
    groups = [
        {"id": g, "title": t, "prefixes": list(p), "per_key": g in PER_KEY_GROUPS}
        for g, t, p in METRIC_GROUPS
    ]
    return groups + [{"id": "other", "title": "Other", "prefixes": [], "per_key": False}]


def _hidden_keys(run: Run) -> list[str]:
    """Key prefixes the run page leaves out: the value model's, for an algorithm that has none (GRPO,
    RLOO, REINFORCE++ log value/mean 0 and explained variance NaN; DPO and SFT log none)."""
    return list(CRITIC_KEYS) if run.algorithm in CRITIC_FREE_ALGORITHMS else []


# --------------------------------------------------------------------------- run table


@researcher_required
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    table = queries.run_table(request.GET)
    if not any(v.strip() for v in request.GET.getlist("metrics")):
        table.metric_columns = table.metric_columns + _common_eval_keys(table.rows)
    # The column chooser offers every metric the runs of this page report, chosen columns first.
    reported = sorted({k for r in table.rows for k in (r.last_metrics or {})} - set(table.metric_columns))
    params = request.GET.copy()
    params.pop("page", None)
    base_query = params.urlencode()
    sort_params = request.GET.copy()
    sort_params.pop("sort", None)
    sort_params.pop("page", None)
    return render(
        request,
        "runs/run_list.html",
        {
            "table": table,
            "rows": [
                {"run": r, "metrics": [table.metric_value(r, k) for k in table.metric_columns]}
                for r in table.rows
            ],
            "base_query": base_query,
            "sort_query": sort_params.urlencode(),
            "metrics_param": ",".join(table.metric_columns),
            "column_choices": [(k, True) for k in table.metric_columns] + [(k, False) for k in reported],
            # Header text split at "/" so that the template can offer a line break after each one.
            "metric_heads": [{"key": k, "parts": k.split("/")} for k in table.metric_columns],
            "status_choices": [s.value for s in RunStatus],
        },
    )


def _common_eval_keys(rows: list[Run], limit: int = 3) -> list[str]:
    """The eval metrics most runs on this page report: default extra columns (no extra query)."""
    counts: dict[str, int] = {}
    for run in rows:
        for key in run.last_metrics or {}:
            if key.startswith("eval/"):
                counts[key] = counts.get(key, 0) + 1
    return sorted(counts, key=lambda k: (-counts[k], k))[:limit]


# --------------------------------------------------------------------------- launch


def _launch_context(
    request: HttpRequest,
    form: RunConfigForm,
    meta: RunMetaForm,
    yaml_form: YamlConfigForm,
    mode: str,
    cloned_from: Run | None,
    preset: str = "",
    extra_errors: list[str] | None = None,
) -> dict[str, Any]:
    preset = preset or request.POST.get("preset", "")
    return {
        "form": form,
        "sections": form.sections(),
        "meta": meta,
        "yaml_form": yaml_form,
        "mode": mode,
        "presets": list_presets(),
        "preset": preset,
        "cloned_from": cloned_from,
        "extra_errors": extra_errors or [],
    }


def _cloned_from(request: HttpRequest) -> Run | None:
    raw = request.POST.get("cloned_from") or request.GET.get("clone") or ""
    if raw.isdigit():
        return Run.objects.filter(pk=int(raw)).first()
    return None


@researcher_required
@require_http_methods(["GET", "POST"])
def sweep_new(request: HttpRequest) -> HttpResponse:
    """A sweep in the CLI's format (engine/sweep.py) with its base config inline: every run is
    validated, then all are queued together, tagged ``sweep:<name>-<id>``."""
    text, error = sweeps.EXAMPLE, ""
    fields: dict[str, Any] | None = None
    if request.method == "POST":
        text = request.POST.get("sweep_yaml", "")
        action = request.POST.get("action", "launch")
        try:
            if action in ("launch_fields", "fields_to_yaml"):
                # The fields form: its rows replace the document's swept values (ranges and base kept).
                rows = [
                    (request.POST.get(f"field_path_{i}", ""), request.POST.get(f"field_values_{i}", ""))
                    for i in range(sweeps.FIELD_ROWS)
                ]
                fields = {
                    "method": request.POST.get("method", "grid"),
                    "count": request.POST.get("count", ""),
                    "rows": [{"path": p, "values": v} for p, v in rows],
                }
                text = sweeps.text_with_fields(text, fields["method"], fields["count"], rows)
                fields = None  # the new text is the source of the form from here on
            if action != "fields_to_yaml":
                tag, runs = sweeps.launch_sweep(text, request.user)
                messages.success(request, f"Sweep queued: {len(runs)} runs.")
                return redirect("runs:sweep", tag=tag)
        except (SweepError, services.ServiceError) as exc:
            error = str(exc)
    paths = [s.path for s in schema_fields() if s.kind in ("int", "float", "enum", "bool", "str")]
    return render(
        request,
        "runs/sweep_new.html",
        {
            "sweep_yaml": text,
            "error": error,
            "max_runs": sweeps.MAX_RUNS,
            "fields": fields or sweeps.fields_from_text(text),
            "paths": paths,
        },
    )


def _sweep_metric(request: HttpRequest, tag: str) -> str:
    """The final metric a sweep's page and its status poll show (``?metric=``, the mean reward by
    default), read in one place so the page and its poll always agree; a tag that is not a sweep's
    is a 404."""
    if not tag.startswith(sweeps.TAG_PREFIX):
        raise Http404("not a sweep")
    return request.GET.get("metric", "").strip()[:200] or "train/reward_mean"


@researcher_required
@require_GET
def sweep_detail(request: HttpRequest, tag: str) -> HttpResponse:
    """The runs of one sweep: varied values, status and final metric; parallel coordinates."""
    metric = _sweep_metric(request, tag)
    data = sweeps.sweep_table(tag, metric)
    if not data["runs"]:
        raise Http404("no runs in this sweep")
    live = {
        "status_url": reverse("runs:sweep_status", args=[tag]) + "?" + urlencode({"metric": metric}),
        "active": any(r.status in ACTIVE_STATUSES for r in data["runs"]),
    }
    cancellable = sum(1 for r in data["runs"] if lifecycle.can_cancel(r))
    return render(
        request,
        "runs/sweep_detail.html",
        {**data, "metric": metric, "live": live, "cancellable": cancellable},
    )


@researcher_required
@require_GET
def sweep_list(request: HttpRequest) -> HttpResponse:
    """Every sweep, newest first, so a sweep can be found again after its launch page is gone."""
    return render(request, "runs/sweep_list.html", {"sweeps": sweeps.sweep_list()})


@researcher_required
@require_GET
def sweep_status(request: HttpRequest, tag: str) -> JsonResponse:
    """Statuses and final metrics of a sweep's runs, polled by its page while any run is active."""
    metric = _sweep_metric(request, tag)
    return JsonResponse(sweeps.sweep_status(tag, metric))


@researcher_required
@require_http_methods(["GET", "POST"])
def sweep_cancel(request: HttpRequest, tag: str) -> HttpResponse:
    """GET: a confirmation page naming the runs a cancel stops (a group action is never one click);
    POST: cancel them."""
    if not tag.startswith(sweeps.TAG_PREFIX):
        raise Http404("not a sweep")
    if request.method == "GET":
        runs = sweeps.cancellable_runs(tag)
        return render(request, "runs/sweep_confirm_cancel.html", {"tag": tag, "runs": runs})
    n = sweeps.cancel_sweep(tag)
    messages.info(request, f"Cancelled {n} run{'s' if n != 1 else ''} of the sweep.")
    return redirect("runs:sweep", tag=tag)


@researcher_required
@require_GET
def workers_json(request: HttpRequest) -> JsonResponse:
    """The live workers, their device kinds and free slots (Celery ``inspect``), for the launch
    form's resources panel. Fetched by the page after it loads: ``inspect`` waits its whole timeout
    for replies, which the form itself must not wait for."""
    try:
        found = workers.describe(celery_app, timeout=1.0)
    except Exception as exc:  # noqa: BLE001 - a broker outage is a message in the panel, not a 500
        return JsonResponse({"workers": [], "error": f"could not ask the workers: {exc}"})
    return JsonResponse({"workers": found})


@researcher_required
@require_GET
def run_placement(request: HttpRequest, pk: int) -> JsonResponse:
    """Why no live worker can take this queued run (``reason`` null when one can, or when the run is
    not queued). The launch form says it before queueing; a run already queued (launched from the
    YAML view, the API, a sweep, or before the last fitting worker stopped) says it on its page,
    which fetches this while the run waits: ``inspect`` waits its whole timeout, the page must not."""
    run = get_object_or_404(Run.objects.only("pk", "status", "config"), pk=pk)
    if run.status != RunStatus.QUEUED:
        return JsonResponse({"status": run.status, "reason": None})
    try:
        found = workers.describe(celery_app, timeout=1.0)
    except Exception as exc:  # noqa: BLE001 - a broker outage is a note on the page, not a 500
        return JsonResponse({"status": run.status, "reason": f"could not ask the workers: {exc}"})
    return JsonResponse({"status": run.status, "reason": workers.unservable_reason(found, run.config)})


def _launch_form_page(request: HttpRequest, cloned_from: Run | None) -> HttpResponse:
    """The launch page as first opened: from a preset, a clone, an app's launch source (e.g. a DPO
    campaign) or the defaults; a bad preset or clone link says so above the form."""
    initial: dict[str, Any] | None = None
    preset = request.GET.get("preset", "")
    reward_choice = request.GET.get("reward", "")
    errors: list[str] = []
    meta_initial: dict[str, Any] = {}
    if preset:
        known = [p["name"] for p in list_presets()]
        if preset not in known:
            # The engine's message lists all ~170 names; the menu beside the form already does.
            close = difflib.get_close_matches(preset, known, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else " Choose one from the preset menu."
            errors.append(f"Unknown preset “{preset}”.{hint}")
        else:
            try:
                initial = load_preset(preset)
            except ConfigError as exc:
                errors.append(str(exc))
    elif request.GET.get("clone") and cloned_from is None:
        errors.append(
            f"There is no run #{request.GET['clone']} to clone (deleted, or a mistyped link): "
            "the form below starts from the defaults."
        )
    elif cloned_from is not None:
        initial = dict(cloned_from.config)
        initial["name"] = f"{cloned_from.name} (clone)"
        meta_initial = {"tags": ", ".join(cloned_from.tags), "notes": cloned_from.notes}
    elif (source := extensions.launch_source(request)) is not None:
        try:  # e.g. ?dpo_campaign=<id>: the server builds the config from the id
            initial = source[0](request, source[1])
        except ValueError as exc:
            errors.append(str(exc))
    form = RunConfigForm(initial_config=initial, reward_choice=reward_choice)
    yaml_form = YamlConfigForm(initial={"config_yaml": dump_yaml(form.initial_config)})
    ctx = _launch_context(
        request, form, RunMetaForm(initial=meta_initial), yaml_form, "form", cloned_from, preset, errors
    )
    return render(request, "runs/launch.html", ctx)


def _sweep_page_from(request: HttpRequest) -> HttpResponse:
    """The new-sweep page with the launch page's config (form or YAML view) as the sweep's base."""
    if "config_yaml" in request.POST:  # from the YAML view
        try:
            config = load_yaml_text(request.POST["config_yaml"]) or {}
        except ValidationError as exc:
            config, sweep_error = {}, " ".join(exc.messages)
        else:
            sweep_error = ""
    else:
        config, sweep_error = RunConfigForm(request.POST).loose_config_dict(), ""
    if not isinstance(config, dict):
        config, sweep_error = {}, "the config must be a YAML mapping"
    return render(
        request,
        "runs/sweep_new.html",
        {
            "sweep_yaml": sweeps.sweep_text_for(config, dump_yaml) if config else sweeps.EXAMPLE,
            "error": sweep_error,
            "max_runs": sweeps.MAX_RUNS,
        },
    )


@researcher_required
@require_http_methods(["GET", "POST"])
def launch(request: HttpRequest) -> HttpResponse:
    """Config form generated from the engine's schema, a YAML view of the same config, presets.

    POST ``action``: ``launch`` (form → validate → launch service → run page), ``launch_yaml`` (the
    same from the YAML view), ``to_yaml`` (show the form's config as YAML), ``to_form`` (load YAML
    into the form, errors on the fields)."""
    cloned_from = _cloned_from(request)
    if request.method == "GET":
        return _launch_form_page(request, cloned_from)
    action = request.POST.get("action", "launch")
    meta = RunMetaForm(request.POST)

    if action == "to_yaml":
        form = RunConfigForm(request.POST)
        yaml_form = YamlConfigForm(initial={"config_yaml": dump_yaml(form.loose_config_dict())})
        ctx = _launch_context(request, form, meta, yaml_form, "yaml", cloned_from)
        return render(request, "runs/launch.html", ctx)

    if action == "to_sweep":  # the sweep page, opened with this config as its base
        return _sweep_page_from(request)

    if action in ("to_form", "launch_yaml"):
        yaml_form = YamlConfigForm(request.POST)
        yaml_ok = yaml_form.is_valid()
        if action == "launch_yaml" and yaml_ok and meta.is_valid():
            return _do_launch(
                request, yaml_form.config.to_dict(), meta, cloned_from, yaml_form=yaml_form
            ) or render(
                request,
                "runs/launch.html",
                _launch_context(request, RunConfigForm(), meta, yaml_form, "yaml", cloned_from),
            )
        if yaml_form.raw is None:  # YAML syntax error: stay on the YAML view
            form = RunConfigForm()
            return render(
                request,
                "runs/launch.html",
                _launch_context(request, form, meta, yaml_form, "yaml", cloned_from),
            )
        form = RunConfigForm(form_data_from_config(yaml_form.raw))
        form.is_valid()
        extra = [f"{k}: unknown key (not in the schema)" for k in unknown_keys(yaml_form.raw)]
        return render(
            request,
            "runs/launch.html",
            _launch_context(
                request,
                form,
                meta,
                yaml_form,
                "yaml" if action == "launch_yaml" else "form",
                cloned_from,
                extra_errors=extra,
            ),
        )

    form = RunConfigForm(request.POST)
    form_ok = form.is_valid()
    meta_ok = meta.is_valid()
    yaml_form = YamlConfigForm(initial={"config_yaml": dump_yaml(form.loose_config_dict())})
    if form_ok and meta_ok and form.config is not None:
        response = _do_launch(request, form.config.to_dict(), meta, cloned_from, form=form)
        if response is not None:
            return response
    return render(
        request, "runs/launch.html", _launch_context(request, form, meta, yaml_form, "form", cloned_from)
    )


def _do_launch(
    request: HttpRequest,
    config: dict[str, Any],
    meta: RunMetaForm,
    cloned_from: Run | None,
    form: RunConfigForm | None = None,
    yaml_form: YamlConfigForm | None = None,
) -> HttpResponse | None:
    """Call the launch service; None when the config was refused (errors are on ``form``, the YAML
    view's list, or messages)."""
    try:
        run = lifecycle.launch_run(
            config,
            user=request.user,
            tags=meta.cleaned_data.get("tags") or [],
            notes=meta.cleaned_data.get("notes") or "",
            cloned_from=cloned_from,
        )
    except services.ConfigInvalid as exc:
        if form is not None:
            form.add_config_errors(ConfigError(str(exc), exc.errors))
        elif yaml_form is not None and exc.errors:  # one line per field, as the YAML view lists them
            yaml_form.config_errors = list(exc.errors)
            yaml_form.add_error("config_yaml", [f"{f}: {m}" for f, m in exc.errors])
        else:
            messages.error(request, str(exc))
        return None
    except services.BrokerUnavailable as exc:
        messages.error(request, str(exc))
        return redirect("runs:detail", pk=exc.run.pk)
    # run-queued: the run page removes it once the run leaves the queue (run_live.js).
    messages.success(request, f"Run #{run.pk} queued.", extra_tags="run-queued")
    return redirect("runs:detail", pk=run.pk)


# --------------------------------------------------------------------------- run page


@researcher_required
@require_GET
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("created_by", "project", "cloned_from"), pk=pk)
    samples = queries.latest_samples(run.pk, limit=NEWEST_SAMPLES)
    logs = list(RunLog.objects.filter(run_id=run.pk).order_by("-id")[:LOG_TAIL])[::-1]
    checkpoints = list(Checkpoint.objects.filter(run_id=run.pk).order_by("step"))
    live = {
        "actions_url": reverse("runs:actions", args=[run.pk]),
        "placement_url": reverse("runs:placement", args=[run.pk]),
        "run_id": run.pk,
        "ws_path": f"/ws/runs/{run.pk}/",
        "series_url": reverse("runs:series", args=[run.pk]),
        "overview_points": queries.OVERVIEW_POINTS,
        "sample_cursor": max((s["id"] for s in samples), default=0),
        "log_cursor": logs[-1].id if logs else 0,
        "groups": _chart_groups(),
        "hidden_keys": _hidden_keys(run),
        "status": run.status,
        "cancel_requested": run.cancel_requested,
    }
    return render(
        request,
        "runs/run_detail.html",
        {
            "run": run,
            "samples": samples,
            "logs": logs,
            "checkpoints": checkpoints,
            "config_yaml": dump_yaml(_schema_ordered(run.config or {})),
            "live": live,
            "actions": lifecycle.actions(run),
            "panels": extensions.run_panels(request, run),
        },
    )


@researcher_required
@require_GET
def run_actions(request: HttpRequest, pk: int) -> HttpResponse:
    """The run page's buttons as an HTML fragment: the page swaps it in when a status message
    arrives, so Resume or Retry shows up without a reload (``lifecycle.actions`` decides)."""
    run = get_object_or_404(Run, pk=pk)
    return render(request, "runs/_run_actions.html", {"run": run, "actions": lifecycle.actions(run)})


def _schema_ordered(config: dict[str, Any]) -> dict[str, Any]:
    """The config in the schema's key order (PostgreSQL's jsonb sorts keys), as the form shows it."""
    try:
        return parse_config(dict(config)).to_dict()
    except ConfigError:
        return config


def _float_param(request: HttpRequest, name: str) -> float | None:
    raw = request.GET.get(name, "")
    if raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number") from None


@researcher_required
@require_GET
@gzip_page  # the first paint's overview of 20 series: 230 kB of JSON, 21 kB gzip-compressed
def run_series(request: HttpRequest, pk: int) -> HttpResponse:
    """Chart data. The cursor is read BEFORE the series so that the websocket catch-up from it can
    only repeat points (the browser dedupes by key and step), never miss one.

    One read of the run row serves the 404 check, the name and the status message (it used to be
    read twice), and only the columns those need: the config can be large."""
    run = get_object_or_404(Run.objects.only("pk", "name", *protocol.STATUS_FIELDS), pk=pk)
    try:
        x0 = _float_param(request, "x0")
        x1 = _float_param(request, "x1")
        max_points = int(request.GET.get("max_points") or 2000)
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    keys_raw = request.GET.get("keys", "")
    keys = [k for k in keys_raw.split(",") if k] if keys_raw else None

    text = queries.run_series_text(run, keys, max_points=max_points, x0=x0, x1=x1, group_of=metric_group)
    return HttpResponse(text, content_type="application/json")


@researcher_required
@require_GET
def run_metrics_export(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)
    return _export([run.pk], fmt, f"run-{run.pk}-metrics")


def _export(ids: list[int], fmt: str, stem: str) -> HttpResponse:
    if fmt == "csv":
        resp = StreamingHttpResponse(queries.metrics_csv(ids), content_type="text/csv")
    elif fmt == "json":
        resp = HttpResponse(queries.metrics_json_text(ids), content_type="application/json")
    else:
        raise Http404("format must be csv or json")
    resp["Content-Disposition"] = f'attachment; filename="{stem}.{fmt}"'
    return resp


# --------------------------------------------------------------------------- actions (POST + CSRF)


def _service_call(request: HttpRequest, fn: Any, *args: Any, ok: str, **kwargs: Any) -> Any:
    try:
        result = fn(*args, **kwargs)
    except services.BrokerUnavailable as exc:
        messages.error(request, str(exc))
        return exc.run
    except services.ServiceError as exc:
        messages.error(request, str(exc))
        return None
    messages.success(request, ok)
    return result


@researcher_required
@require_POST
def run_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)
    _service_call(request, lifecycle.cancel_run, run, ok=f"Cancel requested for run #{run.pk}.")
    return redirect("runs:detail", pk=run.pk)


@researcher_required
@require_POST
def run_retry(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)
    new = _service_call(request, lifecycle.retry_run, run, user=request.user, ok="Run queued again.")
    return redirect("runs:detail", pk=(new or run).pk)


@researcher_required
@require_POST
def run_resume(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)
    _service_call(request, lifecycle.resume_run, run, ok="Run resumes from its last checkpoint.")
    return redirect("runs:detail", pk=run.pk)


@researcher_required
@require_GET
def run_clone(request: HttpRequest, pk: int) -> HttpResponse:
    """Clone-and-edit: the launch form prefilled with this run's config (nothing is saved yet)."""
    run = get_object_or_404(Run, pk=pk)
    return redirect(f"{reverse('runs:launch')}?clone={run.pk}")


@researcher_required
@require_http_methods(["GET", "POST"])
def run_delete(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)
    if request.method == "GET":
        return render(
            request,
            "runs/run_confirm_delete.html",
            {
                "run": run,
                "n_points": run.metric_points.count(),
                "n_samples": run.samples.count(),
                "files_kept_because": lifecycle.files_deletable(run),
            },
        )
    delete_files = request.POST.get("delete_files") == "on"
    try:
        kept = lifecycle.delete_run(run, delete_files=delete_files)
    except services.ServiceError as exc:
        messages.error(request, str(exc))
        return redirect("runs:detail", pk=run.pk)
    if kept:
        messages.warning(request, f"Run #{pk} deleted; its files were kept: {kept}.")
    else:
        messages.success(
            request, f"Run #{pk} deleted" + (" with its run directory." if delete_files else ".")
        )
    return redirect("runs:list")


@researcher_required
@require_POST
def run_update_meta(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)
    meta = RunMetaForm(request.POST)
    if meta.is_valid():
        try:
            services.update_run_meta(run, tags=meta.cleaned_data["tags"], notes=meta.cleaned_data["notes"])
        except services.InvalidState as exc:
            messages.error(request, str(exc))
            return redirect("runs:detail", pk=run.pk)
        messages.success(request, "Saved.")
    else:
        messages.error(request, "; ".join(f"{k}: {', '.join(v)}" for k, v in meta.errors.items()))
    return redirect("runs:detail", pk=run.pk)


# --------------------------------------------------------------------------- compare


def _ids_param(request: HttpRequest) -> list[int]:
    raw: list[str] = []
    for value in request.GET.getlist("ids"):
        raw.extend(value.split(","))
    ids: list[int] = []
    for r in raw:
        r = r.strip().lstrip("#")
        if r.isdigit() and int(r) not in ids:
            ids.append(int(r))
    return ids


@researcher_required
@require_GET
def compare(request: HttpRequest) -> HttpResponse:
    ids = _ids_param(request)
    if len(ids) > MAX_COMPARE:
        return HttpResponseBadRequest(f"compare at most {MAX_COMPARE} runs at once")
    by_id = {r.pk: r for r in Run.objects.filter(pk__in=ids)}
    runs = [by_id[i] for i in ids if i in by_id]
    if len(runs) < 2:
        messages.error(request, "Select at least two runs to compare.")
        return redirect("runs:list")
    diff = queries.config_diff(runs)
    finals = queries.final_metrics(runs)
    side = queries.samples_side_by_side(runs)
    side_rows = [
        {"prompt": s["prompt"], "references": s["references"], "cells": [s["by_run"].get(r.pk) for r in runs]}
        for s in side
    ]
    diff_rows = [{"key": d["key"], "values": [_show(v) for v in d["values"]]} for d in diff]
    # Final metrics transposed (a row per metric, a column per run) and grouped like the charts.
    final_groups = _by_group(
        finals["table"],
        lambda row: row["key"],
        lambda row: {
            "key": row["key"],
            "direction": row["direction"],
            "cells": [
                {"run": r, "value": v, "best": i in row["best"]}
                for i, (r, v) in enumerate(zip(runs, row["values"]))
            ],
        },
    )
    # One chart per metric (a curve per run), in the run page's groups (``metric_group``).
    chart_groups = _by_group(queries.metric_keys([r.pk for r in runs]), lambda k: k, lambda k: k)
    live = {
        "runs": [
            {
                "id": r.pk,
                "name": r.name,
                "series_url": reverse("runs:series", args=[r.pk]),
                "color": queries.run_color(i),
            }
            for i, r in enumerate(runs)
        ],
        "groups": _chart_groups(),
    }
    return render(
        request,
        "runs/compare.html",
        {
            "runs": runs,
            "diff_rows": diff_rows,
            "final_groups": final_groups,
            "n_final": len(finals["table"]),
            "chart_groups": chart_groups,
            "side_rows": side_rows,
            "live": live,
            "legend": [{"run": r, "color": queries.run_color(i)} for i, r in enumerate(runs)],
            "ids_param": ",".join(str(r.pk) for r in runs),
        },
    )


def _by_group(
    items: list[Any], key_of: Callable[[Any], str], row_of: Callable[[Any], Any]
) -> list[dict[str, Any]]:
    """Items sorted into the run page's chart groups (``metric_group``), in METRIC_GROUPS order; empty
    groups left out: ``[{"id", "title", "rows": [row_of(item), ...]}]``."""
    groups = {g["id"]: {"id": g["id"], "title": g["title"], "rows": []} for g in _chart_groups()}
    for item in items:
        groups[metric_group(key_of(item))]["rows"].append(row_of(item))
    return [g for g in groups.values() if g["rows"]]


def _show(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


@researcher_required
@require_GET
def compare_export(request: HttpRequest, fmt: str) -> HttpResponse:
    ids = _ids_param(request)[:MAX_COMPARE]
    return _export(ids, fmt, "runs-" + "-".join(map(str, ids)) + "-metrics")


# --------------------------------------------------------------------------- import


@researcher_required
@require_http_methods(["GET", "POST"])
def import_run(request: HttpRequest) -> HttpResponse:
    form = ImportRunForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        already = Run.objects.filter(run_dir=str(form.cleaned_data["path"])).first()
        try:
            run = services.import_run_dir(
                form.cleaned_data["path"], user=request.user, tags=form.cleaned_data["tags"]
            )
        except services.ConfigInvalid as exc:
            form.add_error("path", f"{exc}")
        except services.ServiceError as exc:  # PathNotAllowed included
            form.add_error("path", str(exc))
        except (OSError, ValueError) as exc:
            form.add_error("path", f"could not read the run directory: {exc}")
        else:
            if already is not None:
                messages.info(request, f"{run.run_dir} is already run #{run.pk}; nothing was imported again.")
            else:
                messages.success(request, f"Imported run #{run.pk}.")
            return redirect("runs:detail", pk=run.pk)
    return render(request, "runs/import.html", {"form": form, "roots": paths.allowed_roots()})
