"""The run page's buttons follow the run's status live: after a cancel, Resume appears without a reload.

Real parts: Debian chromium through Playwright, daphne, Channels over Redis, PostgreSQL; the status
changes are made by the real ``lifecycle`` functions (the ones the worker calls), from a thread because
Playwright's event loop occupies this one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from webapp.runs import lifecycle, services
from webapp.runs.models import Checkpoint, Run, RunStatus

pytestmark = [pytest.mark.e2e]

TINY = {
    "name": "buttons",
    "model": {"name_or_path": "builtin:tiny-gpt2"},
    "task": {"id": "synthetic_increasing_numbers"},
    "reward": {"id": "increasing_numbers"},
    "train": {"n_iters": 50},
}


def in_thread(fn: Callable[[], Any]) -> None:
    worker = threading.Thread(target=fn)
    worker.start()
    worker.join()


@pytest.mark.django_db(transaction=True)
def test_resume_appears_after_a_cancel_without_a_reload(
    page: Any, asgi_server: Any, researcher: Any, login: Any, runs_dir: Any
) -> None:
    run = services.create_run(TINY, user=researcher)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED, task_id="browser-task")
    assert lifecycle.claim(run.pk, task_id="browser-task", worker="browser-test") is not None
    Run.objects.filter(pk=run.pk).update(run_dir=str(runs_dir / f"buttons-{run.pk}"))
    Checkpoint.objects.create(run_id=run.pk, step=3, path=str(runs_dir / f"buttons-{run.pk}" / "rl-000003"))

    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    expect(page.locator("#ws-state")).to_have_text("live")
    expect(page.locator("#cancel-btn")).to_be_visible()
    assert page.locator("#resume-btn").count() == 0
    page.evaluate("window.__sameDocument = true")

    in_thread(lambda: lifecycle.cancel_run(Run.objects.get(pk=run.pk)))
    expect(page.locator("#status-badge")).to_have_text("running (cancelling…)")
    expect(page.locator("#cancel-btn")).to_be_hidden()  # the fragment: a second cancel is refused

    in_thread(lambda: lifecycle.finish(run.pk, {"stopped": True, "iterations": 3}))
    expect(page.locator("#status-badge")).to_have_text("cancelled")
    expect(page.locator("#resume-btn")).to_be_visible()
    expect(page.locator("#retry-btn")).to_be_visible()
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
