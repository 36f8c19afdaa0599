"""The over-optimisation watch after the fact (issue 28 §2): a gold picked on the run page and scored
by the real Celery worker on the run's stored evaluation generations; a checkpoint exported as a
model directory, downloaded, and launched from; the refusals (bad input names its field, roles)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for_condition

STEPS = [0, 10, 20, 30]
#: Digit share of the generations at each evaluation step: the stub judge's "numeric" criterion.
GENERATIONS = {
    0: ["1 2 3 4", "5 6 7 8"],  # 1.0
    10: ["1 2 3 4", "5 6 7 x"],  # 1.0, 0.75
    20: ["1 2 y y", "5 6 y y"],  # 0.5
    30: ["1 y y y", "y y y y"],  # 0.25, 0
}
RUBRIC_ARGS = """criteria:
  - name: numeric
    description: Is the continuation made of numbers?
    scale: {min: 0, max: 1}
judge: {backend: stub}
"""


def _run_with_evaluations(runs_dir: Path, name: str = "vader run") -> Any:
    from webapp.runs import ingest, services
    from webapp.runs.models import Checkpoint, Run, RunStatus, Sample

    run = services.create_run({"name": name, "model": {"name_or_path": "builtin:tiny-gpt2"}})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    for step in STEPS:
        for i, gen in enumerate(GENERATIONS[step]):
            Sample.objects.create(
                run=run, step=step, split="validation", sample_id=str(i), prompt=f"p{i}", generation=gen
            )
    # the final evaluation logs every prompt; only the ids every step has are scored
    Sample.objects.create(run=run, step=30, split="validation", sample_id="7", prompt="p7", generation="9 9")
    # another split with the same ids (other prompts): never mixed into the evaluation split's pairs
    Sample.objects.create(run=run, step=30, split="test", sample_id="0", prompt="other", generation="9 9 9")
    points = []
    for k, step in enumerate(STEPS):
        points += [("eval/reward_mean", step, 0.1 * (k + 1)), ("train/kl_episode", step, step / 10)]
    ingest.ingest_metrics(run.pk, points)
    for step in (10, 20):
        path = runs_dir / f"run-{run.pk}/checkpoints/rl-{step:06d}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "state.pt").write_bytes(b"")  # on disk (only its presence is looked at before export)
        Checkpoint.objects.create(run=run, step=step, path=str(path))
    return run


def _write_checkpoint(path: Path, marker: float) -> None:
    """A checkpoint as the trainer writes it (``state.pt`` with the policy's ``lm.*`` and
    ``value_head.*`` tensors), from the tiny GPT-2 with one weight set to ``marker``."""
    import torch

    from engine.models.loading import load_lm, resolve_model_path

    lm = load_lm(resolve_model_path("builtin:tiny-gpt2"), "causal")
    with torch.no_grad():
        lm.transformer.wte.weight[3, 1] = marker
    policy = {f"lm.{k}": v for k, v in lm.state_dict().items()}
    policy["value_head.linear.weight"] = torch.full((1, lm.config.n_embd), 0.5)
    path.mkdir(parents=True, exist_ok=True)
    torch.save({"policy": policy, "iteration": 10, "phase": "rl"}, path / "state.pt")


# ------------------------------------------------------------------------------------ validation


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("choice", "args", "label", "field", "text"),
    [
        ("reward:no_such", "", "", "gold", "unknown reward id 'no_such'"),
        ("reward:weighted_sum", "", "", "gold", "unknown reward id"),
        ("", "", "", "gold", "choose a registered reward"),
        ("reward:rubric", "criteria: [", "", "args", "bad YAML"),
        ("reward:rubric", "- 1\n- 2", "", "args", "YAML mapping"),
        ("reward:rubric", RUBRIC_ARGS + "colour: red\n", "", "args.colour", "has no argument 'colour'"),
        ("reward:rubric", RUBRIC_ARGS, "Bad Label!", "label", "lower-case letters"),
        ("choice:rm:99999", "", "", "gold", "not an available trained reward model"),
        ("reward:learned", "model_path: /etc", "", "args.model_path", "outside the allowed directories"),
    ],
)
def test_bad_gold_requests_name_their_field(
    choice: str, args: str, label: str, field: str, text: str
) -> None:
    from webapp.runs import gold_jobs

    with pytest.raises(gold_jobs.GoldJobError) as err:
        gold_jobs.clean_gold_request(choice, args, label)
    assert err.value.field == field
    assert text in err.value.message


@pytest.mark.django_db
def test_a_registered_gold_gets_its_id_as_default_label() -> None:
    from webapp.runs import gold_jobs

    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "")
    assert (spec["id"], label) == ("rubric", "rubric")
    assert spec["args"]["judge"] == {"backend": "stub"}
    assert "reward:weighted_sum" not in {c["value"] for c in gold_jobs.gold_choices()}


@pytest.mark.django_db
def test_reference_runs_and_runs_without_evaluations_are_refused(runs_dir: Path, researcher: Any) -> None:
    from webapp.runs import gold_jobs, services
    from webapp.runs.models import Run

    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "")
    bare = services.create_run({"name": "no evals"})
    with pytest.raises(gold_jobs.GoldJobError, match="no evaluation generations"):
        gold_jobs.start_gold_job(bare, spec, label, enqueue=False)
    run = _run_with_evaluations(runs_dir)
    Run.objects.filter(pk=run.pk).update(worker_host="reference:grue")
    run.refresh_from_db()
    with pytest.raises(gold_jobs.GoldJobError, match="read-only"):
        gold_jobs.start_gold_job(run, spec, label, enqueue=False)


@pytest.mark.django_db
def test_a_label_is_free_again_only_after_a_job_that_stored_nothing(runs_dir: Path) -> None:
    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact

    run = _run_with_evaluations(runs_dir)
    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "again")
    first = gold_jobs.start_gold_job(run, spec, label, enqueue=False)
    with pytest.raises(gold_jobs.GoldJobError, match="already has a gold named 'again'"):
        gold_jobs.start_gold_job(run, spec, label, enqueue=False)  # queued
    Artifact.objects.filter(pk=first.pk).update(meta={**first.meta, "status": "failed", "done": 2})
    with pytest.raises(gold_jobs.GoldJobError, match="already has a gold named 'again'"):
        gold_jobs.start_gold_job(run, spec, label, enqueue=False)  # failed after storing points
    Artifact.objects.filter(pk=first.pk).update(meta={**first.meta, "status": "failed", "done": 0})
    second = gold_jobs.start_gold_job(run, spec, label, enqueue=False)
    assert list(Artifact.objects.filter(run=run, kind="gold-job").values_list("pk", flat=True)) == [second.pk]


def test_roles_every_new_endpoint(annotator_client: Any, researcher: Any, db: Any) -> None:
    from django.test import Client

    from webapp.runs import services

    run = services.create_run({"name": "r"})
    urls = [
        ("post", f"/runs/{run.pk}/gold/"),
        ("get", f"/runs/{run.pk}/gold/jobs.json"),
        ("post", f"/runs/{run.pk}/gold/jobs/1/cancel/"),
        ("post", f"/runs/{run.pk}/gold/jobs/1/retry/"),
        ("post", f"/runs/{run.pk}/checkpoints/10/export/"),
        ("post", f"/runs/{run.pk}/checkpoints/10/export/retry/"),
        ("get", f"/runs/{run.pk}/checkpoints/10/model.tar.gz"),
        ("get", f"/launch/?checkpoint={run.pk}:10"),
    ]
    anonymous = Client()
    for method, url in urls:
        r = getattr(anonymous, method)(url)
        assert r.status_code == 302 and "/accounts/login/" in r["Location"], url
        r = getattr(annotator_client, method)(url)
        assert r.status_code in (302, 403), url
        if r.status_code == 302:
            assert "/annotate" in r["Location"] or "/annotation" in r["Location"], (url, r["Location"])


# ------------------------------------------------------------------------------ real worker flows


@pytest.mark.django_db(transaction=True)
def test_gold_after_the_fact_scored_by_the_worker(
    researcher_client: Any, celery_worker: Any, runs_dir: Path
) -> None:
    from webapp.runs.models import Artifact, MetricPoint

    run = _run_with_evaluations(runs_dir)
    r = researcher_client.post(
        f"/runs/{run.pk}/gold/", {"gold": "reward:rubric", "args": RUBRIC_ARGS, "label": "judge"}
    )
    assert r.status_code == 302
    job = Artifact.objects.get(run=run, kind="gold-job")

    def done() -> bool:
        job.refresh_from_db()
        assert job.meta["status"] != "failed", job.meta["error"] + "\n" + celery_worker.log()[-3000:]
        return job.meta["status"] == "succeeded"

    wait_for_condition(done, timeout=180, interval=0.2, what="the gold job")
    gold = dict(MetricPoint.objects.filter(run=run, key="eval/gold:judge").values_list("step", "value"))
    # the two prompts every step has (ids 0 and 1), never the final evaluation's extra one
    assert gold == pytest.approx({0: 1.0, 10: 0.875, 20: 0.5, 30: 0.125})
    crit = dict(
        MetricPoint.objects.filter(run=run, key="eval/gold:judge/numeric").values_list("step", "value")
    )
    assert crit == pytest.approx(gold)
    steps = job.meta["steps"]
    assert [s["n"] for s in steps] == [2, 2, 2, 2]
    assert steps[1]["se"] == pytest.approx(0.125)  # sd of (1, 0.75) / sqrt 2
    assert (job.meta["done"], job.meta["total"]) == (4, 4)
    # Each scored sample keeps its own gold (the stub's digit share), so the watch pairs evaluations
    # by prompt; the final evaluation's extra prompt and the other split were not scored.
    from webapp.runs.models import Sample
    from webapp.runs.overopt_views import gold_scores

    tags = {
        (s.split, s.step, s.sample_id): (s.metrics or {}).get("gold:judge")
        for s in Sample.objects.filter(run=run)
    }
    assert tags[("validation", 10, "0")] == 1.0 and tags[("validation", 10, "1")] == 0.75
    assert tags[("validation", 30, "7")] is None and tags[("test", 30, "0")] is None
    scores = gold_scores(run, "eval/gold:judge")
    # exact: the digit shares are multiples of 1/4
    assert scores == {
        0: {"0": 1.0, "1": 1.0},
        10: {"0": 1.0, "1": 0.75},
        20: {"0": 0.5, "1": 0.5},
        30: {"0": 0.25, "1": 0.0},
    }

    # The panel picks the new gold by default: the proxy rose while it fell 3 times in a row.
    page = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert "eval/gold:judge" in page
    assert "the gold fell at 3 consecutive evaluations" in page
    assert 'id="overopt-best-checkpoint">10<' in page  # step 10 (0.875) beats step 20 (0.5)
    jobs = researcher_client.get(f"/runs/{run.pk}/gold/jobs.json").json()["jobs"]
    assert jobs[0]["status"] == "succeeded" and jobs[0]["key"] == "eval/gold:judge"

    # The same label twice is refused: the form comes back with the message naming the field.
    r = researcher_client.post(
        f"/runs/{run.pk}/gold/", {"gold": "reward:rubric", "args": RUBRIC_ARGS, "label": "judge"}
    )
    assert r.status_code == 400
    page = r.content.decode()
    assert "Gold not started: label: this run already has a gold named &#x27;judge&#x27;" in page
    assert 'id="gold-label" maxlength="40" value="judge"' in page


@pytest.mark.django_db
def test_the_gold_form_lists_registered_rewards_and_keeps_values_on_errors(
    researcher_client: Any, runs_dir: Path
) -> None:
    run = _run_with_evaluations(runs_dir, name="<i>x</i>")
    page = researcher_client.get(f"/runs/{run.pk}/gold/").content.decode()
    assert '<option value="reward:rubric"' in page and "4 evaluation steps" in page
    assert "an NLPO run through each checkpoint's masking policy" in page
    assert "store them as the run's samples (split gold-regen)" in page
    assert "&lt;i&gt;x&lt;/i&gt;" in page
    r = researcher_client.post(f"/runs/{run.pk}/gold/", {"gold": "reward:rubric", "args": "criteria: [\n"})
    assert r.status_code == 400
    page = r.content.decode()
    assert "Gold not started: args: bad YAML" in page
    assert 'id="gold-args"' in page and "criteria: [" in page
    # the run page links the form
    assert (
        f'href="/runs/{run.pk}/gold/" id="gold-new-link"'
        in researcher_client.get(f"/runs/{run.pk}/").content.decode()
    )


@pytest.mark.django_db(transaction=True)
def test_export_download_and_launch_from_the_best_checkpoint(
    researcher_client: Any, celery_worker: Any, runs_dir: Path
) -> None:
    from webapp.runs.models import Artifact

    run = _run_with_evaluations(runs_dir, name="exported <b>run</b>")
    ckpt = runs_dir / f"run-{run.pk}/checkpoints/rl-000010"
    _write_checkpoint(ckpt, marker=0.625)

    # Not exported yet: the launch form says so and starts from the defaults.
    page = researcher_client.get(f"/launch/?checkpoint={run.pk}:10").content.decode()
    assert "step 10 of run #" in page and "is not exported yet" in page

    r = researcher_client.post(f"/runs/{run.pk}/checkpoints/10/export/")
    assert r.status_code == 302
    job = Artifact.objects.get(run=run, kind="checkpoint-export")

    def done() -> bool:
        job.refresh_from_db()
        assert job.meta["status"] != "failed", job.meta["error"] + "\n" + celery_worker.log()[-3000:]
        return job.meta["status"] == "succeeded"

    wait_for_condition(done, timeout=180, interval=0.2, what="the export job")
    out = Path(job.path)
    assert out == runs_dir.resolve() / "exports" / f"run-{run.pk}-rl-000010"

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(str(out))
    assert float(lm.transformer.wte.weight[3, 1].detach()) == pytest.approx(0.625)
    assert float(load_file(str(out / "value_head.safetensors"))["linear.weight"][0, 0]) == 0.5

    r = researcher_client.get(f"/runs/{run.pk}/checkpoints/10/model.tar.gz")
    assert r.status_code == 200 and r["Content-Disposition"].endswith(f'run-{run.pk}-step-10.tar.gz"')
    with tarfile.open(fileobj=io.BytesIO(b"".join(r.streaming_content)), mode="r:gz") as tar:
        names = tar.getnames()
    assert f"run-{run.pk}-rl-000010/config.json" in names
    assert f"run-{run.pk}-rl-000010/value_head.safetensors" in names
    assert researcher_client.get(f"/runs/{run.pk}/checkpoints/20/model.tar.gz").status_code == 404

    page = researcher_client.get(f"/launch/?checkpoint={run.pk}:10").content.decode()
    assert str(out) in page  # model.name_or_path pre-filled with the export
    assert "exported &lt;b&gt;run&lt;/b&gt; from step 10" in page
    # the run page links both, and the export of another step is offered
    detail = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert f"/runs/{run.pk}/checkpoints/10/model.tar.gz" in detail
    assert f"/launch/?checkpoint={run.pk}%3A10" in detail
    assert f"/runs/{run.pk}/checkpoints/20/export/" in detail


@pytest.mark.django_db
def test_launch_source_refuses_bad_values(researcher_client: Any) -> None:
    for value, text in [
        ("abc", "expected &lt;run id&gt;:&lt;step&gt;"),
        ("999999:1", "there is no run #999999"),
    ]:
        page = researcher_client.get(f"/launch/?checkpoint={value}").content.decode()
        assert text in page, value


@pytest.mark.django_db
def test_export_of_a_checkpoint_outside_the_roots_is_refused(researcher: Any, tmp_path: Path) -> None:
    from webapp.runs import gold_jobs, services
    from webapp.runs.models import Checkpoint

    run = services.create_run({"name": "r"})
    Checkpoint.objects.create(run=run, step=5, path="/etc/rl-000005")
    with pytest.raises(gold_jobs.GoldJobError) as err:
        gold_jobs.start_export_job(run, 5, enqueue=False)
    assert err.value.field == "step" and "outside the allowed directories" in err.value.message
    with pytest.raises(gold_jobs.GoldJobError, match="no saved checkpoint at step 6"):
        gold_jobs.start_export_job(run, 6, enqueue=False)


# ------------------------------------------------------------------------------------------ cancel


@pytest.mark.django_db
def test_cancel_a_queued_gold_job_and_the_refusals(researcher_client: Any, runs_dir: Path) -> None:
    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact

    run = _run_with_evaluations(runs_dir)
    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "queued")
    job = gold_jobs.start_gold_job(run, spec, label, enqueue=False)
    page = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    url = f"/runs/{run.pk}/gold/jobs/{job.pk}/cancel/"
    assert f'action="{url}" class="inline gold-cancel-form" data-job-name="queued"' in page

    r = researcher_client.post(url, follow=True)
    assert "Gold &#x27;queued&#x27; cancelled before it started." in r.content.decode()
    job.refresh_from_db()
    assert job.meta["status"] == "cancelled" and job.meta["finished"]
    assert 'class="inline gold-cancel-form"' not in r.content.decode()  # no button on an ended job
    # the worker never takes a cancelled job
    assert gold_jobs.run_gold_job(job.pk, job.meta["task_id"])["status"] == "not claimed"
    r = researcher_client.post(url, follow=True)
    assert (
        "Not cancelled: job: gold job &#x27;queued&#x27; has already ended (cancelled); only a queued or "
        "running job can be cancelled" in r.content.decode()
    )
    # it stored nothing: its label is free again
    again = gold_jobs.start_gold_job(run, spec, label, enqueue=False)
    assert not Artifact.objects.filter(pk=job.pk).exists()
    assert gold_jobs.run_gold_job(again.pk, again.meta["task_id"])["status"] == "succeeded"
    with pytest.raises(gold_jobs.GoldJobError, match=r"has already ended \(succeeded\)") as err:
        gold_jobs.cancel_gold_job(run, again.pk)
    assert err.value.field == "job"
    with pytest.raises(gold_jobs.GoldJobError, match=f"run #{run.pk} has no gold job #999999"):
        gold_jobs.cancel_gold_job(run, 999999)


@pytest.mark.django_db
def test_a_job_cancelled_while_running_stops_before_the_next_step(
    runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's own function, with the cancel landing between two steps (the moment is the
    test's): the steps scored are kept, the job ends cancelled, a second cancel is refused."""
    from webapp.runs import gold_jobs, ingest
    from webapp.runs.models import Artifact, MetricPoint

    run = _run_with_evaluations(runs_dir)
    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "stopped")
    job = gold_jobs.start_gold_job(run, spec, label, enqueue=False)
    real_ingest = ingest.ingest_metrics
    calls = []

    def ingest_then_cancel(run_id: int, points: Any, **kw: Any) -> Any:
        out = real_ingest(run_id, points, **kw)
        calls.append(points[0][1])
        if len(calls) == 2:  # the second step is stored: a researcher cancels now
            assert gold_jobs.cancel_gold_job(run, job.pk).meta["status"] == "cancelling"
        return out

    monkeypatch.setattr(ingest, "ingest_metrics", ingest_then_cancel)  # the real one, then a cancel
    result = gold_jobs.run_gold_job(job.pk, job.meta["task_id"])
    assert result == {"id": job.pk, "status": "cancelled", "steps": 2}
    job = Artifact.objects.get(pk=job.pk)
    assert (job.meta["status"], job.meta["done"], job.meta["total"]) == ("cancelled", 2, 4)
    gold = dict(MetricPoint.objects.filter(run=run, key="eval/gold:stopped").values_list("step", "value"))
    assert gold == pytest.approx({0: 1.0, 10: 0.875})
    with pytest.raises(gold_jobs.GoldJobError, match=r"has already ended \(cancelled\)"):
        gold_jobs.cancel_gold_job(run, job.pk)


