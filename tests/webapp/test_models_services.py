"""Run lifecycle services against the real PostgreSQL and Redis broker."""

from __future__ import annotations

import json

import pytest

from tests.conftest import queued_messages
from tests.helpers import TINY
from webapp.celery import app as celery_app
from webapp.runs import ingest, lifecycle, paths, queries, services
from webapp.runs.models import Checkpoint, MetricPoint, Run, RunStatus, Sample


@pytest.mark.django_db(transaction=True)
def test_launch_validates_saves_and_enqueues_after_commit(researcher, scratch_queue):
    run = lifecycle.launch_run(TINY, user=researcher, tags="smoke, tiny,smoke", project="demo")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    assert run.tags == ["smoke", "tiny"]
    assert run.project.name == "demo"
    assert (run.algorithm, run.task, run.model_name) == (
        "ppo",
        "synthetic_increasing_numbers",
        "builtin:tiny-gpt2",
    )
    # defaults were filled in by the engine's schema
    assert run.config["algorithm"]["clip_range"] == 0.2
    msgs = queued_messages(scratch_queue)
    assert len(msgs) == 1
    assert msgs[0]["headers"]["task"] == "webapp.runs.tasks.execute_run"
    assert msgs[0]["headers"]["id"] == run.task_id
    assert json.dumps([run.pk]) in __import__("base64").b64decode(msgs[0]["body"]).decode()


@pytest.mark.django_db(transaction=True)
def test_invalid_config_saves_nothing_and_names_fields(researcher, scratch_queue):
    bad = {**TINY, "train": {"n_iters": -1}, "rollout": {"temperature": 0}, "typo": 1}
    with pytest.raises(services.ConfigInvalid) as exc:
        lifecycle.launch_run(bad, user=researcher)
    fields = exc.value.field_errors
    assert set(fields) == {"train.n_iters", "rollout.temperature", "typo"}
    assert fields["typo"] == ["unknown key"]
    assert Run.objects.count() == 0
    assert queued_messages(scratch_queue) == []


@pytest.mark.django_db
def test_output_dir_must_stay_inside_allowed_roots(researcher, settings, tmp_path):
    settings.ALLOWED_ROOTS = [tmp_path]
    with pytest.raises(services.ConfigInvalid) as exc:
        services.create_run({**TINY, "train": {"output_dir": "/etc/grue"}}, user=researcher)
    assert list(exc.value.field_errors) == ["train.output_dir"]
    run = services.create_run({**TINY, "train": {"output_dir": str(tmp_path / "r1")}}, user=researcher)
    assert run.config["train"]["output_dir"] == str(tmp_path / "r1")


def test_local_model_and_data_paths_must_stay_inside_read_roots(researcher, settings, tmp_path):
    """Paths a run would READ (models, tokenizers, data files, classifiers) are confined like output dirs;
    hub ids and builtin models are not paths; shipped assets and presets stay launchable."""
    from engine.presets import load_preset

    settings.ALLOWED_ROOTS = [tmp_path]
    outside = {
        "model": {"name_or_path": "/etc"},
        "tokenizer": {"name_or_path": "../../../../etc"},
        "task": {"id": "imdb", "args": {"path": "/etc/passwd"}},
        "reward": {"id": "learned", "args": {"model_path": "~/../../root"}},
        "eval": {"metrics": [{"id": "perplexity", "args": {"model": "/usr/lib"}}]},
    }
    with pytest.raises(services.ConfigInvalid) as exc:
        services.create_run({**TINY, **outside}, user=researcher)
    assert sorted(exc.value.field_errors) == [
        "eval.metrics[0].args.model",
        "model.name_or_path",
        "reward.args.model_path",
        "task.args.path",
        "tokenizer.name_or_path",
    ]
    assert not Run.objects.exists()
    (tmp_path / "data.jsonl").write_text('{"text": "a fine film", "label": 1}\n')
    inside = {
        **TINY,
        "model": {"name_or_path": "gpt2"},
        "task": {"id": "imdb", "args": {"path": str(tmp_path)}},
    }
    assert services.create_run(inside, user=researcher).config["model"]["name_or_path"] == "gpt2"
    preset = load_preset("imdb_ppo_offline")  # SmolLM2 GGUF inside its wheel, VADER, shipped fixture
    assert services.create_run(preset, user=researcher).config["model"]["name_or_path"].endswith(".gguf")


