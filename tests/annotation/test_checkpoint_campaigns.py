"""“Compare this run's checkpoints with people” (issue 28 §2): a pairwise campaign whose systems are a
run's checkpoints, and its Bradley–Terry ratings as the human gold of the run's over-optimisation
panel."""

from __future__ import annotations

import shutil
from pathlib import Path
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
        Checkpoint.objects.create(run=run, step=step, path=str(_on_disk(run.pk, step)))
    ingest.ingest_metrics(run.pk, [("eval/reward_mean", s, s / 100) for s in [5, *steps]])
    return run


def _on_disk(run_id: int, step: int) -> Path:
    """A checkpoint directory as the trainer leaves it (only its ``state.pt`` is looked at here)."""
    from webapp.runs import paths

    path = paths.runs_root() / f"run-{run_id}/checkpoints/rl-{step:06d}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "state.pt").write_bytes(b"")
    return path


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


def test_gold_regenerations_are_not_taken_as_evaluations(researcher: Any) -> None:
    """A gold job's re-generated outputs (split ``gold-regen``, at the checkpoints' steps) stay out of
    campaigns built from a run's evaluation outputs, with or without checkpoints."""
    from webapp.runs.gold_jobs import REGEN_SPLIT
    from webapp.runs.models import Sample

    run = _run_with_checkpoints()
    Sample.objects.bulk_create(
        Sample(run=run, step=step, split=REGEN_SPLIT, sample_id=str(i), prompt=f"Review {i}:",
               generation=f"regenerated {step} {i}")
        for step in [*CKPT_STEPS, 40] for i in range(4)
    )  # fmt: skip
    by_step = campaigns.checkpoint_generations(run)
    assert sorted(by_step) == CKPT_STEPS
    assert all(s.split == "validation" for rows in by_step.values() for s in rows)
    latest = campaigns.latest_eval_samples(run)
    assert latest and all(s.split == "validation" and s.step == 30 for s in latest)


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


def test_pruned_checkpoints_are_left_out_and_refused_by_name(researcher_client: Any) -> None:
    """The trainer keeps only the newest checkpoints; a pruned one is neither a system of a new
    campaign nor counted on the run page, and asking for it names it."""
    run = _run_with_checkpoints("pruned")
    shutil.rmtree(_on_disk(run.pk, 20))
    camp = campaigns.create_campaign_from_checkpoints("", run.pk, overlap=1)
    assert camp.systems == [f"ckpt:{run.pk}:10", f"ckpt:{run.pk}:30"]
    with pytest.raises(AnnotationError) as err:
        campaigns.create_campaign_from_checkpoints("", run.pk, steps=[10, 20])
    assert str(err.value) == (
        f"steps: checkpoint rl-000020 (step 20) of run #{run.pk} is no longer on disk: pruned by the "
        "run's train.keep_checkpoints (only the newest are kept) or deleted"
    )
    page = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert "this run's 2 saved checkpoints still on disk" in page
    shutil.rmtree(_on_disk(run.pk, 30))
    r = researcher_client.post(f"/annotate/runs/{run.pk}/checkpoints-campaign/", {}, follow=True)
    assert (
        f"Campaign not created: run #{run.pk} has 1 saved checkpoint(s) still on disk" in r.content.decode()
    )


def test_compare_view_shows_each_runs_human_gold(researcher_client: Any, researcher: Any) -> None:
    """The compare view offers the human golds beside the logged keys and draws them as the run page
    does: each run's newest campaign at once, or one campaign; with the notes and best checkpoints."""
    import json
    import re

    first = _run_with_checkpoints("first <run>")
    second = _run_with_checkpoints("second")
    plain = _run_with_checkpoints("no campaign")
    camps = {}
    for run, prefer, tag in ((first, 20, "a"), (second, 30, "b")):
        camps[run.pk] = campaigns.create_campaign_from_checkpoints(f"people {tag}", run.pk, overlap=2)
        _judge_all(camps[run.pk], [make_user(f"{tag}{i}") for i in range(2)], prefer=prefer)
    ids = f"{first.pk},{second.pk},{plain.pk}"

    page = researcher_client.get(f"/compare/?ids={ids}&gold=human:*").content.decode()
    assert '<option value="human:*" selected>human: each run&#x27;s newest</option>' in page
    c1 = camps[first.pk].pk
    assert (
        f'<option value="human:{c1}">#{first.pk} first &lt;run&gt; — human: people a (campaign #{c1})' in page
    )
    table = page.split('id="overopt-table"')[1].split("</table>")[0]
    rows = dict(re.findall(r'<tr data-run="(\d+)">.*?<td class="num">[^<]*</td><td class="num">[^<]*</td>'
                           r'<td class="num">(\d+)</td>', table))  # fmt: skip
    assert rows == {str(first.pk): "20", str(second.pk): "30"}  # the run without a campaign is not drawn
    notes = page.split('id="overopt-source-notes"')[1].split("</div>")[0]
    assert "first &lt;run&gt;" in notes and "Bradley–Terry rating" in notes and "relative to the" in notes
    data = json.loads(page.split('id="overopt-data" type="application/json">')[1].split("</script>")[0])
    assert [d["gold_key"] for d in data] == [
        f"human: people a (campaign #{c1})",
        f"human: people b (campaign #{camps[second.pk].pk})",
    ]
    assert [d["best_checkpoint"] for d in data] == [20, 30]

    page = researcher_client.get(f"/compare/?ids={ids}&gold=human:{c1}").content.decode()
    table = page.split('id="overopt-table"')[1].split("</table>")[0]
    assert f'data-run="{first.pk}"' in table and f'data-run="{second.pk}"' not in table
    # a logged key still works as before, and a gold nobody has says so
    page = researcher_client.get(f"/compare/?ids={ids}&gold=human:99999").content.decode()
    assert 'id="overopt-none"' in page
