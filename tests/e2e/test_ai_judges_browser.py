"""AI judges in a real browser (Debian chromium, daphne, the real Celery worker, an OpenAI-compatible
endpoint played by a stdlib HTTP server): the campaign page's progress bar and ETA follow a running
judge, the page refreshes itself when the judge finishes, the API key is never on the page, and the
results page shows the AI-agreement panel."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from annotation import ai_judges
from tests.annotation.test_ai_judges import ChatServer, _campaign

pytestmark = [pytest.mark.e2e]


@pytest.mark.django_db(transaction=True)
def test_progress_bar_eta_and_agreement_panel(
    page: Any, asgi_server: Any, loopback_judge_worker: Any, researcher: Any, login: Any, wait_for: Any
) -> None:
    server = ChatServer()
    server.healthy = True
    server.hold_at = 3  # the first pass of the second item waits: the judge is caught at 1 of 4 items
    try:
        camp = _campaign(4, "browser")
        judge = ai_judges.create_judge(
            camp, name="endpoint judge", kind="endpoint", model="m", base_url=server.url,
            api_key="sk-browser-secret",
        )  # fmt: skip
        ai_judges.start_judging(judge)  # to the test worker's queue
        wait_for(server.held.is_set, timeout=120, what="the judge's third call")

        base = asgi_server.url
        detail = f"/annotate/campaigns/{camp.pk}/"
        login(page, base, researcher, next_url=detail)
        row = page.locator(f'#ai-judge-table tr[data-judge="{judge.pk}"]')
        expect(row.locator(".ai-progress-text")).to_have_text("1 of 4 items")
        expect(row.locator(".ai-eta")).to_contain_text("left")  # written by the polling script
        assert row.locator(".bar").evaluate("e => e.style.width") == "25%"
        assert "sk-browser-secret" not in page.content()

        server.release.set()
        expect(row.locator(".ai-status")).to_have_text("succeeded", timeout=60_000)  # reloaded when done
        expect(row.locator(".ai-progress-text")).to_have_text("4 of 4 items")
        expect(row.locator(".run-ai-btn")).to_be_visible()

        page.goto(f"{base}/annotate/campaigns/{camp.pk}/results/")
        panel = page.locator(f'#ai-agreement-table tr[data-judge="{judge.pk}"]')
        expect(panel).to_contain_text("endpoint judge")
        expect(panel.locator("td").nth(1)).to_have_text("4")  # items judged (both passes)
    finally:
        server.stop()
