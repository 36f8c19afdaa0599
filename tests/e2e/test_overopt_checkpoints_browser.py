"""The over-optimisation watch after the fact, in a real browser against the real worker (issue 28 §2):
a tiny GPT-2 run that saved a checkpoint at each evaluation and had no gold at launch → the researcher
picks a rubric gold (by its registered id, deterministic stub judge) on the run page → the worker scores
the evaluation generations while the page shows the progress → the panel shows the gold, the warning
state and the best checkpoint by gold → the best checkpoint is exported → "launch from this
checkpoint" opens the launch form with the export as the model."""

from __future__ import annotations

import math
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.conftest import status_of, wait_for_condition
from tests.e2e.overopt_setup import RUBRIC_YAML, Dialogs, finished_run, queued_gold_job

pytestmark = [pytest.mark.e2e]


@pytest.mark.django_db(transaction=True)
def test_gold_after_the_fact_best_checkpoint_and_launch_from_it(
    page: Any, live_server_with_worker: Any, researcher: Any, login: Any
) -> None:
    from webapp.runs import lifecycle
    from webapp.runs.forms import load_preset
    from webapp.runs.models import Checkpoint, MetricPoint

    config = load_preset("synthetic_ppo")
    config["name"] = "no gold at launch"
    config["train"].update(n_iters=3, eval_every=1, save_every=1, keep_checkpoints=5)
    run = lifecycle.launch_run(config, user=researcher)
    wait_for_condition(
        lambda: status_of(run.pk) in ("succeeded", "failed"), timeout=600, interval=0.5, what="the run"
    )
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    steps = sorted(Checkpoint.objects.filter(run=run).values_list("step", flat=True))
    assert steps == [1, 2, 3]

    base = live_server_with_worker.url
    login(page, base, researcher)
    page.goto(f"{base}/runs/{run.pk}/", timeout=120_000)
    panel = page.locator("#overopt-panel")
    expect(panel.locator("#overopt-checkpoints tbody tr")).to_have_count(3)

    # Pick the gold after the fact: a rubric, by its registered id; arguments are YAML data.
    panel.locator("#gold-new-link").click(no_wait_after=True)  # a shared CPU builds the menu slowly
    page.wait_for_url(f"{base}/runs/{run.pk}/gold/", timeout=120_000)
    page.select_option("#gold-choice", "reward:rubric")
    page.fill("#gold-args", RUBRIC_YAML)
    page.fill("#gold-label", "judge")
    page.click("#gold-start", no_wait_after=True)
    page.wait_for_url(f"{base}/runs/{run.pk}/#overopt-panel", timeout=120_000)
    expect(page.locator("#gold-jobs tr[data-key='eval/gold:judge'] .job-status")).to_be_visible()
    # When the worker is done the panel shows the new gold: rendered so if the job had ended before
    # the page was, otherwise the page's poll of jobs.json reloads it with the gold selected.
    expect(page.locator("#overopt-best-checkpoint")).to_be_visible(timeout=180_000)
    gold = dict(MetricPoint.objects.filter(run=run, key="eval/gold:judge").values_list("step", "value"))
    assert set(steps) <= set(gold) and all(math.isfinite(v) for v in gold.values())
    row = page.locator("#gold-jobs tr[data-key='eval/gold:judge']")
    expect(row.locator(".job-status")).to_have_text("succeeded")
    expect(row.locator(".job-progress")).to_have_text(f"{len(gold)} / {len(gold)}")  # every evaluation step
    expect(page.locator("#overopt-gold")).to_have_value("eval/gold:judge")

    best = max(steps, key=lambda s: (gold[s], -s))
    expect(page.locator("#overopt-best-checkpoint")).to_have_text(str(best))
    best_row = page.locator("#overopt-checkpoints tr.best")
    expect(best_row).to_have_attribute("data-step", str(best))
    expect(best_row.locator(".best-mark")).to_have_text("best by gold")
    # gold at every evaluation, and the best-by-gold star (plus the proxy's points)
    page.wait_for_function(
        f"() => Number(document.querySelector('#overopt-by-step').dataset.points) >= {len(gold) + 1}"
    )

    # Export the best checkpoint; when it is done the row links the download and the launch form.
    best_row.locator("button.ckpt-export").click(no_wait_after=True)
    expect(page.locator("#overopt-checkpoints tr.best a.ckpt-launch")).to_be_visible(timeout=180_000)
    href = page.locator("#overopt-checkpoints tr.best a.ckpt-download").get_attribute("href")
    assert href == f"/runs/{run.pk}/checkpoints/{best}/model.tar.gz"
    page.locator("#overopt-checkpoints tr.best a.ckpt-launch").click(no_wait_after=True)
    page.wait_for_url(f"{base}/launch/?checkpoint={run.pk}%3A{best}", timeout=120_000)
    model = page.locator("input[name=model__name_or_path]")
    expect(model).to_have_value(f"{runs_root()}/exports/run-{run.pk}-rl-{best:06d}")
    expect(page.locator("input[name=name]")).to_have_value(f"no gold at launch from step {best}")


