"""Path confinement: which local files a run, a form or an import may read or write.

Everything that turns a user's string into a file path goes through here, in the web process (forms,
launch, import) and again in the worker right before training, so that a file or symlink changed in
between cannot lead the worker out of the allowed directories. Every check resolves the FINAL path
(``~``, ``..`` and symlinks, a GGUF file joined with its directory) before comparing it with the
roots; a string counts as a hub id only when it has a hub id's exact shape and names nothing on disk.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from django.conf import settings

from engine import assets
from engine.models.builtin import cache_root
from webapp.runs.errors import PathNotAllowed

# A Hugging Face hub id: "name" or "org/name", letters, digits, "-", "_", "." (never "..").
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
# Config sections whose strings may name local models, tokenizers, data files or classifiers.
READ_SECTIONS = ("model", "tokenizer", "task", "reward", "eval", "supervised")
# Fields that hold a model/tokenizer reference: a hub id, a builtin model or a local path, nothing else.
MODEL_FIELDS = ("model.name_or_path", "model.reference_name_or_path", "tokenizer.name_or_path")
RUN_MARKERS = ("config.json", "metrics.jsonl")


def allowed_roots() -> list[Path]:
    """Directories typed paths (import, output dirs, local data) must stay inside."""
    return [Path(p).expanduser().resolve() for p in getattr(settings, "ALLOWED_ROOTS", [])]


def runs_root() -> Path:
    """Where the worker creates run directories (``GRUE_RUNS_DIR``)."""
    return Path(settings.RUNS_DIR).expanduser().resolve()


def reward_models_dir() -> Path:
    """Where the annotation app writes trained reward models (same rule as that app's setting)."""
    env = os.environ.get("GRUE_REWARD_MODELS_DIR") or getattr(settings, "GRUE_REWARD_MODELS_DIR", None)
    return Path(env).expanduser().resolve() if env else runs_root() / "reward_models"


def write_roots() -> list[Path]:
    """Where a run's output directory may be."""
    return [*allowed_roots(), runs_root()]


def read_roots() -> list[Path]:
    """Where a launched run may read local files from: the allowed roots, the runs directory (trained
    reward models live there), the engine's model cache and the wheels that ship offline assets."""
    roots = [*allowed_roots(), runs_root(), cache_root()]
    for finder in (assets.minilm_dir, assets.smollm2_dir):
        try:
            roots.append(finder())
        except assets.MissingAssetError:
            pass
    roots.append(Path(__file__).resolve().parents[2] / "engine")  # shipped fixtures and assets
    return [Path(r).resolve() for r in roots]


def resolve(path: str | Path) -> Path:
    """The final path a loader would open: ``~`` expanded, relative to the working directory (the
    web server and the worker share it), ``..`` and every symlink resolved."""
    return Path(os.path.expanduser(str(path))).resolve()


def inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_path(path: str | Path, roots: Iterable[Path | str] | None = None) -> Path:
    """Resolve ``path`` and require it inside one of ``roots`` (default: the allowed roots)."""
    root_list = [resolve(r) for r in roots] if roots is not None else allowed_roots()
    p = resolve(path)
    if any(inside(p, root) for root in root_list):
        return p
    listing = ", ".join(str(r) for r in root_list) or "(none configured)"
    shown = str(path) if str(path) == str(p) else f"{path} (resolves to {p})"
    raise PathNotAllowed(
        f"path {shown} is outside the allowed directories ({listing}); set GRUE_ALLOWED_ROOTS to allow more"
    )


def is_hub_id(value: str) -> bool:
    """``gpt2`` or ``org/name`` that names nothing on this server: the loaders download it instead of
    reading a file. ``runs/../../x``, ``a/b/c``, ``/x``, ``~x``, ``x y`` are never hub ids."""
    if not _HUB_ID.match(value) or ".." in value:
        return False
    try:
        return not Path(value).exists()
    except OSError:
        return False


def is_model_reference_safe(value: str) -> bool:
    """Builtin models and hub ids are not files; every other model reference is a path."""
    return value.startswith("builtin:") or is_hub_id(value)


# Argument names (the last part of a dotted field) that say what a string means. A name that says
# "file" makes the value a path unless it is a hub id (``path: "secret.csv"`` that exists, ``"."``); a name that says
# "text" or a registry name (CommonGen's ``concept_end_token: "."``, prompt prefixes, ``task.id``) keeps a value that merely looks
# like a path from being refused; a hub argument must be a hub id.
_PATH_ARG = re.compile(r"(^|_)(path|paths|file|files|dir|dirs|directory|root|folder)$")
_TEXT_ARG = re.compile(
    r"(^|_)(token|tokens|prefix|suffix|separator|delimiter|template|prompt|instructions|text)$"
    r"|^(id|ids|type|kind|name|names|metric|metrics|split|lang|language|source_lang|target_lang)$"
)
HUB_ARGS = ("hub",)


def _exists(value: str) -> bool:
    try:
        return Path(os.path.expanduser(value)).exists()
    except (OSError, ValueError):
        return False


def looks_like_path(value: str, key: str = "") -> bool:
    """Whether a free-form string (a task or reward argument named ``key``) may be read as a file.

    By name first: an argument named like a file (``path``, ``*_path``, ``*_file``, ``*_dir``…) is a
    path unless it is a hub id (which names nothing on disk, so a loader downloads it), and one named like text (``*_token``, ``prefix``, ``template``…) is a path
    only in the unmistakable shapes below. By value: absolute, home and dot-relative strings, ``.``,
    ``..`` and anything that exists on disk (relative to the worker's working directory, which is
    where a loader would open it) are paths; a relative string with a ``/`` is a path unless it is a
    hub id, except plain text with spaces that names nothing on disk (``"English/German: "``).
    Other strings without a ``/`` (``"en"``) are not paths."""
    if not value or "\n" in value:
        return False
    name = key.rsplit(".", 1)[-1].split("[", 1)[0].lower()
    if _PATH_ARG.search(name):
        return not is_hub_id(value)  # ``model_path: lvwerra/distilbert-imdb`` is downloaded
    if value.startswith(("/", "~", "./", "../")):
        return True
    text = bool(_TEXT_ARG.search(name))
    if not text and (value in (".", "..") or _exists(value)):
        return True
    if "/" not in value and os.sep not in value:
        return False
    if is_hub_id(value):
        return False
    return _exists(value) or ".." in value.split("/") or not any(c.isspace() for c in value)


def config_read_violations(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(dotted.field, message)`` for every local path in ``cfg`` that resolves outside the read
    roots. Model fields are paths unless builtin or a hub id; a GGUF file is checked joined with its
    directory, as the loader opens it."""
    roots = read_roots()
    found: list[tuple[str, str]] = []

    def check(where: str, value: str) -> None:
        try:
            check_path(value, roots)
        except PathNotAllowed as exc:
            found.append((where, str(exc)))

    model = cfg.get("model") or {}
    name = model.get("name_or_path")
    gguf = model.get("gguf_file")
    if isinstance(gguf, str) and gguf:
        base = name if isinstance(name, str) and name else "."
        check("model.gguf_file", str(Path(os.path.expanduser(base)) / gguf))
    checked = set()
    for dotted in MODEL_FIELDS:
        section, key = dotted.split(".")
        value = (cfg.get(section) or {}).get(key)
        checked.add(dotted)
        if isinstance(value, str) and value and not is_model_reference_safe(value):
            check(dotted, value)

    def walk(value: Any, where: str) -> None:
        if where in checked:
            return
        if isinstance(value, Mapping):
            gguf = value.get("gguf_file")
            if isinstance(gguf, str) and gguf:  # a GGUF file is opened inside its model's directory
                base = value.get("model") or value.get("name_or_path") or "."
                check(f"{where}.gguf_file", str(Path(os.path.expanduser(str(base))) / gguf))
            for k, v in value.items():
                if k != "gguf_file":
                    walk(v, f"{where}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, str) and where.rsplit(".", 1)[-1] in HUB_ARGS:
            if not is_hub_id(value):
                found.append((where, f"{value!r} is not a hub data set id (name or org/name that names "
                                     "nothing on this server); local data goes in task.args.path"))  # fmt: skip
        elif isinstance(value, str) and looks_like_path(value, where):
            check(where, value)

    for section in READ_SECTIONS:
        if section == "model":
            walk({k: v for k, v in model.items() if k != "gguf_file"}, "model")
        else:
            walk(cfg.get(section), section)
    return found


def tracker_violations(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(dotted.field, message)`` for tracker options (``train.trackers``) a web-launched run may not
    use: directories the worker would write get the output directory's rules (inside the write roots,
    never a directory the app manages), and an MLflow tracking URI is a file store under the same
    rules, without a host part (``file://host/...`` names another machine). A tracking server is the
    worker's ``MLFLOW_TRACKING_URI``, set by whoever runs the worker, so a form never points the worker
    at a host of its choosing (MLflow's own HTTP client would resolve the name again and follow
    redirects, so :mod:`engine.netguard` could not pin it)."""
    trackers = (cfg.get("train") or {}).get("trackers") or {}
    found: list[tuple[str, str]] = []

    def check(where: str, value: str) -> None:
        try:
            check_output_dir(value, what=where)
        except PathNotAllowed as exc:
            found.append((where, str(exc)))

    for tracker, key in (("tensorboard", "log_dir"), ("wandb", "dir")):
        value = (trackers.get(tracker) or {}).get(key)
        if isinstance(value, str) and value:
            check(f"train.trackers.{tracker}.{key}", value)
    uri = (trackers.get("mlflow") or {}).get("tracking_uri")
    where = "train.trackers.mlflow.tracking_uri"
    if isinstance(uri, str) and uri:
        parsed = urlparse(uri)
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            found.append(
                (where, f"file URI with the host {parsed.netloc!r}: give a local file-store directory")
            )
        elif parsed.scheme == "file":
            check(where, url2pathname(parsed.path))
        elif parsed.scheme == "":
            check(where, uri)
        else:
            found.append(
                (
                    where,
                    f"{parsed.scheme}: tracking URIs are set by the worker's MLFLOW_TRACKING_URI, not by a "
                    "launched config; leave this empty or give a file-store directory inside the allowed "
                    "directories",
                )
            )
    return found


def check_output_dir(value: str | Path, what: str = "output dir") -> Path:
    """A directory a run writes (its output directory, a tracker's directory): inside the allowed
    roots or the runs directory, and never one of those roots itself, the data directory or the
    reward-models directory (or a parent of one of them), which deleting the run's files would wipe
    or whose files the run would overwrite."""
    p = check_path(value, write_roots())
    data_dir = resolve(getattr(settings, "DATA_DIR", runs_root()))
    protected = {*allowed_roots(), runs_root(), data_dir, reward_models_dir()}
    for d in sorted(protected):
        if inside(d, p):
            raise PathNotAllowed(
                f"{what} {p} is (or contains) {d}, a directory the app manages; "
                "choose a new directory inside it"
            )
    if inside(p, reward_models_dir()):
        raise PathNotAllowed(f"{what} {p} is inside the reward-models directory {reward_models_dir()}")
    return p


def holds_a_run(path: Path) -> bool:
    """A directory that already holds a run's files (the engine would mix two runs in it)."""
    return any((path / marker).exists() for marker in RUN_MARKERS)


def is_plain_dir_inside(path: str | Path, root: Path) -> Path | None:
    """The resolved directory when ``path`` is a real directory strictly inside ``root`` reached
    without any symlink (a symlink anywhere on the way could point out of ``root``); else None."""
    raw = Path(os.path.abspath(os.path.expanduser(str(path))))
    if raw.resolve() != raw:  # some component is a symlink (or the path is not normalised)
        return None
    if raw.is_symlink() or not raw.is_dir():
        return None
    if raw == root or root not in raw.parents:
        return None
    return raw
