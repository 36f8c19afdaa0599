"""Sending live messages to a run's Channels group from synchronous code: the one home of broadcasting.

Broadcasting is best effort (Channels groups are fire-and-forget): rows are always stored first, and
a browser that missed a message catches up from its cursor, so a failed or slow send only logs. Every
send has a timeout (``GRUE_BROADCAST_TIMEOUT``, default 1 s): a hung Redis cannot hold a request or a
status change longer than that. Two ways to send, for two rates:

- ``broadcast(run_id, message)``: one message now (views, lifecycle, the API's batches);
- ``Broadcaster`` + ``Sender``: a run's stream of flushes from the worker's recorder: one event loop
  and Redis connection per run, reused, a backoff after a failure, sent from a thread of its own in
  flush order.

Messages are built in ``webapp.runs.protocol``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from webapp.runs.models import group_name
from webapp.runs.protocol import flush_message

__all__ = ["DEFAULT_BROADCAST_TIMEOUT_S", "Broadcaster", "Sender", "broadcast"]

log = logging.getLogger(__name__)

DEFAULT_BROADCAST_TIMEOUT_S = float(os.environ.get("GRUE_BROADCAST_TIMEOUT", "1.0"))


def broadcast(run_id: int, message: dict[str, Any], *, timeout: float | None = None) -> bool:
    """Send ``message`` to every consumer of the run; returns False (and logs) when it failed."""
    layer = get_channel_layer()
    if layer is None:
        return False
    limit = DEFAULT_BROADCAST_TIMEOUT_S if timeout is None else timeout

    async def send() -> None:
        await asyncio.wait_for(
            layer.group_send(group_name(run_id), {"type": "run.message", "message": message}), limit
        )

    try:
        async_to_sync(send)()
        return True
    except Exception as exc:  # noqa: BLE001 - the data is stored; clients catch up from their cursor
        log.warning("broadcast to run %s failed (%s: %s)", run_id, type(exc).__name__, exc)
        return False


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


class Sender:
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
                    self.broadcaster.send(flush_message(messages))
            except Exception:  # noqa: BLE001 - the rows are stored; clients catch up from their cursor
                log.exception("building the live messages of %s failed", self.broadcaster.group)
            finally:
                self._queue.task_done()
