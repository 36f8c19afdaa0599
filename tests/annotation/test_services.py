"""Campaign creation, upload validation, assignment, judgments, undo/skip, results and exports."""

from __future__ import annotations

import csv
import io
import json

import pytest

from annotation import services
from annotation.models import Assignment, Campaign, Item, Judgment
from tests.annotation.conftest import make_user, sentiment_upload

pytestmark = pytest.mark.django_db


def _judge_all(camp, users, pick):
    """Each user judges until nothing is left; ``pick(item, user)`` returns the stored-terms choice."""
    for u in users:
        while (a := services.next_item(camp, u)) is not None:
            want = pick(a.item, u)
            shown = (
                want if want in ("tie", "both_bad") else ("left" if (want == "a") == a.left_is_a else "right")
            )
            services.record_judgment(u, a.token, item_id=a.item_id, choice=shown, seconds=2.0)


def test_campaign_from_runs_pairs_latest_eval_samples(two_runs, researcher):
    good, bad = two_runs
    camp = services.create_campaign_from_runs("cmp", [good.pk, bad.pk], user=researcher, overlap=3)
    items = list(camp.items.all())
    assert len(items) == 6 and camp.systems == [f"run:{good.pk}", f"run:{bad.pk}"]
    for it in items:
        assert not it.output_a.startswith("old ") and it.output_a != "train"  # last eval step, eval split
        assert {it.system_a, it.system_b} == set(camp.systems)
        assert it.metrics_a["reward"] in (0.0, 1.0) and "length" in it.metrics_b
    with pytest.raises(services.AnnotationError, match="at least 2 runs"):
        services.create_campaign_from_runs("x", [good.pk])
    from tests.annotation.conftest import make_run

    other = make_run("other", ["unrelated prompt"], ["text"])
    with pytest.raises(services.AnnotationError, match="share no prompts"):
        services.create_campaign_from_runs("x", [good.pk, other.pk])
    # Likert: one item per (prompt, system); vs_baseline with 3 systems gives 2 pairs per prompt.
    lik = services.create_campaign_from_runs("lik", [good.pk], kind="likert")
    assert lik.items.count() == 6 and lik.axes[0]["name"] == "fluency"


def test_upload_all_or_nothing_names_line_and_field(researcher):
    ok = sentiment_upload(3)
    bad_lines = [
        (ok + '{"prompt": "p", "outputs": {"a": "x"}}\n', r"line 4, field 'outputs': needs at least 2"),
        (ok + '{"outputs": {"a": "x", "b": "y"}}\n', r"line 4, field 'prompt'"),
        (ok + "{not json\n", r"line 4: invalid JSON"),
        ('{"prompt": "p", "outputs": {"a": 1, "b": "y"}}\n', r"line 1, field 'outputs.a'"),
        ('{"prompt": "p", "outputs": {"a": "x", "b": "y"}, "gold": "c"}\n', r"line 1, field 'gold'"),
        (
            '{"prompt": "p", "outputs": {"a": "x", "b": "y"}, "metrics": {"a": {"m": "hi"}}}\n',
            r"field 'metrics.a'",
        ),
        (
            '{"prompt": "p", "outputs": [{"system": "a", "text": "x"}, {"system": "a", "text": "y"}]}\n',
            r"outputs\[1\].system",
        ),
    ]
    for data, pattern in bad_lines:
        with pytest.raises(services.UploadError, match=pattern):
            services.create_campaign_from_upload("bad", data, user=researcher)
    assert Campaign.objects.count() == 0 and Item.objects.count() == 0  # nothing imported
    camp = services.create_campaign_from_upload("ok", sentiment_upload(4, gold=2), user=researcher)
    assert camp.items.count() == 6 and camp.items.exclude(gold="").count() == 2
    assert camp.systems == ["pos", "neg"]  # gold systems are not ranked


def test_start_requires_items_and_enough_annotators(researcher):
    camp = services.create_campaign_from_upload("c", sentiment_upload(2), overlap=3)
    with pytest.raises(services.AnnotationError, match=r"not enough annotators: 0 joined.*overlap 3"):
        services.start_campaign(camp)
    for u in [make_user(f"u{i}") for i in range(3)]:
        services.add_member(camp, u)
    assert services.start_campaign(camp).status == "active"
    gold_only = services.create_campaign_from_upload(
        "g", '{"prompt": "p", "outputs": {"a": "x", "b": "y"}, "gold": "a"}\n', overlap=1
    )
    assert "no items to judge" in services.start_problems(gold_only)[0]


