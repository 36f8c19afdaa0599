"""The part every tracker shares: a thread of its own, so a slow or dead tracker never slows training.

Every sink call from the trainer only puts the event on a bounded queue and returns; the tracker's
thread writes it. The first exception (after the library's own retries) switches the tracker off for
the rest of the run: one warning goes to the run's log ("the run goes on without it"), later events
are dropped, and the run itself never sees the error. A tracker that falls behind by ``MAX_QUEUE``
events drops the newest ones and says so once. At the end (``finished`` / ``failed``) the trainer waits
at most ``flush_timeout_s`` for the thread to deliver what is queued and close the tracker's run.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import dotted
from engine.events import NullSink

log = logging.getLogger("engine.trackers")

MAX_QUEUE = 10_000
_STOP = object()


def flatten(config: dict[str, Any]) -> dict[str, Any]:
    """Nested config → ``{"algorithm.learning_rate": 1e-5, ...}`` (``engine.dotted.flatten``); lists
    and empty mappings become JSON text, because params/hparams hold scalars only."""
    return {
        path: json.dumps(value, ensure_ascii=False, default=str)
        if isinstance(value, (dict, list, tuple))
        else value
        for path, value in dotted.flatten(config).items()
    }


def scalars(values: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a ``metrics`` event (the run directory writes the others as null)."""
    out = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def cell(value: Any) -> Any:
    """A sample field as a table cell: scalars stay, anything else becomes JSON text."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def sample_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The fields of a samples event in first-seen order: rows may differ (a metric per sample only
    on some), and every tracker's table must hold them all."""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    return columns


def sample_table(step: int, rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """``(columns, data)`` of a samples event as a table with the step as first column."""
    columns = ["step", *(c for c in sample_columns(rows) if c != "step")]
    return columns, [[step] + [cell(row.get(c)) for c in columns[1:]] for row in rows]


def status_of(summary: dict[str, Any]) -> str:
    return "stopped" if summary.get("stopped") else "succeeded"


class Tracker(NullSink):
    """Base of the tracker sinks. Subclasses implement the ``open`` / ``write_*`` / ``close`` hooks,
    which run on the tracker's thread, one at a time, in event order."""

    tracker_id = "tracker"

    def __init__(
        self,
        options: dict[str, Any],
        config: dict[str, Any],
        run_dir: Path,
        warn: Callable[[str], None] | None = None,
        flush_timeout_s: float = 60.0,
    ):
        self.options = options
        self.config = config
        self.run_dir = Path(run_dir)
        self.flush_timeout_s = flush_timeout_s
        self._warn_to = warn
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=MAX_QUEUE)
        self._error: str | None = None  # set by the thread; reported by the training thread
        self._reported_error = False
        self._dropped = 0
        self._ended = False
        self._opened = False
        self._thread = threading.Thread(target=self._work, name=f"tracker-{self.tracker_id}", daemon=True)
        self._thread.start()

    # Hooks (tracker thread) ---------------------------------------------------------------------
    def open(self, config: dict[str, Any]) -> None:
        """Start (or, on resume, continue) the tracker's run and record the config."""

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        pass

    def write_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        pass

    def write_checkpoint(self, step: int, path: str) -> None:
        pass

    def write_log(self, message: str) -> None:
        pass

    def close(self, status: str, summary: dict[str, Any]) -> None:
        """End the tracker's run with ``status``: succeeded, stopped or failed."""

    # The thread ----------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            name, args = item
            if name == "open":
                self._opened = True
            elif not self._opened:
                continue  # the run failed before it started: nothing to close
            if self._error is not None and name != "close":
                continue
            try:
                getattr(self, name)(*args)
            except Exception as exc:  # a tracker must never take the run down
                if self._error is None:
                    first = (str(exc).strip().splitlines() or [""])[0][:300]
                    self._error = f"{type(exc).__name__}: {first}"
                    log.warning("%s export failed", self.tracker_id, exc_info=True)

    def _put(self, name: str, *args: Any) -> None:
        self._report()
        if self._ended:
            return
        try:
            self._queue.put_nowait((name, args))
        except queue.Full:
            self._dropped += 1
            if self._dropped == 1:
                self._warn(
                    f"{self.tracker_id} export is more than {MAX_QUEUE} events behind; "
                    "dropping events until it catches up (the run directory keeps everything)"
                )

    # Training thread -----------------------------------------------------------------------------
    def _warn(self, message: str) -> None:
        log.warning(message)
        if self._warn_to is not None:
            self._warn_to(message)

    def _report(self) -> None:
        if self._error is not None and not self._reported_error:
            self._reported_error = True
            self._warn(
                f"{self.tracker_id} export failed ({self._error}); the run goes on without {self.tracker_id}"
            )

    def _end(self, status: str, summary: dict[str, Any]) -> None:
        if self._ended:
            return
        self._put("close", status, summary)
        self._ended = True
        try:
            self._queue.put(_STOP, timeout=self.flush_timeout_s)
        except queue.Full:
            pass
        self._thread.join(self.flush_timeout_s)
        self._report()
        if self._thread.is_alive():
            self._warn(
                f"{self.tracker_id} export still busy after {self.flush_timeout_s:g} s "
                "(train.trackers.flush_timeout_s); not waiting for it: the run directory holds everything"
            )

    # EventSink ---------------------------------------------------------------------------------
    def run_started(self, config: dict[str, Any], run_dir: str | None = None) -> None:
        self._put("open", config)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self._put("write_metrics", step, dict(values))

    def samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        self._put("write_samples", step, split, [dict(r) for r in rows])

    def checkpoint(self, step: int, path: str) -> None:
        self._put("write_checkpoint", step, path)

    def log(self, message: str) -> None:
        self._put("write_log", message)

    def finished(self, summary: dict[str, Any]) -> None:
        self._end(status_of(summary), dict(summary))

    def failed(self, error: str, traceback: str) -> None:
        self._end("failed", {"error": error})


def state_file(run_dir: Path) -> Path:
    """Where trackers remember their run ids, so a resumed run continues the same tracker run."""
    return run_dir / "trackers.json"


def load_state(run_dir: Path, tracker_id: str) -> dict[str, Any]:
    try:
        data = json.loads(state_file(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    value = data.get(tracker_id) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


_state_lock = threading.Lock()


def save_state(run_dir: Path, tracker_id: str, state: dict[str, Any]) -> None:
    with _state_lock:  # trackers run on threads of their own and share the file
        path = state_file(run_dir)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        data[tracker_id] = state
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
        tmp.replace(path)
