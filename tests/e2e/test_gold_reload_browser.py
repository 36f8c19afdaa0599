"""The run page reloads itself when a gold job ends (gold_jobs.js), but not under the researcher's
hand: with the mouse button held down the reload waits (the panel says ``data-reload="deferred"``),
and it happens once the button is released and the page has been quiet for a second."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.overopt_setup import finished_run, queued_gold_job

pytestmark = [pytest.mark.e2e]


@pytest.mark.django_db(transaction=True)
def test_a_job_ending_under_a_pressed_mouse_button_waits_to_reload(
    page: Any, live_server_with_worker: Any, researcher: Any, login: Any
) -> None:
    from webapp.runs.models import Artifact

    run = finished_run(researcher, "reload waits")
    job = queued_gold_job(run, "waiting")  # queued, sent to no worker: the page polls it
    base = live_server_with_worker.url
    login(page, base, researcher)
    page.goto(f"{base}/runs/{run.pk}/", timeout=120_000)
    page.wait_for_selector("#gold-jobs tr[data-key='eval/gold:waiting'] .job-status:text('queued')")
    page.evaluate("window.__samePage = true")  # gone once the page is reloaded

    page.mouse.move(5, 5)
    page.mouse.down()
    Artifact.objects.filter(pk=job.pk).update(meta={**job.meta, "status": "cancelled"})
    # the poll saw the job end (its row says so) and deferred the reload
    page.wait_for_function(
        "document.getElementById('overopt-panel').dataset.reload === 'deferred'", timeout=30_000
    )
    assert page.evaluate("window.__samePage === true")
    page.mouse.up()
    page.wait_for_function("window.__samePage === undefined", timeout=30_000)
    # the reloaded page shows the ended job with its retry button
    page.wait_for_selector("#gold-jobs tr[data-key='eval/gold:waiting'] .job-status:text('cancelled')")