def test_assignment_least_judged_overlap_and_no_repeats():
    camp = services.create_campaign_from_upload("c", sentiment_upload(4), overlap=2)
    users = [make_user(f"u{i}") for i in range(3)]
    for u in users:
        services.add_member(camp, u)
    services.start_campaign(camp)
    # User 0 takes an item; user 1 must get a DIFFERENT (less-judged) item.
    a0 = services.next_item(camp, users[0])
    assert services.next_item(camp, users[0]).pk == a0.pk  # an open assignment is resumed, not duplicated
    a1 = services.next_item(camp, users[1])
    assert a1.item_id != a0.item_id
    _judge_all(camp, users, lambda item, u: "a")
    counts = list(Item.objects.filter(campaign=camp).values_list("judgment_count", flat=True))
    assert counts == [2, 2, 2, 2]  # every item exactly at overlap, never above
    assert Judgment.objects.count() == 8
    assert all(
        len(set(Judgment.objects.filter(item=it).values_list("annotator", flat=True))) == 2
        for it in camp.items.all()
    )


def test_tampered_replayed_and_foreign_submissions_are_rejected():
    camp = services.create_campaign_from_upload("c", sentiment_upload(3), overlap=1)
    u1, u2 = make_user("u1"), make_user("u2")
    outsider = make_user("outsider")
    services.add_member(camp, u1)
    services.add_member(camp, u2)
    services.start_campaign(camp)
    a = services.next_item(camp, u1)
    other_item = camp.items.exclude(pk=a.item_id).first()
    with pytest.raises(services.Rejected, match="not assigned to you"):
        services.record_judgment(u2, a.token, item_id=a.item_id, choice="left")
    with pytest.raises(services.Rejected, match="does not match"):
        services.record_judgment(u1, a.token, item_id=other_item.pk, choice="left")
    with pytest.raises(services.Rejected, match="not assigned to you"):
        services.record_judgment(u1, "forged-token", item_id=a.item_id, choice="left")
    with pytest.raises(services.Rejected, match="unknown choice"):
        services.record_judgment(u1, a.token, item_id=a.item_id, choice="a_sneaky_value")
    with pytest.raises(services.AnnotationError, match="not an annotator"):
        services.next_item(camp, outsider)
    j = services.record_judgment(u1, a.token, item_id=a.item_id, choice="left", seconds=3.5)
    assert j.choice == ("a" if a.left_is_a else "b") and j.left_is_a == a.left_is_a
    with pytest.raises(services.Rejected, match="duplicate"):
        services.record_judgment(u1, a.token, item_id=a.item_id, choice="right")
    assert Judgment.objects.count() == 1
    services.close_campaign(camp)
    b = Assignment.objects.create(campaign=camp, item=other_item, annotator=u2)
    with pytest.raises(services.Rejected, match="not active"):
        services.record_judgment(u2, b.token, item_id=other_item.pk, choice="left")


def test_left_right_randomisation_is_recorded_and_mapped():
    camp = services.create_campaign_from_upload("c", sentiment_upload(40), overlap=1)
    u = make_user("u")
    services.add_member(camp, u)
    services.start_campaign(camp)
    sides = []
    while (a := services.next_item(camp, u)) is not None:
        shown = services.display_item(a)
        assert "pos" not in json.dumps(shown) or "pos" in a.item.prompt  # no system ids shown
        sides.append(a.left_is_a)
        # The annotator always picks the positive text, wherever it is displayed.
        choice = "left" if shown["left"] == a.item.output_a else "right"
        if a.item.system_a == "neg":
            choice = "right" if choice == "left" else "left"
        services.record_judgment(u, a.token, item_id=a.item_id, choice=choice)
    assert 5 < sum(sides) < 35  # both placements occur
    stored = {(j.item.system_a, j.choice) for j in Judgment.objects.select_related("item")}
    assert all((s == "pos") == (c == "a") for s, c in stored)


def test_undo_and_skip_keep_counts_consistent():
    camp = services.create_campaign_from_upload("c", sentiment_upload(3), overlap=1)
    u = make_user("u")
    services.add_member(camp, u)
    services.start_campaign(camp)
    a = services.next_item(camp, u)
    services.record_judgment(u, a.token, item_id=a.item_id, choice="tie")
    b = services.next_item(camp, u)
    back = services.undo_last(camp, u)
    assert back.item_id == a.item_id and back.token != a.token and Judgment.objects.count() == 0
    assert Item.objects.get(pk=b.item_id).slots_taken == 0  # the item shown after it went back to the pool
    assert services.next_item(camp, u).pk == back.pk
    with pytest.raises(services.Rejected):
        services.record_judgment(u, a.token, item_id=a.item_id, choice="left")  # old token is dead
    services.record_judgment(u, back.token, item_id=a.item_id, choice="left")
    c = services.next_item(camp, u)
    services.skip_item(u, c.token)
    assert Item.objects.get(pk=c.item_id).slots_taken == 0
    d = services.next_item(camp, u)
    assert d.item_id not in (a.item_id, c.item_id)  # skipped items are not offered again
    assert services.progress_for(camp, u) == {"done": 1, "total": 2}


