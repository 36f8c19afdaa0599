"""Campaign creation, upload validation, assignment, judgments, undo/skip, results and exports."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from annotation import assignment, campaigns, exports, invites, results, uploads
from annotation.errors import AnnotationError, Rejected, UploadError
from annotation.models import Assignment, Campaign, Item, Judgment
from annotation.pairs import preference_pairs
from tests.annotation.conftest import make_user, sentiment_upload

pytestmark = pytest.mark.django_db


def _judge_all(camp, users, pick):
    """Each user judges until nothing is left; ``pick(item, user)`` returns the stored-terms choice."""
    for u in users:
        while (a := assignment.next_item(camp, u)) is not None:
            want = pick(a.item, u)
            shown = (
                want if want in ("tie", "both_bad") else ("left" if (want == "a") == a.left_is_a else "right")
            )
            assignment.record_judgment(u, a.token, item_id=a.item_id, choice=shown, seconds=2.0)


def test_campaign_from_runs_pairs_latest_eval_samples(two_runs, researcher):
    good, bad = two_runs
    camp = campaigns.create_campaign_from_runs("cmp", [good.pk, bad.pk], user=researcher, overlap=3)
    items = list(camp.items.all())
    assert len(items) == 6 and camp.systems == [f"run:{good.pk}", f"run:{bad.pk}"]
    for it in items:
        assert not it.output_a.startswith("old ") and it.output_a != "train"  # last eval step, eval split
        assert {it.system_a, it.system_b} == set(camp.systems)
        assert it.metrics_a["reward"] in (0.0, 1.0) and "length" in it.metrics_b
    with pytest.raises(AnnotationError, match="at least 2 runs"):
        campaigns.create_campaign_from_runs("x", [good.pk])
    from tests.annotation.conftest import make_run

    other = make_run("other", ["unrelated prompt"], ["text"])
    with pytest.raises(AnnotationError, match="share no prompts"):
        campaigns.create_campaign_from_runs("x", [good.pk, other.pk])
    # Likert: one item per (prompt, system); vs_baseline with 3 systems gives 2 pairs per prompt.
    lik = campaigns.create_campaign_from_runs("lik", [good.pk], kind="likert")
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
            r"line 1, field 'metrics.a.m': must be a number",
        ),
        (
            '{"prompt": "p", "outputs": [{"system": "a", "text": "x"}, {"system": "a", "text": "y"}]}\n',
            r"outputs\[1\].system",
        ),
    ]
    for data, pattern in bad_lines:
        with pytest.raises(UploadError, match=pattern):
            uploads.create_campaign_from_upload("bad", data, user=researcher)
    assert Campaign.objects.count() == 0 and Item.objects.count() == 0  # nothing imported
    camp = uploads.create_campaign_from_upload("ok", sentiment_upload(4, gold=2), user=researcher)
    assert camp.items.count() == 6 and camp.items.exclude(gold="").count() == 2
    assert camp.systems == ["pos", "neg"]  # gold systems are not ranked


def test_start_requires_items_and_enough_annotators(researcher):
    camp = uploads.create_campaign_from_upload("c", sentiment_upload(2), overlap=3)
    with pytest.raises(AnnotationError, match=r"not enough annotators: 0 joined.*overlap 3"):
        campaigns.start_campaign(camp)
    for u in [make_user(f"u{i}") for i in range(3)]:
        invites.add_member(camp, u)
    assert campaigns.start_campaign(camp).status == "active"
    gold_only = uploads.create_campaign_from_upload(
        "g", '{"prompt": "p", "outputs": {"a": "x", "b": "y"}, "gold": "a"}\n', overlap=1
    )
    assert "no items to judge" in campaigns.start_problems(gold_only)[0]


def test_assignment_least_judged_overlap_and_no_repeats():
    camp = uploads.create_campaign_from_upload("c", sentiment_upload(4), overlap=2)
    users = [make_user(f"u{i}") for i in range(3)]
    for u in users:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    # User 0 takes an item; user 1 must get a DIFFERENT (less-judged) item.
    a0 = assignment.next_item(camp, users[0])
    assert assignment.next_item(camp, users[0]).pk == a0.pk  # an open assignment is resumed, not duplicated
    a1 = assignment.next_item(camp, users[1])
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
    camp = uploads.create_campaign_from_upload("c", sentiment_upload(3), overlap=1)
    u1, u2 = make_user("u1"), make_user("u2")
    outsider = make_user("outsider")
    invites.add_member(camp, u1)
    invites.add_member(camp, u2)
    campaigns.start_campaign(camp)
    a = assignment.next_item(camp, u1)
    other_item = camp.items.exclude(pk=a.item_id).first()
    with pytest.raises(Rejected, match="not assigned to you"):
        assignment.record_judgment(u2, a.token, item_id=a.item_id, choice="left")
    with pytest.raises(Rejected, match="does not match"):
        assignment.record_judgment(u1, a.token, item_id=other_item.pk, choice="left")
    with pytest.raises(Rejected, match="not assigned to you"):
        assignment.record_judgment(u1, "forged-token", item_id=a.item_id, choice="left")
    with pytest.raises(Rejected, match="unknown choice"):
        assignment.record_judgment(u1, a.token, item_id=a.item_id, choice="a_sneaky_value")
    with pytest.raises(AnnotationError, match="not an annotator"):
        assignment.next_item(camp, outsider)
    j = assignment.record_judgment(u1, a.token, item_id=a.item_id, choice="left", seconds=3.5)
    assert j.choice == ("a" if a.left_is_a else "b") and j.left_is_a == a.left_is_a
    with pytest.raises(Rejected, match="duplicate"):
        assignment.record_judgment(u1, a.token, item_id=a.item_id, choice="right")
    assert Judgment.objects.count() == 1
    campaigns.close_campaign(camp)
    b = Assignment.objects.create(campaign=camp, item=other_item, annotator=u2)
    with pytest.raises(Rejected, match="not active"):
        assignment.record_judgment(u2, b.token, item_id=other_item.pk, choice="left")


def _fair_coin_bounds(n: int, alpha: float = 1e-6) -> tuple[int, int]:
    """The central range of Binomial(n, 1/2) that a fair coin leaves with probability below ``alpha``
    (two-sided, exact): outside it the placement is biased, not unlucky."""
    tail, k = 0.0, -1
    while tail + math.comb(n, k + 1) / 2**n <= alpha / 2:
        k += 1
        tail += math.comb(n, k) / 2**n
    return k + 1, n - k - 1


def test_left_right_randomisation_is_recorded_and_mapped():
    # 200 items: a fair coin lands in [66, 134] except once in a million runs, while an 85/15 bias
    # (mean 170) passes with probability 2e-10 and a 70/30 one with 0.2 (with 40 items and 5 < n < 35,
    # an 85/15 bias passed half the time).
    n_items = 200
    lo, hi = _fair_coin_bounds(n_items)
    assert (lo, hi) == (66, 134)
    camp = uploads.create_campaign_from_upload("c", sentiment_upload(n_items), overlap=1)
    u = make_user("u")
    invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    sides = []
    while (a := assignment.next_item(camp, u)) is not None:
        shown = assignment.display_item(a)
        # No system ids shown. The token is 32 random letters and digits: one of them spells "pos" in
        # about one run of this test in forty (200 tokens), so it is checked for what it is and left out.
        assert shown["token"] == a.token
        visible = {k: v for k, v in shown.items() if k != "token"}
        assert "pos" not in json.dumps(visible) or "pos" in a.item.prompt
        sides.append(a.left_is_a)
        # The annotator always picks the positive text, wherever it is displayed.
        choice = "left" if shown["left"] == a.item.output_a else "right"
        if a.item.system_a == "neg":
            choice = "right" if choice == "left" else "left"
        assignment.record_judgment(u, a.token, item_id=a.item_id, choice=choice)
    assert len(sides) == n_items
    assert lo <= sum(sides) <= hi, sum(sides)  # each placement about half the time
    stored = {(j.item.system_a, j.choice) for j in Judgment.objects.select_related("item")}
    assert all((s == "pos") == (c == "a") for s, c in stored)


def test_claimed_seconds_are_clamped_to_the_time_the_item_was_on_screen():
    """A client claims how long its annotator looked; the server keeps the claim when it is possible and
    cuts it to the time since the item was served + 1 s when it is not. The item is served 1000 s in the
    past (served_at moved back), so the bounds below do not depend on how fast the test runs."""
    camp = uploads.create_campaign_from_upload("c", sentiment_upload(3), overlap=1)
    u = make_user("u")
    invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    stored = []
    for claim in (3.0, 100_000.0, None):
        a = assignment.next_item(camp, u)
        Assignment.objects.filter(pk=a.pk).update(served_at=timezone.now() - timedelta(seconds=1000))
        a.refresh_from_db()
        j = assignment.record_judgment(u, a.token, item_id=a.item_id, choice="left", seconds=claim)
        stored.append(j.seconds)
    assert stored[0] == 3.0  # possible: kept as claimed
    assert 1001.0 <= stored[1] < 100_000.0  # inflated: cut to the time on screen + 1 s
    assert 1000.0 <= stored[2] < 1001.0 + 3600  # no claim: the time on screen


def test_undo_and_skip_keep_counts_consistent():
    camp = uploads.create_campaign_from_upload("c", sentiment_upload(3), overlap=1)
    u = make_user("u")
    invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    a = assignment.next_item(camp, u)
    assignment.record_judgment(u, a.token, item_id=a.item_id, choice="tie")
    b = assignment.next_item(camp, u)
    back = assignment.undo_last(camp, u)
    assert back.item_id == a.item_id and back.token != a.token and Judgment.objects.count() == 0
    assert Item.objects.get(pk=b.item_id).slots_taken == 0  # the item shown after it went back to the pool
    assert assignment.next_item(camp, u).pk == back.pk
    with pytest.raises(Rejected):
        assignment.record_judgment(u, a.token, item_id=a.item_id, choice="left")  # old token is dead
    assignment.record_judgment(u, back.token, item_id=a.item_id, choice="left")
    c = assignment.next_item(camp, u)
    assignment.skip_item(u, c.token)
    assert Item.objects.get(pk=c.item_id).slots_taken == 0  # the slot is free for others at once
    assert assignment.progress_for(camp, u) == {"done": 1, "total": 3, "skipped": 1}  # not shrunk
    d = assignment.next_item(camp, u)
    assert d.item_id not in (a.item_id, c.item_id)  # unseen items come first


def test_skipped_items_come_back_once_at_the_end_of_the_queue():
    camp = uploads.create_campaign_from_upload("c", sentiment_upload(3), overlap=1)
    u = make_user("u")
    invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    first = assignment.next_item(camp, u)
    assignment.skip_item(u, first.token)
    served = []
    while (a := assignment.next_item(camp, u)) is not None and a.item_id != first.item_id:
        served.append(a.item_id)
        assignment.record_judgment(u, a.token, item_id=a.item_id, choice="left")
    assert len(served) == 2 and a is not None  # the skipped item came back after the other two
    assert a.item_id == first.item_id and a.token != first.token and a.status == "open"
    with pytest.raises(Rejected):
        assignment.record_judgment(u, first.token, item_id=first.item_id, choice="left")  # old token is dead
    assert assignment.progress_for(camp, u) == {"done": 2, "total": 3, "skipped": 0}
    assignment.skip_item(u, a.token)  # skipped a second time: final for this annotator
    assert assignment.next_item(camp, u) is None
    assert assignment.progress_for(camp, u) == {"done": 2, "total": 2, "skipped": 0}
    assert Item.objects.get(pk=first.item_id).slots_taken == 0  # still open to everyone else
    other = make_user("other")
    invites.add_member(camp, other)
    assert assignment.next_item(camp, other).item_id == first.item_id


def test_a_skipped_item_filled_by_others_does_not_come_back():
    camp = uploads.create_campaign_from_upload("c", sentiment_upload(1), overlap=1)
    u, v = make_user("u"), make_user("v")
    invites.add_member(camp, u)
    invites.add_member(camp, v)
    campaigns.start_campaign(camp)
    a = assignment.next_item(camp, u)
    assignment.skip_item(u, a.token)
    b = assignment.next_item(camp, v)
    assert b.item_id == a.item_id
    assignment.record_judgment(v, b.token, item_id=b.item_id, choice="tie")
    assert assignment.next_item(camp, u) is None  # the only slot went to v: nothing over the overlap
    assert assignment.progress_for(camp, u) == {"done": 0, "total": 0, "skipped": 0}


def test_results_rank_the_preferred_system_with_agreement_and_metrics():
    camp = uploads.create_campaign_from_upload("c", sentiment_upload(12, gold=2), overlap=3)
    users = [make_user(f"u{i}") for i in range(3)]
    for u in users:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)

    def pick(item, u):
        if item.gold:
            return "b" if u.username == "u2" else item.gold  # u2 fails the attention checks
        pos_is_a = item.system_a == "pos"
        if u.username == "u2" and item.order % 4 == 0:
            return "tie"
        return "a" if pos_is_a else "b"

    _judge_all(camp, users, pick)
    res = results.campaign_results(camp)
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
    # The annotator's median is that of their stored seconds (the clamp itself: the test below).
    stored = sorted(Judgment.objects.filter(annotator=users[0]).values_list("seconds", flat=True))
    assert ann["u0"]["count"] == 14 == len(stored)
    assert ann["u0"]["median_seconds"] == pytest.approx((stored[6] + stored[7]) / 2)
    ma = res["metric_agreement"]
    assert (
        ma["positivity"]["agreement"] == 1.0
        and ma["positivity"]["tau"] == 1.0
        and ma["positivity"]["n"] == 12
    )
    # Exports: JSONL pairs prompt/chosen/rejected with metadata, CSV with one row per judgment.
    pairs = [json.loads(x) for x in exports.export_jsonl(camp).splitlines()]
    assert pairs and all(set(p) == {"prompt", "chosen", "rejected", "meta"} for p in pairs)
    assert all(p["meta"]["system_chosen"] == "pos" for p in pairs)
    rows = list(csv.DictReader(io.StringIO(exports.export_csv(camp))))
    assert len(rows) == Judgment.objects.count() == 42
    assert {r["winner"] for r in rows} <= {"pos", "neg", "good", "bad", ""}


def test_likert_campaign_scores_and_results():
    data = "\n".join(
        json.dumps({"prompt": f"p{i}", "outputs": {"s1": f"fine text {i}", "s2": f"poor {i}"}})
        for i in range(3)
    )
    camp = uploads.create_campaign_from_upload("lik", data, kind="likert", overlap=2)
    users = [make_user(f"u{i}") for i in range(2)]
    for u in users:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    for u in users:
        while (a := assignment.next_item(camp, u)) is not None:
            hi = a.item.system_a == "s1"
            with pytest.raises(Rejected, match="relevance"):
                assignment.record_judgment(u, a.token, scores={"fluency": 5})
            with pytest.raises(Rejected, match="1–5"):
                assignment.record_judgment(u, a.token, scores={"fluency": 9, "relevance": 1})
            assignment.record_judgment(
                u, a.token, scores={"fluency": 5 if hi else 2, "relevance": 4 if hi else 1}
            )
    res = results.campaign_results(camp)
    assert res["likert"]["fluency"]["s1"]["mean"] == 5 and res["likert"]["fluency"]["s2"]["mean"] == 2
    assert res["agreement"]["per_axis"]["fluency"]["krippendorff_alpha"] == 1.0


def test_same_ranking_everywhere_and_too_little_data_below_the_threshold(two_runs, researcher_client):
    """Results page, human leaderboard and run page show one function's numbers for a campaign; below
    ANNOTATION_MIN_COMPARISONS (10) comparisons per system nothing is ranked."""
    good, bad = two_runs
    camp = campaigns.create_campaign_from_runs("cmp", [good.pk, bad.pk], overlap=2)
    u1, u2 = make_user("u1"), make_user("u2")
    invites.add_member(camp, u1)
    invites.add_member(camp, u2)
    campaigns.start_campaign(camp)
    good_wins = lambda item, _u: "a" if item.system_a == f"run:{good.pk}" else "b"  # noqa: E731
    _judge_all(camp, [u1], good_wins)  # 6 comparisons per system

    def intervals(html: str) -> list[str]:
        return re.findall(r'class="num bt-interval">([^<]+)<', html)

    he = results.human_eval_for_run(good)[0]
    assert he["rank"] is None and "Too little data to rank" in he["message"] and "has 6" in he["message"]
    res = results.campaign_results(camp)
    board = results.leaderboard()[0]
    assert res["ranking"]["rows"] == board["ranking"]["rows"]  # the same ratings and intervals
    assert (he["low"], he["high"]) == (
        board["ranking"]["rows"][0]["low"],
        board["ranking"]["rows"][0]["high"],
    )
    results_html = researcher_client.get(f"/annotate/campaigns/{camp.pk}/results/").content.decode()
    board_html = researcher_client.get("/annotate/leaderboard/").content.decode()
    run_html = researcher_client.get(f"/runs/{good.pk}/").content.decode()
    assert intervals(results_html) == intervals(board_html) and len(intervals(results_html)) == 2
    for html in (results_html, board_html):
        assert "Too little data to rank" in html
    assert "too little data to rank" in run_html

    _judge_all(camp, [u2], good_wins)  # 12 comparisons per system: ranked
    he = results.human_eval_for_run(good)[0]
    assert he["campaign_id"] == camp.pk and he["rank"] == 1 and he["win_rate"] == 1.0 and he["n"] == 12
    worse = results.human_eval_for_run(bad)[0]
    assert worse["rank"] == 2 and worse["high"] < he["low"]
    board = results.leaderboard()[0]
    assert [r["run_id"] for r in board["ranking"]["rows"]] == [good.pk, bad.pk]
    results_html = researcher_client.get(f"/annotate/campaigns/{camp.pk}/results/").content.decode()
    board_html = researcher_client.get("/annotate/leaderboard/").content.decode()
    assert intervals(results_html) == intervals(board_html) and "Too little data" not in board_html


def test_expired_reservations_are_reclaimed_when_nothing_else_is_left():
    from datetime import timedelta

    from django.utils import timezone

    camp = uploads.create_campaign_from_upload("c", sentiment_upload(1), overlap=1)
    gone, other = make_user("gone"), make_user("other")
    invites.add_member(camp, gone)
    invites.add_member(camp, other)
    campaigns.start_campaign(camp)
    stale = assignment.next_item(camp, gone)  # then the tab is closed
    assert assignment.next_item(camp, other) is None  # the only slot is reserved
    Assignment.objects.filter(pk=stale.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    fresh = assignment.next_item(camp, other)
    assert fresh is not None and fresh.item_id == stale.item_id
    assert Item.objects.get(pk=fresh.item_id).slots_taken == 1  # released once, taken once
    with pytest.raises(Rejected, match="already submitted or skipped"):
        assignment.record_judgment(gone, stale.token, item_id=stale.item_id, choice="left")


def test_run_page_panel_renders_human_eval(two_runs, settings, rf):
    """The panel the annotation app registers with the runs app (webapp.runs.extensions)."""
    from annotation.plugins import human_eval_panel
    from webapp.runs import extensions

    settings.ANNOTATION_MIN_COMPARISONS = 5
    good, bad = two_runs
    assert "human-eval" in [name for name, _ in extensions.run_panels(rf.get("/"), good)]
    assert "Not in any started annotation campaign" in human_eval_panel(rf.get("/"), good)
    camp = campaigns.create_campaign_from_runs("panel", [good.pk, bad.pk], overlap=1)
    u = make_user("u")
    invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    _judge_all(camp, [u], lambda item, _u: "a" if item.system_a == f"run:{good.pk}" else "b")
    html = human_eval_panel(rf.get("/"), good)
    assert "panel" in html and "1 of 2" in html


def test_likert_axes_presets_follow_rl4lms_templates():
    from annotation.models import AXES_PRESETS

    assert [a["name"] for a in AXES_PRESETS["imdb"]] == ["coherence", "sentiment"]
    assert [a["name"] for a in AXES_PRESETS["commongen"]] == ["fluency", "commonsense"]
    data = json.dumps({"prompt": "p", "outputs": {"s": "t"}})
    camp = uploads.create_campaign_from_upload("lik", data, kind="likert", axes=AXES_PRESETS["commongen"])
    assert camp.axes == AXES_PRESETS["commongen"]


def test_csv_export_neutralises_formulas_and_signup_validates_names():
    data = json.dumps({"prompt": '=HYPERLINK("http://evil")', "outputs": {"a": "+1", "b": "fine"}})
    camp = uploads.create_campaign_from_upload("f", data, overlap=1)
    u = make_user("u")
    invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    a = assignment.next_item(camp, u)
    assignment.record_judgment(u, a.token, item_id=a.item_id, choice="left", rationale="@cmd")
    row = next(csv.DictReader(io.StringIO(exports.export_csv(camp))))
    assert row["prompt"].startswith("'=") and row["rationale"] == "'@cmd"
    assert "'+1" in (row["output_a"], row["output_b"])
    inv = invites.create_invite(camp)
    with pytest.raises(AnnotationError, match="letters, numbers"):
        invites.signup_with_invite(inv.token, "bad name <script>", "a-long-password")


def test_removed_annotator_cannot_submit_an_open_assignment():
    camp = uploads.create_campaign_from_upload("c", sentiment_upload(2), overlap=1)
    u = make_user("u")
    invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    a = assignment.next_item(camp, u)
    camp.memberships.filter(user=u).delete()
    with pytest.raises(Rejected, match="not an annotator"):
        assignment.record_judgment(u, a.token, item_id=a.item_id, choice="left")
    assert Judgment.objects.count() == 0


def test_run_page_shows_its_human_evaluation(two_runs, researcher_client, settings):
    """The run page (platform view) embeds the campaign ranking of that run."""
    settings.ANNOTATION_MIN_COMPARISONS = 5
    good, bad = two_runs
    camp = campaigns.create_campaign_from_runs("judged-on-run-page", [good.pk, bad.pk], overlap=1)
    u = make_user("judge")
    invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    _judge_all(camp, [u], lambda item, _u: "a" if item.system_a == f"run:{good.pk}" else "b")
    html = researcher_client.get(f"/runs/{good.pk}/").content.decode()
    assert 'id="human-eval"' in html and "judged-on-run-page" in html and "1 of 2" in html


def _run_with(name, rows, step=10):
    """A run whose last evaluation holds ``rows`` of (sample id, prompt, generation)."""
    from webapp.runs.models import Run, Sample

    run = Run.objects.create(name=name, status="succeeded", config={})
    Sample.objects.bulk_create(
        [
            Sample(run=run, step=step, split="validation", sample_id=sid, prompt=p, generation=g)
            for sid, p, g in rows
        ]
    )
    return run


def test_runs_are_matched_on_sample_id_first_then_prompt_and_the_rest_is_reported(researcher):
    """Issue 13: two runs of a task whose prompts are all identical gave a 1-item campaign, silently."""
    same = "Write a positive review:"
    a = _run_with("a", [(str(i), same, f"a-{i}") for i in range(8)])
    b = _run_with("b", [(str(i), same, f"b-{i}") for i in range(8)])
    camp = campaigns.create_campaign_from_runs("ids", [a.pk, b.pk], user=researcher, overlap=1)
    items = list(camp.items.all())
    assert len(items) == 8 and camp.build_report["by_sample_id"] == 8
    for it in items:  # each item pairs the two runs' generations for the SAME sample
        outs = {it.system_a: it.output_a, it.system_b: it.output_b}
        assert outs[f"run:{a.pk}"][2:] == outs[f"run:{b.pk}"][2:]
    # Ids that do not match: identical prompts are still paired, once per occurrence in every run.
    c = _run_with("c", [(f"x{i}", same, f"c-{i}") for i in range(5)])
    camp = campaigns.create_campaign_from_runs("prompts", [a.pk, c.pk], user=researcher, overlap=1)
    assert camp.items.count() == 5
    assert camp.build_report["by_prompt"] == 5
    assert camp.build_report["unmatched"] == {str(a.pk): 3, str(c.pk): 0}
    text = campaigns.describe_match(camp.build_report, camp.system_labels)
    assert text.startswith("0 matched by sample id, 5 by prompt text; 3 samples not present in all runs")
    assert f"#{a.pk} a: 3" in text
    # Mixed: ids 0-2 match with the same prompt, id 3 has a different prompt in each run (matched by
    # prompt if that prompt occurs in both), id 4 exists only in one run.
    d = _run_with(
        "d", [("0", "p0", "d0"), ("1", "p1", "d1"), ("2", "p2", "d2"), ("3", "q", "d3"), ("4", "z", "d4")]
    )
    e = _run_with(
        "e", [("0", "p0", "e0"), ("1", "p1", "e1"), ("2", "p2", "e2"), ("3", "r", "e3"), ("9", "q", "e9")]
    )
    camp = campaigns.create_campaign_from_runs("mixed", [d.pk, e.pk], user=researcher, overlap=1)
    rep = camp.build_report
    assert (rep["by_sample_id"], rep["by_prompt"], rep["id_prompt_differs"]) == (3, 1, 1)
    assert rep["unmatched"] == {str(d.pk): 1, str(e.pk): 1}
    pairs = {frozenset((it.output_a, it.output_b)) for it in camp.items.all()}
    assert pairs == {frozenset(p) for p in [("d0", "e0"), ("d1", "e1"), ("d2", "e2"), ("d3", "e9")]}


def test_campaign_page_says_how_items_were_matched(client, researcher):
    same = "Same prompt"
    a = _run_with("run-a", [(str(i), same, f"a-{i}") for i in range(4)])
    b = _run_with("run-b", [(str(i), same, f"b-{i}") for i in range(3)])
    client.force_login(researcher)
    r = client.post("/annotate/campaigns/new/", {"name": "m", "runs": [a.pk, b.pk], "kind": "pairwise",
                                                  "overlap": "1", "pairing": "all_pairs"}, follow=True)  # fmt: skip
    html = r.content.decode()
    assert "Campaign created with 3 items" in html
    assert 'id="build-report"' in html and "3 matched by sample id, 0 by prompt text" in html
    assert "1 samples not present in all runs" in html


def test_campaign_caps_refuse_too_many_runs_or_items(researcher, settings):
    runs = [_run_with(f"r{i}", [("0", "p", f"g{i}")]) for i in range(4)]
    settings.ANNOTATION_MAX_SYSTEMS = 3
    with pytest.raises(AnnotationError, match="4 systems, more than the limit of 3"):
        campaigns.create_campaign_from_runs("x", [r.pk for r in runs])
    settings.ANNOTATION_MAX_SYSTEMS = 50
    settings.ANNOTATION_MAX_ITEMS = 5
    with pytest.raises(AnnotationError, match="6 items, more than the limit of 5"):
        campaigns.create_campaign_from_runs("x", [r.pk for r in runs])  # 4 systems: 6 pairs per input
    assert Campaign.objects.count() == 0


def test_heldout_split_never_shares_an_input_with_training(two_runs):
    """Issue 17: pairs about one input (3 systems → 3 items per prompt, each judged by 3 annotators)
    all land on the same side of the reward model's held-out split, for several seeds."""
    import random as _random

    from engine.reward_model import parse_pairs, split_heldout
    from tests.annotation.conftest import make_run

    good, bad = two_runs
    prompts = [f"Prompt number {i}:" for i in range(6)]
    mid = make_run("mid-run", prompts, [f"an okay answer {i}" for i in range(6)])
    camp = campaigns.create_campaign_from_runs("rm", [good.pk, bad.pk, mid.pk], overlap=3)
    users = [make_user(f"u{i}") for i in range(3)]
    for u in users:
        invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    _judge_all(camp, users, lambda item, u: "a" if hash((item.pk, u.pk)) % 2 else "b")
    raw = preference_pairs(camp)
    assert len(raw) == 6 * 3 * 3
    pairs = parse_pairs([json.dumps(p) for p in raw])
    for seed in range(5):
        held, train = split_heldout(pairs, 0.3, _random.Random(seed))
        assert held and train and len(held) + len(train) == len(pairs)
        held_inputs = {p.meta["group"] for p in held}
        train_inputs = {p.meta["group"] for p in train}
        assert not held_inputs & train_inputs
        assert not {p.meta["item"] for p in held} & {p.meta["item"] for p in train}
        assert not {p.prompt for p in held} & {p.prompt for p in train}
        train_texts = {t for p in train for t in (p.chosen, p.rejected)}
        assert not {t for p in held for t in (p.chosen, p.rejected)} & train_texts


