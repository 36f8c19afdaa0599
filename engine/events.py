"""Run events and the sinks that receive them.

The trainer never knows who listens: the CLI prints a progress bar and writes a run directory,
the web worker stores rows in PostgreSQL and broadcasts them. Both implement ``EventSink``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class EventSink(Protocol):
    """Receives a run's events in order. Every method may be called from the training thread."""

    def run_started(self, config: dict[str, Any], run_dir: str | None = None) -> None: ...

    def progress(self, iteration: int, total: int, eta_seconds: float | None, phase: str = "rl") -> None: ...

    def metrics(self, step: int, values: dict[str, float]) -> None: ...

    def samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None: ...

    def checkpoint(self, step: int, path: str) -> None: ...

    def log(self, message: str) -> None: ...

    def finished(self, summary: dict[str, Any]) -> None: ...

    def failed(self, error: str, traceback: str) -> None: ...

    def flush(self) -> None:
        """Block until every event so far is durably stored (or journaled to disk).

        The trainer calls it before a checkpoint becomes the one a resume starts from: a process killed
        right after publishing checkpoint N must not have lost step N's metrics, since the resumed run
        starts at N + 1 and never reports N again. Optional for third-party sinks (``MultiSink`` skips
        a sink without it)."""
        ...


# Methods a sink may lack: MultiSink skips such a sink for them instead of failing.
OPTIONAL_METHODS = frozenset({"flush"})


class NullSink:
    """Ignores everything; the base class for sinks that only care about some events."""

    def run_started(self, config: dict[str, Any], run_dir: str | None = None) -> None:
        pass

    def progress(self, iteration: int, total: int, eta_seconds: float | None, phase: str = "rl") -> None:
        pass

    def metrics(self, step: int, values: dict[str, float]) -> None:
        pass

    def samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        pass

    def checkpoint(self, step: int, path: str) -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def finished(self, summary: dict[str, Any]) -> None:
        pass

    def failed(self, error: str, traceback: str) -> None:
        pass

    def flush(self) -> None:
        pass


class MultiSink(NullSink):
    """Fans every event out to several sinks in order."""

    def __init__(self, *sinks: Any):
        self.sinks = [s for s in sinks if s is not None]

    def __getattribute__(self, name: str) -> Any:
        if (
            name in EventSink.__dict__
            and not name.startswith("_")
            and callable(getattr(NullSink, name, None))
        ):
            sinks = object.__getattribute__(self, "sinks")

            def fan(*args: Any, **kwargs: Any) -> None:
                for s in sinks:
                    if name in OPTIONAL_METHODS and not hasattr(s, name):
                        continue
                    getattr(s, name)(*args, **kwargs)

            return fan
        return object.__getattribute__(self, name)
