"""The run page's live connection in a real browser when the server refuses it: the page stops
reconnecting and says why (close codes 4403/4404 reach the browser because the server accepts the
handshake before closing), and a recorder flush (one ``batch`` message) is drawn.

Real parts only: Debian chromium through Playwright, daphne, Channels over Redis, PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.e2e]


def _in_thread(fn: Any) -> None:
    """Database work from another thread: Playwright's event loop occupies this one."""
    from django.db import connection

    def run() -> None:
        try:
            fn()
        finally:
            connection.close()

    t = threading.Thread(target=run)
    t.start()
    t.join()


@pytest.mark.django_db(transaction=True)
def test_logged_out_page_stops_and_says_why(page: Any, asgi_server: Any, researcher: Any, login: Any) -> None:
    from django.contrib.sessions.models import Session

    from webapp.runs.models import Run
    from webapp.runs.recorder import Recorder

    run = Run.objects.create(name="live", config={}, status="running")
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    expect(page.locator("#ws-state")).to_have_text("live")

    # One recorder flush = one batch message with points and a log line: both are drawn.
    def record() -> None:
        sink = Recorder(run.pk)
        sink.metrics(1, {"train/reward_mean": 0.25, "train/kl": 0.01})
        sink.close()

    _in_thread(record)
    page.wait_for_function("window.grueRun.pointCount() === 2")
    expect(page.locator("#log-tail .line")).to_contain_text(["step 1: "])

    # The session ends (logout elsewhere); the next connection is refused with 4403 and the page stops.
    _in_thread(lambda: Session.objects.all().delete())
    page.evaluate("window.grueRun.disconnect()")
    expect(page.locator("#ws-state")).to_have_text(
        "live updates stopped: not allowed (log in again as a researcher)", timeout=30_000
    )
    assert page.evaluate("window.grueRun.state.stopped") is not None
    assert page.evaluate("window.grueRun.state.ws") is None  # no reconnect scheduled


@pytest.mark.django_db(transaction=True)
def test_deleted_run_page_stops_and_says_why(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    from webapp.runs.models import Run

    run = Run.objects.create(name="gone", config={}, status="running")
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    expect(page.locator("#ws-state")).to_have_text("live")
    _in_thread(lambda: Run.objects.filter(pk=run.pk).delete())
    page.evaluate("window.grueRun.disconnect()")
    expect(page.locator("#ws-state")).to_have_text(
        "live updates stopped: this run no longer exists", timeout=30_000
    )
