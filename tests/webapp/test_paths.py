"""Path confinement (webapp/runs/paths.py): the final path of every string that can be a path is
checked, in the shapes that slipped through before (a GGUF file joined after the check, ``runs/../..``
taken for a hub id, a path with a space, a model reference not starting with ``/ . ~``)."""

from __future__ import annotations

import pytest

from engine import presets
from engine.config import parse_config
from tests.helpers import TINY
from webapp.runs import paths, services
from webapp.runs.errors import ConfigInvalid, PathNotAllowed


@pytest.fixture
def roots(settings, tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    settings.ALLOWED_ROOTS = [allowed]
    return allowed


@pytest.mark.parametrize(
    ("value", "hub"),
    [
        ("gpt2", True),
        ("allenai/t5-base", True),
        ("org/name.v2", True),
        ("runs/../../etc", False),
        ("a/b/c", False),
        ("/abs", False),
        ("~/x", False),
        ("./x", False),
        ("my model", False),
        ("org/../x", False),
        ("..", False),
    ],
)
def test_hub_ids_have_a_hub_ids_shape(value, hub):
    assert paths.is_hub_id(value) is hub
    assert paths.is_model_reference_safe(value) is hub


def test_a_relative_string_naming_a_local_directory_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not paths.is_hub_id("org/name")
    assert paths.is_model_reference_safe("builtin:tiny-gpt2")


@pytest.mark.parametrize(
    ("value", "is_path"),
    [
        ("/data/my reviews.jsonl", True),  # spaces do not make a path text
        ("~/data", True),
        ("runs/../../etc/passwd", True),
        ("Translate English/German: ", False),  # prose that names nothing on disk
        ("gpt2", False),
        ("lang", False),
        (".", True),  # the working directory, whatever the argument's name
        ("..", True),
        ("allenai/t5-base", False),
    ],
)
def test_free_form_strings_that_can_be_paths(value, is_path):
    assert paths.looks_like_path(value) is is_path


def test_arguments_are_paths_by_name_and_meaning_not_by_a_slash(tmp_path, monkeypatch):
    """Issue 25.3: strings without "/" were never paths, so ``path: "secret.csv"`` and ``hub: ".."``
    were opened relative to the worker's working directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.csv").write_text("x")
    assert paths.looks_like_path("secret.csv")  # exists on disk
    assert paths.looks_like_path("secret.csv", "task.args.path")
    assert paths.looks_like_path("my data.jsonl", "task.args.path")  # named a path, and no hub id
    assert paths.looks_like_path("..", "reward.args.classifier_dir")
    assert paths.looks_like_path("a b.jsonl", "task.args.data_files[0]")
    assert not paths.looks_like_path("lvwerra/distilbert-imdb", "eval.metrics[0].args.model_path")  # a hub id
    assert not paths.looks_like_path(".", "task.args.concept_end_token")  # named text: CommonGen's token
    assert not paths.looks_like_path("en", "task.args.lang")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "field", "says"),
    [
        ({"hub": ".."}, "task.args.hub", "not a hub data set id"),
        ({"hub": "a/b/c"}, "task.args.hub", "not a hub data set id"),
        ({"path": "secret.csv"}, "task.args.path", "outside the allowed directories"),
        ({"path": "."}, "task.args.path", "outside the allowed directories"),
        ({"train_path": ".."}, "task.args.train_path", "outside the allowed directories"),
    ],
)
def test_bare_names_in_task_arguments_are_confined(
    researcher, roots, tmp_path, monkeypatch, args, field, says
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.csv").write_text("prompt,reference\nsecret,secret\n")
    with pytest.raises(ConfigInvalid) as exc:
        services.create_run({**TINY, "task": {"id": "imdb", "args": args}}, user=researcher)
    assert list(exc.value.field_errors) == [field]
    assert says in exc.value.field_errors[field][0]


@pytest.mark.django_db
def test_a_hub_id_that_names_a_local_folder_is_refused(researcher, roots, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imdb").mkdir()
    with pytest.raises(ConfigInvalid) as exc:
        services.create_run({**TINY, "task": {"id": "imdb", "args": {"hub": "imdb"}}}, user=researcher)
    assert list(exc.value.field_errors) == ["task.args.hub"]
    (tmp_path / "imdb").rmdir()
    run = services.create_run(
        {**TINY, "task": {"id": "imdb", "args": {"hub": "stanfordnlp/imdb"}}}, user=researcher
    )
    assert run.config["task"]["args"]["hub"] == "stanfordnlp/imdb"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"model": {"name_or_path": "runs/../../../../../../etc"}}, "model.name_or_path"),
        ({"model": {"name_or_path": "/etc/a model with spaces"}}, "model.name_or_path"),
        ({"tokenizer": {"name_or_path": "x/y/z"}}, "tokenizer.name_or_path"),
        ({"task": {"id": "imdb", "args": {"path": "/etc/my data.jsonl"}}}, "task.args.path"),
        ({"task": {"id": "imdb", "args": {"path": "runs/../../../../../etc"}}}, "task.args.path"),
    ],
)
def test_every_shape_of_path_outside_the_roots_is_refused(researcher, roots, section, field):
    with pytest.raises(ConfigInvalid) as exc:
        services.create_run({**TINY, **section}, user=researcher)
    assert list(exc.value.field_errors) == [field]


@pytest.mark.django_db
def test_a_gguf_file_is_checked_joined_with_its_directory(researcher, roots, tmp_path):
    (roots / "m").mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "evil.gguf").write_text("")
    for gguf in ("../../elsewhere/evil.gguf", str(outside / "evil.gguf")):
        cfg = {**TINY, "model": {"name_or_path": str(roots / "m"), "gguf_file": gguf}}
        with pytest.raises(ConfigInvalid) as exc:
            services.create_run(cfg, user=researcher)
        assert list(exc.value.field_errors) == ["model.gguf_file"]
        assert str(outside / "evil.gguf") in exc.value.field_errors["model.gguf_file"][0]
    (roots / "m" / "ok.gguf").write_text("")
    cfg = {**TINY, "model": {"name_or_path": str(roots / "m"), "gguf_file": "ok.gguf"}}
    assert services.create_run(cfg, user=researcher).config["model"]["gguf_file"] == "ok.gguf"


@pytest.mark.django_db
def test_prose_and_hub_ids_in_a_config_are_not_paths(researcher, roots):
    cfg = {
        **TINY,
        "model": {"name_or_path": "gpt2"},
        "task": {"id": "iwslt2017en_de", "args": {"prompt_prefix": "Translate English/German: "}},
    }
    run = services.create_run(cfg, user=researcher)
    assert run.config["task"]["args"]["prompt_prefix"] == "Translate English/German: "


def test_check_path_resolves_symlinks_and_dotdot(roots, tmp_path):
    inside = roots / "a" / "b"
    inside.mkdir(parents=True)
    assert paths.check_path(inside) == inside
    with pytest.raises(PathNotAllowed, match="resolves to"):
        paths.check_path(roots / ".." / "elsewhere")
    (roots / "link").symlink_to("/etc")
    with pytest.raises(PathNotAllowed, match="/etc/passwd"):
        paths.check_path(roots / "link" / "passwd")


def test_is_plain_dir_inside_refuses_symlinks_anywhere_on_the_way(tmp_path):
    root = tmp_path / "runs"
    (root / "real" / "child").mkdir(parents=True)
    (tmp_path / "out" / "child").mkdir(parents=True)
    (root / "via-link").symlink_to(tmp_path / "out")
    assert paths.is_plain_dir_inside(root / "real" / "child", root) == root / "real" / "child"
    assert paths.is_plain_dir_inside(root / "via-link" / "child", root) is None
    assert paths.is_plain_dir_inside(root / "via-link", root) is None
    assert paths.is_plain_dir_inside(root, root) is None
    assert paths.is_plain_dir_inside(tmp_path / "out", root) is None


def test_every_preset_stays_launchable_under_the_path_rules():
    """No preset's model, data or metric argument is mistaken for a path outside the roots (e.g.
    CommonGen's "." end token, prompt prefixes), with the default allowed roots."""
    names = [p["name"] for p in presets.list_presets()]
    assert len(names) > 100
    flagged = {
        name: found
        for name in names
        if (found := paths.config_read_violations(parse_config(presets.load_preset(name)).to_dict()))
    }
    assert flagged == {}
