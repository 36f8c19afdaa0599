"""A run's life (webapp/runs/lifecycle.py) against the real PostgreSQL and Redis broker: refusals in
the wrong state, the worker's claim guard, and one owner per run directory (launch, import, delete)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import queued_messages
from tests.helpers import TINY
from webapp.runs import lifecycle, services
from webapp.runs.errors import ConfigInvalid, InvalidState, ServiceError
from webapp.runs.models import Checkpoint, Run, RunStatus
from webapp.runs.tasks import execute_run


def queued_ids(queue: str) -> list[str]:
    return [m["headers"]["id"] for m in queued_messages(queue)]


def with_status(run: Run, status: str, **fields) -> Run:
    Run.objects.filter(pk=run.pk).update(status=status, **fields)
    run.refresh_from_db()
    return run


# --------------------------------------------------------------------------- refusals


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", ["queued", "running", "succeeded", "failed", "cancelled", "lost"])
def test_only_drafts_are_enqueued(researcher, scratch_queue, status):
    run = with_status(services.create_run(TINY, user=researcher), status)
    with pytest.raises(InvalidState, match=f"is {status}; only draft runs"):
        lifecycle.enqueue_run(run)
    assert Run.objects.get(pk=run.pk).status == status and queued_ids(scratch_queue) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", ["draft", "queued", "running", "succeeded"])
def test_only_failed_lost_or_cancelled_runs_resume(researcher, scratch_queue, tmp_path, status):
    run = with_status(services.create_run(TINY, user=researcher), status, run_dir=str(tmp_path))
    Checkpoint.objects.create(run=run, step=1, path=str(tmp_path / "ck"))
    assert not lifecycle.can_resume(run)
    with pytest.raises(InvalidState, match="only failed, lost or cancelled runs resume"):
        lifecycle.resume_run(run)
    run.refresh_from_db()
    assert run.status == status and run.resume_from == "" and queued_ids(scratch_queue) == []


@pytest.mark.django_db(transaction=True)
def test_resume_without_checkpoint_and_retry_or_delete_of_active_runs_are_refused(researcher, scratch_queue):
    run = with_status(services.create_run(TINY, user=researcher), RunStatus.FAILED, run_dir="/x")
    with pytest.raises(InvalidState, match="no checkpoint"):
        lifecycle.resume_run(run)
    for status in (RunStatus.QUEUED, RunStatus.RUNNING):
        run = with_status(run, status)
        assert lifecycle.actions(run) == {
            "cancel": True,
            "retry": False,
            "resume": False,
            "delete": False,
            "enqueue": False,
        }
        with pytest.raises(InvalidState, match="still"):
            lifecycle.retry_run(run)
        with pytest.raises(InvalidState, match="cancel it before deleting"):
            lifecycle.delete_run(run)
    assert queued_ids(scratch_queue) == []


@pytest.mark.django_db(transaction=True)
def test_cancel_of_a_running_run_is_a_flag_and_cannot_be_repeated(researcher, scratch_queue):
    run = with_status(services.create_run(TINY, user=researcher), RunStatus.RUNNING)
    assert not lifecycle.cancel_requested(run.pk)
    run = lifecycle.cancel_run(run)
    assert run.status == RunStatus.RUNNING and lifecycle.cancel_requested(run.pk)
    assert not lifecycle.can_cancel(run)
    with pytest.raises(InvalidState, match="cancel requested"):
        lifecycle.cancel_run(run)


# --------------------------------------------------------------------------- the claim guard


@pytest.mark.django_db(transaction=True)
def test_claim_happens_once_per_delivery_of_the_current_task(researcher, scratch_queue):
    run = lifecycle.launch_run(TINY, user=researcher)
    assert queued_ids(scratch_queue) == [run.task_id]
    assert lifecycle.claim(run.pk, task_id="stale-attempt", worker="w1") is None
    claimed = lifecycle.claim(run.pk, task_id=run.task_id, worker="w1")
    assert claimed is not None and claimed.status == RunStatus.RUNNING and claimed.worker_host == "w1"
    # the same message delivered again (redelivery after a connection loss): refused
    assert lifecycle.claim(run.pk, task_id=run.task_id, worker="w2") is None
    assert Run.objects.get(pk=run.pk).worker_host == "w1"


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_runs_task_does_nothing_when_it_arrives(researcher, scratch_queue, runs_dir):
    """The real task body, executed in-process: a cancelled run is neither started nor given a
    directory, whichever message reaches the worker."""
    run = lifecycle.launch_run(TINY, user=researcher)
    lifecycle.cancel_run(run)
    result = execute_run.apply(args=[run.pk], task_id=run.task_id)
    assert result.get() == "not claimed"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.started_at is None and run.run_dir == ""
    assert not (runs_dir / f"run-{run.pk}").exists()


@pytest.mark.django_db(transaction=True)
def test_a_message_of_an_earlier_attempt_does_not_start_the_requeued_run(researcher, scratch_queue):
    run = lifecycle.launch_run(TINY, user=researcher)
    first_task = run.task_id
    lifecycle.cancel_run(run)
    again = lifecycle.retry_run(run)  # never started: re-queued in place with a new task id
    assert again.pk == run.pk and again.task_id != first_task
    assert execute_run.apply(args=[run.pk], task_id=first_task).get() == "not claimed"
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED


# --------------------------------------------------------------------------- run directory ownership


def _owned_run(researcher, runs_dir: Path, status: str = RunStatus.SUCCEEDED) -> tuple[Run, Path]:
    """A run whose directory the worker created (as prepare_run_dir does)."""
    run = services.create_run(TINY, user=researcher)
    run = with_status(run, RunStatus.RUNNING)
    config = lifecycle.prepare_run_dir(run)
    run_dir = Path(config["train"]["output_dir"])
    (run_dir / "config.json").write_text("{}")
    (run_dir / "checkpoints").mkdir()
    return with_status(run, status), run_dir


@pytest.mark.django_db
def test_worker_creates_and_owns_the_default_run_directory(researcher, runs_dir):
    run, run_dir = _owned_run(researcher, runs_dir)
    assert run_dir == runs_dir.resolve() / f"run-{run.pk}"
    assert run.run_dir == str(run_dir) and run.run_dir_owned


@pytest.mark.django_db
def test_delete_with_files_removes_the_runs_own_directory(researcher, runs_dir):
    run, run_dir = _owned_run(researcher, runs_dir)
    outside = runs_dir.parent / f"outside-{uuid.uuid4().hex[:6]}"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    (run_dir / "link-out").symlink_to(outside)  # a symlink inside the run dir is unlinked, not followed
    assert lifecycle.files_deletable(run) is None
    assert lifecycle.delete_run(run, delete_files=True) is None
    assert not run_dir.exists() and not Run.objects.filter(pk=run.pk).exists()
    assert (outside / "precious").read_text() == "keep me"


@pytest.mark.django_db
def test_delete_with_files_never_follows_a_symlinked_run_dir_out(researcher, runs_dir):
    run, run_dir = _owned_run(researcher, runs_dir)
    outside = runs_dir.parent / f"victim-{uuid.uuid4().hex[:6]}"
    outside.mkdir()
    (outside / "model.safetensors").write_text("weights")
    # someone swaps the run directory for a symlink to another place
    os.rename(run_dir, runs_dir / f"moved-{run.pk}")
    run_dir.symlink_to(outside)
    reason = lifecycle.files_deletable(run)
    assert reason and "symlink" in reason
    assert lifecycle.delete_run(run, delete_files=True) == reason
    assert not Run.objects.filter(pk=run.pk).exists()
    assert (outside / "model.safetensors").read_text() == "weights"
    assert run_dir.is_symlink()


@pytest.mark.django_db
def test_delete_with_files_keeps_a_directory_another_run_uses(researcher, runs_dir):
    run, run_dir = _owned_run(researcher, runs_dir)
    # a later run fine-tunes from this run's checkpoint: its config names a path inside the directory
    child_cfg = {**TINY, "model": {"name_or_path": str(run_dir / "checkpoints")}}
    child = services.create_run(child_cfg, user=researcher)
    reason = lifecycle.files_deletable(run)
    assert reason == f"{run_dir} is still used by run #{child.pk}"
    assert lifecycle.delete_run(run, delete_files=True) == reason
    assert run_dir.is_dir()


@pytest.mark.django_db
def test_delete_with_files_keeps_directories_the_worker_did_not_create(
    researcher, runs_dir, settings, tmp_path
):
    settings.ALLOWED_ROOTS = [tmp_path]
    imported_dir = tmp_path / "cli-run"
    imported_dir.mkdir()
    (imported_dir / "config.json").write_text(json.dumps(TINY))
    run = services.import_run_dir(imported_dir, user=researcher)
    assert not run.run_dir_owned
    reason = lifecycle.delete_run(run, delete_files=True)
    assert reason and "not created by the worker" in reason
    assert (imported_dir / "config.json").exists()


@pytest.mark.django_db
def test_launch_refuses_an_output_dir_another_run_owns_or_that_holds_a_run(
    researcher, runs_dir, settings, tmp_path
):
    settings.ALLOWED_ROOTS = [tmp_path]
    run, run_dir = _owned_run(researcher, runs_dir)
    for target in (run_dir, run_dir / "checkpoints"):
        with pytest.raises(ConfigInvalid) as exc:
            services.create_run({**TINY, "train": {"output_dir": str(target)}}, user=researcher)
        assert exc.value.field_errors["train.output_dir"] == [
            f"output dir {target} belongs to run #{run.pk} ({run_dir})"
        ]
    cli_run = tmp_path / "cli"
    cli_run.mkdir()
    (cli_run / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigInvalid, match="already holds a run"):
        services.create_run({**TINY, "train": {"output_dir": str(cli_run)}}, user=researcher)
    assert Run.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("which", ["allowed root", "runs dir", "data dir", "reward models", "parent of data"])
def test_output_dir_is_never_a_directory_the_app_manages(researcher, settings, tmp_path, which):
    data = tmp_path / "x" / "var"
    settings.DATA_DIR = data
    settings.RUNS_DIR = data / "runs"
    settings.ALLOWED_ROOTS = [tmp_path]
    target = {
        "allowed root": tmp_path,
        "runs dir": data / "runs",
        "data dir": data,
        "reward models": data / "runs" / "reward_models",
        "parent of data": tmp_path / "x",
    }[which]
    with pytest.raises(ConfigInvalid) as exc:
        services.create_run({**TINY, "train": {"output_dir": str(target)}}, user=researcher)
    assert list(exc.value.field_errors) == ["train.output_dir"]
    assert "a directory the app manages" in exc.value.field_errors["train.output_dir"][0]
    ok = services.create_run({**TINY, "train": {"output_dir": str(data / "runs" / "mine")}}, user=researcher)
    assert ok.config["train"]["output_dir"] == str(data / "runs" / "mine")


@pytest.mark.django_db
def test_worker_checks_paths_again_before_training(researcher, runs_dir, settings, tmp_path):
    """A symlink planted after the launch is caught by the worker's own check."""
    settings.ALLOWED_ROOTS = [tmp_path]
    models = tmp_path / "models"
    models.mkdir()
    run = services.create_run({**TINY, "model": {"name_or_path": str(models / "m")}}, user=researcher)
    (models / "m").symlink_to("/etc")
    run = with_status(run, RunStatus.RUNNING)
    with pytest.raises(ConfigInvalid, match="model.name_or_path"):
        lifecycle.prepare_run_dir(run)
    assert Run.objects.get(pk=run.pk).run_dir == ""