def test_reward_model_reports_heldout_count_and_wilson_interval(settings):
    from annotation.reward_models import heldout_summary

    tiny = heldout_summary({"heldout_pairs": 2, "heldout_accuracy": 1.0})
    assert tiny["heldout_too_small"] and tiny["heldout_n"] == 2
    assert tiny["heldout_text"] == "too few held-out pairs to measure (n=2, need 20; 1.00 observed)"
    assert tiny["heldout_low"] < 0.35 and tiny["heldout_high"] == 1.0  # Wilson: 2 of 2 is far from certain
    ok = heldout_summary({"heldout_pairs": 40, "heldout_accuracy": 0.85})
    assert not ok["heldout_too_small"]
    assert ok["heldout_text"] == f"0.85 (95% CI {ok['heldout_low']:.2f}–{ok['heldout_high']:.2f}, n=40)"
    assert 0.70 < ok["heldout_low"] < 0.85 < ok["heldout_high"] < 0.95
    assert heldout_summary({})["heldout_text"].startswith("no held-out pairs")
    settings.ANNOTATION_MIN_HELDOUT = 50
    assert heldout_summary({"heldout_pairs": 40, "heldout_accuracy": 0.85})["heldout_too_small"]


def test_special_tokens_are_shown_as_escaped_markers():
    from annotation.templatetags.annotation_tags import special_tokens

    html = special_tokens("Great film!<|endoftext|><pad><pad> and </s> <script>alert(1)</script> [SEP]")
    assert "<|endoftext|>" not in html and "<script>" not in html and "&lt;script&gt;" in html
    assert html.count('class="special-token"') == 5
    assert "⟦end of text⟧" in html and "⟦padding⟧" in html and "⟦separator⟧" in html
    assert 'title="model control token &lt;|endoftext|&gt;"' in html
    assert special_tokens("a < b & c") == "a &lt; b &amp; c"  # ordinary text is only escaped


