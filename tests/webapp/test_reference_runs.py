"""Reference runs (webapp/grue/reference.py): a real tiny study (engine smoke budget, two cells x two seeds)
exported, loaded into PostgreSQL by ``manage.py load_reference_runs`` idempotently, shown on the GRUE page
and in the run table, and refused every state change (delete, cancel, resume, retry) server-side."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from engine.study import PERPLEXITY, SENTIMENT, export_reference, read_reference, run_study
from webapp.grue import reference
from webapp.runs import lifecycle, services
from webapp.runs.errors import InvalidState
from webapp.runs.models import MetricPoint, Run, Sample

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory) -> Path:
    """Zero-shot (seeds 0 and 1) and PPO (seed 0) on the builtin tiny GPT-2: three real runs, exported."""
    out = tmp_path_factory.mktemp("refstudy")
    quiet = {"budget": "smoke", "say": lambda m: None}
    results = run_study("grue-imdb", out, seeds=[0], cells=["zero_shot", "ppo"], **quiet)
    results += run_study("grue-imdb", out, seeds=[1], cells=["zero_shot"], **quiet)
    assert [r["status"] for r in results] == ["done"] * 3
    return export_reference(out, out / "grue-imdb.json.gz")


def load(*paths: Path) -> str:
    buf = io.StringIO()
    call_command("load_reference_runs", *map(str, paths), stdout=buf)
    return buf.getvalue()


@pytest.fixture
def no_shipped_file(monkeypatch, tmp_path):
    """The page's message depends on whether a file is shipped: pin it to 'none shipped'."""
    monkeypatch.setattr(reference, "REFERENCE_DIR", tmp_path / "none")


def test_page_says_reference_runs_are_not_yet_available(researcher_client, no_shipped_file):
    html = researcher_client.get("/grue/").content.decode()
    assert 'id="reference-missing-grue-imdb"' in html and "not yet available" in html
    assert "has not been run and shipped yet" in html
    assert researcher_client.get("/grue/data.json").json()["reference"][0]["n_runs"] == 0
    assert "none shipped yet" in load()


def test_loader_is_idempotent_and_the_page_and_run_table_show_the_runs(
    researcher_client, tiny_reference, no_shipped_file
):
    assert "3 created, 0 replaced, 0 unchanged, 0 removed" in load(tiny_reference)
    runs = list(reference.reference_runs("grue-imdb").order_by("id"))
    ids = [r.pk for r in runs]
    n_points, n_samples = (
        MetricPoint.objects.filter(run_id__in=ids).count(),
        Sample.objects.filter(run_id__in=ids).count(),
    )
    assert "0 created, 0 replaced, 3 unchanged, 0 removed" in load(tiny_reference)
    assert [r.pk for r in reference.reference_runs("grue-imdb").order_by("id")] == ids
    assert MetricPoint.objects.filter(run_id__in=ids).count() == n_points
    assert Sample.objects.filter(run_id__in=ids).count() == n_samples

    doc = read_reference(tiny_reference)
    ppo = next(
        r for r in runs if r.summary["reference"]["cell"] == "ppo" and r.summary["reference"]["seed"] == 0
    )
    assert ppo.status == "succeeded" and set(ppo.tags) == {"reference", "study:grue-imdb"}
    assert ppo.algorithm == "ppo" and ppo.task == "imdb" and ppo.model_name == "builtin:tiny-gpt2"
    steps = list(
        MetricPoint.objects.filter(run=ppo, key="train/reward_mean")
        .order_by("step")
        .values_list("step", flat=True)
    )
    assert steps == [1, 2]
    exported = next(r for r in doc["runs"] if r["key"] == "ppo-seed0")
    assert ppo.summary["eval"][f"eval/{SENTIMENT}"] == pytest.approx(exported["test"]["metrics"][SENTIMENT])
    assert ppo.last_metrics[f"test/{PERPLEXITY}"] == pytest.approx(exported["test"]["metrics"][PERPLEXITY])
    assert Sample.objects.filter(run=ppo, split="test").count() == len(exported["test_samples"])

    # the GRUE page: mean ± std over the two seeds beside the paper's numbers, linked runs
    data = researcher_client.get("/grue/data.json").json()
    study = next(s for s in data["reference"] if s["study"] == "grue-imdb")
    cell = next(c for c in study["cells"] if c["algorithm"] == "zero_shot")
    vals = [r["test"]["metrics"][SENTIMENT] for r in doc["runs"] if r["cell"] == "zero_shot"]
    assert len(vals) == 2
    assert cell["sentiment"]["mean"] == pytest.approx(sum(vals) / 2)
    assert cell["sentiment"]["std"] == pytest.approx(abs(vals[0] - vals[1]) / 2**0.5)
    assert cell["paper"] == {"sentiment": 0.489, "perplexity": 32.17} and len(cell["runs"]) == 2
    ppo_cell = next(c for c in study["cells"] if c["algorithm"] == "ppo")
    assert len(ppo_cell["runs"]) == 1 and ppo_cell["sentiment"]["std"] is None
    html = researcher_client.get("/grue/").content.decode()
    assert 'id="reference-table-grue-imdb"' in html and "reference-missing-grue-imdb" not in html
    assert f'href="/runs/{ppo.pk}/"' in html and "0.489 / 32.17" in html and " ± " in html
    # and the leaderboard's IMDB cells are filled by them (the test evaluation is their final evaluation)
    imdb = next(row for row in data["tasks"] if row["task"] == "imdb")
    assert {c["algorithm"] for c in imdb["cells"] if c["run"]} == {"zero_shot", "ppo"}
    # three of the grid's 12 runs (6 cells x seeds 0, 1): shown as partial, each cell with its seed count
    assert (study["partial"], study["n_runs"], study["expected_runs"]) == (True, 3, 12)
    assert 'id="reference-partial-grue-imdb"' in html and "Partial: 3 of 12 runs" in html
    assert "2 of 2 seeds" in html and "1 of 2 seeds" in html
    # the run table, filtered by the study's tag
    table = researcher_client.get("/", {"tag": "study:grue-imdb"}).content.decode()
    assert all(r.name in table for r in runs)


