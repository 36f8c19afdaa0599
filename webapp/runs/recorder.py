"""The run recorder: the engine's event sink inside a Celery worker, and the delivery of its events.

This module only delivers: a bounded queue, a flush thread, retries and backpressure. What an event
becomes (rows, live messages) is ``translation``'s job, shared with the API's batch ingest, and the
live messages leave through ``broadcast.Sender``.

Why a queue and a thread: the trainer must never wait for PostgreSQL or Redis. Every event the engine
emits (metrics, log lines, samples, progress, checkpoints, the end) is built by
``translation.EventBuilder``, put on a bounded queue and returns at once; a background thread drains
the queue and, per flush, stores everything it took in ONE transaction (``translation.store_events``),
then sends ONE broadcast message (``protocol.batch_message``) holding the flush's messages in event
order, from a sender thread of its own (in flush order; a flush's broadcast overlaps with the next
flush's storing; ``flush()`` waits for both).

Flushes happen when ``batch_points`` metric points are buffered or ``max_delay`` seconds (default
50 ms: the live latency it adds) after the first buffered event, and on ``flush()`` / ``finished`` /
``failed``, which wait until the data is stored. While a flush runs, new events queue up, so the batch
size follows the event rate: one event per flush when training is slow, 10,000 points when it is not.

Backpressure: the queue holds ``queue_events`` sink calls. When it is full (the database is slower
than the trainer, or unreachable), the trainer's next sink call blocks until the flush thread has made
room: training slows down instead of memory growing without bound or data being dropped. A run
logging 1,000 points/s is far below what a flush stores (≥ 100k points/s), so it never waits.

Outages: a connection-level database error (server restart, network cut, killed backend) is retried on
a fresh connection with exponential backoff (0.2 s doubling to 5 s) for up to ``give_up_after`` seconds
(``GRUE_RECORDER_GIVE_UP_S``, default 900). Every statement is idempotent (points unique per
run/key/step, every log line carries a unique key, a step's samples are replaced), so a flush retried
after an ambiguous commit stores everything exactly once. If the outage outlasts the limit the recorder
gives up: the next sink call raises ``RecorderError`` naming the real cause, which fails the run with
that message.

Broadcasts are best effort: rows are stored first, a send that takes longer than
``GRUE_BROADCAST_TIMEOUT`` (default 1 s) is abandoned, and after a failure the recorder stops sending
for a backoff period (5 s doubling to 60 s). Browsers catch up from their cursors when they reconnect.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import InterfaceError, OperationalError, connection

from webapp.runs import queries
from webapp.runs.broadcast import DEFAULT_BROADCAST_TIMEOUT_S, Broadcaster, Sender
from webapp.runs.translation import Event, EventBuilder, StoredFlush, store_events

log = logging.getLogger(__name__)

DEFAULT_GIVE_UP_S = float(os.environ.get("GRUE_RECORDER_GIVE_UP_S", "900"))
DEFAULT_QUEUE_EVENTS = 10_000
IDLE_EXIT_S = 5.0  # an idle flush thread ends (closing its connection); the next event starts one


class RecorderError(RuntimeError):
    """The recorder could not store the run's data (the message names the real cause)."""


def with_db_retry(
    fn: Callable[[], Any], *, give_up_after: float | None = None, what: str = "run data"
) -> Any:
    """Run ``fn`` again on a fresh connection after a connection-level error (server restart, network
    cut, killed backend), backing off 0.2 s doubling to 5 s, for up to ``give_up_after`` seconds (then
    the last error propagates). Other errors propagate at once: retrying a bad statement cannot help.
    ``fn`` must be idempotent; it runs in its own transaction."""
    limit = DEFAULT_GIVE_UP_S if give_up_after is None else give_up_after
    start = time.monotonic()
    delay = 0.2
    for attempt in itertools.count():
        try:
            return fn()
        except (OperationalError, InterfaceError) as exc:
            waited = time.monotonic() - start
            if waited + delay > limit:
                raise
            log.warning(
                "database error while storing %s (attempt %d, %.1f s into the outage); retrying in %.1f s: %s",
                what,
                attempt + 1,
                waited,
                delay,
                exc,
            )
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - the connection is broken already
                pass
            time.sleep(delay)
            delay = min(5.0, delay * 2)
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- the queue


@dataclass
class _Barrier:
    """Put on the queue by ``flush()``: set once everything before it is stored (or failed)."""

    done: threading.Event = field(default_factory=threading.Event)
    stop: bool = False