def test_results_rank_the_preferred_system_with_agreement_and_metrics():
    camp = services.create_campaign_from_upload("c", sentiment_upload(12, gold=2), overlap=3)
    users = [make_user(f"u{i}") for i in range(3)]
    for u in users:
        services.add_member(camp, u)
    services.start_campaign(camp)

    def pick(item, u):
        if item.gold:
            return "b" if u.username == "u2" else item.gold  # u2 fails the attention checks
        pos_is_a = item.system_a == "pos"
        if u.username == "u2" and item.order % 4 == 0:
            return "tie"
        return "a" if pos_is_a else "b"

    _judge_all(camp, users, pick)
    res = services.campaign_results(camp, n_bootstrap=100)
    bt = res["bradley_terry"]
    rating = dict(zip(bt["systems"], bt["rating"]))
    ranks = dict(zip(bt["systems"], bt["rank"]))
    assert rating["pos"] > rating["neg"] and ranks["pos"] == 1 and ranks["neg"] == 2
    wr = res["win_rates"]
    assert wr["rate"][0][1] > 0.85 and wr["low"][0][1] > 0.5  # pos beats neg, interval above chance
    assert (
        res["agreement"]["fleiss_kappa"] is not None and res["agreement"]["krippendorff_alpha"] > 0.3
    )  # well above chance (0)
    assert len(res["agreement"]["cohen"]) == 3
    ann = {a["annotator"]: a for a in res["annotators"]}
    assert ann["u0"]["gold_accuracy"] == 1.0 and ann["u2"]["gold_accuracy"] == 0.0
    # Claimed seconds are clamped to the wall time the server saw (+1 s), so they cannot be inflated.
    assert ann["u0"]["count"] == 14 and 0 < ann["u0"]["median_seconds"] <= 2.0
    ma = res["metric_agreement"]
    assert (
        ma["positivity"]["agreement"] == 1.0
        and ma["positivity"]["tau"] == 1.0
        and ma["positivity"]["n"] == 12
    )
    # Exports: JSONL pairs prompt/chosen/rejected with metadata, CSV with one row per judgment.
    pairs = [json.loads(x) for x in services.export_jsonl(camp).splitlines()]
    assert pairs and all(set(p) == {"prompt", "chosen", "rejected", "meta"} for p in pairs)
    assert all(p["meta"]["system_chosen"] == "pos" for p in pairs)
    rows = list(csv.DictReader(io.StringIO(services.export_csv(camp))))
    assert len(rows) == Judgment.objects.count() == 42
    assert {r["winner"] for r in rows} <= {"pos", "neg", "good", "bad", ""}


def test_likert_campaign_scores_and_results():
    data = "\n".join(
        json.dumps({"prompt": f"p{i}", "outputs": {"s1": f"fine text {i}", "s2": f"poor {i}"}})
        for i in range(3)
    )
    camp = services.create_campaign_from_upload("lik", data, kind="likert", overlap=2)
    users = [make_user(f"u{i}") for i in range(2)]
    for u in users:
        services.add_member(camp, u)
    services.start_campaign(camp)
    for u in users:
        while (a := services.next_item(camp, u)) is not None:
            hi = a.item.system_a == "s1"
            with pytest.raises(services.Rejected, match="relevance"):
                services.record_judgment(u, a.token, scores={"fluency": 5})
            with pytest.raises(services.Rejected, match="1–5"):
                services.record_judgment(u, a.token, scores={"fluency": 9, "relevance": 1})
            services.record_judgment(
                u, a.token, scores={"fluency": 5 if hi else 2, "relevance": 4 if hi else 1}
            )
    res = services.campaign_results(camp)
    assert res["likert"]["fluency"]["s1"]["mean"] == 5 and res["likert"]["fluency"]["s2"]["mean"] == 2
    assert res["agreement"]["per_axis"]["fluency"]["krippendorff_alpha"] == 1.0


def test_human_eval_for_run_and_leaderboard(two_runs):
    good, bad = two_runs
    camp = services.create_campaign_from_runs("cmp", [good.pk, bad.pk], overlap=1)
    u = make_user("u")
    services.add_member(camp, u)
    services.start_campaign(camp)
    _judge_all(camp, [u], lambda item, _u: "a" if item.system_a == f"run:{good.pk}" else "b")
    he = services.human_eval_for_run(good)
    assert he[0]["campaign_id"] == camp.pk and he[0]["rank"] == 1 and he[0]["win_rate"] == 1.0
    assert services.human_eval_for_run(bad)[0]["rating"] < he[0]["rating"]
    board = services.leaderboard()[0]
    assert [r["run_id"] for r in board["rows"]] == [good.pk, bad.pk]


