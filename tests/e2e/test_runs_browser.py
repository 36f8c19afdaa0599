"""The whole researcher loop in a real browser: log in, launch the tiny synthetic preset from the
generated form, watch a chart grow live over the websocket (no reload), cancel, see "cancelled".

Real parts only: Debian chromium through Playwright, daphne, Channels over Redis, a Celery worker
process running ``engine.train`` on the builtin tiny GPT-2, PostgreSQL."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.e2e]

SCREENSHOTS = os.environ.get("GRUE_SCREENSHOTS")  # a directory: also save screenshots for the docs


def _shot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        page.screenshot(path=os.path.join(SCREENSHOTS, f"{name}.png"), full_page=True)


@pytest.mark.django_db(transaction=True)
def test_launch_watch_live_and_cancel(
    page: Any, live_server_with_worker: Any, researcher: Any, login: Any
) -> None:
    from webapp.runs.models import MetricPoint, Run, RunStatus

    base = live_server_with_worker.url
    login(page, base, researcher)

    # Launch page: start from the tiny synthetic PPO preset, then edit it in the generated form.
    page.goto(f"{base}/launch/?preset=synthetic_ppo")
    expect(page.locator("#preset-description")).to_contain_text("synthetic_ppo")
    expect(page.locator("input[name=model__name_or_path]")).to_have_value("builtin:tiny-gpt2")
    page.click("#section-tabs a[data-section=train]")
    page.fill("input[name=train__n_iters]", "400")  # long enough to watch and cancel
    page.fill("input[name=train__eval_every]", "0")
    page.fill("input[name=train__save_every]", "0")
    page.click("#section-tabs a[data-section=general]")
    page.fill("input[name=name]", "browser-run")
    _shot(page, "launch")
    page.click("#launch-btn")

    page.wait_for_url(f"{base}/runs/*/")
    run = Run.objects.get(name="browser-run")
    assert page.url == f"{base}/runs/{run.pk}/"
    assert run.config["train"]["n_iters"] == 400

    # Live: the reward chart appears and its point count grows without a reload.
    page.wait_for_function("() => window.grueRun && window.grueRun.pointCount() > 0", timeout=180_000)
    reward = page.locator(".chart[data-group=reward]")
    expect(reward).to_be_visible()
    first = page.evaluate("window.grueRun.pointCount()")
    page.wait_for_function(f"() => window.grueRun.pointCount() > {first}", timeout=120_000)
    page.wait_for_function(
        "() => Number(document.querySelector('.chart[data-group=reward]').dataset.points) > 1", timeout=60_000
    )
    expect(page.locator("#status-badge")).to_have_text("running")
    expect(page.locator("#ws-state")).to_have_text("live")
    assert page.locator("#samples-body tr").count() > 0  # newest generations arrived live
    # The page is still the same document (no reload happened while it grew).
    assert page.evaluate("window.performance.getEntriesByType('navigation')[0].type") != "reload"
    _shot(page, "run")

    # Drop the websocket: the page reconnects by itself, sends its cursor and keeps growing.
    before = page.evaluate("window.grueRun.pointCount()")
    page.evaluate("window.grueRun.disconnect()")
    # Polled in the page at every frame: the state is off "live" for only about a second (the retry
    # comes after 0.75-1.25 s), and expect() from here polls every 500 ms plus a round trip.
    page.wait_for_function("() => document.getElementById('ws-state').textContent !== 'live'", timeout=10_000)
    expect(page.locator("#ws-state")).to_have_text("live", timeout=60_000)
    page.wait_for_function(f"() => window.grueRun.pointCount() > {before}", timeout=120_000)

    # Cancel: a POST with CSRF; the worker stops between iterations and the badge says cancelled.
    page.click("#cancel-btn")
    expect(page.locator("#status-badge")).to_have_text("cancelled", timeout=120_000)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert 0 < run.current_iter < 400
    # No gaps, no duplicates across the reconnect: the page holds exactly the stored (key, step) points.
    stored = MetricPoint.objects.filter(run=run).count()
    page.wait_for_function(f"() => window.grueRun.pointCount() === {stored}", timeout=30_000)
    # Once finished, the page offers retry/delete instead of cancel, without a reload.
    expect(page.locator("#retry-btn")).to_be_visible()
    expect(page.locator("#cancel-btn")).to_be_hidden()


@pytest.mark.django_db(transaction=True)
def test_live_generations_are_inserted_as_text_not_html(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """A generation arriving over the websocket is shown verbatim and never parsed as HTML."""
    from webapp.runs import ingest, protocol, services
    from webapp.runs.broadcast import broadcast
    from webapp.runs.models import RunStatus

    run = services.create_run({"name": "xss"}, user=researcher)
    run.status = RunStatus.RUNNING
    run.save(update_fields=["status"])
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    expect(page.locator("#ws-state")).to_have_text("live")
    payload = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
    rows = ingest.ingest_samples(
        run.pk,
        3,
        "train",
        [{"prompt": f"p {payload}", "generation": f"g {payload}", "references": [], "reward": 0.5}],
    )
    # Broadcast from another thread: Playwright's event loop occupies this one.
    sender = threading.Thread(target=broadcast, args=(run.pk, protocol.samples_message(rows)))
    sender.start()
    sender.join()
    cell = page.locator("#samples-body td.generation").first
    expect(cell).to_have_text(f"g {payload}")
    assert page.locator("#samples-body img, #samples-body script").count() == 0
    assert page.evaluate("window.__xss") is None


@pytest.mark.django_db(transaction=True)
def test_zoom_fetches_full_resolution(page: Any, asgi_server: Any, researcher: Any, login: Any) -> None:
    """The overview of a long metric is downsampled; zooming loads every point of the range."""
    from webapp.runs import ingest, services

    run = services.create_run({"name": "long"}, user=researcher)
    ingest.ingest_metrics(run.pk, [("train/reward_mean", s, (s % 97) / 97) for s in range(20_000)])
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    chart = "document.querySelector('.chart[data-group=reward]')"
    # Points arrive in memory before the chart is drawn (a render is queued for the next frame), so
    # wait for the drawn trace, not for pointCount(): reading .data between the two failed in CI.
    page.wait_for_function(
        f"() => {{ const c = {chart}; return !!(c && c.data && c.data[0] && c.data[0].x.length); }}"
    )
    overview = page.evaluate(f"{chart}.data[0].x.length")
    assert 0 < overview < 20_000  # downsampled by the server
    page.evaluate(f"Plotly.relayout({chart}, {{'xaxis.range': [1000, 1300]}})")
    page.wait_for_function(f"() => {chart}.dataset.zoomed === '1000:1300'")
    page.wait_for_function(f"() => {chart}.data[0].x.length === 301")  # every step of the range
    page.evaluate(f"Plotly.relayout({chart}, {{'xaxis.autorange': true}})")
    page.wait_for_function(f"() => {chart}.data[0].x.length === {overview}")
    # The smoothing is a debiased EMA; by hand for alpha = 0.5 over [1, 2, gap, 4]:
    # 0.5/0.5 = 1, (0.25 + 1)/0.75 = 5/3, gap, (0.625 + 2)/0.875 = 3.
    smoothed = page.evaluate("GrueCharts.ema([1, 2, null, 4], 0.5)")
    assert smoothed[2] is None
    assert [round(v, 6) for v in (smoothed[0], smoothed[1], smoothed[3])] == [1.0, round(5 / 3, 6), 3.0]


# The order in which charts.js finished drawing the run page's charts (each sets data-points on its
# .chart right after Plotly drew it), recorded from the first byte of the page.
RECORD_DRAW_ORDER = """
window.__drawOrder = [];
new MutationObserver((records) => {
  for (const r of records) {
    const el = r.target;
    if (el.classList.contains("chart") && !window.__drawOrder.includes(el.id)) window.__drawOrder.push(el.id);
  }
}).observe(document, {subtree: true, attributes: true, attributeFilter: ["data-points"]});
"""


@pytest.mark.django_db(transaction=True)
def test_run_page_first_paint_grid_order_and_caching(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """A run page with a chart per group: the charts form a grid of readable width (the compare
    page's flex rule once squeezed all eight into one row of ~60 px wide charts), those on the
    first screen are drawn first and those far below it only when the page scrolls near them, the
    page asks for no action buttons it already has, and a second visit takes the plotly bundle from
    the browser's cache (versioned URL)."""
    from webapp.runs import ingest, services
    from webapp.runs.views import METRIC_GROUPS

    run = services.create_run({"name": "first-paint"}, user=researcher)
    keys = [prefixes[0] + ("mean" if prefixes[0].endswith("/") else "") for _g, _t, prefixes in METRIC_GROUPS]
    keys.append("misc/other")
    ingest.ingest_metrics(run.pk, [(k, s, s * 0.5) for k in keys for s in range(50)])
    login(page, asgi_server.url, researcher)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.add_init_script(RECORD_DRAW_ORDER)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    url = f"{asgi_server.url}/runs/{run.pk}/"
    page.goto(url)
    n = len(keys)
    # Without scrolling: every chart of the first screen is drawn ...
    page.wait_for_function(
        f"() => {{ const c = Array.from(document.querySelectorAll('.chart')); return c.length === {n}"
        " && c.filter((el) => el.getBoundingClientRect().top < innerHeight)"
        ".every((el) => el.dataset.points && el.querySelector('.main-svg')); }"
    )
    boxes = page.evaluate(
        "() => Array.from(document.querySelectorAll('.chart')).map((el) => {"
        " const b = el.getBoundingClientRect();"
        " return {id: el.id, top: b.top, width: b.width, drawn: Boolean(el.dataset.points)}; })"
    )
    # ... and those far below it (beyond the observer's 300 px margin) wait until the page scrolls
    far = [b for b in boxes if b["top"] > 800 + 400]
    assert far and not any(b["drawn"] for b in far), boxes
    _drawn(page, ".chart")
    page.evaluate("() => window.scrollTo(0, 0)")
    assert all(b["width"] >= 400 for b in boxes), boxes
    rows = sorted({round(b["top"]) for b in boxes})
    assert 2 <= len(rows) < n, boxes  # a grid: several charts per row, several rows
    on_screen = {b["id"] for b in boxes if b["top"] < 800}
    assert on_screen and len(on_screen) < n, boxes
    order = page.evaluate("() => window.__drawOrder")
    assert sorted(order) == sorted(b["id"] for b in boxes)
    assert set(order[: len(on_screen)]) == on_screen, (order, on_screen)
    assert not [u for u in requests if "/actions/" in u], requests  # the buttons came with the page
    plotly_urls = [u for u in requests if "/static/vendor/plotly.min.js?v=" in u]
    assert len(plotly_urls) == 1, requests
    # A second visit: the bundle comes from the cache (no bytes transferred), not from the server.
    page.goto(url)
    page.wait_for_function("() => document.querySelectorAll('.chart .main-svg').length > 0")
    transfer = page.evaluate(
        "() => performance.getEntriesByType('resource')"
        ".filter((e) => e.name.includes('plotly.min.js')).map((e) => e.transferSize)"
    )
    assert transfer == [0], transfer


# --------------------------------------------------------------------------- compare and run table


def _drawn(page: Any, selector: str) -> None:
    """Scroll to each chart under ``selector`` and wait until Plotly has drawn it (the compare page
    draws a chart when it comes near the screen). Predicates are functions, not expressions: the
    pages' CSP forbids the eval Playwright uses for expressions."""
    charts = page.locator(selector)
    for i in range(charts.count()):
        charts.nth(i).scroll_into_view_if_needed()
        charts.nth(i).locator(".main-svg").first.wait_for()


def _overlaps(boxes: list[dict[str, float]]) -> list[tuple[int, int]]:
    """Pairs of tick labels whose boxes intersect."""
    out = []
    for i, a in enumerate(boxes):
        for j, b in enumerate(boxes[i + 1 :], i + 1):
            if (
                a["x"] < b["x"] + b["w"]
                and b["x"] < a["x"] + a["w"]
                and a["y"] < b["y"] + b["h"]
                and b["y"] < a["y"] + a["h"]
            ):
                out.append((i, j))
    return out


@pytest.mark.django_db(transaction=True)
def test_compare_groups_charts_keeps_constant_series_flat_and_ticks_readable(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """The compare page in chromium: charts sit in the run page's groups; the EMA of a constant
    series is that constant at every point (no start-up dip, no rounding drift); tick labels use SI
    suffixes and never overlap; the partial plotly bundle holds exactly the app's trace types."""
    from webapp.runs import ingest, services

    a = services.create_run({"name": "flat-a"}, user=researcher)
    b = services.create_run({"name": "flat-b"}, user=researcher)
    steps = range(0, 20_000, 50)  # 400 points up to step 19,950: the x axis needs "k" ticks
    for run, level in ((a, 0.1), (b, 0.3)):
        ingest.ingest_metrics(
            run.pk,
            [("train/reward_mean", s, level) for s in steps]  # constant
            + [("train/kl", s, 0.01 + (s % 700) / 1e5) for s in steps]
            + [("loss/value", s, 3e-6 * (1 + s / 20_000)) for s in steps]  # micro-scale values
            + [("custom/x", s, s / 1000) for s in steps]
            + [(f"extra/m{i:02d}", s, i) for i in range(30) for s in (0, 1, 2)],  # a long page
        )
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/compare/?ids={a.pk},{b.pk}")
    # Charts are drawn as they come near the screen: the top one now, the last one once scrolled to.
    page.locator("#charts .chart").first.locator(".main-svg").first.wait_for()
    page.wait_for_function("() => document.getElementById('charts').dataset.loaded === '1'")
    last = page.locator("#charts .chart").last
    assert last.get_attribute("data-key") == "extra/m29" and last.locator(".main-svg").count() == 0
    _drawn(page, "#charts .chart")
    # A chart near the screen is drawn empty as soon as it shows, before the series arrive; its curves
    # come a frame after "loaded". The charts read below: wait for their points (2 runs × 400 steps).
    for key in ("train/reward_mean", "loss/value"):
        expect(page.locator(f'#charts .chart[data-key="{key}"]')).to_have_attribute(
            "data-points", str(2 * len(steps))
        )
    groups = page.evaluate(
        "() => Array.from(document.querySelectorAll('#charts .chart-group')).map((g) =>"
        " [g.dataset.group, Array.from(g.querySelectorAll('.chart')).map((c) => c.dataset.key)])"
    )
    assert groups == [
        ["reward", ["train/reward_mean"]],
        ["kl", ["train/kl"]],
        ["loss", ["loss/value"]],
        ["other", ["custom/x"] + [f"extra/m{i:02d}" for i in range(30)]],
    ]
    reward = "document.querySelector('.chart[data-key=\"train/reward_mean\"]')"
    # Every curve of every run is in its chart: a raw trace and its EMA per run.
    names = page.evaluate(f"() => {reward}.data.map((t) => t.name)")
    assert names == [f"#{a.pk} flat-a"] * 2 + [f"#{b.pk} flat-b"] * 2
    ema_of = (
        f"() => {reward}.data.filter((t) => t.hovertemplate.includes('(EMA)')).map((t) => Array.from(t.y))"
    )
    for alpha in ("0.6", "0.99"):
        page.evaluate(
            "(v) => { const s = document.getElementById('smoothing'); s.value = v;"
            " s.dispatchEvent(new Event('input')); }",
            alpha,
        )
        page.wait_for_function(
            "(v) => document.getElementById('smoothing-value').textContent === Number(v).toFixed(2)",
            arg=alpha,
        )
        ema_a, ema_b = page.evaluate(ema_of)
        assert len(ema_a) == len(ema_b) == len(steps)
        assert set(ema_a) == {0.1} and set(ema_b) == {0.3}, alpha  # exactly constant, every point
    # The shared helper itself, on a long constant series and a heavy smoothing.
    assert page.evaluate("() => GrueCharts.ema(new Array(5000).fill(0.1), 0.999).every((v) => v === 0.1)")
    # Readable ticks: SI suffixes (19,950 steps → "k"; 3e-6 → "µ"), no label overlapping another.
    loss = "document.querySelector('.chart[data-key=\"loss/value\"]')"
    for chart in (reward, loss):
        for axis in ("xtick", "ytick"):
            labels = page.evaluate(
                f"() => Array.from({chart}.querySelectorAll('.{axis} text')).map((t) => {{"
                " const r = t.getBoundingClientRect(); return {text: t.textContent, x: r.x, y: r.y, w: r.width, h: r.height}; })"
            )
            assert len(labels) >= 3, (chart, axis, labels)
            assert not _overlaps(labels), (axis, labels)
            assert not any(
                "," in lab["text"] or "e-" in lab["text"] or "e−" in lab["text"] for lab in labels
            ), labels
    x_ticks = page.evaluate(
        f"() => Array.from({reward}.querySelectorAll('.xtick text')).map((t) => t.textContent)"
    )
    assert any(t.endswith("k") for t in x_ticks), x_ticks
    y_ticks = page.evaluate(
        f"() => Array.from({loss}.querySelectorAll('.ytick text')).map((t) => t.textContent)"
    )
    assert any(t.endswith(("μ", "µ")) for t in y_ticks), y_ticks  # Greek mu or micro sign
    # The page loaded the partial bundle: exactly the trace types the app draws.
    traces = page.evaluate("() => Object.keys(Plotly.PlotSchema.get().traces).sort()")
    assert traces == ["bar", "heatmap", "scatter"]
    _shot(page, "compare")


@pytest.mark.django_db(transaction=True)
def test_run_table_with_30_eval_columns_scrolls_inside_its_box(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """30 chosen eval columns at a 1280 px viewport: the page is never wider than the viewport; the
    table scrolls sideways inside its own box."""
    from webapp.runs import services
    from webapp.runs.models import Run

    keys = [f"eval/lexical/rouge_variant_{i:02d}" for i in range(30)]
    for i in range(3):
        run = services.create_run({"name": f"wide-{i}"}, user=researcher)
        Run.objects.filter(pk=run.pk).update(last_metrics={k: 1000.5 + j for j, k in enumerate(keys)})
    page.set_viewport_size({"width": 1280, "height": 900})
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/?metrics={','.join(keys)}")
    assert page.locator("table.runs-table th.metric").count() == 30
    widths = page.evaluate(
        "() => { const box = document.getElementById('runs-table-scroll');"
        " return {page: document.documentElement.scrollWidth, viewport: window.innerWidth,"
        " box: box.clientWidth, table: box.scrollWidth}; }"
    )
    assert widths["viewport"] == 1280
    assert widths["page"] <= widths["viewport"], widths
    assert widths["table"] > widths["box"], widths  # the table scrolls inside its box
    # The box scrolls to the last column; the page itself does not move sideways.
    page.evaluate(
        "() => { const b = document.getElementById('runs-table-scroll'); b.scrollLeft = b.scrollWidth; }"
    )
    last = page.locator("table.runs-table th.metric").last
    expect(last).to_be_in_viewport()
    assert page.evaluate("() => window.scrollX") == 0
    # The column chooser narrows the table back: keep two columns and submit.
    page.click("#column-chooser summary")
    for key in keys[2:]:
        page.uncheck(f'#column-chooser input[value="{key}"]')
    page.click("#column-chooser button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('table.runs-table th.metric').length === 2")
    narrower = page.evaluate("() => document.getElementById('runs-table-scroll').scrollWidth")
    assert narrower < widths["table"] / 2, (narrower, widths)


@pytest.mark.django_db(transaction=True)
def test_run_page_preloads_its_chart_overview_once(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """A first visit requests the chart overview from the HTML (a preload that runs while the
    plotly bundle loads) and the page's script uses that response: one request, not two."""
    from webapp.runs import ingest, services

    run = services.create_run({"name": "preloaded"}, user=researcher)
    ingest.ingest_metrics(run.pk, [("train/reward_mean", s, s / 100) for s in range(100)])
    login(page, asgi_server.url, researcher)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/series.json" in r.url else None)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    page.wait_for_function("() => window.grueRun && window.grueRun.pointCount() === 100")
    assert requests == [f"{asgi_server.url}/runs/{run.pk}/series.json?max_points=1000"]
    initiators = page.evaluate(
        "() => performance.getEntriesByType('resource')"
        ".filter((e) => e.name.includes('/series.json')).map((e) => e.initiatorType)"
    )
    assert initiators == ["link"]


@pytest.mark.django_db(transaction=True)
def test_a_queued_run_no_worker_can_take_says_so_on_its_page(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """A CUDA run waiting in its queue with no GPU worker alive: the page says why it waits (asked
    from the page after it loads), and the note goes when the run is no longer queued."""
    from tests.helpers import tiny_run_config
    from webapp.runs import lifecycle, services
    from webapp.runs.models import Run, RunStatus

    run = services.create_run(tiny_run_config(2, "gpu-wait", resources={"devices": "cuda"}), user=researcher)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED)
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    note = page.locator("#placement-note")
    expect(note).to_be_visible(timeout=30_000)
    expect(note).to_contain_text(
        "Waiting for a worker: no"
    )  # "no worker answered" / "no live worker serves cuda runs"
    # cancelled from another thread (Playwright's loop runs in this one): the broadcast updates the page live
    canceller = threading.Thread(target=lambda: lifecycle.cancel_run(Run.objects.get(pk=run.pk)))
    canceller.start()
    canceller.join(timeout=60)
    expect(page.locator("#status-badge")).to_have_attribute("data-status", "cancelled", timeout=30_000)
    expect(note).to_be_hidden()
