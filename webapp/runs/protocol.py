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
  {"type": "metrics", "points": [{"id", "key", "step", "value"}, ...]}
  {"type": "samples", "rows": [{"id", "step", "split", "sample_id", "prompt", "generation",
                                "references", "reward", "metrics"}, ...]}
  {"type": "log", "lines": [{"id", "line", "time"}, ...]}
  {"type": "checkpoint", "step", "path"}
  {"type": "batch", "messages": [<any of the above>, ...]}   one recorder flush, in event order
  {"type": "caught_up", "metric_cursor", "sample_cursor", "log_cursor"}
  {"type": "pong", "live"}   live: group messages this connection has received (a test barrier)
  {"type": "error", "error"}
Close codes: 4403 not allowed (not logged in, not a researcher, or the session ended), 4404 no such
run, 4409 a second subscribe on one connection. The browser stops reconnecting on these and says why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_RESUBSCRIBE = 4409

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


def metric_point(point_id: int, key: str, step: int, value: float | None) -> dict[str, Any]:
    return {"id": int(point_id), "key": key, "step": int(step), "value": clean_float(value)}


def metric_points(rows: Iterable[tuple[int, str, int, float | None]]) -> list[dict[str, Any]]:
    """``metric_point`` for many stored rows (ints and floats/None as the database returns them),
    inlined: the recorder builds 10,000 of these per flush."""
    fin = math.isfinite
    return [
        {"id": i, "key": k, "step": s, "value": v if v is None or fin(v) else None} for i, k, s, v in rows
    ]


def stored_metric_points(
    points: Iterable[tuple[str, int, float | None]], ids: Mapping[str, Iterator[int | None]]
) -> list[dict[str, Any]]:
    """``metric_point`` for the points of one recorder event that were stored: ``points`` as the
    engine emitted them ``(key, step, value)``, ``ids[key]`` yields the id of each point of that key
    in emission order (None: not stored, the run had that step already). Inlined as
    ``metric_points``: 10,000 per flush."""
    fin = math.isfinite
    out = []
    for k, s, v in points:
        i = next(ids[k])
        if i is not None:
            out.append({"id": i, "key": k, "step": s, "value": v if v is None or fin(v) else None})
    return out


def metrics_message(rows: Iterable[tuple[int, str, int, float | None]]) -> dict[str, Any]:
    """``rows`` are stored points ``(id, key, step, value)`` in id order."""
    return {"type": "metrics", "points": metric_points(rows)}


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
    "metrics": ("points", "metric_cursor"),
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
    if kind in _ROW_LISTS:
        field, cursor_name = _ROW_LISTS[kind]
        cur = cursors[cursor_name]
        rows = [r for r in message.get(field, []) if r["id"] > cur]
        if not rows:
            return None
        cursors[cursor_name] = max(r["id"] for r in rows)
        return {**message, field: rows}
    return message
