"""Translation of a run's events into rows and live messages: what a stored run looks like.

Why a module of its own: two deliveries feed the same data into PostgreSQL. The worker's
``recorder`` queues the engine's sink calls and stores them from a thread (retries, backpressure,
broadcasts); the API's ``webapp.api.ingest`` stores a remote client's batch inside the request. A run
streamed from another machine must look exactly like a worker's run (the same points and rollups,
keyed log lines including the per-iteration and evaluation lines, samples replacing a re-executed
step, checkpoints, progress and heartbeat, summary) and send the same live message, so both build
their events with :class:`EventBuilder` and store them with :func:`store_events`. Delivery (when,
from which thread, how often to retry) is the caller's business; nothing here queues or sleeps.

A flush is stored in ONE transaction with a fixed number of statements (a binary COPY of one chunk
row per metric key, the rollup, a COPY of the log lines, one UPDATE of the run, a few small lookups;
samples and checkpoints only when present; see ``ingest``). Every statement is idempotent, so a
caller may retry a flush after an ambiguous commit.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from engine.sinks import eval_log_line, iteration_log_line
from webapp.runs import ingest, protocol, queries
from webapp.runs.ingest import pg_safe, pg_text

EVENT_KINDS = ("metrics", "log", "samples", "progress", "checkpoint", "run_started", "finished", "failed")


class RunGone(RuntimeError):
    """The run's row was deleted while its data was being stored: nothing of the flush is kept."""


@dataclass
class Event:
    """One sink call, made storable: ``kind`` is one of ``EVENT_KINDS``, ``time`` when it happened
    (a remote client's time for API batches), ``data`` the cleaned arguments (NUL-free text, floats)."""

    kind: str
    time: datetime
    data: dict[str, Any] = field(default_factory=dict)


