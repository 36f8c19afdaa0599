"""End to end with a REAL Celery worker process running a real (tiny) engine run.

launch → worker claims the run → metric rows in PostgreSQL → websocket messages → succeeded;
a crashing run → failed with traceback; cancel → cancelled; a SIGKILLed worker → lost.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from tests.conftest import session_cookie, status_of
from tests.helpers import tiny_run_config
from webapp.asgi import application
from webapp.runs import lifecycle, protocol, queries, services
from webapp.runs.models import Checkpoint, MetricPoint, Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def tiny(n_iters: int = 2, **over) -> dict:
    return tiny_run_config(n_iters, "worker-e2e", **over)


FINISHED = ("succeeded", "failed", "cancelled", "lost")


def _series_query_count(run_id: int, max_points: int) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        queries.metric_series_many(run_id, max_points=max_points)
    return len(ctx.captured_queries)


async def test_launch_runs_on_worker_streams_and_succeeds(celery_worker, researcher):
    cfg = tiny(2)
    cfg["train"]["save_final_model"] = True
    draft = await database_sync_to_async(services.create_run)(cfg, user=researcher)
    cookie = await database_sync_to_async(session_cookie)(researcher)
    comm = WebsocketCommunicator(
        application,
        f"/ws/runs/{draft.pk}/",
        headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"), (b"cookie", cookie.encode())],
    )
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {}})
    while (await comm.receive_json_from(timeout=10))["type"] != "caught_up":
        pass
    await database_sync_to_async(lifecycle.enqueue_run)(draft)

    seen: dict[str, list] = {"status": [], "metrics": [], "samples": [], "checkpoint": []}
    while True:
        msg = await comm.receive_json_from(timeout=240)
        # one recorder flush arrives as one "batch": its points, then its other messages in order
        inner = msg["messages"] if msg["type"] == "batch" else [msg]
        for m in inner:
            seen.setdefault(m["type"], []).append(m)
        if any(m["type"] == "status" and m["status"] in FINISHED for m in inner):
            break
    await comm.disconnect()
    run = await database_sync_to_async(Run.objects.get)(pk=draft.pk)
    assert run.status == RunStatus.SUCCEEDED, run.traceback
    statuses = [m["status"] for m in seen["status"]]
    assert statuses[0] in ("queued", "running") and "running" in statuses and statuses[-1] == "succeeded"
    assert run.worker_host == celery_worker.name and run.heartbeat_at is not None
    assert run.progress == 1.0 and run.current_iter == 2 and run.total_iters == 2

    streamed = [p for m in seen["metrics"] for p in protocol.message_points(m)]
    stored = await database_sync_to_async(
        lambda: list(
            MetricPoint.objects.filter(run_id=draft.pk).order_by("id").values_list("id", "key", "step")
        )
    )()
    # every stored point reached the browser exactly once, in order
    assert [(p["id"], p["key"], p["step"]) for p in streamed] == stored
    keys = {k for _i, k, _s in stored}
    assert {"train/reward_mean", "train/kl", "loss/policy"} <= keys
    assert {s for _i, k, s in stored if k == "train/reward_mean"} == {1, 2}
    assert seen["samples"] and seen["checkpoint"]
    assert run.summary.get("iterations") == 2
    assert "train/reward_mean" in run.last_metrics
    logs = await database_sync_to_async(lambda: list(run.logs.values_list("line", flat=True)))()
    assert logs[0].startswith("started on ") and "ppo on builtin:tiny-gpt2" in logs[0]
    assert sum(line.startswith(("step 1: reward=", "step 2: reward=")) for line in logs) == 2
    assert logs[-1] == "finished after 2 iterations"
    # the worker warmed the chart cache at the page's overview size: reading it touches no metric rows
    warm = await database_sync_to_async(_series_query_count)(run.pk, queries.OVERVIEW_POINTS)
    cold = await database_sync_to_async(_series_query_count)(run.pk, queries.OVERVIEW_POINTS + 1)
    assert warm < cold
    n_ckpt = await database_sync_to_async(run.checkpoints.count)()
    assert n_ckpt >= 1
    model = await database_sync_to_async(lambda: run.artifacts.get(kind="model"))()
    assert (Path(model.path) / "config.json").exists()


def test_crashing_run_is_failed_with_traceback(celery_worker, researcher, runs_dir, wait_for):
    missing = str(runs_dir / "no-such-model")  # allowed to launch (inside the roots), fails in the engine
    run = lifecycle.launch_run(tiny(2, model={"name_or_path": missing}), user=researcher)
    wait_for(lambda: status_of(run.pk) in ("failed", "succeeded"), timeout=120, what="run to fail")
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert missing in run.error
    assert "Traceback" in run.traceback and "engine" in run.traceback
    assert run.finished_at is not None


def _iterations_done(run_dir: str) -> int:
    """RL iterations the engine has finished, from the run directory it writes synchronously (the
    database lags behind by the recorder's batching)."""
    done = 0
    events = Path(run_dir) / "events.jsonl"
    if not events.exists():
        return 0
    for line in events.read_text().splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:  # the line being written right now
            continue
        if ev.get("event") == "progress" and ev.get("phase") == "rl":
            done = max(done, int(ev["iteration"]))
    return done


def test_cancel_stops_a_running_run_within_one_iteration(celery_worker, researcher, wait_for):
    """Once the cancel is committed the engine finishes at most the iteration it is in: the worker
    reads the flag at every ``should_stop`` (no heartbeat period to wait for)."""
    run = lifecycle.launch_run(tiny(10_000), user=researcher)
    wait_for(lambda: Run.objects.get(pk=run.pk).run_dir, timeout=180, what="the run directory")
    run_dir = Run.objects.get(pk=run.pk).run_dir
    wait_for(lambda: _iterations_done(run_dir) >= 2, timeout=180, what="two iterations")
    lifecycle.cancel_run(run)
    at_cancel = _iterations_done(run_dir)  # read after the commit: at least what was done at it
    wait_for(lambda: status_of(run.pk) != RunStatus.RUNNING, timeout=120, what="run to stop")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED, run.traceback
    final = _iterations_done(run_dir)
    assert at_cancel <= final <= at_cancel + 1
    assert run.summary["iterations"] == final and run.summary["stopped"] is True
    # the engine checkpoints where it stopped, so the page offers Resume
    assert lifecycle.can_resume(run) and lifecycle.actions(run)["resume"]


def test_a_task_delivered_twice_runs_once(celery_worker, researcher, wait_for):
    run = lifecycle.launch_run(tiny(2), user=researcher)
    lifecycle.publish(run.pk, run.task_id)  # the broker hands the same message out again
    wait_for(
        lambda: f"for run {run.pk} not claimed" in celery_worker.log(),
        timeout=240,
        what="the second delivery to be refused",
    )
    wait_for(lambda: status_of(run.pk) in ("succeeded", "failed"), timeout=240, what="run to finish")
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.traceback
    assert run.attempts == 1
    starts = [line for line in run.logs.values_list("line", flat=True) if line.startswith("started on ")]
    assert len(starts) == 1


def test_killed_worker_leaves_run_lost_and_it_resumes_from_its_checkpoint(
    worker_factory, researcher, settings, wait_for
):
    """A SIGKILLed worker (OOM, pulled plug) leaves its run running; the restarted worker marks it lost;
    a resume continues the same curves. The run is far too long to finish during the test, so every
    step below waits on a state transition, never on the clock."""
    worker = worker_factory()
    settings.CELERY_TASK_DEFAULT_QUEUE = worker.queue
    n_iters = 10_000
    run = lifecycle.launch_run(tiny(n_iters), user=researcher)
    wait_for(lambda: Checkpoint.objects.filter(run_id=run.pk).exists(), timeout=180, what="a checkpoint")
    worker.kill()
    assert status_of(run.pk) == RunStatus.RUNNING  # nobody could record anything: the process just vanished
    # the same worker comes back (e.g. systemd restart): it knows it is running nothing
    worker_factory(queue=worker.queue, name=worker.name)
    wait_for(lambda: status_of(run.pk) == RunStatus.LOST, timeout=60, what="run marked lost")
    run.refresh_from_db()
    assert worker.name in run.error and "heartbeat" in run.error and "resumed" in run.error
    lost_at = max(MetricPoint.objects.filter(run_id=run.pk).values_list("step", flat=True), default=0)
    assert lost_at < n_iters
    # resume in place from the last checkpoint: the curves continue, no step is stored twice
    lifecycle.resume_run(run)
    wait_for(
        lambda: MetricPoint.objects.filter(
            run_id=run.pk, key="train/reward_mean", step__gt=lost_at + 1
        ).exists(),
        timeout=240,
        what="the resumed run to pass the step where it was lost",
    )
    lifecycle.cancel_run(run)
    wait_for(lambda: status_of(run.pk) == RunStatus.CANCELLED, timeout=120, what="resumed run to stop")
    run.refresh_from_db()
    steps = list(
        MetricPoint.objects.filter(run_id=run.pk, key="train/reward_mean")
        .order_by("step")
        .values_list("step", flat=True)
    )
    assert steps == list(range(1, run.summary["iterations"] + 1))
    logs = " ".join(run.logs.values_list("line", flat=True))
    assert "resumed from" in logs