@pytest.mark.django_db
def test_two_queued_runs_with_one_output_dir_cannot_both_take_it(researcher, settings, tmp_path):
    settings.ALLOWED_ROOTS = [tmp_path]
    cfg = {**TINY, "train": {"output_dir": str(tmp_path / "shared")}}
    first = with_status(services.create_run(cfg, user=researcher), RunStatus.RUNNING)
    second = with_status(services.create_run(cfg, user=researcher), RunStatus.RUNNING)
    lifecycle.prepare_run_dir(first)
    with pytest.raises(ServiceError, match=f"belongs to run #{first.pk}"):
        lifecycle.prepare_run_dir(second)
    assert Run.objects.get(pk=second.pk).run_dir == ""


@pytest.mark.django_db(transaction=True)
def test_a_run_resumes_in_its_own_chosen_output_dir(researcher, settings, tmp_path, scratch_queue):
    """Its own files do not count as "another run" when it continues in place."""
    settings.ALLOWED_ROOTS = [tmp_path]
    out = tmp_path / "chosen"
    run = lifecycle.launch_run({**TINY, "train": {"output_dir": str(out)}}, user=researcher)
    run = lifecycle.claim(run.pk, task_id=run.task_id, worker="w1")
    assert lifecycle.prepare_run_dir(run)["train"]["output_dir"] == str(out)
    (out / "config.json").write_text("{}")  # what the engine writes first
    Checkpoint.objects.create(run=run, step=1, path=str(out / "checkpoints" / "rl-000001"))
    assert lifecycle.mark_lost(run.pk)
    run = lifecycle.resume_run(run)
    assert run.status == RunStatus.QUEUED and run.resume_from == str(out)
    run = lifecycle.claim(run.pk, task_id=run.task_id, worker="w2")
    assert lifecycle.prepare_run_dir(run)["train"]["output_dir"] == str(out)
    run.refresh_from_db()
    assert run.run_dir == str(out) and run.run_dir_owned