def jsonable(obj: Any) -> Any:
    """``obj`` as JSON PostgreSQL can store: NUL-free text, no NaN/inf (``None``), other objects as
    numbers when they convert, else as their text (a run summary may hold numpy scalars)."""
    if isinstance(obj, dict):
        return {pg_text(str(k)): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
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


def message_lines(message: str) -> list[str]:
    """A log message as the run's log lines (blank lines dropped, at least one line)."""
    return [ln for ln in str(message).splitlines() if ln.strip()] or [str(message)]


class EventBuilder:
    """The engine's sink calls turned into :class:`Event` objects handed to ``emit``, in call order.

    Both deliveries call these methods with what the engine (or a remote client) emitted; the
    builder cleans the values once, so the flush that stores them does no per-point work beyond one
    transposition. Free log lines get unique keys (a token per builder and a counter), so a flush
    retried after an ambiguous commit stores them once."""

    def __init__(self, emit: Callable[[Event], None], *, clock: Callable[[], datetime] | None = None):
        self.emit = emit
        self.clock = clock or (lambda: datetime.now(UTC))
        self._token = uuid.uuid4().hex[:12]
        self._line_seq = itertools.count()

    def event(self, kind: str, **data: Any) -> None:
        self.emit(Event(kind, self.clock(), data))

    def run_started(
        self, config: dict[str, Any], run_dir: str | None, *, host: str, remote: bool = False
    ) -> None:
        """A remote run's directory is on the client's machine: it is named in the log, never recorded
        as a directory of this server (delete and resume must not touch a local path of that name)."""
        algo = (config.get("algorithm") or {}).get("id")
        model = (config.get("model") or {}).get("name_or_path")
        task = (config.get("task") or {}).get("id")
        where = f"{host} (remote)" if remote else host
        if not remote:
            self.event("run_started", run_dir=pg_text(str(run_dir)) if run_dir else None)
        self.log(f"started on {where}: {algo} on {model}, task {task}; run dir {run_dir or '-'}")

    def progress(self, iteration: int, total: int, eta_seconds: float | None, phase: str = "rl") -> None:
        self.event(
            "progress", iteration=int(iteration), total=int(total), eta=eta_seconds, phase=pg_text(str(phase))
        )

    def metrics(self, step: int, values: dict[str, float]) -> None:
        step = int(step)
        # Kept as the event's key tuple and value list: the flush turns runs of events with the same
        # keys into per-key columns with one transposition (``_columns``), not per point.
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
        # metrics). They ride in the metrics event itself: one event per call, and the lines are
        # stored and broadcast right after the points, in the same flush.
        lines, keys = [], []
        line = iteration_log_line(step, values)
        if line:
            lines.append(line)
            keys.append(f"iter:{step}")
        line = eval_log_line(step, values)
        if line:
            lines.append(line)
            keys.append(f"eval:{step}")
        self.event("metrics", step=step, names=names, vals=vals, lines=lines, keys=keys)

    def samples(self, step: int, split: str, rows: list[dict[str, Any]], *, append: bool = False) -> None:
        """``append``: add to the (step, split)'s samples instead of replacing them (the later parts
        of one samples event a remote client split across batches)."""
        self.event(
            "samples", step=int(step), split=pg_text(str(split or "train"))[:32], rows=pg_safe(list(rows)),
            append=append,
        )  # fmt: skip

    def checkpoint(self, step: int, path: str) -> None:
        path = pg_text(str(path))
        self.event("checkpoint", step=int(step), path=path)
        self.log_lines([f"checkpoint at step {step}: {path}"], [f"ckpt:{step}"])

    def log(self, message: str) -> None:
        lines = message_lines(message)
        self.log_lines(lines, [f"{self._token}:{next(self._line_seq)}" for _ in lines])

    def log_lines(self, lines: list[str], keys: list[str]) -> None:
        """Log lines with the caller's unique keys (a line whose key the run has is not stored again)."""
        self.event("log", lines=[pg_text(ln) for ln in lines], keys=[pg_text(k) for k in keys])

    def finished(self, summary: dict[str, Any]) -> None:
        self.event("finished", summary=jsonable(summary))
        self.log(f"finished after {summary.get('iterations', '?')} iterations")

    def failed(self, error: str, traceback: str) -> None:
        self.event("failed", error=pg_text(str(error))[:10000], traceback=pg_text(str(traceback)))
        self.log(f"failed: {error}")


# --------------------------------------------------------------------------- storing a flush


@dataclass
class StoredFlush:
    """A committed flush: the points it stored, the (step, split) pairs whose samples it wrote, and
    ``messages()``, which builds its live messages in event order from the committed rows (the
    recorder calls it on its sender thread while the next flush is stored)."""

    points: int
    sample_steps: set[tuple[int, str]]
    messages: Callable[[], list[dict[str, Any]]]


def _last_value(steps: list[int], values: list[float | None]) -> float | None:
    """The value at the largest step (the latest emitted among equal steps): the run's last value."""
    if steps[-1] >= max(steps):
        return values[-1]
    best = max(range(len(steps)), key=lambda i: (steps[i], i))
    return values[best]


def _columns(events: list[Event], groups: ingest.PointGroups) -> None:
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


@dataclass
class _Rows:
    """A flush's events in the shape of the rows they become (built before the transaction)."""

    groups: ingest.PointGroups = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)
    log_keys: list[str] = field(default_factory=list)
    log_times: list[datetime] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    status_at: int | None = None  # the index of the last progress event: its status message goes there


