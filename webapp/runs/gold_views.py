"""Endpoints of the over-optimisation watch's jobs (``webapp/runs/gold_jobs.py``): start, cancel and
retry a gold after the fact, export a checkpoint and retry a failed export, download an export, and
the jobs' progress as JSON for the run page.

Every view requires a researcher (annotators are sent to the annotation app); every state change is
a POST with CSRF. Errors come back as a message naming the field, on the run page's panel.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from webapp.access import researcher_required
from webapp.runs import gold_jobs, paths
from webapp.runs.errors import PathNotAllowed
from webapp.runs.models import Artifact, Run

PANEL = "#overopt-panel"


def _back(run: Run) -> HttpResponse:
    return redirect(reverse("runs:detail", args=[run.pk]) + PANEL)


@researcher_required
@require_http_methods(["GET", "POST"])
def gold_start(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the form (its menu lists the registered rewards, which loads their modules: a page of
    its own keeps that off the run page). POST: validate, queue, back to the run page's panel; a
    refusal shows the form again with the message naming the field and the values kept."""
    run = get_object_or_404(Run, pk=pk)
    values = {k: request.POST.get(k, "") for k in ("gold", "args", "label", "prompts")}
    error, field = "", ""
    if request.method == "POST":
        try:
            spec, label = gold_jobs.clean_gold_request(values["gold"], values["args"], values["label"])
            prompts = gold_jobs.clean_prompts(values["prompts"])
            job = gold_jobs.start_gold_job(run, spec, label, user=request.user, prompts=prompts)
        except gold_jobs.GoldJobError as exc:
            error, field = f"Gold not started: {exc}", exc.field.split(".", 1)[0]
        else:
            what = (
                f"re-generating on {prompts} prompts per checkpoint, then scoring"
                if prompts
                else "scoring the evaluation generations"
            )
            messages.success(request, f"Gold {job.name!r} queued: {what}.")
            return _back(run)
    ctx = {"run": run, "choices": gold_jobs.gold_choices(), "values": values, "error": error, "field": field,
           "n_steps": len(gold_jobs.eval_steps(run.pk)), "max_prompts": gold_jobs.MAX_PROMPTS,
           "n_checkpoints": len(gold_jobs.existing_checkpoints(run.pk)[0])}  # fmt: skip
    return render(request, "runs/gold_new.html", ctx, status=400 if error else 200)


@researcher_required
@require_POST
def checkpoint_export(request: HttpRequest, pk: int, step: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=pk)
    try:
        gold_jobs.start_export_job(run, step, user=request.user)
    except gold_jobs.GoldJobError as exc:
        messages.error(request, f"Export not started: {exc}", extra_tags="gold-error")
    return _back(run)


def _act(
    request: HttpRequest,
    pk: int,
    action: Callable[..., Artifact],
    key: int,
    refused: str,
    said: Callable[[Artifact], str],
) -> HttpResponse:
    """A confirmed job action of the panel (cancel, retry: ``action(run, key, user=...)``): done, its
    outcome is said; refused, the reason (naming the job and its state) is said after ``refused``;
    back to the panel either way."""
    run = get_object_or_404(Run, pk=pk)
    try:
        job = action(run, key, user=request.user)
    except gold_jobs.GoldJobError as exc:
        messages.error(request, f"{refused}: {exc}", extra_tags="gold-error")
    else:
        messages.success(request, said(job))
    return _back(run)


def _attempt(job: Artifact) -> int:
    return len(job.meta["attempts"]) + 1


def _export_retry_said(job: Artifact) -> str:
    return (
        f"Export of checkpoint {job.name} (step {job.meta['step']}) queued again (attempt {_attempt(job)})."
    )


@researcher_required
@require_POST
def checkpoint_export_retry(request: HttpRequest, pk: int, step: int) -> HttpResponse:
    """Queue a failed (or dead worker's) export again on its row, the earlier attempts kept (the
    page asks for confirmation first); a queued, running or succeeded export is refused, saying so."""
    return _act(request, pk, gold_jobs.retry_export_job, step, "Not retried", _export_retry_said)


def _cancel_said(job: Artifact) -> str:
    if job.meta.get("status") == "cancelled":
        return f"Gold {job.name!r} cancelled before it started."
    return (
        f"Gold {job.name!r} is being cancelled: the worker stops before the next evaluation step and "
        "keeps the steps it has scored."
    )


@researcher_required
@require_POST
def gold_cancel(request: HttpRequest, pk: int, job_id: int) -> HttpResponse:
    """Cancel a gold job (the page asks for confirmation first); an ended job is refused, saying so."""
    return _act(request, pk, gold_jobs.cancel_gold_job, job_id, "Not cancelled", _cancel_said)


def _retry_said(job: Artifact) -> str:
    kept = job.meta.get("done", 0)
    return f"Gold {job.name!r} queued again (attempt {_attempt(job)})" + (
        f"; steps already scored, kept: {kept}." if kept else "."
    )


@researcher_required
@require_POST
def gold_retry(request: HttpRequest, pk: int, job_id: int) -> HttpResponse:
    """Queue a failed or cancelled gold job again (the page asks for confirmation first); a queued,
    running or succeeded job is refused, naming it and its state."""
    return _act(request, pk, gold_jobs.retry_gold_job, job_id, "Not retried", _retry_said)


@researcher_required
@require_GET
def jobs_json(request: HttpRequest, pk: int) -> JsonResponse:
    run = get_object_or_404(Run.objects.only("pk"), pk=pk)
    gold_jobs.fail_stale_jobs(run_ids=[run.pk])  # a dead worker's job shows failed while polled
    jobs = [gold_jobs.job_json(j) for j in gold_jobs.jobs_of(run)]
    for j in jobs:
        j.pop("path", None)  # the page links the download; the server path is not needed in JSON
    return JsonResponse({"jobs": jobs})


def _tar_stream(root: Path) -> Iterator[bytes]:
    """A .tar.gz of ``root`` written as it is read: no temporary file, memory of one chunk."""

    class Sink:
        def __init__(self) -> None:
            self.chunks: list[bytes] = []

        def write(self, data: bytes) -> int:
            self.chunks.append(bytes(data))
            return len(data)

        def take(self) -> bytes:
            out, self.chunks = b"".join(self.chunks), []
            return out

    sink = Sink()
    with tarfile.open(fileobj=sink, mode="w|gz") as tar:  # type: ignore[call-overload]
        for path in sorted(root.rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue  # only the export's own files (the worker wrote no links)
            tar.add(str(path), arcname=f"{root.name}/{path.relative_to(root)}", recursive=False)
            yield sink.take()
    yield sink.take()


@researcher_required
@require_GET
def checkpoint_download(request: HttpRequest, pk: int, step: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.only("pk"), pk=pk)
    job = gold_jobs.succeeded_export(run.pk, step)
    if job is None:
        raise Http404(f"step {step} of run #{pk} is not exported")
    try:
        root = paths.check_path(job.path, paths.read_roots())
    except PathNotAllowed as exc:
        raise Http404(str(exc)) from None
    if not root.is_dir():
        raise Http404("the export's directory is gone; export the checkpoint again")
    resp = StreamingHttpResponse(_tar_stream(root), content_type="application/gzip")
    resp["Content-Disposition"] = f'attachment; filename="run-{run.pk}-step-{step}.tar.gz"'
    return resp
