"""Multi-process runs in a worker: ``torchrun`` launched and supervised by ``execute_run``.

A run whose config asks for ``resources.processes > 1`` is not trained inside the Celery process.
The worker starts ``python -m torch.distributed.run --standalone --nproc_per_node N -m
webapp.runs.rank_main RUN_ID CONFIG`` in a process group of its own and supervises it:

* rank 0 (``webapp/runs/rank_main.py``) trains with the worker's own sink and stop check (the
  ``Recorder`` and ``StopCheck`` of ``webapp/runs/``), so metrics, samples, logs and checkpoints
  reach the database and the websocket exactly as for a one-process run; the other ranks train
  with no sink (engine/distributed.py: rank 0 alone reports);
* the worker's heartbeat thread keeps beating while it waits, so a dead worker makes the run
  ``lost`` as before; every process of the launch dies with its parent (``PR_SET_PDEATHSIG``), so a
  killed worker leaves no orphan ranks training;
* cancel: rank 0 sees the cancel flag at its next step and stops with a checkpoint; if the launch
  has not ended ``GRUE_CANCEL_GRACE_S`` seconds later, the whole process group is killed;
* the launch's exit status decides the outcome: rank 0 leaves the engine's summary in the run
  directory; a non-zero exit fails the run with the tail of torchrun's output;
* a run that needs more GPUs than this worker has (``resources.processes × gpus_per_process``
  against ``GRUE_WORKER_GPUS`` or the detected count, webapp/runs/workers.py) fails before
  torchrun starts, with both numbers, instead of with a CUDA error from one of its ranks.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from webapp.runs import workers

SUMMARY_FILE = "launch-summary.json"
CONFIG_FILE = "launch-config.json"
LOG_FILE = "torchrun.log"
_PR_SET_PDEATHSIG = 1


class LaunchFailed(RuntimeError):
    """torchrun exited non-zero (a rank failed or was killed)."""


def cancel_grace_s() -> float:
    """Seconds a cancelled launch gets to stop at a step (with a checkpoint) before it is killed."""
    return float(os.environ.get("GRUE_CANCEL_GRACE_S", "30"))


def processes_of(config: dict[str, Any]) -> int:
    return int((config.get("resources") or {}).get("processes") or 1)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def torchrun_command(nproc: int, run_id: int, config_path: Path, resume_from: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd += ["-m", "webapp.runs.rank_main", str(run_id), str(config_path)]
    return cmd + (["--resume", resume_from] if resume_from else [])


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_distributed(
    run_id: int,
    config: dict[str, Any],
    resume_from: str | None,
    cancel_requested: Callable[[], bool],
    grace_s: float,
    poll_s: float = 1.0,
) -> dict[str, Any]:
    """Launch the run on ``resources.processes`` local processes and wait for it; the engine's summary."""
    need = workers.gpus_needed(config)
    if need:
        have = workers.worker_gpus("cuda")
        if need > have:
            raise LaunchFailed(
                f"the run needs {need} GPUs (resources.processes × gpus_per_process) on one worker and "
                f"this worker has {have} (GRUE_WORKER_GPUS or detected): it cannot start here"
            )
    run_dir = Path(config["train"]["output_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / CONFIG_FILE
    fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(config, f)
    summary_path = run_dir / SUMMARY_FILE
    summary_path.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    with open(run_dir / LOG_FILE, "ab") as log:
        proc = subprocess.Popen(
            torchrun_command(processes_of(config), run_id, config_path, resume_from),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # one process group: cancel kills torchrun and every rank
            preexec_fn=die_with_parent,  # noqa: PLW1509 - no threads touch the child between fork and exec
        )
    cancelled_at: float | None = None
    try:
        while proc.poll() is None:
            if cancelled_at is None and cancel_requested():
                cancelled_at = time.monotonic()  # rank 0 stops at its next step; the group after grace_s
            if cancelled_at is not None and time.monotonic() - cancelled_at > grace_s:
                _kill_group(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=poll_s)
    finally:
        if proc.poll() is None:  # the task itself is going away (worker shutdown, an exception)
            _kill_group(proc)
            proc.wait()
    if cancelled_at is not None and proc.returncode != 0:
        return {"stopped": True, "run_dir": str(run_dir), "killed": True}
    if proc.returncode != 0:
        tail = (run_dir / LOG_FILE).read_text(errors="replace")[-3000:]
        raise LaunchFailed(f"torchrun exited with status {proc.returncode}:\n{tail}")
    return json.loads(summary_path.read_text())
