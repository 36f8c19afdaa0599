"""Tracker exports in the web app: ``train.report_to`` as checkboxes on the launch form, and tracker
options of a launched config kept inside the allowed directories (no tracking server chosen by a form)."""

from __future__ import annotations

from typing import Any

import pytest
from django import forms
from django.urls import reverse

from engine.trackers import TRACKER_IDS
from tests.helpers import TINY
from webapp.runs import services
from webapp.runs.errors import ConfigInvalid
from webapp.runs.forms import RunConfigForm, default_config, form_data_from_config

pytestmark = pytest.mark.django_db


@pytest.fixture
def roots(settings: Any, tmp_path: Any) -> Any:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    settings.ALLOWED_ROOTS = [allowed]
    return allowed


def test_report_to_is_a_set_of_checkboxes_that_round_trips() -> None:
    field = RunConfigForm().fields["train__report_to"]
    assert isinstance(field, forms.MultipleChoiceField)
    assert isinstance(field.widget, forms.CheckboxSelectMultiple)
    assert [c for c, _ in field.choices] == list(TRACKER_IDS)
    cfg = default_config()
    cfg["train"]["report_to"] = ["wandb", "tensorboard"]
    cfg["train"]["trackers"]["wandb"]["mode"] = "offline"
    form = RunConfigForm(form_data_from_config(cfg))
    assert form.is_valid(), form.errors
    assert form.config.train.report_to == ["wandb", "tensorboard"]
    assert form.config.train.trackers.wandb.mode == "offline"
    data = form_data_from_config(default_config())
    data["train__report_to"] = ["tensorboard", "comet"]
    form = RunConfigForm(data)
    assert not form.is_valid()
    assert "comet" in " ".join(form.errors["train__report_to"])


def test_the_launch_page_offers_each_tracker_as_a_checkbox(researcher_client: Any) -> None:
    html = researcher_client.get(reverse("runs:launch")).content.decode()
    for tracker in TRACKER_IDS:
        assert f'type="checkbox" name="train__report_to" value="{tracker}"' in html, tracker


@pytest.mark.parametrize(
    ("trackers", "field", "needle"),
    [
        (
            {"tensorboard": {"log_dir": "/tmp/grue-elsewhere/tb"}},
            "train.trackers.tensorboard.log_dir",
            "outside",
        ),
        ({"wandb": {"dir": "../../.."}}, "train.trackers.wandb.dir", "outside"),
        ({"mlflow": {"tracking_uri": "file:///etc/mlruns"}}, "train.trackers.mlflow.tracking_uri", "outside"),
        (
            {"mlflow": {"tracking_uri": "http://10.0.0.1:5000"}},
            "train.trackers.mlflow.tracking_uri",
            "MLFLOW_TRACKING_URI",
        ),
    ],
)
def test_tracker_options_of_a_launched_run_stay_inside_the_allowed_roots(
    researcher: Any, roots: Any, trackers: dict[str, Any], field: str, needle: str
) -> None:
    cfg = {**TINY, "train": {**TINY.get("train", {}), "report_to": ["mlflow"], "trackers": trackers}}
    with pytest.raises(ConfigInvalid) as exc:
        services.create_run(cfg, user=researcher)
    assert list(exc.value.field_errors) == [field]
    assert needle in exc.value.field_errors[field][0]


def test_tracker_directories_get_the_output_directorys_guard(
    researcher: Any, roots: Any, settings: Any
) -> None:
    """Issue 25.3: a tracker directory could be an allowed root itself or the runs directory (the
    output directory's managed-folder rule did not apply), and a file URI could name another host."""
    for trackers, field in [
        ({"tensorboard": {"log_dir": str(roots)}}, "train.trackers.tensorboard.log_dir"),
        ({"wandb": {"dir": str(settings.RUNS_DIR), "mode": "offline"}}, "train.trackers.wandb.dir"),
        ({"mlflow": {"tracking_uri": roots.as_uri()}}, "train.trackers.mlflow.tracking_uri"),
        (
            {"mlflow": {"tracking_uri": f"file://files.internal{roots / 'mlruns'}"}},
            "train.trackers.mlflow.tracking_uri",
        ),
    ]:
        cfg = {**TINY, "train": {**TINY.get("train", {}), "report_to": list(trackers), "trackers": trackers}}
        with pytest.raises(ConfigInvalid) as exc:
            services.create_run(cfg, user=researcher)
        assert list(exc.value.field_errors) == [field], trackers
        assert "manages" in exc.value.field_errors[field][0] or "host" in exc.value.field_errors[field][0]


def test_tracker_directories_inside_the_roots_are_accepted(researcher: Any, roots: Any) -> None:
    trackers = {
        "tensorboard": {"log_dir": str(roots / "tb")},
        "mlflow": {"tracking_uri": (roots / "mlruns").as_uri()},
        "wandb": {"dir": str(roots / "wandb"), "mode": "offline"},
    }
    cfg = {**TINY, "train": {**TINY.get("train", {}), "report_to": list(TRACKER_IDS), "trackers": trackers}}
    run = services.create_run(cfg, user=researcher)
    assert run.config["train"]["report_to"] == list(TRACKER_IDS)
    assert run.config["train"]["trackers"]["tensorboard"]["log_dir"] == str(roots / "tb")
