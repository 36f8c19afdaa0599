"""Issue 24: the SHIPPED reference file (webapp/grue/reference/grue-imdb.json.gz) loaded by
``manage.py load_reference_runs`` (what ``manage.py up`` does on start), then the GRUE page in chromium:
the IMDB reference table's seed means and stds, the paper beside them, the partial marks and per-cell
seed counts while the grid is unfinished, the chart's bars and error bars, the leaderboard's IMDB row,
and a reference run opened from the run table.

Every expectation is read from the shipped file itself (means and sample stds computed here with
``statistics``), so a re-export with more runs keeps this test valid; when the grid is complete the
same test checks that nothing is marked partial."""

from __future__ import annotations

import io
import statistics
from typing import Any

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from engine.presets import ALGORITHM_LABELS
from engine.study import PERPLEXITY, SENTIMENT, read_reference
from engine.study.paper import PAPER_IMDB
from webapp.grue.reference import REFERENCE_DIR
from webapp.grue.templatetags.grue_extras import metricfmt

pytestmark = [pytest.mark.e2e]

SHIPPED = REFERENCE_DIR / "grue-imdb.json.gz"


def expected_cells(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per cell of the file's grid: its runs (seed order) and, per metric, the mean and the sample std
    (None below two seeds) of the runs' test values."""
    out = {}
    for cell in doc["cells"]:
        runs = sorted((r for r in doc["runs"] if r["cell"] == cell), key=lambda r: r["seed"])
        stats = {}
        for name, key in (("sentiment", SENTIMENT), ("perplexity", PERPLEXITY)):
            vals = [float(r["test"]["metrics"][key]) for r in runs]
            stats[name] = (
                statistics.mean(vals) if vals else None,
                statistics.stdev(vals) if len(vals) >= 2 else None,
            )
        out[cell] = {"runs": runs, **stats}
    return out


def load_shipped() -> str:
    buf = io.StringIO()
    call_command("load_reference_runs", stdout=buf)  # no argument: every shipped file, as `up` does
    return buf.getvalue()


def check_reference_table(page: Any, doc: dict[str, Any], cells: dict[str, dict[str, Any]]) -> None:
    """The reference table: values, std only from two seeds, partial marks and seed counts, run links."""
    n_seeds = len(doc["seeds"])
    expected_runs = len(doc["cells"]) * n_seeds
    partial = len(doc["runs"]) < expected_runs
    banner = page.locator("#reference-partial-grue-imdb")
    if partial:
        expect(banner).to_contain_text(f"Partial: {len(doc['runs'])} of {expected_runs} runs")
    else:
        expect(banner).to_have_count(0)
    table = page.locator("#reference-table-grue-imdb")
    for cell, exp in cells.items():
        row = table.locator(f"tr[data-algorithm='{cell}']")
        expect(row.locator("th")).to_have_text(ALGORITHM_LABELS[cell])
        n = len(exp["runs"])
        paper = PAPER_IMDB[cell]
        expect(row.locator("td.paper")).to_have_text(f"{metricfmt(paper[0])} / {metricfmt(paper[1])}")
        expect(row.locator("td:last-child a")).to_have_count(n)
        cell_partial = 0 < n < n_seeds
        expect(row.locator(".partial-mark")).to_have_count(2 if cell_partial else 0)
        if partial:
            expect(row.locator(".seeds-count")).to_have_text(f"{n} of {n_seeds} seeds")
        else:
            expect(row.locator(".seeds-count")).to_have_count(0)
        if not n:
            expect(row.locator("td.empty")).to_have_count(2)  # no sentiment, no perplexity
            expect(row.locator("td:last-child .empty")).to_have_text("none")
            continue
        for metric in ("sentiment", "perplexity"):
            mean, std = exp[metric]
            td = row.locator(f"td.ref-value[data-metric='{metric}']")
            expect(td.locator(".ref-mean")).to_have_text(metricfmt(mean))
            if std is None:  # one seed: its value, no band
                expect(td.locator(".ref-std")).to_have_count(0)
                expect(td).not_to_contain_text("±")
            else:
                expect(td.locator(".ref-std")).to_have_text(metricfmt(std))


def check_chart(page: Any, doc: dict[str, Any], cells: dict[str, dict[str, Any]]) -> None:
    """The paper chart's reference bars as Plotly drew them: the seed means, an error bar only from two
    seeds, the trace named partial while the grid is unfinished."""
    page.wait_for_function("() => (document.getElementById('chart-paper') || {}).data")
    traces = page.evaluate("() => document.getElementById('chart-paper').data")
    ref = [t for t in traces if t["name"].startswith("reference runs")]
    assert len(ref) == 1, [t["name"] for t in traces]
    partial = len(doc["runs"]) < len(doc["cells"]) * len(doc["seeds"])
    assert ("partial" in ref[0]["name"]) == partial, ref[0]["name"]
    by_label = {ALGORITHM_LABELS[c]: exp for c, exp in cells.items()}
    for x, y, err in zip(ref[0]["x"], ref[0]["y"], ref[0]["error_y"]["array"], strict=True):
        mean, std = by_label[x]["sentiment"]
        assert (y, err) == (pytest.approx(mean), pytest.approx(std)), x


def check_leaderboard_row(page: Any, doc: dict[str, Any], cells: dict[str, dict[str, Any]]) -> None:
    """The leaderboard's IMDB row: each cell with reference runs shows the best seed's test sentiment,
    marked as a reference run (of a partial study while the grid is unfinished), beside the paper."""
    partial = len(doc["runs"]) < len(doc["cells"]) * len(doc["seeds"])
    row = page.locator("#grue-table tr[data-task='imdb']")
    for cell, exp in cells.items():
        td = row.locator(f"td[data-algorithm='{cell}']")
        paper = PAPER_IMDB[cell]
        expect(td.locator(".paper")).to_have_text(
            f"paper (GPT-2): {metricfmt(paper[0])} / {metricfmt(paper[1])}"
        )
        if not exp["runs"]:
            expect(td.locator(".reference-mark")).to_have_count(0)
            continue
        best = max(float(r["test"]["metrics"][SENTIMENT]) for r in exp["runs"])
        expect(td.locator(".cell-metrics li").first.locator("span").last).to_have_text(metricfmt(best))
        expect(td.locator(".reference-mark")).to_contain_text("reference run")
        expect(td.locator(".reference-mark .partial-mark")).to_have_count(1 if partial else 0)


@pytest.mark.django_db(transaction=True)
def test_grue_page_shows_the_shipped_reference_runs_as_the_file_says(
    page: Any, asgi_server: Any, researcher: Any, login: Any
) -> None:
    assert SHIPPED.exists(), f"{SHIPPED} is not shipped"
    doc = read_reference(SHIPPED)
    assert doc["study"] == "grue-imdb" and doc["runs"]
    assert f"from {SHIPPED.name}: {len(doc['runs'])} created" in load_shipped()
    cells = expected_cells(doc)

    # a generous bound on each wait (not a sleep): the GRUE page answers in well under a second, but this
    # test also runs on machines whose cores a long study keeps busy at a higher priority
    page.set_default_timeout(120_000)
    login(page, asgi_server.url, researcher, next_url="/grue/")
    expect(page.locator("#reference-missing-grue-imdb")).to_have_count(0)
    check_reference_table(page, doc, cells)
    check_chart(page, doc, cells)
    check_leaderboard_row(page, doc, cells)

    # the run table lists the study's runs; one of them opens, read-only, with its test evaluation
    page.click("#reference-runs a[href*='tag=study']")
    table = page.locator("tr[data-run-id]")
    expect(table).to_have_count(len(doc["runs"]))
    run = doc["runs"][-1]
    name = f"grue-imdb · {ALGORITHM_LABELS[run['cell']]} · seed {run['seed']}"
    page.locator("tr[data-run-id] td a", has_text=name).click()
    page.wait_for_url(f"{asgi_server.url}/runs/*/")
    expect(page.locator("h1")).to_contain_text(name)
    expect(page.locator("#status-badge")).to_have_text("succeeded")
    expect(page.locator("body")).to_contain_text("Reference run of the grue-imdb")
