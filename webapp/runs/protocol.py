"""The live protocol of a run: every message the run websocket carries is built here.

The recorder (live messages after each flush), the catch-up queries (what a reconnecting browser
missed) and the consumer all build their messages with these functions, so a field added to a message
reaches the live path and the catch-up path at once. Nothing here touches the database or the channel
layer; the functions take rows that were already stored.

Client → server:
  {"type": "subscribe", "after": {"metric_cursor": 0, "sample_cursor": 0, "log_cursor": 0}}  (once)
  {"type": "ping"}
Server → client:
  {"type": "status", "status", "progress", "eta_seconds", "current_iter", "total_iters", "phase",
   "error", "cancel_requested", "started_at", "finished_at"}
  {"type": "metrics", "series": [{"key", "ids": [...], "steps": [...], "values": [...]}, ...]}
      one entry per metric key, its points as parallel arrays in id order (ids ascending); a value
      that is not finite is null. Columns, not a dict per point: a 10,000-point flush is 3 arrays
      per key to build and encode instead of 10,000 objects (issue #15).
  {"type": "samples", "rows": [{"id", "step", "split", "sample_id", "prompt", "generation",
                                "references", "reward", "metrics"}, ...]}
  {"type": "log", "lines": [{"id", "line", "time"}, ...]}
  {"type": "checkpoint", "step", "path"}
  {"type": "batch", "messages": [<any of the above>, ...]}   one recorder flush: first one metrics
      message with all of the flush's points (each key's in the order they were emitted), then the
      other messages in event order (log lines, samples, checkpoints, status). Every kind keeps its
      event order; the flush's points come before its log lines and status (a flush is stored in one
      transaction and applied by the page at once, so nothing shows a line before its point).
  {"type": "caught_up", "metric_cursor", "sample_cursor", "log_cursor"}
  {"type": "pong", "live"}   live: group messages this connection has received (a test barrier)
  {"type": "error", "error"}
Close codes: 4403 not allowed (not logged in, not a researcher, or the session ended), 4404 no such
run, 4409 a second subscribe on one connection. The browser stops reconnecting on these and says why.
4503: live updates are unavailable for now (the channel layer's Redis is down or hung); the browser retries
with backoff. (An application may not send 1011 itself: daphne's websocket library accepts only 1000 and
3000–4999 from the server side, and the close then failed with an exception.)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_RESUBSCRIBE = 4409
CLOSE_UNAVAILABLE = 4503

CURSOR_NAMES = ("metric_cursor", "sample_cursor", "log_cursor")


def clean_float(v: Any) -> float | None:
    """JSON has no NaN/Infinity: send them as null (the chart shows a gap)."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _iso(t: datetime | str | None) -> str | None:
    if t is None or isinstance(t, str):
        return t
    return t.isoformat()


# The Run columns ``status_message`` reads: queries that build it load exactly these (a column left
# out would cost one more query per request) and the recorder RETURNs them from its UPDATE.
STATUS_FIELDS = (
    "status",
    "progress",
    "eta_seconds",
    "current_iter",
    "total_iters",
    "phase",
    "error",
    "cancel_requested",
    "started_at",
    "finished_at",
)


def status_message(run: Any) -> dict[str, Any]:
    """A run's status as the page shows it (badge, progress bar, ETA, error box)."""
    return {
        "type": "status",
        "status": run.status,
        "progress": run.progress,
        "eta_seconds": clean_float(run.eta_seconds),
        "current_iter": run.current_iter,
        "total_iters": run.total_iters,
        "phase": run.phase,
        "error": run.error,
        "cancel_requested": run.cancel_requested,
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
    }


def metric_series(
    key: str, ids: Sequence[int], steps: Sequence[int], values: Sequence[float | None]
) -> dict[str, Any]:
    """One key's points of a metrics message; ``ids`` ascending. Non-finite values become null."""
    fin = math.isfinite
    return {
        "key": key,
        "ids": list(ids),
        "steps": list(steps),
        "values": [v if v is None or fin(v) else None for v in values],
    }


def columns_by_key(rows: Iterable[Sequence[Any]], key_at: int) -> dict[str, tuple[list, list, list]]:
    """Rows of four fields grouped by the field at ``key_at``: per key, the other three as columns,
    in row order (the shape of a metrics message's series and of the stored chunks)."""
    others = [i for i in range(4) if i != key_at]
    a, b, c = others
    cols: dict[str, tuple[list, list, list]] = {}
    for row in rows:
        k = row[key_at]
        col = cols.get(k)
        if col is None:
            col = cols[k] = ([], [], [])
        col[0].append(row[a])
        col[1].append(row[b])
        col[2].append(row[c])
    return cols


def metrics_message(rows: Iterable[tuple[int, str, int, float | None]]) -> dict[str, Any]:
    """``rows`` are stored points ``(id, key, step, value)`` in id order, grouped per key."""
    cols = columns_by_key(rows, 1)
    return {"type": "metrics", "series": [metric_series(k, *c) for k, c in cols.items()]}


def series_message(series: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "metrics", "series": series}


