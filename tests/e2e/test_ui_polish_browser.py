"""Issue 26: the researcher's pages as a demanding user finds them, checked in Debian chromium with
the Content-Security-Policy enforced (no ``bypass_csp``), at a desktop (1280 px) and a phone (375 px)
width: the launch form's layout and per-algorithm settings, one colour per run on the compare page,
and pages that fit a phone. Layout is measured in the browser (bounding boxes, scroll widths), never
timed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.e2e]

RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => { window.__csp.push(e.violatedDirective); });
"""
DESKTOP = 1280
PHONE = 375


@pytest.fixture
def csp_page(browser: Any) -> Iterator[Any]:
    """A page whose CSP is enforced (unlike the ``page`` fixture), recording any violation."""
    context = browser.new_context(viewport={"width": DESKTOP, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    pg.add_init_script(RECORD_VIOLATIONS)
    yield pg
    assert pg.evaluate("() => window.__csp") == []
    context.close()


WIDER_THAN_WINDOW = """() => {
  const out = [];
  document.querySelectorAll("body *").forEach((el) => {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > window.innerWidth + 1) out.push(`${el.tagName}#${el.id}.${el.className} ${Math.round(r.right)}`);
  });
  return out.slice(0, 12);
}"""


def page_overflow(page: Any) -> int:
    """How many pixels the document is wider than the window (0 = no horizontal scroll)."""
    return int(page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth"))


def assert_fits(page: Any) -> None:
    """No horizontal scroll; when there is, name the elements that stick out."""
    assert page_overflow(page) == 0, page.evaluate(WIDER_THAN_WINDOW)


@pytest.mark.django_db(transaction=True)
def test_launch_form_is_wide_and_shows_only_the_chosen_algorithms_settings(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    page = csp_page
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/launch/?preset=synthetic_grpo")
    form = page.locator("#launch-form")
    expect(form).to_be_visible()
    assert form.bounding_box()["width"] >= 600
    assert_fits(page)

    page.locator("#section-tabs a[data-section='algorithm']").click()
    section = page.locator("fieldset.section[data-section='algorithm']")
    expect(section).to_be_visible()
    expect(page.locator("select[name='algorithm__id']")).to_have_value("grpo")
    # GRPO: its group settings, not NLPO's, TRPO's, A2C's, DPO's, nor the value-function fields.
    expect(section.locator("fieldset[data-group='algorithm.group']")).to_be_visible()
    for other in ("algorithm.nlpo", "algorithm.trpo", "algorithm.a2c", "algorithm.dpo"):
        expect(section.locator(f"fieldset[data-group='{other}']")).to_be_hidden()
    expect(section.locator(".field[data-path='algorithm.vf_coef']")).to_be_hidden()
    # Grouped, with the defaults in view (the per-algorithm default of n_epochs included).
    expect(section.locator("fieldset[data-group='algorithm.optimiser'] legend")).to_have_text("Optimiser")
    expect(section.locator(".field[data-path='algorithm.n_epochs'] .default-value")).to_contain_text("grpo")
    expect(section.locator(".field[data-path='algorithm.learning_rate'] .default-value")).to_have_text(
        "default 1e-05"
    )

    page.select_option("select[name='algorithm__id']", "ppo")
    expect(section.locator(".field[data-path='algorithm.vf_coef']")).to_be_visible()
    expect(section.locator("fieldset[data-group='algorithm.group']")).to_be_hidden()
    assert form.bounding_box()["width"] >= 600
    assert_fits(page)

    page.set_viewport_size({"width": PHONE, "height": 800})
    expect(form).to_be_visible()
    assert_fits(page)
