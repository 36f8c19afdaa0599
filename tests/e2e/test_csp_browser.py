"""Every page works under the Content-Security-Policy: the browser reports no CSP violation on the
run list, launch form, a run page with its charts, compare, the GRUE board and annotation, and the
charts and inline scripts (carrying the response's nonce) still run."""

from __future__ import annotations

from typing import Any

import pytest

from webapp.runs.ingest import ingest_metrics
from webapp.runs.models import Run

pytestmark = [pytest.mark.e2e]

RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + (e.sourceFile || "") + ":" + e.lineNumber);
});
"""


@pytest.mark.django_db(transaction=True)
def test_pages_run_under_the_csp_without_violations(asgi_server, browser, researcher, login):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})  # the CSP is enforced
    page = context.new_page()
    page.set_default_timeout(30_000)
    run = Run.objects.create(name="csp-run", config={}, created_by=researcher, status="succeeded")
    ingest_metrics(run.pk, [("train/reward_mean", s, 0.1 * s) for s in range(1, 30)])
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))
    page.add_init_script(RECORD_VIOLATIONS)
    base = asgi_server.url
    login(page, base, researcher)
    violations: dict[str, Any] = {}
    for path in ("/", "/launch/", f"/runs/{run.pk}/", f"/compare/?runs={run.pk}", "/grue/", "/annotate/"):
        resp = page.goto(f"{base}{path}")
        assert resp.status == 200, path
        assert "nonce-" in (resp.headers.get("content-security-policy") or ""), path
        page.wait_for_load_state("networkidle")
        found = page.evaluate("() => window.__csp")
        if found:
            violations[path] = found
        if path == f"/runs/{run.pk}/":
            page.wait_for_selector(".js-plotly-plot", timeout=30_000)  # the charts' scripts ran
    context.close()
    csp_console = [m for m in console if "Content Security Policy" in m or "Refused to" in m]
    assert not violations and not csp_console, (violations, csp_console)