def _long_job_scoring(client: Any, runs_dir: Path, name: str) -> tuple[Any, Any]:
    """A run with 404 evaluation steps whose rubric gold is started from the page; returns
    ``(run, job)`` once the worker has scored two steps (many remain)."""
    from webapp.runs.models import Artifact, Sample

    run = _run_with_evaluations(runs_dir, name=name)
    Sample.objects.bulk_create(
        Sample(run=run, step=100 + k, split="validation", sample_id=str(i), prompt=f"p{i}", generation="1 y")
        for k in range(400)
        for i in range(2)
    )
    r = client.post(f"/runs/{run.pk}/gold/", {"gold": "reward:rubric", "args": RUBRIC_ARGS})
    assert r.status_code == 302
    job = Artifact.objects.get(run=run, kind="gold-job")

    def scoring() -> bool:
        job.refresh_from_db()
        assert job.meta["status"] in ("queued", "running"), job.meta
        return job.meta["done"] >= 2

    wait_for_condition(scoring, timeout=180, interval=0.05, what="the gold job's first steps")
    return run, job


@pytest.mark.django_db(transaction=True)
def test_the_worker_stops_a_cancelled_gold_job(
    researcher_client: Any, celery_worker: Any, runs_dir: Path
) -> None:
    """The real worker scoring many evaluation steps; the researcher cancels once it has scored
    some: it stops within one step, keeping the points of the steps it scored."""
    from webapp.runs.models import MetricPoint

    run, job = _long_job_scoring(researcher_client, runs_dir, "long")
    r = researcher_client.post(f"/runs/{run.pk}/gold/jobs/{job.pk}/cancel/", follow=True)
    assert "is being cancelled: the worker stops before the next evaluation step" in r.content.decode()
    job.refresh_from_db()
    at_cancel = job.meta["done"]

    def stopped() -> bool:
        job.refresh_from_db()
        assert job.meta["status"] in ("cancelling", "cancelled"), job.meta
        return job.meta["status"] == "cancelled"

    wait_for_condition(stopped, timeout=60, interval=0.1, what="the cancelled gold job")
    done = job.meta["done"]
    assert at_cancel <= done <= at_cancel + 1 < job.meta["total"] == 404
    points = MetricPoint.objects.filter(run=run, key="eval/gold:rubric")
    assert points.count() == done == len(job.meta["steps"])  # what it scored is kept
    assert researcher_client.get(f"/runs/{run.pk}/gold/jobs.json").json()["jobs"][0]["status"] == "cancelled"
    r = researcher_client.post(f"/runs/{run.pk}/gold/jobs/{job.pk}/cancel/", follow=True)
    assert "has already ended (cancelled)" in r.content.decode().replace("&#x27;", "'")