def test_a_reexported_run_is_replaced_and_a_dropped_one_removed(tiny_reference, tmp_path, db):
    load(tiny_reference)
    doc = read_reference(tiny_reference)
    doc["runs"][0]["test"]["metrics"][SENTIMENT] = 0.987
    dropped = doc["runs"].pop()
    changed = tmp_path / "grue-imdb.json.gz"
    with gzip.open(changed, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh)
    assert "0 created, 1 replaced, 1 unchanged, 1 removed" in load(changed)
    keys = {r.summary["reference"]["key"]: r for r in reference.reference_runs("grue-imdb")}
    assert dropped["key"] not in keys and len(keys) == 2
    assert keys[doc["runs"][0]["key"]].summary["eval"][f"eval/{SENTIMENT}"] == 0.987


def test_reference_runs_are_read_only_server_side(researcher_client, researcher, tiny_reference, db):
    load(tiny_reference)
    run = reference.reference_runs("grue-imdb").first()
    assert not any(lifecycle.actions(run).values())
    page = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="delete-btn" data-show="finished" hidden' in page and "Reference run of the grue-imdb" in page
    for call in (
        lambda: lifecycle.delete_run(run),
        lambda: lifecycle.cancel_run(run),
        lambda: lifecycle.resume_run(run),
        lambda: lifecycle.retry_run(run, user=researcher),
    ):
        with pytest.raises(InvalidState, match="reference run"):
            call()
    # the views refuse too, and the run is still there with its points
    n_points = MetricPoint.objects.filter(run=run).count()
    researcher_client.post(f"/runs/{run.pk}/delete/")
    researcher_client.post(f"/runs/{run.pk}/cancel/")
    assert Run.objects.filter(pk=run.pk, status="succeeded").exists()
    assert MetricPoint.objects.filter(run=run).count() == n_points > 0
    # its tags and notes are fixed too: the form is not offered and a POST is refused
    tags, notes = list(run.tags), run.notes
    assert f'action="/runs/{run.pk}/meta/"' not in page and 'id="reference-meta"' in page
    with pytest.raises(InvalidState, match="reference run"):
        services.update_run_meta(run, tags="", notes="mine now")
    researcher_client.post(f"/runs/{run.pk}/meta/", {"tags": "", "notes": "mine now"})
    run.refresh_from_db()
    assert run.tags == tags and "reference" in tags and run.notes == notes
    # the mark is not the tag, and only the loader sets the tag: a person's run cannot take it, and a
    # clone of a reference run is an ordinary run without it
    mine = services.create_run(run.config, user=researcher, tags=["reference", "mine"])
    assert mine.tags == ["mine"] and not lifecycle.is_reference(mine) and lifecycle.can_delete(mine)
    services.update_run_meta(mine, tags="reference, x")
    assert mine.tags == ["x"]
    clone = services.clone_run(run, user=researcher)
    assert "reference" not in clone.tags and not lifecycle.is_reference(clone)


def test_a_complete_grid_is_not_marked_partial(researcher_client, tiny_reference, tmp_path, no_shipped_file):
    """The same runs as a file whose grid they fill (Zero-shot x seeds 0, 1 and PPO x seed 0 dropped to
    one cell): no partial banner. Loading it re-stamps the unchanged runs with the new grid."""
    doc = read_reference(tiny_reference)
    doc["cells"], doc["seeds"] = ["zero_shot"], [0, 1]
    doc["runs"] = [r for r in doc["runs"] if r["cell"] == "zero_shot"]
    full = tmp_path / "grue-imdb.json.gz"
    with gzip.open(full, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh)
    load(tiny_reference)
    assert "0 created, 2 replaced, 0 unchanged, 1 removed" in load(full)
    study = next(
        s for s in researcher_client.get("/grue/data.json").json()["reference"] if s["study"] == "grue-imdb"
    )
    assert (study["partial"], study["n_runs"], study["expected_runs"]) == (False, 2, 2)
    assert "reference-partial-grue-imdb" not in researcher_client.get("/grue/").content.decode()
