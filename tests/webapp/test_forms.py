"""The launch form is generated from the engine's JSON Schema: every schema leaf has a widget, the
widgets round-trip a config exactly, and the engine's errors land on the widget of their field.

The form asks the runs app's extension point for reward choices (the annotation app's provider reads
its reward models from the database), hence the database mark."""

from __future__ import annotations

from typing import Any

import pytest

from engine.config import RunConfig, json_schema
from webapp.runs import extensions
from webapp.runs.forms import (
    ImportRunForm,
    RunConfigForm,
    default_config,
    field_for_path,
    form_data_from_config,
    schema_fields,
)
from webapp.runs.queries import flatten

pytestmark = pytest.mark.django_db


def _schema_leaves(schema: dict[str, Any]) -> set[str]:
    """Leaf paths of the schema, computed independently of the form code."""
    defs = schema["$defs"]
    out: set[str] = set()

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, prop in node["properties"].items():
            path = f"{prefix}.{key}" if prefix else key
            if "$ref" in prop:
                walk(defs[prop["$ref"].rsplit("/", 1)[-1]], path)
            else:
                out.add(path)

    walk(schema, "")
    return out


def test_every_schema_field_has_a_widget_with_default_and_help() -> None:
    form = RunConfigForm()
    leaves = _schema_leaves(json_schema())
    assert {s.path for s in schema_fields()} == leaves
    defaults = flatten(default_config())
    for spec in schema_fields():
        field = form.fields[spec.name]
        assert field.help_text, f"{spec.path} has no help text"
        if spec.kind != "yaml" and spec.path in defaults:
            assert field.initial == defaults[spec.path], spec.path
    # Nested NLPO section and eval decoding are grouped as subsections.
    sections = {s["key"]: s for s in form.sections()}
    assert set(sections) >= {"general", "model", "algorithm", "eval", "train", "reward"}
    sub = {g["key"] for g in sections["algorithm"]["groups"]}
    assert "algorithm.nlpo" in sub
    # eval.generation defaults to greedy decoding (a default_factory the schema cannot express).
    assert form.fields["eval__generation__do_sample"].initial is False


def test_widget_kinds_follow_the_schema() -> None:
    from django import forms

    form = RunConfigForm()
    f = form.fields
    assert isinstance(f["model__type"], forms.ChoiceField)
    assert [c for c, _ in f["model__type"].choices] == ["auto", "causal", "seq2seq"]
    assert isinstance(f["rollout__do_sample"], forms.BooleanField)
    assert isinstance(f["train__n_iters"], forms.IntegerField)
    assert f["train__n_iters"].widget.attrs["min"] == 0
    assert f["algorithm__gamma"].widget.attrs["max"] == 1
    assert f["algorithm__target_kl"].required is False  # nullable number
    assert isinstance(f["eval__metrics"].widget, forms.Textarea)
    assert isinstance(f["algorithm__id"], forms.ChoiceField)  # registry select
    from engine.registry import algorithms

    assert {c for c, _ in f["algorithm__id"].choices} == set(algorithms.ids())


def test_form_round_trips_a_non_default_config() -> None:
    cfg = default_config()
    cfg["name"] = "round-trip"
    cfg["algorithm"]["learning_rate"] = 3e-6
    cfg["algorithm"]["target_kl"] = 0.05
    cfg["algorithm"]["nlpo"]["top_mask"] = 0.5
    cfg["kl"]["target"] = None
    cfg["rollout"]["do_sample"] = False
    # arguments the task takes (the launch checks refuse others, issue 26.4); a string with YAML's
    # special characters checks that the text round-trips
    cfg["task"]["args"] = {"n_samples": 3, "seed": 7, "prompt": "count: [1, 2]"}
    from engine.registry import metrics

    metric_id = metrics.ids()[0]
    cfg["eval"]["metrics"] = [{"id": metric_id, "args": {}}]
    form = RunConfigForm(form_data_from_config(cfg))
    assert form.is_valid(), form.errors
    assert form.config is not None
    assert form.config.to_dict() == RunConfig.model_validate(cfg).to_dict()


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("algorithm__learning_rate", "-1", "greater than 0"),
        ("rollout__top_p", "1.5", "less than or equal to 1"),
        ("train__n_iters", "abc", "whole number"),
        ("task__args", "a: [1, 2", "line"),
        ("eval__metrics", "- id: no_such_metric", "unknown id 'no_such_metric'"),
        ("rollout__min_new_tokens", "99", "must not exceed"),
    ],
)
def test_invalid_values_error_on_their_field(field: str, value: str, needle: str) -> None:
    data = form_data_from_config(default_config())
    data[field] = value
    form = RunConfigForm(data)
    assert not form.is_valid()
    assert form.config is None
    assert field in form.errors, form.errors
    assert needle in " ".join(form.errors[field]), form.errors[field]


