"""First visit to a run page in Debian chromium (not a test): what a researcher waits for when the
browser has nothing cached, then the repeat visit in the same browser context.

    DATABASE_URL=... REDIS_URL=... .venv/bin/python bench/run_page.py [--visits 3] [--json out.json]
        [--variants partial,full]

The run is the one of ``bench/ingest.py``'s page benchmark (a 100,000-point reward plus 19 keys of
2,000 points and 20 generations: 8 chart groups); the server, the session cookie and the key list
are reused from there. Every visit gets a fresh browser context (1280 x 800), so its cache is
empty (a first visit); a second page in the same context is the repeat visit. Marks, in the page's
own clock from navigation start (``performance.now()``, no Playwright round trip in them):
DOMContentLoaded; the first chart drawn; **every chart of the first screen drawn** (the "first
visit" of issue #13 since 2026-12-01, when the run page began drawing charts below the first screen
only as they come near it: as many ``.chart`` elements as the run has groups, and each one of the
first screen with Plotly's SVG and the ``data-points`` mark charts.js sets after drawing it; from
2026-11-30 to 2026-12-01 the mark was every chart of the page, all drawn without scrolling, and
before that this bench counted ``.main-svg`` elements, of which Plotly makes 3 per chart); then the
rest of the page scrolled through chart by chart (first scroll → last chart drawn). Also: the
renderer's script, layout and main-thread time up to the first screen (Chrome's Performance metrics:
less sensitive to other jobs on a shared machine than wall time), the number of requests and the
bytes transferred (resource timing; 0 for a cache hit).

``--variants`` compares bundles under the same machine load: visits alternate between them, and the
browser gets each bundle's bytes from Playwright (the same way for every variant): ``partial`` is
the committed webapp/static/vendor/plotly.min.js, ``full`` the complete bundle of the plotly wheel,
``server`` (the default) leaves the request to the app.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ingest  # noqa: E402  (sets up Django; reused: daphne, cookie, keys)
import plotly  # noqa: E402
from django.contrib.auth.models import Group, User  # noqa: E402
from django.core.management import call_command  # noqa: E402

from webapp.runs import services  # noqa: E402
from webapp.runs.ingest import ingest_metrics, ingest_samples  # noqa: E402
from webapp.runs.models import Run  # noqa: E402
from webapp.runs.views import metric_group  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
BUNDLES = {
    "partial": ingest.ROOT / "webapp" / "static" / "vendor" / "plotly.min.js",
    "full": Path(plotly.__file__).parent / "package_data" / "plotly.min.js",
}
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
VIEWPORT = {"width": 1280, "height": 800}


def make_run() -> Run:
    run = services.create_run({}, name="bench-first-visit", tags=["bench-page"])
    rows = [("train/reward_mean", s, math.sin(s / 500)) for s in range(100_000)]
    ingest_metrics(run.pk, rows, returning=False)
    ingest_metrics(run.pk, [(k, s, 0.1 * s) for k in ingest.KEYS[1:] for s in range(2000)], returning=False)
    ingest_samples(
        run.pk,
        99_999,
        "train",
        [{"prompt": f"p{i}", "generation": "g " * 30, "reward": 0.5} for i in range(20)],
    )
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    return run


def serve(body: bytes) -> Any:
    """A Playwright route handler answering with ``body`` as JavaScript."""

    def handler(route: Any, request: Any) -> None:
        route.fulfill(status=200, body=body, headers={"Content-Type": "application/javascript"})

    return handler


# In-page marks (when each chart was drawn, navigation timing, resources): shared with bench/ingest.py.
RECORD_DRAWS = ingest.RECORD_DRAWS
READ_MARKS = ingest.READ_MARKS


def first_visits(
    port: int, cookie: str, run_id: int, n_charts: int, visits: int, variants: list[str]
) -> list[dict[str, Any]]:
    """First visits (fresh browser context each: empty cache) and, after each, a repeat visit in
    the same context (what a researcher sees when coming back to a run page)."""
    from playwright.sync_api import sync_playwright

    name, value = cookie.split("=", 1)
    url = f"http://127.0.0.1:{port}/runs/{run_id}/"
    # "First screen drawn": as many .chart elements as the run has chart groups, and each of those in
    # the first screen with Plotly's SVG and the data-points mark charts.js sets after drawing it.
    # (Counting .main-svg elements alone, as this bench once did, is satisfied after 3 charts: Plotly
    # makes 3 per chart.) Charts below draw when the page scrolls near them: scroll_through.
    drawn = ingest.first_screen_drawn(n_charts)
    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        # Warm the server's chart cache once so that every measured visit asks the same of it.
        ctx = browser.new_context()
        ctx.add_cookies([{"name": name, "value": value, "domain": "127.0.0.1", "path": "/"}])
        page = ctx.new_page()
        page.goto(url, timeout=120_000)
        page.wait_for_function(drawn, timeout=120_000)
        ctx.close()
        for visit in range(visits * len(variants)):
            variant = variants[visit % len(variants)]
            ctx = browser.new_context(viewport=VIEWPORT)  # empty cache: a first visit
            ctx.add_cookies([{"name": name, "value": value, "domain": "127.0.0.1", "path": "/"}])
            ctx.add_init_script(RECORD_DRAWS)
            if variant in BUNDLES:
                ctx.route("**/static/vendor/plotly.min.js*", serve(BUNDLES[variant].read_bytes()))
            row: dict[str, Any] = {"variant": variant}
            for kind in ("first", "repeat"):
                page = ctx.new_page()
                cdp = ctx.new_cdp_session(page)
                cdp.send("Performance.enable")
                t = time.perf_counter()
                page.goto(url, wait_until="domcontentloaded", timeout=120_000)
                page.wait_for_function(drawn, timeout=120_000)
                wall = (time.perf_counter() - t) * 1000
                # The renderer's main-thread time (seconds of script, layout, all tasks): less
                # sensitive to other jobs on a shared machine than wall time.
                perf = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
                marks = page.evaluate(READ_MARKS)
                times = [c["t"] for c in marks["charts"] if c.get("t") is not None]
                row[kind] = {
                    "dom_content_loaded": marks["dom_content_loaded"],
                    "first_chart": min(times),
                    "visible_charts": max(c["t"] for c in marks["charts"] if c["onScreen"]),
                    "visible_charts_wall": wall,
                    "charts_drawn_unscrolled": len(times),
                    "rest_scrolled_through": ingest.scroll_through(page),
                    "script_ms": perf["ScriptDuration"] * 1000,
                    "layout_ms": perf["LayoutDuration"] * 1000,
                    "main_thread_ms": perf["TaskDuration"] * 1000,
                    "requests": len(marks["resources"]),
                    "bytes": sum(r["bytes"] for r in marks["resources"]),
                    "html_response_end": marks["html_response_end"],
                    "resources": marks["resources"],
                }
                page.close()
            out.append(row)
            ctx.close()
        browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--visits", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--variants", default="server", help="comma list of: partial, full, server (or a --bundle name)"
    )
    ap.add_argument(
        "--bundle",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another plotly bundle to compare as variant NAME (e.g. a rebuilt one); repeatable",
    )
    args = ap.parse_args()
    for spec in args.bundle:
        name, _, path = spec.partition("=")
        BUNDLES[name] = Path(path)
    call_command("migrate", verbosity=0)
    user, _ = User.objects.get_or_create(username="bench-researcher")
    user.groups.add(Group.objects.get_or_create(name="researcher")[0])
    Run.objects.filter(tags__contains=["bench-page"]).delete()
    run = make_run()
    n_charts = len({metric_group(k) for k in ingest.KEYS})
    results: dict[str, Any] = {"load_avg_1m": os.getloadavg()[0]}
    port = ingest.free_port()
    proc = ingest.start_daphne(port)
    try:
        variants = [v for v in args.variants.split(",") if v]
        visits = first_visits(port, ingest.session_cookie(user), run.pk, n_charts, args.visits, variants)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        run.delete()
    results["visits"] = visits
    marks = (
        "dom_content_loaded",
        "first_chart",
        "visible_charts",
        "visible_charts_wall",
        "rest_scrolled_through",
    )
    marks += ("script_ms", "layout_ms", "main_thread_ms", "requests", "bytes")
    results["median_ms"] = {
        f"{variant} {kind}": {
            mark: statistics.median(v[kind][mark] for v in visits if v["variant"] == variant)
            for mark in marks
        }
        for variant in variants
        for kind in ("first", "repeat")
    }
    results["load_avg_1m_end"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
