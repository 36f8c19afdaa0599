"""The run page's plug-in panels and buttons, the delete page's file rule, and the admin's read-only
fields, through Django's test client against the real database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils.html import escape

from tests.helpers import TINY
from webapp.runs import extensions, ingest, lifecycle, services
from webapp.runs.models import Checkpoint, Run, RunStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def own_panels(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's panels only (the installed apps' panels are registered at start-up)."""
    monkeypatch.setattr(extensions, "_run_panels", {})


def test_run_page_shows_registered_panels_in_order(
    researcher_client: Client, researcher: Any, own_panels: None
) -> None:
    run = services.create_run(TINY, user=researcher, name="paneled")
    seen: list[tuple[str, int]] = []

    def second(request: Any, r: Run) -> str:
        seen.append((request.user.username, r.pk))
        return f'<div id="second-panel">{escape(r.name)}</div>'

    extensions.register_run_panel("second", second, order=20)
    extensions.register_run_panel("first", lambda request, r: '<div id="first-panel">one</div>', order=10)
    extensions.register_run_panel("nothing", lambda request, r: None, order=5)
    html = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert seen == [(researcher.username, run.pk)]
    assert html.index('id="first-panel"') < html.index('id="second-panel">paneled<')
    assert 'data-panel="nothing"' not in html
    # registering a name again replaces the panel
    extensions.register_run_panel("first", lambda request, r: '<div id="first-v2"></div>', order=10)
    html = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="first-v2"' in html and 'id="first-panel"' not in html


def test_actions_fragment_follows_the_runs_state(
    researcher_client: Client, researcher: Any, runs_dir: Any
) -> None:
    """What the page swaps in on a status message: Resume appears once a cancelled run has a
    checkpoint, Cancel disappears once cancel is requested."""
    run = services.create_run(TINY, user=researcher)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    url = f"/runs/{run.pk}/actions/"
    html = researcher_client.get(url).content.decode()
    assert 'id="cancel-form" data-show="active">' in html and "resume-btn" not in html
    lifecycle.cancel_run(run)
    html = researcher_client.get(url).content.decode()
    assert 'id="cancel-form" data-show="active" hidden>' in html
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED, run_dir=str(runs_dir / "x"))
    Checkpoint.objects.create(run_id=run.pk, step=3, path=str(runs_dir / "x" / "ck"))
    html = researcher_client.get(url).content.decode()
    assert 'id="resume-btn"' in html and 'id="retry-btn"' in html
    assert (
        json.loads(
            researcher_client.get(f"/runs/{run.pk}/")
            .content.decode()
            .split('id="run-live-config"')[1]
            .split(">", 1)[1]
            .split("</script>")[0]
        )["actions_url"]
        == url
    )


def test_actions_fragment_needs_the_researcher_role(client: Client, annotator: Any, researcher: Any) -> None:
    run = services.create_run(TINY, user=researcher)
    assert client.get(f"/runs/{run.pk}/actions/").status_code == 302
    client.force_login(annotator)
    assert client.get(f"/runs/{run.pk}/actions/").status_code in (302, 403)


def test_delete_page_offers_file_removal_only_for_the_runs_own_directory(
    researcher_client: Client, researcher: Any, settings: Any, tmp_path: Any
) -> None:
    settings.ALLOWED_ROOTS = [tmp_path]
    d = tmp_path / "cli-run"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    imported = services.import_run_dir(d, user=researcher)
    html = researcher_client.get(f"/runs/{imported.pk}/delete/").content.decode()
    assert 'name="delete_files"' not in html and 'id="files-kept"' in html
    # even a forged POST keeps the files, and says so
    resp = researcher_client.post(f"/runs/{imported.pk}/delete/", {"delete_files": "on"}, follow=True)
    assert "its files were kept" in resp.content.decode()
    assert (d / "config.json").exists() and not Run.objects.filter(pk=imported.pk).exists()

    owned = services.create_run(TINY, user=researcher)
    Run.objects.filter(pk=owned.pk).update(status=RunStatus.RUNNING)
    owned.refresh_from_db()
    run_dir = lifecycle.prepare_run_dir(owned)["train"]["output_dir"]
    Run.objects.filter(pk=owned.pk).update(status=RunStatus.FAILED)
    html = researcher_client.get(f"/runs/{owned.pk}/delete/").content.decode()
    assert 'name="delete_files"' in html
    researcher_client.post(f"/runs/{owned.pk}/delete/", {"delete_files": "on"})
    assert not Run.objects.filter(pk=owned.pk).exists()
    assert not Path(run_dir).exists()


