"""The remote sink: stream a run trained on this machine into a GRUE Studio dashboard over its API.

Why it never blocks training: every sink call only appends the event to an in-memory list and returns.
A background thread seals what has accumulated into batches (at most ``batch_events`` events, every
``max_delay`` seconds), writes each batch to an on-disk outbox in the run directory
(``RUN_DIR/remote/outbox-<run id>.jsonl``) and sends the batches in order. When the network drops or the server
is down, the thread keeps the batches (in memory and in the outbox) and re-sends them with exponential
backoff (0.5 s doubling to 30 s); training goes on. Every batch carries a client batch id
(``<run>-<nonce>-<seq>``) that the server stores in the same transaction as the batch's rows, so a
batch whose reply was lost and is sent again is stored exactly once: nothing is lost or duplicated.

Batches fit the server's limits (docs/api.md): at most ``MAX_BATCH_BYTES`` of JSON (below the API's 8 MiB),
``MAX_EVENTS`` events and ``MAX_POINTS`` metric points; samples travel in batches of their own, apart from
metrics, and a samples event too large for one batch is split into parts (the later ones ``append``).
When the server refuses a batch (a 4xx naming an event), the batch is split in halves until the refused
events are alone: everything else is stored, and each refused event is set aside on disk
(``refused-<run id>.jsonl``, with the server's reason) and named in the run's log on the dashboard. A
batch the server keeps failing with a 500 while it accepts an empty batch (a "poison" batch) is
treated the same way after ``POISON_ATTEMPTS`` tries, so it never blocks the batches behind it; during
an outage (no connection, 502-504, 429, or a failing empty batch too) batches wait and are re-sent.

The run's end (``succeeded`` / ``cancelled`` / ``failed``) is sent after every batch before it, so the
dashboard never shows a finished run with missing points. ``close(timeout)`` waits for the outbox to
drain; what could not be delivered stays in the outbox file (``acked-<run id>.json`` records how far the server
confirmed), and ``GRUE_TOKEN=… python -m engine push RUN_DIR --report-to URL`` sends the rest later.
"""

from __future__ import annotations

import json
import math
import socket
import sys
import threading
import time
import uuid
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from engine.client import ApiError, Client
from engine.events import NullSink
from engine.jsonl import read_jsonl

MAX_BATCH_BYTES = 6 * 1024 * 1024  # the API refuses bodies over 8 MiB; headroom for the envelope
MAX_EVENTS = 5000  # the API's limits per batch (webapp/api/ingest.py)
MAX_POINTS = 50_000
MAX_SAMPLE_ROWS = 2000
POISON_ATTEMPTS = 5  # 500s in a row for one batch before the server is probed with an empty batch
OUTAGE_STATUSES = (0, 429, 502, 503, 504)  # the server or the path to it is down: wait, never set aside


def outbox_path(spool: Path, run_id: int) -> Path:
    return spool / f"outbox-{run_id}.jsonl"


def refused_path(spool: Path, run_id: int) -> Path:
    return spool / f"refused-{run_id}.jsonl"


def acked_path(spool: Path, run_id: int) -> Path:
    return spool / f"acked-{run_id}.json"


