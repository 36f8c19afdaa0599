"""End to end with a REAL Celery worker process running a real (tiny) engine run.

launch → worker claims the run → metric rows in PostgreSQL → websocket messages → succeeded;
a crashing run → failed with traceback; cancel → cancelled; a SIGKILLed worker → lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from webapp.asgi import application
from webapp.runs import lifecycle, queries, services
from webapp.runs.models import Checkpoint, MetricPoint, Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def tiny(n_iters: int = 2, **over) -> dict:
    cfg = {
        "name": "worker-e2e",
        "model": {"name_or_path": "builtin:tiny-gpt2", "device": "cpu"},
        "task": {"id": "synthetic_increasing_numbers", "max_train_samples": 8, "max_eval_samples": 2},
        "reward": {"id": "increasing_numbers"},
        "rollout": {"max_new_tokens": 4, "batch_size": 2},
        "algorithm": {"id": "ppo", "n_epochs": 1, "minibatch_size": 2},
        "train": {
            "n_iters": n_iters,
            "prompts_per_iter": 2,
            "eval_every": 0,
            "save_every": 1,
            "log_samples": 2,
            "save_final_model": False,
        },
        "eval": {"generation": {"max_new_tokens": 4, "do_sample": False}},
    }
    cfg.update(over)
    return cfg


def status_of(run_id: int) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run_id)


def _cookie(user) -> str:
    from django.conf import settings
    from django.test import Client

    c = Client()
    c.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={c.cookies[settings.SESSION_COOKIE_NAME].value}"


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
    cookie = await database_sync_to_async(_cookie)(researcher)
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
        seen.setdefault(msg["type"], []).append(msg)
        if msg["type"] == "status" and msg["status"] in ("succeeded", "failed", "cancelled", "lost"):
            break
    await comm.disconnect()
    run = await database_sync_to_async(Run.objects.get)(pk=draft.pk)
    assert run.status == RunStatus.SUCCEEDED, run.traceback
    statuses = [m["status"] for m in seen["status"]]
    assert statuses[0] in ("queued", "running") and "running" in statuses and statuses[-1] == "succeeded"
    assert run.worker_host == celery_worker.name and run.heartbeat_at is not None
    assert run.progress == 1.0 and run.current_iter == 2 and run.total_iters == 2

    streamed = [p for m in seen["metrics"] for p in m["points"]]
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


def test_cancel_stops_a_running_run(celery_worker, researcher, wait_for):
    run = lifecycle.launch_run(tiny(500), user=researcher)
    wait_for(lambda: MetricPoint.objects.filter(run_id=run.pk).exists(), timeout=180, what="first metrics")
    lifecycle.cancel_run(run)
    wait_for(lambda: status_of(run.pk) != RunStatus.RUNNING, timeout=120, what="run to stop")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.current_iter < 500


def test_killed_worker_leaves_run_lost_and_it_resumes_from_its_checkpoint(
    worker_factory, researcher, settings, wait_for
):
    worker = worker_factory()
    settings.CELERY_TASK_DEFAULT_QUEUE = worker.queue
    run = lifecycle.launch_run(tiny(12), user=researcher)
    wait_for(lambda: Checkpoint.objects.filter(run_id=run.pk).exists(), timeout=180, what="a checkpoint")
    worker.kill()
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # nobody could record anything: the process just vanished
    assert run.current_iter < 12
    # the same worker comes back (e.g. systemd restart): it knows it is running nothing
    worker_factory(queue=worker.queue, name=worker.name)
    wait_for(lambda: status_of(run.pk) == RunStatus.LOST, timeout=60, what="run marked lost")
    run.refresh_from_db()
    assert worker.name in run.error and "heartbeat" in run.error and "resumed" in run.error
    # resume in place from the last checkpoint: the curves continue, no step is stored twice
    lifecycle.resume_run(run)
    wait_for(lambda: status_of(run.pk) in ("succeeded", "failed"), timeout=240, what="resumed run to finish")
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.traceback
    assert run.current_iter == 12
    steps = list(
        MetricPoint.objects.filter(run_id=run.pk, key="train/reward_mean")
        .order_by("step")
        .values_list("step", flat=True)
    )
    assert steps == list(range(1, 13))
    logs = " ".join(run.logs.values_list("line", flat=True))
    assert "resumed from" in logs
