"""The run recorder: the engine's event sink inside a Celery worker.

It stores every event of a run in PostgreSQL first, then broadcasts it to the run's Channels group;
the DB-retry helper that keeps a connection blip from failing a run lives here with it.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone

from engine.sinks import eval_log_line, iteration_log_line
from webapp.runs import queries, services
from webapp.runs.broadcast import broadcast, clean_float, status_message
from webapp.runs.models import Run

log = logging.getLogger(__name__)


class Recorder:
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