def _clean(obj: Any) -> Any:
    """JSON without NaN/Infinity (sent as the strings the API accepts) and without numpy scalars."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        if math.isnan(obj):
            return "NaN"
        if math.isinf(obj):
            return "Infinity" if obj > 0 else "-Infinity"
        return obj
    try:
        return _clean(float(obj))
    except (TypeError, ValueError):
        return str(obj)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _size(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def _describe(events: list[dict[str, Any]]) -> str:
    """``3 events (metrics at step 4, samples at step 4)``: what a refused part held, for the log."""
    kinds = ", ".join(
        f"{ev.get('type')} at step {ev['step']}" if "step" in ev else str(ev.get("type")) for ev in events[:5]
    )
    more = f", and {len(events) - 5} more" if len(events) > 5 else ""
    return f"{len(events)} event{'s' if len(events) != 1 else ''} ({kinds}{more})"


def split_samples(event: dict[str, Any], budget: int = MAX_BATCH_BYTES) -> list[dict[str, Any]]:
    """A samples event as parts of at most ``MAX_SAMPLE_ROWS`` rows and about ``budget`` bytes each;
    parts after the first carry ``append: true`` so the server adds them to the step's samples instead
    of replacing the first part. A single row over the budget stays a part of its own (the server will
    refuse it and the sink sets it aside)."""
    rows = event.get("rows") or []
    if len(rows) <= MAX_SAMPLE_ROWS and _size(event) <= budget:
        return [event]
    parts: list[list[dict[str, Any]]] = [[]]
    used = 0
    for row in rows:
        n = _size(row) + 1
        if parts[-1] and (used + n > budget - 1024 or len(parts[-1]) >= MAX_SAMPLE_ROWS):
            parts.append([])
            used = 0
        parts[-1].append(row)
        used += n
    out = []
    for i, part in enumerate(parts):
        ev = {**event, "rows": part}
        if i:
            ev["append"] = True
        out.append(ev)
    return out


def pack_events(events: list[dict[str, Any]], budget: int = MAX_BATCH_BYTES) -> list[list[dict[str, Any]]]:
    """Events in order as batches within the API's limits: samples alone (split by ``split_samples``),
    the others packed up to ``MAX_EVENTS`` events, ``MAX_POINTS`` points and ``budget`` bytes. Why:
    a batch the server refuses for its size would otherwise take every metric point in it along."""
    batches: list[list[dict[str, Any]]] = []
    chunk: list[dict[str, Any]] = []
    used = points = 0

    def close() -> None:
        nonlocal chunk, used, points
        if chunk:
            batches.append(chunk)
        chunk, used, points = [], 0, 0

    for ev in events:
        if ev.get("type") == "samples":
            close()
            batches.extend([part] for part in split_samples(ev, budget))
            continue
        n = _size(ev) + 1
        p = len(ev.get("values") or ()) if ev.get("type") == "metrics" else 0
        if chunk and (used + n > budget or len(chunk) >= MAX_EVENTS or points + p > MAX_POINTS):
            close()
        chunk.append(ev)
        used += n
        points += p
    close()
    return batches


def refusal_is_about_events(exc: ApiError) -> bool:
    """A refusal that names the batch's content (an event, or its size) rather than the run or the
    caller: splitting the batch can store the rest. 401/403/404/409 concern the whole run."""
    if exc.status in (401, 403, 404, 405, 409):
        return False
    return exc.status == 413 or exc.status >= 500 or (exc.field or "").startswith("events")


def split_item(item: dict[str, Any]) -> list[dict[str, Any]]:
    """An events item in two halves with batch ids of their own (``<id>a``, ``<id>b``): each half is
    stored (or refused) on its own. Deterministic, so a re-send after a crash repeats the same ids."""
    events = item["events"]
    half = len(events) // 2
    return [
        {**item, "events": part, "batch_id": item["batch_id"] + tag, "split_of": item["batch_id"]}
        for tag, part in (("a", events[:half]), ("b", events[half:]))
    ]


def set_aside(spool: Path | None, run_id: int, item: dict[str, Any], reason: str) -> str:
    """Append a refused item to ``refused-<run id>.jsonl`` (with the reason) so nothing is silently
    lost: it can be fixed by hand and sent with ``push``. Returns where it went (or why it could not)."""
    if spool is None:
        return "(no run directory: kept nowhere)"
    path = refused_path(spool, run_id)
    try:
        spool.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"run_id": run_id, "reason": reason, "time": _now(), **item}) + "\n")
    except OSError as exc:
        return f"(could not write {path}: {exc})"
    return str(path)


class RemoteSink(NullSink):
    """EventSink that streams to ``/api/v1/runs/<run_id>/events`` (see module doc)."""

    def __init__(
        self,
        client: Client,
        run_id: int,
        *,
        spool_dir: str | Path | None = None,
        batch_events: int = 500,
        max_delay: float = 0.5,
        max_backoff: float = 30.0,
        heartbeat_s: float = 15.0,
        err: TextIO | None = None,
    ):
        self.client = client
        self.run_id = int(run_id)
        self.batch_events = batch_events
        self.max_delay = max_delay
        self.max_backoff = max_backoff
        # An empty batch when nothing was sent for this long: the server's watchdog marks a run lost
        # when its heartbeat stops, and an iteration of a large model can take minutes.
        self.heartbeat_s = heartbeat_s
        self._last_contact = time.monotonic()
        self.err = err or sys.stderr
        self.sent = 0  # batches the server confirmed
        self.retries = 0  # failed attempts (network, 429, 5xx)
        self.rejected: list[str] = []  # batches the server refused (4xx): reported, not retried
        self._nonce = uuid.uuid4().hex[:8]
        self._seq = 0
        self._log_seq = 0
        self._pending: list[dict[str, Any]] = []
        self._outbox: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._spool: Path | None = Path(spool_dir) if spool_dir else None
        self._seals_wanted = 0  # flush() requests; the sender thread seals and counts them in _sealed
        self._sealed = 0
        self._thread = threading.Thread(target=self._run, name=f"remote-sink-{run_id}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ trainer side (never blocks)
    def _add(self, event: dict[str, Any]) -> None:
        event.setdefault("time", _now())
        with self._cond:
            self._pending.append(event)
            if len(self._pending) >= self.batch_events:
                self._cond.notify()

    def run_started(self, config: dict[str, Any], run_dir: str | None = None) -> None:
        if run_dir and self._spool is None:
            with self._cond:
                self._spool = Path(run_dir) / "remote"
        self._add({"type": "run_started", "config": _clean(config), "run_dir": str(run_dir or "")})

    def progress(self, iteration: int, total: int, eta_seconds: float | None, phase: str = "rl") -> None:
        eta = None if eta_seconds is None or not math.isfinite(float(eta_seconds)) else float(eta_seconds)
        self._add(
            {"type": "progress", "iteration": int(iteration), "total": int(total), "eta_seconds": eta,
             "phase": str(phase)}
        )  # fmt: skip

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self._add({"type": "metrics", "step": int(step), "values": _clean(values)})

    def samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        self._add(
            {"type": "samples", "step": int(step), "split": str(split or "train"), "rows": _clean(rows)}
        )

    def checkpoint(self, step: int, path: str) -> None:
        self._add({"type": "checkpoint", "step": int(step), "path": str(path)})

    def log(self, message: str) -> None:
        self._log_seq += 1
        self._add({"type": "log", "message": str(message), "key": f"{self._nonce}:{self._log_seq}"})

    def finished(self, summary: dict[str, Any]) -> None:
        self._add({"type": "finished", "summary": _clean(summary)})
        status = "cancelled" if summary.get("stopped") else "succeeded"
        self._add({"type": "_status", "status": status, "summary": _clean(summary)})

    def failed(self, error: str, traceback: str) -> None:
        self._add({"type": "failed", "error": str(error)[:10000], "traceback": str(traceback)})
        self._add(
            {"type": "_status", "status": "failed", "error": str(error)[:10000], "traceback": str(traceback)}
        )

    def flush(self, timeout: float = 60.0) -> None:
        """Journal every event emitted so far to the outbox file; does not wait for the server.

        The trainer calls it before publishing a checkpoint: if this process dies after that, the
        checkpoint's steps are on disk (``engine push`` delivers them) instead of lost in memory. The
        sender thread seals (so batch numbers stay in one thread); it does so between two sends, so
        this waits at most for one request in flight (the client's timeout) and never for an outage."""
        with self._cond:
            if self._spool is None:
                return  # nothing durable to write to: delivery stays best effort
            self._seals_wanted += 1
            wanted = self._seals_wanted
            self._cond.notify_all()
            self._cond.wait_for(
                lambda: self._sealed >= wanted or self._stop or not self._thread.is_alive(), timeout
            )

    def close(self, timeout: float | None = 600.0) -> int:
        """Send everything still buffered (waiting up to ``timeout`` s); returns how many batches are
        left undelivered (kept in the outbox file)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        with self._cond:
            self._closing = True
            self._stop = True
            self._cond.notify()
            left = len(self._outbox) + (1 if self._pending else 0)
        return left

    # ------------------------------------------------------------------ sender thread
    _stop = False

    def _seal(self) -> None:
        """Turn pending events into numbered batches (a status change is its own item) and journal them."""
        with self._cond:
            events, self._pending = self._pending, []
            spool = self._spool
            wanted = self._seals_wanted
        items: list[dict[str, Any]] = []
        run: list[dict[str, Any]] = []
        for ev in [*events, {"type": "_end"}]:
            if ev["type"] in ("_status", "_end"):
                items.extend({"kind": "events", "events": b} for b in pack_events(run))
                run = []
                if ev["type"] == "_status":
                    body = {k: v for k, v in ev.items() if k not in ("type", "time")}
                    items.append({"kind": "status", "body": body})
            else:
                run.append(ev)
        heartbeat = (
            not items and not self._outbox and time.monotonic() - self._last_contact > self.heartbeat_s
        )
        if heartbeat:
            items.append({"kind": "events", "events": []})
        for item in items:
            self._seq += 1
            item["seq"] = self._seq
            item["batch_id"] = f"{self.run_id}-{self._nonce}-{self._seq}"
        if items and not heartbeat and spool is not None:
            try:
                spool.mkdir(parents=True, exist_ok=True)
                with outbox_path(spool, self.run_id).open("a", encoding="utf-8") as f:
                    for item in items:
                        f.write(json.dumps({"run_id": self.run_id, **item}) + "\n")
            except OSError as exc:  # a full disk must not stop training; memory still holds them
                print(f"remote: could not write the outbox in {spool}: {exc}", file=self.err)
        self._outbox.extend(items)
        with self._cond:
            self._sealed = max(self._sealed, wanted)
            self._cond.notify_all()

    def _ack(self, item: dict[str, Any]) -> None:
        self.sent += 1
        self._last_contact = time.monotonic()
        self._ack_if_done(item)

    def _server_healthy(self) -> bool:
        """Whether the server stores an empty batch now (then a batch that keeps failing is at fault,
        not the server)."""
        self._probes = getattr(self, "_probes", 0) + 1
        try:
            self.client.send_events(self.run_id, f"{self.run_id}-{self._nonce}-probe{self._probes}", [])
        except ApiError:
            return False
        return True

    def _refused(self, item: dict[str, Any], exc: ApiError, poison: bool) -> None:
        """The server will not take ``item``: split an events batch whose content it refused and try
        the halves (so only the offending events are left out), or set a single event / a status /
        a run-level refusal aside on disk, report it here and in the run's log on the dashboard."""
        if item["kind"] == "events" and len(item["events"]) > 1 and (poison or refusal_is_about_events(exc)):
            for part in reversed(split_item(item)):
                part.pop("failures", None)
                self._outbox.appendleft(part)
            self._journal(self._outbox[0], self._outbox[1])
            return
        reason = (
            f"failed {item.get('failures', 0)} times ({exc}) while the server took other data"
            if poison
            else str(exc)
        )
        where = set_aside(self._spool, self.run_id, item, reason)
        what = (
            _describe(item["events"])
            if item["kind"] == "events"
            else f"the status {item['body'].get('status')!r}"
        )
        line = f"batch {item['batch_id']} ({what}) not stored: {reason}; kept in {where}"
        self.rejected.append(line)
        print(f"remote: {line}", file=self.err)
        if item["kind"] == "events" and not (exc.status in (401, 403, 404) and not poison):
            # The run page says what is missing (sent behind it, in the stream that goes on).
            self._add({"type": "log", "message": f"remote client: {line}"[:9000],
                       "key": f"{self._nonce}:refused:{item['batch_id']}"[:56]})  # fmt: skip
        self._ack_if_done(item)

    def _journal(self, *items: dict[str, Any]) -> None:
        if self._spool is None:
            return
        try:
            with outbox_path(self._spool, self.run_id).open("a", encoding="utf-8") as f:
                for item in items:
                    f.write(json.dumps({"run_id": self.run_id, **item}) + "\n")
        except OSError as exc:
            print(f"remote: could not write the outbox in {self._spool}: {exc}", file=self.err)

    def _ack_if_done(self, item: dict[str, Any]) -> None:
        """Record ``item``'s seq as confirmed once no part of it is left to send."""
        if any(other["seq"] == item["seq"] for other in self._outbox):
            return
        self._last_contact = time.monotonic()
        if self._spool is not None:
            try:
                acked_path(self._spool, self.run_id).write_text(
                    json.dumps({"run_id": self.run_id, "seq": item["seq"]})
                )
            except OSError:
                pass

    def _send(self, item: dict[str, Any]) -> None:
        if item["kind"] == "events":
            self.client.send_events(self.run_id, item["batch_id"], item["events"])
        else:
            self.client.set_status(self.run_id, **item["body"])

    def _run(self) -> None:
        backoff = 0.5
        retry_at = 0.0
        warned = False
        while True:
            with self._cond:
                if not self._closing and not self._stop and self._seals_wanted <= self._sealed:
                    wait = self.max_delay
                    if self._outbox and retry_at > time.monotonic():
                        wait = min(wait, retry_at - time.monotonic())
                    self._cond.wait(max(0.0, wait))
                closing, stop = self._closing, self._stop
            if stop:
                return
            self._seal()
            while self._outbox and time.monotonic() >= retry_at:
                if self._seals_wanted > self._sealed:
                    self._seal()  # a flush() waits: journal its events before the next send
                item = self._outbox[0]
                try:
                    self._send(item)
                except ApiError as exc:
                    poison = False
                    if exc.retryable:
                        item["failures"] = item.get("failures", 0) + 1
                        # A 500 again and again for this batch while an empty batch goes through: the
                        # batch itself breaks the server. Set it aside instead of blocking the stream.
                        poison = (
                            exc.status not in OUTAGE_STATUSES
                            and item["failures"] >= POISON_ATTEMPTS
                            and self._server_healthy()
                        )
                    if exc.retryable and not poison:
                        self.retries += 1
                        delay = max(backoff, exc.retry_after or 0.0)
                        retry_at = time.monotonic() + delay
                        if not warned:
                            print(
                                f"remote: {exc}; buffering and retrying (next in {delay:.1f} s)",
                                file=self.err,
                            )
                            warned = True
                        backoff = min(self.max_backoff, backoff * 2)
                        break
                    self._outbox.popleft()
                    self._refused(item, exc, poison)
                    continue
                self._outbox.popleft()
                self._ack(item)
                if warned:
                    print("remote: connection back; buffered batches delivered", file=self.err)
                    warned = False
                backoff = 0.5
                retry_at = 0.0
            if closing and not self._outbox:
                with self._cond:
                    if not self._pending:
                        return
            if closing and self._outbox and retry_at > time.monotonic():
                time.sleep(min(0.2, retry_at - time.monotonic()))


def start_remote_run(client: Client, config: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
    """Create the run on the server (a draft with this config) and mark it running from this host.

    The config is validated by the server with the launch form's rules except the path rules (its data
    and model paths are this machine's: ``remote``); ``train.output_dir`` and the tracker options
    (``train.trackers``: directories and tracking URIs) are left out since they are this machine's,
    not the server's: the trackers export from here."""
    cfg = json.loads(json.dumps(_clean(config)))
    (cfg.get("train") or {}).pop("output_dir", None)
    (cfg.get("train") or {}).pop("trackers", None)
    run = client.create_run(cfg, name=name or cfg.get("name"), remote=True)
    client.set_status(run["id"], "running", host=socket.gethostname()[:150])
    return run


def push_outbox(client: Client, run_dir: str | Path) -> dict[int, tuple[int, int, int]]:
    """Send the batches of a run directory's outboxes that the server has not confirmed (after
    ``close`` gave up, or the process died). Batches the server already has are no-ops there; a batch
    the sink had split is sent as its parts; refused events are set aside as the sink does
    (``refused-<run id>.jsonl``). A transient failure (``ApiError.retryable``) stops the push: run it
    again later. Returns ``{run_id: (stored, already there, refused)}``."""
    spool = Path(run_dir) / "remote"
    outboxes = sorted(spool.glob("outbox-*.jsonl"))
    if not outboxes:
        raise FileNotFoundError(f"no outbox in {spool}: this run was not streamed with --report-to")
    out: dict[int, tuple[int, int, int]] = {}
    for outbox in outboxes:
        run_id = int(outbox.stem.split("-", 1)[1])
        ack = acked_path(spool, run_id)
        acked = json.loads(ack.read_text())["seq"] if ack.exists() else 0
        items = read_jsonl(outbox)
        replaced = {item["split_of"] for item in items if item.get("split_of")}
        todo = deque(
            sorted(
                (it for it in items if it["seq"] > acked and it["batch_id"] not in replaced),
                key=lambda it: (it["seq"], it["batch_id"]),
            )
        )
        sent = dup = refused = 0
        while todo:
            item = todo.popleft()
            try:
                if item["kind"] == "events":
                    reply = client.send_events(run_id, item["batch_id"], item["events"])
                    dup += bool(reply.get("duplicate"))
                    sent += not reply.get("duplicate")
                else:
                    try:
                        client.set_status(run_id, **item["body"])
                        sent += 1
                    except ApiError as exc:
                        if exc.status != 409:  # 409: the run already ended (the status had arrived)
                            raise
                        dup += 1
            except ApiError as exc:
                if exc.retryable:
                    raise
                if item["kind"] == "events" and len(item["events"]) > 1 and refusal_is_about_events(exc):
                    todo.extendleft(reversed(split_item(item)))
                    continue
                set_aside(spool, run_id, item, str(exc))
                refused += 1
            if not any(other["seq"] == item["seq"] for other in todo):
                ack.write_text(json.dumps({"run_id": run_id, "seq": item["seq"]}))
        out[run_id] = (sent, dup, refused)
    return out