# ------------------------------------------------------------------------- retry and a dead worker


class _WorkerDied(BaseException):
    """Stands for the worker process vanishing mid-step: nothing of the job's own code runs after."""


def _age_heartbeat(job: Any, seconds: float) -> None:
    from datetime import timedelta

    from django.utils import timezone

    job.refresh_from_db()
    job.meta = {**job.meta, "heartbeat": (timezone.now() - timedelta(seconds=seconds)).isoformat()}
    job.save(update_fields=["meta"])


@pytest.mark.django_db
def test_a_stale_job_fails_and_a_retry_scores_only_the_missing_steps(
    researcher_client: Any, runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's own function dies after storing two of four steps (the job stays ``running``);
    the staleness check keeps it while its heartbeat is fresh and fails it, saying the worker
    stopped, once the heartbeat is older than the limit. Retry re-queues the same row; the steps
    already stored are kept and only the other two are scored. Every refusal names the job."""
    from webapp.runs import gold_jobs, ingest
    from webapp.runs.models import Artifact, MetricPoint

    run = _run_with_evaluations(runs_dir)
    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "flaky")
    job = gold_jobs.start_gold_job(run, spec, label, enqueue=False)
    first_task = job.meta["task_id"]
    real_ingest = ingest.ingest_metrics
    stored: list[int] = []

    def ingest_then_die(run_id: int, points: Any, **kw: Any) -> Any:
        if len(stored) == 2:
            raise _WorkerDied
        stored.append(points[0][1])
        return real_ingest(run_id, points, **kw)

    monkeypatch.setattr(ingest, "ingest_metrics", ingest_then_die)
    with pytest.raises(_WorkerDied):
        gold_jobs.run_gold_job(job.pk, first_task)
    job.refresh_from_db()
    assert (job.meta["status"], job.meta["done"]) == ("running", 2)

    assert gold_jobs.fail_stale_jobs(older_than=60) == []  # its heartbeat is fresh
    _age_heartbeat(job, 120)
    assert gold_jobs.fail_stale_jobs(older_than=60, run_ids=[run.pk + 1]) == []  # another run
    assert gold_jobs.fail_stale_jobs(older_than=60, run_ids=[run.pk]) == [job.pk]
    assert gold_jobs.fail_stale_jobs(older_than=60) == []  # once
    job.refresh_from_db()
    assert job.meta["status"] == "failed" and job.meta["finished"]
    assert job.meta["error"].startswith("Worker stopped: the worker ")
    assert "stopped sending heartbeats" in job.meta["error"]
    assert "The steps it scored (2) are kept; retry the job to score the rest." in job.meta["error"]

    url = f"/runs/{run.pk}/gold/jobs/{job.pk}/retry/"
    page = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert f'action="{url}" class="inline gold-retry-form" data-job-name="flaky"' in page
    assert 'class="inline gold-cancel-form"' not in page
    assert researcher_client.get(url).status_code == 405  # a state change is a POST

    r = researcher_client.post(url, follow=True)
    text = r.content.decode().replace("&#x27;", "'")
    assert "Gold 'flaky' queued again (attempt 2); steps already scored, kept: 2." in text
    assert 'class="inline gold-retry-form"' not in text  # queued: no retry button
    job = Artifact.objects.get(pk=job.pk)  # the same row: the label still names one gold
    assert Artifact.objects.filter(run=run, kind="gold-job").count() == 1
    assert job.meta["status"] == "queued" and job.meta["task_id"] != first_task
    assert job.meta["attempts"] == [
        {"status": "failed", "error": job.meta["attempts"][0]["error"], "done": 2, "total": 4,
         "started": job.meta["attempts"][0]["started"], "finished": job.meta["attempts"][0]["finished"],
         "by": ""},
    ]  # fmt: skip
    assert "stopped sending heartbeats" in job.meta["attempts"][0]["error"]
    assert "earlier attempt: failed after 2 steps — Worker stopped: the worker " in text

    r = researcher_client.post(url, follow=True)
    assert (
        "Not retried: job: gold job 'flaky' is queued; only a failed or cancelled job can be retried"
        in r.content.decode().replace("&#x27;", "'")
    )
    assert gold_jobs.run_gold_job(job.pk, first_task)["status"] == "not claimed"  # the earlier attempt's
    calls: list[int] = []

    def counting(run_id: int, points: Any, **kw: Any) -> Any:
        calls.append(points[0][1])
        return real_ingest(run_id, points, **kw)

    monkeypatch.setattr(ingest, "ingest_metrics", counting)
    result = gold_jobs.run_gold_job(job.pk, job.meta["task_id"])
    assert result == {"id": job.pk, "status": "succeeded", "steps": 4}
    assert calls == [20, 30]  # the steps the first attempt stored are not scored again
    job.refresh_from_db()
    assert (job.meta["status"], job.meta["done"], job.meta["total"]) == ("succeeded", 4, 4)
    assert [e["step"] for e in job.meta["steps"]] == STEPS
    gold = dict(MetricPoint.objects.filter(run=run, key="eval/gold:flaky").values_list("step", "value"))
    assert gold == pytest.approx({0: 1.0, 10: 0.875, 20: 0.5, 30: 0.125})
    for state in ("succeeded", "running"):
        Artifact.objects.filter(pk=job.pk).update(meta={**job.meta, "status": state})
        with pytest.raises(
            gold_jobs.GoldJobError, match=f"gold job 'flaky' is {state}; only a failed"
        ) as err:
            gold_jobs.retry_gold_job(run, job.pk)
        assert err.value.field == "job"
    with pytest.raises(gold_jobs.GoldJobError, match=f"run #{run.pk} has no gold job #999999"):
        gold_jobs.retry_gold_job(run, 999999)


@pytest.mark.django_db
def test_stale_jobs_of_a_restarted_worker_and_a_cancel_that_outlived_its_worker(runs_dir: Path) -> None:
    """A restarted worker holds nothing: the jobs it had claimed fail at once (others stay); a job
    being cancelled whose worker died ends ``cancelled``; a cancelled job can be retried."""
    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact

    run = _run_with_evaluations(runs_dir)
    jobs = {}
    for label, worker in (("on-w1", "w1@host"), ("on-w2", "w2@host")):
        spec, _ = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, label)
        job = gold_jobs.start_gold_job(run, spec, label, enqueue=False)
        assert gold_jobs._claim(job.pk, job.meta["task_id"]) is not None
        Artifact.objects.filter(pk=job.pk).update(
            meta={**Artifact.objects.get(pk=job.pk).meta, "worker": worker}
        )
        jobs[label] = job
    assert gold_jobs.fail_stale_jobs(worker_host="w1@host") == [jobs["on-w1"].pk]
    w1 = Artifact.objects.get(pk=jobs["on-w1"].pk)
    assert w1.meta["status"] == "failed"
    assert w1.meta["error"].startswith("Worker stopped: the worker w1@host restarted while it held this job.")

    assert gold_jobs.cancel_gold_job(run, jobs["on-w2"].pk).meta["status"] == "cancelling"
    assert gold_jobs.fail_stale_jobs(older_than=60) == []
    _age_heartbeat(jobs["on-w2"], 61)
    assert gold_jobs.fail_stale_jobs(older_than=60) == [jobs["on-w2"].pk]
    w2 = Artifact.objects.get(pk=jobs["on-w2"].pk)
    assert w2.meta["status"] == "cancelled" and w2.meta["error"].endswith("the cancel is done.")
    again = gold_jobs.retry_gold_job(run, w2.pk, enqueue=False)
    assert again.meta["status"] == "queued" and again.meta["attempts"][0]["status"] == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_fails_its_gold_job_and_a_retry_finishes_it(
    researcher_client: Any, worker_factory: Any, celery_worker: Any, runs_dir: Path, settings: Any
) -> None:
    """A real worker scoring many steps is SIGKILLed (no cleanup runs); its job stays ``running``
    until its heartbeat is older than the limit, then fails saying the worker stopped. Retried from
    the page, another real worker scores only the missing steps."""
    from webapp.runs import gold_jobs
    from webapp.runs.models import MetricPoint

    doomed = worker_factory()
    settings.CELERY_TASK_DEFAULT_QUEUE = doomed.queue
    run, job = _long_job_scoring(researcher_client, runs_dir, "killed")
    assert job.meta["worker"] == doomed.name
    doomed.kill()
    job.refresh_from_db()
    at_kill = job.meta["done"]
    assert job.meta["status"] == "running" and at_kill < job.meta["total"] == 404

    def failed() -> bool:
        return gold_jobs.fail_stale_jobs(older_than=2.0, run_ids=[run.pk]) == [job.pk]

    wait_for_condition(failed, timeout=60, interval=0.1, what="the dead worker's job to go stale")
    data = researcher_client.get(f"/runs/{run.pk}/gold/jobs.json").json()["jobs"][0]
    assert data["status"] == "failed"
    assert data["error"].startswith(f"Worker stopped: the worker {doomed.name} stopped sending heartbeats")

    settings.CELERY_TASK_DEFAULT_QUEUE = celery_worker.queue
    r = researcher_client.post(f"/runs/{run.pk}/gold/jobs/{job.pk}/retry/", follow=True)
    assert "queued again (attempt 2)" in r.content.decode()

    def done() -> bool:
        job.refresh_from_db()
        assert job.meta["status"] in ("queued", "running", "succeeded"), job.meta
        return job.meta["status"] == "succeeded"

    wait_for_condition(done, timeout=300, interval=0.1, what="the retried gold job")
    assert (job.meta["done"], job.meta["total"]) == (404, 404)
    assert job.meta["worker"] == celery_worker.name
    assert MetricPoint.objects.filter(run=run, key="eval/gold:rubric").count() == 404
    assert sorted(e["step"] for e in job.meta["steps"]) == sorted(STEPS + [100 + k for k in range(400)])


# ------------------------------------------------------------------------------ pruned checkpoints


@pytest.mark.django_db
def test_pruned_checkpoints_are_not_offered_and_refused_by_name(
    researcher_client: Any, runs_dir: Path
) -> None:
    """The trainer keeps only the newest ``train.keep_checkpoints``; the rows of the pruned ones stay.
    The panel lists only checkpoints on disk (the best by gold among them), says which are gone, and
    an export of a gone one is refused naming it."""
    import shutil

    from webapp.runs import gold_jobs, ingest
    from webapp.runs.models import Checkpoint

    run = _run_with_evaluations(runs_dir)
    shutil.rmtree(runs_dir / f"run-{run.pk}/checkpoints/rl-000010")
    Checkpoint.objects.create(run=run, step=30, path="/etc/rl-000030")  # outside the roots: not offered
    ingest.ingest_metrics(run.pk, [("eval/gold", 10, 0.9), ("eval/gold", 20, 0.5), ("eval/gold", 30, 0.1)])
    assert [c.step for c in gold_jobs.existing_checkpoints(run.pk)[0]] == [20]
    page = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert '<tr data-step="20" class="best">' in page and 'tr data-step="10"' not in page
    assert 'id="overopt-best-checkpoint">20<' in page  # step 10 has the better gold, but is gone
    assert "Not listed: 2 checkpoints no longer on disk (steps 10, 30)" in page
    assert f"/runs/{run.pk}/checkpoints/10/export/" not in page
    with pytest.raises(gold_jobs.GoldJobError) as err:
        gold_jobs.start_export_job(run, 10, enqueue=False)
    assert err.value.field == "step"
    assert err.value.message == (
        f"checkpoint rl-000010 (step 10) of run #{run.pk} is no longer on disk: pruned by the run's "
        "train.keep_checkpoints (only the newest are kept) or deleted"
    )
    r = researcher_client.post(f"/runs/{run.pk}/checkpoints/10/export/", follow=True)
    assert "Export not started: step: checkpoint rl-000010 (step 10)" in r.content.decode()


# ------------------------------------------------------------------- re-generate on more prompts


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "text"),
    [("abc", "'abc' is not a whole number"), ("0", "between 1 and 512 per checkpoint (got 0)"),
     ("513", "between 1 and 512 per checkpoint (got 513)"), ("2.5", "'2.5' is not a whole number")],
)  # fmt: skip
def test_bad_prompt_counts_name_the_field(value: str, text: str) -> None:
    from webapp.runs import gold_jobs

    with pytest.raises(gold_jobs.GoldJobError) as err:
        gold_jobs.clean_prompts(value)
    assert err.value.field == "prompts" and text in err.value.message
    assert gold_jobs.clean_prompts(" ") is None and gold_jobs.clean_prompts("12") == 12


@pytest.mark.django_db
def test_regenerating_needs_a_checkpoint_on_disk(researcher_client: Any, runs_dir: Path) -> None:
    import shutil

    run = _run_with_evaluations(runs_dir)
    shutil.rmtree(runs_dir / f"run-{run.pk}/checkpoints")  # both pruned
    r = researcher_client.post(
        f"/runs/{run.pk}/gold/", {"gold": "reward:rubric", "args": RUBRIC_ARGS, "prompts": "8"}
    )
    assert r.status_code == 400
    page = r.content.decode()
    assert f"Gold not started: prompts: run #{run.pk} has no checkpoint on disk to re-generate from" in page
    assert 'id="gold-prompts" min="1" max="512" value="8"' in page
    r = researcher_client.post(
        f"/runs/{run.pk}/gold/", {"gold": "reward:rubric", "args": RUBRIC_ARGS, "prompts": "9999"}
    )
    assert (
        "Gold not started: prompts: must be between 1 and 512 per checkpoint (got 9999)" in r.content.decode()
    )


@pytest.mark.django_db(transaction=True)
def test_gold_regenerated_from_each_checkpoint_by_the_worker(
    researcher_client: Any, celery_worker: Any, runs_dir: Path
) -> None:
    """The real worker loads each checkpoint on disk (a tiny GPT-2), samples it on 5 prompts of the
    run's evaluation split and scores them; a pruned checkpoint is skipped. Two checkpoints with the
    same weights get the same gold: the same prompts and seed for every checkpoint."""
    from django.utils.html import escape

    from webapp.runs import gold_jobs, services
    from webapp.runs.forms import load_preset
    from webapp.runs.models import Artifact, Checkpoint, MetricPoint, Run, RunStatus, Sample

    config = load_preset("synthetic_ppo")
    config["name"] = "regenerated"
    run = services.create_run(config)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    for step in (10, 20):
        path = runs_dir / f"run-{run.pk}/checkpoints/rl-{step:06d}"
        _write_checkpoint(path, marker=0.5)
        Checkpoint.objects.create(run=run, step=step, path=str(path))
    Checkpoint.objects.create(run=run, step=5, path=str(runs_dir / f"run-{run.pk}/checkpoints/rl-000005"))
    r = researcher_client.post(
        f"/runs/{run.pk}/gold/",
        {"gold": "reward:rubric", "args": RUBRIC_ARGS, "label": "more", "prompts": "5"},
    )
    assert r.status_code == 302, r.content.decode()[-2000:]
    job = Artifact.objects.get(run=run, kind="gold-job")
    assert job.meta["prompts"] == 5

    def done() -> bool:
        job.refresh_from_db()
        assert job.meta["status"] != "failed", job.meta["error"] + "\n" + celery_worker.log()[-3000:]
        return job.meta["status"] == "succeeded"

    wait_for_condition(done, timeout=300, interval=0.2, what="the re-generating gold job")
    assert [(s["step"], s["n"]) for s in job.meta["steps"]] == [(10, 5), (20, 5)]
    assert [(s["checkpoint"], s["masking"]) for s in job.meta["steps"]] == [
        ("rl-000010", ""),
        ("rl-000020", ""),
    ]
    gold = dict(MetricPoint.objects.filter(run=run, key="eval/gold:more").values_list("step", "value"))
    assert set(gold) == {10, 20} and 0 <= gold[10] <= 1
    assert gold[10] == pytest.approx(gold[20])

    # The re-generated outputs are the run's samples: split gold-regen at each checkpoint's step, the
    # same 5 prompts (task sample ids) at both, each with its gold; their mean is the step's point.
    stored = list(Sample.objects.filter(run=run, split="gold-regen").order_by("step", "id"))
    assert [s.step for s in stored] == [10] * 5 + [20] * 5
    assert [s.sample_id for s in stored[:5]] == [s.sample_id for s in stored[5:]]
    assert [s.prompt for s in stored[:5]] == [s.prompt for s in stored[5:]]
    assert all(s.generation for s in stored) and [s.generation for s in stored[:5]] == [
        s.generation for s in stored[5:]
    ]  # same weights, prompts and seed
    for step in (10, 20):
        values = [s.metrics["gold:more"] for s in stored if s.step == step]
        assert sum(values) / 5 == pytest.approx(gold[step])
    assert gold_jobs.eval_steps(run.pk) == []  # never taken for evaluation generations
    # the watch pairs the two checkpoints' golds over the prompts both were sampled on
    from webapp.runs.overopt_views import gold_scores

    scores = gold_scores(run, "eval/gold:more")
    assert sorted(scores) == [10, 20] and sorted(scores[10]) == sorted(s.sample_id for s in stored[:5])

    page = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert "re-generated on 5 prompts per checkpoint" in page
    assert "Re-generated outputs of gold <code>more</code>" in page
    assert '<th data-step="10">step 10<br><span class="num">gold ' in page
    first = stored[0]
    assert f'<tr data-sample="{first.sample_id}"><td class="prompt">{escape(first.prompt)}</td>' in page
    assert f'<td class="generation">{escape(first.generation)}<br>' in page
    assert (
        "The first 5 of the 5 prompts each checkpoint was sampled on; all 10 generations are stored" in page
    )
    assert "gold-masking" not in page  # PPO: no masking note
    # the compare view shows them too, under the run, when that gold is picked
    other = services.create_run({"name": "other"})
    page = researcher_client.get(f"/compare/?ids={run.pk},{other.pk}&gold=eval/gold:more").content.decode()
    assert (
        f'data-run="{run.pk}" class="gold-regenerated-title">#{run.pk} regenerated: re-generated outputs'
        in page
    )
    assert f'<td class="generation">{escape(first.generation)}<br>' in page


def _regen_run(runs_dir: Path, config: dict[str, Any], checkpoints: dict[int, Any]) -> Any:
    """A succeeded run of ``config`` with the given checkpoints on disk (``step: masker or None``,
    written as the trainer writes them)."""
    from tests.engine.test_checkpoint_regeneration import write_checkpoint
    from webapp.runs import services
    from webapp.runs.models import Checkpoint, Run, RunStatus

    run = services.create_run(config)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    for step, masker in checkpoints.items():
        path = runs_dir / f"run-{run.pk}/checkpoints/rl-{step:06d}"
        write_checkpoint(path, masker)
        Checkpoint.objects.create(run=run, step=step, path=str(path))
    return run


@pytest.mark.django_db
def test_a_retried_regenerating_job_stores_its_samples_once(runs_dir: Path) -> None:
    """The worker's own function run twice on one job (its message delivered again after a requeue):
    each checkpoint's samples are replaced, not added, and no metric point is stored twice."""
    from tests.engine.test_checkpoint_regeneration import config
    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact, MetricPoint, Sample

    run = _regen_run(runs_dir, {**config("ppo"), "name": "retried"}, {10: None, 20: None})
    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "again")
    job = gold_jobs.start_gold_job(run, spec, label, enqueue=False, prompts=3)
    assert gold_jobs.run_gold_job(job.pk, job.meta["task_id"])["status"] == "succeeded"

    def stored() -> list[tuple[int, str, str, float]]:
        return [
            (s.step, s.sample_id, s.generation, s.metrics["gold:again"])
            for s in Sample.objects.filter(
                run=run, split="gold-regen", metrics__has_key="gold:again"
            ).order_by("step", "sample_id")
        ]

    first = stored()
    points = list(
        MetricPoint.objects.filter(run=run).values_list("key", "step", "value").order_by("key", "step")
    )
    assert len(first) == 6 and len(points) == 4  # 3 prompts x 2 checkpoints; gold and its criterion x 2
    job = Artifact.objects.get(pk=job.pk)
    Artifact.objects.filter(pk=job.pk).update(meta={**job.meta, "status": "queued", "done": 0})
    assert gold_jobs.run_gold_job(job.pk, job.meta["task_id"])["status"] == "succeeded"
    assert stored() == first
    again = list(
        MetricPoint.objects.filter(run=run).values_list("key", "step", "value").order_by("key", "step")
    )
    assert again == points
    # another label's samples at the same steps are its own rows, and left alone by this one's retry
    spec2, label2 = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "other")
    other = gold_jobs.start_gold_job(run, spec2, label2, enqueue=False, prompts=2)
    assert gold_jobs.run_gold_job(other.pk, other.meta["task_id"])["status"] == "succeeded"
    assert stored() == first
    assert Sample.objects.filter(run=run, split="gold-regen", metrics__has_key="gold:other").count() == 4


