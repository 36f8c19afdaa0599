"""Rubric rewards and the over-optimisation watch in a real browser.

1. A researcher picks the ``rubric`` reward in the generated launch form (by its registered id; the
   rubric is YAML data, never code), the real Celery worker trains the tiny GPT-2 against it with the
   deterministic stub judge, and the run page shows the judge's per-criterion scores: in the
   generations table (live) and in the rubric panel (criteria, weights, mean score per criterion).
2. A run whose gold rises, peaks and falls while its proxy keeps rising (Gao et al.'s shape, written
   as stored metric points): the run page warns, marks the best evaluation and checkpoint by gold and
   draws proxy and gold against step and against √KL; a higher N removes the warning; the compare view
   shows both runs' watches.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.e2e]

RUBRIC_YAML = """criteria:
  - name: numeric
    description: Is the continuation made of numbers?
    weight: 3
    scale: {min: 1, max: 5, labels: {1: no digits, 5: only digits}}
  - name: varied
    description: Are its words distinct?
    scale: {min: 0, max: 4}
judge: {backend: stub, features: {varied: distinct}}
"""


@pytest.mark.django_db(transaction=True)
def test_rubric_reward_selected_in_the_launch_form_shows_per_criterion_scores(
    page: Any, live_server_with_worker: Any, researcher: Any, login: Any
) -> None:
    from webapp.runs.models import Run, Sample

    base = live_server_with_worker.url
    login(page, base, researcher)
    page.goto(f"{base}/launch/?preset=synthetic_ppo", timeout=120_000)  # a shared CPU builds the form slowly
    expect(page.locator("input[name=model__name_or_path]")).to_have_value("builtin:tiny-gpt2")
    page.click("#section-tabs a[data-section=reward]")
    page.select_option("select[name=reward__id]", "rubric")
    page.fill("textarea[name=reward__args]", RUBRIC_YAML)
    page.fill("textarea[name=reward__components]", "")  # the preset's weighted sum had components
    page.click("#section-tabs a[data-section=train]")
    page.fill("input[name=train__n_iters]", "3")
    page.fill("input[name=train__eval_every]", "0")
    page.fill("input[name=train__save_every]", "0")
    page.click("#section-tabs a[data-section=general]")
    page.fill("input[name=name]", "rubric-run")
    page.click("#launch-btn")

    page.wait_for_url(f"{base}/runs/*/", timeout=120_000)
    run = Run.objects.get(name="rubric-run")
    assert run.config["reward"]["id"] == "rubric"
    assert run.config["reward"]["args"]["criteria"][0]["weight"] == 3
    # The judge's scores arrive with the generations, live.
    expect(page.locator("#samples-body")).to_contain_text("rubric/numeric", timeout=180_000)
    expect(page.locator("#samples-body")).to_contain_text("rubric/varied")
    expect(page.locator("#status-badge")).to_have_text("succeeded", timeout=180_000)

    # Each stored sample's reward is the rubric's weighted mean of its stored per-criterion scores.
    rows = list(Sample.objects.filter(run=run, split="train"))
    assert rows
    for s in rows:
        numeric, varied = s.metrics["rubric/numeric"], s.metrics["rubric/varied"]
        assert s.reward == pytest.approx((3 * (numeric - 1) / 4 + varied / 4) / 4, abs=1e-3)

    page.reload(timeout=120_000)
    panel = page.locator("#rubric-panel")
    expect(panel.locator("tr[data-criterion=numeric]")).to_contain_text(
        "Is the continuation made of numbers?"
    )
    expect(panel.locator("tr[data-criterion=numeric]")).to_contain_text("1 = no digits; 5 = only digits")
    expect(panel).to_contain_text("judge stub")
    scores = panel.locator("#rubric-scores tbody tr[data-split=train]")
    expect(scores.first).to_be_visible()
    header = panel.locator("#rubric-scores thead")
    expect(header).to_contain_text("numeric")
    expect(header).to_contain_text("varied")
    # the newest step's mean per criterion, as stored
    newest = max(s.step for s in rows)
    vals = [s.metrics["rubric/varied"] for s in rows if s.step == newest]
    row = panel.locator(f"#rubric-scores tr[data-split=train][data-step='{newest}']")
    expect(row.locator("td").nth(4)).to_have_text(f"{sum(vals) / len(vals):.4g}")


STEPS = [0, 10, 20, 30, 40, 50, 60, 70, 80]
PROXY = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
GOLD = [0.30, 0.40, 0.50, 0.55, 0.60, 0.58, 0.52, 0.45, 0.40]


def _overoptimised_run(researcher: Any, name: str, gold: list[float]) -> Any:
    from webapp.runs import ingest, paths, services
    from webapp.runs.models import Checkpoint

    run = services.create_run({"name": name}, user=researcher)
    points = []
    for s, p, g in zip(STEPS, PROXY, gold):
        points += [("eval/reward_mean", s, p), ("eval/gold", s, g), ("train/kl_episode", s, s / 20)]
        points += [("train/reward_mean", s, p - 0.05), ("eval/meteor", s, 0.2)]
    ingest.ingest_metrics(run.pk, points)
    for s in (20, 60, 80):  # on disk, as the trainer leaves them (pruned ones are not offered)
        path = paths.runs_root() / f"run-{run.pk}/checkpoints/rl-{s:06d}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "state.pt").write_bytes(b"")
        Checkpoint.objects.create(run=run, step=s, path=str(path))
    return run


@pytest.mark.django_db(transaction=True)
def test_overoptimisation_warning_best_checkpoint_and_charts(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    run = _overoptimised_run(researcher, "vader <b>long</b>", GOLD)
    steady = _overoptimised_run(researcher, "steady", sorted(GOLD))
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")

    panel = page.locator("#overopt-panel")
    expect(panel.locator("#overopt-warning")).to_contain_text(
        "the gold fell at 4 consecutive evaluations (steps 40–80"
    )
    expect(panel.locator("#overopt-best")).to_contain_text("Best evaluation by gold: step 40")
    expect(panel.locator("#overopt-best-checkpoint")).to_have_text("60")  # the saved step with the best gold
    expect(panel.locator("#overopt-best")).to_contain_text("rl-000060")
    for chart in ("#overopt-by-step", "#overopt-by-kl"):
        # proxy, gold and the best-by-gold star; 9 + 9 + 1 points
        page.wait_for_function(f"() => document.querySelector('{chart}').dataset.points === '19'")
        assert page.locator(f"{chart} .main-svg").count() > 0
    # the √KL axis: train/kl_episode = step / 20, so the last evaluation sits at sqrt(4) = 2
    xs = page.evaluate("() => document.querySelector('#overopt-by-kl').data[1].x")
    assert xs[-1] == pytest.approx(2.0) and xs[0] == 0
    # the run's name is text, never markup
    expect(page.locator("h1")).to_contain_text("vader <b>long</b>")

    # Four falls do not reach N = 5: no warning, the best checkpoint stays.
    page.fill("#overopt-falls", "5")
    page.click("#overopt-form button[type=submit]")
    expect(panel.locator("#overopt-ok")).to_contain_text("5 consecutive evaluations")
    expect(panel.locator("#overopt-warning")).to_have_count(0)
    # Another evaluation metric as gold: it never fell.
    page.select_option("#overopt-gold", "eval/meteor")
    page.click("#overopt-form button[type=submit]")
    expect(page.locator("#overopt-ok")).to_be_visible()
    assert "gold=eval%2Fmeteor" in page.url

    page.goto(f"{asgi_server.url}/compare/?ids={run.pk},{steady.pk}")
    table = page.locator("#overopt-table")
    expect(table.locator(f"tr[data-run='{run.pk}']")).to_contain_text("Possible reward over-optimisation")
    expect(table.locator(f"tr[data-run='{steady.pk}'] td").nth(4)).to_have_text("—")
    expect(table.locator(f"tr[data-run='{steady.pk}'] td").nth(1)).to_have_text("80")
    page.wait_for_function("() => document.querySelector('#overopt-by-kl').dataset.traces === '6'")


@pytest.mark.django_db(transaction=True)
def test_a_noisy_fall_below_the_best_warns_in_the_browser(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    """The below-the-best rule on the run page: a gold that falls past its peak with noise (never three
    falls in a row) warns from its stored evaluation samples' standard errors; N = 5 asks for more
    evaluations than the four below the best, and the panel says which rules looked."""
    from tests.webapp.test_overopt_errors import _noisy_run

    run = _noisy_run(researcher)
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    panel = page.locator("#overopt-panel")
    expect(panel.locator("#overopt-warning")).to_contain_text(
        "more than 2 standard errors below its best (step 10) at 4 consecutive evaluations (steps 20–50"
    )
    expect(panel.locator("#overopt-best")).to_contain_text("Best evaluation by gold: step 10")
    # proxy and gold, 6 points each, and the star
    page.wait_for_function("() => document.querySelector('#overopt-by-step').dataset.points === '13'")
    page.fill("#overopt-falls", "5")
    page.click("#overopt-form button[type=submit]")
    expect(panel.locator("#overopt-warning")).to_have_count(0)
    expect(panel.locator("#overopt-ok")).to_contain_text(
        "nor stayed more than 2 standard errors below its best at 5 consecutive evaluations"
    )
