"""Sweeps launched from the web app (webapp/runs/sweeps.py): all runs validated then queued as a
tagged group in the real broker, the sweep page's table and chart data, errors, roles, cancel."""

from __future__ import annotations

import json

import pytest
import yaml
from django.test import Client
from django.urls import reverse

from tests.conftest import queued_messages
from tests.helpers import tiny_run_config
from webapp.runs import sweeps
from webapp.runs.ingest import ingest_metrics
from webapp.runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _sweep(**over) -> str:
    data = {
        "name": "lr seed",
        "metric": "train/reward_mean",
        "parameters": {
            "algorithm.learning_rate": {"values": [0.001, 0.01]},
            "train.seed": {"values": [0, 1]},
        },
        "config": tiny_run_config(2, "base"),
        **over,
    }
    return yaml.safe_dump(data)


def test_sweep_queues_a_tagged_group_and_its_page_shows_values_and_final_metric(
    researcher_client, scratch_queue
):
    resp = researcher_client.post(reverse("runs:sweep_new"), {"sweep_yaml": _sweep()})
    assert resp.status_code == 302
    tag = resp.url.rstrip("/").split("/")[-1]
    assert tag.startswith("sweep:lr-seed-")
    runs = list(Run.objects.filter(tags__contains=[tag]).order_by("id"))
    assert [r.status for r in runs] == [RunStatus.QUEUED] * 4
    assert [(r.config["algorithm"]["learning_rate"], r.config["train"]["seed"]) for r in runs] == [
        (0.001, 0),
        (0.001, 1),
        (0.01, 0),
        (0.01, 1),
    ]
    assert all(r.config["train"]["output_dir"] is None for r in runs)  # the worker picks each directory
    assert sorted(m["headers"]["argsrepr"] for m in queued_messages(scratch_queue)) == sorted(
        f"[{r.pk}]" for r in runs
    )
    # Metric points are written through the ingest (the MetricPoint model is a read-only view).
    ingest_metrics(runs[0].pk, [("train/reward_mean", 2, 0.25), ("train/reward_mean", 1, 0.1)])
    ingest_metrics(runs[1].pk, [("train/reward_mean", 1, 0.5)])
    page = researcher_client.get(resp.url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "<code>algorithm.learning_rate</code>" in html and "<code>train.seed</code>" in html
    chart = json.loads(html.split('id="sweep-data" type="application/json">')[1].split("</script>")[0])
    assert chart["paths"] == ["algorithm.learning_rate", "train.seed"]
    assert [(r["values"], r["metric"]) for r in chart["runs"]] == [
        ([0.001, 0], 0.25),  # the last step's value
        ([0.001, 1], 0.5),
        ([0.01, 0], None),
        ([0.01, 1], None),
    ]

    assert researcher_client.post(reverse("runs:sweep_cancel", args=[tag])).status_code == 302
    assert set(Run.objects.filter(tags__contains=[tag]).values_list("status", flat=True)) == {
        RunStatus.CANCELLED
    }


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"base": "other.yaml", "config": None}, "give the base config inline"),
        ({"parameters": {"algorithm.nope": {"values": [1]}}}, "algorithm.nope: unknown key"),
        ({"parameters": {"train.seed": {"values": list(range(65))}}}, "65 runs; at most 64"),
        ({"parameters": {"train.seed": {"min": 0, "max": 3}}}, "a grid needs a list of values"),
    ],
)
def test_bad_sweeps_are_refused_whole(researcher_client, scratch_queue, over, message):
    data = yaml.safe_load(_sweep())
    data.update(over)
    if data.get("config") is None:
        data.pop("config")
    resp = researcher_client.post(reverse("runs:sweep_new"), {"sweep_yaml": yaml.safe_dump(data)})
    assert resp.status_code == 200
    assert message in resp.content.decode()
    assert not Run.objects.exists() and not queued_messages(scratch_queue)


def test_sweeps_need_a_researcher(client, annotator_client):
    assert client.get(reverse("runs:sweep_new")).status_code == 302
    for resp in (
        annotator_client.get(reverse("runs:sweep_new")),
        annotator_client.post(reverse("runs:sweep_new"), {"sweep_yaml": _sweep()}),
    ):  # annotators are sent to their own pages
        assert resp.status_code == 302 and "/annotate/" in resp.url
    assert not Run.objects.exists()
    assert sweeps.MAX_RUNS == 64


