"""Issue 26 item 4: a config whose task, algorithm and settings cannot run together is refused at
launch with a message naming the field (it used to be queued and fail on a worker), and every error
of a config is reported at once: schema errors beside this installation's checks
(``engine.launch_checks``), in the validator the API uses, the launch form and the YAML view.
Nothing is queued (the real broker's queue is read back)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine import launch_checks, presets
from engine.config import parse_config
from tests.conftest import queued_messages
from tests.helpers import tiny_run_config
from webapp.api.auth import create_token
from webapp.runs import services
from webapp.runs.forms import default_config, dump_yaml, form_data_from_config
from webapp.runs.models import Run


def fields_of(config: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(services.ConfigInvalid) as exc:
        services.validate_config(config)
    return dict(exc.value.errors)


def test_dpo_on_a_task_without_pairs_names_the_algorithm_and_says_what_to_use() -> None:
    errors = fields_of({**tiny_run_config(2, "dpo"), "algorithm": {"id": "dpo"}})
    assert list(errors) == ["algorithm.id"]
    assert "preference pairs" in errors["algorithm.id"] and "'preference_pairs'" in errors["algorithm.id"]
    assert "synthetic_increasing_numbers" in errors["algorithm.id"]
    # The pairs task without its file: the missing argument, on its field.
    errors = fields_of(
        {**tiny_run_config(2, "dpo"), "algorithm": {"id": "dpo"}, "task": {"id": "preference_pairs"}}
    )
    assert list(errors) == ["task.args.path"]


def test_a_negative_learning_rate_and_a_group_of_one_are_reported_together() -> None:
    cfg = {
        **tiny_run_config(2, "g"),
        "algorithm": {"id": "grpo", "learning_rate": -1, "group": {"group_size": 1}},
    }
    errors = fields_of(cfg)
    assert set(errors) == {"algorithm.learning_rate", "algorithm.group.group_size"}, errors
    assert "at least 2" in errors["algorithm.group.group_size"]
    # reinforce_pp uses no group: a group of one is fine for it.
    ok = {**tiny_run_config(2, "r"), "algorithm": {"id": "reinforce_pp", "group": {"group_size": 1}}}
    assert services.validate_config(ok)["algorithm"]["group"]["group_size"] == 1


def test_component_arguments_are_checked_against_their_factories() -> None:
    cfg = {
        **tiny_run_config(2, "a"),
        "task": {"id": "synthetic_increasing_numbers", "args": {"n_sample": 5}},
        "reward": {"id": "metric"},
        "algorithm": {"id": "trpo"},
        "model": {"name_or_path": "builtin:tiny-gpt2", "gradient_checkpointing": True},
    }
    errors = fields_of(cfg)
    assert set(errors) == {"task.args.n_sample", "reward.args.metric_id", "model.gradient_checkpointing"}, (
        errors
    )
    assert "n_samples" in errors["task.args.n_sample"]  # what it does take


def test_no_shipped_preset_trips_the_checks() -> None:
    """Every one of the ~170 presets passes: the checks refuse what cannot run, nothing else."""
    names = [p["name"] for p in presets.list_presets()]
    assert len(names) > 100
    bad = {n: launch_checks.config_errors(parse_config(presets.load_preset(n)).to_dict()) for n in names}
    assert {n: e for n, e in bad.items() if e} == {}
    assert launch_checks.config_errors(default_config()) == []


@pytest.mark.django_db
def test_the_api_refuses_dpo_on_the_synthetic_task(client: Any, researcher: Any, scratch_queue: str) -> None:
    token = create_token(researcher, "t")[1]
    config = {**tiny_run_config(2, "api"), "algorithm": {"id": "dpo", "learning_rate": -1}}
    r = client.post("/api/v1/runs", json.dumps({"config": config, "launch": True}), content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
    assert r.status_code == 400, r.content[:300]
    assert {e["field"] for e in r.json()["errors"]} == {
        "config.algorithm.learning_rate",
        "config.algorithm.id",
    }
    assert not Run.objects.exists() and queued_messages(scratch_queue) == []


@pytest.mark.django_db
def test_the_yaml_view_lists_an_unknown_key_and_id_beside_a_type_error(
    researcher_client: Any, scratch_queue: str
) -> None:
    cfg = {**tiny_run_config(2, "y"), "id": "grpo2", "algorithm": {"id": "grpo2", "learning_rate": "fast"}}
    r = researcher_client.post(
        "/launch/", {"action": "launch_yaml", "config_yaml": dump_yaml(cfg), "tags": "", "notes": ""}
    )
    assert r.status_code == 200
    page = r.content.decode()
    yaml_errors = page.split('id="yaml-errors"', 1)[1].split("</ul>", 1)[0]
    assert "id: unknown key" in yaml_errors
    assert "algorithm.learning_rate:" in yaml_errors
    assert "algorithm.id: unknown algorithm id &#x27;grpo2&#x27;" in yaml_errors
    assert not Run.objects.exists() and queued_messages(scratch_queue) == []


@pytest.mark.django_db
def test_the_form_shows_every_error_on_its_field(researcher_client: Any, scratch_queue: str) -> None:
    data = form_data_from_config(
        {
            **default_config(),
            "algorithm": {**default_config()["algorithm"], "id": "grpo", "learning_rate": -1},
        }
    )
    data["algorithm__group__group_size"] = "1"
    r = researcher_client.post("/launch/", {**data, "action": "launch", "tags": "", "notes": ""})
    assert r.status_code == 200
    form = r.context["form"]
    assert set(form.errors) >= {"algorithm__learning_rate", "algorithm__group__group_size"}, form.errors
    data = form_data_from_config(
        {**default_config(), "algorithm": {**default_config()["algorithm"], "id": "dpo"}}
    )
    r = researcher_client.post("/launch/", {**data, "action": "launch", "tags": "", "notes": ""})
    assert "preference pairs" in " ".join(r.context["form"].errors["algorithm__id"])
    assert not Run.objects.exists() and queued_messages(scratch_queue) == []
