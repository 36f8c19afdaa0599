"""Live updates of one run over a websocket (protocol in docs/platform.md).

Client → server:
  {"type": "subscribe", "after": {"metric_cursor": 0, "sample_cursor": 0, "log_cursor": 0}}
  {"type": "ping"}
Server → client:
  {"type": "status", "status", "progress", "eta_seconds", "current_iter", "total_iters", "phase", "error", ...}
  {"type": "metrics", "points": [{"id", "key", "step", "value"}, ...]}
  {"type": "samples", "rows": [{"id", "step", "split", "sample_id", "prompt", "generation", "references",
                                "reward", "metrics"}, ...]}
  {"type": "log", "lines": [{"id", "line", "time"}, ...]}
  {"type": "checkpoint", "step", "path"}
  {"type": "caught_up", "metric_cursor", "sample_cursor", "log_cursor"}
  {"type": "pong"}

No gaps, no duplicates: the consumer joins the group at connect, before reading the catch-up
from the database; rows are stored before they are broadcast, so anything broadcast after the
read has a larger id than the cursor and anything before it is in the read. Live messages with
ids at or below the cursor are dropped.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from webapp.access import is_researcher
from webapp.runs.models import group_name

CATCHUP_CHUNK = 5000


class RunConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        allowed = await database_sync_to_async(_allowed)(user, self.run_id)
        if allowed is None:
            await self.close(code=4403)
            return
        if allowed is False:
            await self.close(code=4404)
            return
        self.group = group_name(self.run_id)
        self.subscribed = False
        self.cursors = {"metric_cursor": 0, "sample_cursor": 0, "log_cursor": 0}
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "error": "expected a JSON object"})
            return
        kind = content.get("type")
        if kind == "subscribe":
            after = content.get("after") or {}
            if not isinstance(after, dict):
                after = {}
            for name in self.cursors:
                try:
                    self.cursors[name] = max(0, int(after.get(name) or 0))
                except (TypeError, ValueError):
                    self.cursors[name] = 0
            await self._catch_up()
            self.subscribed = True
        elif kind == "ping":
            await self.send_json({"type": "pong"})
        else:
            await self.send_json({"type": "error", "error": f"unknown message type {kind!r}"})

    async def _catch_up(self) -> None:
        from webapp.runs import queries, services

        await database_sync_to_async(services.mark_lost_runs)(run_ids=[self.run_id])
        status = await database_sync_to_async(queries.run_status_message)(self.run_id)
        if status is not None:
            await self.send_json(status)
        while True:
            points = await database_sync_to_async(queries.metrics_after)(
                self.run_id, self.cursors["metric_cursor"], limit=CATCHUP_CHUNK
            )
            if not points:
                break
            self.cursors["metric_cursor"] = points[-1]["id"]
            await self.send_json({"type": "metrics", "points": points})
            if len(points) < CATCHUP_CHUNK:
                break
        while True:
            rows = await database_sync_to_async(queries.samples_after)(
                self.run_id, self.cursors["sample_cursor"], limit=500
            )
            if not rows:
                break
            self.cursors["sample_cursor"] = rows[-1]["id"]
            await self.send_json({"type": "samples", "rows": rows})
            if len(rows) < 500:
                break
        lines = await database_sync_to_async(queries.logs_after)(
            self.run_id, self.cursors["log_cursor"], limit=1000
        )
        if lines:
            self.cursors["log_cursor"] = lines[-1]["id"]
            await self.send_json({"type": "log", "lines": lines})
        await self.send_json({"type": "caught_up", **self.cursors})

    async def run_message(self, event: dict[str, Any]) -> None:
        """A message broadcast to the run's group (see ``webapp.runs.broadcast``)."""
        if not self.subscribed:
            return  # the subscription's catch-up will read it from the database
        msg = event["message"]
        kind = msg.get("type")
        if kind == "metrics":
            cur = self.cursors["metric_cursor"]
            points = [p for p in msg.get("points", []) if p["id"] > cur]
            if not points:
                return
            self.cursors["metric_cursor"] = max(p["id"] for p in points)
            msg = {**msg, "points": points}
        elif kind == "samples":
            cur = self.cursors["sample_cursor"]
            rows = [r for r in msg.get("rows", []) if r["id"] > cur]
            if not rows:
                return
            self.cursors["sample_cursor"] = max(r["id"] for r in rows)
            msg = {**msg, "rows": rows}
        elif kind == "log":
            cur = self.cursors["log_cursor"]
            lines = [r for r in msg.get("lines", []) if r["id"] > cur]
            if not lines:
                return
            self.cursors["log_cursor"] = max(r["id"] for r in lines)
            msg = {**msg, "lines": lines}
        await self.send_json(msg)


def _allowed(user: Any, run_id: int) -> bool | None:
    """None: not authenticated/not a researcher; False: no such run; True: ok."""
    if user is None or not is_researcher(user):
        return None
    from webapp.runs.models import Run

    return Run.objects.filter(pk=run_id).exists()
