"""Celery tasks: execute one run with the engine; find runs whose worker died.

``execute_run`` receives a run id (never a model object), claims the run atomically
(queued → running), heartbeats from a side thread, and hands ``engine.train`` a ``Recorder``
(``webapp/runs/recorder.py``) that stores every event in PostgreSQL and THEN broadcasts it to the run's
Channels group.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import traceback as tb
from pathlib import Path
from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from webapp.runs import services
from webapp.runs.broadcast import broadcast, status_message
from webapp.runs.models import Artifact, Run, RunStatus
from webapp.runs.recorder import Recorder, _jsonable, _with_db_retry  # noqa: F401

log = logging.getLogger(__name__)

# The recorder moved to webapp/runs/recorder.py; the old name stays importable until callers switch.
DbSink = Recorder


class Heartbeat(threading.Thread):
    """Writes ``heartbeat_at`` every interval and mirrors ``cancel_requested`` into an Event, so
    the training thread's ``should_stop`` costs nothing."""

    def __init__(self, run_id: int, interval: float):
        super().__init__(name=f"heartbeat-{run_id}", daemon=True)
        self.run_id = run_id
        self.interval = interval
        self.stop_requested = threading.Event()
        self._done = threading.Event()

    def run(self) -> None:
        try:
            while not self._done.is_set():
                try:
                    Run.objects.filter(pk=self.run_id).update(heartbeat_at=timezone.now())
                    if Run.objects.filter(pk=self.run_id, cancel_requested=True).exists():
                        self.stop_requested.set()
                except Exception:  # noqa: BLE001 - a DB blip must not kill the run
                    log.warning("heartbeat of run %s failed", self.run_id, exc_info=True)
                    close_old_connections()
                self._done.wait(self.interval)
        finally:
            connection.close()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def _worker_name(task: Any) -> str:
    name = getattr(getattr(task, "request", None), "hostname", None)
    return name or f"{socket.gethostname()}:{os.getpid()}"


@shared_task(name="webapp.runs.tasks.execute_run", bind=True, acks_late=False, ignore_result=True)
def execute_run(self: Any, run_id: int) -> str:
    """Claim the run (queued → running), train it, record the outcome. Returns the final status."""
    import engine

    now = timezone.now()
    worker = _worker_name(self)
    claimed = Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
        status=RunStatus.RUNNING,
        started_at=now,
        heartbeat_at=now,
        worker_host=worker[:200],
        worker_pid=os.getpid(),
        progress=0.0,
        finished_at=None,
    )
    if not claimed:
        run = Run.objects.filter(pk=run_id).first()
        return run.status if run else "missing"
    run = Run.objects.get(pk=run_id)
    broadcast(run_id, status_message(run))

    config = dict(run.config)
    train_cfg = dict(config.get("train") or {})
    if not train_cfg.get("output_dir"):
        out = run.resume_from or str(Path(settings.RUNS_DIR) / f"run-{run_id}")
        train_cfg["output_dir"] = out
        config["train"] = train_cfg
    Path(train_cfg["output_dir"]).mkdir(parents=True, exist_ok=True)
    Run.objects.filter(pk=run_id).update(run_dir=train_cfg["output_dir"])

    beat = Heartbeat(run_id, settings.GRUE_HEARTBEAT_INTERVAL)
    beat.start()
    sink = Recorder(run_id)
    status = RunStatus.SUCCEEDED
    error = ""
    trace = ""
    summary: dict[str, Any] | None = None
    try:
        summary = engine.train(
            config, sink=sink, should_stop=beat.stop_requested.is_set, resume_from=run.resume_from or None
        )
        sink.flush()
        if beat.stop_requested.is_set() or Run.objects.filter(pk=run_id, cancel_requested=True).exists():
            status = RunStatus.CANCELLED
    except BaseException as exc:  # noqa: BLE001 - record every failure, then re-raise the fatal ones
        status = RunStatus.FAILED
        error = f"{type(exc).__name__}: {exc}"
        trace = tb.format_exc()
        try:
            sink.flush()
        except Exception:  # noqa: BLE001
            log.warning("final flush of run %s failed", run_id, exc_info=True)
        if not isinstance(exc, Exception):
            _finish(run_id, status, error, trace, summary)
            beat.stop()
            raise
    finally:
        beat.stop()
    _finish(run_id, status, error, trace, summary)
    return status


def _finish(run_id: int, status: str, error: str, trace: str, summary: dict[str, Any] | None) -> None:
    fields: dict[str, Any] = {"status": status, "finished_at": timezone.now(), "heartbeat_at": timezone.now()}
    if status == RunStatus.SUCCEEDED:
        fields["progress"] = 1.0
        fields["eta_seconds"] = 0.0
    if error:
        fields["error"] = error[:10000]
        fields["traceback"] = trace
    if summary is not None:
        fields["summary"] = _jsonable(summary)
    Run.objects.filter(pk=run_id).update(**fields)
    model_dir = (summary or {}).get("model_dir")
    if model_dir and not Artifact.objects.filter(run_id=run_id, kind="model", path=str(model_dir)).exists():
        Artifact.objects.create(run_id=run_id, name="final model", kind="model", path=str(model_dir))
    run = Run.objects.get(pk=run_id)
    broadcast(run_id, status_message(run))


@shared_task(name="webapp.runs.tasks.mark_lost_runs", ignore_result=True)
def mark_lost_runs() -> list[int]:
    """Periodic (celery beat) check: running runs whose heartbeat stopped become ``lost``."""
    return services.mark_lost_runs()


@worker_ready.connect
def _on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    """A (re)started worker cannot be running anything yet: runs it had claimed are lost."""
    try:
        hostname = getattr(sender, "hostname", None)
        if hostname:
            lost = services.mark_lost_runs(worker_host=hostname)
            if lost:
                log.warning("worker %s restarted: marked runs %s lost", hostname, lost)
        services.mark_lost_runs()
    except Exception:  # noqa: BLE001 - never keep a worker from starting
        log.exception("stale run check at worker start failed")
    finally:
        connection.close()