def test_admin_shows_config_run_dir_and_resume_from_read_only(
    admin_user_client: Client, researcher: Any
) -> None:
    run = services.create_run(TINY, user=researcher, name="admin-view")
    Run.objects.filter(pk=run.pk).update(run_dir="/srv/runs/run-x", resume_from="/srv/runs/run-x")
    url = f"/admin/runs/run/{run.pk}/change/"
    html = admin_user_client.get(url).content.decode()
    for field in ("config", "run_dir", "resume_from"):
        assert f'name="{field}"' not in html, field
    assert "/srv/runs/run-x" in html
    form = {
        "name": "renamed",
        "status": "draft",
        "config": json.dumps({"model": {"name_or_path": "/etc"}}),
        "run_dir": "/etc",
        "resume_from": "/etc",
        "tags": "",
        "notes": "",
        "progress": "0",
        "attempts": "0",
        "summary": "{}",
        "last_metrics": "{}",
        "auto_resumes": "0",
    }
    resp = admin_user_client.post(url, form)
    assert resp.status_code == 302, resp.content.decode()[:2000]
    run.refresh_from_db()
    assert run.name == "renamed"  # an editable field changed ...
    assert run.config["model"]["name_or_path"] == "builtin:tiny-gpt2"  # ... the read-only ones did not
    assert run.run_dir == "/srv/runs/run-x" and run.resume_from == "/srv/runs/run-x"


@pytest.mark.django_db
def test_series_answers_gzip_with_the_status_of_one_run_read(
    researcher_client: Client, researcher: Any
) -> None:
    """The chart data is compressed for browsers that accept gzip and carries the run's status
    from the same row read as the 404 check (not a second read)."""
    import gzip

    run = services.create_run(TINY, user=researcher)
    ingest.ingest_metrics(
        run.pk, [(k, s, s / 7) for k in ("train/reward_mean", "loss/policy") for s in range(3000)]
    )
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, error="boom", progress=0.5)
    url = f"/runs/{run.pk}/series.json?max_points=1000"
    packed = researcher_client.get(url, HTTP_ACCEPT_ENCODING="gzip")
    assert packed.status_code == 200 and packed["Content-Encoding"] == "gzip"
    plain = researcher_client.get(url)
    assert not plain.has_header("Content-Encoding")
    body = json.loads(gzip.decompress(packed.content))
    assert body == json.loads(plain.content)
    assert len(packed.content) < len(plain.content) / 2
    assert body["status"]["status"] == "failed" and body["status"]["error"] == "boom"
    assert body["status"]["progress"] == 0.5 and body["run"] == {"id": run.pk, "name": run.name}
    assert set(body["series"]) == {"train/reward_mean", "loss/policy"}
    assert researcher_client.get("/runs/999999/series.json").status_code == 404


@pytest.mark.django_db
def test_series_from_the_cached_text_is_fresh_where_it_must_be(
    researcher_client: Client, researcher: Any
) -> None:
    """The series part is served from the chart cache as finished JSON: the same body as computed,
    a new point of the run is in the next answer (the cache is versioned by the newest metric id),
    and the run's name and status are always read fresh (they change without a new point)."""
    run = services.create_run(TINY, user=researcher)
    ingest.ingest_metrics(run.pk, [("train/reward_mean", s, s / 3) for s in range(10)])
    url = f"/runs/{run.pk}/series.json?max_points=1000"
    first = json.loads(researcher_client.get(url).content)
    again = json.loads(researcher_client.get(url).content)  # from the cached text
    assert again == first and first["series"]["train/reward_mean"]["x"] == list(range(10))
    assert first["groups"] == {"train/reward_mean": "reward"}
    Run.objects.filter(pk=run.pk).update(name="renamed", status=RunStatus.SUCCEEDED, progress=1.0)
    renamed = json.loads(researcher_client.get(url).content)
    assert renamed["run"]["name"] == "renamed" and renamed["status"]["status"] == "succeeded"
    assert renamed["series"] == first["series"]
    ingest.ingest_metrics(run.pk, [("train/reward_mean", 10, 9.0), ("loss/policy", 0, 1.5)])
    grown = json.loads(researcher_client.get(url).content)
    assert grown["series"]["train/reward_mean"]["x"][-1] == 10 and grown["series"]["loss/policy"]["y"] == [
        1.5
    ]
    assert grown["cursor"] > first["cursor"]
