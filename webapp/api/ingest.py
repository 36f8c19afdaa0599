"""Storing a remote run's event batches exactly as the worker's recorder stores its flushes.

Why the recorder's translation: a run streamed from another machine must look exactly like a worker's
run — the same rows (points with their rollup, keyed log lines including the per-iteration and
evaluation lines, samples replacing a re-executed step, checkpoints, progress and heartbeat, summary)
and the same live message (one ``protocol.batch_message`` per batch, in event order). So a batch's
events are built by the same ``translation.EventBuilder`` the worker's recorder uses (with the
client's times) and stored by the same ``translation.store_events``, in one transaction together with
the batch id (``ApiBatch``); the message is broadcast after the commit. Only the delivery differs: no
queue or thread, the request itself waits for its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from webapp.api.auth import ApiError
from webapp.api.models import ApiBatch
from webapp.runs import protocol
from webapp.runs.broadcast import broadcast
from webapp.runs.models import Run
from webapp.runs.translation import Event, EventBuilder, RunGone, message_lines, store_events

EVENT_TYPES = ("run_started", "progress", "metrics", "samples", "checkpoint", "log", "finished", "failed")
MAX_EVENTS = 5000
MAX_POINTS = 50_000
MAX_SAMPLE_ROWS = 2000


class EventBatch:
    """One API batch's events, collected in order through the recorder's ``EventBuilder``, each at
    the client's time when the event named one (points keep when they happened, not when they arrived)."""

    def __init__(self, run_id: int, host: str):
        self.run_id = run_id
        self.host = host
        self.events: list[Event] = []
        self._event_time: datetime | None = None
        self.build = EventBuilder(self._add)

    def _add(self, event: Event) -> None:
        if self._event_time is not None:
            event.time = self._event_time
        self.events.append(event)

    def at(self, when: datetime | None) -> None:
        """The client's time of the next events (None: the time they arrive)."""
        self._event_time = when

    def run_started(self, config: dict[str, Any], run_dir: str | None = None) -> None:
        self.build.run_started(config, run_dir, host=self.host, remote=True)

    def log_keyed(self, message: str, key: str | None) -> None:
        """A log event with the client's key (re-sent lines are stored once); without one, free lines."""
        if not key:
            self.build.log(message)
            return
        lines = message_lines(message)
        keys = [f"api:{key}"[:64]] if len(lines) == 1 else [f"api:{key}:{i}"[:64] for i in range(len(lines))]
        self.build.log_lines(lines, keys)


# --------------------------------------------------------------------------- validation


INT32_MAX = 2**31 - 1  # iterations and totals are stored in integer columns
STEP_MAX = 2**62  # steps are bigint; point ids leave the top bits free


