"""Issue 26: the researcher's pages as a demanding user finds them, checked in Debian chromium with
the Content-Security-Policy enforced (no ``bypass_csp``), at a desktop (1280 px) and a phone (375 px)
width: the launch form's layout and per-algorithm settings, one colour per run on the compare page,
and pages that fit a phone. Layout is measured in the browser (bounding boxes, scroll widths), never
timed."""

from __future__ import annotations

import html
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
    assert pg.evaluate("() => window.__csp || []") == []  # (about:blank when a test skipped early)
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


TRACE_COLOURS = """(sel) => Array.from(document.querySelectorAll(sel)).map((el) => ({
  key: el.dataset.key || el.id,
  traces: (el.data || []).map((t) => [t.name, t.line && t.line.color]),
}))"""


def _metric_runs(researcher: Any, suffix: str = " <b>x</b>") -> list[Any]:
    """Three runs reporting overlapping subsets of three metrics, as a PPO, an A2C and a GRPO run do:
    a colour handed out by position among the runs that report a metric differs from chart to chart."""
    from webapp.runs.ingest import ingest_metrics
    from webapp.runs.models import Run

    reports = {
        "ppo": ("train/reward_mean", "loss/value"),
        "a2c": ("loss/value", "eval/bleu"),
        "grpo": ("train/reward_mean", "eval/bleu"),
    }
    runs = []
    for name, keys in reports.items():
        run = Run.objects.create(name=f"{name}{suffix}", config={}, created_by=researcher, status="succeeded")
        ingest_metrics(run.pk, [(k, s, 0.1 * s) for k in keys for s in range(1, 6)])
        runs.append(run)
    return runs


