"""Retrying a gold job whose worker died, in a real browser against the real worker (issue 28 §2): a
job left ``running`` with an old heartbeat shows ``failed`` on the run page with the reason (the
worker stopped) and a retry button; retry asks first; accepted, the real worker scores the step the
dead one had not stored, and the row lists the earlier attempt."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.test_overopt_checkpoints_browser import RUBRIC_YAML

pytestmark = [pytest.mark.e2e]


@pytest.mark.django_db(transaction=True)
def test_a_dead_workers_gold_job_is_shown_failed_and_retried_from_the_run_page(
    page: Any, live_server_with_worker: Any, researcher: Any, login: Any
) -> None:
    from django.utils import timezone

    from webapp.runs import gold_jobs, ingest, services
    from webapp.runs.models import Artifact, MetricPoint, Run, Sample

    run = services.create_run({"name": "dead worker"}, user=researcher)
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    for step in (0, 10):
        Sample.objects.create(
            run=run, step=step, split="validation", sample_id="0", prompt="p", generation="1"
        )
    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_YAML, "orphan")
    job = gold_jobs.start_gold_job(run, spec, label, enqueue=False)
    assert gold_jobs._claim(job.pk, job.meta["task_id"]) is not None
    # What a worker that died after its first step leaves: step 0 stored, the job running, silence.
    ingest.ingest_metrics(run.pk, [("eval/gold:orphan", 0, 5.0)])
    first = {"step": 0, "mean": 5.0, "se": None, "n": 1}
    old = (timezone.now() - timedelta(minutes=10)).isoformat()
    job.refresh_from_db()
    Artifact.objects.filter(pk=job.pk).update(
        meta={**job.meta, "done": 1, "total": 2, "steps": [first], "heartbeat": old, "worker": "gone@host"}
    )

    base = live_server_with_worker.url
    login(page, base, researcher)
    page.goto(f"{base}/runs/{run.pk}/", timeout=120_000)
    row = page.locator("#gold-jobs tr[data-key='eval/gold:orphan']")
    expect(row.locator(".job-status")).to_have_text("failed")
    expect(row.locator(".job-error")).to_contain_text(
        "Worker stopped: the worker gone@host stopped sending heartbeats"
    )
    expect(row.locator("button.gold-cancel")).to_have_count(0)

    dialogs: list[str] = []

    def answer(accept: bool) -> Any:
        def handler(dialog: Any) -> None:
            dialogs.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        return handler

    page.once("dialog", answer(False))
    row.locator("button.gold-retry").click()
    expect(row.locator(".job-status")).to_have_text("failed")
    assert "Retry the gold “orphan”?" in dialogs[0]
    assert Artifact.objects.get(pk=job.pk).meta["status"] == "failed"

    page.once("dialog", answer(True))
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
