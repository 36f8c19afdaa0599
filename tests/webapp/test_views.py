"""Pages of the experiment manager through Django's test client against the real PostgreSQL and
Redis broker: access per role, the launch form (invalid → field errors and nothing queued), YAML
round trip, run actions, run table state and query count, compare, escaping, import, exports."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import Client
from django.utils import timezone

from tests.helpers import TINY
from webapp.runs import ingest, lifecycle, services
from webapp.runs.forms import default_config, form_data_from_config, schema_fields
from webapp.runs.models import MetricPoint, Run, RunLog, RunStatus, Sample


def queued(queue: str) -> int:
    return redis.Redis.from_url(settings.REDIS_URL).llen(queue)


def make_run(user: Any = None, **kw: Any) -> Run:
    cfg = json.loads(json.dumps(kw.pop("config", TINY)))
    run = services.create_run(cfg, user=user, name=kw.pop("name", None), tags=kw.pop("tags", None))
    for k, v in kw.items():
        setattr(run, k, v)
    run.save()
    return run


def launch_data(config: dict[str, Any] | None = None, **extra: str) -> dict[str, str]:
    cfg = json.loads(json.dumps(default_config()))
    for section, values in (config or TINY).items():
        if isinstance(values, dict):
            cfg[section].update(values)
        else:
            cfg[section] = values
    data = form_data_from_config(cfg)
    data.update({"action": "launch", "tags": "", "notes": ""})
    data.update(extra)
    return data


# --------------------------------------------------------------------------- access


PAGES = ["/", "/launch/", "/import/", "/compare/?ids=1,2"]


@pytest.mark.django_db
def test_every_page_needs_login_and_the_researcher_role(
    client: Client, annotator: Any, nobody: Any, researcher: Any
) -> None:
    run = make_run(researcher)
    pages = [
        *PAGES,
        f"/runs/{run.pk}/",
        f"/runs/{run.pk}/series.json",
        f"/runs/{run.pk}/metrics.csv",
        f"/runs/{run.pk}/delete/",
        f"/runs/{run.pk}/clone/",
    ]
    for url in pages:
        r = client.get(url)
        assert r.status_code == 302 and r["Location"].startswith("/accounts/login/"), url
    client.force_login(annotator)
    for url in pages:
        r = client.get(url)
        assert r.status_code == 302 and r["Location"] == "/annotate/", url
    for url in [f"/runs/{run.pk}/cancel/", f"/runs/{run.pk}/delete/", "/launch/"]:
        assert client.post(url, {}).status_code == 302, url
    run.refresh_from_db()
    assert run.status == RunStatus.DRAFT
    client.force_login(nobody)
    assert client.get("/").status_code == 403
    client.force_login(researcher)
    for url in pages:
        assert client.get(url).status_code in (200, 302), url


@pytest.mark.django_db
def test_post_actions_require_csrf(researcher: Any, scratch_queue: str) -> None:
    run = make_run(researcher)
    c = Client(enforce_csrf_checks=True)
    c.force_login(researcher)
    assert c.post(f"/runs/{run.pk}/cancel/").status_code == 403
    assert c.post(f"/runs/{run.pk}/delete/").status_code == 403
    assert c.post("/launch/", launch_data()).status_code == 403
    assert Run.objects.count() == 1 and queued(scratch_queue) == 0
    page = c.get(f"/runs/{run.pk}/").content.decode()
    assert page.count("csrfmiddlewaretoken") >= 3  # cancel, retry, delete/meta forms


# --------------------------------------------------------------------------- launch


@pytest.mark.django_db
def test_launch_page_renders_every_schema_field_with_help(researcher_client: Client) -> None:
    r = researcher_client.get("/launch/")
    assert r.status_code == 200
    html = r.content.decode()
    for spec in schema_fields():
        assert f'name="{spec.name}"' in html, spec.path
    # help text from the field description, escaped as the template does
    assert "Learning rate (AdamW; A2C: its optimizer; TRPO: the critic only)." in html
    assert 'id="section-algorithm"' in html and 'data-group="algorithm.nlpo"' in html
    assert 'name="csrfmiddlewaretoken"' in html


@pytest.mark.django_db(transaction=True)
def test_invalid_config_shows_field_errors_and_queues_nothing(
    researcher_client: Client, scratch_queue: str
) -> None:
    data = launch_data()
    data["algorithm__learning_rate"] = "-0.5"
    data["train__n_iters"] = "many"
    data["eval__metrics"] = "- id: not_a_metric"
    r = researcher_client.post("/launch/", data)
    assert r.status_code == 200
    html = r.content.decode()
    for path in ("algorithm.learning_rate", "train.n_iters", "eval.metrics"):
        assert f'data-error-for="{path}"' in html, path
    assert "greater than 0" in html
    assert Run.objects.count() == 0
    assert queued(scratch_queue) == 0
    # the typed values stay in the form
    assert 'value="-0.5"' in html


@pytest.mark.django_db(transaction=True)
def test_model_path_outside_allowed_roots_is_a_field_error(
    researcher_client: Client, scratch_queue: str, settings: Any, tmp_path: Any
) -> None:
    settings.ALLOWED_ROOTS = [tmp_path]
    data = launch_data()
    data["model__name_or_path"] = "/etc"
    html = researcher_client.post("/launch/", data).content.decode()
    assert 'data-error-for="model.name_or_path"' in html and "outside the allowed directories" in html
    assert Run.objects.count() == 0 and queued(scratch_queue) == 0


@pytest.mark.django_db(transaction=True)
def test_valid_launch_creates_run_and_enqueues_once(
    researcher_client: Client, researcher: Any, scratch_queue: str
) -> None:
    data = launch_data(tags="ui, smoke", notes="from the browser")
    data["name"] = "launched-from-form"
    data["algorithm__nlpo__top_mask"] = "0.7"
    r = researcher_client.post("/launch/", data)
    run = Run.objects.get()
    assert r.status_code == 302 and r["Location"] == f"/runs/{run.pk}/"
    assert run.status == RunStatus.QUEUED and run.name == "launched-from-form"
    assert run.created_by == researcher and run.tags == ["ui", "smoke"] and run.notes == "from the browser"
    assert run.config["algorithm"]["nlpo"]["top_mask"] == 0.7
    assert run.config["task"]["id"] == "synthetic_increasing_numbers"
    assert queued(scratch_queue) == 1


@pytest.mark.django_db(transaction=True)
def test_yaml_view_round_trips_and_launches(researcher_client: Client, scratch_queue: str) -> None:
    data = launch_data()
    data["name"] = "yaml-trip"
    data["kl__init_coef"] = "0.33"
    data["action"] = "to_yaml"
    r = researcher_client.post("/launch/", data)
    html = r.content.decode()
    m = re.search(r'<textarea name="config_yaml"[^>]*>(.*?)</textarea>', html, re.S)
    assert m, "YAML textarea missing"
    import html as htmlmod

    import yaml

    text = htmlmod.unescape(m.group(1))
    loaded = yaml.safe_load(text)
    assert loaded["name"] == "yaml-trip" and loaded["kl"]["init_coef"] == 0.33
    # back to the form: the same values fill the widgets
    r = researcher_client.post(
        "/launch/", {"action": "to_form", "config_yaml": text, "tags": "", "notes": ""}
    )
    html = r.content.decode()
    assert 'value="yaml-trip"' in html and 'value="0.33"' in html
    # an invalid YAML config names the dotted paths and queues nothing
    bad = text.replace("init_coef: 0.33", "init_coef: -2") + "\nbogus_section: 1\n"
    r = researcher_client.post(
        "/launch/", {"action": "launch_yaml", "config_yaml": bad, "tags": "", "notes": ""}
    )
    html = r.content.decode()
    assert "kl.init_coef" in html and "bogus_section" in html
    assert Run.objects.count() == 0 and queued(scratch_queue) == 0
    # a syntax error names the line
    r = researcher_client.post(
        "/launch/", {"action": "launch_yaml", "config_yaml": "a: [1,\nb: 2", "tags": "", "notes": ""}
    )
    assert "line" in r.content.decode() and Run.objects.count() == 0
    # a valid YAML launch
    r = researcher_client.post(
        "/launch/", {"action": "launch_yaml", "config_yaml": text, "tags": "y", "notes": ""}
    )
    run = Run.objects.get()
    assert r["Location"] == f"/runs/{run.pk}/" and run.config["kl"]["init_coef"] == 0.33
    assert queued(scratch_queue) == 1


@pytest.mark.django_db
def test_clone_prefills_the_launch_form(researcher_client: Client, researcher: Any) -> None:
    cfg = json.loads(json.dumps(TINY))
    cfg["algorithm"] = {"learning_rate": 7.5e-4}
    run = make_run(researcher, config=cfg, name="origin", tags=["a"])
    r = researcher_client.get(f"/runs/{run.pk}/clone/")
    assert r.status_code == 302 and r["Location"] == f"/launch/?clone={run.pk}"
    html = researcher_client.get(r["Location"]).content.decode()
    assert 'value="origin (clone)"' in html
    assert 'value="0.00075"' in html
    assert f'name="cloned_from" value="{run.pk}"' in html


def input_value(html: str, name: str) -> str | None:
    """The value attribute of the form input called ``name`` (None if it has none)."""
    tag = re.search(rf'<input[^>]*\bname="{re.escape(name)}"[^>]*>', html)
    assert tag, f"no input named {name}"
    value = re.search(r'\bvalue="([^"]*)"', tag.group(0))
    return value.group(1) if value else None


@pytest.mark.django_db
def test_presets_are_offered_and_load(researcher_client: Client) -> None:
    from engine.presets import list_presets

    presets = list_presets()
    assert len(presets) >= 102  # the GRUE grid (8 tasks x 6 algorithms x 2 variants) + quick starts
    html = researcher_client.get("/launch/").content.decode()
    assert f"{len(presets)} presets" in html
    for p in presets:
        assert f'<option value="{p["name"]}" title=' in html, p["name"]
    assert 'id="preset-description"' not in html  # nothing chosen yet

    # loading a preset fills the form with its values and selects it
    r = researcher_client.get("/launch/", {"preset": "imdb_ppo"})
    html = r.content.decode()
    assert r.status_code == 200
    assert '<option value="imdb_ppo" selected title=' in html
    assert '<input type="hidden" name="preset" value="imdb_ppo">' in html
    assert input_value(html, "name") == "imdb_ppo"
    assert input_value(html, "model__name_or_path") == "lvwerra/gpt2-imdb"
    assert input_value(html, "train__n_iters") == "50"
    assert float(input_value(html, "algorithm__learning_rate")) == pytest.approx(1e-6)
    assert "unknown preset" not in html and 'class="msg msg-error"' not in html

    # an unknown name: the error names it (escaped), the form keeps its defaults
    r = researcher_client.get("/launch/", {"preset": "no-such-preset"})
    html = r.content.decode()
    assert r.status_code == 200
    assert '<div class="msg msg-error">Unknown preset “no-such-preset”. Choose one' in html
    # (issue 26.8: a short message, close names when there are some, never all ~170 names; escaped)
    html = researcher_client.get("/launch/", {"preset": "imdb_ppo<b>"}).content.decode()
    assert (
        "Unknown preset “imdb_ppo&lt;b&gt;”. Did you mean imdb_ppo" in html and "synthetic_grpo," not in html
    )
    assert input_value(html, "model__name_or_path") == default_config()["model"]["name_or_path"]


# --------------------------------------------------------------------------- run actions


@pytest.mark.django_db(transaction=True)
def test_cancel_retry_delete_flow(researcher_client: Client, researcher: Any, scratch_queue: str) -> None:
    run = lifecycle.launch_run(TINY, user=researcher)
    assert queued(scratch_queue) == 1
    r = researcher_client.post(f"/runs/{run.pk}/cancel/")
    assert r.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    # GET on an action is refused
    assert researcher_client.get(f"/runs/{run.pk}/cancel/").status_code == 405
    # retry re-queues a run that never started
    researcher_client.post(f"/runs/{run.pk}/retry/")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and queued(scratch_queue) == 2
    # deleting an active run is refused with a message
    r = researcher_client.post(f"/runs/{run.pk}/delete/", follow=True)
    assert Run.objects.filter(pk=run.pk).exists() and b"cancel it before deleting" in r.content
    researcher_client.post(f"/runs/{run.pk}/cancel/")
    confirm = researcher_client.get(f"/runs/{run.pk}/delete/")
    assert b"cannot be undone" in confirm.content and b"csrfmiddlewaretoken" in confirm.content
    r = researcher_client.post(f"/runs/{run.pk}/delete/")
    assert r.status_code == 302 and r["Location"] == "/"
    assert not Run.objects.filter(pk=run.pk).exists()


# --------------------------------------------------------------------------- run page


@pytest.mark.django_db
def test_run_page_escapes_model_and_user_text(researcher_client: Client, researcher: Any) -> None:
    evil = "<script>alert('x')</script>"
    run = make_run(researcher, name=f"name {evil}", notes=f"notes {evil}")
    Sample.objects.create(
        run=run,
        step=1,
        split="train",
        prompt=f"prompt {evil}",
        generation=f"gen {evil}",
        references=[evil],
        reward=0.5,
    )
    RunLog.objects.create(run=run, line=f"log {evil}")
    services.update_run_meta(run, tags=[f"t{evil}"])
    for url in (f"/runs/{run.pk}/", "/"):
        html = researcher_client.get(url).content.decode()
        assert "<script>alert" not in html, url
    html = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert "gen &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "log &lt;script&gt;" in html and "prompt &lt;script&gt;" in html


@pytest.mark.django_db
def test_run_page_and_series_endpoint(researcher_client: Client, researcher: Any) -> None:
    run = make_run(
        researcher,
        status=RunStatus.RUNNING,
        started_at=timezone.now(),
        progress=0.25,
        current_iter=5,
        total_iters=20,
    )
    ingest.ingest_metrics(
        run.pk,
        [("train/reward_mean", s, s / 10) for s in range(50)] + [("loss/policy", s, -s) for s in range(50)],
    )
    html = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="run-live-config"' in html and "/static/vendor/plotly.min.js" in html
    assert "iteration 5 / 20" in html and 'id="cancel-btn"' in html
    live = json.loads(
        re.search(r'<script id="run-live-config" type="application/json">(.*?)</script>', html, re.S).group(1)
    )
    assert live["ws_path"] == f"/ws/runs/{run.pk}/"
    data = researcher_client.get(live["series_url"]).json()
    assert data["cursor"] == MetricPoint.objects.filter(run=run).order_by("-id").first().id
    assert data["series"]["train/reward_mean"]["x"] == list(range(50))
    assert data["groups"] == {"train/reward_mean": "reward", "loss/policy": "loss"}
    # zoom: full resolution inside the range only
    z = researcher_client.get(live["series_url"], {"keys": "loss/policy", "x0": 10, "x1": 14}).json()
    assert list(z["series"]) == ["loss/policy"] and z["series"]["loss/policy"]["x"] == [10, 11, 12, 13, 14]
    # downsampled overview keeps the extremes
    ds = researcher_client.get(live["series_url"], {"keys": "loss/policy", "max_points": 8}).json()
    s = ds["series"]["loss/policy"]
    assert s["downsampled"] and len(s["x"]) < 50 and min(s["y"]) == -49 and max(s["y"]) == 0
    assert researcher_client.get(live["series_url"], {"x0": "abc"}).status_code == 400


@pytest.mark.django_db
def test_metrics_download_csv_and_json(researcher_client: Client, researcher: Any) -> None:
    run = make_run(researcher)
    ingest.ingest_metrics(run.pk, [("train/kl", s, 0.5 * s) for s in range(3)])
    r = researcher_client.get(f"/runs/{run.pk}/metrics.csv")
    assert r["Content-Disposition"].endswith('.csv"')
    rows = list(csv.reader(io.StringIO(b"".join(r.streaming_content).decode())))
    assert rows[0][:5] == ["run_id", "run_name", "key", "step", "value"]
    assert [(row[2], row[3], float(row[4])) for row in rows[1:]] == [
        ("train/kl", str(s), 0.5 * s) for s in range(3)
    ]
    j = researcher_client.get(f"/runs/{run.pk}/metrics.json").json()
    assert j["runs"][0]["metrics"]["train/kl"] == [[0, 0.0], [1, 0.5], [2, 1.0]]
    assert researcher_client.get(f"/runs/{run.pk}/metrics.xml").status_code == 404


# --------------------------------------------------------------------------- run table


def _bulk_runs(n: int, user: Any) -> None:
    objs = []
    for i in range(n):
        algo = ("ppo", "nlpo", "sft")[i % 3]
        cfg = {**default_config(), "name": f"run-{i:04d}"}
        objs.append(
            Run(
                name=f"run-{i:04d}",
                config=cfg,
                status=("succeeded", "failed", "running")[i % 3],
                created_by=user,
                algorithm=algo,
                task=("imdb", "commongen")[i % 2],
                tags=["even"] if i % 2 == 0 else ["odd"],
                last_metrics={"train/reward_mean": i / 1000, "eval/bleu": (n - i) / 1000},
            )
        )
    Run.objects.bulk_create(objs, batch_size=500)


@pytest.mark.django_db
def test_run_table_filters_sort_pagination_with_1000_runs(
    researcher_client: Client, researcher: Any, django_assert_max_num_queries: Any
) -> None:
    _bulk_runs(1000, researcher)
    with django_assert_max_num_queries(12):
        r = researcher_client.get(
            "/", {"sort": "-metric:train/reward_mean", "metrics": "train/reward_mean,eval/bleu"}
        )
    html = r.content.decode()
    names = re.findall(r'<a href="/runs/\d+/">(run-\d{4})</a>', html)
    assert len(names) == 50 and names[0] == "run-0999" and names[1] == "run-0998"
    assert "page 1 / 20" in html
    assert "eval/bleu" in html and "0.999" in html  # metric column value of run-0999 reward
    # filters combine; the URL holds the state and pagination keeps it
    r = researcher_client.get("/", {"algorithm": "nlpo", "tag": "even", "sort": "name", "page": "2"})
    html = r.content.decode()
    names = re.findall(r'<a href="/runs/\d+/">(run-\d{4})</a>', html)
    expected = sorted(f"run-{i:04d}" for i in range(1000) if i % 3 == 1 and i % 2 == 0)
    assert names == expected[50:100]
    assert "algorithm=nlpo" in html and "tag=even" in html and "page=3" in html
    # without a metrics choice the table shows the default columns plus the eval metrics runs report
    html = researcher_client.get("/").content.decode()
    head = r'<th class="num metric" title="([^"]+)"><a [^>]*>([^<]*)/<wbr>([^<]*)</a>'
    headers = re.findall(head, html)  # a line break may follow each "/"
    assert ("train/reward_mean", "train", "reward_mean") in headers
    assert ("eval/bleu", "eval", "bleu") in headers
    # text search and status filter
    r = researcher_client.get("/", {"q": "run-0042"})
    assert re.findall(r'<a href="/runs/\d+/">(run-\d{4})</a>', r.content.decode()) == ["run-0042"]
    r = researcher_client.get("/", {"status": "failed", "task": "imdb"})
    names = re.findall(r'<a href="/runs/\d+/">(run-\d{4})</a>', r.content.decode())
    assert names and all(int(n[4:]) % 3 == 1 and int(n[4:]) % 2 == 0 for n in names)


def _options(html: str, select: str) -> list[str]:
    """The option values of one filter dropdown of the run table."""
    block = re.search(rf'<select name="{select}"[^>]*>(.*?)</select>', html, re.S)
    assert block, select
    return re.findall(r'<option value="([^"]*)"', block.group(1))


@pytest.mark.django_db
def test_run_table_filters_list_each_task_and_algorithm_once(
    researcher_client: Client, researcher: Any
) -> None:
    """60 runs over 2 tasks and 3 algorithms, created at different times: each value once, sorted
    (the model's default ordering by creation time used to make DISTINCT keep one per run)."""
    _bulk_runs(60, researcher)
    html = researcher_client.get("/").content.decode()
    assert _options(html, "task") == ["", "commongen", "imdb"]
    assert _options(html, "algorithm") == ["", "nlpo", "ppo", "sft"]
    assert _options(html, "tag") == ["", "even", "odd"]


@pytest.mark.django_db
def test_run_table_column_chooser_takes_repeated_and_comma_separated_metrics(
    researcher_client: Client, researcher: Any
) -> None:
    keys = [f"eval/metric_{i:02d}" for i in range(30)]
    make_run(researcher, name="wide", last_metrics={k: i / 10 for i, k in enumerate(keys)})
    # the chooser's checkboxes repeat ``metrics``; an old URL's comma list still works
    r = researcher_client.get("/", {"metrics": [keys[3], f"{keys[1]},{keys[2]}", keys[3]]})
    html = r.content.decode()
    headers = re.findall(r'<th class="num metric" title="([^"]+)">', html)
    assert headers == [keys[3], keys[1], keys[2]]
    row = html[html.index('<tr data-run-id="') :]
    assert [c for c in re.findall(r'<td class="num">([^<]*)</td>', row)][1:4] == ["0.3", "0.1", "0.2"]
    # every reported metric is offered in the chooser, the shown ones checked first
    chooser = html[html.index('id="column-chooser"') : html.index("</details>")]
    offered = re.findall(r'name="metrics" value="([^"]+)"( checked)?', chooser)
    assert offered[:3] == [(keys[3], " checked"), (keys[1], " checked"), (keys[2], " checked")]
    assert {k for k, on in offered[3:] if not on} == set(keys) - {keys[1], keys[2], keys[3]}
    # the table sits in its own horizontal scroll box
    assert '<div class="table-scroll" id="runs-table-scroll">' in html


# --------------------------------------------------------------------------- compare


CELL = r'<td class="num( best)?" data-run="(\d+)"[^>]*>([^<]*)</td>'


def _final_cells(html: str) -> dict[tuple[str, int], tuple[str, bool]]:
    """{(metric key, run id): (shown text, highlighted as best)} from the final-metrics table."""
    start = html.index('<table id="final-metrics"')
    table = html[start : html.index("</table>", start)]
    cells = {}
    for key, body in re.findall(r'<tr data-key="([^"]+)">(.*?)</tr>', table, re.S):
        for cls, run_id, text in re.findall(CELL, body):
            cells[(key, int(run_id))] = (text, bool(cls))
    return cells


@pytest.mark.django_db
def test_compare_shows_only_differing_config_keys_finals_and_generations(
    researcher_client: Client, researcher: Any
) -> None:
    a_cfg = json.loads(json.dumps(TINY))
    b_cfg = json.loads(json.dumps(TINY))
    b_cfg["algorithm"] = {"learning_rate": 0.001}
    b_cfg["name"] = "b"
    a = make_run(
        researcher,
        config=a_cfg,
        name="a",
        last_metrics={
            "train/reward_mean": 0.1,
            "loss/value": 0.5,
            "eval/lexical/ter": 0.3,
            "train/kl_coef": 0.2,
        },
    )
    b = make_run(
        researcher,
        config=b_cfg,
        name="b",
        last_metrics={
            "train/reward_mean": 0.9,
            "loss/value": 0.25,
            "eval/lexical/ter": 0.4,
            "train/kl_coef": 0.1,
        },
    )
    for run, gen in ((a, "<b>one</b>"), (b, "two")):
        Sample.objects.create(
            run=run, step=1, split="validation", sample_id="s1", prompt="p1", generation="old"
        )
        Sample.objects.create(
            run=run, step=9, split="validation", sample_id="s1", prompt="p1", generation=gen, reward=1.0
        )
    r = researcher_client.get("/compare/", {"ids": f"{a.pk},{b.pk}"})
    html = r.content.decode()
    start = html.index('id="config-diff"')
    diff_keys = re.findall(r'<tr data-key="([^"]+)">', html[start : html.index("</table>", start)])
    assert set(diff_keys) == {"algorithm.learning_rate", "name"}
    # Final metrics: a row per metric, a column per run, the better value highlighted per metric.
    cells = _final_cells(html)
    assert cells == {
        ("train/reward_mean", a.pk): ("0.1", False),
        ("train/reward_mean", b.pk): ("0.9", True),  # reward: higher is better
        ("train/kl_coef", a.pk): ("0.2", False),  # β: no better direction, nothing highlighted
        ("train/kl_coef", b.pk): ("0.1", False),
        ("loss/value", a.pk): ("0.5", False),
        ("loss/value", b.pk): ("0.25", True),  # loss: lower is better
        ("eval/lexical/ter", a.pk): ("0.3", True),  # TER: lower is better
        ("eval/lexical/ter", b.pk): ("0.4", False),
    }
    # grouped and ordered as the run page's charts
    final = html[html.index('id="final-metrics"') :]
    assert re.findall(r'<tbody data-group="([^"]+)">', final) == ["reward", "kl", "loss", "eval"]
    side = html[html.index('id="side-by-side"') :]
    assert "&lt;b&gt;one&lt;/b&gt;" in side and "two" in side and "old" not in side
    assert f'"series_url": "/runs/{a.pk}/series.json"' in html
    # fewer than two runs → back to the table with a message
    r = researcher_client.get("/compare/", {"ids": str(a.pk)}, follow=True)
    assert b"at least two runs" in r.content


@pytest.mark.django_db
def test_compare_charts_are_grouped_like_the_run_page(researcher_client: Client, researcher: Any) -> None:
    """One chart per metric, inside the run page's groups (views.metric_group), in their order."""
    a = make_run(researcher, name="a")
    b = make_run(researcher, name="b")
    ingest.ingest_metrics(a.pk, [("eval/bleu", 1, 0.2), ("train/reward_mean", 1, 0.5), ("custom/x", 1, 1)])
    ingest.ingest_metrics(b.pk, [("train/kl", 1, 0.1), ("train/reward_mean", 1, 0.7), ("loss/policy", 1, 2)])
    html = researcher_client.get("/compare/", {"ids": f"{a.pk},{b.pk}"}).content.decode()
    charts = html[
        html.index('<div id="charts" class="chart-groups">') : html.index("<h2>Config differences</h2>")
    ]
    group = r'<details class="chart-group[^"]*" data-group="([^"]+)" open>(.*?)</details>'
    sections = re.findall(group, charts, re.S)
    chart = r'<div class="chart" data-key="([^"]+)" data-group="([^"]+)">'
    assert [(gid, re.findall(chart, body)) for gid, body in sections] == [
        ("reward", [("train/reward_mean", "reward")]),
        ("kl", [("train/kl", "kl")]),
        ("loss", [("loss/policy", "loss")]),
        ("eval", [("eval/bleu", "eval")]),
        ("other", [("custom/x", "other")]),
    ]
    titles = re.findall(r"<summary><h3>([^<]+) <span", charts)
    assert titles == ["Reward", "KL &amp; β", "Losses", "Eval metrics", "Other"]


# --------------------------------------------------------------------------- import


@pytest.mark.django_db
def test_import_rejects_paths_outside_roots_and_imports_inside(
    researcher_client: Client, settings: Any, tmp_path: Any
) -> None:
    root = tmp_path / "runs"
    d = root / "cli-run"
    d.mkdir(parents=True)
    settings.ALLOWED_ROOTS = [root]
    (d / "config.json").write_text(json.dumps(TINY))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/reward_mean": 0.5}) + "\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps(TINY))
    for bad in (str(outside), "/etc", str(root / ".." / "elsewhere")):
        r = researcher_client.post("/import/", {"path": bad})
        assert r.status_code == 200 and "outside the allowed directories" in r.content.decode(), bad
    assert Run.objects.count() == 0
    r = researcher_client.post("/import/", {"path": str(d), "tags": "imported"})
    run = Run.objects.get()
    assert (
        r["Location"] == f"/runs/{run.pk}/" and run.status == RunStatus.SUCCEEDED and run.tags == ["imported"]
    )
