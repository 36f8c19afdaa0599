"""Queue routing and what a worker can serve: its device kind, the queues it consumes, who is out there.

The one home of queue routing: ``run_queue`` says which queue a run (or another GPU-free job, such as
a reward model or an AI judge) is sent to, and ``extra_queues`` which queues a worker consumes, so the
two cannot disagree. A worker always consumes the CPU run queue (``CELERY_QUEUE``, default ``runs``);
a worker that serves GPUs also consumes ``runs-gpu`` (``run_queue`` routes a run with
``resources.devices: cuda`` there). ``GRUE_WORKER_DEVICES`` sets the kind: ``cpu``, ``cuda``, or
``auto`` (default: ``cuda`` when ``torch.cuda.is_available()``). ``celery -A webapp worker -Q ...``
still works for any other layout.

A GPU worker's capacity is counted in GPUs: ``GRUE_WORKER_GPUS`` (an override, e.g. to test on a
machine without GPUs, or to give each of several workers on one host its share), else
``torch.cuda.device_count()``. A run needs ``resources.processes × resources.gpus_per_process``
GPUs, all on one worker (torchrun ``--standalone`` starts its ranks on the worker's host). Each
worker answers the ``grue_resources`` remote-control command with its kind and GPU count, which
:func:`describe` merges with Celery's own ``inspect`` replies.
"""

from __future__ import annotations

import os
from typing import Any

from celery.worker.control import inspect_command
from django.conf import settings

#: Suffix of the queue GPU runs go to: ``runs`` (CPU) and ``runs-gpu`` by default.
GPU_QUEUE_SUFFIX = "-gpu"


def run_queue(config: dict[str, Any] | None = None) -> str:
    """The Celery queue a run is sent to: the CPU queue (``CELERY_QUEUE``, tests use one of their
    own), or its ``-gpu`` twin when the config's ``resources.devices`` is ``cuda``. Workers on a GPU
    host consume both (``extra_queues``), CPU-only workers only the first."""
    base = settings.CELERY_TASK_DEFAULT_QUEUE
    devices = ((config or {}).get("resources") or {}).get("devices", "cpu")
    return base + GPU_QUEUE_SUFFIX if devices == "cuda" else base


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


def worker_gpus(devices: str) -> int:
    """GPUs this worker offers: ``GRUE_WORKER_GPUS`` when set, else the detected count on a GPU
    worker (0 on a CPU worker). Called in the worker only (it loads torch)."""
    override = os.environ.get("GRUE_WORKER_GPUS", "").strip()
    if override:
        try:
            n = int(override)
        except ValueError:
            raise ValueError(f"GRUE_WORKER_GPUS={override!r}: expected a number of GPUs") from None
        if n < 0:
            raise ValueError(f"GRUE_WORKER_GPUS={override!r}: expected a number of GPUs >= 0")
        return n
    if devices != "cuda":
        return 0
    import torch

    return int(torch.cuda.device_count())


@inspect_command(name="grue_resources")
def grue_resources(state: Any) -> dict[str, Any]:
    """Remote control (in the worker): its device kind and GPUs, for the launch form's panel."""
    import torch

    devices = worker_devices(torch.cuda.is_available())
    return {"devices": devices, "gpus": worker_gpus(devices)}


def gpus_needed(config: dict[str, Any] | None) -> int:
    """GPUs a run needs on one worker: ``processes × gpus_per_process`` (0 for a CPU run)."""
    res = (config or {}).get("resources") or {}
    if res.get("devices", "cpu") != "cuda":
        return 0
    return int(res.get("processes") or 1) * int(res.get("gpus_per_process") or 0)


def extra_queues(devices: str) -> list[str]:
    """Queues a worker consumes besides the CPU run queue: the GPU queue on a GPU worker."""
    if devices == "cuda":
        return [run_queue({"resources": {"devices": "cuda"}})]
    return []


def describe(app: Any, timeout: float = 1.0) -> list[dict[str, Any]]:
    """The live workers that consume run queues, with their free slots (concurrency minus active
    tasks), from Celery's own remote control (``inspect``); empty when none answers in ``timeout``."""
    insp = app.control.inspect(timeout=timeout)
    queues = insp.active_queues() or {}
    stats = insp.stats() or {}
    active = insp.active() or {}
    resources: dict[str, dict[str, Any]] = {}
    for reply in app.control.broadcast("grue_resources", reply=True, timeout=timeout) or []:
        resources.update(reply)
    cpu_q = settings.CELERY_TASK_DEFAULT_QUEUE
    gpu_q = run_queue({"resources": {"devices": "cuda"}})
    out = []
    for name, qs in sorted(queues.items()):
        names = {q.get("name") for q in qs}
        kinds = [k for k, q in (("cpu", cpu_q), ("cuda", gpu_q)) if q in names]
        if not kinds:
            continue
        pool = (stats.get(name) or {}).get("pool") or {}
        slots = int(pool.get("max-concurrency") or 1)
        free = max(0, slots - len(active.get(name) or []))
        # GPUs: a busy worker (one run per slot) has none free; an older worker that does not know
        # the command counts as having none.
        gpus = int((resources.get(name) or {}).get("gpus") or 0) if "cuda" in kinds else 0
        out.append(
            {
                "name": name,
                "devices": kinds,
                "slots": slots,
                "free": free,
                "gpus": gpus,
                "free_gpus": gpus if free == slots else 0,
            }
        )
    return out


def can_serve(workers: list[dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    """The workers whose queues a run with this config is routed to and that have the GPUs it
    needs (``gpus_needed``) on one machine; free now or not."""
    devices = ((config or {}).get("resources") or {}).get("devices", "cpu")
    need = gpus_needed(config)
    return [w for w in workers if devices in w["devices"] and w.get("gpus", 0) >= need]


def unservable_reason(workers: list[dict[str, Any]], config: dict[str, Any]) -> str | None:
    """Why no live worker can take this run (``None`` when one can): said before queueing, because
    Celery would keep such a run in its queue until a worker that fits joins."""
    if can_serve(workers, config):
        return None
    devices = ((config or {}).get("resources") or {}).get("devices", "cpu")
    need = gpus_needed(config)
    if not workers:
        return "no worker answered: the run will wait in its queue until one starts"
    kind = [w for w in workers if devices in w["devices"]]
    if not kind:
        return f"no live worker serves {devices} runs: the run will wait in its queue until one joins"
    most = max(w.get("gpus", 0) for w in kind)
    return (
        f"the run needs {need} GPUs on one worker (processes × gpus_per_process) and the largest GPU "
        f"worker has {most}: it will wait in its queue until a worker with {need} GPUs joins"
    )
