"""Sending live messages to a run's Channels group.

Broadcasting is best effort (Channels groups are fire-and-forget): rows are always stored first,
and a browser that missed a message catches up from its cursor, so a failed send only logs.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from webapp.runs.models import group_name

log = logging.getLogger(__name__)


def clean_float(v: Any) -> float | None:
    """JSON has no NaN/Infinity: send them as null (the chart shows a gap)."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def broadcast(run_id: int, message: dict[str, Any]) -> bool:
    """Send ``message`` to every consumer of the run; returns False (and logs) when it failed."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        async_to_sync(layer.group_send)(group_name(run_id), {"type": "run.message", "message": message})
        return True
    except Exception:  # noqa: BLE001 - the data is stored; clients catch up from their cursor
        log.warning("broadcast to run %s failed", run_id, exc_info=True)
        return False


def status_message(run: Any) -> dict[str, Any]:
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
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }
