"""Sweeps in a real browser under the enforced Content-Security-Policy.

- The whole flow (issue #11's "done when"): a researcher loads the tiny synthetic PPO preset in the
  launch form, cuts it down there, takes its YAML view as the sweep's base config, goes to a new
  sweep from the launch form, varies the learning rate over 4 values (grid) and launches; two real
  Celery workers train the 4 runs (each takes at least one); the sweep page then draws the
  parallel-coordinates chart with 4 lines and shows the varied field as the one config column.
- The sweep page alone, from hand-ingested metrics: a line per run that has the final metric, and
  none for a run that has not reported it yet (a state the real flow does not reach).

No CSP violation may be reported (Plotly's WebGL ``parcoords`` trace evals code and was refused
here; the page draws SVG lines).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from django.urls import reverse

from tests.conftest import wait_for_condition
from tests.e2e.test_csp_browser import RECORD_VIOLATIONS
from tests.helpers import tiny_run_config
from webapp.runs.ingest import ingest_metrics
from webapp.runs.models import Run, RunStatus

pytestmark = [pytest.mark.e2e]

#: The preset cut down in the form for the test: 2 iterations of 4 prompts, 1 PPO epoch, no
#: evaluation but the final one on 2 samples, no checkpoint.
TINY = {
    "train.n_iters": "2",
    "train.prompts_per_iter": "4",
    "train.eval_every": "0",
    "train.save_every": "0",
    "algorithm.n_epochs": "1",
    "algorithm.minibatch_size": "4",
    "task.max_eval_samples": "2",
}
CSP_ERRORS = ("Content Security Policy", "Refused to", "Error")


def _csp_page(browser: Any) -> tuple[Any, Any, list[str]]:
    """A page whose context enforces the app's CSP, recording violations and console messages."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})  # the CSP is enforced
    page = context.new_page()
    page.set_default_timeout(30_000)
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))
    page.add_init_script(RECORD_VIOLATIONS)
    return context, page, console


@pytest.mark.django_db(transaction=True)
def test_a_sweep_of_4_tiny_runs_over_2_workers_from_the_launch_form(
    two_workers_server, browser, researcher, login
):
    server, workers = two_workers_server
    base = server.url
    lrs = [0.0001, 0.0003, 0.001, 0.003]
    context, page, console = _csp_page(browser)
    login(page, base, researcher)
    # The launch form: the tiny synthetic PPO preset, cut to 2 small iterations in the form.
    page.goto(f"{base}{reverse('runs:launch')}?preset=synthetic_ppo")
    page.wait_for_selector("#preset-description")
    assert page.input_value("input[name=model__name_or_path]") == "builtin:tiny-gpt2"
    for path, value in TINY.items():
        section, field = path.split(".")
        page.click(f"#section-tabs a[data-section={section}]")
        page.fill(f"input[name={section}__{field}]", value)
    # Its YAML view gives the base config of the sweep (what the new-sweep page asks for).
    page.click("#tab-yaml")
    page.wait_for_selector("#pane-yaml textarea")
    config = yaml.safe_load(page.input_value("#pane-yaml textarea"))
    assert config["train"]["n_iters"] == 2 and config["algorithm"]["n_epochs"] == 1
    del config["name"]  # the sweep names its runs
    sweep = {
        "name": "lr-e2e",
        "method": "grid",
        "metric": "train/reward_mean",
        "parameters": {"algorithm.learning_rate": {"values": lrs}},
        "config": config,
    }
    page.click("#new-sweep-link")  # the launch form's way to a sweep
    page.wait_for_url(f"{base}{reverse('runs:sweep_new')}")
    page.fill("textarea[name=sweep_yaml]", yaml.safe_dump(sweep, sort_keys=False))
    page.click("#launch-sweep")
    page.wait_for_url(re.compile(r".*/sweeps/sweep:lr-e2e-[0-9a-f]{6}/$"))
    tag = page.url.rstrip("/").rsplit("/", 1)[1]
    runs = list(Run.objects.filter(tags__contains=[tag]).order_by("id"))
    assert len(runs) == 4
    assert sorted(r.config["algorithm"]["learning_rate"] for r in runs) == lrs

    def all_succeeded() -> bool:
        statuses = list(Run.objects.filter(tags__contains=[tag]).values_list("status", flat=True))
        bad = [s for s in statuses if s in (RunStatus.FAILED, RunStatus.LOST, RunStatus.CANCELLED)]
        assert not bad, (statuses, [w.log()[-3000:] for w in workers])
        return statuses == [RunStatus.SUCCEEDED] * 4

    wait_for_condition(all_succeeded, timeout=300, interval=0.2, what="the sweep's 4 runs to succeed")
    # Each worker runs one run at a time and takes the next message only when its run ends; the
    # four messages are queued at once while both wait on the queue, so the second is taken by the
    # idle worker within milliseconds while the first worker trains for seconds.
    done = list(Run.objects.filter(tags__contains=[tag]))
    by_worker = {w.name: [r.pk for r in done if r.worker_host == w.name] for w in workers}
    assert all(by_worker.values()) and sum(map(len, by_worker.values())) == 4, by_worker
    assert len({r.worker_pid for r in done}) == 2  # two processes, not two names for one

    page.reload()
    page.wait_for_selector('#sweep-parcoords[data-drawn="4"]')
    assert page.locator("#sweep-parcoords .scatterlayer .trace").count() == 4
    axes = page.inner_text("#sweep-parcoords")
    assert "algorithm.learning_rate" in axes and "train/reward_mean" in axes
    # the varied field is the one config column, each run's value in it, all succeeded
    assert page.locator("#sweep-table thead th code").all_inner_texts() == ["algorithm.learning_rate"]
    rows = page.locator("#sweep-table tbody tr")
    assert rows.count() == 4
    cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(4)]
    assert sorted(float(c[1]) for c in cells) == lrs
    assert {c[2] for c in cells} == {"succeeded"}
    assert all(c[3] != "–" for c in cells)  # every run reported the final metric
    violations = page.evaluate("() => window.__csp")
    context.close()
    errors = [m for m in console if any(e in m for e in CSP_ERRORS)]
    assert not violations and not errors, (violations, errors)


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
    cfg = tiny_run_config(2, "lr-3")
    cfg["algorithm"]["learning_rate"] = 0.03
    Run.objects.create(name="lr-3", config=cfg, created_by=researcher, status="running", tags=[tag])
    context, page, console = _csp_page(browser)
    base = asgi_server.url
    login(page, base, researcher)
    resp = page.goto(f"{base}/sweeps/{tag}/")
    assert resp.status == 200
    page.wait_for_selector('#sweep-parcoords[data-drawn="3"]')
    # one line per run with the metric across the 2 axes (learning rate, metric); the running run
    # without it is in the table only
    assert page.locator("#sweep-parcoords .scatterlayer .trace").count() == 3
    assert "train/reward_mean" in page.inner_text("#sweep-parcoords")
    assert page.locator("#sweep-table tbody tr").count() == 4
    assert "algorithm.learning_rate" in page.inner_text("#sweep-table thead")
    violations = page.evaluate("() => window.__csp")
    context.close()
    errors = [m for m in console if any(e in m for e in CSP_ERRORS)]
    assert not violations and not errors, (violations, errors)