@pytest.mark.django_db(transaction=True)
def test_broker_down_keeps_run_as_retryable_draft(researcher, scratch_queue):
    good_url = celery_app.conf.broker_url
    celery_app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    try:
        with pytest.raises(services.BrokerUnavailable) as exc:
            lifecycle.launch_run(TINY, user=researcher)
    finally:
        celery_app.conf.broker_url = good_url
    assert "broker" in str(exc.value)
    run = Run.objects.get()
    assert run.status == RunStatus.DRAFT
    assert "Could not reach the task broker" in run.error
    # the broker is back: retry queues the same run, nothing lost
    again = lifecycle.retry_run(run)
    assert again.pk == run.pk
    assert again.status == RunStatus.QUEUED and again.error == ""
    assert len(queued_messages(scratch_queue)) == 1


@pytest.mark.django_db(transaction=True)
def test_cancel_queued_run_is_immediate_and_cancel_twice_is_an_error(researcher, scratch_queue):
    run = lifecycle.launch_run(TINY, user=researcher)
    run = lifecycle.cancel_run(run)
    assert run.status == RunStatus.CANCELLED and run.cancel_requested
    with pytest.raises(services.InvalidState):
        lifecycle.cancel_run(run)


@pytest.mark.django_db
def test_cancel_running_run_sets_cooperative_flag(researcher):
    run = services.create_run(TINY, user=researcher)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run = lifecycle.cancel_run(run)
    assert run.status == RunStatus.RUNNING and run.cancel_requested


@pytest.mark.django_db(transaction=True)
def test_clone_retry_delete(researcher, scratch_queue):
    run = services.create_run(TINY, user=researcher, tags=["a"], notes="n")
    clone = services.clone_run(run, config={**TINY, "train": {"n_iters": 3}})
    assert clone.cloned_from_id == run.pk and clone.status == RunStatus.DRAFT
    assert clone.config["train"]["n_iters"] == 3 and clone.tags == ["a"]
    # a finished run with data is retried as a new run so curves never mix
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, started_at=run.created)
    ingest.ingest_metrics(run.pk, [("train/kl", 0, 0.1)])
    new = lifecycle.retry_run(run)
    assert new.pk != run.pk and new.cloned_from_id == run.pk and new.status == RunStatus.QUEUED
    with pytest.raises(services.InvalidState):
        lifecycle.delete_run(new)  # queued: cancel first
    lifecycle.delete_run(run)
    assert not Run.objects.filter(pk=run.pk).exists()
    assert MetricPoint.objects.filter(run_id=run.pk).count() == 0


@pytest.mark.django_db(transaction=True)
def test_resume_needs_a_checkpoint(researcher, tmp_path, scratch_queue):
    run = services.create_run(TINY, user=researcher)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.LOST, run_dir=str(tmp_path))
    with pytest.raises(services.InvalidState, match="no checkpoint"):
        lifecycle.resume_run(run)
    assert queued_messages(scratch_queue) == []
    Checkpoint.objects.create(run=run, step=1, path=str(tmp_path / "checkpoints" / "step-1"))
    lifecycle.resume_run(run)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.resume_from == str(tmp_path)
    # published once, after commit, to the real broker, with the id the worker's claim will check
    msgs = queued_messages(scratch_queue)
    assert [m["headers"]["id"] for m in msgs] == [run.task_id]
    assert msgs[0]["headers"]["task"] == "webapp.runs.tasks.execute_run"


@pytest.mark.django_db
def test_mark_lost_runs_by_heartbeat_age_and_by_restarted_host(researcher):
    from datetime import timedelta

    from django.utils import timezone

    old = services.create_run(TINY, user=researcher)
    fresh = services.create_run(TINY, user=researcher)
    other_host = services.create_run(TINY, user=researcher)
    now = timezone.now()
    Run.objects.filter(pk=old.pk).update(
        status=RunStatus.RUNNING, heartbeat_at=now - timedelta(minutes=5), worker_host="w1"
    )
    Run.objects.filter(pk=fresh.pk).update(status=RunStatus.RUNNING, heartbeat_at=now, worker_host="w1")
    Run.objects.filter(pk=other_host.pk).update(status=RunStatus.RUNNING, heartbeat_at=now, worker_host="w2")
    assert lifecycle.mark_lost_runs(older_than=60) == [old.pk]
    assert Run.objects.get(pk=old.pk).status == RunStatus.LOST
    assert "heartbeat" in Run.objects.get(pk=old.pk).error
    assert lifecycle.mark_lost_runs(worker_host="w1") == [fresh.pk]
    assert Run.objects.get(pk=other_host.pk).status == RunStatus.RUNNING


