"""What a worker can serve: its device kind, the queues it consumes, and who is out there.

A worker always consumes the CPU run queue (``CELERY_QUEUE``, default ``runs``); a worker that
serves GPUs also consumes ``runs-gpu`` (``services.run_queue`` routes a run with
``resources.devices: cuda`` there). ``GRUE_WORKER_DEVICES`` sets the kind: ``cpu``, ``cuda``, or
``auto`` (default: ``cuda`` when ``torch.cuda.is_available()``). ``celery -A webapp worker -Q ...``
still works for any other layout.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings

from webapp.runs import services


def worker_devices(cuda_available: bool) -> str:
    """``cpu`` or ``cuda``: what this worker offers (``GRUE_WORKER_DEVICES``; ``auto`` = detected,
    the caller, a worker, passes ``torch.cuda.is_available()``: this module stays free of torch
    because the web process imports it for the launch form)."""
    kind = os.environ.get("GRUE_WORKER_DEVICES", "auto").strip().lower()
    if kind not in ("auto", "cpu", "cuda"):
        raise ValueError(f"GRUE_WORKER_DEVICES={kind!r}: expected auto, cpu or cuda")
    if kind == "auto":
        return "cuda" if cuda_available else "cpu"
    return kind


def extra_queues(devices: str) -> list[str]:
    """Queues a worker consumes besides the CPU run queue: the GPU queue on a GPU worker."""
    if devices == "cuda":
        return [services.run_queue({"resources": {"devices": "cuda"}})]
    return []


def describe(app: Any, timeout: float = 1.0) -> list[dict[str, Any]]:
    """The live workers that consume run queues, with their free slots (concurrency minus active
    tasks), from Celery's own remote control (``inspect``); empty when none answers in ``timeout``."""
    insp = app.control.inspect(timeout=timeout)
    queues = insp.active_queues() or {}
    stats = insp.stats() or {}
    active = insp.active() or {}
    cpu_q = settings.CELERY_TASK_DEFAULT_QUEUE
    gpu_q = services.run_queue({"resources": {"devices": "cuda"}})
    out = []
    for name, qs in sorted(queues.items()):
        names = {q.get("name") for q in qs}
        kinds = [k for k, q in (("cpu", cpu_q), ("cuda", gpu_q)) if q in names]
        if not kinds:
            continue
        pool = (stats.get(name) or {}).get("pool") or {}
        slots = int(pool.get("max-concurrency") or 1)
        out.append(
            {
                "name": name,
                "devices": kinds,
                "slots": slots,
                "free": max(0, slots - len(active.get(name) or [])),
            }
        )
    return out


def can_serve(workers: list[dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    """The workers whose queues a run with this config is routed to."""
    devices = ((config or {}).get("resources") or {}).get("devices", "cpu")
    return [w for w in workers if devices in w["devices"]]
