"""Adaptive campaigns in a real browser (Debian chromium via Playwright, daphne, PostgreSQL): a
researcher creates one from three runs with the form's "How items are chosen" option, an annotator
judges in the browser, and the results page says how the items were chosen (issue 28.1)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from annotation import assignment, campaigns, invites
from annotation.models import Campaign, Judgment
from tests.annotation.conftest import make_run, make_user

pytestmark = [pytest.mark.e2e]


@pytest.mark.django_db(transaction=True)
def test_researcher_creates_an_adaptive_campaign_and_results_say_how_items_were_chosen(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    prompts = [f"Continue the review {i}:" for i in range(4)]
    runs = [
        make_run(name, prompts, [f"{word} film {i}" for i in range(4)])
        for name, word in (("kind", "a lovely"), ("plain", "a film, a"), ("grumpy", "a dreadful"))
    ]
    base = asgi_server.url
    login(page, base, researcher, next_url="/annotate/campaigns/new/")
    page.fill("input[name=name]", "adaptive three")
    for r in runs:
        page.check(f"input[name=runs][value='{r.pk}']")
    page.fill("input[name=overlap]", "2")
    page.select_option("#assignment-mode", "adaptive")
    page.click("form.card [type=submit]")
    page.wait_for_url(re.compile(r".*/annotate/campaigns/\d+/$"))
    expect(page.locator("body")).to_contain_text("items chosen: adaptive")
    camp = Campaign.objects.get(name="adaptive three")
    assert camp.assignment_mode == "adaptive" and camp.items.count() == 4 * 3

    annotators = [make_user("ada0"), make_user("ada1")]
    for u in annotators:
        invites.add_member(camp, u)
    page.click("#start-btn")
    expect(page.locator("#status")).to_have_text("active")

    # One annotator judges an item in the browser with the keyboard; the sides are still blind.
    visitor = page.context.browser.new_context(viewport={"width": 1200, "height": 900}, bypass_csp=True)
    vpage = visitor.new_page()
    url = f"/annotate/c/{camp.pk}/"
    login(vpage, base, "ada0", "pw-ada0-123", next_url=url)
    vpage.wait_for_selector("body[data-annotate-ready='1']")
    expect(vpage.locator("body")).not_to_contain_text("run:")
    vpage.keyboard.press("1")
    vpage.keyboard.press("Enter")
    expect(vpage.locator("#progress")).to_have_text(re.compile(r"^1 of \d+$"))
    visitor.close()
    assert Judgment.objects.filter(campaign=camp, annotator=annotators[0]).count() == 1

    camp.refresh_from_db()
    for u in annotators:  # the rest through the service the page calls
        while (a := assignment.next_item(camp, u)) is not None:
            assignment.record_judgment(u, a.token, item_id=a.item_id, choice="left")
    assert camp.judgments.count() == 4 * 3 * 2  # adaptive changes the order, not the capacity

    page.goto(f"{base}/annotate/campaigns/{camp.pk}/results/")
    note = page.locator("#assignment-note")
    expect(note).to_contain_text("Items were chosen adaptively")
    expect(note).to_contain_text("depended only on earlier judgments")
    expect(page.locator("#bt-table")).to_contain_text("kind")

    # A uniform campaign's results page says so instead.
    uniform = campaigns.create_campaign_from_runs("uniform three", [r.pk for r in runs], overlap=1)
    page.goto(f"{base}/annotate/campaigns/{uniform.pk}/results/")
    expect(page.locator("#assignment-note")).to_contain_text("Items were chosen uniformly")