class Recorder:
    """EventSink that stores a run's events in PostgreSQL, then broadcasts them (see module doc)."""

    def __init__(
        self,
        run_id: int,
        *,
        batch_points: int = 10_000,
        max_delay: float = 0.05,
        broadcast_enabled: bool = True,
        queue_events: int = DEFAULT_QUEUE_EVENTS,
        give_up_after: float | None = None,
        broadcast_timeout: float | None = None,
    ):
        self.run_id = run_id
        self.batch_points = batch_points
        self.max_delay = max_delay
        self.broadcast_enabled = broadcast_enabled
        self.give_up_after = DEFAULT_GIVE_UP_S if give_up_after is None else give_up_after
        self.points_stored = 0
        self.flushes = 0
        self.error: RecorderError | None = None
        self._queue: queue.Queue[Event | _Barrier] = queue.Queue(maxsize=max(1, queue_events))
        self._broadcaster = Broadcaster(
            run_id, DEFAULT_BROADCAST_TIMEOUT_S if broadcast_timeout is None else broadcast_timeout
        )
        self._sender = Sender(self._broadcaster)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._events = EventBuilder(self._put)
        # (step, split) pairs whose samples this execution stored: later ones add instead of replacing.
        self._seen_sample_steps: set[tuple[int, str]] = set()

    # ------------------------------------------------------------------ trainer side
    def _put(self, item: Event | _Barrier) -> None:
        while True:
            if self.error is not None:
                raise self.error
            self._ensure_thread()
            try:
                self._queue.put(item, timeout=0.5)  # blocks while full: the documented backpressure
                return
            except queue.Full:
                continue

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=f"recorder-{self.run_id}", daemon=True)
                self._thread.start()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every event emitted so far is stored (and broadcast); raises RecorderError if
        the recorder gave up."""
        barrier = _Barrier()
        self._put(barrier)
        if not barrier.done.wait(timeout):
            raise RecorderError(f"run {self.run_id}: events not stored after {timeout} s")
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Flush, then stop the background thread (it closes its database connection)."""
        barrier = _Barrier(stop=True)
        self._put(barrier)  # raises RecorderError if the recorder gave up (its idle thread ends alone)
        barrier.done.wait()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=30)
        if self.error is not None:
            raise self.error

    # -- EventSink: each call becomes events (``translation.EventBuilder``) on the queue
    def run_started(self, config: dict[str, Any], run_dir: str | None = None) -> None:
        self._events.run_started(config, run_dir, host=socket.gethostname())

    def progress(self, iteration: int, total: int, eta_seconds: float | None, phase: str = "rl") -> None:
        self._events.progress(iteration, total, eta_seconds, phase)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self._events.metrics(step, values)

    def samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        self._events.samples(step, split, rows)

    def checkpoint(self, step: int, path: str) -> None:
        self._events.checkpoint(step, path)

    def log(self, message: str) -> None:
        self._events.log(message)

    def finished(self, summary: dict[str, Any]) -> None:
        self._events.finished(summary)
        self.flush()
        try:  # warm the chart cache: the first visit of a finished run reads Redis, not 100k rows
            queries.metric_series_many(self.run_id, max_points=queries.OVERVIEW_POINTS)
        except Exception:  # noqa: BLE001 - a cold cache only costs the first visitor some time
            log.warning("could not warm the chart cache of run %s", self.run_id, exc_info=True)

    def failed(self, error: str, traceback: str) -> None:
        if self.error is not None:
            return  # the recorder gave up: its own error is what fails the run
        self._events.failed(error, traceback)
        try:
            self.flush()
        except RecorderError:
            log.warning("could not store the failure of run %s", self.run_id, exc_info=True)

    # ------------------------------------------------------------------ flush thread
    def _run(self) -> None:
        pending: list[Event] = []
        points = 0
        first_at = 0.0
        try:
            while True:
                timeout = None if not pending else max(0.0, first_at + self.max_delay - time.monotonic())
                try:
                    item = self._queue.get(timeout=timeout if pending else IDLE_EXIT_S)
                except queue.Empty:
                    if pending:
                        self._store(pending)
                        pending, points = [], 0
                        continue
                    with self._lock:  # idle: end the thread; the next event starts a new one
                        if self._queue.empty():
                            self._exit()
                            return
                    continue
                if isinstance(item, _Barrier):
                    if pending:
                        self._store(pending)
                        pending, points = [], 0
                    self._sender.drain()  # flush() returns once its data is stored and broadcast
                    if item.stop:
                        with self._lock:
                            self._exit()
                        item.done.set()
                        return
                    item.done.set()
                    continue
                if not pending:
                    first_at = time.monotonic()
                pending.append(item)
                if item.kind == "metrics":
                    points += len(item.data["vals"])
                if points >= self.batch_points:
                    self._store(pending)
                    pending, points = [], 0
        except BaseException:
            with self._lock:
                self._exit()
            raise

    def _exit(self) -> None:
        """The flush thread's cleanup, under ``_lock``: a thread started for the next event cannot
        run before this thread's connection and event loop are closed."""
        self._sender.stop()
        self._broadcaster.close()
        connection.close()
        self._thread = None

    def _store(self, events: list[Event]) -> None:
        if self.error is not None:
            return
        try:
            stored: StoredFlush = with_db_retry(
                lambda: store_events(self.run_id, events, samples_stored=self._seen_sample_steps),
                give_up_after=self.give_up_after,
                what=f"run {self.run_id}",
            )
        except (OperationalError, InterfaceError) as exc:
            self._give_up(
                f"could not store the data of run {self.run_id}: the database was unreachable for "
                f"{self.give_up_after:.0f} s ({type(exc).__name__}: {str(exc).strip()})"
            )
            return
        except Exception as exc:  # noqa: BLE001 - a bad row or a deleted run: retrying cannot help
            log.exception("storing the data of run %s failed", self.run_id)
            self._give_up(f"could not store the data of run {self.run_id}: {type(exc).__name__}: {exc}")
            return
        self._seen_sample_steps.update(stored.sample_steps)
        self.points_stored += stored.points
        self.flushes += 1
        if self.broadcast_enabled:
            self._sender.send(stored.messages)

    def _give_up(self, message: str) -> None:
        log.error("recorder of run %s gives up: %s", self.run_id, message)
        self.error = RecorderError(message)
        # Unblock a trainer waiting on a full queue: its next call raises the error.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Barrier):
                item.done.set()
