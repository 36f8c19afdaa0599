"""The watch's below-the-best rule in the web app (issue 28 §2): each evaluation's standard error comes
from the stored evaluation samples' per-sample scores, or from a gold job's per-step errors, and the run
page's panel warns on a noisy fall the falls-in-a-row rule misses. Real PostgreSQL, the Django test
client; the browser path is in tests/e2e/test_rubric_overopt_browser.py."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

#: Past its peak at step 10 the gold falls with noise: never two falls in a row.
STEPS = [0, 10, 20, 30, 40, 50]
GOLD = [0.50, 0.52, 0.46, 0.47, 0.45, 0.44]
PROXY = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
#: Four samples per evaluation at mean ± 0.01 (two each side): sd 0.011547, SE 0.0057735.
SPREAD = (-0.01, -0.01, 0.01, 0.01)


def _reads_jobs_of(sql: str, run_id: int) -> bool:
    """Whether ``sql`` is a read of one run's gold/export jobs (``gold_jobs.jobs_of``)."""
    return sql.startswith("SELECT") and '"runs_artifact"' in sql and f'"run_id" = {run_id}' in sql


def _noisy_run(user: Any = None, samples: bool = True) -> Any:
    from webapp.runs import ingest, services
    from webapp.runs.models import Sample

    run = services.create_run({"name": "noisy gold", "eval": {"split": "validation"}}, user=user)
    points = []
    for s, g, p in zip(STEPS, GOLD, PROXY):
        points += [("eval/gold", s, g), ("eval/reward_mean", s, p), ("train/kl_episode", s + 1, s / 10)]
        if samples:
            for i, d in enumerate(SPREAD):
                # No sample ids: the rule compares the means as independent (the paired case is below).
                Sample.objects.create(
                    run=run, step=s, split="validation", sample_id="", prompt=f"p{i}",
                    generation="g", metrics={"gold": g + d},
                )  # fmt: skip
    # a training sample's score is not an evaluation's: it must not enter the errors
    Sample.objects.create(run=run, step=20, split="train", prompt="p", generation="g", metrics={"gold": 9.0})
    ingest.ingest_metrics(run.pk, points)
    return run


@pytest.mark.django_db
def test_errors_come_from_the_evaluation_samples_and_from_gold_jobs() -> None:
    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact
    from webapp.runs.overopt_views import gold_errors

    run = _noisy_run()
    errors = gold_errors(run, "eval/gold")
    assert sorted(errors) == STEPS
    assert all(math.isclose(v, 0.0057735, rel_tol=1e-4) for v in errors.values())
    assert gold_errors(run, "eval/reward_mean") == {}  # no per-sample scores for it
    assert gold_errors(run, "human:3") == {}
    # a gold scored after the fact carries its own per-step errors (a None one is left out)
    Artifact.objects.create(
        run=run, name="judge", kind=gold_jobs.GOLD_KIND, path="",
        meta={"key": "gold:judge", "steps": [{"step": 0, "se": 0.02}, {"step": 10, "se": None}]},
    )  # fmt: skip
    assert gold_errors(run, "gold:judge") == {0: 0.02}