def test_a_run_whose_worker_still_beats_in_redis_is_not_lost_during_a_database_outage(researcher, wait_for):
    """bench/outage.py --spare-worker found it: with only ``heartbeat_at`` a run cut off from the
    database for longer than GRUE_LOST_AFTER was marked lost and re-queued while its worker trained on,
    and a free worker trained it a second time. The worker's Heartbeat thread also beats in Redis; the
    watchdog leaves alone a run whose Redis beat is fresh, and marks it lost once that beat is old too."""
    from datetime import timedelta

    from django.core.cache import cache
    from django.utils import timezone

    from webapp.runs.tasks import Heartbeat

    run = services.create_run(TINY, user=researcher)
    stale = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, heartbeat_at=stale, worker_host="w1")
    cache.delete(f"run-alive:{run.pk}")
    beat = Heartbeat(run.pk, interval=0.2)
    beat.start()
    try:
        wait_for(lambda: cache.get(f"run-alive:{run.pk}") is not None, timeout=30, what="the Redis heartbeat")
        Run.objects.filter(pk=run.pk).update(heartbeat_at=stale)  # the database beat "fails"
        assert lifecycle.mark_lost_runs(older_than=60) == []
        assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING
    finally:
        beat.stop()
    # The worker is gone: its last Redis beat ages past the watchdog's limit, like heartbeat_at.
    cache.set(f"run-alive:{run.pk}", (timezone.now() - timedelta(seconds=61)).timestamp(), timeout=60)
    assert lifecycle.mark_lost_runs(older_than=60) == [run.pk]
    assert Run.objects.get(pk=run.pk).status == RunStatus.LOST


@pytest.mark.django_db
def test_check_path_stays_inside_allowed_roots(tmp_path, settings):
    settings.ALLOWED_ROOTS = [tmp_path]
    inside = tmp_path / "a" / "b"
    inside.mkdir(parents=True)
    assert paths.check_path(inside) == inside
    with pytest.raises(services.PathNotAllowed):
        paths.check_path(tmp_path / ".." / "etc")
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(services.PathNotAllowed):
        paths.check_path(tmp_path / "link" / "passwd")


@pytest.mark.django_db
def test_import_cli_run_directory(researcher, tmp_path, settings):
    settings.ALLOWED_ROOTS = [tmp_path]
    d = tmp_path / "run-1"
    (d / "checkpoints" / "step-2").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(TINY))
    with (d / "metrics.jsonl").open("w") as fh:
        for step in range(3):
            fh.write(
                json.dumps({"step": step, "train/reward_mean": step / 10, "train/kl": 0.01 * step}) + "\n"
            )
        fh.write(json.dumps({"step": 2, "metrics": {"eval/rouge": 0.5}}) + "\n")
    with (d / "samples.jsonl").open("w") as fh:
        fh.write(
            json.dumps(
                {
                    "step": 2,
                    "split": "validation",
                    "prompt": "1 2",
                    "generation": "3 4",
                    "references": ["3"],
                    "reward": 1.0,
                }
            )
            + "\n"
        )
    run = services.import_run_dir(d, user=researcher)
    assert run.status == RunStatus.SUCCEEDED
    assert MetricPoint.objects.filter(run=run).count() == 7
    assert run.last_metrics["train/reward_mean"] == pytest.approx(0.2)
    assert queries.metric_series(run.pk, "train/kl")["y"] == pytest.approx([0.0, 0.01, 0.02])
    s = Sample.objects.get(run=run)
    assert (s.split, s.generation, s.references) == ("validation", "3 4", ["3"])
    assert run.checkpoints.get().step == 2
    # importing the same directory again returns the same run (one run per directory)
    assert services.import_run_dir(str(d) + "/", user=researcher).pk == run.pk
    assert Run.objects.count() == 1 and MetricPoint.objects.filter(run=run).count() == 7
    # bad lines are reported with file and line, and nothing is imported
    bad = tmp_path / "run-2"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(TINY))
    (bad / "metrics.jsonl").write_text('{"step": 1, "a": 1}\n{oops\n')
    with pytest.raises(services.ServiceError, match=r"metrics.jsonl: line 2"):
        services.import_run_dir(bad, user=researcher)
    assert Run.objects.count() == 1
    with pytest.raises(services.PathNotAllowed):
        services.import_run_dir("/etc", user=researcher)


