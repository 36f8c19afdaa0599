"""“Compare this run's checkpoints with people” (issue 28 §2): a pairwise campaign whose systems are a
run's checkpoints, and its Bradley–Terry ratings as the human gold of the run's over-optimisation
panel."""

from __future__ import annotations

from typing import Any

import pytest

from annotation import assignment, campaigns
from annotation.errors import AnnotationError
from annotation.models import Campaign, Membership
from tests.annotation.conftest import make_user

pytestmark = pytest.mark.django_db

CKPT_STEPS = [10, 20, 30]


def _run_with_checkpoints(name: str = "ckpt <run>", steps: list[int] = CKPT_STEPS) -> Any:
    from webapp.runs import ingest
    from webapp.runs.models import Checkpoint, Run, Sample

    run = Run.objects.create(name=name, status="succeeded", config={})
    rows = []
    for step in [5, *steps]:  # step 5: an evaluation without a checkpoint, never a system
        for i in range(4):
            rows.append(
                Sample(run=run, step=step, split="validation", sample_id=str(i), prompt=f"Review {i}:",
                       generation=f"step {step} answer {i}", reward=step / 100)
            )  # fmt: skip
        rows.append(Sample(run=run, step=step, split="train", sample_id="t", prompt="x", generation="train"))
    Sample.objects.bulk_create(rows)
    for step in steps:
        Checkpoint.objects.create(run=run, step=step, path=f"/tmp/none/rl-{step:06d}")
    ingest.ingest_metrics(run.pk, [("eval/reward_mean", s, s / 100) for s in [5, *steps]])
    return run


def _judge_all(camp: Campaign, users: list[Any], prefer: int) -> None:
    """Every user judges every item: the checkpoint at step ``prefer`` wins, otherwise the earlier."""

    def winner(item: Any) -> str:
        sa, sb = campaigns.checkpoint_step(item.system_a), campaigns.checkpoint_step(item.system_b)
        if prefer in (sa, sb):
            return "a" if sa == prefer else "b"
        return "a" if sa < sb else "b"

    for u in users:
        Membership.objects.get_or_create(campaign=camp, user=u)
    campaigns.start_campaign(camp)
    for u in users:
        while (a := assignment.next_item(camp, u)) is not None:
            want = winner(a.item)
            shown = "left" if (want == "a") == a.left_is_a else "right"
            assignment.record_judgment(u, a.token, item_id=a.item_id, choice=shown)


def test_campaign_over_checkpoints_pairs_their_evaluations(researcher: Any) -> None:
    run = _run_with_checkpoints()
    camp = campaigns.create_campaign_from_checkpoints("", run.pk, user=researcher, overlap=1)
    assert camp.source == campaigns.CHECKPOINTS_SOURCE
    assert camp.systems == [f"ckpt:{run.pk}:{s}" for s in CKPT_STEPS]
    assert camp.label(f"ckpt:{run.pk}:20") == f"#{run.pk} step 20"
    assert camp.name == "ckpt <run>: checkpoints"
    items = list(camp.items.all())
    assert len(items) == 4 * 3  # 4 inputs × 3 pairs of checkpoints
    for it in items:
        sa, sb = campaigns.checkpoint_step(it.system_a), campaigns.checkpoint_step(it.system_b)
        assert it.output_a == f"step {sa} answer {it.prompt[7]}"
        assert it.output_b == f"step {sb} answer {it.prompt[7]}"
        assert it.metrics_a["reward"] == sa / 100
    assert camp.build_report["run"] == run.pk and camp.build_report["checkpoints"] == CKPT_STEPS
    assert campaigns.checkpoint_campaigns(run.pk) == [camp]


def test_bad_requests_say_why(researcher: Any) -> None:
    one = _run_with_checkpoints("one", steps=[10])
    with pytest.raises(AnnotationError, match="needs at least 2"):
        campaigns.create_campaign_from_checkpoints("", one.pk)
    with pytest.raises(AnnotationError, match="run: there is no run #99999"):
        campaigns.create_campaign_from_checkpoints("", 99999)
    run = _run_with_checkpoints()
    with pytest.raises(
        AnnotationError, match=r"steps: no checkpoint with evaluation generations at step\(s\) \[5\]"
    ):
        campaigns.create_campaign_from_checkpoints("", run.pk, steps=[5, 10])


def test_human_gold_feeds_the_overopt_panel(researcher_client: Any, researcher: Any) -> None:
    run = _run_with_checkpoints()
    r = researcher_client.post(
        f"/annotate/runs/{run.pk}/checkpoints-campaign/", {"overlap": "4", "name": "people"}
    )
    camp = Campaign.objects.get(source=campaigns.CHECKPOINTS_SOURCE)
    assert r.status_code == 302 and r["Location"] == f"/annotate/campaigns/{camp.pk}/"
    assert campaigns.checkpoint_human_gold(run) == []  # no judgments yet: no gold

    _judge_all(camp, [make_user(f"h{i}") for i in range(4)], prefer=20)
    (gold,) = campaigns.checkpoint_human_gold(run)
    assert gold["key"] == f"human:{camp.pk}"
    series = gold["series"]
    assert set(series) == set(CKPT_STEPS)
    assert series[20] > series[10] > series[30]  # 20 beats both; 10 beats 30
    assert "Bradley–Terry rating" in gold["note"] and "48 human pairwise judgments" in gold["note"]

    page = researcher_client.get(f"/runs/{run.pk}/?gold=human:{camp.pk}").content.decode()
    assert f'<option value="human:{camp.pk}" selected>human: people (campaign #{camp.pk})</option>' in page
    assert 'id="overopt-best-checkpoint">20<' in page
    assert "the gold fell" not in page  # one fall after the peak: no warning at N = 3
    assert 'id="overopt-source-note"' in page
    # the panel of the run page: the campaign, and the button
    assert 'id="checkpoints-campaign-btn"' in page and f'data-campaign="{camp.pk}"' in page
    assert "ckpt &lt;run&gt;: checkpoints" in page  # the name placeholder, escaped


def test_errors_come_back_on_the_run_page(researcher_client: Any) -> None:
    one = _run_with_checkpoints("one", steps=[10, 20])
    from webapp.runs.models import Checkpoint

    Checkpoint.objects.filter(run=one, step=20).delete()
    Checkpoint.objects.create(run=one, step=25, path="/tmp/none/rl-000025")  # saved, never evaluated
    r = researcher_client.post(
        f"/annotate/runs/{one.pk}/checkpoints-campaign/", {"overlap": "x"}, follow=True
    )
    assert "Campaign not created: overlap: &#x27;x&#x27; is not a whole number" in r.content.decode()
    r = researcher_client.post(f"/annotate/runs/{one.pk}/checkpoints-campaign/", {}, follow=True)
    assert f"Campaign not created: run #{one.pk} has 1 saved checkpoint(s)" in r.content.decode()


def test_only_researchers(client: Any, annotator: Any) -> None:
    run = _run_with_checkpoints()
    url = f"/annotate/runs/{run.pk}/checkpoints-campaign/"
    r = client.post(url)
    assert r.status_code == 302 and "/accounts/login/" in r["Location"]
    client.force_login(annotator)
    r = client.post(url)
    assert r.status_code == 302 and r["Location"] == "/annotate/"
    assert not Campaign.objects.exists()