def test_several_errors_show_at_once() -> None:
    data = form_data_from_config(default_config())
    data["train__n_iters"] = "x"
    data["kl__init_coef"] = "-3"
    form = RunConfigForm(data)
    assert not form.is_valid()
    assert {"train__n_iters", "kl__init_coef"} <= set(form.errors)


def test_engine_error_paths_map_to_widgets() -> None:
    names = {s.path: s.name for s in schema_fields()}
    assert field_for_path("eval.metrics[0].id", names) == "eval__metrics"
    assert field_for_path("algorithm.nlpo.top_mask", names) == "algorithm__nlpo__top_mask"
    assert field_for_path("rollout", names, "min_new_tokens must not exceed max_new_tokens") == (
        "rollout__min_new_tokens"
    )
    assert field_for_path("nonsense.key", names) is None


def test_output_dir_must_stay_inside_allowed_roots(settings: Any, tmp_path: Any) -> None:
    settings.ALLOWED_ROOTS = [tmp_path]
    data = form_data_from_config(default_config())
    data["train__output_dir"] = "/etc/grue-evil"
    form = RunConfigForm(data)
    assert not form.is_valid()
    assert "outside the allowed directories" in " ".join(form.errors["train__output_dir"])
    data["train__output_dir"] = str(tmp_path / "ok")
    assert RunConfigForm(data).is_valid()


def test_import_form_rejects_paths_outside_roots(settings: Any, tmp_path: Any) -> None:
    root = tmp_path / "allowed"
    root.mkdir()
    settings.ALLOWED_ROOTS = [root]
    outside = tmp_path / "other"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    form = ImportRunForm({"path": str(outside)})
    assert not form.is_valid()
    assert "outside the allowed directories" in form.errors["path"][0]
    sneaky = ImportRunForm({"path": str(root / ".." / "other")})
    assert not sneaky.is_valid()
    assert "outside the allowed directories" in sneaky.errors["path"][0]


def test_reward_choices_from_other_apps_replace_the_reward_section(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another app (annotation: trained reward models) offers rewards through the extension point;
    choosing one replaces the reward section, and ``reward_choice`` preselects it (the "launch a run
    on it" link)."""
    learned = {
        "id": "increasing_numbers",
        "args": {"min_tokens": 3},
        "components": [],
        "include_prompt": True,
        "subtract_prompt_score": False,
        "transform": "identity",
    }
    monkeypatch.setattr(extensions, "_reward_providers", [])
    extensions.register_reward_choices(
        lambda: [{"id": "rm-7", "label": "Learned reward: prefs (#7)", "config": learned}]
    )
    form = RunConfigForm()
    assert ("rm-7", "Learned reward: prefs (#7)") in form.fields["reward_preset"].choices
    assert form["reward_preset"].value() in ("", None)
    assert RunConfigForm(reward_choice="rm-7")["reward_preset"].value() == "rm-7"
    assert RunConfigForm(reward_choice="no-such")["reward_preset"].value() == ""
    data = form_data_from_config(default_config())
    data["reward_preset"] = "rm-7"
    form = RunConfigForm(data)
    assert form.is_valid(), form.errors
    assert form.config.reward.model_dump() == learned
    # without a choice the reward widgets apply; an unknown choice is a field error
    data["reward_preset"] = ""
    form = RunConfigForm(data)
    assert form.is_valid() and form.config.reward.id == default_config()["reward"]["id"]
    data["reward_preset"] = "rm-8"
    form = RunConfigForm(data)
    assert not form.is_valid() and "reward_preset" in form.errors


def test_without_providers_there_is_no_reward_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extensions, "_reward_providers", [])
    assert "reward_preset" not in RunConfigForm().fields


def test_a_malformed_reward_choice_names_its_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider returning the wrong shape fails loudly instead of silently losing the reward."""
    monkeypatch.setattr(extensions, "_reward_providers", [])

    def broken_provider() -> list[dict[str, Any]]:
        return [{"label": "old shape", "reward": {"id": "x"}}]

    extensions.register_reward_choices(broken_provider)
    with pytest.raises(TypeError, match="broken_provider"):
        RunConfigForm()