def test_reward_model_backbone_must_be_a_known_model_or_inside_the_read_roots(tmp_path, settings):
    """Issue 16: the backbone was checked only when it started with / . ~ ("runs/../../x" passed)."""
    from annotation.reward_models import TrainRequest, create_reward_model
    from webapp.runs.errors import PathNotAllowed

    settings.ALLOWED_ROOTS = [str(tmp_path / "allowed")]
    (tmp_path / "allowed" / "rm-backbone").mkdir(parents=True)
    camp = uploads.create_campaign_from_upload("rm", sentiment_upload(4), overlap=1)
    u = make_user("u")
    invites.add_member(camp, u)
    campaigns.start_campaign(camp)
    _judge_all(camp, [u], lambda item, _u: "a")
    for bad in ("runs/../../etc", "/etc", "~/secrets", "a/b/c", str(tmp_path / "elsewhere")):
        with pytest.raises(PathNotAllowed, match="outside the allowed directories"):
            create_reward_model(camp, TrainRequest(name="x", backbone=bad), enqueue=False)
    for ok in ("minilm", "builtin:tiny-gpt2", "sentence-transformers/all-MiniLM-L6-v2"):
        assert create_reward_model(camp, TrainRequest(name="x", backbone=ok), enqueue=False).backbone == ok
    inside = create_reward_model(
        camp, TrainRequest(name="x", backbone=str(tmp_path / "allowed" / "rm-backbone")), enqueue=False
    )
    assert inside.backbone == str((tmp_path / "allowed" / "rm-backbone").resolve())