def test_expired_reservations_are_reclaimed_when_nothing_else_is_left():
    from datetime import timedelta

    from django.utils import timezone

    camp = services.create_campaign_from_upload("c", sentiment_upload(1), overlap=1)
    gone, other = make_user("gone"), make_user("other")
    services.add_member(camp, gone)
    services.add_member(camp, other)
    services.start_campaign(camp)
    stale = services.next_item(camp, gone)  # then the tab is closed
    assert services.next_item(camp, other) is None  # the only slot is reserved
    Assignment.objects.filter(pk=stale.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    fresh = services.next_item(camp, other)
    assert fresh is not None and fresh.item_id == stale.item_id
    assert Item.objects.get(pk=fresh.item_id).slots_taken == 1  # released once, taken once
    with pytest.raises(services.Rejected, match="already submitted or skipped"):
        services.record_judgment(gone, stale.token, item_id=stale.item_id, choice="left")


def test_run_page_panel_tag_renders_human_eval(two_runs):
    from django.template import Context, Template

    good, bad = two_runs
    tpl = Template("{% load annotation_tags %}{% human_eval_panel run %}")
    assert "Not in any started annotation campaign" in tpl.render(Context({"run": good}))
    camp = services.create_campaign_from_runs("panel", [good.pk, bad.pk], overlap=1)
    u = make_user("u")
    services.add_member(camp, u)
    services.start_campaign(camp)
    _judge_all(camp, [u], lambda item, _u: "a" if item.system_a == f"run:{good.pk}" else "b")
    html = tpl.render(Context({"run": good}))
    assert "panel" in html and "1 of 2" in html


def test_likert_axes_presets_follow_rl4lms_templates():
    from annotation.models import AXES_PRESETS

    assert [a["name"] for a in AXES_PRESETS["imdb"]] == ["coherence", "sentiment"]
    assert [a["name"] for a in AXES_PRESETS["commongen"]] == ["fluency", "commonsense"]
    data = json.dumps({"prompt": "p", "outputs": {"s": "t"}})
    camp = services.create_campaign_from_upload("lik", data, kind="likert", axes=AXES_PRESETS["commongen"])
    assert camp.axes == AXES_PRESETS["commongen"]


def test_csv_export_neutralises_formulas_and_signup_validates_names():
    data = json.dumps({"prompt": '=HYPERLINK("http://evil")', "outputs": {"a": "+1", "b": "fine"}})
    camp = services.create_campaign_from_upload("f", data, overlap=1)
    u = make_user("u")
    services.add_member(camp, u)
    services.start_campaign(camp)
    a = services.next_item(camp, u)
    services.record_judgment(u, a.token, item_id=a.item_id, choice="left", rationale="@cmd")
    row = next(csv.DictReader(io.StringIO(services.export_csv(camp))))
    assert row["prompt"].startswith("'=") and row["rationale"] == "'@cmd"
    assert "'+1" in (row["output_a"], row["output_b"])
    inv = services.create_invite(camp)
    with pytest.raises(services.AnnotationError, match="letters, numbers"):
        services.signup_with_invite(inv.token, "bad name <script>", "a-long-password")


def test_removed_annotator_cannot_submit_an_open_assignment():
    camp = services.create_campaign_from_upload("c", sentiment_upload(2), overlap=1)
    u = make_user("u")
    services.add_member(camp, u)
    services.start_campaign(camp)
    a = services.next_item(camp, u)
    camp.memberships.filter(user=u).delete()
    with pytest.raises(services.Rejected, match="not an annotator"):
        services.record_judgment(u, a.token, item_id=a.item_id, choice="left")
    assert Judgment.objects.count() == 0


def test_run_page_shows_its_human_evaluation(two_runs, researcher_client):
    """The run page (platform view) embeds the campaign ranking of that run."""
    good, bad = two_runs
    camp = services.create_campaign_from_runs("judged-on-run-page", [good.pk, bad.pk], overlap=1)
    u = make_user("judge")
    services.add_member(camp, u)
    services.start_campaign(camp)
    _judge_all(camp, [u], lambda item, _u: "a" if item.system_a == f"run:{good.pk}" else "b")
    html = researcher_client.get(f"/runs/{good.pk}/").content.decode()
    assert 'id="human-eval"' in html and "judged-on-run-page" in html and "1 of 2" in html
