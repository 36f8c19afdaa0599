"""Annotators and researchers in a real browser (Debian chromium via Playwright, daphne, PostgreSQL).

1. An annotator judges a whole pairwise campaign with the keyboard only: 1/2/3/4 and a/b/t/x choose,
   Enter submits, u undoes, s skips (the skipped item comes back at the end); sides are shuffled and
   the stored choice follows what was on screen.
2. A researcher creates a blind comparison of two runs, starts it once three annotators have
   joined, and reads the results page (Bradley–Terry table, Plotly charts, agreement).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from annotation import assignment, campaigns, invites, uploads
from annotation.models import Campaign, Judgment
from tests.annotation.conftest import make_run, make_user

pytestmark = [pytest.mark.e2e]


def ready(page: Any) -> None:
    """The keyboard handler is attached (annotate.js marks the body when it is listening)."""
    page.wait_for_selector("body[data-annotate-ready='1']")


def _upload(n: int) -> str:
    return "\n".join(
        json.dumps(
            {"prompt": f"Prompt {i}", "outputs": {"HIDDEN_X": f"x-output-{i}", "HIDDEN_Y": f"y-output-{i}"}}
        )
        for i in range(n)
    )


@pytest.mark.django_db(transaction=True)
def test_annotator_judges_with_the_keyboard(page: Any, asgi_server: Any, login: Any) -> None:
    ann = make_user("kbd")
    camp = uploads.create_campaign_from_upload(
        "keyboard campaign", _upload(4), overlap=1, instructions="Pick the better one."
    )
    invites.add_member(camp, ann)
    campaigns.start_campaign(camp)
    base = asgi_server.url
    url = f"/annotate/c/{camp.pk}/"
    login(page, base, "kbd", "pw-kbd-123", next_url=url)

    progress = page.locator("#progress")
    expect(progress).to_have_text("0 of 4")
    ready(page)
    expect(page.locator("body")).not_to_contain_text("HIDDEN_X")
    expect(page.locator(".ann-help")).to_contain_text("Enter")

    # Enter without a choice does not submit; it asks for a choice.
    page.keyboard.press("Enter")
    expect(page.locator("#hint")).to_contain_text("Choose A, B, tie or both bad")
    assert Judgment.objects.count() == 0

    # Skip the first item with "s": the campaign does not shrink, and the item comes back at the end.
    skipped = {page.locator("#text-left").inner_text(), page.locator("#text-right").inner_text()}
    page.keyboard.press("s")
    expect(page.locator("#skipped-note")).to_contain_text("1 skipped")
    expect(progress).to_have_text("0 of 4")
    ready(page)
    assert {page.locator("#text-left").inner_text(), page.locator("#text-right").inner_text()} != skipped

    shown = []  # (screen text on the left, key pressed)
    for i, key in enumerate(["1", "b", "t", "x"]):
        left_text = page.locator("#text-left").inner_text()
        if i == 3:  # the last item served is the one skipped at the start
            assert {left_text, page.locator("#text-right").inner_text()} == skipped
        shown.append((left_text, key))
        page.keyboard.press(key)
        expected = {"1": "#btn-left", "b": "#btn-right", "t": "#btn-tie", "x": "#btn-both_bad"}[key]
        expect(page.locator(expected)).to_have_class(re.compile(r"\bselected\b"))
        if i == 2:
            page.fill("#rationale", "both fine")
            page.locator("#rationale").press("Control+Enter")
        else:
            page.keyboard.press("Enter")
        if i < 3:
            expect(progress).to_have_text(f"{i + 1} of 4")
            ready(page)
        if i == 1:
            # Undo with "u": the second judgment is withdrawn and its item comes back.
            page.keyboard.press("u")
            expect(progress).to_have_text("1 of 4")
            ready(page)
            assert page.locator("#text-left").inner_text() in (shown[1][0], _other(shown[1][0]))
            page.keyboard.press("2")
            page.keyboard.press("Enter")
            expect(progress).to_have_text("2 of 4")
            ready(page)
            shown[1] = (shown[1][0], "2")
    expect(page.locator("#all-done")).to_be_visible()

    judgments = list(Judgment.objects.select_related("item").order_by("id"))
    assert len(judgments) == 4
    for j, (left_text, key) in zip(judgments, shown):
        left_system_output = j.item.output_a if j.left_is_a else j.item.output_b
        assert left_system_output == left_text  # what was on the left is recorded
        want = {"1": "left", "2": "right", "t": "tie", "x": "both_bad"}[key]
        if want == "left":
            assert j.choice == ("a" if j.left_is_a else "b")
        elif want == "right":
            assert j.choice == ("b" if j.left_is_a else "a")
        else:
            assert j.choice == want
        assert j.seconds is not None and j.seconds >= 0
    assert judgments[2].rationale == "both fine"


@pytest.mark.django_db(transaction=True)
def test_annotator_scores_likert_axes_with_the_keyboard(page: Any, asgi_server: Any, login: Any) -> None:
    from annotation.models import AXES_PRESETS

    ann = make_user("lik")
    data = json.dumps(
        {"prompt": "Concepts: dog, frisbee, catch", "outputs": {"S": "The dog catches a frisbee."}}
    )
    camp = uploads.create_campaign_from_upload(
        "likert", data, kind="likert", overlap=1, axes=AXES_PRESETS["commongen"]
    )
    invites.add_member(camp, ann)
    campaigns.start_campaign(camp)
    url = f"/annotate/c/{camp.pk}/"
    login(page, asgi_server.url, "lik", "pw-lik-123", next_url=url)
    ready(page)
    expect(page.locator(".likert-axis").first).to_contain_text("5 – fluent")  # anchored labels on screen
    page.keyboard.press("5")  # fluency, then the highlight moves to commonsense
    expect(page.locator(".likert-axis.active")).to_have_attribute("data-axis", "commonsense")
    page.keyboard.press("Enter")
    expect(page.locator("#hint")).to_contain_text("Score every axis")
    page.keyboard.press("4")
    page.keyboard.press("Enter")
    expect(page.locator("#all-done")).to_be_visible()
    assert Judgment.objects.get().scores == {"fluency": 5, "commonsense": 4}


def _other(text: str) -> str:
    return (
        text.replace("x-output", "y-output") if "x-output" in text else text.replace("y-output", "x-output")
    )


@pytest.mark.django_db(transaction=True)
def test_researcher_runs_a_blind_comparison_in_the_browser(
    page: Any, live_server_with_worker: Any, researcher: Any, login: Any, wait_for: Any
) -> None:
    """The whole loop: compare two runs blind, 3 annotators, results with intervals and agreement,
    train a reward model from the judgments (real worker), launch a new run that optimises it."""
    from webapp.runs.lifecycle import cancel_run
    from webapp.runs.models import Run

    prompts = [f"Continue the review {i}:" for i in range(5)]
    good = make_run("kind-run", prompts, [f"a lovely film {i}" for i in range(5)], rewards=[0.9] * 5)
    bad = make_run("grumpy-run", prompts, [f"a dreadful film {i}" for i in range(5)], rewards=[0.1] * 5)
    base = live_server_with_worker.url
    login(page, base, researcher, next_url="/annotate/campaigns/new/")
    page.fill("input[name=name]", "kind vs grumpy")
    page.check(f"input[name=runs][value='{good.pk}']")
    page.check(f"input[name=runs][value='{bad.pk}']")
    page.fill("input[name=overlap]", "3")
    page.click("form.card [type=submit]")
    page.wait_for_url(re.compile(r".*/annotate/campaigns/\d+/$"))
    camp = Campaign.objects.get(name="kind vs grumpy")
    assert camp.items.count() == 5

    page.click("#start-btn")
    expect(page.locator(".messages")).to_contain_text("not enough annotators: 0 joined")
    page.click("#invite-btn")
    copy = page.locator(".copy-btn").first
    copy.click()  # clipboard where the browser allows it, else the link is selected for Ctrl+C
    expect(copy).to_have_text(re.compile(r"Copied|Press Ctrl\+C"))
    invite_url = page.locator(".invite-url").first.inner_text()
    assert "/annotate/join/#" in invite_url  # the token is in the fragment: never sent, never logged

    # The first annotator opens the single-use link in a fresh browser context and signs up.
    visitor = page.context.browser.new_context()
    vpage = visitor.new_page()
    vpage.goto(invite_url)
    vpage.fill("input[name=username]", "r0")
    vpage.fill("input[name=password]", "a-long-password")
    vpage.click("#signup-btn")
    vpage.wait_for_url(re.compile(rf".*/annotate/c/{camp.pk}/$"))
    assert "#" not in vpage.url and invite_url.split("#")[1] not in vpage.url
    visitor.close()
    # The server's access log (daphne) saw the join page, never the token.
    log = live_server_with_worker.log()
    assert '"GET /annotate/join/"' in log and '"POST /annotate/join/"' in log
    assert invite_url.split("#")[1] not in log
    # Two more join through a link with two uses (service calls stand in for their browsers).
    token = invites.create_invite(camp, researcher, max_uses=2).token
    raters = [User.objects.get(username="r0")] + [make_user(f"r{i}", group=None) for i in (1, 2)]
    for u in raters[1:]:
        invites.accept_invite(token, u)
    page.click("#start-btn")
    expect(page.locator("#status")).to_have_text("active")
    camp.refresh_from_db()
    for k, u in enumerate(raters):
        while (a := assignment.next_item(camp, u)) is not None:
            good_left = (a.item.system_a == f"run:{good.pk}") == a.left_is_a
            choice = "left" if good_left else "right"
            if k == 2 and a.item.order == 0:
                choice = "tie"
            assignment.record_judgment(u, a.token, item_id=a.item_id, choice=choice)

    page.click("#results-link")
    rows = page.locator("#bt-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("kind-run")
    expect(rows.nth(0).locator("td").first).to_have_text("1")
    expect(page.locator("#bt-chart .main-svg").first).to_be_visible()
    expect(page.locator("#winrate-chart .main-svg").first).to_be_visible()
    expect(page.locator("#agreement-table")).to_contain_text("Fleiss")
    expect(page.locator("#metric-table")).to_contain_text("reward")
    expect(page.locator("#annotator-table tbody tr")).to_have_count(3)

    # Train a reward model from these judgments in the worker, then launch a run on it.
    page.goto(f"{base}/annotate/campaigns/{camp.pk}/")
    page.fill("input[name=epochs]", "1")
    page.click("#train-rm-btn")
    page.wait_for_url(f"{base}/annotate/reward-models/")
    row = page.locator("tr[data-rm]").first
    expect(row).to_have_attribute("data-status", "succeeded", timeout=300_000)  # the page polls, then reloads
    expect(row.locator(".rm-acc")).not_to_be_empty()
    expect(row.locator(".rm-acc")).to_contain_text("n=")  # held-out accuracy comes with its count
    rm = camp.reward_models.get()
    row.get_by_text("Launch a run on it").click()
    page.wait_for_url(f"{base}/launch/?reward=learned-rm-{rm.pk}")
    # The form opens with that reward model selected (the choice replaces the reward fields).
    expect(page.locator("select[name=reward_preset]")).to_have_value(f"learned-rm-{rm.pk}")
    page.click("#section-tabs a[data-section=reward]")
    expect(page.locator("select[name=reward_preset]")).to_be_visible()
    replaced = page.locator("#section-reward .field").filter(
        has_not=page.locator("select[name=reward_preset]")
    )
    assert replaced.count() > 0
    for i in range(replaced.count()):
        expect(replaced.nth(i)).to_be_hidden()  # the reward fields it replaces are hidden
    page.click("#section-tabs a[data-section=general]")
    page.fill("input[name=name]", "rlhf-run")
    page.click("#launch-btn")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    run = Run.objects.get(name="rlhf-run")
    rm_path = rm.path
    assert run.config["reward"]["id"] == "learned"
    assert run.config["reward"]["args"] == {"model_path": rm_path, "label_index": 0}
    cancel_run(run)  # the launch is what this test checks; free the shared worker
    wait_for(lambda: Run.objects.get(pk=run.pk).is_finished, timeout=180, what="run cancelled")