@pytest.mark.django_db
def test_run_table_filters_sort_pagination_and_metric_columns(researcher):
    runs = []
    for i in range(30):
        cfg = {**TINY, "algorithm": {"id": "nlpo" if i % 3 == 0 else "ppo"}}
        r = services.create_run(
            cfg, user=researcher, name=f"run {i}", tags=["even"] if i % 2 == 0 else ["odd"]
        )
        ingest.update_last_metrics(r.pk, {"train/reward_mean": float(i % 7)})
        runs.append(r)
    Run.objects.filter(pk=runs[5].pk).update(status=RunStatus.FAILED)
    t = queries.run_table({"algorithm": "nlpo", "per_page": "4", "page": "2"})
    assert t.total == 10 and t.pages == 3 and len(t.rows) == 4
    assert all(r.algorithm == "nlpo" for r in t.rows)
    t = queries.run_table({"tag": "odd", "status": "failed"})
    assert [r.pk for r in t.rows] == [runs[5].pk]
    t = queries.run_table({"sort": "-metric:train/reward_mean", "per_page": "5"})
    vals = [t.metric_value(r, "train/reward_mean") for r in t.rows]
    assert vals == [6.0, 6.0, 6.0, 6.0, 5.0]
    t = queries.run_table({"q": "run 1", "sort": "name"})
    assert [r.name for r in t.rows] == ["run 1"] + [f"run {i}" for i in range(10, 20)]
    assert "nlpo" in t.facets["algorithm"] and "even" in t.facets["tag"]
    # an unknown sort falls back to newest first
    assert queries.run_table({"sort": "drop table"}).sort == "-created"


@pytest.mark.django_db
def test_config_diff_final_metrics_and_side_by_side(researcher):
    a = services.create_run(TINY, user=researcher, name="a")
    b = services.create_run(
        {**TINY, "algorithm": {"id": "ppo", "learning_rate": 3e-5}}, user=researcher, name="b"
    )
    diff = {d["key"]: d["values"] for d in queries.config_diff([a, b])}
    assert diff == {"name": ["a", "b"], "algorithm.learning_rate": [1e-5, 3e-5]}
    ingest.update_last_metrics(a.pk, {"eval/x": 1.0})
    a.refresh_from_db()
    fm = queries.final_metrics([a, b])
    assert fm["keys"] == ["eval/x"] and fm["rows"][1]["values"] == {"eval/x": None}
    for run, gen in ((a, "g-a"), (b, "g-b")):
        ingest.ingest_samples(
            run.pk, 1, "validation", [{"prompt": "p", "generation": "old", "sample_id": "s1"}]
        )
        ingest.ingest_samples(
            run.pk,
            2,
            "validation",
            [{"prompt": "p", "generation": gen, "sample_id": "s1", "reward": 0.5, "references": ["r"]}],
        )
    rows = queries.samples_side_by_side([a, b])
    assert len(rows) == 1
    assert rows[0]["by_run"][a.pk]["generation"] == "g-a" and rows[0]["by_run"][b.pk]["generation"] == "g-b"


@pytest.mark.django_db
def test_exports(researcher):
    r = services.create_run(TINY, user=researcher, name='quote "me", please')
    ingest.ingest_metrics(r.pk, [("k", 0, 1.5), ("k", 1, float("nan"))])
    text = "".join(queries.metrics_csv([r.pk]))
    lines = text.strip().splitlines()
    assert lines[0] == "run_id,run_name,key,step,value,time"
    assert lines[1].startswith(f'{r.pk},"quote ""me"", please",k,0,1.5,')
    data = json.loads(queries.metrics_json_text([r.pk]))
    assert data["runs"][0]["metrics"]["k"] == [[0, 1.5], [1, None]]
