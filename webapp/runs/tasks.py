"""Celery tasks: execute one run with the engine; find runs whose worker died.

``execute_run`` receives a run id (never a model object). Every status change is ``lifecycle``'s;
every stored event is the ``Recorder``'s (``webapp/runs/recorder.py``); this module only wires the
engine to them inside a worker, with a heartbeat thread beside the training.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import traceback as tb
from typing import Any

import torch
from celery import shared_task
from celery.signals import celeryd_after_setup, worker_ready, worker_shutting_down
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

import engine
from webapp import watchdog
from webapp.runs import launcher, lifecycle, workers
from webapp.runs.models import Run, RunStatus
from webapp.runs.recorder import Recorder, with_db_retry

log = logging.getLogger(__name__)


@shared_task(name=lifecycle.EXECUTE_TASK, bind=True, acks_late=False, ignore_result=True)
def execute_run(self: Any, run_id: int) -> str:
    """Claim the run (queued → running), train it, record the outcome. Returns the final status."""
    run = lifecycle.claim(run_id, task_id=self.request.id, worker=_worker_name(self))
    if run is None:  # cancelled meanwhile, delivered twice, or a stale attempt's message
        return "not claimed"
    recorder = Recorder(run_id)
    stop = StopCheck(run_id)
    beat = Heartbeat(run_id, settings.GRUE_HEARTBEAT_INTERVAL)
    beat.start()
    try:
        config = lifecycle.prepare_run_dir(run)
        if launcher.processes_of(config) > 1:  # torchrun, supervised here (webapp/runs/launcher.py)
            summary = launcher.run_distributed(
                run_id, config, run.resume_from or None, stop, launcher.cancel_grace_s()
            )
        else:
            summary = engine.train(
                config, sink=recorder, should_stop=stop, resume_from=run.resume_from or None
            )
        interrupted = bool(summary.get("stopped")) and stop.interrupted
        if interrupted:  # the log tail says so too, above the resume line that will follow it
            recorder.log(lifecycle.interrupted_reason(summary))
        recorder.close()  # everything stored before the status says so
        if interrupted:
            log.warning("run %s interrupted by the worker's shutdown; stored, marking it resumable", run_id)
            # Stopped for the worker's shutdown, not by the user: lost (resumable, and resumed by the
            # watchdog without counting against the crash limit), with the reason, never "cancelled".
            reason = lifecycle.interrupted_reason(summary)
            with_db_retry(lambda: lifecycle.mark_lost(run_id, reason), what=f"the end of run {run_id}")
            return RunStatus.LOST
        # The final status rides out a database outage as the recorder does (webapp/runs/recorder.py).
        return with_db_retry(
            lambda: lifecycle.finish(run_id, summary), what=f"the end of run {run_id}"
        ).status
    except BaseException as exc:  # noqa: BLE001 - record every failure, then re-raise the fatal ones
        trace = tb.format_exc()
        try:
            recorder.close()
        except Exception:  # noqa: BLE001 - the failure below is what the user must see
            log.warning("final flush of run %s failed", run_id, exc_info=True)
        error = f"{type(exc).__name__}: {exc}"
        with_db_retry(lambda: lifecycle.fail(run_id, error, trace), what=f"the end of run {run_id}")
        if not isinstance(exc, Exception):
            raise
        return RunStatus.FAILED
    finally:
        beat.stop()


# Set when this worker begins a warm shutdown (SIGTERM from ``manage.py up``, systemd, compose): the
# running run stops at the engine's next step with a checkpoint instead of holding the shutdown until
# it ends (then the supervisor's SIGKILL left it ``running`` until the next start marked it lost).
SHUTTING_DOWN = threading.Event()


@worker_shutting_down.connect
def _on_worker_shutting_down(sender: Any = None, **kwargs: Any) -> None:
    SHUTTING_DOWN.set()
    log.warning("worker shutting down: a running run stops at its next step with a checkpoint")


class StopCheck:
    """The engine's ``should_stop``: reads the run's cancel flag from the database at every call (one
    primary-key lookup, well under a millisecond, against steps of tens of milliseconds or more), so a
    cancel takes effect at the engine's next step. A database error counts as "go on": the recorder
    deals with outages, and the next call asks again. The worker's shutdown stops the run too
    (``interrupted``), so the caller records it as interrupted and resumable, not cancelled."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        self.fired = False
        self.interrupted = False

    def __call__(self) -> bool:
        if not self.fired and SHUTTING_DOWN.is_set():
            self.fired = self.interrupted = True
        if not self.fired:
            try:
                self.fired = lifecycle.cancel_requested(self.run_id)
            except DatabaseError:
                log.warning("cancel check of run %s failed; continuing", self.run_id, exc_info=True)
                connection.close()
        return self.fired


class Heartbeat(threading.Thread):
    """Writes ``heartbeat_at`` every interval from a side thread, so a long step (a big rollout, an
    evaluation) does not make the run look lost."""

    def __init__(self, run_id: int, interval: float):
        super().__init__(name=f"heartbeat-{run_id}", daemon=True)
        self.run_id = run_id
        self.interval = interval
        self._done = threading.Event()

    def run(self) -> None:
        try:
            while not self._done.is_set():
                try:
                    Run.objects.filter(pk=self.run_id).update(heartbeat_at=timezone.now())
                except Exception:  # noqa: BLE001 - a DB blip must not kill the run
                    log.warning("heartbeat of run %s failed", self.run_id, exc_info=True)
                    close_old_connections()
                try:  # the second heartbeat: keeps the watchdog off a run during a database outage
                    lifecycle.note_alive(self.run_id)
                except Exception:  # noqa: BLE001 - Redis down: the database heartbeat still counts
                    log.warning("Redis heartbeat of run %s failed", self.run_id, exc_info=True)
                self._done.wait(self.interval)
        finally:
            connection.close()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def _worker_name(task: Any) -> str:
    name = getattr(getattr(task, "request", None), "hostname", None)
    return name or f"{socket.gethostname()}:{os.getpid()}"


@shared_task(name="webapp.runs.tasks.mark_lost_runs", ignore_result=True)
def mark_lost_runs() -> list[int]:
    """Periodic (celery beat) check: running runs whose heartbeat stopped become ``lost``, and the
    gold and export jobs a dead worker held fail (``webapp.watchdog.mark_lost``, the watchdog's and
    the cron command's sweep too). Returns the lost runs' ids."""
    return watchdog.mark_lost().lost


@celeryd_after_setup.connect
def _consume_gpu_queue(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    """A worker that serves GPUs also consumes the GPU run queue (webapp/runs/workers.py)."""
    for queue in workers.extra_queues(workers.worker_devices(torch.cuda.is_available())):
        instance.app.amqp.queues.select_add(queue)


@worker_ready.connect
def _on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    """A (re)started worker cannot be running anything yet: runs it had claimed are lost."""
    try:
        hostname = getattr(sender, "hostname", None)
        if hostname:
            lost = lifecycle.mark_lost_runs(worker_host=hostname)
            if lost:
                log.warning("worker %s restarted: marked runs %s lost", hostname, lost)
        lifecycle.mark_lost_runs()
    except Exception:  # noqa: BLE001 - never keep a worker from starting
        log.exception("stale run check at worker start failed")
    finally:
        connection.close()
