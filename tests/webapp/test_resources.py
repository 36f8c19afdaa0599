"""Resource-aware workers with REAL Celery worker processes: a run is routed to a queue that can
serve its ``resources.devices``, and a run with ``resources.processes: 2`` is launched by the worker
through torchrun, streams into the database from rank 0 and is cancelled as a whole process group.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import torch
from django.urls import reverse

from tests.conftest import status_of
from tests.helpers import tiny_run_config
from webapp.celery import app as celery_app
from webapp.runs import launcher, lifecycle, services, workers
from webapp.runs.models import MetricPoint, Run, RunLog, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_runs_go_to_a_worker_that_can_serve_their_devices(worker_factory, researcher, settings, wait_for):
    queue = f"res-{uuid.uuid4().hex[:8]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    # A CPU worker on the run queue; a "GPU" worker (GRUE_WORKER_DEVICES=cuda: detection overridden,
    # this machine has no GPU) that consumes only the GPU queue it adds itself at start.
    env = {"CELERY_QUEUE": queue}
    cpu = worker_factory(queue=queue, extra_env={**env, "GRUE_WORKER_DEVICES": "cpu"})
    gpu = worker_factory(
        queue=f"{queue}-idle", extra_env={**env, "GRUE_WORKER_DEVICES": "cuda", "GRUE_WORKER_GPUS": "2"}
    )
    assert workers.run_queue({"resources": {"devices": "cuda"}}) == f"{queue}-gpu"

    seen = wait_for(
        lambda: (
            (found := {w["name"]: w for w in workers.describe(celery_app, timeout=5)})
            and {cpu.name, gpu.name} <= set(found)
            and found
        ),
        timeout=60,
        what="both workers answering inspect",
    )
    assert seen[cpu.name]["devices"] == ["cpu"] and seen[gpu.name]["devices"] == ["cuda"]
    assert seen[cpu.name]["free"] == 1  # --concurrency=1, idle
    # Slots of a GPU worker are counted in GPUs (GRUE_WORKER_GPUS overrides the detected 0).
    assert (seen[gpu.name]["gpus"], seen[gpu.name]["free_gpus"]) == (2, 2)
    assert seen[cpu.name]["gpus"] == 0
    gpu_config = tiny_run_config(2, "gpu-run", resources={"devices": "cuda"})
    live = list(seen.values())
    assert [w["name"] for w in workers.can_serve(live, gpu_config)] == [gpu.name]
    two_gpus = {"resources": {"devices": "cuda", "processes": 2, "gpus_per_process": 1}}
    assert workers.gpus_needed(two_gpus) == 2
    assert [w["name"] for w in workers.can_serve(live, two_gpus)] == [gpu.name]
    assert workers.unservable_reason(live, two_gpus) is None
    three_gpus = {"resources": {"devices": "cuda", "processes": 3, "gpus_per_process": 1}}
    assert workers.can_serve(live, three_gpus) == []
    reason = workers.unservable_reason(live, three_gpus)
    assert "needs 3 GPUs" in reason and "has 2" in reason and "wait in its queue" in reason

    cpu_run = lifecycle.launch_run(tiny_run_config(2, "cpu-run"), user=researcher)
    gpu_run = lifecycle.launch_run(gpu_config, user=researcher)  # trains on the CPU here (model.device)
    for run in (cpu_run, gpu_run):
        wait_for(lambda run=run: status_of(run.pk) == RunStatus.SUCCEEDED, timeout=300, what="run to succeed")
    assert Run.objects.get(pk=cpu_run.pk).worker_host == cpu.name
    assert Run.objects.get(pk=gpu_run.pk).worker_host == gpu.name


def test_two_process_run_streams_from_rank_0_and_cancel_kills_the_group(
    worker_factory, researcher, settings, wait_for
):
    worker = worker_factory(extra_env={"GRUE_CANCEL_GRACE_S": "60"})
    settings.CELERY_TASK_DEFAULT_QUEUE = worker.queue
    run = lifecycle.launch_run(
        tiny_run_config(10_000, "two-procs", resources={"processes": 2}), user=researcher
    )
    run_dir = Path(
        wait_for(lambda: Run.objects.get(pk=run.pk).run_dir, timeout=180, what="the run directory")
    )
    ranks = wait_for(lambda: json.loads((run_dir / "ranks.json").read_text()), timeout=300, what="ranks.json")
    pids = [r["pid"] for r in ranks["ranks"]]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    # Rank 0's recorder stores metrics and the "where it runs" line in the database.
    wait_for(
        lambda: MetricPoint.objects.filter(run_id=run.pk, key="train/reward_mean", step__gte=2).exists(),
        timeout=300,
        what="metrics of iteration 2 in the database",
    )
    assert RunLog.objects.filter(run_id=run.pk, line__contains="distributed: 2 processes (gloo)").exists()
    assert status_of(run.pk) == RunStatus.RUNNING

    lifecycle.cancel_run(run)
    wait_for(lambda: status_of(run.pk) == RunStatus.CANCELLED, timeout=300, what="run cancelled")
    wait_for(lambda: not any(_alive(p) for p in pids), timeout=60, what="every rank gone")
    assert (run_dir / "checkpoints" / "latest.json").exists()  # stopped at a step, with a checkpoint


def test_workers_panel_and_where_a_run_runs(celery_worker, client, researcher):
    assert client.get(reverse("runs:workers")).status_code == 302  # login first
    client.force_login(researcher)
    page = client.get(reverse("runs:launch")).content.decode()
    assert 'id="workers-card"' in page and reverse("runs:workers") in page
    found = client.get(reverse("runs:workers")).json()["workers"]
    mine = [w for w in found if w["name"] == celery_worker.name]
    assert mine and mine[0]["devices"] == ["cpu"] and mine[0]["slots"] == 1
    run = services.create_run(tiny_run_config(2, "where", resources={"processes": 2}), user=researcher)
    assert "2 processes · cpu" in client.get(reverse("runs:detail", args=[run.pk])).content.decode()


def test_worker_gpu_count_override(monkeypatch):
    monkeypatch.setenv("GRUE_WORKER_GPUS", "4")
    assert workers.worker_gpus("cuda") == 4
    monkeypatch.setenv("GRUE_WORKER_GPUS", "two")
    with pytest.raises(ValueError, match="GRUE_WORKER_GPUS='two'"):
        workers.worker_gpus("cuda")
    monkeypatch.delenv("GRUE_WORKER_GPUS")
    assert workers.worker_gpus("cpu") == 0
    assert workers.worker_gpus("cuda") == torch.cuda.device_count()  # detected: 0 on a CPU machine
    assert workers.unservable_reason([], {"resources": {"devices": "cuda"}}).startswith("no worker answered")


def test_a_worker_with_too_few_gpus_refuses_the_launch(monkeypatch, tmp_path):
    """Checked before torchrun starts: nothing is launched, the message has both numbers."""
    monkeypatch.setenv("GRUE_WORKER_GPUS", "2")
    config = tiny_run_config(
        2, "too-big", resources={"devices": "cuda", "processes": 3, "gpus_per_process": 1}
    )
    config["train"]["output_dir"] = str(tmp_path / "run")
    with pytest.raises(launcher.LaunchFailed, match=r"needs 3 GPUs .* this worker has 2"):
        launcher.run_distributed(1, config, None, lambda: False, grace_s=1)
    assert not (tmp_path / "run" / launcher.LOG_FILE).exists()  # torchrun never started


def test_a_queued_run_no_worker_can_take_says_why_on_its_page(celery_worker, client, researcher):
    """The launch form warns before queueing; a run that is already queued (API, sweep, YAML view,
    or its fitting worker left) gets the same reason on its page: a CUDA run with only CPU workers."""
    client.force_login(researcher)
    gpu = services.create_run(tiny_run_config(2, "gpu", resources={"devices": "cuda"}), user=researcher)
    cpu = services.create_run(tiny_run_config(2, "cpu"), user=researcher)
    Run.objects.filter(pk__in=[gpu.pk, cpu.pk]).update(status=RunStatus.QUEUED)
    page = client.get(reverse("runs:detail", args=[gpu.pk])).content.decode()
    assert 'id="placement-note" hidden' in page and reverse("runs:placement", args=[gpu.pk]) in page
    reason = client.get(reverse("runs:placement", args=[gpu.pk])).json()["reason"]
    assert reason.startswith("no live worker serves cuda runs"), reason
    assert (
        client.get(reverse("runs:placement", args=[cpu.pk])).json()["reason"] is None
    )  # the fixture's worker fits
    Run.objects.filter(pk=gpu.pk).update(status=RunStatus.CANCELLED)
    assert client.get(reverse("runs:placement", args=[gpu.pk])).json() == {
        "status": "cancelled",
        "reason": None,
    }
