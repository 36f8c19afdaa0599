"""Celery tasks: execute one run with the engine; find runs whose worker died.

``execute_run`` receives a run id (never a model object), claims the run atomically
(queued → running), heartbeats from a side thread, and hands ``engine.train`` a ``DbSink`` that
stores every event in PostgreSQL and THEN broadcasts it to the run's Channels group.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback as tb
from pathlib import Path
from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection
from django.utils import timezone

from engine.sinks import eval_log_line, iteration_log_line
from webapp.runs import queries, services
from webapp.runs.broadcast import broadcast, clean_float, status_message
from webapp.runs.models import Artifact, Run, RunStatus

log = logging.getLogger(__name__)


class DbSink:
    """EventSink that stores in PostgreSQL first, then broadcasts.

    Metrics are buffered until ``batch_points`` points or ``max_delay`` seconds have
    accumulated (default: every ``metrics`` call is one batch, which is what a live chart wants);
    any other event flushes the buffer first so the order of events is kept.
    """

    def __init__(
        self, run_id: int, *, batch_points: int = 1, max_delay: float = 0.25, broadcast_enabled: bool = True
    ):
        self.run_id = run_id
        self.batch_points = batch_points
        self.max_delay = max_delay
        self.broadcast_enabled = broadcast_enabled
        self._buf: list[tuple[str, int, float | None]] = []
        self._buf_since: float | None = None
        self._last_progress_write = 0.0
        self.points_stored = 0

    # -- helpers
    def _send(self, msg: dict[str, Any]) -> None:
        if self.broadcast_enabled:
            broadcast(self.run_id, msg)

    def flush(self) -> None:
        if not self._buf:
            return
        buf, self._buf, self._buf_since = self._buf, [], None
        # A dropped database connection must not fail a training run: the batch is re-sent on a
        # fresh connection, and ON CONFLICT DO NOTHING makes the retry create no duplicates.
        res = _with_db_retry(lambda: services.ingest_metrics(self.run_id, buf))
        self.points_stored += len(res.inserted)
        last: dict[str, tuple[int, float | None]] = {}
        for k, s, v in buf:
            if k not in last or s >= last[k][0]:
                last[k] = (s, v)
        _with_db_retry(
            lambda: services.update_last_metrics(self.run_id, {k: v for k, (_s, v) in last.items()})
        )
        if res.inserted:
            self._send(
                {
                    "type": "metrics",
                    "points": [
                        {"id": i, "key": k, "step": s, "value": clean_float(v)} for i, k, s, v in res.inserted
                    ],
                }
            )

    # -- EventSink
    def run_started(self, config: dict[str, Any], run_dir: str | None = None) -> None:
        if run_dir:
            Run.objects.filter(pk=self.run_id).update(run_dir=str(run_dir))
        algo = (config.get("algorithm") or {}).get("id")
        model = (config.get("model") or {}).get("name_or_path")
        task = (config.get("task") or {}).get("id")
        self.log(
            f"started on {socket.gethostname()}: {algo} on {model}, task {task}; run dir {run_dir or '-'}"
        )

    def progress(self, iteration: int, total: int, eta_seconds: float | None, phase: str = "rl") -> None:
        self.flush()
        frac = 0.0 if not total else max(0.0, min(1.0, iteration / total))

        def store() -> Run:
            Run.objects.filter(pk=self.run_id).update(
                current_iter=iteration,
                total_iters=total,
                eta_seconds=clean_float(eta_seconds),
                progress=frac,
                phase=str(phase)[:32],
                heartbeat_at=timezone.now(),
            )
            return Run.objects.get(pk=self.run_id)

        self._send(status_message(_with_db_retry(store)))

    def metrics(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            try:
                fv = None if v is None else float(v)
            except (TypeError, ValueError):
                continue
            self._buf.append((str(k), int(step), fv))
        # The run page's log tail: one line per iteration and per evaluation (values stored as metrics).
        for line in (iteration_log_line(step, values), eval_log_line(step, values)):
            if line:
                self.log(line)
        if self._buf_since is None:
            self._buf_since = time.monotonic()
        if len(self._buf) >= self.batch_points or time.monotonic() - self._buf_since >= self.max_delay:
            self.flush()

    def samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        self.flush()
        objs = _with_db_retry(lambda: services.ingest_samples(self.run_id, step, split, rows))
        if objs:
            self._send(services.sample_message(objs))

    def checkpoint(self, step: int, path: str) -> None:
        self.flush()
        _with_db_retry(lambda: services.add_checkpoint(self.run_id, step, path))
        self._send({"type": "checkpoint", "step": int(step), "path": str(path)})
        self.log(f"checkpoint at step {step}: {path}")

    def log(self, message: str) -> None:
        lines = [ln for ln in str(message).splitlines() if ln.strip()] or [str(message)]
        objs = _with_db_retry(lambda: services.add_log_lines(self.run_id, lines))
        self._send(
            {"type": "log", "lines": [{"id": o.id, "line": o.line, "time": o.time.isoformat()} for o in objs]}
        )

    def finished(self, summary: dict[str, Any]) -> None:
        self.flush()
        _with_db_retry(lambda: Run.objects.filter(pk=self.run_id).update(summary=_jsonable(summary)))
        self.log(f"finished after {summary.get('iterations', '?')} iterations")
        try:  # warm the chart cache: the first visit of a finished run reads Redis, not 100k rows
            queries.metric_series_many(self.run_id, max_points=queries.OVERVIEW_POINTS)
        except Exception:  # noqa: BLE001 - a cold cache only costs the first visitor some time
            log.warning("could not warm the chart cache of run %s", self.run_id, exc_info=True)

    def failed(self, error: str, traceback: str) -> None:
        self.flush()
        _with_db_retry(
            lambda: Run.objects.filter(pk=self.run_id).update(
                error=str(error)[:10000], traceback=str(traceback)
            )
        )
        self.log(f"failed: {error}")


def _with_db_retry(fn: Any, attempts: int = 4) -> Any:
    """Run ``fn`` again on a new connection after a connection-level error (server restart,
    network blip, killed backend), backing off 0.2 s, 0.4 s, 0.8 s. Other errors propagate."""
    for attempt in range(attempts):
        try:
            return fn()
        except (OperationalError, InterfaceError):
            if attempt == attempts - 1:
                raise
            log.warning("database error while storing run data; retrying", exc_info=True)
            connection.close()
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return clean_float(obj)
    if isinstance(obj, (int, str, bool)) or obj is None:
        return obj
    try:
        return float(obj)
    except (TypeError, ValueError):
        return str(obj)


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
    sink = DbSink(run_id)
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
