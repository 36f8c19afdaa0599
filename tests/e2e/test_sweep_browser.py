"""The sweep page in a real browser under the enforced Content-Security-Policy: the parallel-
coordinates chart is drawn (one line per run with a final metric) and no CSP violation is reported
(Plotly's WebGL ``parcoords`` trace evals code and was refused here; the page draws SVG lines)."""

from __future__ import annotations

import pytest

from tests.e2e.test_csp_browser import RECORD_VIOLATIONS
from tests.helpers import tiny_run_config
from webapp.runs.ingest import ingest_metrics
from webapp.runs.models import Run

pytestmark = [pytest.mark.e2e]


@pytest.mark.django_db(transaction=True)
def test_sweep_page_draws_parcoords_under_the_csp(asgi_server, browser, researcher, login):
    tag = "sweep:lr-e2e-abc123"
    for i, lr in enumerate((0.001, 0.003, 0.01)):
        cfg = tiny_run_config(2, f"lr-{i}")
        cfg["algorithm"]["learning_rate"] = lr
        run = Run.objects.create(
            name=f"lr-{i}", config=cfg, created_by=researcher, status="succeeded", tags=[tag]
        )
        ingest_metrics(run.pk, [("train/reward_mean", s, 0.1 * s * (i + 1)) for s in range(1, 4)])
    context = browser.new_context(viewport={"width": 1400, "height": 1000})  # the CSP is enforced
    page = context.new_page()
    page.set_default_timeout(30_000)
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))
    page.add_init_script(RECORD_VIOLATIONS)
    base = asgi_server.url
    login(page, base, researcher)
    resp = page.goto(f"{base}/sweeps/{tag}/")
    assert resp.status == 200
    page.wait_for_selector('#sweep-parcoords[data-drawn="3"]')
    # one line per run across the 2 axes (learning rate, metric)
    assert page.locator("#sweep-parcoords .scatterlayer .trace").count() == 3
    assert "train/reward_mean" in page.inner_text("#sweep-parcoords")
    assert page.locator("#sweep-table tbody tr").count() == 3
    assert "algorithm.learning_rate" in page.inner_text("#sweep-table thead")
    violations = page.evaluate("() => window.__csp")
    context.close()
    errors = [m for m in console if "Content Security Policy" in m or "Refused to" in m or "Error" in m]
    assert not violations and not errors, (violations, errors)