@pytest.mark.parametrize("view", ["form", "yaml"])
def test_launch_form_opens_a_sweep_with_its_config_as_base(researcher_client, scratch_queue, view):
    """ "Sweep over this config…" on the launch form (form or YAML view) opens the sweep page with
    the form's config under ``config:`` and a learning-rate x seed grid around its rate; launched
    unchanged, it queues 6 runs of that config."""
    base = tiny_run_config(2, "from-form")
    base["algorithm"] = {**base.get("algorithm", {}), "learning_rate": 0.003}
    if view == "yaml":
        post = {"action": "to_sweep", "config_yaml": yaml.safe_dump(base)}
    else:
        page = researcher_client.post(
            reverse("runs:launch"), {"action": "to_form", "config_yaml": yaml.safe_dump(base)}
        )
        form = page.context["form"]
        post = {"action": "to_sweep", **{k: v for k, v in form.data.items() if k != "action"}}
    resp = researcher_client.post(reverse("runs:launch"), post)
    assert resp.status_code == 200
    assert resp.templates[0].name == "runs/sweep_new.html"
    text = resp.context["sweep_yaml"]
    data = yaml.safe_load(text)
    assert data["parameters"] == {
        "algorithm.learning_rate": {"values": [0.001, 0.003, 0.009]},
        "train.seed": {"values": [0, 1]},
    }
    # the form's view holds every default too; what was set comes through unchanged
    assert base["model"].items() <= data["config"]["model"].items()
    assert data["config"]["train"]["n_iters"] == 2
    assert not Run.objects.exists()  # opening the sweep page queues nothing

    launched = researcher_client.post(reverse("runs:sweep_new"), {"sweep_yaml": text})
    assert launched.status_code == 302
    runs = list(Run.objects.order_by("id"))
    assert len(runs) == 6
    assert {r.config["algorithm"]["learning_rate"] for r in runs} == {0.001, 0.003, 0.009}
    assert {r.config["model"]["name_or_path"] for r in runs} == {base["model"]["name_or_path"]}


def test_launch_form_sweep_with_broken_yaml_names_the_line(researcher_client):
    resp = researcher_client.post(reverse("runs:launch"), {"action": "to_sweep", "config_yaml": "model: [\n"})
    assert resp.status_code == 200
    assert "bad YAML at line" in resp.content.decode()
    assert not Run.objects.exists()


def test_sweep_list_status_and_cancel_confirmation_need_a_researcher_and_escape_names(researcher, annotator):
    """The sweep list, the live status JSON and the cancel confirmation (issue 26.3): login and the
    researcher role, run names escaped, and a GET of the cancel page changes nothing."""
    tag = "sweep:roles001"
    run = Run.objects.create(
        name="<script>x</script>", config={}, created_by=researcher, status=RunStatus.QUEUED, tags=[tag]
    )
    client, annotator_client, researcher_client = Client(), Client(), Client()
    annotator_client.force_login(annotator)
    researcher_client.force_login(researcher)
    urls = [
        reverse("runs:sweep_list"),
        reverse("runs:sweep_status", args=[tag]),
        reverse("runs:sweep_cancel", args=[tag]),
    ]
    for url in urls:
        assert client.get(url).status_code == 302 and "/accounts/login/" in client.get(url).url
        resp = annotator_client.get(url)
        assert resp.status_code == 302 and "/annotate/" in resp.url
    listing = researcher_client.get(urls[0]).content.decode()
    assert "&lt;script&gt;x&lt;/script&gt;" in listing and "<script>x" not in listing
    status = researcher_client.get(urls[1]).json()
    assert status == {
        "runs": [{"id": run.pk, "status": "queued", "metric": None}],
        "cancellable": 1,
        "active": True,
    }
    confirm = researcher_client.get(urls[2]).content.decode()
    assert "&lt;script&gt;" in confirm and 'id="confirm-cancel-sweep"' in confirm
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED


def test_fields_form_replaces_swept_values_and_keeps_ranges_and_base():
    """The new-sweep fields form (issue 26.3) writes its rows into the document: values typed as
    text become numbers (1e-5 too, which YAML 1.1 reads as a string), ranges and the base config
    stay, and a field without values or no field at all is an error naming it."""
    text = yaml.safe_dump(
        {
            "name": "s",
            "method": "random",
            "count": 3,
            "parameters": {"train.seed": {"values": [0, 1]}, "kl.init_kl_coef": {"min": 0.01, "max": 0.2}},
            "config": tiny_run_config(2, "base"),
        }
    )
    assert sweeps.fields_from_text(text)["rows"][0] == {"path": "train.seed", "values": "0, 1"}
    out = yaml.safe_load(
        sweeps.text_with_fields(text, "random", "4", [("algorithm.learning_rate", "1e-5, 3e-5"), ("", "")])
    )
    assert out["parameters"] == {
        "kl.init_kl_coef": {"min": 0.01, "max": 0.2},
        "algorithm.learning_rate": {"values": [1e-5, 3e-5]},
    }
    assert out["count"] == 4 and out["config"] == tiny_run_config(2, "base")
    with pytest.raises(sweeps.SweepError, match="train.seed at least one value"):
        sweeps.text_with_fields(text, "grid", "", [("train.seed", " , ")])
    with pytest.raises(sweeps.SweepError, match="needs a count"):
        sweeps.text_with_fields(text, "random", "", [("train.seed", "1")])
