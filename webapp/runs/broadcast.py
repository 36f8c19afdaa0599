"""Sending one live message to a run's Channels group from synchronous code (views, lifecycle).

Broadcasting is best effort (Channels groups are fire-and-forget): rows are always stored first, and
a browser that missed a message catches up from its cursor, so a failed or slow send only logs. Every
send has a timeout (``GRUE_BROADCAST_TIMEOUT``, default 1 s): a hung Redis cannot hold a request or a
status change longer than that. The recorder sends its flushes with its own ``Broadcaster`` (one event
loop and connection per run). Messages are built in ``webapp.runs.protocol``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from webapp.runs.models import group_name
from webapp.runs.protocol import clean_float, status_message

__all__ = ["DEFAULT_BROADCAST_TIMEOUT_S", "broadcast", "clean_float", "status_message"]

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
