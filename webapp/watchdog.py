"""The run watchdog: finds runs whose worker died and resumes them from their last checkpoint.

Why a process of its own (``manage.py watch_runs``, started and supervised by ``manage.py up``, a
unit/service of its own in deploy/): the old Celery beat task sat on the training queue, so with
every worker busy training a dead run was noticed minutes late (issue 14 item 2). The watchdog needs
no free training slot, so a dead run is marked lost within ``GRUE_LOST_AFTER`` + ``GRUE_WATCH_INTERVAL``.

Automatic resume (issue 14 item 1) mirrors Celery's ``acks_late`` + ``reject_on_worker_lost``
redelivery: a lost run that has a checkpoint is queued again (``lifecycle.resume_run``), at most
``GRUE_AUTO_RESUME_LIMIT`` times per run (counted in ``Run.auto_resumes``); the queued message waits
in the broker until a worker is back. ``GRUE_AUTO_RESUME=0`` turns it off.

The jobs of the over-optimisation watch (a gold scored after the fact, a checkpoint export;
``webapp/runs/gold_jobs.py``) are watched in the same pass: one whose worker stopped heartbeating ends
``failed`` (:func:`mark_lost`, shared with the cron command ``manage.py mark_lost_runs``), so it can
be retried, whether or not anyone opens its run page. They are not resumed automatically.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import close_old_connections, connection, transaction

from webapp.runs import gold_jobs, ingest, lifecycle
from webapp.runs.broadcast import broadcast
from webapp.runs.errors import BrokerUnavailable, ServiceError
from webapp.runs.models import Run, RunLog, RunStatus
from webapp.runs.protocol import status_message

log = logging.getLogger(__name__)


@dataclass
class SweepResult:
    lost: list[int] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    #: Over-optimisation jobs (gold, export) whose worker died, now failed (``Artifact`` ids).
    failed_jobs: list[int] = field(default_factory=list)


def mark_lost(older_than: float | None = None) -> SweepResult:
    """Everything a dead worker left behind: running runs without a heartbeat become ``lost``, and
    gold and export jobs without one end ``failed`` (``gold_jobs.fail_stale_jobs``), both after
    ``older_than`` seconds (``GRUE_LOST_AFTER``). The watchdog's sweep and the cron command share it,
    so neither deployment path forgets the jobs."""
    return SweepResult(
        lost=lifecycle.mark_lost_runs(older_than), failed_jobs=gold_jobs.fail_stale_jobs(older_than)
    )


def auto_resume_lost_runs(limit: int | None = None) -> list[int]:
    """Queue again every lost run that has a checkpoint and automatic resumes left.

    The message goes to the broker after the resume commits (``lifecycle._queue``). When the broker
    cannot be reached, the launch path would keep the run as a retryable draft; here nobody is there
    to retry it, so the run goes back to ``lost`` as it was (:func:`_keep_lost`, the attempt not
    spent) and the next sweep tries again."""
    limit = int(settings.GRUE_AUTO_RESUME_LIMIT if limit is None else limit)
    resumed: list[int] = []
    candidates = Run.objects.filter(status=RunStatus.LOST, auto_resumes__lt=limit, checkpoints__isnull=False)
    # A remote run (webapp.api) trains on its client's machine: no local worker can resume it.
    candidates = candidates.exclude(worker_host__startswith=lifecycle.REMOTE_PREFIX)
    for run_id in candidates.values_list("pk", flat=True).distinct():
        before: dict = {}
        try:
            with transaction.atomic():
                run = Run.objects.select_for_update().get(pk=run_id)
                if run.status != RunStatus.LOST or run.auto_resumes >= limit:
                    continue
                before = {f: getattr(run, f) for f in _LOST_STATE}
                logged = (
                    RunLog.objects.filter(run_id=run_id).order_by("-pk").values_list("pk", flat=True).first()
                )
                _resume(run, limit)
        except BrokerUnavailable as exc:  # raised after commit, by the publish hook
            _keep_lost(run_id, before, logged or 0, exc)
            continue
        except ServiceError as exc:
            log.warning("automatic resume of run %s failed: %s", run_id, exc)
            continue
        resumed.append(run_id)
    return resumed


#: What ``lifecycle._queue`` and a failed publish change on a lost run: :func:`_keep_lost` restores it.
_LOST_STATE = (
    "error",
    "traceback",
    "finished_at",
    "queued_at",
    "cancel_requested",
    "attempts",
    "task_id",
    "auto_resumes",
    "resume_from",
)


def _resume(run: Run, limit: int) -> None:
    """Queue ``run`` (locked, lost) again and say why in its log, inside the caller's transaction."""
    # A run interrupted by a shutdown (webapp/runs/tasks.py) did not crash: its resume does not count
    # against the limit of automatic resumes after a worker died.
    interrupted = (run.error or "").startswith(lifecycle.INTERRUPTED_PREFIX)
    if not interrupted:
        run.auto_resumes += 1
        run.save(update_fields=["auto_resumes"])
    lifecycle.resume_run(run)
    # The reason, in the resume's transaction: the run page never shows the run queued again without
    # it. A savepoint: the line is a courtesy and must not undo the resume.
    line = (
        "interrupted by a shutdown; resumed automatically from its checkpoint"
        if interrupted
        else "worker lost; resumed automatically from the last checkpoint "
        f"(attempt {run.auto_resumes} of {limit})"
    )
    try:
        with transaction.atomic():
            ingest.add_log_lines(run.pk, [line])
    except Exception:  # noqa: BLE001 - the log line is a courtesy
        log.warning("could not log the automatic resume of run %s", run.pk, exc_info=True)


