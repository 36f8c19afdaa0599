"""A run's life: every status change and every ``can_*`` check, in one place.

::

    draft ──enqueue──► queued ──claim──► running ──finish──► succeeded | cancelled
      ▲                  │                  ├──fail────► failed
      │ broker down      │ cancel           ├──lost────► lost (heartbeat stopped, worker restarted)
      └──────────────────┘                  └──cancel──► (flag; the worker stops at its next step)
    failed | lost | cancelled ──resume──► queued (same run, from its last checkpoint)
    any finished run ──retry──► queued (same run if it never started, else a clone)

Views, templates (through ``actions``), the Celery task and the supervisor call these functions;
nothing else writes ``Run.status``. Each change is made under a row lock or a guarded UPDATE so
that two callers (a double click, a task delivered twice, a cancel racing a claim) cannot both win,
and the new status is broadcast to the run's page after the transaction commits.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import F, Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from webapp.celery import app as celery_app
from webapp.runs import paths, services, workers
from webapp.runs.broadcast import broadcast
from webapp.runs.errors import BrokerUnavailable, InvalidState, ServiceError
from webapp.runs.ingest import pg_text
from webapp.runs.models import ACTIVE_STATUSES, Artifact, Project, Run, RunStatus
from webapp.runs.protocol import status_message

log = logging.getLogger(__name__)

EXECUTE_TASK = "webapp.runs.tasks.execute_run"
RESUMABLE = (RunStatus.FAILED, RunStatus.LOST, RunStatus.CANCELLED)
RETRYABLE = (RunStatus.DRAFT, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.LOST, RunStatus.SUCCEEDED)


# --------------------------------------------------------------------------- can_* (buttons, refusals)


def is_reference(run: Run) -> bool:
    """A reference run: cancel, retry, resume, delete and editing its tags or notes are refused (clone
    & edit stays). The mark is ``worker_host`` (``Run.is_reference``), which only the server writes;
    the ``reference`` tag is for people and filters, and only the reference loader sets it."""
    return run.is_reference


def _refuse_reference(run: Run, action: str) -> None:
    if is_reference(run):
        raise InvalidState(f"run #{run.pk} is a reference run (shipped study results) and cannot be {action}")


def can_enqueue(run: Run) -> bool:
    return run.status == RunStatus.DRAFT and not is_reference(run)


def can_cancel(run: Run) -> bool:
    return (
        run.status in (RunStatus.DRAFT, RunStatus.QUEUED, RunStatus.RUNNING)
        and not (run.status == RunStatus.RUNNING and run.cancel_requested)
        and not is_reference(run)
    )


def can_retry(run: Run) -> bool:
    return run.status in RETRYABLE and not is_reference(run)


def can_resume(run: Run) -> bool:
    return (
        run.status in RESUMABLE and bool(run.run_dir) and run.checkpoints.exists() and not is_reference(run)
    )


def can_delete(run: Run) -> bool:
    return run.status not in ACTIVE_STATUSES and not is_reference(run)


def files_deletable(run: Run) -> str | None:
    """Why deleting ``run``'s directory with it is refused, or None when it may go.

    Only a directory the worker created for this run, strictly inside the runs directory, reached
    without a symlink, and referenced by no other run (as its directory, a resume source, or a path in
    its config: a model fine-tuned from this run's checkpoint) may be removed."""
    if not run.run_dir:
        return "the run has no directory"
    if not run.run_dir_owned:
        return f"{run.run_dir} was not created by the worker for this run (imported or chosen by hand)"
    root = paths.runs_root()
    real = paths.is_plain_dir_inside(run.run_dir, root)
    if real is None:
        return (
            f"{run.run_dir} is not a directory inside the runs directory {root} (or a symlink is on the way)"
        )
    others = Run.objects.exclude(pk=run.pk)
    prefix = str(real).rstrip("/") + "/"
    shared = others.filter(
        Q(run_dir=str(real)) | Q(run_dir__startswith=prefix) | Q(resume_from=str(real))
    ).first()
    if shared is None:
        shared = (
            others.annotate(config_text=Cast("config", TextField()))
            .filter(config_text__contains=str(real))
            .first()
        )
    if shared is not None:
        return f"{real} is still used by run #{shared.pk}"
    return None


def actions(run: Run) -> dict[str, bool]:
    """What the run page offers for ``run`` now (the buttons fragment renders from this)."""
    return {
        "cancel": can_cancel(run),
        "retry": can_retry(run),
        "resume": can_resume(run),
        "delete": can_delete(run),
        "enqueue": can_enqueue(run),
    }


# --------------------------------------------------------------------------- queueing


def launch_run(
    config: Mapping[str, Any],
    *,
    user: Any = None,
    name: str | None = None,
    project: Project | str | None = None,
    tags: Iterable[str] | str | None = None,
    notes: str = "",
    cloned_from: Run | None = None,
) -> Run:
    """Validate, save as ``queued`` and publish ``execute_run`` once the transaction commits.

    Raises ConfigInvalid (nothing saved) or BrokerUnavailable (run saved as draft with the error,
    so ``enqueue_run``/``retry_run`` can send it later: nothing is lost)."""
    with transaction.atomic():
        run = services.create_run(
            config, user=user, name=name, project=project, tags=tags, notes=notes, cloned_from=cloned_from
        )
        _queue(run)
    run.refresh_from_db()
    return run


def enqueue_run(run: Run) -> Run:
    """Queue an existing draft run (e.g. one whose first enqueue hit a broker outage)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if not can_enqueue(run):
            raise InvalidState(f"run #{run.pk} is {run.status}; only draft runs can be queued")
        _queue(run)
    run.refresh_from_db()
    return run


def _queue(run: Run) -> None:
    """Mark queued inside the caller's transaction; publish to the broker after commit. The task id
    is chosen here, so the worker can tell this delivery from a stale or repeated one."""
    run.status = RunStatus.QUEUED
    run.queued_at = timezone.now()
    run.finished_at = None
    run.cancel_requested = False
    run.error = ""
    run.traceback = ""
    run.attempts += 1
    run.task_id = uuid.uuid4().hex
    run.save()
    run_id, task_id = run.pk, run.task_id
    transaction.on_commit(lambda: publish(run_id, task_id))


def publish(run_id: int, task_id: str) -> None:
    """Send ``execute_run`` by name (the web side never imports the worker's module). A broker outage
    turns the run back into a draft that keeps the error, and raises BrokerUnavailable."""
    try:
        # A fresh connection per launch: a broker outage shows up here, fast, instead of in a
        # pooled connection's retry loop.
        # Socket timeouts: a broker that accepts but never answers (hung Redis) fails the launch in
        # about a second instead of holding the request.
        timeouts = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
        with celery_app.connection_for_write(transport_options=timeouts) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2, interval_max=0.5)
            celery_app.send_task(
                EXECUTE_TASK,
                args=[run_id],
                task_id=task_id,
                queue=workers.run_queue(Run.objects.only("config").get(pk=run_id).config),
                retry=False,
                connection=conn,
            )
    except Exception as exc:  # noqa: BLE001 - kombu/redis raise many types for "broker down"
        where = str(celery_app.conf.broker_url or "").split("@")[-1]
        msg = f"Could not reach the task broker ({where}): {exc}"
        Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
            status=RunStatus.DRAFT, error=msg, queued_at=None
        )
        run = Run.objects.get(pk=run_id)
        log.error("enqueue of run %s failed: %s", run_id, exc)
        raise BrokerUnavailable(
            msg + ". The run was saved as a draft; retry when the broker is back.", run
        ) from exc
    broadcast(run_id, status_message(Run.objects.get(pk=run_id)))


def _send_status(run: Run) -> None:
    msg = status_message(run)
    transaction.on_commit(lambda: broadcast(run.pk, msg))


# --------------------------------------------------------------------------- the worker's side


def claim(run_id: int, *, task_id: str | None, worker: str, pid: int | None = None) -> Run | None:
    """queued → running for exactly one delivery of the run's current task.

    Refused (None) when the run was cancelled meanwhile, when another delivery already claimed it
    (a redelivered message), or when the message belongs to an earlier attempt of the run."""
    now = timezone.now()
    guard = Q(pk=run_id, status=RunStatus.QUEUED, cancel_requested=False)
    if task_id:
        guard &= Q(task_id=task_id) | Q(task_id="")
    claimed = Run.objects.filter(guard).update(
        status=RunStatus.RUNNING,
        started_at=now,
        heartbeat_at=now,
        worker_host=worker[:200],
        worker_pid=pid if pid is not None else os.getpid(),
        progress=0.0,
        finished_at=None,
    )
    if not claimed:
        current = Run.objects.filter(pk=run_id).values_list("status", "task_id").first()
        log.warning(
            "task %s for run %s not claimed: run is %s (task %s)",
            task_id,
            run_id,
            current[0] if current else "missing",
            current[1] if current else "-",
        )
        return None
    run = Run.objects.get(pk=run_id)
    broadcast(run_id, status_message(run))
    return run


REMOTE_PREFIX = "remote:"


def is_remote(run: Run) -> bool:
    """A run trained on another machine and streamed in through the API (``webapp.api``)."""
    return run.worker_host.startswith(REMOTE_PREFIX)


def start_remote(run_id: int, host: str) -> Run | None:
    """draft → running for a run that a client trains elsewhere and streams in (``webapp.api``);
    ``worker_host`` becomes ``remote:<host>``. None when the run is not a draft (already started)."""
    now = timezone.now()
    started = Run.objects.filter(pk=run_id, status=RunStatus.DRAFT).update(
        status=RunStatus.RUNNING,
        started_at=now,
        heartbeat_at=now,
        worker_host=(REMOTE_PREFIX + host)[:200],
        worker_pid=None,
        progress=0.0,
        finished_at=None,
        attempts=F("attempts") + 1,
    )
    if not started:
        return None
    run = Run.objects.get(pk=run_id)
    broadcast(run_id, status_message(run))
    return run


def prepare_run_dir(run: Run) -> dict[str, Any]:
    """The config the worker trains, with its run directory decided, checked and created.

    Paths are checked again here, in the worker, right before training: a symlink swapped after the
    launch cannot lead the engine out of the allowed roots. A directory the worker creates is
    recorded as owned by the run (only such a directory is ever deleted with it)."""
    config = dict(run.config)
    train = dict(config.get("train") or {})
    services.check_config_paths(config, run_id=run.pk, resuming=bool(run.resume_from))
    owned = run.run_dir_owned
    if run.resume_from:
        out = paths.resolve(run.resume_from)
    elif train.get("output_dir"):
        out = paths.check_output_dir(train["output_dir"])
    else:
        out = paths.runs_root() / f"run-{run.pk}"
    if not run.resume_from:
        if out.exists() and paths.holds_a_run(out):
            raise ServiceError(f"{out} already holds a run (config.json or metrics.jsonl); choose another")
        try:
            out.mkdir(parents=True, exist_ok=False)
            owned = True
        except FileExistsError:
            owned = False
    train["output_dir"] = str(out)
    config["train"] = train
    try:
        with transaction.atomic():
            Run.objects.filter(pk=run.pk).update(run_dir=str(out), run_dir_owned=owned)
    except IntegrityError:  # another run took the directory between the check and now
        owner = services.run_dir_owner(out, exclude=run.pk)
        raise ServiceError(f"{out} belongs to run #{owner.pk if owner else '?'}") from None
    return config


def cancel_requested(run_id: int) -> bool:
    """The worker's ``should_stop``: one indexed primary-key read, so the run stops at the engine's
    next step after a cancel (no heartbeat period to wait for)."""
    return Run.objects.filter(pk=run_id, cancel_requested=True).exists()


def finish(run_id: int, summary: Mapping[str, Any] | None) -> Run:
    """running → succeeded, or cancelled when the engine stopped on request. (The summary itself is
    stored by the recorder with the engine's ``finished`` event.)"""
    stopped = bool((summary or {}).get("stopped"))
    fields: dict[str, Any] = {"status": RunStatus.CANCELLED if stopped else RunStatus.SUCCEEDED}
    if not stopped:
        fields.update(progress=1.0, eta_seconds=0.0)
    model_dir = (summary or {}).get("model_dir")

    def record_model() -> None:
        # In the status's transaction: a page that reacts to "succeeded" finds the final model.
        if (
            model_dir
            and not Artifact.objects.filter(run_id=run_id, kind="model", path=str(model_dir)).exists()
        ):
            Artifact.objects.create(run_id=run_id, name="final model", kind="model", path=str(model_dir))

    return _end(run_id, fields, also=record_model)


def fail(run_id: int, error: str, traceback: str = "") -> Run:
    """running → failed, keeping the cause and the traceback for the run page."""
    return _end(
        run_id,
        {
            "status": RunStatus.FAILED,
            "error": pg_text(str(error))[:10000],
            "traceback": pg_text(str(traceback)),
        },
    )


def _end(run_id: int, fields: dict[str, Any], also: Callable[[], None] | None = None) -> Run:
    """``also`` writes what goes with the ending in the same transaction, before it is broadcast."""
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.status != RunStatus.RUNNING:
            # Marked lost meanwhile (a long outage of the heartbeat): the worker's outcome wins,
            # since it is the one that knows how the run ended.
            log.warning("run %s ended while %s; recording %s", run_id, run.status, fields["status"])
        for key, value in {**fields, "finished_at": now, "heartbeat_at": now}.items():
            setattr(run, key, value)
        run.save()
        if also is not None:
            also()
        _send_status(run)
    return run


def _alive_key(run_id: int) -> str:
    return f"run-alive:{run_id}"


def note_alive(run_id: int) -> None:
    """The worker's second heartbeat, in Redis (the cache), beside ``heartbeat_at`` in PostgreSQL.

    Why two: during a database outage the worker keeps training (the recorder buffers and retries for
    minutes) but cannot write ``heartbeat_at``, while the watchdog may still reach the database; on
    ``heartbeat_at`` alone it would mark the run lost and queue it again, and a free worker would train
    the same run twice into the same directory (measured by bench/outage.py --spare-worker). The key
    holds the time of the beat and the watchdog judges its age with its own ``GRUE_LOST_AFTER``, so a
    dead worker is noticed as soon as before."""
    cache.set(_alive_key(run_id), time.time(), timeout=max(60, int(settings.GRUE_LOST_AFTER)))


def seems_alive(run_id: int, within: float) -> bool:
    """Whether the run's worker sent its Redis heartbeat in the last ``within`` seconds (False when
    Redis cannot be asked: then ``heartbeat_at`` alone decides, as before). The age is judged here,
    with the watchdog's own limit; the key's expiry only clears keys of runs that ended."""
    try:
        beat = cache.get(_alive_key(run_id))
    except Exception:  # noqa: BLE001 - Redis down or hung: fall back to the database heartbeat
        log.warning("could not read the Redis heartbeat of run %s", run_id, exc_info=True)
        return False
    return isinstance(beat, int | float) and time.time() - beat < within


def mark_lost_runs(
    older_than: float | None = None, *, worker_host: str | None = None, run_ids: Iterable[int] | None = None
) -> list[int]:
    """running → lost for runs whose heartbeat stopped. With ``worker_host`` every run that host
    claimed is lost (a restarted worker cannot still be running them). ``run_ids`` limits the check
    (the live page checks its own run when a browser subscribes, so a dead worker shows up even
    where no beat scheduler runs)."""
    qs = Run.objects.filter(status=RunStatus.RUNNING)
    if run_ids is not None:
        qs = qs.filter(pk__in=list(run_ids))
    if worker_host is not None:
        qs = qs.filter(worker_host=worker_host)
    age = older_than if older_than is not None else settings.GRUE_LOST_AFTER
    if worker_host is None:
        limit = timezone.now() - timedelta(seconds=age)
        qs = qs.filter(Q(heartbeat_at__lt=limit) | Q(heartbeat_at__isnull=True, started_at__lt=limit))
    ids = []
    for run_id in qs.values_list("pk", flat=True):
        if worker_host is None and seems_alive(run_id, within=age):
            # Its worker is alive and reaches Redis; only its database writes stop (an outage).
            log.warning("run %s: no database heartbeat for a while, but its worker is alive", run_id)
            continue
        if mark_lost(run_id):
            ids.append(run_id)
    return ids


INTERRUPTED_PREFIX = "Interrupted at iteration"


def interrupted_reason(summary: Mapping[str, Any]) -> str:
    """Why a run a worker stopped at its shutdown is ``lost``: the status and the log tail say it was
    interrupted (not crashed), with a checkpoint, and will resume; ``webapp.watchdog`` reads the prefix."""
    return (
        f"{INTERRUPTED_PREFIX} {summary.get('iterations', '?')}: the worker was stopped (GRUE Studio shut "
        "down). A checkpoint was saved there; the run resumes from it automatically when a worker is back "
        "(or press Resume)."
    )


def mark_lost(run_id: int, reason: str = "") -> bool:
    """running → lost (False when the run is no longer running)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.status != RunStatus.RUNNING:
            return False
        beat = run.heartbeat_at.isoformat() if run.heartbeat_at else "never"
        why = reason or f"Worker {run.worker_host or '?'} stopped sending heartbeats (last: {beat})."
        if run.checkpoints.exists():
            why += " The run can be resumed from its last checkpoint."
        run.status = RunStatus.LOST
        run.finished_at = timezone.now()
        run.error = why
        run.save(update_fields=["status", "finished_at", "error"])
        _send_status(run)
    return True


# --------------------------------------------------------------------------- the researcher's actions


def cancel_run(run: Run) -> Run:
    """A draft or queued run is cancelled at once (its queued message is revoked and the worker's
    claim refuses it anyway); a running one gets ``cancel_requested``, which the worker reads at the
    engine's next step."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        _refuse_reference(run, "cancelled")
        if not can_cancel(run):
            raise InvalidState(
                f"run #{run.pk} is already {run.status}"
                + (" (cancel requested)" if run.status == RunStatus.RUNNING else "")
            )
        if run.status in (RunStatus.DRAFT, RunStatus.QUEUED):
            run.status = RunStatus.CANCELLED
            run.cancel_requested = True
            run.finished_at = timezone.now()
            run.save(update_fields=["status", "cancel_requested", "finished_at"])
            task_id = run.task_id
            if task_id:
                transaction.on_commit(lambda: _revoke(task_id))
        else:
            run.cancel_requested = True
            run.save(update_fields=["cancel_requested"])
        _send_status(run)
    return run


def _revoke(task_id: str) -> None:
    try:
        celery_app.control.revoke(task_id)
    except Exception:  # noqa: BLE001 - the worker's claim refuses a cancelled run anyway
        log.warning("revoke of %s failed", task_id, exc_info=True)


def retry_run(run: Run, *, user: Any = None) -> Run:
    """Run it again. A run that never started (broker outage, cancelled while queued) is re-queued in
    place; one that produced data gets a fresh run (cloned) so that curves never mix. The clone gets a
    new run directory: the old one stays the old run's."""
    run.refresh_from_db()
    _refuse_reference(run, "retried")
    if not can_retry(run):
        raise InvalidState(f"run #{run.pk} is still {run.status}")
    never_started = run.started_at is None and not run.metric_points.exists()
    if never_started:
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            if not can_retry(locked):
                raise InvalidState(f"run #{run.pk} is still {locked.status}")
            _queue(locked)
        run.refresh_from_db()
        return run
    config = dict(run.config)
    if (config.get("train") or {}).get("output_dir"):
        config["train"] = {**config["train"], "output_dir": None}
    with transaction.atomic():
        new = services.clone_run(run, user=user or run.created_by, config=config, name=f"{run.name} (retry)")
        _queue(new)
    new.refresh_from_db()
    return new


def resume_run(run: Run) -> Run:
    """Continue a failed/lost/cancelled run from its last checkpoint, in place (same curves). Steps
    already stored are kept (ingest is idempotent on run/key/step)."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        _refuse_reference(locked, "resumed")
        if locked.status not in RESUMABLE:
            raise InvalidState(
                f"run #{run.pk} is {locked.status}; only failed, lost or cancelled runs resume"
            )
        if not locked.run_dir or not locked.checkpoints.exists():
            raise InvalidState(f"run #{run.pk} has no checkpoint to resume from")
        locked.resume_from = locked.run_dir
        _queue(locked)
    run.refresh_from_db()
    return run


def delete_run(run: Run, *, delete_files: bool = False) -> str | None:
    """Delete a run and its rows (active runs must be cancelled first). With ``delete_files`` its
    directory goes too, but only when ``files_deletable`` allows it; otherwise the files stay and the
    reason is returned (the view shows it)."""
    run.refresh_from_db()
    _refuse_reference(run, "deleted")
    if not can_delete(run):
        raise InvalidState(f"run #{run.pk} is {run.status}; cancel it before deleting")
    kept: str | None = None
    target: Path | None = None
    if delete_files:
        kept = files_deletable(run)
        if kept is None:
            target = paths.is_plain_dir_inside(run.run_dir, paths.runs_root())
    run_id = run.pk
    with transaction.atomic():
        # FOR UPDATE waits for batches being stored (they hold KEY SHARE, see ingest._lock_run) and
        # keeps new ones out until the run and its points are gone: metric chunks and rollups have no
        # FK constraint (Django's cascade deletes them with the run).
        list(Run.objects.select_for_update().filter(pk=run_id).values_list("pk", flat=True))
        run.delete()
    if target is not None:
        try:
            shutil.rmtree(target)  # unlinks symlinks found inside the tree; never follows them
        except OSError as exc:
            log.warning("could not remove %s of deleted run %s", target, run_id, exc_info=True)
            kept = f"removing {target} failed: {exc}"
    return kept