@pytest.mark.django_db(transaction=True)
def test_each_run_has_one_colour_in_every_compare_chart_with_a_legend(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    page = csp_page
    runs = _metric_runs(researcher)
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/compare/?ids={','.join(str(r.pk) for r in runs)}")
    charts = page.locator("#charts .chart[data-key]")
    expect(charts).to_have_count(3)
    for i in range(3):
        charts.nth(i).scroll_into_view_if_needed()
        expect(charts.nth(i)).to_have_attribute("data-points", "10")
    colour_of: dict[str, set[str]] = {}
    for chart in page.evaluate(TRACE_COLOURS, "#charts .chart[data-key]"):
        for name, colour in chart["traces"]:
            colour_of.setdefault(name, set()).add(colour)
    # Plotly renders HTML in trace names: run names go in escaped (a "<b>x</b>" run showed a bold x).
    names = {html.escape(f"#{r.pk} {r.name}", quote=False) for r in runs}
    assert set(colour_of) == names
    assert all(len(c) == 1 for c in colour_of.values()), colour_of  # one colour per run everywhere
    assert len({next(iter(c)) for c in colour_of.values()}) == 3  # and different runs differ

    legend = page.locator("#run-legend li")
    expect(legend).to_have_count(3)
    for run, item in zip(runs, legend.all(), strict=True):
        expect(item).to_contain_text(f"#{run.pk} {run.name}")  # the name as text, escaped
        swatch = item.locator(".swatch").evaluate("(el) => getComputedStyle(el).backgroundColor")
        (colour,) = colour_of[html.escape(f"#{run.pk} {run.name}", quote=False)]
        assert swatch == _rgb(colour)
    assert_fits(page)


def _rgb(hex_colour: str) -> str:
    """``#2f6fed`` as the browser's computed style writes it, ``rgb(47, 111, 237)``."""
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


@pytest.mark.django_db(transaction=True)
def test_sweep_chart_uses_the_runs_compare_colours(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    from webapp.runs.ingest import ingest_metrics
    from webapp.runs.models import Run

    page = csp_page
    tag = "sweep:colours01"
    runs = []
    for i, lr in enumerate((1e-5, 3e-5, 1e-4)):
        run = Run.objects.create(
            name=f"lr-{i}",
            config={"algorithm": {"learning_rate": lr}},
            created_by=researcher,
            status="succeeded",
            tags=[tag],
        )
        ingest_metrics(run.pk, [("train/reward_mean", 1, 0.1 * i)])
        runs.append(run)
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/sweeps/{tag}/")
    expect(page.locator("#sweep-parcoords")).to_have_attribute("data-drawn", "3")
    lines = {name: colour for name, colour in page.evaluate(TRACE_COLOURS, "#sweep-parcoords")[0]["traces"]}
    page.locator("#compare-sweep").click()
    charts = page.locator("#charts .chart[data-key]")
    expect(charts.first).to_have_attribute("data-points", "3")
    on_compare = {
        name: colour for name, colour in page.evaluate(TRACE_COLOURS, "#charts .chart[data-key]")[0]["traces"]
    }
    for run in runs:
        assert lines[run.name] == on_compare[f"#{run.pk} {run.name}"]
    assert len(set(lines.values())) == 3


@pytest.mark.django_db(transaction=True)
def test_sweeps_are_listed_linked_both_ways_live_and_cancelled_after_a_confirmation(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    from webapp.runs.ingest import ingest_metrics
    from webapp.runs.models import Run

    page = csp_page
    tag = "sweep:found0001"
    first = Run.objects.create(
        name="lr-a",
        config={"algorithm": {"learning_rate": 1e-5}},
        created_by=researcher,
        status="queued",
        tags=[tag],
    )
    second = Run.objects.create(
        name="lr-b",
        config={"algorithm": {"learning_rate": 1e-4}},
        created_by=researcher,
        status="queued",
        tags=[tag],
    )
    for run in (first, second):
        ingest_metrics(run.pk, [("train/reward_mean", 1, 0.5)])
    login(page, asgi_server.url, researcher)

    page.goto(f"{asgi_server.url}/")
    page.locator("nav.nav a", has_text="Sweeps").click()
    row = page.locator(f"#sweep-list tr[data-tag='{tag}']")
    expect(row).to_contain_text("lr-a")
    expect(row).to_contain_text("2 queued")
    row.locator("a").first.click()
    expect(page).to_have_url(f"{asgi_server.url}/sweeps/{tag}/")

    # The chart sits inside its card, on a desktop and on a phone.
    chart = page.locator("#sweep-parcoords")
    expect(chart).to_have_attribute("data-drawn", "2")
    for width in (DESKTOP, PHONE):
        # Loaded at each width, as a phone would: measured once the chart says it is drawn.
        page.set_viewport_size({"width": width, "height": 900})
        page.reload()
        expect(chart).to_have_attribute("data-drawn", "2")
        card = page.locator(".sweep-chart-card").bounding_box()
        svg = chart.locator(".main-svg").first.evaluate("(el) => el.getBoundingClientRect().right")
        assert svg <= card["x"] + card["width"]
        assert_fits(page)
    page.set_viewport_size({"width": DESKTOP, "height": 900})

    # Member run -> its sweep, and back.
    page.locator("#sweep-table a", has_text="lr-b").click()
    expect(page).to_have_url(f"{asgi_server.url}/runs/{second.pk}/")
    page.locator("a.sweep-link").click()
    expect(page).to_have_url(f"{asgi_server.url}/sweeps/{tag}/")

    # Live status: a run that finishes shows so without a reload.
    Run.objects.filter(pk=second.pk).update(status="succeeded")
    expect(page.locator(f"[data-status-of='{second.pk}']")).to_have_text("succeeded", timeout=30_000)
    expect(page.locator("#cancel-sweep")).to_be_visible()

    # Cancelling the group asks first, naming the runs it stops (only the unfinished one).
    page.locator("#cancel-sweep").click()
    expect(page.locator("#runs-to-cancel li")).to_have_count(1)
    expect(page.locator("#runs-to-cancel")).to_contain_text("lr-a")
    assert Run.objects.get(pk=first.pk).status == "queued"  # nothing happened before confirming
    page.locator("#confirm-cancel-sweep").click()
    expect(page).to_have_url(f"{asgi_server.url}/sweeps/{tag}/")
    expect(page.locator(f"[data-status-of='{first.pk}']")).to_have_text("cancelled")
    expect(page.locator("#cancel-sweep")).to_be_hidden()  # a finished sweep offers no cancel


@pytest.mark.django_db(transaction=True)
def test_run_page_fits_a_phone_and_its_nav_wraps(
    csp_page: Any, asgi_server: Any, admin: Any, login: Any
) -> None:
    """At 375 px: no horizontal scroll (the generations table scrolls inside its box, long text
    wraps), and every nav link and the log-out button are on screen, none cut mid-word."""
    from webapp.runs.ingest import ingest_metrics
    from webapp.runs.models import Run, Sample

    page = csp_page
    run = Run.objects.create(name="phone-" + "x" * 60, config={}, created_by=admin, status="succeeded")
    ingest_metrics(run.pk, [("train/reward_mean", s, 0.1 * s) for s in range(1, 10)])
    Sample.objects.create(
        run=run,
        step=3,
        prompt="a long prompt " * 20 + "unbroken" * 20,
        generation="a long generation " * 30 + "nospaces" * 30,
        reward=0.5,
        metrics={"eval/bleu": 2.58496250072, "eval/rouge": 0.1234567},
    )
    page.set_viewport_size({"width": PHONE, "height": 800})
    login(page, asgi_server.url, admin)  # an admin sees the most nav entries
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    expect(page.locator("#samples-body tr")).to_have_count(1)
    expect(page.locator("#charts .chart").first).to_be_visible()
    assert_fits(page)
    entries = page.locator(".topbar nav a, .userbox a, .userbox button")
    assert entries.count() >= 6  # Runs, Compare, Sweeps, GRUE, Annotation, Admin, API tokens, Log out
    for i in range(entries.count()):
        entry = entries.nth(i)
        expect(entry).to_be_in_viewport(ratio=1)
        # Not cut: the text fits its box.
        assert entry.evaluate("(el) => el.scrollWidth <= el.clientWidth + 1"), entry.inner_text()


@pytest.mark.django_db(transaction=True)
def test_error_pages_and_empty_states_say_what_happened_and_where_to_go(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    page = csp_page
    base = asgi_server.url
    login(page, base, researcher)

    resp = page.goto(f"{base}/runs/999999/?<b>x</b>")
    assert resp.status == 404
    expect(page.locator(".topbar nav a", has_text="Runs")).to_be_visible()  # the site's navigation
    expect(page.locator("#error-page h1")).to_have_text("Not found")
    expect(page.locator("#error-links a", has_text="Sweeps")).to_be_visible()
    page.set_viewport_size({"width": PHONE, "height": 800})
    assert_fits(page)
    page.set_viewport_size({"width": DESKTOP, "height": 900})

    page.goto(f"{base}/launch/?preset=imdb_ppx")
    message = page.locator(".msg-error")
    expect(message).to_contain_text("Unknown preset “imdb_ppx”")
    expect(message).to_contain_text("imdb_ppo")
    expect(message).not_to_contain_text("synthetic_grpo")  # not every preset's name

    page.goto(f"{base}/launch/?clone=9999")
    expect(page.locator(".msg-error")).to_contain_text("no run #9999 to clone")

    page.goto(f"{base}/grue/")
    link = page.locator("tr td[data-algorithm='ppo'] a.launch-preset").first
    expect(link).to_contain_text("_ppo_offline")
    preset = link.locator("code").inner_text()
    link.click()
    expect(page.locator("#preset-select")).to_have_value(preset)
    expect(page.locator(".msg-error")).to_have_count(0)


@pytest.mark.django_db(transaction=True)
def test_an_annotators_404_offers_only_annotation(
    csp_page: Any, asgi_server: Any, annotator: Any, login: Any
) -> None:
    page = csp_page
    login(page, asgi_server.url, annotator, next_url="/annotate/")
    resp = page.goto(f"{asgi_server.url}/annotate/no-such-page/")
    assert resp.status == 404
    expect(page.locator("#error-links a")).to_have_count(1)
    expect(page.locator("#error-links a")).to_have_text("Annotation")


@pytest.mark.django_db(transaction=True)
def test_run_page_details_follow_the_run_without_a_reload(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """After a launch from the form: "Run #N queued." goes once the run leaves the queue, and the
    finished time appears when it ends (it said "finished —" until a reload); per-sample scores are
    rounded like every other number on the page."""
    import threading

    from webapp.runs import lifecycle
    from webapp.runs.models import Run, Sample

    page = csp_page
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/launch/?preset=synthetic_ppo")
    page.locator("#launch-btn").click()
    page.wait_for_url(f"{asgi_server.url}/runs/*/")
    run = Run.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    message = page.locator(".msg", has_text=f"Run #{run.pk} queued.")
    expect(message).to_be_visible()
    expect(page.locator("#ws-state")).to_have_text("live")
    expect(page.locator("#finished-at")).to_have_text("—")

    def work() -> None:
        from django.db import connection

        try:
            assert lifecycle.claim(run.pk, task_id=run.task_id, worker="browser-test") is not None
            lifecycle.finish(run.pk, {"iterations": 1})
        finally:
            connection.close()  # this thread's own connection, so the test database can be dropped

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    expect(page.locator("#status-badge")).to_have_text("succeeded")
    expect(message).to_have_count(0)
    finished = Run.objects.get(pk=run.pk).finished_at
    expect(page.locator("#finished-at")).to_have_text(finished.strftime("%Y-%m-%d %H:%M:%S"))

    Sample.objects.create(
        run=run, step=1, prompt="p", generation="g", reward=0.5, metrics={"bleu": 2.58496250072}
    )
    page.reload()
    expect(page.locator("#samples-body td.details")).to_have_text("bleu 2.585")


@pytest.mark.django_db(transaction=True)
def test_ai_judge_template_help_shows_its_literal_braces(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """The prompt-template help says how to write a literal brace, ``{{`` and ``}}`` (Django's
    template engine used to swallow them, leaving "; and for literal braces")."""
    from tests.annotation.test_ai_judges import _campaign

    camp = _campaign(2, "braces")
    page = csp_page
    detail = f"/annotate/campaigns/{camp.pk}/"
    login(page, asgi_server.url, researcher, next_url=detail)
    help_text = page.locator("label", has_text="Prompt template").locator("span.muted")
    expect(help_text).to_contain_text("{response_b}; {{ and }} for literal braces")


@pytest.mark.django_db(transaction=True)
def test_new_api_token_has_a_copy_button_and_revoke_asks_first(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    from webapp.api.models import ApiToken

    page = csp_page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    login(page, asgi_server.url, researcher, next_url="/settings/tokens/")
    page.fill("#token-name", "cluster <b>")
    page.locator("form button[type=submit]", has_text="Create token").click()
    token = page.locator("#new-token")
    expect(token).to_be_visible()
    page.locator("#copy-token").click()
    expect(page.locator("#copy-token")).to_have_text("Copied")
    assert page.evaluate("() => navigator.clipboard.readText()") == token.inner_text().strip()

    seen: list[str] = []

    def dismiss(dialog: Any) -> None:
        seen.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.locator("button[name=revoke]").click()
    expect(page.locator("button[name=revoke]")).to_be_visible()
    assert seen and "cluster <b>" in seen[0]  # the dialog names the token
    assert ApiToken.objects.get(name="cluster <b>").active

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("button[name=revoke]").click()
    expect(page.locator("button[name=revoke]")).to_have_count(0)
    assert not ApiToken.objects.get(name="cluster <b>").active


@pytest.mark.django_db(transaction=True)
def test_item_preview_shows_metrics_as_text_not_dicts(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    from annotation.models import Item
    from tests.annotation.test_ai_judges import _campaign

    camp = _campaign(2, "preview")
    first = camp.items.order_by("pk").first()
    Item.objects.filter(pk=first.pk).update(metrics_a={"bleu": 2.58496250072, "len": 12, "<b>": 1})
    page = csp_page
    login(page, asgi_server.url, researcher, next_url=f"/annotate/campaigns/{camp.pk}/preview/")
    line = page.locator(f".preview-item[data-item='{first.pk}'] p.muted")
    expect(line).to_contain_text("(<b> 1 · bleu 2.585 · len 12)")
    for text in page.locator(".preview-item p.muted").all_inner_texts():
        assert "{" not in text and "}" not in text, text


@pytest.mark.django_db(transaction=True)
def test_screenshots_for_the_docs(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any, tmp_path: Any
) -> None:
    """The docs/ui.md screenshots (launch form, compare view, sweep list, run page) at 1280 px, the
    first screen of each, with the CSP enforced: into ``GRUE_SCREENSHOTS=<dir>`` to refresh the docs,
    else into a temporary folder (the pages must still render and the pictures be real PNGs)."""
    import os
    from pathlib import Path

    from webapp.runs.ingest import ingest_metrics
    from webapp.runs.models import Run, Sample

    folder = Path(os.environ.get("GRUE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page = csp_page
    page.set_viewport_size({"width": DESKTOP, "height": 760})
    runs = _metric_runs(researcher, suffix="-lr3e-5")
    for i, run in enumerate(runs):
        ingest_metrics(run.pk, [("train/reward_mean", s, 0.1 * s + 0.05 * i) for s in range(6, 40)])
    Sample.objects.create(
        run=runs[0], step=5, prompt="Numbers: 3 4", generation="5 6 7 8", reward=0.83, metrics={"bleu": 0.41}
    )
    tag = "sweep:lr-seed-1a2b"
    for i, lr in enumerate((1e-5, 3e-5, 1e-4)):
        run = Run.objects.create(
            name=f"lr-seed-{i}",
            config={"algorithm": {"learning_rate": lr}},
            created_by=researcher,
            status="succeeded" if i else "running",
            tags=[tag],
        )
        ingest_metrics(run.pk, [("train/reward_mean", 5, 0.2 + 0.1 * i)])
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/launch/?preset=synthetic_grpo")
    page.locator("#section-tabs a[data-section='algorithm']").click()
    page.screenshot(path=str(folder / "ui-launch-form.png"))
    page.goto(f"{asgi_server.url}/compare/?ids={','.join(str(r.pk) for r in runs)}")
    expect(page.locator("#charts .chart[data-points]").first).to_be_visible()
    expect(page.locator("#charts .chart .main-svg").first).to_be_visible()
    page.screenshot(path=str(folder / "ui-compare.png"))
    page.goto(f"{asgi_server.url}/sweeps/")
    expect(page.locator("#sweep-list")).to_be_visible()
    page.screenshot(path=str(folder / "ui-sweep-list.png"))
    page.goto(f"{asgi_server.url}/runs/{runs[0].pk}/")
    expect(page.locator("#charts .chart .main-svg").first).to_be_visible()
    page.screenshot(path=str(folder / "ui-run-page.png"))
    for name in ("ui-launch-form", "ui-compare", "ui-sweep-list", "ui-run-page"):
        data = (folder / f"{name}.png").read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5_000, name


@pytest.mark.django_db(transaction=True)
def test_a_sweep_is_made_by_picking_fields_and_values_in_a_form(
    csp_page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """The new-sweep page's fields form (the YAML stays as the advanced view): three learning rates,
    the example's seed row cleared, launched as three runs varying only the learning rate."""
    page = csp_page
    login(page, asgi_server.url, researcher, next_url="/sweeps/new/")
    expect(page.locator("#field-path-0")).to_have_value("algorithm.learning_rate")
    expect(page.locator("#field-path-1")).to_have_value("train.seed")
    page.fill("#field-values-0", "1e-5, 3e-5, 1e-4")
    page.fill("#field-path-1", "")
    page.fill("#field-values-1", "")
    page.locator("#fields-to-yaml").click()  # the form written into the YAML view, nothing queued
    expect(page.locator("textarea[name=sweep_yaml]")).to_contain_text("- 3.0e-05")
    expect(page.locator("textarea[name=sweep_yaml]")).not_to_contain_text("train.seed")
    page.locator("#launch-fields").click()
    page.wait_for_url(f"{asgi_server.url}/sweeps/sweep*/")
    expect(page.locator("#sweep-table tbody tr")).to_have_count(3)
    headers = page.locator("#sweep-table thead th code")
    expect(headers).to_have_count(1)
    expect(headers).to_have_text("algorithm.learning_rate")
    assert_fits(page)
