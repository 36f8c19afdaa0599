"""Browser fixtures: Debian chromium driven by Playwright (browsers cannot be downloaded here), and a
real daphne server that enqueues on the queue of the test's real Celery worker.

Browser tests need committed rows: mark them ``@pytest.mark.django_db(transaction=True)``.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import AsgiServer, WorkerProcess

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


@pytest.fixture
def live_server_with_worker(celery_worker: Any, test_db_name: str, runs_dir: Path) -> Iterator[AsgiServer]:
    """A real daphne whose launches are executed by the session's real Celery worker."""
    server = AsgiServer(test_db_name, runs_dir, queue=celery_worker.queue)
    yield server
    server.stop()


@pytest.fixture
def two_workers_server(
    worker_factory: Callable[..., WorkerProcess], test_db_name: str, runs_dir: Path, settings: Any
) -> Iterator[tuple[AsgiServer, list[WorkerProcess]]]:
    """Two real Celery workers consuming ONE run queue, and a real daphne whose launches go to it:
    what ``manage.py up --workers 2`` gives, so a sweep's runs spread over whichever worker is free.
    Each worker is ``--pool=solo --concurrency=1`` (tests/conftest.py's ``WorkerProcess``) with a
    prefetch multiplier of 1 and early acks (webapp/settings.py): it takes the next message only
    after its current run ends. They start (and stop) side by side, not one after the other."""
    queue = f"pair-{uuid.uuid4().hex[:8]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    env = {"CELERY_QUEUE": queue, "GRUE_WORKER_DEVICES": "cpu"}
    host = socket.gethostname()
    with ThreadPoolExecutor(3) as pool:
        starting = [
            pool.submit(worker_factory, queue=queue, name=f"{queue}-{i}@{host}", extra_env=env) for i in "ab"
        ]
        serving = pool.submit(AsgiServer, test_db_name, runs_dir, queue=queue)
    futures = [*starting, serving]
    up = [f.result() for f in futures if f.exception() is None]

    def stop_all() -> None:
        with ThreadPoolExecutor(3) as stopping:
            list(stopping.map(lambda p: p.stop(), up))

    if len(up) < len(futures):  # one failed to start: stop the others, then report why
        stop_all()
        next(f for f in futures if f.exception() is not None).result()
    yield serving.result(), [f.result() for f in starting]
    stop_all()


def require_chromium(path: str = CHROMIUM) -> str:
    """``path`` when it is an executable; otherwise fail with the command that installs it (the
    browser tests use Debian's chromium: Playwright cannot download its own browsers here)."""
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"browser tests drive Debian's chromium at {path}, which is not installed: run "
            "`make system-packages` (as root it runs apt-get install chromium)",
            pytrace=False,
        )
    return path


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
            b = pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS, headless=True)
            yield b
            b.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    # bypass_csp: Playwright's wait_for_function evaluates its predicate with eval(), which the app's
    # Content-Security-Policy forbids; tests/e2e/test_csp_browser.py checks the pages under the CSP.
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    yield pg
    context.close()


@pytest.fixture
def login(password_of: Callable[[Any], str]) -> Callable[..., None]:
    """Log a browser page in through the real login form, then wait for the redirect:
    ``login(page, base_url, user, password=None, next_url="/")``. ``user`` is a fixture user (its
    password comes from ``password_of``) or a username with ``password`` given."""

    def do(page: Any, base_url: str, user: Any, password: str | None = None, next_url: str = "/") -> None:
        username = user if isinstance(user, str) else user.username
        secret = password if password is not None else password_of(user)
        page.goto(f"{base_url}/accounts/login/" + (f"?next={next_url}" if next_url != "/" else ""))
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", secret)
        page.click("form [type=submit]")
        page.wait_for_url(f"{base_url}{next_url}")

    return do
