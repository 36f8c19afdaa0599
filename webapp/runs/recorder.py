"""The run recorder: the engine's event sink inside a Celery worker.

Why a queue and a thread: the trainer must never wait for PostgreSQL or Redis. Every event the engine
emits (metrics, log lines, samples, progress, checkpoints, the end) is put on a bounded queue and
returns at once; a background thread drains the queue and, per flush, stores everything it took in
ONE transaction with a fixed number of statements (a binary COPY of one chunk row per metric key, the
rollup (COPY + one upsert), a COPY of the log lines, one UPDATE of the run, a few small lookups;
samples and checkpoints only when present; see ``ingest``), then sends
ONE broadcast message (``protocol.batch_message``) holding the flush's messages in event order, from a
sender thread of its own (in flush order; a flush's broadcast overlaps with the next flush's storing;
``flush()`` waits for both).

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

import asyncio
import itertools
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from channels.layers import get_channel_layer
from django.db import InterfaceError, OperationalError, connection, transaction

from engine.sinks import eval_log_line, iteration_log_line
from webapp.runs import ingest, protocol, queries
from webapp.runs.broadcast import DEFAULT_BROADCAST_TIMEOUT_S
from webapp.runs.ingest import pg_safe, pg_text
from webapp.runs.models import group_name

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


def _last_value(steps: list[int], values: list[float | None]) -> float | None:
    """The value at the largest step (the latest emitted among equal steps): the run's last value."""
    if steps[-1] >= max(steps):
        return values[-1]
    best = max(range(len(steps)), key=lambda i: (steps[i], i))
    return values[best]


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {pg_text(str(k)): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return protocol.clean_float(obj)
    if isinstance(obj, str):
        return pg_text(obj)
    if isinstance(obj, (int, bool)) or obj is None:
        return obj
    try:
        return float(obj)
    except (TypeError, ValueError):
        return pg_text(str(obj))


def _columns(events: list[_Event], groups: dict[str, tuple[list, list, list]]) -> None:
    """Append the points of consecutive metrics events that share their keys to ``groups``
    (``{key: (steps, values, times)}``): one transposition of the events' value lists instead of
    three appends per point (10,000 points per flush)."""
    names = events[0].data["names"]
    if not names:
        return
    steps = [ev.data["step"] for ev in events]
    times = [ev.time for ev in events]
    for k, col in zip(names, zip(*(ev.data["vals"] for ev in events), strict=True), strict=True):
        g = groups.get(k)
        if g is None:
            g = groups[k] = ([], [], [])
        g[0].extend(steps)
        g[1].extend(col)
        g[2].extend(times)


# --------------------------------------------------------------------------- events on the queue


@dataclass
class _Event:
    kind: str  # metrics | log | samples | progress | checkpoint | run_started | finished | failed
    time: datetime
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Barrier:
    """Put on the queue by ``flush()``: set once everything before it is stored (or failed)."""

    done: threading.Event = field(default_factory=threading.Event)
    stop: bool = False


class Broadcaster:
    """Sends a run's messages to its Channels group from one thread, on one event loop (one Redis
    connection, reused), with a timeout per send and a backoff after a failure."""

    def __init__(self, run_id: int, timeout: float = DEFAULT_BROADCAST_TIMEOUT_S):
        self.group = group_name(run_id)
        self.timeout = timeout
        self.failures = 0
        self.sent = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pause_until = 0.0
        self._backoff = 5.0

    def send(self, message: dict[str, Any]) -> bool:
        if time.monotonic() < self._pause_until:
            return False
        layer = get_channel_layer()
        if layer is None:
            return False
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(
                asyncio.wait_for(
                    layer.group_send(self.group, {"type": "run.message", "message": message}), self.timeout
                )
            )
        except Exception as exc:  # noqa: BLE001 - stored already; clients catch up from their cursor
            self.failures += 1
            self._pause_until = time.monotonic() + self._backoff
            log.warning(
                "live update to %s failed (%s: %s); pausing broadcasts for %.0f s, the data is stored",
                self.group,
                type(exc).__name__,
                exc,
                self._backoff,
            )
            self._backoff = min(60.0, self._backoff * 2)
            self._reset_loop()
            return False
        self._backoff = 5.0
        self.sent += 1
        return True

    def _reset_loop(self) -> None:
        """A send that timed out may leave its connection mid-reply: start the next on a fresh one."""
        loop, self._loop = self._loop, None
        if loop is not None:
            try:
                loop.close()  # channels-redis closes this loop's connection pool
            except Exception:  # noqa: BLE001
                log.debug("closing the broadcast loop failed", exc_info=True)

    def close(self) -> None:
        self._reset_loop()


class _Sender:
    """Hands a run's broadcasts to a thread of their own (FIFO, so in flush order): building and
    encoding a 10,000-point message and the Redis round trips then overlap with the next flush's
    database work instead of adding to it. ``send`` takes a function returning the flush's messages
    (built from rows already committed). At most ``depth`` flushes wait; beyond that ``send`` blocks
    (the flush thread slows down rather than queueing without bound)."""

    def __init__(self, broadcaster: Broadcaster, depth: int = 4):
        self.broadcaster = broadcaster
        self._queue: queue.Queue[Callable[[], list[dict[str, Any]]] | None] = queue.Queue(maxsize=depth)
        self._thread: threading.Thread | None = None

    def send(self, build: Callable[[], list[dict[str, Any]]]) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name=f"broadcast-{self.broadcaster.group}", daemon=True
            )
            self._thread.start()
        self._queue.put(build)

    def drain(self) -> None:
        """Wait until every message handed over has been sent (or given up on)."""
        self._queue.join()

    def stop(self) -> None:
        """Send what is queued, then end the thread (its event loop is closed by ``Broadcaster.close``)."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._thread = None

    def _run(self) -> None:
        while True:
            build = self._queue.get()
            try:
                if build is None:
                    return
                messages = build()
                if messages:  # Broadcaster.send never raises: a failure pauses broadcasts
                    self.broadcaster.send(protocol.flush_message(messages))
            except Exception:  # noqa: BLE001 - the rows are stored; clients catch up from their cursor
                log.exception("building the live messages of %s failed", self.broadcaster.group)
            finally:
                self._queue.task_done()


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
        self._queue: queue.Queue[_Event | _Barrier] = queue.Queue(maxsize=max(1, queue_events))
        self._broadcaster = Broadcaster(
            run_id, DEFAULT_BROADCAST_TIMEOUT_S if broadcast_timeout is None else broadcast_timeout
        )
        self._sender = _Sender(self._broadcaster)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # Unique keys for free log lines: a flush retried after an ambiguous commit stores them once.
        self._token = uuid.uuid4().hex[:12]
        self._line_seq = itertools.count()
        self._seen_sample_steps: set[tuple[int, str]] = set()
        self._flush_sample_steps: set[tuple[int, str]] = set()

    # ------------------------------------------------------------------ trainer side
    def _put(self, item: _Event | _Barrier) -> None:
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

    def _event(self, kind: str, **data: Any) -> None:
        self._put(_Event(kind, datetime.now(UTC), data))

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

    # -- EventSink
    def run_started(self, config: dict[str, Any], run_dir: str | None = None) -> None:
        algo = (config.get("algorithm") or {}).get("id")
        model = (config.get("model") or {}).get("name_or_path")
        task = (config.get("task") or {}).get("id")
        self._event("run_started", run_dir=pg_text(str(run_dir)) if run_dir else None)
        self.log(
            f"started on {socket.gethostname()}: {algo} on {model}, task {task}; run dir {run_dir or '-'}"
        )

    def progress(self, iteration: int, total: int, eta_seconds: float | None, phase: str = "rl") -> None:
        self._event(
            "progress", iteration=int(iteration), total=int(total), eta=eta_seconds, phase=pg_text(str(phase))
        )

    def metrics(self, step: int, values: dict[str, float]) -> None:
        step = int(step)
        # Kept as the event's key tuple and value list: the flush thread turns runs of events with
        # the same keys into per-key columns with one transposition (``_columns``), not per point.
        try:
            names = tuple(k if type(k) is str else str(k) for k in values)
            vals = [None if v is None else float(v) for v in values.values()]
        except (TypeError, ValueError):  # a value that is not a number: skip it, keep the others
            kept = []
            for k, v in values.items():
                try:
                    kept.append((str(k), None if v is None else float(v)))
                except (TypeError, ValueError):
                    continue
            names = tuple(k for k, _v in kept)
            vals = [v for _k, v in kept]
        if any("\x00" in k for k in names):
            names = tuple(pg_text(k) for k in names)
            values = dict(zip(names, vals, strict=True))
        # The run page's log tail: one line per iteration and per evaluation (values stored as
        # metrics). They ride in the metrics event itself: one queue operation per call, and the
        # lines are stored and broadcast right after the points, in the same flush.
        lines, keys = [], []
        line = iteration_log_line(step, values)
        if line:
            lines.append(line)
            keys.append(f"iter:{step}")
        line = eval_log_line(step, values)
        if line:
            lines.append(line)
            keys.append(f"eval:{step}")
        self._put(
            _Event(
                "metrics",
                datetime.now(UTC),
                {"step": step, "names": names, "vals": vals, "lines": lines, "keys": keys},
            )
        )

    def samples(self, step: int, split: str, rows: list[dict[str, Any]], *, append: bool = False) -> None:
        """``append``: add to the (step, split)'s samples instead of replacing them (the later parts
        of one samples event a remote client split across batches)."""
        self._event(
            "samples", step=int(step), split=pg_text(str(split or "train"))[:32], rows=pg_safe(list(rows)),
            append=append,
        )  # fmt: skip

    def checkpoint(self, step: int, path: str) -> None:
        path = pg_text(str(path))
        self._event("checkpoint", step=int(step), path=path)
        self._log([f"checkpoint at step {step}: {path}"], [f"ckpt:{step}"])

    def log(self, message: str) -> None:
        lines = [ln for ln in str(message).splitlines() if ln.strip()] or [str(message)]
        self._log(lines, [f"{self._token}:{next(self._line_seq)}" for _ in lines])

    def _log(self, lines: list[str], keys: list[str]) -> None:
        self._event("log", lines=[pg_text(ln) for ln in lines], keys=[pg_text(k) for k in keys])

    def finished(self, summary: dict[str, Any]) -> None:
        self._event("finished", summary=_jsonable(summary))
        self.log(f"finished after {summary.get('iterations', '?')} iterations")
        self.flush()
        try:  # warm the chart cache: the first visit of a finished run reads Redis, not 100k rows
            queries.metric_series_many(self.run_id, max_points=queries.OVERVIEW_POINTS)
        except Exception:  # noqa: BLE001 - a cold cache only costs the first visitor some time
            log.warning("could not warm the chart cache of run %s", self.run_id, exc_info=True)

    def failed(self, error: str, traceback: str) -> None:
        if self.error is not None:
            return  # the recorder gave up: its own error is what fails the run
        self._event("failed", error=pg_text(str(error))[:10000], traceback=pg_text(str(traceback)))
        self.log(f"failed: {error}")
        try:
            self.flush()
        except RecorderError:
            log.warning("could not store the failure of run %s", self.run_id, exc_info=True)

    # ------------------------------------------------------------------ flush thread
    def _run(self) -> None:
        pending: list[_Event] = []
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

    def _store(self, events: list[_Event]) -> None:
        if self.error is not None:
            return
        try:
            build_messages = with_db_retry(
                lambda: self._store_flush(events), give_up_after=self.give_up_after, what=f"run {self.run_id}"
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
        self._seen_sample_steps.update(self._flush_sample_steps)
        self.flushes += 1
        if self.broadcast_enabled:
            self._sender.send(build_messages)

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

    def _store_once(self, events: list[_Event]) -> list[dict[str, Any]]:
        """One transaction for the whole flush; returns the live messages in event order (the API's
        batches store through this)."""
        return self._store_flush(events)()

    def _store_flush(self, events: list[_Event]) -> Callable[[], list[dict[str, Any]]]:
        """One transaction for the whole flush; returns what builds its live messages in event order
        (the recorder has its sender thread call it, while this thread stores the next flush)."""
        # The flush's points grouped per key (the shape of the stored chunks), in event order.
        groups: ingest.PointGroups = {}
        log_lines: list[str] = []
        log_keys: list[str] = []
        log_times: list[datetime] = []
        fields: dict[str, Any] = {}
        status_at: int | None = None
        self._flush_sample_steps: set[tuple[int, str]] = set()
        same_keys: list[_Event] = []  # metrics events with the same keys, since the last other keys
        for idx, ev in enumerate(events):
            if ev.kind == "metrics":
                if same_keys and ev.data["names"] != same_keys[0].data["names"]:
                    _columns(same_keys, groups)
                    same_keys = []
                same_keys.append(ev)
                if ev.data["lines"]:
                    log_lines.extend(ev.data["lines"])
                    log_keys.extend(ev.data["keys"])
                    log_times.extend([ev.time] * len(ev.data["lines"]))
            elif ev.kind == "log":
                log_lines.extend(ev.data["lines"])
                log_keys.extend(ev.data["keys"])
                log_times.extend([ev.time] * len(ev.data["lines"]))
            elif ev.kind == "progress":
                total = ev.data["total"]
                fields.update(
                    current_iter=ev.data["iteration"],
                    total_iters=total,
                    eta_seconds=protocol.clean_float(ev.data["eta"]),
                    progress=0.0 if not total else max(0.0, min(1.0, ev.data["iteration"] / total)),
                    phase=ev.data["phase"][:32],
                    heartbeat_at=ev.time,
                )
                status_at = idx
            elif ev.kind == "run_started" and ev.data.get("run_dir"):
                fields["run_dir"] = ev.data["run_dir"]
            elif ev.kind == "finished":
                fields["summary"] = ev.data["summary"]
            elif ev.kind == "failed":
                fields["error"] = ev.data["error"]
                fields["traceback"] = ev.data["traceback"]
        if same_keys:
            _columns(same_keys, groups)
        last = {k: _last_value(st, vs) for k, (st, vs, _ts) in groups.items()}
        with transaction.atomic():
            # What the run held before this flush: a consumer behind these missed a broadcast.
            since = queries.run_cursors(self.run_id)
            ids, stored = ingest.insert_point_groups(self.run_id, groups)
            lines = ingest.add_log_lines(self.run_id, log_lines, keys=log_keys, times=log_times)
            run = ingest.update_run(self.run_id, fields, last_metrics=last)
            if run is None:
                raise RecorderError(f"run {self.run_id} no longer exists")
            samples: dict[int, list[Any]] = {}
            for idx, ev in enumerate(events):
                if ev.kind == "samples":
                    # The first samples of a (step, split) in this execution replace what an earlier
                    # execution (before a resume) or an ambiguous earlier attempt stored for it.
                    key = (ev.data["step"], ev.data["split"])
                    replace = (
                        not ev.data.get("append")
                        and key not in self._seen_sample_steps
                        and key not in self._flush_sample_steps
                    )
                    self._flush_sample_steps.add(key)
                    samples[idx] = ingest.ingest_samples(
                        self.run_id, ev.data["step"], ev.data["split"], ev.data["rows"], replace=replace
                    )
                elif ev.kind == "checkpoint":
                    ingest.add_checkpoint(self.run_id, ev.data["step"], ev.data["path"])
        self.points_stored += stored
        # The messages are built by the sender thread, while this one stores the next flush.
        return lambda: self._messages(events, groups, ids, lines, run, status_at, samples, since)

    def _messages(
        self,
        events: list[_Event],
        groups: ingest.PointGroups,
        ids: dict[str, Any],
        lines: list[tuple[int, str, datetime, str]],
        run: Any,
        status_at: int | None,
        samples: dict[int, list[Any]],
        since: dict[str, int] | None = None,
    ) -> list[dict[str, Any]]:
        """The flush's messages (``since``, the run's cursors before the flush, rides on the first,
        so consumers detect a broadcast they missed; see ``protocol.after_cursors``): one metrics message with every stored point (per key, columns in id
        order), then the others in event order, consecutive log lines merged (protocol docstring).
        ``ids``: per key, the id of each of the flush's points of that key in emission order (None:
        not stored, the run had the step already); a ``range`` when all were stored in order."""
        out: list[dict[str, Any]] = []
        series = []
        for k, (steps, values, _times) in groups.items():
            key_ids = ids.get(k)
            if key_ids is None:
                continue
            if isinstance(key_ids, range):  # the fast path: every point new, ids ascending
                series.append(protocol.metric_series(k, key_ids, steps, values))
                continue
            kept = sorted(
                (i, st, v) for i, st, v in zip(key_ids, steps, values, strict=True) if i is not None
            )
            if kept:
                series.append(protocol.metric_series(k, *zip(*kept, strict=True)))
        if series:
            out.append(protocol.series_message(series))
        stored_lines = {key: (i, line, t) for i, line, t, key in lines}

        def add_lines(keys: list[str]) -> None:
            rows = [protocol.log_line(*stored_lines[key]) for key in keys if key in stored_lines]
            if not rows:
                return
            if out and out[-1]["type"] == "log":
                out[-1]["lines"].extend(rows)
            else:
                out.append({"type": "log", "lines": rows})

        for idx, ev in enumerate(events):
            if ev.kind in ("metrics", "log"):
                add_lines(ev.data["keys"])
            elif ev.kind == "samples" and samples.get(idx):
                out.append(protocol.samples_message(samples[idx]))
            elif ev.kind == "checkpoint":
                out.append(protocol.checkpoint_message(ev.data["step"], ev.data["path"]))
            if idx == status_at:
                out.append(protocol.status_message(run))
        if out and since is not None:
            out[0] = {**out[0], "since": since}
        return out
