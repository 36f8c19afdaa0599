"""Retrying a dead worker's jobs, in a real browser against the real worker (issue 28 §2): a gold job
and a checkpoint export left ``running`` with an old heartbeat show ``failed`` on the run page with
the reason (the worker stopped) and a retry button; retry asks first; accepted, the real worker scores
the step the dead one had not stored (and exports the checkpoint), and the rows list the earlier
attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.overopt_setup import (
    Dialogs,
    checkpoint_on_disk,
    finished_run,
    left_by_a_dead_worker,
    queued_gold_job,
)

pytestmark = [pytest.mark.e2e]


@pytest.mark.django_db(transaction=True)
def test_a_dead_workers_gold_job_and_export_are_shown_failed_and_retried_from_the_run_page(
    page: Any, live_server_with_worker: Any, researcher: Any, login: Any, runs_dir: Path
) -> None:
    from webapp.runs import gold_jobs, ingest
    from webapp.runs.models import Artifact, MetricPoint

    run = finished_run(researcher, "dead worker")
    job = queued_gold_job(run, "orphan")
    # What a worker that died after its first step leaves: step 0 stored, the job running, silence.
    ingest.ingest_metrics(run.pk, [("eval/gold:orphan", 0, 5.0)])
    first = {"step": 0, "mean": 5.0, "se": None, "n": 1}
    left_by_a_dead_worker(job, done=1, total=2, steps=[first])
    checkpoint_on_disk(run, runs_dir, 10)
    export = left_by_a_dead_worker(gold_jobs.start_export_job(run, 10, enqueue=False))

    base = live_server_with_worker.url
    login(page, base, researcher)
    page.goto(f"{base}/runs/{run.pk}/", timeout=120_000)
    row = page.locator("#gold-jobs tr[data-key='eval/gold:orphan']")
    expect(row.locator(".job-status")).to_have_text("failed")
    expect(row.locator(".job-error")).to_contain_text(
        "Worker stopped: the worker gone@host stopped sending heartbeats"
    )
    expect(row.locator("button.gold-cancel")).to_have_count(0)

    dialogs = Dialogs(page)
    dialogs.answer_next(False)
    row.locator("button.gold-retry").click()
    expect(row.locator(".job-status")).to_have_text("failed")
    assert "Retry the gold “orphan”?" in dialogs.messages[0]
    assert Artifact.objects.get(pk=job.pk).meta["status"] == "failed"

    dialogs.answer_next(True)
    row.locator("button.gold-retry").click(no_wait_after=True)
    expect(
        page.get_by_text("Gold 'orphan' queued again (attempt 2); steps already scored, kept: 1.")
    ).to_be_visible(timeout=60_000)
    # the page follows the job to its end, then shows it succeeded with the earlier attempt listed
    expect(row.locator(".job-status")).to_have_text("succeeded", timeout=180_000)
    expect(row.locator(".job-progress")).to_have_text("2 / 2")
    expect(row.locator(".gold-attempts")).to_contain_text(
        "earlier attempt: failed after 1 step — Worker stopped"
    )
    expect(row.locator("button.gold-retry")).to_have_count(0)
    points = dict(MetricPoint.objects.filter(run=run, key="eval/gold:orphan").values_list("step", "value"))
    assert points[0] == 5.0 and set(points) == {0, 10}  # step 0 kept as the dead worker stored it

    # The checkpoint's export died with its worker too: its row says so and offers retry. On a fresh
    # page: the poll that wrote "succeeded" above also reloads the page (gold_jobs.js, with the new gold
    # selected), and a click while that reload is under way can land on the page being replaced.
    page.goto(f"{base}/runs/{run.pk}/", timeout=120_000)
    cell = page.locator("#overopt-checkpoints tr[data-step='10'] td.export")
    expect(cell.locator(".ckpt-export-error")).to_contain_text(
        "export failed: Worker stopped: the worker gone@host stopped sending heartbeats"
    )
    expect(cell.locator("button.ckpt-export")).to_have_count(0)
    dialogs.answer_next(True)
    cell.locator("button.ckpt-retry").click(no_wait_after=True)
    expect(
        page.get_by_text("Export of checkpoint rl-000010 (step 10) queued again (attempt 2).")
    ).to_be_visible(timeout=60_000)
    assert "Retry the export of “rl-000010”?" in dialogs.messages[-1]
    expect(cell.locator("a.ckpt-download")).to_be_visible(timeout=180_000)
    expect(cell.locator(".ckpt-attempts")).to_contain_text("earlier attempt: failed — Worker stopped")
    export.refresh_from_db()
    assert export.meta["status"] == "succeeded" and len(export.meta["attempts"]) == 1
