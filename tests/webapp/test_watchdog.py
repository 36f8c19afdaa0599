"""The run watchdog (``manage.py watch_runs``) with real workers: a run whose worker was SIGKILLed is
marked lost while the only other worker is busy training (detection needs no free training slot),
then resumed automatically from its checkpoint once a worker is back, with the attempt counted;
the retry limit and the off switch hold."""

from __future__ import annotations

import os
import time

import pytest

from tests.conftest import start_watchdog, status_of
from tests.helpers import tiny_run_config
from webapp import watchdog
from webapp.runs import lifecycle
from webapp.runs.ingest import add_checkpoint
from webapp.runs.models import Checkpoint, MetricPoint, Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)

# The loss window is far from any pause a loaded machine gives a live worker's 0.5 s heartbeats (40
# missed beats in a row), so "the busy run stays running" tests the watchdog, not the scheduler: with
# 3 s, a busy 2-core machine could starve the busy worker's heartbeat thread long enough (issue 31.9).
LOST_AFTER = 20.0
INTERVAL = 0.5


def tiny(n_iters: int) -> dict:
    return tiny_run_config(n_iters, "watchdog")


def test_lost_run_is_detected_behind_a_busy_worker_and_resumed_automatically(
    worker_factory, researcher, settings, test_db_name, runs_dir, wait_for
):
    busy = worker_factory()
    victim = worker_factory()
    settings.CELERY_TASK_DEFAULT_QUEUE = busy.queue
    long_run = lifecycle.launch_run(tiny(100000), user=researcher)
    wait_for(lambda: status_of(long_run.pk) == RunStatus.RUNNING, timeout=120, what="busy worker training")
    settings.CELERY_TASK_DEFAULT_QUEUE = victim.queue
    run = lifecycle.launch_run(tiny(8), user=researcher)
    wait_for(lambda: Checkpoint.objects.filter(run_id=run.pk).exists(), timeout=180, what="a checkpoint")
    victim.kill()
    killed_at = time.monotonic()

    log_path = runs_dir / f"watchdog-{run.pk}.log"
    proc = start_watchdog(
        test_db_name,
        runs_dir,
        log_path,
        GRUE_LOST_AFTER=str(LOST_AFTER),
        GRUE_WATCH_INTERVAL=str(INTERVAL),
        CELERY_QUEUE=victim.queue,  # the resumed run goes back to the queue it came from
    )
    try:
        # Lost within GRUE_LOST_AFTER + interval (+ generous slack on a loaded machine), not minutes.
        wait_for(
            lambda: Run.objects.get(pk=run.pk).auto_resumes == 1,
            timeout=LOST_AFTER + INTERVAL + 30,
            interval=0.1,
            what="lost and resumed by the watchdog",
        )
        detected_after = time.monotonic() - killed_at
        assert status_of(long_run.pk) == RunStatus.RUNNING  # the only live worker was busy all along
        assert status_of(run.pk) == RunStatus.QUEUED  # waits in the broker for a worker
        wait_for(
            lambda: "resumed from checkpoint" in log_path.read_text(), timeout=30, what="watchdog report"
        )
        assert f"marked lost: [{run.pk}]" in log_path.read_text()

        worker_factory(queue=victim.queue)  # a worker is back: it picks the run up
        wait_for(
            lambda: status_of(run.pk) in ("succeeded", "failed"), timeout=300, what="resumed run finishes"
        )
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, run.traceback
        assert run.auto_resumes == 1 and run.current_iter == 8
        steps = list(
            MetricPoint.objects.filter(run_id=run.pk, key="train/reward_mean")
            .order_by("step")
            .values_list("step", flat=True)
        )
        assert steps == list(range(1, 9))  # continued from the checkpoint, nothing stored twice
        logs = " ".join(run.logs.values_list("line", flat=True))
        assert "resumed automatically from the last checkpoint (attempt 1 of" in logs
        print(f"lost-run detection + resume after kill: {detected_after:.1f} s")
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        lifecycle.cancel_run(Run.objects.get(pk=long_run.pk))
        wait_for(lambda: status_of(long_run.pk) != RunStatus.RUNNING, timeout=120, what="busy run cancelled")


def _lost_run_with_checkpoint(user, auto_resumes: int) -> Run:
    run = Run.objects.create(name="lost", config=tiny(2), created_by=user, status=RunStatus.LOST)
    run_dir = f"/nonexistent/lost-{run.pk}"
    Run.objects.filter(pk=run.pk).update(run_dir=run_dir)
    add_checkpoint(run.pk, 1, f"{run_dir}/checkpoints/rl-000001")
    Run.objects.filter(pk=run.pk).update(auto_resumes=auto_resumes)
    return run


def test_auto_resume_respects_the_limit_and_the_switch(researcher, settings):
    settings.CELERY_TASK_DEFAULT_QUEUE = "watchdog-test-nobody-listens"
    settings.GRUE_AUTO_RESUME_LIMIT = 2
    spent = _lost_run_with_checkpoint(researcher, auto_resumes=2)
    fresh = _lost_run_with_checkpoint(researcher, auto_resumes=0)
    assert watchdog.sweep(auto_resume=False).resumed == []
    assert status_of(fresh.pk) == RunStatus.LOST
    res = watchdog.sweep()
    assert fresh.pk in res.resumed and spent.pk not in res.resumed
    assert status_of(spent.pk) == RunStatus.LOST and status_of(fresh.pk) == RunStatus.QUEUED
    assert Run.objects.get(pk=fresh.pk).auto_resumes == 1


def test_a_broker_outage_leaves_the_run_lost_for_the_next_sweep(researcher, settings, monkeypatch):
    """The launch path keeps a run it could not send as a draft for someone to retry; the watchdog has
    nobody to retry it, so the run must stay lost, as it was, with its attempt not spent."""
    from webapp.celery import app

    settings.CELERY_TASK_DEFAULT_QUEUE = "watchdog-test-nobody-listens"
    settings.GRUE_AUTO_RESUME_LIMIT = 2
    run = _lost_run_with_checkpoint(researcher, auto_resumes=0)
    Run.objects.filter(pk=run.pk).update(error="worker lost: no heartbeat for 300 s", attempts=1)
    before = Run.objects.get(pk=run.pk)

    monkeypatch.setattr(app.conf, "broker_url", "redis://127.0.0.1:1/0")  # nothing listens on port 1
    assert watchdog.sweep().resumed == []
    after = Run.objects.get(pk=run.pk)
    assert after.status == RunStatus.LOST
    assert (after.error, after.auto_resumes, after.attempts, after.task_id, after.resume_from) == (
        before.error,
        0,
        1,
        before.task_id,
        before.resume_from,
    )
    lines = list(after.logs.order_by("pk").values_list("line", flat=True))
    assert "automatic resume postponed" in lines[-1] and "127.0.0.1:1" in lines[-1], lines
    assert not any("resumed automatically" in line for line in lines), lines  # it was not
    # the next sweeps of the same outage try again and leave it as it is, without a line each
    assert watchdog.sweep().resumed == [] and watchdog.sweep().resumed == []
    assert Run.objects.get(pk=run.pk).status == RunStatus.LOST
    assert [line for line in after.logs.values_list("line", flat=True) if "postponed" in line] == lines[-1:]

    monkeypatch.undo()  # the broker is back: the next sweep resumes it, as the first attempt
    assert watchdog.sweep().resumed == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.auto_resumes == 1 and run.resume_from
    assert "(attempt 1 of 2)" in run.logs.order_by("pk").last().line
