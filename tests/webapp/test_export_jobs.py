"""Jobs of the over-optimisation watch whose worker failed or died (issue 28 §2): a checkpoint export
that failed is retried on its row by the real worker, its earlier attempt kept; a dead worker's
export (no heartbeat) ends failed like a gold job and is retried; and the run watchdog process and
the cron command fail a dead worker's gold and export jobs without anyone opening the run page."""

from __future__ import annotations

import io
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from tests.conftest import start_watchdog, wait_for_condition
from tests.webapp.test_gold_jobs import RUBRIC_ARGS, _run_with_evaluations, _write_checkpoint


def _text(response: Any) -> str:
    return response.content.decode().replace("&#x27;", "'")


def _dead_workers_job(job: Any, worker: str = "gone@host", age_s: float = 3600.0) -> Any:
    """What a worker that died holding ``job`` leaves: claimed (``running``) by ``worker``, its last
    heartbeat ``age_s`` seconds old."""
    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact

    assert gold_jobs._claim(job.pk, job.meta["task_id"]) is not None
    job.refresh_from_db()
    beat = (timezone.now() - timedelta(seconds=age_s)).isoformat()
    Artifact.objects.filter(pk=job.pk).update(meta={**job.meta, "worker": worker, "heartbeat": beat})
    job.refresh_from_db()
    return job


def _wait_for_export(job: Any, worker: Any, want: str) -> None:
    def ended() -> bool:
        job.refresh_from_db()
        assert job.meta["status"] in ("queued", "running", want), job.meta["error"] + worker.log()[-3000:]
        return job.meta["status"] == want

    wait_for_condition(ended, timeout=180, interval=0.2, what=f"the export to end {want}")


@pytest.mark.django_db(transaction=True)
def test_a_failed_export_is_retried_on_its_row_and_other_states_are_refused(
    researcher_client: Any, celery_worker: Any, runs_dir: Path
) -> None:
    """The real worker fails to export a checkpoint whose state.pt is unreadable; the row says why
    and offers retry (no second export button). Once the checkpoint is whole, retry queues the same
    row again (the failed attempt kept and listed) and the worker exports it; a succeeded export,
    a step without an export and a GET are refused, naming what."""
    from webapp.runs.models import Artifact

    run = _run_with_evaluations(runs_dir, name="export retried")  # rl-000010's state.pt is empty
    assert researcher_client.post(f"/runs/{run.pk}/checkpoints/10/export/").status_code == 302
    job = Artifact.objects.get(run=run, kind="checkpoint-export")
    _wait_for_export(job, celery_worker, "failed")
    first_task, error = job.meta["task_id"], job.meta["error"]
    assert error

    url = f"/runs/{run.pk}/checkpoints/10/export/retry/"
    page = _text(researcher_client.get(f"/runs/{run.pk}/"))
    assert f'action="{url}" class="inline ckpt-retry-form" data-job-name="rl-000010"' in page
    assert f'action="/runs/{run.pk}/checkpoints/10/export/"' not in page  # retry, not a new export
    assert f'action="/runs/{run.pk}/checkpoints/20/export/"' in page  # the other step: export
    assert researcher_client.get(url).status_code == 405  # a state change is a POST

    _write_checkpoint(runs_dir / f"run-{run.pk}/checkpoints/rl-000010", marker=0.25)
    text = _text(researcher_client.post(url, follow=True))
    assert "Export of checkpoint rl-000010 (step 10) queued again (attempt 2)." in text
    job.refresh_from_db()
    assert job.meta["status"] in ("queued", "running", "succeeded") and job.meta["task_id"] != first_task
    _wait_for_export(job, celery_worker, "succeeded")
    assert Artifact.objects.filter(run=run, kind="checkpoint-export").count() == 1  # the same row
    assert [(a["status"], a["error"]) for a in job.meta["attempts"]] == [("failed", error)]
    page = _text(researcher_client.get(f"/runs/{run.pk}/"))
    assert f"/runs/{run.pk}/checkpoints/10/model.tar.gz" in page
    assert "earlier attempt: failed — " in page and 'class="inline ckpt-retry-form"' not in page

    text = _text(researcher_client.post(url, follow=True))
    assert (
        "Not retried: job: the export of checkpoint rl-000010 (step 10) is succeeded; only a failed "
        "or cancelled job can be retried" in text
    )
    text = _text(researcher_client.post(f"/runs/{run.pk}/checkpoints/20/export/retry/", follow=True))
    assert f"Not retried: step: run #{run.pk} has no export of the checkpoint at step 20 to retry" in text
    job.refresh_from_db()
    assert job.meta["status"] == "succeeded" and len(job.meta["attempts"]) == 1