def _int(value: Any, field: str, lo: int = -STEP_MAX, hi: int = STEP_MAX) -> int:
    """An integer in ``[lo, hi]`` (a float with no fraction counts, 3.0 but not 1e300: the range is
    checked after the conversion, so a value the database column cannot hold is a 400 naming it)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if not (isinstance(value, float) and math.isfinite(value) and value.is_integer()):
            raise ApiError(400, "must be an integer", field)
        value = int(value)
    if not lo <= value <= hi:
        raise ApiError(400, f"out of range: must be between {lo} and {hi}", field)
    return value


def _str(value: Any, field: str, *, max_len: int = 10_000, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ApiError(400, "must be a string", field)
    if len(value) > max_len:
        raise ApiError(400, f"longer than {max_len} characters", field)
    return value


def _number(value: Any, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if value in ("NaN", "Infinity", "-Infinity"):
            return float(value)  # JSON has no NaN: clients may send these strings
        raise ApiError(400, "must be a number or null", field)
    try:
        return float(value)
    except OverflowError:  # an integer beyond a double's range (10**400)
        raise ApiError(400, "out of range for a 64-bit float", field) from None


def _time(value: Any, field: str) -> datetime | None:
    if value is None:
        return None
    parsed = parse_datetime(value) if isinstance(value, str) else None
    if parsed is None:
        raise ApiError(400, "must be an ISO 8601 timestamp", field)
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, timezone.utc)
    return parsed


def refuse_nul(value: Any, field: str) -> None:
    """400 naming the first string (or key) under ``value`` that holds a NUL character: run settings
    (config, name, tags, status texts) are refused whole, since PostgreSQL cannot store a NUL and a
    config changed behind the user's back would not be the config they sent. (Streamed run data is
    stored with the NUL shown as "␀" instead: ``webapp.runs.ingest.pg_text``.)"""
    if isinstance(value, str):
        if "\x00" in value:
            raise ApiError(400, "contains a NUL character (\\u0000), which cannot be stored", field)
    elif isinstance(value, dict):
        for k, v in value.items():
            refuse_nul(k, field)
            refuse_nul(v, f"{field}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            refuse_nul(v, f"{field}[{i}]")


@dataclass
class BatchResult:
    duplicate: bool
    events: int
    points: int  # stored by this request (a (key, step) the run already had is not stored again)
    points_sent: int


def feed(rec: EventBatch, events: Any) -> int:
    """Validate every event and feed it to ``rec`` through the sink methods; returns the point count.
    Nothing is stored if any event is invalid (the error names ``events[i].field``)."""
    if not isinstance(events, list):
        raise ApiError(400, "must be a list of events", "events")
    if len(events) > MAX_EVENTS:
        raise ApiError(413, f"at most {MAX_EVENTS} events per batch", "events")
    points = 0
    for i, ev in enumerate(events):
        where = f"events[{i}]"
        if not isinstance(ev, dict):
            raise ApiError(400, "must be an object", where)
        kind = ev.get("type")
        if kind not in EVENT_TYPES:
            raise ApiError(
                400, f"unknown event type {kind!r}; one of {', '.join(EVENT_TYPES)}", f"{where}.type"
            )
        rec.at(_time(ev.get("time"), f"{where}.time"))
        if kind == "metrics":
            points = _feed_metrics(rec, ev, where, points)
        elif kind == "progress":
            eta = _number(ev.get("eta_seconds"), f"{where}.eta_seconds")
            rec.build.progress(
                _int(ev.get("iteration"), f"{where}.iteration", 0, INT32_MAX),
                _int(ev.get("total"), f"{where}.total", 0, INT32_MAX),
                None if eta is None or not math.isfinite(eta) else eta,
                _str(ev.get("phase", "rl"), f"{where}.phase", max_len=32),
            )
        elif kind == "samples":
            _feed_samples(rec, ev, where)
        elif kind == "checkpoint":
            rec.build.checkpoint(
                _int(ev.get("step"), f"{where}.step"), _str(ev.get("path"), f"{where}.path", max_len=1000)
            )
        elif kind == "log":
            rec.log_keyed(
                _str(ev.get("message"), f"{where}.message"),
                _str(ev.get("key"), f"{where}.key", max_len=56, required=False),
            )
        elif kind == "run_started":
            config = ev.get("config") or {}
            if not isinstance(config, dict):
                raise ApiError(400, "must be an object", f"{where}.config")
            rec.run_started(config, _str(ev.get("run_dir"), f"{where}.run_dir", max_len=1000, required=False))
        elif kind == "finished":
            summary = ev.get("summary") or {}
            if not isinstance(summary, dict):
                raise ApiError(400, "must be an object", f"{where}.summary")
            rec.build.finished(summary)
        elif kind == "failed":
            rec.build.failed(
                _str(ev.get("error"), f"{where}.error"),
                _str(ev.get("traceback", ""), f"{where}.traceback", max_len=200_000),
            )
    return points


def _feed_metrics(rec: EventBatch, ev: dict[str, Any], where: str, points: int) -> int:
    """One ``metrics`` event: keys 1–200 characters, finite-or-null numbers; returns the batch's point
    count so far (capped at ``MAX_POINTS``)."""
    values = ev.get("values")
    if not isinstance(values, dict):
        raise ApiError(400, "must be an object {key: number}", f"{where}.values")
    clean = {}
    for k, v in values.items():
        if not k or len(k) > 200:
            raise ApiError(400, "metric keys are 1 to 200 characters", f"{where}.values")
        clean[k] = _number(v, f"{where}.values.{k}")
    points += len(clean)
    if points > MAX_POINTS:
        raise ApiError(413, f"at most {MAX_POINTS} metric points per batch", f"{where}.values")
    rec.build.metrics(_int(ev.get("step"), f"{where}.step"), clean)
    return points


def _feed_samples(rec: EventBatch, ev: dict[str, Any], where: str) -> None:
    """One ``samples`` event: a bounded list of objects whose prompt and generation are strings."""
    rows = ev.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ApiError(400, "must be a list of objects", f"{where}.rows")
    if len(rows) > MAX_SAMPLE_ROWS:
        raise ApiError(413, f"at most {MAX_SAMPLE_ROWS} samples per event", f"{where}.rows")
    for j, r in enumerate(rows):
        for name in ("prompt", "generation"):
            _str(r.get(name, ""), f"{where}.rows[{j}].{name}", max_len=100_000)
    append = ev.get("append", False)
    if not isinstance(append, bool):
        raise ApiError(400, "must be true or false", f"{where}.append")
    rec.build.samples(
        _int(ev.get("step"), f"{where}.step"),
        _str(ev.get("split", "train"), f"{where}.split", max_len=32),
        rows,
        append=append,
    )


def store_batch(run_id: int, batch_id: str, events: Any, host: str) -> BatchResult:
    """Store one batch once: a batch id the run already has stores nothing and answers ``duplicate``."""
    batch_id = _str(batch_id, "batch_id", max_len=64)
    if not batch_id.strip():
        raise ApiError(400, "a non-empty client batch id is required (re-sends must repeat it)", "batch_id")
    rec = EventBatch(run_id, host)
    points = feed(rec, events)
    if ApiBatch.objects.filter(run_id=run_id, batch_id=batch_id).exists():
        return BatchResult(True, len(events), 0, points)
    try:
        with transaction.atomic():
            ApiBatch.objects.create(run_id=run_id, batch_id=batch_id, events=len(events))
            stored = store_events(run_id, rec.events) if rec.events else None
            messages = stored.messages() if stored else []
    except IntegrityError:
        # Either the same batch sent twice at once (the other request committed its id first: this
        # one is a duplicate, delivered) or the run was deleted meanwhile (a foreign-key failure:
        # nothing was stored, and answering "duplicate" would make the client drop the batch).
        if ApiBatch.objects.filter(run_id=run_id, batch_id=batch_id).exists():
            return BatchResult(True, len(events), 0, points)
        if not Run.objects.filter(pk=run_id).exists():
            raise ApiError(404, f"run #{run_id} was deleted; nothing stored", "run_id") from None
        raise
    except RunGone:
        if not Run.objects.filter(pk=run_id).exists():
            raise ApiError(404, f"run #{run_id} was deleted; nothing stored", "run_id") from None
        raise
    if messages:
        broadcast(run_id, protocol.flush_message(messages))
    return BatchResult(False, len(events), stored.points if stored else 0, points)