@pytest.mark.django_db
def test_a_superseded_step_stores_nothing(runs_dir: Path) -> None:
    """A step whose job no longer names the worker's task is rolled back: no samples, no points."""
    from tests.engine.test_checkpoint_regeneration import config
    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact, MetricPoint, Sample

    run = _regen_run(runs_dir, {**config("ppo"), "name": "superseded"}, {10: None})
    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "late")
    job = gold_jobs.start_gold_job(run, spec, label, enqueue=False, prompts=2)
    batch = gold_jobs.Batch(["p"], ["g"], [[]], ["0"], checkpoint="rl-000010")
    progress = {"done": 1, "steps": []}
    assert not gold_jobs._store_step(
        job, "another-task", 10, batch, [0.5], [("eval/gold:late", 10, 0.5)], progress
    )
    assert not Sample.objects.filter(run=run).exists()
    assert not MetricPoint.objects.filter(run=run).exists()
    assert Artifact.objects.get(pk=job.pk).meta["done"] == 0


@pytest.mark.django_db
def test_nlpo_regeneration_is_masked_as_its_evaluations_and_says_how(
    researcher_client: Any, runs_dir: Path
) -> None:
    """An NLPO run's checkpoint holding its masking policy is sampled through it (the test's masking
    policy allows "&" only); one without it is sampled with the policy as its own mask, which the
    job records and the page says, per step."""
    from engine.models.loading import load_lm, load_tokenizer, resolve_model_path
    from tests.engine.test_checkpoint_regeneration import FORCED, N_TOKENS, config, forcing_masker
    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact, Sample

    path = resolve_model_path("builtin:tiny-gpt2")
    masker = forcing_masker(load_lm(path, "causal"), load_tokenizer(path).encode(FORCED)[0])
    run = _regen_run(runs_dir, {**config("nlpo"), "name": "nlpo <run>"}, {10: masker, 20: None})
    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "masked")
    job = gold_jobs.start_gold_job(run, spec, label, enqueue=False, prompts=4)
    assert gold_jobs.run_gold_job(job.pk, job.meta["task_id"])["status"] == "succeeded"

    gens = {
        step: [s.generation for s in Sample.objects.filter(run=run, split="gold-regen", step=step)]
        for step in (10, 20)
    }
    assert gens[10] == [FORCED * N_TOKENS] * 4  # through the checkpoint's masking policy
    assert len(gens[20]) == 4 and FORCED * N_TOKENS not in gens[20]  # self-masked: not the mask above
    meta = Artifact.objects.get(pk=job.pk).meta
    assert [(s["step"], s["masking"]) for s in meta["steps"]] == [(10, "checkpoint"), (20, "policy")]
    masking = gold_jobs.job_json(Artifact.objects.get(pk=job.pk))["masking"]
    assert [(m["masking"], m["steps"]) for m in masking] == [("checkpoint", [10]), ("policy", [20])]
    assert "the checkpoint holds no NLPO masking policy" in masking[1]["note"]

    page = researcher_client.get(f"/runs/{run.pk}/?gold=eval/gold:masked").content.decode()
    assert (
        'data-masking="checkpoint">step 10: sampled through the checkpoint&#x27;s NLPO masking policy, '
        "as the run&#x27;s evaluations</span>" in page
    )
    assert 'data-masking="policy">step 20: the checkpoint holds no NLPO masking policy: sampled with' in page
    assert (
        '<span class="muted" data-masking="policy">self-masked: no masking policy in the checkpoint' in page
    )