def message_points(message: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The points of a metrics message (or of every metrics message in a batch) one dict each:
    ``{"id", "key", "step", "value"}``, per key in id order. For tests and tools; the page reads the
    columns directly."""
    if message.get("type") == "batch":
        for m in message.get("messages", []):
            yield from message_points(m)
        return
    if message.get("type") != "metrics":
        return
    for s in message.get("series", []):
        k = s["key"]
        for i, st, v in zip(s["ids"], s["steps"], s["values"], strict=True):
            yield {"id": i, "key": k, "step": st, "value": v}


def sample_row(s: Any) -> dict[str, Any]:
    """One stored generation (a ``Sample`` model or a mapping with the same fields)."""
    get = s.get if isinstance(s, Mapping) else lambda name: getattr(s, name)
    return {
        "id": get("id"),
        "step": get("step"),
        "split": get("split"),
        "sample_id": get("sample_id"),
        "prompt": get("prompt"),
        "generation": get("generation"),
        "references": get("references"),
        "reward": clean_float(get("reward")),
        "metrics": get("metrics"),
    }


def samples_message(samples: Iterable[Any]) -> dict[str, Any]:
    return {"type": "samples", "rows": [sample_row(s) for s in samples]}


def log_line(line_id: int, line: str, time: datetime | str) -> dict[str, Any]:
    return {"id": int(line_id), "line": line, "time": _iso(time)}


def log_message(rows: Iterable[tuple[int, str, datetime | str]]) -> dict[str, Any]:
    """``rows`` are stored log lines ``(id, line, time)`` in id order."""
    return {"type": "log", "lines": [log_line(*r) for r in rows]}


def checkpoint_message(step: int, path: str) -> dict[str, Any]:
    return {"type": "checkpoint", "step": int(step), "path": str(path)}


def batch_message(messages: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One recorder flush: its messages in the order the events happened."""
    return {"type": "batch", "messages": list(messages)}


def flush_message(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """What one flush broadcasts: its only message, or a batch of them. The flush's ``since`` (the
    run's cursors before it, on the first message) moves to the top, where consumers look for it."""
    since = messages[0].get("since")
    if len(messages) == 1:
        return messages[0]
    first = {k: v for k, v in messages[0].items() if k != "since"}
    out = batch_message([first, *messages[1:]])
    if since is not None:
        out["since"] = since
    return out


def missed_broadcast(message: dict[str, Any], cursors: Mapping[str, int]) -> bool:
    """Whether a consumer with ``cursors`` missed rows stored before ``message`` (its ``since`` is
    ahead of a cursor): a broadcast was lost (Redis restarted, the recorder paused its broadcasts), and
    the consumer must read the gap from the database before it forwards this message."""
    since = message.get("since")
    if not isinstance(since, dict):
        return False
    return any(int(since.get(name) or 0) > int(cursors.get(name) or 0) for name in CURSOR_NAMES)


def caught_up_message(cursors: Mapping[str, int]) -> dict[str, Any]:
    return {"type": "caught_up", **{name: int(cursors.get(name) or 0) for name in CURSOR_NAMES}}


def pong_message(live: int) -> dict[str, Any]:
    """``live``: how many group messages the connection has received so far; a client (or a test)
    that pings until it reaches a known count knows every earlier broadcast has been handled."""
    return {"type": "pong", "live": int(live)}


def error_message(error: str) -> dict[str, Any]:
    return {"type": "error", "error": error}


def parse_cursors(after: Any) -> dict[str, int]:
    """The cursors of a ``subscribe`` (missing or malformed ones count as 0: replay everything)."""
    after = after if isinstance(after, Mapping) else {}
    out: dict[str, int] = {}
    for name in CURSOR_NAMES:
        try:
            out[name] = max(0, int(after.get(name) or 0))
        except (TypeError, ValueError):
            out[name] = 0
    return out


_ROW_LISTS = {
    "samples": ("rows", "sample_cursor"),
    "log": ("lines", "log_cursor"),
}


def after_cursors(message: dict[str, Any], cursors: dict[str, int]) -> dict[str, Any] | None:
    """The part of a live message that a client with ``cursors`` has not seen (None: nothing new).

    Advances ``cursors`` in place. This is what makes catch-up + live free of gaps and duplicates:
    rows read by the catch-up have ids at or below the cursor, and are dropped here when their
    broadcast arrives later.
    """
    kind = message.get("type")
    if kind == "batch":
        parts = [m for m in (after_cursors(m, cursors) for m in message.get("messages", [])) if m]
        return batch_message(parts) if parts else None
    if kind == "metrics":
        return _series_after(message, cursors)
    if kind in _ROW_LISTS:
        field, cursor_name = _ROW_LISTS[kind]
        cur = cursors[cursor_name]
        rows = [r for r in message.get(field, []) if r["id"] > cur]
        if not rows:
            return None
        cursors[cursor_name] = max(r["id"] for r in rows)
        return {**message, field: rows}
    return message


def _series_after(message: dict[str, Any], cursors: dict[str, int]) -> dict[str, Any] | None:
    """``after_cursors`` for a metrics message: each key's ids are ascending, so the unseen points
    of a key are a suffix of its arrays (found by bisection, not a pass over every point)."""
    cur = cursors["metric_cursor"]
    top = cur
    out = []
    for s in message.get("series", []):
        ids = s["ids"]
        if not ids or ids[-1] <= cur:
            continue
        top = max(top, ids[-1])
        if ids[0] > cur:
            out.append(s)
            continue
        a = bisect.bisect_right(ids, cur)
        out.append({**s, "ids": ids[a:], "steps": s["steps"][a:], "values": s["values"][a:]})
    if not out:
        return None
    cursors["metric_cursor"] = top
    return {**message, "series": out}