def runs_root() -> str:
    """The runs directory the worker wrote the export into (the session's, resolved)."""
    from webapp.runs import paths

    return str(paths.runs_root())


@pytest.mark.django_db(transaction=True)
def test_the_run_page_follows_a_gold_job_to_its_end(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """A queued job's row shows its state; when the job ends (run here by the worker's own function,
    so the moment is the test's), the page's poll of jobs.json switches the panel to the new gold."""
    from webapp.runs import gold_jobs

    run = finished_run(researcher, "followed", {0: ["1 2", "3 4"], 10: ["1 x", "y y"]})
    job = queued_gold_job(run, "later")  # no worker takes it

    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/", timeout=120_000)
    row = page.locator("#gold-jobs tr[data-key='eval/gold:later']")
    expect(row.locator(".job-status")).to_have_text("queued")
    expect(page.locator("#overopt-no-gold")).to_be_visible()
    assert gold_jobs.run_gold_job(job.pk, job.meta["task_id"])["status"] == "succeeded"
    page.wait_for_url("**gold=eval%2Fgold%3Alater**", timeout=60_000)
    expect(row.locator(".job-status")).to_have_text("succeeded")
    expect(row.locator(".job-progress")).to_have_text("2 / 2")
    expect(page.locator("#overopt-best")).to_contain_text("Best evaluation by gold: step 0")


@pytest.mark.django_db(transaction=True)
def test_cancel_a_gold_job_from_the_run_page(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """The cancel button asks first: dismissing keeps the job; accepting cancels it (queued: at once),
    the row says so and offers no button any more."""
    from webapp.runs.models import Artifact

    run = finished_run(researcher, "cancelled")
    job = queued_gold_job(run, "stop-me")  # no worker takes it

    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/", timeout=120_000)
    row = page.locator("#gold-jobs tr[data-key='eval/gold:stop-me']")
    dialogs = Dialogs(page)
    dialogs.answer_next(False)
    row.locator("button.gold-cancel").click()
    expect(row.locator(".job-status")).to_have_text("queued")
    assert "Cancel the gold “stop-me”?" in dialogs.messages[0]
    job.refresh_from_db()
    assert job.meta["status"] == "queued"

    dialogs.answer_next(True)
    row.locator("button.gold-cancel").click(no_wait_after=True)
    page.wait_for_url(f"{asgi_server.url}/runs/{run.pk}/#overopt-panel", timeout=60_000)
    expect(page.get_by_text("Gold 'stop-me' cancelled before it started.")).to_be_visible()
    expect(row.locator(".job-status")).to_have_text("cancelled")
    expect(row.locator("button.gold-cancel")).to_have_count(0)
    assert Artifact.objects.get(pk=job.pk).meta["status"] == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_compare_view_draws_each_runs_human_gold(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """Two runs, each with a campaign over its checkpoints judged by people: the compare view's gold
    menu offers their human golds; picking "each run's newest" draws both on the step and √KL charts
    (proxy, gold and best star per run) with the best checkpoints and the campaigns' notes."""
    from annotation import campaigns
    from tests.annotation.conftest import make_user
    from tests.annotation.test_checkpoint_campaigns import _judge_all, _run_with_checkpoints
    from webapp.runs import ingest

    first = _run_with_checkpoints("first")
    second = _run_with_checkpoints("second")
    for run, prefer, tag in ((first, 20, "a"), (second, 30, "b")):
        ingest.ingest_metrics(run.pk, [("train/kl_episode", s, s / 10) for s in (5, 10, 20, 30)])
        camp = campaigns.create_campaign_from_checkpoints(f"people {tag}", run.pk, overlap=2)
        _judge_all(camp, [make_user(f"{tag}{i}") for i in range(2)], prefer=prefer)

    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/compare/?ids={first.pk},{second.pk}", timeout=120_000)
    page.select_option("#overopt-gold", "human:*")
    page.click("#overopt-form button[type=submit]")
    page.wait_for_url("**gold=human%3A*", timeout=60_000)
    table = page.locator("#overopt-table")
    expect(table.locator(f"tr[data-run='{first.pk}'] td").nth(3)).to_have_text("20")
    expect(table.locator(f"tr[data-run='{second.pk}'] td").nth(3)).to_have_text("30")
    expect(page.locator(f"#overopt-source-notes p[data-run='{second.pk}']")).to_contain_text("people b")
    for chart in ("#overopt-by-step", "#overopt-by-kl"):
        # per run: proxy, gold and the best-by-gold star
        page.wait_for_function(f"() => document.querySelector('{chart}').dataset.traces === '6'")
    names = page.evaluate("() => document.querySelector('#overopt-by-step').data.map(t => t.name)")
    assert any("gold (human: people a" in n for n in names) and any(
        "gold (human: people b" in n for n in names
    )
