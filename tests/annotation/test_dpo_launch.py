"""Campaign → DPO through the Django test client: the results page's button exports the decided
pairs into the runs directory and opens the launch form prefilled by the server from the campaign id;
researchers only; bad ids and Likert campaigns give clear errors; the prefilled config is valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from annotation import assignment, campaigns, dpo, invites
from annotation.models import CampaignKind
from engine.config import parse_config
from tests.annotation.conftest import NEGATIVE, POSITIVE, make_run, make_user

pytestmark = pytest.mark.django_db


def _judged_campaign(kind: str = CampaignKind.PAIRWISE):
    prompts = [f"Prompt number {i}:" for i in range(6)]
    good = make_run("good-run", prompts, [f"a {POSITIVE[i]} answer" for i in range(6)])
    bad = make_run("bad-run", prompts, [f"a {NEGATIVE[i]} answer" for i in range(6)])
    for run in (good, bad):
        run.config = {"model": {"name_or_path": "builtin:tiny-gpt2", "mixed_precision": "no"}}
        run.save(update_fields=["config"])
    camp = campaigns.create_campaign_from_runs("judged", [good.pk, bad.pk], kind=kind, overlap=1)
    judge = make_user(f"judge-{kind}")
    invites.add_member(camp, judge)
    campaigns.start_campaign(camp)
    if kind == CampaignKind.PAIRWISE:
        while (a := assignment.next_item(camp, judge)) is not None:
            good_left = (a.item.system_a == f"run:{good.pk}") == a.left_is_a
            assignment.record_judgment(
                judge, a.token, item_id=a.item_id, choice="left" if good_left else "right"
            )
    return camp, good


def test_results_button_exports_pairs_and_prefills_the_launch_form(researcher_client, runs_dir):
    camp, good = _judged_campaign()
    page = researcher_client.get(f"/annotate/campaigns/{camp.pk}/results/").content.decode()
    assert f'action="/annotate/campaigns/{camp.pk}/dpo/"' in page
    assert "Fine-tune with DPO on these judgments" in page

    resp = researcher_client.post(f"/annotate/campaigns/{camp.pk}/dpo/")
    assert resp.status_code == 302 and resp["Location"] == f"/launch/?dpo_campaign={camp.pk}"
    path = Path(runs_dir) / "preference_pairs" / f"campaign-{camp.pk}-pairs.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(rows) == 6  # one decided judgment per prompt
    assert all(r["chosen"].split()[1] in POSITIVE and r["rejected"].split()[1] in NEGATIVE for r in rows)

    launch = researcher_client.get(resp["Location"])
    assert launch.status_code == 200
    initial = launch.context["form"].initial_config
    assert initial["algorithm"]["id"] == "dpo"
    assert (
        initial["algorithm"]["dpo"]["beta"] == 0.1 and initial["algorithm"]["dpo"]["loss_type"] == "sigmoid"
    )
    assert initial["task"] == {
        "id": "preference_pairs",
        "args": {"path": str(path), "heldout_fraction": 0.0},
        **{k: initial["task"][k] for k in initial["task"] if k not in ("id", "args")},
    }
    assert initial["model"]["name_or_path"] == "builtin:tiny-gpt2"  # the judged runs' model
    assert initial["train"]["prompts_per_iter"] == 6 and initial["train"]["n_iters"] == 3  # 3 epochs
    cfg = parse_config(initial)  # a valid run config, as the form will submit it
    assert cfg.algorithm.id == "dpo" and cfg.task.args["path"] == str(path)
    html = launch.content.decode()
    assert "preference_pairs" in html and "6 preference pairs exported" in html
    # The form, generated from the schema, has the DPO and LoRA sections.
    for field in (
        "algorithm__dpo__beta",
        "algorithm__dpo__loss_type",
        "model__lora__enabled",
        "model__lora__r",
    ):
        assert f'name="{field}"' in html, field


def test_only_researchers_and_only_pairwise_campaigns(client, researcher, annotator):
    camp, _ = _judged_campaign()
    client.force_login(annotator)
    r = client.post(f"/annotate/campaigns/{camp.pk}/dpo/")
    assert r.status_code in (302, 403) and not dpo.pairs_path(camp).exists()
    client.force_login(researcher)
    assert client.get(f"/annotate/campaigns/{camp.pk}/dpo/").status_code == 405  # POST only

    likert, _ = _judged_campaign(CampaignKind.LIKERT)
    r = client.post(f"/annotate/campaigns/{likert.pk}/dpo/", follow=True)
    assert "Cannot fine-tune with DPO: DPO needs pairwise judgments" in r.content.decode()
    assert not dpo.pairs_path(likert).exists()


def test_launch_source_errors_are_shown_escaped(researcher_client):
    camp, _ = _judged_campaign()
    html = researcher_client.get("/launch/?dpo_campaign=<b>x</b>").content.decode()
    assert "dpo_campaign: &#x27;&lt;b&gt;x&lt;/b&gt;&#x27; is not a campaign id" in html
    html = researcher_client.get("/launch/?dpo_campaign=999999").content.decode()
    assert "dpo_campaign: no campaign #999999" in html
    # Not exported yet: the launch form says how to do it instead of pointing at a missing file.
    html = researcher_client.get(f"/launch/?dpo_campaign={camp.pk}").content.decode()
    assert "its pairs are not exported yet" in html
