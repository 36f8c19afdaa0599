"""Browser fixtures: Debian chromium driven by Playwright (browsers cannot be downloaded here), and a
real daphne server that enqueues on the queue of the test's real Celery worker.

Browser tests need committed rows: mark them ``@pytest.mark.django_db(transaction=True)``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """daphne serving ``webapp.asgi:application`` against pytest-django's test database."""

    def __init__(self, test_db_name: str, runs_dir: Path, queue: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = runs_dir / f"daphne-e2e-{self.port}.log"
        env = dict(os.environ)
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # the browser fixture's exemption is for this process only
        env.update(
            DJANGO_SETTINGS_MODULE="webapp.settings",
            GRUE_TEST_DB_NAME=test_db_name,
            GRUE_RUNS_DIR=str(runs_dir),
            CELERY_QUEUE=queue,  # launches from the browser go to the test worker's queue
            PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "webapp.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.proc.returncode}:\n{self.log()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"daphne did not listen within 60 s:\n{self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


@pytest.fixture
def live_server_with_worker(celery_worker: Any, test_db_name: str, runs_dir: Path) -> Iterator[LiveServer]:
    """A real daphne whose launches are executed by the session's real Celery worker."""
    server = LiveServer(test_db_name, runs_dir, celery_worker.queue)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module. Playwright's sync API keeps an event loop running in this
    thread, which makes Django refuse ORM calls ("async context"); the test's own ORM use is plain
    synchronous code, so it is allowed while the browser is open, and the loop is closed after the
    module so that later tests run as usual."""
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            yield b
            b.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    yield pg
    context.close()
