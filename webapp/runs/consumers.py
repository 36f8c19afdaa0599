"""Live updates of one run over a websocket; the messages are defined in ``webapp.runs.protocol``.

No gaps, no duplicates: the consumer joins the group at connect, before reading the catch-up from
the database; rows are stored before they are broadcast, so anything broadcast after the read has a
larger id than the cursor and anything before it is in the read. Live messages with ids at or below
the cursor are dropped (``protocol.after_cursors``).

Refusals are sent after accepting the handshake (accept-then-close), because a browser only sees the
close code of an accepted websocket: 4403 (not allowed, or the session ended / the role was removed:
re-checked every ``RECHECK_SECONDS`` and before live data after that), 4404 (no such run), 4409 (a
second ``subscribe``: one full catch-up per connection). A channel layer that is down or does not answer
within ``LAYER_TIMEOUT`` gets the client an error message and close code 4503, and the page retries.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.utils.crypto import constant_time_compare
from redis.exceptions import ConnectionError as RedisConnectionError

from webapp.access import is_researcher
from webapp.runs import lifecycle, protocol, queries
from webapp.runs.models import Run, group_name

log = logging.getLogger(__name__)

CATCHUP_CHUNK = 5000
SAMPLE_CHUNK = 500
LOG_CHUNK = 1000
# How often an open socket re-checks that its session is still logged in as a researcher.
RECHECK_SECONDS = float(os.environ.get("GRUE_WS_RECHECK_S", "30"))
LAYER_TIMEOUT = float(os.environ.get("GRUE_BROADCAST_TIMEOUT", "1.0")) * 3


class RunConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        self.group = None
        self.subscribed = False
        self.live_received = 0
        self.cursors = dict.fromkeys(protocol.CURSOR_NAMES, 0)
        self._recheck_task: asyncio.Task | None = None
        user = self.scope.get("user")
        session = self.scope.get("session")
        self.user_id = getattr(user, "pk", None)
        self.session_key = getattr(session, "session_key", None)
        allowed = await database_sync_to_async(_allowed)(user, self.run_id)
        await self.accept()  # accept first: a browser only sees the close code of an accepted socket
        if allowed is None:
            await self.close(code=protocol.CLOSE_FORBIDDEN)
            return
        if allowed is False:
            await self.close(code=protocol.CLOSE_NOT_FOUND)
            return
        self._join_error: BaseException | None = None
        try:
            await asyncio.wait_for(self._join_group(), LAYER_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - Redis down or hung: say so; the page retries
            # A timeout that cut the retries short names the connection error they kept getting.
            cause = self._join_error if isinstance(exc, TimeoutError) and self._join_error else exc
            log.warning(
                "live updates of run %s unavailable: %s: %s", self.run_id, type(cause).__name__, cause
            )
            await self.send_json(protocol.error_message("live updates unavailable"))
            await self.close(code=protocol.CLOSE_UNAVAILABLE)
            return
        self.group = group_name(self.run_id)
        self._checked_at = time.monotonic()
        self._recheck_task = asyncio.ensure_future(self._recheck_loop())

    async def _join_group(self) -> None:
        """group_add, tried again on a connection error until ``LAYER_TIMEOUT`` (the caller's) runs out.

        Why: right after a Redis restart the first commands on the channel layer's connections fail with
        "Connection closed by server" and a moment later succeed; without a retry here every page open at
        the restart paid one failed websocket and a backoff before it was live again (its retries double
        up to 30 s). Joining a group is idempotent, so trying again is safe."""
        delay = 0.05
        while True:
            try:
                await self.channel_layer.group_add(group_name(self.run_id), self.channel_name)
                return
            except (OSError, RedisConnectionError) as exc:
                self._join_error = exc
                log.info("joining the live group of run %s: %s; trying again", self.run_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def disconnect(self, code: int) -> None:
        if self._recheck_task is not None:
            self._recheck_task.cancel()
        if self.group:
            try:
                await asyncio.wait_for(
                    self.channel_layer.group_discard(self.group, self.channel_name), LAYER_TIMEOUT
                )
            except Exception:  # noqa: BLE001 - the group entry expires on its own
                log.warning("leaving the live group of run %s failed", self.run_id, exc_info=True)

    # ------------------------------------------------------------------ session re-check
    async def _recheck_loop(self) -> None:
        while True:
            await asyncio.sleep(RECHECK_SECONDS)
            if not await self._still_allowed():
                return

    async def _still_allowed(self) -> bool:
        ok = await database_sync_to_async(_session_still_allowed)(self.session_key, self.user_id)
        self._checked_at = time.monotonic()
        if not ok:
            self.subscribed = False  # nothing more reaches this socket
            await self.close(code=protocol.CLOSE_FORBIDDEN)
        return ok

    # ------------------------------------------------------------------ client messages
    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            await self.send_json(protocol.error_message("expected a JSON object"))
            return
        kind = content.get("type")
        if kind == "subscribe":
            if self.subscribed:
                await self.send_json(protocol.error_message("already subscribed on this connection"))
                await self.close(code=protocol.CLOSE_RESUBSCRIBE)
                return
            self.subscribed = True  # live messages queue behind the catch-up (one task per consumer)
            self.cursors = protocol.parse_cursors(content.get("after"))
            await self._catch_up()
        elif kind == "ping":
            # The page pings now and then: a broadcast lost with nothing sent after it (the run's
            # last flush, or a long pause of the recorder) is found here and read from the database.
            if self.subscribed:
                newest = await database_sync_to_async(queries.run_cursors)(self.run_id)
                if protocol.missed_broadcast({"since": newest}, self.cursors):
                    await self._send_missed()
            await self.send_json(protocol.pong_message(self.live_received))
        else:
            await self.send_json(protocol.error_message(f"unknown message type {kind!r}"))

    async def _catch_up(self) -> None:
        await database_sync_to_async(lifecycle.mark_lost_runs)(run_ids=[self.run_id])
        status = await database_sync_to_async(queries.run_status_message)(self.run_id)
        if status is not None:
            await self.send_json(status)
        await self._send_missed()
        await self.send_json(protocol.caught_up_message(self.cursors))

    async def _send_missed(self) -> None:
        """Send every stored row past this consumer's cursors (in chunks), advancing them."""
        # Per stream: its rows past the cursor (in chunks), the message they make, a row's id.
        streams = (
            (queries.metrics_after, "metric_cursor", CATCHUP_CHUNK, protocol.metrics_message, _first),
            (queries.samples_after, "sample_cursor", SAMPLE_CHUNK, _samples_message, _row_id),
            (queries.logs_after, "log_cursor", LOG_CHUNK, _log_message, _row_id),
        )
        for read, cursor, chunk, message, row_id in streams:
            while True:
                rows = await database_sync_to_async(read)(self.run_id, self.cursors[cursor], limit=chunk)
                if not rows:
                    break
                self.cursors[cursor] = row_id(rows[-1])
                await self.send_json(message(rows))
                if len(rows) < chunk:
                    break

    # ------------------------------------------------------------------ group messages
    async def run_message(self, event: dict[str, Any]) -> None:
        """A message broadcast to the run's group (the recorder, lifecycle changes)."""
        self.live_received += 1
        if not self.subscribed:
            return  # the subscription's catch-up will read it from the database
        if time.monotonic() - self._checked_at > RECHECK_SECONDS and not await self._still_allowed():
            return
        message = event["message"]
        if protocol.missed_broadcast(message, self.cursors):
            # Rows were stored before this message that never reached this socket: read them from the
            # database first (this message's rows come with them and are dropped below), so the page
            # never moves its cursor past a gap.
            await self._send_missed()
        message.pop("since", None)
        msg = protocol.after_cursors(message, self.cursors)
        if msg is not None:
            await self.send_json(msg)


def _first(row: Any) -> int:
    return row[0]  # metrics_after's rows: (id, key, step, value)


def _row_id(row: Any) -> int:
    return row["id"]


def _samples_message(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "samples", "rows": rows}  # samples_after's rows are sample_row dicts already


def _log_message(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "log", "lines": rows}


def _allowed(user: Any, run_id: int) -> bool | None:
    """None: not authenticated/not a researcher; False: no such run; True: ok."""
    if user is None or not is_researcher(user):
        return None
    return Run.objects.filter(pk=run_id).exists()


def _session_still_allowed(session_key: str | None, user_id: int | None) -> bool:
    """The session is still stored, still logged in as the same user (same password), and that
    user is still an active researcher."""
    if not session_key or user_id is None:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    data = store.load()  # {} when deleted (logout) or expired
    if str(data.get(SESSION_KEY)) != str(user_id):
        return False
    user = get_user_model().objects.filter(pk=user_id).first()
    if user is None or not user.is_active:
        return False
    session_hash = data.get(HASH_SESSION_KEY)
    if not session_hash or not constant_time_compare(session_hash, user.get_session_auth_hash()):
        return False  # the password changed: Django ends every session of the user
    return is_researcher(user)
