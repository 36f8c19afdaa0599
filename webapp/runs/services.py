"""Creating, validating, ingesting and importing runs (no status changes: see ``lifecycle``).

Views, the Celery worker and ``lifecycle`` call these. ``validate_config`` is the one gate a config
passes before it is saved (engine schema, path confinement, run-directory ownership), and again in
the worker before training.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from engine import launch_checks
from engine.config import ConfigError, parse_config
from engine.jsonl import iter_jsonl_file
from webapp.runs import ingest, paths, protocol
from webapp.runs.errors import (  # noqa: F401 - what these functions raise: callers catch services.ServiceError & co.
    BrokerUnavailable,
    ConfigInvalid,
    InvalidState,
    PathNotAllowed,
    ServiceError,
)
from webapp.runs.models import REFERENCE_TAG, Project, Run, RunStatus

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- validation


def validate_config(
    config: Mapping[str, Any], *, run_id: int | None = None, resuming: bool = False, local_paths: bool = True
) -> dict[str, Any]:
    """Validate with the engine's schema, this installation's components and model sizes
    (``engine.launch_checks``) and the web app's path rules; returns the normalised config (defaults
    filled in). The one validator of the launch form, the YAML view, sweeps and the API: an invalid
    config queues nothing. Raises ConfigInvalid listing every error found, each naming its field.

    ``local_paths=False`` for a run streamed from a client (``--report-to``): its paths are on the
    client's machine, so the server's path rules do not apply and no server file is read for sizes
    (a worker re-checks the paths before it would ever train such a config here)."""
    errors = [(f, "contains a NUL character (\\u0000), which cannot be stored") for f in _nul_fields(config)]
    try:
        cfg = parse_config(dict(config)).to_dict()
    except ConfigError as exc:
        schema = exc.errors or [("(root)", str(exc))]
        # The checks that need no valid schema run too: every error of the config in one report.
        # (A field the schema already refused is not reported twice.)
        named = {f for f, _m in schema}
        errors += schema + [e for e in launch_checks.config_errors(config) if e[0] not in named]
        raise ConfigInvalid(str(exc) if errors == schema else _joined(errors), errors) from None
    errors += launch_checks.config_errors(cfg)
    path_errors: list[tuple[str, str]] = []
    if local_paths:
        try:
            check_config_paths(cfg, run_id=run_id, resuming=resuming)
        except ConfigInvalid as exc:
            path_errors = exc.errors
    errors += path_errors
    # Sizes read a local model's config.json: only once its path passed the rules (or a builtin).
    if not any(f.startswith("model") for f, _m in path_errors):
        errors += launch_checks.size_errors(cfg, local_files=local_paths)
    if errors:
        raise ConfigInvalid(_joined(errors), errors)
    return cfg


def _joined(errors: list[tuple[str, str]]) -> str:
    return "invalid config: " + "; ".join(f"{f}: {m}" for f, m in errors)


def _nul_fields(value: Any, where: str = "") -> list[str]:
    """Dotted fields of ``value`` whose string (or key) holds a NUL character."""
    if isinstance(value, str):
        return [where or "(root)"] if "\x00" in value else []
    out: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            field = f"{where}.{k}" if where else str(k)
            out += [field] if "\x00" in str(k) else _nul_fields(v, field)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out += _nul_fields(v, f"{where}[{i}]")
    return out


def check_config_paths(cfg: Mapping[str, Any], *, run_id: int | None = None, resuming: bool = False) -> None:
    """Every local path the run would read stays inside the read roots (tracker options inside the
    write roots, ``paths.tracker_violations``); the output directory is
    allowed (``paths.check_output_dir``), owned by no other run and, unless the run resumes in it, holds
    no run yet. Raises ConfigInvalid listing every violation with its field."""
    errors = paths.config_read_violations(cfg) + paths.tracker_violations(cfg)
    out_dir = (cfg.get("train") or {}).get("output_dir")
    if out_dir:
        try:
            out = paths.check_output_dir(out_dir)
            owner = run_dir_owner(out, exclude=run_id)
            if owner is not None:
                raise PathNotAllowed(f"output dir {out} belongs to run #{owner.pk} ({owner.run_dir})")
            if not resuming and out.is_dir() and paths.holds_a_run(out):
                raise PathNotAllowed(
                    f"output dir {out} already holds a run (config.json or metrics.jsonl); "
                    "import it instead, or choose a new directory"
                )
        except PathNotAllowed as exc:
            errors.insert(0, ("train.output_dir", str(exc)))
    if errors:
        raise ConfigInvalid("; ".join(f"{f}: {m}" for f, m in errors), errors)


def run_dir_owner(path: Path, *, exclude: int | None = None) -> Run | None:
    """The run whose directory is ``path``, inside it or contains it (two runs never share files)."""
    text = str(path).rstrip("/")
    qs = Run.objects.exclude(run_dir="")
    if exclude is not None:
        qs = qs.exclude(pk=exclude)
    ancestors = [str(p) for p in path.parents]
    return (
        qs.filter(Q(run_dir=text) | Q(run_dir__startswith=text + "/") | Q(run_dir__in=ancestors))
        .order_by("pk")
        .first()
    )


def _denormalise(run: Run) -> None:
    cfg = run.config or {}
    run.algorithm = str((cfg.get("algorithm") or {}).get("id", ""))[:64]
    run.task = str((cfg.get("task") or {}).get("id", ""))[:128]
    run.model_name = str((cfg.get("model") or {}).get("name_or_path", ""))[:300]
    train = cfg.get("train") or {}
    if isinstance(train.get("n_iters"), int):
        run.total_iters = train["n_iters"]


def _clean_tags(tags: Iterable[str] | str | None) -> list[str]:
    """Stripped, unique, at most 64 characters. The ``reference`` tag is the reference loader's
    (``webapp/grue/reference.py`` writes it directly): a person's run cannot pose as shipped results,
    and a clone of a reference run is an ordinary run."""
    if tags is None:
        return []
    if isinstance(tags, str):
        tags = tags.split(",")
    out: list[str] = []
    for t in tags:
        t = str(t).strip()[:64]
        if t and t not in out and t != REFERENCE_TAG:
            out.append(t)
    return out


# --------------------------------------------------------------------------- creating runs


def create_run(
    config: Mapping[str, Any],
    *,
    user: Any = None,
    name: str | None = None,
    project: Project | str | None = None,
    tags: Iterable[str] | str | None = None,
    notes: str = "",
    cloned_from: Run | None = None,
    local_paths: bool = True,
) -> Run:
    """Validate and save a run in ``draft`` (nothing is enqueued: ``lifecycle.launch_run`` does).
    ``local_paths=False``: a run to stream into from a client (``validate_config``). Raises
    ConfigInvalid."""
    cfg = validate_config(config, local_paths=local_paths)
    return _new_run(
        cfg, user=user, name=name, project=project, tags=tags, notes=notes, cloned_from=cloned_from
    )


def _new_run(
    cfg: dict[str, Any],
    *,
    user: Any,
    name: str | None,
    project: Project | str | None,
    tags: Iterable[str] | str | None,
    notes: str,
    cloned_from: Run | None = None,
    save: bool = True,
) -> Run:
    if name:
        cfg["name"] = name
    if isinstance(project, str):
        project = Project.objects.get_or_create(name=project)[0] if project.strip() else None
    run = Run(
        name=(name or cfg.get("name") or "run")[:200],
        project=project,
        config=cfg,
        status=RunStatus.DRAFT,
        created_by=user if getattr(user, "is_authenticated", False) else None,
        tags=_clean_tags(tags),
        notes=notes or "",
        cloned_from=cloned_from,
    )
    _denormalise(run)
    if save:
        run.save()
    return run


def clone_run(
    run: Run, *, user: Any = None, config: Mapping[str, Any] | None = None, name: str | None = None
) -> Run:
    """A new draft with the same (or edited) config, remembering where it came from."""
    cfg = dict(config if config is not None else run.config)
    new_name = name or f"{run.name} (clone)"
    cfg["name"] = new_name
    return create_run(
        cfg, user=user, name=new_name, project=run.project, tags=run.tags, notes=run.notes, cloned_from=run
    )


def update_run_meta(
    run: Run, *, name: str | None = None, tags: Iterable[str] | str | None = None, notes: str | None = None
) -> Run:
    """Rename, retag or annotate a run (any status; not a reference run: shipped results stay as
    shipped)."""
    if run.is_reference:
        raise InvalidState(
            f"run #{run.pk} is a reference run (shipped study results): its tags and notes are fixed"
        )
    fields = []
    if name is not None:
        run.name = name.strip()[:200] or run.name
        fields.append("name")
    if tags is not None:
        run.tags = _clean_tags(tags)
        fields.append("tags")
    if notes is not None:
        run.notes = notes
        fields.append("notes")
    if fields:
        run.save(update_fields=fields)
    return run


# --------------------------------------------------------------------------- import of CLI runs


_METRIC_META_KEYS = {"step", "time", "timestamp", "event", "type", "iteration", "split", "phase"}


def _metric_rows(path: Path) -> Iterable[tuple[str, int, float | None]]:
    """Accepts ``{"step", "key", "value"}`` lines, ``{"step", "metrics"|"values": {...}}`` lines and
    flat ``{"step": s, "<key>": value, ...}`` lines (what the engine's JSONL sink may write)."""
    for lineno, obj in iter_jsonl_file(path, error=ServiceError):
        step = obj.get("step", obj.get("iteration"))
        if step is None:
            raise ServiceError(f"{path}: line {lineno}: missing 'step'")
        try:
            step = int(step)
        except (TypeError, ValueError):
            raise ServiceError(f"{path}: line {lineno}: 'step' must be an integer") from None
        if "key" in obj and "value" in obj:
            items = [(obj["key"], obj["value"])]
        else:
            values = obj.get("metrics", obj.get("values"))
            if isinstance(values, dict):
                items = list(values.items())
            else:
                items = [(k, v) for k, v in obj.items() if k not in _METRIC_META_KEYS]
        for k, v in items:
            if isinstance(v, bool) or not isinstance(v, (int, float)) and v is not None:
                continue
            yield str(k), step, (None if v is None else float(v))


def import_run_dir(
    path: str | Path,
    *,
    user: Any = None,
    project: Project | str | None = None,
    name: str | None = None,
    tags: Iterable[str] | str | None = None,
) -> Run:
    """Import a run directory written by the CLI (config.json, metrics.jsonl, samples.jsonl,
    checkpoints/) as a finished Run. The path must be inside the allowed roots."""
    root = paths.check_path(path)
    if not root.is_dir():
        raise ServiceError(f"{root}: not a directory")
    existing = Run.objects.filter(run_dir=str(root)).first()
    if existing is not None:  # importing the same directory again returns the run it already is
        return existing
    owner = run_dir_owner(root)
    if owner is not None:
        raise ServiceError(f"{root} overlaps the directory of run #{owner.pk} ({owner.run_dir})")
    cfg_path = root / "config.json"
    if not cfg_path.exists():
        raise ServiceError(f"{root}: no config.json (is this a run directory?)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise ServiceError(f"{cfg_path}: line {exc.lineno}: bad JSON: {exc.msg}") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("config"), dict):
        cfg = cfg["config"]
    if not isinstance(cfg, dict):
        raise ServiceError(f"{cfg_path}: expected a JSON object")
    try:
        # Schema only: an imported run executes nothing here (a clone of it is checked at launch).
        cfg = parse_config(dict(cfg), source=str(cfg_path)).to_dict()
    except ConfigError as exc:
        raise ConfigInvalid(f"{cfg_path}: {exc}", exc.errors or [("(root)", str(exc))]) from None
    try:
        with transaction.atomic():
            return _import_rows(root, cfg, user=user, project=project, name=name, tags=tags)
    except IntegrityError:
        # A concurrent import of the same directory won the unique run_dir: it is the run.
        existing = Run.objects.filter(run_dir=str(root)).first()
        if existing is None:
            raise
        return existing


def _import_rows(
    root: Path,
    cfg: dict[str, Any],
    *,
    user: Any,
    project: Project | str | None,
    name: str | None,
    tags: Iterable[str] | str | None,
) -> Run:
    run = _new_run(
        cfg,
        user=user,
        name=name or cfg.get("name") or root.name,
        project=project,
        tags=tags,
        notes=f"Imported from {root}",
        save=False,
    )
    run.run_dir = str(root)
    run.run_dir_owned = False
    run.save()
    metrics_path = root / "metrics.jsonl"
    last: dict[str, float | None] = {}
    last_step: dict[str, int] = {}
    max_step = 0
    if metrics_path.exists():
        batch: list[tuple[str, int, float | None]] = []
        for k, s, v in _metric_rows(metrics_path):
            batch.append((k, s, v))
            if s >= last_step.get(k, -1):
                last_step[k] = s
                last[k] = v
            max_step = max(max_step, s)
            if len(batch) >= 20000:
                ingest.ingest_metrics(run.pk, batch, returning=False)
                batch = []
        ingest.ingest_metrics(run.pk, batch, returning=False)
    samples_path = root / "samples.jsonl"
    if samples_path.exists():
        groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for lineno, obj in iter_jsonl_file(samples_path, error=ServiceError):
            if "prompt" not in obj or "generation" not in obj:
                raise ServiceError(f"{samples_path}: line {lineno}: a sample needs 'prompt' and 'generation'")
            groups.setdefault((int(obj.get("step", 0)), str(obj.get("split", "train"))), []).append(obj)
        for (step, split), rows in groups.items():
            ingest.ingest_samples(run.pk, step, split, rows)
    ckdir = root / "checkpoints"
    if ckdir.is_dir():
        for d in sorted(ckdir.iterdir()):
            digits = "".join(ch for ch in d.name if ch.isdigit())
            if digits:
                ingest.add_checkpoint(run.pk, int(digits), str(d))
    summary_path = root / "summary.json"
    summary: dict[str, Any] = {}
    if summary_path.exists():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError:
            summary = {}
    run.summary = summary if isinstance(summary, dict) else {}
    run.last_metrics = {k: protocol.clean_float(v) for k, v in last.items()}
    run.status = RunStatus.SUCCEEDED
    run.progress = 1.0
    run.current_iter = max_step
    run.finished_at = timezone.now()
    run.save()
    return run
