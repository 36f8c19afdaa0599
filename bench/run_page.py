"""First visit to a run page in Debian chromium (not a test): what a researcher waits for when the
browser has nothing cached, which is dominated by downloading and parsing the plotly bundle.

    DATABASE_URL=... REDIS_URL=... .venv/bin/python bench/run_page.py [--visits 3] [--json out.json]
        [--variants partial,full]

The run is the one of ``bench/ingest.py``'s page benchmark (a 100,000-point reward plus 19 keys of
2,000 points and 20 generations); the server, the session cookie and the key list are reused from
there. Every visit gets a fresh browser context, so its cache is empty (a first visit), and is timed
from navigation start to: DOMContentLoaded, the first chart drawn, every chart drawn. The plotly
bundle's size and download time come from the browser's resource timing.

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
from webapp.runs.models import Run  # noqa: E402
from webapp.runs.views import metric_group  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
BUNDLES = {
    "partial": ingest.ROOT / "webapp" / "static" / "vendor" / "plotly.min.js",
    "full": Path(plotly.__file__).parent / "package_data" / "plotly.min.js",
}
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def make_run() -> Run:
    run = services.create_run({}, name="bench-first-visit", tags=["bench-page"])
    rows = [("train/reward_mean", s, math.sin(s / 500)) for s in range(100_000)]
    services.ingest_metrics(run.pk, rows, returning=False)
    services.ingest_metrics(
        run.pk, [(k, s, 0.1 * s) for k in ingest.KEYS[1:] for s in range(2000)], returning=False
    )
    services.ingest_samples(
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


def first_visits(
    port: int, cookie: str, run_id: int, n_charts: int, visits: int, variants: list[str]
) -> list[dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    name, value = cookie.split("=", 1)
    url = f"http://127.0.0.1:{port}/runs/{run_id}/"
    # A function, not an expression: the page's CSP forbids the eval Playwright uses for expressions.
    drawn = (
        f"() => document.querySelectorAll('.chart .main-svg').length >= {n_charts}"
        " && window.grueRun && window.grueRun.pointCount() > 0"
    )
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
            ctx = browser.new_context()  # empty cache: a first visit
            ctx.add_cookies([{"name": name, "value": value, "domain": "127.0.0.1", "path": "/"}])
            if variant in BUNDLES:
                ctx.route("**/static/vendor/plotly.min.js", serve(BUNDLES[variant].read_bytes()))
            page = ctx.new_page()
            cdp = ctx.new_cdp_session(page)
            cdp.send("Performance.enable")
            t = time.perf_counter()
            page.goto(url, wait_until="domcontentloaded", timeout=120_000)
            dom = (time.perf_counter() - t) * 1000
            page.wait_for_selector(".chart .main-svg", timeout=120_000)
            first = (time.perf_counter() - t) * 1000
            page.wait_for_function(drawn, timeout=120_000)
            every = (time.perf_counter() - t) * 1000
            # The renderer's main-thread time (seconds of script, layout, all tasks): less sensitive
            # to other jobs on a shared machine than wall time.
            perf = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
            resources = page.evaluate(
                """() => performance.getEntriesByType('resource')
                     .filter((e) => e.name.includes('plotly') || e.name.includes('series'))
                     .map((e) => ({url: e.name, bytes: e.encodedBodySize, start: e.startTime, ms: e.duration}))"""
            )
            out.append(
                {
                    "variant": variant,
                    "dom_content_loaded": dom,
                    "first_chart": first,
                    "every_chart": every,
                    "script_ms": perf["ScriptDuration"] * 1000,
                    "main_thread_ms": perf["TaskDuration"] * 1000,
                    "resources": resources,
                }
            )
            ctx.close()
        browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--visits", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--variants", default="server", help="comma list of: partial, full, server")
    args = ap.parse_args()
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
    results["median_ms"] = {
        variant: {
            mark: statistics.median(v[mark] for v in visits if v["variant"] == variant)
            for mark in ("dom_content_loaded", "first_chart", "every_chart", "script_ms", "main_thread_ms")
        }
        for variant in variants
    }
    results["load_avg_1m_end"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