@pytest.mark.django_db
def test_regenerated_outputs_are_shown_escaped_and_never_taken_as_evaluations(
    researcher_client: Any, runs_dir: Path
) -> None:
    """Model text is shown escaped beside the gold; the re-generated samples are not evaluation
    generations (a gold on stored evaluations still finds none)."""
    from webapp.runs import gold_jobs, ingest, services
    from webapp.runs.models import Artifact

    run = _regen_run(runs_dir, {"name": "escaped", "model": {"name_or_path": "builtin:tiny-gpt2"}}, {})
    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_ARGS, "shown")
    job = Artifact.objects.create(
        run=run, name=label, kind=gold_jobs.GOLD_KIND, path="",
        meta={"status": "succeeded", "key": "eval/gold:shown", "prompts": 1, "spec": spec, "done": 1,
              "total": 1, "steps": [{"step": 10, "mean": 0.25, "se": None, "n": 1}]},
    )  # fmt: skip
    batch = gold_jobs.Batch(
        ["<i>prompt</i>"], ["<script>alert(1)</script>"], [[]], ["0"], checkpoint="rl-000010"
    )
    assert gold_jobs.store_regenerated(run.pk, job.name, 10, batch, [0.25]) == 1
    ingest.ingest_metrics(run.pk, [("eval/gold:shown", 10, 0.25)])
    page = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert '<td class="prompt">&lt;i&gt;prompt&lt;/i&gt;</td>' in page
    assert (
        '<td class="generation">&lt;script&gt;alert(1)&lt;/script&gt;<br><span class="muted num">gold 0.25'
        in page
    )
    assert "<script>alert(1)" not in page
    other = services.create_run({"name": "other"})
    page = researcher_client.get(f"/compare/?ids={run.pk},{other.pk}&gold=eval/gold:shown").content.decode()
    assert '<td class="generation">&lt;script&gt;alert(1)&lt;/script&gt;<br>' in page
    assert "<script>alert(1)" not in page
    assert gold_jobs.eval_steps(run.pk) == [] and gold_jobs.eval_split(run) is None
    with pytest.raises(gold_jobs.GoldJobError, match="no evaluation generations"):
        gold_jobs.start_gold_job(run, spec, "stored", enqueue=False)
