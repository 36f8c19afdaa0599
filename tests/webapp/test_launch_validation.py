"""One validator for every way a config arrives (issue 29 item 5): the API, the launch page's YAML view
and the form all go through ``services.validate_config``, which checks component ids against the
engine's registries and generation lengths against the model's context, besides the schema and the
path rules, and reports every error at once, each naming its field. An invalid config queues nothing
(the real broker's queue is read back)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import queued_messages
from tests.helpers import tiny_run_config
from webapp.api.auth import create_token
from webapp.runs import services
from webapp.runs.forms import dump_yaml
from webapp.runs.models import Run

BAD = {
    **tiny_run_config(2, "bad"),
    "task": {"id": "no_such_task"},
    "reward": {"id": "no_such_reward", "components": []},
    "algorithm": {"id": "no_such_algorithm"},
    "rollout": {"max_new_tokens": 10**6, "batch_size": 2},
}
BAD_FIELDS = {"task.id", "reward.id", "algorithm.id", "rollout.max_new_tokens"}


def test_the_validator_names_every_unknown_id_and_oversized_generation_at_once() -> None:
    with pytest.raises(services.ConfigInvalid) as exc:
        services.validate_config(BAD)
    fields = {f for f, _m in exc.value.errors}
    assert fields == BAD_FIELDS, exc.value.errors
    messages = dict(exc.value.errors)
    assert "registered" in messages["task.id"] and "synthetic_increasing_numbers" in messages["task.id"]
    assert "512 positions" in messages["rollout.max_new_tokens"]  # the tiny GPT-2's context
    # The eval generation and the prompt share the window too; a config that fits passes.
    with pytest.raises(services.ConfigInvalid) as exc:
        services.validate_config({**tiny_run_config(2, "e"), "eval": {"generation": {"max_new_tokens": 500}}})
    assert [f for f, _m in exc.value.errors] == ["eval.generation.max_new_tokens"]
    assert services.validate_config(tiny_run_config(2, "ok"))["rollout"]["max_new_tokens"] == 4


def test_schema_errors_and_unknown_ids_come_together() -> None:
    cfg = {**tiny_run_config(2, "both"), "task": {"id": "no_such_task"}, "train": {"n_iters": 10**9}}
    with pytest.raises(services.ConfigInvalid) as exc:
        services.validate_config(cfg)
    assert {f for f, _m in exc.value.errors} == {"train.n_iters", "task.id"}


@pytest.mark.django_db
def test_the_api_refuses_the_config_naming_every_field(client: Any, researcher: Any) -> None:
    token = create_token(researcher, "t")[1]
    r = client.post("/api/v1/runs", json.dumps({"config": BAD, "launch": True}), content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
    assert r.status_code == 400, r.content[:300]
    assert {e["field"] for e in r.json()["errors"]} == {f"config.{f}" for f in BAD_FIELDS}
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_the_yaml_view_queues_nothing_and_names_the_fields(
    researcher_client: Any, scratch_queue: str
) -> None:
    r = researcher_client.post(
        "/launch/", {"action": "launch_yaml", "config_yaml": dump_yaml(BAD), "tags": "", "notes": ""}
    )
    assert r.status_code == 200
    page = r.content.decode()
    for field in BAD_FIELDS:
        assert field in page
    assert not Run.objects.exists() and queued_messages(scratch_queue) == []
