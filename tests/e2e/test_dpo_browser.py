"""Campaign → DPO in a real browser (Debian chromium, daphne, PostgreSQL, the real Celery worker).

A researcher opens a judged campaign's results page, presses "Fine-tune with DPO on these
judgments", lands on the launch form prefilled by the server (DPO, the exported pairs file, the judged
runs' model), launches, and the worker trains the DPO run to the end with its preference metrics stored.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from annotation import assignment, campaigns, invites
from tests.annotation.conftest import NEGATIVE, POSITIVE, make_run, make_user

pytestmark = [pytest.mark.e2e]


@pytest.mark.django_db(transaction=True)
def test_results_page_to_a_finished_dpo_run(
    page: Any, live_server_with_worker: Any, researcher: Any, login: Any, wait_for: Any, runs_dir: Path
) -> None:
    from webapp.runs.models import MetricPoint, Run

    prompts = [f"Prompt number {i}:" for i in range(6)]
    good = make_run("good-run", prompts, [f"a {POSITIVE[i]} answer" for i in range(6)])
    bad = make_run("bad-run", prompts, [f"a {NEGATIVE[i]} answer" for i in range(6)])
    for run in (good, bad):
        run.config = {"model": {"name_or_path": "builtin:tiny-gpt2", "mixed_precision": "no"}}
        run.save(update_fields=["config"])
    camp = campaigns.create_campaign_from_runs("dpo campaign", [good.pk, bad.pk], overlap=1)
    judge = make_user("dpo-judge")
    invites.add_member(camp, judge)
    campaigns.start_campaign(camp)
    while (a := assignment.next_item(camp, judge)) is not None:
        good_left = (a.item.system_a == f"run:{good.pk}") == a.left_is_a
        assignment.record_judgment(judge, a.token, item_id=a.item_id, choice="left" if good_left else "right")

    base = live_server_with_worker.url
    results = f"/annotate/campaigns/{camp.pk}/results/"
    login(page, base, researcher, next_url=results)
    page.click("#dpo-button")
    page.wait_for_url(f"{base}/launch/?dpo_campaign={camp.pk}")
    expect(page.get_by_text("6 preference pairs exported")).to_be_visible()
    expect(page.locator("select[name=algorithm__id]")).to_have_value("dpo")
    pairs = runs_dir / "preference_pairs" / f"campaign-{camp.pk}-pairs.jsonl"
    expect(page.locator("[name=task__id]")).to_have_value("preference_pairs")
    assert str(pairs) in page.content()  # task.args carries the exported file
    expect(page.locator("[name=model__name_or_path]")).to_have_value("builtin:tiny-gpt2")

    page.click("#launch-btn")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    run = Run.objects.get(name=f"DPO on {camp.name}")
    assert run.config["algorithm"]["id"] == "dpo" and run.config["task"]["args"]["path"] == str(pairs)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).is_finished, timeout=420, interval=0.5, what="DPO run finished"
    )
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    keys = set(MetricPoint.objects.filter(run=run).values_list("key", flat=True))
    assert {"train/loss", "rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy"} <= keys
    first = MetricPoint.objects.filter(run=run, key="train/loss").order_by("step").first()
    assert abs(first.value - 0.6931) < 1e-3  # policy == reference at the first step