def _rows(events: list[Event]) -> _Rows:
    rows = _Rows()
    same_keys: list[Event] = []  # metrics events with the same keys, since the last other keys
    for idx, ev in enumerate(events):
        if ev.kind in ("metrics", "log"):
            if ev.kind == "metrics":
                if same_keys and ev.data["names"] != same_keys[0].data["names"]:
                    _columns(same_keys, rows.groups)
                    same_keys = []
                same_keys.append(ev)
            if ev.data["lines"]:
                rows.log_lines.extend(ev.data["lines"])
                rows.log_keys.extend(ev.data["keys"])
                rows.log_times.extend([ev.time] * len(ev.data["lines"]))
        elif ev.kind == "progress":
            total = ev.data["total"]
            rows.fields.update(
                current_iter=ev.data["iteration"],
                total_iters=total,
                eta_seconds=protocol.clean_float(ev.data["eta"]),
                progress=0.0 if not total else max(0.0, min(1.0, ev.data["iteration"] / total)),
                phase=ev.data["phase"][:32],
                heartbeat_at=ev.time,
            )
            rows.status_at = idx
        elif ev.kind == "run_started" and ev.data.get("run_dir"):
            rows.fields["run_dir"] = ev.data["run_dir"]
        elif ev.kind == "finished":
            rows.fields["summary"] = ev.data["summary"]
        elif ev.kind == "failed":
            rows.fields["error"] = ev.data["error"]
            rows.fields["traceback"] = ev.data["traceback"]
    if same_keys:
        _columns(same_keys, rows.groups)
    return rows


def store_events(
    run_id: int, events: list[Event], *, samples_stored: Collection[tuple[int, str]] = ()
) -> StoredFlush:
    """Store ``events`` in one transaction (nested in the caller's, if any); raises :class:`RunGone`
    when the run no longer exists. ``samples_stored``: the (step, split) pairs this execution stored
    already; the first samples of any other pair replace what an earlier execution (before a resume)
    or an ambiguous earlier attempt stored for it, later ones (and ``append`` events) add to them."""
    rows = _rows(events)
    groups = rows.groups
    last = {k: _last_value(st, vs) for k, (st, vs, _ts) in groups.items()}
    sample_steps: set[tuple[int, str]] = set()
    with transaction.atomic():
        # What the run held before this flush: a consumer behind these missed a broadcast.
        since = queries.run_cursors(run_id)
        ids, stored = ingest.insert_point_groups(run_id, groups)
        lines = ingest.add_log_lines(run_id, rows.log_lines, keys=rows.log_keys, times=rows.log_times)
        run = ingest.update_run(run_id, rows.fields, last_metrics=last)
        if run is None:
            raise RunGone(f"run {run_id} no longer exists")
        samples: dict[int, list[Any]] = {}
        for idx, ev in enumerate(events):
            if ev.kind == "samples":
                key = (ev.data["step"], ev.data["split"])
                replace = not ev.data.get("append") and key not in samples_stored and key not in sample_steps
                sample_steps.add(key)
                samples[idx] = ingest.ingest_samples(
                    run_id, ev.data["step"], ev.data["split"], ev.data["rows"], replace=replace
                )
            elif ev.kind == "checkpoint":
                ingest.add_checkpoint(run_id, ev.data["step"], ev.data["path"])
    return StoredFlush(
        stored,
        sample_steps,
        lambda: flush_messages(events, groups, ids, lines, run, rows.status_at, samples, since),
    )


def flush_messages(
    events: list[Event],
    groups: ingest.PointGroups,
    ids: dict[str, Any],
    lines: list[tuple[int, str, datetime, str]],
    run: Any,
    status_at: int | None,
    samples: dict[int, list[Any]],
    since: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """A stored flush's messages (``since``, the run's cursors before the flush, rides on the first,
    so consumers detect a broadcast they missed; see ``protocol.after_cursors``): one metrics message
    with every stored point (per key, columns in id order), then the others in event order,
    consecutive log lines merged (protocol docstring). ``ids``: per key, the id of each of the
    flush's points of that key in emission order (None: not stored, the run had the step already);
    a ``range`` when all were stored in order."""
    out: list[dict[str, Any]] = []
    series = []
    for k, (steps, values, _times) in groups.items():
        key_ids = ids.get(k)
        if key_ids is None:
            continue
        if isinstance(key_ids, range):  # the fast path: every point new, ids ascending
            series.append(protocol.metric_series(k, key_ids, steps, values))
            continue
        kept = sorted((i, st, v) for i, st, v in zip(key_ids, steps, values, strict=True) if i is not None)
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