@pytest.mark.django_db(transaction=True)
def test_a_dead_workers_export_fails_and_exporting_again_keeps_the_attempt(
    researcher_client: Any, celery_worker: Any, runs_dir: Path
) -> None:
    """An export claimed by a worker that stopped heartbeating stays ``running`` while its heartbeat
    is fresh, then ends failed saying the worker stopped (on jobs.json as on the page); one claimed by
    a restarted worker fails at once. The row's retry (or its checkpoint exported again) re-queues the
    same row and the real worker exports it; a pruned checkpoint is refused by name."""
    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact

    run = _run_with_evaluations(runs_dir, name="export orphaned")
    _write_checkpoint(runs_dir / f"run-{run.pk}/checkpoints/rl-000010", marker=0.5)
    dead = _dead_workers_job(gold_jobs.start_export_job(run, 10, enqueue=False), age_s=5)
    restarted = _dead_workers_job(
        gold_jobs.start_export_job(run, 20, enqueue=False), worker="w1@host", age_s=0
    )
    assert gold_jobs.fail_stale_jobs(older_than=60) == []  # both heartbeats are fresh enough
    assert gold_jobs.fail_stale_jobs(worker_host="w1@host") == [restarted.pk]
    assert gold_jobs.fail_stale_jobs(older_than=1, run_ids=[run.pk + 1]) == []  # another run
    jobs = {j["id"]: j for j in researcher_client.get(f"/runs/{run.pk}/gold/jobs.json").json()["jobs"]}
    assert jobs[dead.pk]["status"] == "running"  # GRUE_LOST_AFTER (60 s) has not passed
    assert gold_jobs.fail_stale_jobs(older_than=1, run_ids=[run.pk]) == [dead.pk]
    dead.refresh_from_db()
    assert dead.meta["status"] == "failed" and dead.meta["finished"]
    assert dead.meta["error"] == (
        f"Worker stopped: the worker gone@host stopped sending heartbeats (last: {dead.meta['heartbeat']}). "
        "Nothing was exported (the directory is written whole or not at all); retry the export."
    )
    restarted.refresh_from_db()
    assert restarted.meta["error"].startswith(
        "Worker stopped: the worker w1@host restarted while it held this job."
    )
    page = _text(researcher_client.get(f"/runs/{run.pk}/"))
    assert "export failed: Worker stopped: the worker gone@host stopped sending heartbeats" in page

    # Exporting the checkpoint again is its retry: the same row, the dead attempt kept.
    assert researcher_client.post(f"/runs/{run.pk}/checkpoints/10/export/").status_code == 302
    _wait_for_export(dead, celery_worker, "succeeded")
    assert dead.meta["worker"] == celery_worker.name
    assert dead.meta["attempts"][0]["status"] == "failed"
    assert dead.meta["attempts"][0]["error"].startswith("Worker stopped: the worker gone@host")
    assert (Path(dead.path) / "config.json").is_file()
    assert Artifact.objects.filter(run=run, kind="checkpoint-export").count() == 2

    os.remove(runs_dir / f"run-{run.pk}/checkpoints/rl-000020/state.pt")  # pruned meanwhile
    with pytest.raises(
        gold_jobs.GoldJobError, match="checkpoint rl-000020 .step 20. .* is no longer on disk"
    ):
        gold_jobs.retry_export_job(run, 20, enqueue=False)
    restarted.refresh_from_db()
    assert restarted.meta["status"] == "failed" and "attempts" not in restarted.meta


@pytest.mark.django_db(transaction=True)
def test_the_watchdog_and_the_cron_command_fail_a_dead_workers_jobs(
    runs_dir: Path, test_db_name: str
) -> None:
    """Nobody opens the run page: the run watchdog process (``manage.py watch_runs``, what ``up`` and
    the deployments start) fails a gold job and an export whose worker stopped heartbeating, and
    keeps a job whose worker still beats; ``manage.py mark_lost_runs`` (cron) does the same."""
    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact

    run = _run_with_evaluations(runs_dir, name="nobody looks")
    jobs = {}
    for label in ("orphan", "alive", "for-cron"):
        spec, _ = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, label)
        jobs[label] = gold_jobs.start_gold_job(run, spec, label, enqueue=False)
    orphan = _dead_workers_job(jobs["orphan"])
    alive = _dead_workers_job(jobs["alive"], worker="alive@host", age_s=0)
    export = _dead_workers_job(gold_jobs.start_export_job(run, 10, enqueue=False))

    def status(job: Any) -> str:
        return Artifact.objects.get(pk=job.pk).meta["status"]

    log_path = runs_dir / f"watchdog-jobs-{run.pk}.log"
    proc = start_watchdog(test_db_name, runs_dir, log_path, GRUE_LOST_AFTER="600", GRUE_WATCH_INTERVAL="0.5")
    try:
        wait_for_condition(
            lambda: status(orphan) == status(export) == "failed",
            timeout=120,
            interval=0.2,
            what="the watchdog to fail the dead worker's jobs",
        )
        wait_for_condition(
            lambda: "failed jobs of stopped workers" in log_path.read_text(), timeout=30, what="its report"
        )
        assert str(sorted([orphan.pk, export.pk])) in log_path.read_text()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)
    assert status(alive) == "running"
    assert (
        Artifact.objects.get(pk=orphan.pk)
        .meta["error"]
        .startswith("Worker stopped: the worker gone@host stopped sending heartbeats")
    )

    late = _dead_workers_job(jobs["for-cron"], age_s=7200)
    out = io.StringIO()
    call_command("mark_lost_runs", "--older-than", "3600", stdout=out)
    assert out.getvalue().splitlines() == ["no lost runs", f"failed jobs of stopped workers: [{late.pk}]"]
    assert status(late) == "failed" and status(alive) == "running"