POSTPONED = "automatic resume postponed, the run stays lost until the next sweep"


def _keep_lost(run_id: int, before: dict, logged: int, exc: BrokerUnavailable) -> None:
    """Undo an automatic resume whose message never reached the broker: the run is ``lost`` again with
    its own error and its attempt given back, the resume's log line (after log row ``logged``) goes,
    and its log says why, so the next sweep resumes it."""
    reason = str(exc).split(". The run was saved as a draft")[0]
    log.warning("automatic resume of run %s postponed: %s", run_id, reason)
    with transaction.atomic():
        undone = Run.objects.filter(pk=run_id, status=RunStatus.DRAFT).update(status=RunStatus.LOST, **before)
        if undone:
            RunLog.objects.filter(
                run_id=run_id, pk__gt=logged, line__contains="resumed automatically"
            ).delete()
            last = RunLog.objects.filter(run_id=run_id).order_by("-pk").values_list("line", flat=True).first()
            # Once per outage, not once per sweep (every GRUE_WATCH_INTERVAL seconds while it lasts).
            if not (last or "").startswith(POSTPONED):
                ingest.add_log_lines(run_id, [f"{POSTPONED}: {reason}"])
    if undone:
        broadcast(run_id, status_message(Run.objects.get(pk=run_id)))


def sweep(*, auto_resume: bool | None = None) -> SweepResult:
    """One pass: running runs without a heartbeat become lost, and jobs without one fail
    (:func:`mark_lost`); lost runs with a checkpoint resume."""
    result = mark_lost()
    if settings.GRUE_AUTO_RESUME if auto_resume is None else auto_resume:
        result.resumed = auto_resume_lost_runs()
    return result


def watch(
    interval: float | None = None,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    report: Callable[[str], None] = print,
) -> None:
    """Sweep every ``interval`` seconds until ``should_stop``; a database outage only delays it."""
    interval = float(settings.GRUE_WATCH_INTERVAL if interval is None else interval)
    while not should_stop():
        try:
            res = sweep()
            if res.lost:
                report(f"marked lost: {res.lost}")
            if res.resumed:
                report(f"resumed from checkpoint: {res.resumed}")
            if res.failed_jobs:
                report(f"failed jobs of stopped workers: {res.failed_jobs}")
        except Exception as exc:  # noqa: BLE001 - keep watching through outages
            log.warning("run watchdog sweep failed: %s", exc)
            close_old_connections()
            connection.close()
        deadline = time.monotonic() + interval
        while not should_stop() and time.monotonic() < deadline:
            time.sleep(min(0.2, interval))
