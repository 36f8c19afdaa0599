"""Run the whole suite as two concurrent pytest processes (what ``make test`` calls).

Why: the suite is half CPU-bound engine tests (learning runs of tiny models, no services) and half
web, worker and browser tests that mostly wait on other processes (a Celery worker, daphne, chromium,
PostgreSQL). One after the other they took ~21 minutes on a 2-core machine; side by side the waiting
half runs while the engine half computes. The engine half gets one intra-op thread
(``OMP_NUM_THREADS=1``) so the two halves do not fight over the two cores.

The halves share nothing: the engine half (``tests/engine`` without the two files that talk to the
web app) never opens the database or Redis, so the other half keeps the test database, the Redis
database and the channel prefix to itself. Output: the web half streams; the engine half's output is
printed when it ends. The exit status is the first non-zero of the two.

Each half ends with its 15 slowest tests (``--durations``): the suite must stay well under 20 minutes,
and the list says where its time goes without another timed run.

    python tests/run_suite.py [pytest args for both halves]
    GRUE_SUITE_SERIAL=1 python tests/run_suite.py    # one process, as before
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Engine tests that use the web app (a live server, the database): they stay with the web half.
ENGINE_WITH_SERVICES = ("tests/engine/test_client_remote.py", "tests/engine/test_trackers.py")
# Printed by each half; the caller's own --durations (later on the command line) wins.
DURATIONS = ("--durations=15", "--durations-min=5")


def main(argv: list[str]) -> int:
    py = sys.executable
    if os.environ.get("GRUE_SUITE_SERIAL") or any(not a.startswith("-") for a in argv):
        # Serial on request, or when the caller names what to run (make test PYTEST_ARGS=tests/...).
        return subprocess.call([py, "-m", "pytest", *argv], cwd=ROOT)
    engine_args = ["tests/engine", *(f"--ignore={p}" for p in ENGINE_WITH_SERVICES)]
    # Named one by one: ``--ignore=tests/engine`` would also drop the two engine files named here.
    web_args = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").iterdir()
        if (p.is_dir() and p.name not in ("engine", "__pycache__") and any(p.glob("test_*.py")))
        or (p.is_file() and p.name.startswith("test_") and p.suffix == ".py")
    ) + list(ENGINE_WITH_SERVICES)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    started = time.monotonic()
    # The engine half writes to a temporary file (removed after it is printed), not to our stdout:
    # two pytest progress lines interleaved would be unreadable.
    with tempfile.NamedTemporaryFile("w+", prefix="grue-engine-tests-", suffix=".log") as log:
        engine = subprocess.Popen(
            [py, "-m", "pytest", *engine_args, *DURATIONS, *argv],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        print(f"engine tests run beside the others (output: {log.name}, printed when they end)", flush=True)
        try:
            web_rc = subprocess.call([py, "-m", "pytest", *web_args, *DURATIONS, *argv], cwd=ROOT)
            engine_rc = engine.wait()
        except KeyboardInterrupt:
            engine.terminate()
            engine.wait()
            raise
        log.seek(0)
        print("\n======== engine tests (tests/engine) ========", flush=True)
        sys.stdout.write(log.read())
    minutes = (time.monotonic() - started) / 60
    print(
        f"\nsuite: web half exit {web_rc}, engine half exit {engine_rc}, {minutes:.1f} min in all", flush=True
    )
    return web_rc or engine_rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