@pytest.mark.django_db
def test_the_panel_warns_on_a_noisy_fall_only_with_errors(client: Any, researcher: Any) -> None:
    run = _noisy_run(researcher)
    client.force_login(researcher)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    # best 0.52 at step 10; steps 20..50 lie 0.06, 0.05, 0.07, 0.08 below it: 6.1 to 9.8 SE of the difference
    assert 'id="overopt-warning"' in html
    assert "more than 2 standard errors below its best (step 10) at 4 consecutive evaluations" in html
    assert "(steps 20–50; −0.08, 9.8 SE at step 50)" in html and "the gold fell at" not in html
    html = client.get(f"/runs/{run.pk}/?falls=5").content.decode()
    assert 'id="overopt-warning"' not in html and "nor stayed more than 2 standard errors" in html
    # the same means without samples: the rule cannot run, and the panel says why
    bare = _noisy_run(researcher, samples=False)
    html = client.get(f"/runs/{bare.pk}/").content.decode()
    assert 'id="overopt-warning"' not in html and "the below-the-best rule needs" in html


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["gold", "gold:judge"])
def test_stored_samples_by_prompt_pair_the_evaluations(client: Any, researcher: Any, name: str) -> None:
    """Four prompts whose gold differs by prompt (±0.3) and drops by 0.06-0.08 on each with a little
    noise: as independent means the drop is under one standard error (the prompts' spread), paired
    over the prompts it is far beyond two; the panel says which error it used. ``gold`` is a metric
    the run logged per sample; ``gold:judge`` a gold job's, whose per-step errors are the independent
    ones and whose per-sample gold the job stored on the samples (``gold_jobs.tag_stored``)."""
    from webapp.runs import gold_jobs, ingest, services
    from webapp.runs.models import Artifact, Sample
    from webapp.runs.overopt_views import gold_errors, gold_scores

    key = "eval/" + name
    run = services.create_run({"name": "paired gold", "eval": {"split": "validation"}}, user=researcher)
    if name != "gold":
        Artifact.objects.create(
            run=run, name="judge", kind=gold_jobs.GOLD_KIND, path="",
            meta={"key": key, "status": "succeeded", "steps": [{"step": s, "se": 0.129} for s in STEPS]},
        )  # fmt: skip
    prompt = (-0.3, -0.1, 0.1, 0.3)
    # per evaluation and prompt, in thousandths; each row's mean is 0, so each mean is exactly its gold
    noise = [(4, -4, -4, 4), (4, 4, -4, -4), (4, -4, 4, -4), (-4, 4, 4, -4), (-4, -4, 4, 4), (-4, 4, -4, 4)]
    points = []
    for k, (s, g, p) in enumerate(zip(STEPS, GOLD, PROXY)):
        points += [(key, s, g), ("eval/reward_mean", s, p)]
        for i, (a, e) in enumerate(zip(prompt, noise[k])):
            Sample.objects.create(
                run=run, step=s, split="validation", sample_id=f"r{i}", prompt=f"p{i}",
                generation="g", metrics={name: g + a + e / 1000},
            )  # fmt: skip
    ingest.ingest_metrics(run.pk, points)
    scores = gold_scores(run, key)
    assert sorted(scores) == STEPS and sorted(scores[10]) == ["r0", "r1", "r2", "r3"]
    assert gold_scores(run, "gold:judge") == {}  # not an evaluation key
    # independent: each mean's SE is about 0.129 (the prompts' spread), so 0.08 is under half an SE
    assert all(v > 0.12 for v in gold_errors(run, key).values())
    client.force_login(researcher)
    with CaptureQueriesContext(connection) as queries:
        html = client.get(f"/runs/{run.pk}/?gold={key}").content.decode()
    # the panel reads the run's gold jobs once per view and hands them to every helper (errors, where
    # the job's per-sample tags live, its re-generated table); the stale-job sweep is a separate query
    job_reads = [q["sql"] for q in queries.captured_queries if _reads_jobs_of(q["sql"], run.pk)]
    assert len(job_reads) == 1, job_reads
    # paired, by hand: step 10 minus step 50 per prompt = 0.08 + (8, 0, 0, -8)/1000: sd 0.0065320,
    # SE 0.0032660, z = 0.08 / 0.0032660 = 24.5 (steps 20..40: 18.4, 15.3, 15.2)
    assert 'id="overopt-warning"' in html
    assert "more than 2 standard errors of the paired per-prompt differences below its best (step 10)" in html
    assert "at 4 consecutive evaluations (steps 20–50; −0.08, 24.5 SE at step 50)" in html
    Sample.objects.filter(run=run).update(sample_id="")  # the same scores without ids: not paired
    html = client.get(f"/runs/{run.pk}/?gold={key}").content.decode()
    assert 'id="overopt-warning"' not in html and "nor stayed more than 2 standard errors" in html
