"""The whole researcher loop in a real browser: log in, launch the tiny synthetic preset from the
generated form, watch a chart grow live over the websocket (no reload), cancel, see "cancelled".

Real parts only: Debian chromium through Playwright, daphne, Channels over Redis, a Celery worker
process running ``engine.train`` on the builtin tiny GPT-2, PostgreSQL."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.e2e]

SCREENSHOTS = os.environ.get("GRUE_SCREENSHOTS")  # a directory: also save screenshots for the docs


def login(page: Any, base_url: str, username: str, password: str) -> None:
    """Log in through the real login form."""
    page.goto(f"{base_url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("form [type=submit]")
    page.wait_for_url(f"{base_url}/")


def _shot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        page.screenshot(path=os.path.join(SCREENSHOTS, f"{name}.png"), full_page=True)


@pytest.mark.django_db(transaction=True)
def test_launch_watch_live_and_cancel(
    page: Any, live_server_with_worker: Any, researcher: Any, password_of: Any
) -> None:
    from webapp.runs.models import MetricPoint, Run, RunStatus

    base = live_server_with_worker.url
    login(page, base, researcher.username, password_of(researcher))

    # Launch page: start from the tiny synthetic PPO preset, then edit it in the generated form.
    page.goto(f"{base}/launch/?preset=synthetic_ppo")
    expect(page.locator("#preset-description")).to_contain_text("synthetic_ppo")
    expect(page.locator("input[name=model__name_or_path]")).to_have_value("builtin:tiny-gpt2")
    page.click("#section-tabs a[data-section=train]")
    page.fill("input[name=train__n_iters]", "400")  # long enough to watch and cancel
    page.fill("input[name=train__eval_every]", "0")
    page.fill("input[name=train__save_every]", "0")
    page.click("#section-tabs a[data-section=general]")
    page.fill("input[name=name]", "browser-run")
    _shot(page, "launch")
    page.click("#launch-btn")

    page.wait_for_url(f"{base}/runs/*/")
    run = Run.objects.get(name="browser-run")
    assert page.url == f"{base}/runs/{run.pk}/"
    assert run.config["train"]["n_iters"] == 400

    # Live: the reward chart appears and its point count grows without a reload.
    page.wait_for_function("window.grueRun && window.grueRun.pointCount() > 0", timeout=180_000)
    reward = page.locator(".chart[data-group=reward]")
    expect(reward).to_be_visible()
    first = page.evaluate("window.grueRun.pointCount()")
    page.wait_for_function(f"window.grueRun.pointCount() > {first}", timeout=120_000)
    page.wait_for_function(
        "Number(document.querySelector('.chart[data-group=reward]').dataset.points) > 1", timeout=60_000
    )
    expect(page.locator("#status-badge")).to_have_text("running")
    expect(page.locator("#ws-state")).to_have_text("live")
    assert page.locator("#samples-body tr").count() > 0  # newest generations arrived live
    # The page is still the same document (no reload happened while it grew).
    assert page.evaluate("window.performance.getEntriesByType('navigation')[0].type") != "reload"
    _shot(page, "run")

    # Drop the websocket: the page reconnects by itself, sends its cursor and keeps growing.
    before = page.evaluate("window.grueRun.pointCount()")
    page.evaluate("window.grueRun.disconnect()")
    expect(page.locator("#ws-state")).not_to_have_text("live", timeout=10_000)
    expect(page.locator("#ws-state")).to_have_text("live", timeout=60_000)
    page.wait_for_function(f"window.grueRun.pointCount() > {before}", timeout=120_000)

    # Cancel: a POST with CSRF; the worker stops between iterations and the badge says cancelled.
    page.click("#cancel-btn")
    expect(page.locator("#status-badge")).to_have_text("cancelled", timeout=120_000)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert 0 < run.current_iter < 400
    # No gaps, no duplicates across the reconnect: the page holds exactly the stored (key, step) points.
    stored = MetricPoint.objects.filter(run=run).count()
    page.wait_for_function(f"window.grueRun.pointCount() === {stored}", timeout=30_000)
    # Once finished, the page offers retry/delete instead of cancel, without a reload.
    expect(page.locator("#retry-btn")).to_be_visible()
    expect(page.locator("#cancel-btn")).to_be_hidden()


@pytest.mark.django_db(transaction=True)
def test_live_generations_are_inserted_as_text_not_html(
    page: Any, asgi_server: Any, researcher: Any, password_of: Any
) -> None:
    """A generation arriving over the websocket is shown verbatim and never parsed as HTML."""
    from webapp.runs import services
    from webapp.runs.broadcast import broadcast
    from webapp.runs.models import RunStatus

    run = services.create_run({"name": "xss"}, user=researcher)
    run.status = RunStatus.RUNNING
    run.save(update_fields=["status"])
    login(page, asgi_server.url, researcher.username, password_of(researcher))
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    expect(page.locator("#ws-state")).to_have_text("live")
    payload = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
    rows = services.ingest_samples(
        run.pk,
        3,
        "train",
        [{"prompt": f"p {payload}", "generation": f"g {payload}", "references": [], "reward": 0.5}],
    )
    # Broadcast from another thread: Playwright's event loop occupies this one.
    sender = threading.Thread(target=broadcast, args=(run.pk, services.sample_message(rows)))
    sender.start()
    sender.join()
    cell = page.locator("#samples-body td.generation").first
    expect(cell).to_have_text(f"g {payload}")
    assert page.locator("#samples-body img, #samples-body script").count() == 0
    assert page.evaluate("window.__xss") is None


@pytest.mark.django_db(transaction=True)
def test_zoom_fetches_full_resolution(page: Any, asgi_server: Any, researcher: Any, password_of: Any) -> None:
    """The overview of a long metric is downsampled; zooming loads every point of the range."""
    from webapp.runs import services

    run = services.create_run({"name": "long"}, user=researcher)
    services.ingest_metrics(run.pk, [("train/reward_mean", s, (s % 97) / 97) for s in range(20_000)])
    login(page, asgi_server.url, researcher.username, password_of(researcher))
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    page.wait_for_function("window.grueRun && window.grueRun.pointCount() > 0")
    chart = "document.querySelector('.chart[data-group=reward]')"
    overview = page.evaluate(f"{chart}.data[0].x.length")
    assert 0 < overview < 20_000  # downsampled by the server
    page.evaluate(f"Plotly.relayout({chart}, {{'xaxis.range': [1000, 1300]}})")
    page.wait_for_function(f"{chart}.dataset.zoomed === '1000:1300'")
    page.wait_for_function(f"{chart}.data[0].x.length === 301")  # every step of the range
    page.evaluate(f"Plotly.relayout({chart}, {{'xaxis.autorange': true}})")
    page.wait_for_function(f"{chart}.data[0].x.length === {overview}")
    # The smoothing is a debiased EMA; by hand for alpha = 0.5 over [1, 2, gap, 4]:
    # 0.5/0.5 = 1, (0.25 + 1)/0.75 = 5/3, gap, (0.625 + 2)/0.875 = 3.
    smoothed = page.evaluate("GrueCharts.ema([1, 2, null, 4], 0.5)")
    assert smoothed[2] is None
    assert [round(v, 6) for v in (smoothed[0], smoothed[1], smoothed[3])] == [1.0, round(5 / 3, 6), 3.0]
