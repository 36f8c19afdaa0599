"""Jobs of the over-optimisation watch after a run has ended: a gold scored on the run's evaluation
generations, and a checkpoint exported as a model directory (to download, or to launch from).

Why after the fact: a researcher usually learns that the proxy was gamed only after the run, and did
not configure a ``gold`` evaluation metric at launch. Every evaluation the run made stored its
generations (``Sample`` rows of the evaluation split; the first ``train.log_samples`` prompts at each
periodic evaluation, all of them at the final one), so any registered reward can score them later
without re-generating: the gold of evaluation step s is the mean gold over that step's generations.
The same prompts are scored at every step (the sample ids common to all evaluation steps), so the
steps differ only by the policy; each step's standard error is kept beside its mean.

With "prompts per checkpoint" the job instead re-generates from each checkpoint still on disk, on the
same seeded prompts, sampled as the engine's evaluation of the run's algorithm (an NLPO policy
through the masking policy its checkpoint holds; how each was sampled is recorded on the job). The
new outputs are stored as the run's samples (split :data:`REGEN_SPLIT`, at the checkpoint's step,
each with its gold), in the same transaction as the step's points and progress, replacing what a
retried step stored before, so the page can show them beside the gold.

The gold is chosen by **registered id** (a reward of ``engine.registry.rewards``: ``rubric`` with
the local AI judge, ``learned``, ``metric``, a sentiment classifier…, with its arguments as YAML
data) or as a trained reward model offered by another app (``extensions.reward_choices``); never
code. Its arguments go through the same checks as a launched config's reward (registered ids,
argument names, the rubric's own checks, local paths inside the read roots), each error naming its
field. The values are stored as ordinary metric points ``eval/gold:<label>`` (and
``eval/gold:<label>/<criterion>`` for a rubric), so the over-optimisation panel, the charts, the
compare view and the exports show them like any evaluation metric.

Job state lives on an ``Artifact`` row of the run (``kind`` ``gold-job`` or ``checkpoint-export``,
state in ``meta``): the run owns its jobs, deleting the run deletes them, and no migration is needed.
Only the worker that claimed a job (same ``task_id``, conditional update) writes its progress.

A gold job can be cancelled (:func:`cancel_gold_job`): a queued one ends ``cancelled`` at once (the
worker's claim then refuses it); a running one is marked ``cancelling`` and the worker stops before
the next evaluation step, ending ``cancelled`` with the steps it had scored kept (their points stay
on the charts). The request and the worker's progress meet under the job row's lock, so a job that
has already ended cannot be cancelled, and a cancelled one is never marked succeeded.

A failed or cancelled gold job can be retried (:func:`retry_gold_job`): the same row is queued again
with the same spec under a new task id, its earlier attempts kept in ``meta["attempts"]`` (status,
error, steps done), so the page shows what happened before and the label keeps naming one gold. The
steps the earlier attempt stored are kept and not scored again (points are never overwritten); the
worker scores the others.

A failed export is retried the same way (:func:`retry_export_job`, or exporting that checkpoint
again): the same row, a new task id, the earlier attempts kept.

A worker that dies mid-job leaves it ``running``. Runs already handle that (``heartbeat_at``,
``GRUE_LOST_AFTER``, ``lifecycle.mark_lost_runs``); both kinds of job ride on the same mechanism: the
worker stamps ``meta["heartbeat"]`` every ``GRUE_HEARTBEAT_INTERVAL`` and on each write, and
:func:`fail_stale_jobs` runs wherever lost runs are looked for — the run watchdog's sweep and the
cron command and the beat-scheduled ``mark_lost_runs`` task (all through ``webapp.watchdog.mark_lost``),
at a worker's start (jobs that host had claimed) — and when the run page or its jobs.json is read. A
stale job ends ``failed`` with an error saying the worker stopped, so it can be retried.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from celery import current_task, shared_task
from celery.signals import worker_ready
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from engine import launch_checks, overopt, registry, yamlio
from engine.checkpoint_layout import STATE_FILE
from webapp.celery import app as celery_app
from webapp.runs import extensions, ingest, paths
from webapp.runs.errors import PathNotAllowed
from webapp.runs.models import Artifact, Checkpoint, Run, Sample
from webapp.runs.protocol import clean_float
from webapp.runs.workers import run_queue

log = logging.getLogger(__name__)

GOLD_KIND = "gold-job"
EXPORT_KIND = "checkpoint-export"
GOLD_TASK = "webapp.runs.gold_jobs.score_gold"
EXPORT_TASK = "webapp.runs.gold_jobs.export_checkpoint"
KEY_PREFIX = "eval/gold:"
JOB_KINDS = (GOLD_KIND, EXPORT_KIND)
ACTIVE = ("queued", "running")
#: The states of a gold job the page keeps polling (a cancel request waits for the worker's next step).
GOLD_ACTIVE = (*ACTIVE, "cancelling")
ENDED = ("succeeded", "failed", "cancelled")
#: The states a job (gold or export) can be retried from.
RETRYABLE = ("failed", "cancelled")
#: The states in which a worker holds a job (its heartbeat is watched).
HELD = ("running", "cancelling")
#: Most prompts a gold job re-generates per checkpoint (each checkpoint is loaded and sampled on them).
MAX_PROMPTS = 512
MAX_ARGS_CHARS = 20_000
LABEL = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,39}$")
#: Rewards that make no sense as a gold chosen here (``weighted_sum`` needs components).
NOT_GOLD = frozenset({"weighted_sum"})
#: The checkpoint directory names the engine writes (as ``engine.trainer.CHECKPOINT_NAME``).
CHECKPOINT_NAME = re.compile(r"rl-[0-9]{6,12}")
#: The split of the samples a gold job re-generated from checkpoints (source "gold re-generation"), at
#: the checkpoint's step; never an evaluation split (:data:`NOT_EVALUATION`), so a later gold on the
#: stored evaluation generations and the evaluation views do not mix them in.
REGEN_SPLIT = "gold-regen"
NOT_EVALUATION = ("train", REGEN_SPLIT)
#: The per-sample gold of a re-generated sample: ``metrics["gold:<label>"]``, which also tags the row
#: with its job (labels are unique per run).
SAMPLE_KEY_PREFIX = "gold:"
#: Prompts of a re-generating job shown on the run page beside its gold (all are stored).
SHOWN_PROMPTS = 8


class GoldJobError(ValueError):
    """Bad input or a refused job; ``field`` names the form field the message is about."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# ------------------------------------------------------------------------------------------ choices


def gold_choices() -> list[dict[str, str]]:
    """What the "gold after the fact" menu offers: every registered reward (with YAML arguments), and
    the trained reward models other apps offer (complete configs, no arguments)."""
    out = [
        {"value": f"reward:{rid}", "label": f"{rid} — {desc}" if desc else rid, "group": "registered"}
        for rid, desc in sorted(registry.rewards.describe().items())
        if rid not in NOT_GOLD
    ]
    for choice in extensions.reward_choices():
        out.append({"value": f"choice:{choice['id']}", "label": choice["label"], "group": "trained"})
    return out


def clean_gold_request(choice: str, args_text: str, label: str) -> tuple[dict[str, Any], str]:
    """``(reward config, label)`` of a gold request, or :class:`GoldJobError` naming the field."""
    choice = (choice or "").strip()
    args_text = args_text or ""
    if choice.startswith("choice:"):
        found = {f"choice:{c['id']}": c for c in extensions.reward_choices()}
        if choice not in found:
            raise GoldJobError("gold", f"{choice[:80]!r} is not an available trained reward model")
        if args_text.strip():
            raise GoldJobError("args", "a trained reward model takes no arguments here; leave them empty")
        spec = dict(found[choice]["config"])
        default_label = re.sub(r"[^a-z0-9_.-]+", "-", choice[7:].lower()).strip("-") or "learned"
    elif choice.startswith("reward:"):
        rid = choice[7:]
        if rid not in registry.rewards or rid in NOT_GOLD:
            known = ", ".join(r for r in registry.rewards.ids() if r not in NOT_GOLD)
            raise GoldJobError("gold", f"unknown reward id {rid[:80]!r}; registered: {known}")
        if len(args_text) > MAX_ARGS_CHARS:
            raise GoldJobError("args", f"longer than {MAX_ARGS_CHARS} characters")
        try:
            args = yamlio.safe_load(args_text) if args_text.strip() else {}
        except Exception as exc:  # noqa: BLE001 - any YAML error: say where
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise GoldJobError("args", f"bad YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            raise GoldJobError("args", "the arguments must be a YAML mapping (name: value lines)")
        spec = {"id": rid, "args": dict(args)}
        default_label = rid
    else:
        raise GoldJobError("gold", "choose a registered reward or a trained reward model")
    errors = launch_checks.component_errors({"reward": spec}) + launch_checks.argument_errors(
        {"reward": spec}
    )
    errors += paths.config_read_violations({"reward": spec})
    if errors:
        field, message = errors[0]
        raise GoldJobError(field[len("reward.") :] if field.startswith("reward.args") else "gold", message)
    label = (label or "").strip().lower() or default_label[:40]
    if not LABEL.match(label):
        raise GoldJobError(
            "label",
            "1–40 characters: lower-case letters, digits, '-', '_' or '.', starting with a letter or digit",
        )
    return spec, label


def clean_prompts(value: str | int | None) -> int | None:
    """The "prompts per checkpoint" option: empty for the stored evaluation generations, else a whole
    number in 1..MAX_PROMPTS; anything else is a :class:`GoldJobError` naming ``prompts``."""
    text = str(value if value is not None else "").strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        raise GoldJobError("prompts", f"{text[:20]!r} is not a whole number") from None
    if not 1 <= n <= MAX_PROMPTS:
        raise GoldJobError("prompts", f"must be between 1 and {MAX_PROMPTS} per checkpoint (got {n})")
    return n


# ---------------------------------------------------------------------------------------- jobs rows


def jobs_of(run: Run, kind: str | None = None) -> list[Artifact]:
    qs = Artifact.objects.filter(run_id=run.pk, kind__in=[kind] if kind else [GOLD_KIND, EXPORT_KIND])
    return list(qs.order_by("id"))


def job_with_key(run: Run, gold_key: str, jobs: Sequence[Artifact] | None = None) -> Artifact | None:
    """The run's gold job whose metric is ``gold_key`` (a label is unique per run, so at most one),
    found in ``jobs`` (the run's :func:`jobs_of`) when the caller has read them: the run page reads
    them once per view and hands them to every helper that needs the job (its errors, where its
    per-sample tags live, its re-generated table)."""
    jobs = jobs_of(run, GOLD_KIND) if jobs is None else jobs
    return next((j for j in jobs if j.kind == GOLD_KIND and (j.meta or {}).get("key") == gold_key), None)


def job_json(job: Artifact) -> dict[str, Any]:
    """What the run page shows of a job (no server paths of other runs, nothing secret)."""
    m = job.meta or {}
    out = {
        "id": job.pk,
        "kind": job.kind,
        "name": job.name,
        "status": m.get("status", ""),
        "done": m.get("done", 0),
        "total": m.get("total", 0),
        "error": m.get("error", ""),
        "attempts": [
            {"status": a.get("status", ""), "error": a.get("error", ""), "done": a.get("done", 0)}
            for a in m.get("attempts") or []
        ],
    }
    if job.kind == GOLD_KIND:
        out.update(
            key=m.get("key", ""), gold=m.get("gold", ""), steps=m.get("steps", []), prompts=m.get("prompts"),
            masking=masking_summary(m.get("steps", []), m.get("masking_notes") or {}),
        )  # fmt: skip
    else:
        out.update(step=m.get("step"), path=job.path if m.get("status") == "succeeded" else "")
    return out


def _check_writable(run: Run) -> None:
    if run.is_reference:
        raise GoldJobError("run", "reference runs are read-only: clone the run to score a gold on it")


def start_gold_job(
    run: Run,
    spec: dict[str, Any],
    label: str,
    user: Any = None,
    enqueue: bool = True,
    prompts: int | None = None,
) -> Artifact:
    """Queue the scoring of ``spec`` on the run's evaluation generations (after the commit), or, with
    ``prompts``, on generations re-made from each checkpoint still on disk on that many prompts."""
    _check_writable(run)
    key = KEY_PREFIX + label
    if prompts is not None:
        prompts = clean_prompts(prompts)
    _check_sources(run, prompts)
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run.pk).first()  # one job creation at a time per run
        existing = Artifact.objects.filter(run_id=run.pk, kind=GOLD_KIND, name=label).first()
        if existing is not None:
            m = existing.meta or {}
            if m.get("status") not in ("failed", "cancelled") or m.get("done"):
                raise GoldJobError(
                    "label", f"this run already has a gold named {label!r}; choose another label"
                )
            existing.delete()  # ended before storing any point: the label is free again
        task_id = uuid.uuid4().hex
        job = Artifact.objects.create(
            run=run, name=label, kind=GOLD_KIND, path="",
            meta={"status": "queued", "task_id": task_id, "spec": spec, "key": key, "gold": _describe(spec),
                  "done": 0, "total": 0, "steps": [], "error": "", "prompts": prompts,
                  "by": _username(user)},
        )  # fmt: skip
        if enqueue:
            transaction.on_commit(lambda: _enqueue(GOLD_TASK, job.pk, task_id))
    return job


def _check_sources(run: Run, prompts: int | None) -> None:
    """A gold job needs something to score: checkpoints on disk to re-generate from (``prompts``),
    else stored evaluation generations; checked at the start and again at a retry."""
    if prompts is not None:
        if not existing_checkpoints(run.pk)[0]:
            raise GoldJobError(
                "prompts",
                f"run #{run.pk} has no checkpoint on disk to re-generate from (pruned or never saved)",
            )
    elif not eval_steps(run.pk):
        raise GoldJobError(
            "run", "this run stored no evaluation generations (evaluation split samples) to score"
        )


def _username(user: Any) -> str:
    return getattr(user, "username", "") if getattr(user, "is_authenticated", False) else ""


def _locked_job(
    run: Run, kind: str, missing: GoldJobError, **match: Any
) -> tuple[Artifact, dict[str, Any], str]:
    """``(job, a copy of its meta, its status)`` under the row's lock (call inside a transaction), so
    a researcher's action and the worker's progress meet one at a time; no such job is ``missing``."""
    job = Artifact.objects.select_for_update().filter(run_id=run.pk, kind=kind, **match).first()
    if job is None:
        raise missing
    m = dict(job.meta or {})
    return job, m, m.get("status", "")


def _locked_gold_job(run: Run, job_id: int) -> tuple[Artifact, dict[str, Any], str]:
    return _locked_job(
        run, GOLD_KIND, GoldJobError("job", f"run #{run.pk} has no gold job #{job_id}"), pk=job_id
    )


def _check_retryable(what: str, status: str) -> None:
    """Only a job that has ended without success can be queued again; the refusal names the job."""
    if status not in RETRYABLE:
        raise GoldJobError("job", f"{what} is {status}; only a failed or cancelled job can be retried")


def _requeue(job: Artifact, m: dict[str, Any], user: Any, task: str, enqueue: bool, **fresh: Any) -> None:
    """Queue ``job`` again on its own row (call under the row's lock, :func:`_locked_job`): a new task
    id, so a late message of the earlier attempt is refused by the claim; the earlier attempt (status,
    error, progress, times) appended to ``meta["attempts"]``; ``fresh`` resets the progress."""
    attempt = {k: m.get(k) for k in ("status", "error", "done", "total", "started", "finished", "by")}
    task_id = uuid.uuid4().hex
    for k in ("started", "finished", "heartbeat", "worker", "cancelled_by"):
        m.pop(k, None)
    m.update(
        status="queued", task_id=task_id, error="", attempts=[*(m.get("attempts") or []), attempt],
        by=_username(user), **fresh,
    )  # fmt: skip
    job.meta = m
    job.save(update_fields=["meta"])
    if enqueue:
        transaction.on_commit(lambda: _enqueue(task, job.pk, task_id))


def retry_gold_job(run: Run, job_id: int, user: Any = None, enqueue: bool = True) -> Artifact:
    """Queue a failed or cancelled gold job again with the same spec, on the same row (the label
    keeps naming one gold), under a new task id so a late message of the earlier attempt is refused.
    The earlier attempt is appended to ``meta["attempts"]``; the steps it stored are kept and the
    worker scores only the others. A queued, running, cancelling or succeeded job is refused by
    name with its state."""
    _check_writable(run)
    with transaction.atomic():
        job, m, status = _locked_gold_job(run, job_id)
        _check_retryable(f"gold job {job.name!r}", status)
        _check_sources(run, m.get("prompts"))
        _requeue(job, m, user, GOLD_TASK, enqueue, done=len(m.get("steps") or []), total=0)
    return job


def retry_export_job(run: Run, step: int, user: Any = None, enqueue: bool = True) -> Artifact:
    """Queue the failed (or dead worker's) export of the checkpoint at ``step`` again, on the same row
    with its earlier attempts kept (as :func:`retry_gold_job`); the checkpoint must still be on disk.
    A queued, running or succeeded export is refused by name with its state."""
    with transaction.atomic():
        missing = GoldJobError(
            "step", f"run #{run.pk} has no export of the checkpoint at step {step} to retry"
        )
        job, m, status = _locked_job(run, EXPORT_KIND, missing, meta__step=int(step))
        _check_retryable(f"the export of checkpoint {job.name} (step {step})", status)
        source = _checkpoint_source(run, step)
        _requeue(job, m, user, EXPORT_TASK, enqueue, done=0, total=1, checkpoint=str(source))
    return job


def _describe(spec: Mapping[str, Any]) -> str:
    args = spec.get("args") or {}
    judge = args.get("judge") if isinstance(args, Mapping) else None
    text = str(spec.get("id"))
    if isinstance(judge, Mapping) and judge.get("backend"):
        text += f" (judge {judge.get('backend')})"
    return text


def _checkpoint_source(run: Run, step: int) -> Path:
    """The directory of the run's checkpoint at ``step``, refused (field ``step``) when there is no
    such checkpoint or it is no longer on disk; checked at an export's start and again at its retry."""
    ckpt = Checkpoint.objects.filter(run_id=run.pk, step=step).first()
    if ckpt is None:
        raise GoldJobError("step", f"run #{run.pk} has no saved checkpoint at step {step}")
    source = checkpoint_dir(ckpt)
    if not (source / STATE_FILE).is_file():
        raise GoldJobError("step", missing_message(ckpt, source))
    return source


def start_export_job(run: Run, step: int, user: Any = None, enqueue: bool = True) -> Artifact:
    """Queue the export of the run's checkpoint at ``step`` as a model directory (one row per step: an
    active or succeeded export is returned as it is, a failed or cancelled one is retried on its row)."""
    source = _checkpoint_source(run, step)
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run.pk).first()
        existing = Artifact.objects.filter(run_id=run.pk, kind=EXPORT_KIND, meta__step=int(step)).first()
        if existing is not None:
            if (existing.meta or {}).get("status") in RETRYABLE:
                return retry_export_job(run, step, user=user, enqueue=enqueue)  # keeps the attempts
            return existing
        task_id = uuid.uuid4().hex
        meta = {"status": "queued", "task_id": task_id, "step": int(step), "checkpoint": str(source),
                "done": 0, "total": 1, "error": "", "by": _username(user)}  # fmt: skip
        job = Artifact.objects.create(
            run=run, name=source.name, kind=EXPORT_KIND, path=str(export_dir(run, source)), meta=meta
        )
        if enqueue:
            transaction.on_commit(lambda: _enqueue(EXPORT_TASK, job.pk, task_id))
    return job


def checkpoint_dir(ckpt: Checkpoint) -> Path:
    """The checkpoint's directory, resolved, inside the read roots and named as the engine names RL
    checkpoints; anything else is refused (a row could have been written by an import or the API)."""
    try:
        p = paths.check_path(ckpt.path, paths.read_roots())
    except PathNotAllowed as exc:
        raise GoldJobError("step", str(exc)) from None
    if not CHECKPOINT_NAME.fullmatch(p.name):
        raise GoldJobError("step", f"{p.name!r} is not an RL checkpoint directory (rl-<step>)")
    return p


def missing_message(ckpt: Checkpoint, source: Path | None = None) -> str:
    """Why a recorded checkpoint cannot be used, naming it (the trainer prunes old ones)."""
    name = source.name if source is not None else Path(ckpt.path).name
    return (
        f"checkpoint {name} (step {ckpt.step}) of run #{ckpt.run_id} is no longer on disk: pruned by "
        "the run's train.keep_checkpoints (only the newest are kept) or deleted"
    )


def checkpoint_on_disk(ckpt: Checkpoint) -> bool:
    """The checkpoint's directory is inside the read roots, named ``rl-<step>``, and still holds the
    trainer's ``state.pt``. A ``Checkpoint`` row outlives its directory: the trainer keeps only the
    newest ``train.keep_checkpoints``, so most rows of a long run name pruned directories."""
    try:
        return (checkpoint_dir(ckpt) / STATE_FILE).is_file()
    except GoldJobError:
        return False


def existing_checkpoints(run_id: int) -> tuple[list[Checkpoint], list[Checkpoint]]:
    """``(on disk, gone)``: the run's recorded checkpoints by step, split by :func:`checkpoint_on_disk`;
    only the first may be offered for export, launch, or a campaign over checkpoints."""
    here: list[Checkpoint] = []
    gone: list[Checkpoint] = []
    for ckpt in Checkpoint.objects.filter(run_id=run_id).order_by("step"):
        (here if checkpoint_on_disk(ckpt) else gone).append(ckpt)
    return here, gone


def export_dir(run: Run, source: Path) -> Path:
    """Where an export goes: ``<runs dir>/exports/run-<id>-<checkpoint>`` (inside the read roots, so a
    launched run may load it; outside every run directory, so deleting the run's files keeps it)."""
    return paths.runs_root() / "exports" / f"run-{run.pk}-{source.name}"


def succeeded_export(run_id: int, step: int) -> Artifact | None:
    job = Artifact.objects.filter(run_id=run_id, kind=EXPORT_KIND, meta__step=int(step)).first()
    return job if job is not None and (job.meta or {}).get("status") == "succeeded" else None


def _enqueue(task: str, job_id: int, task_id: str) -> None:
    """Send by name; a broker that does not answer fails the job with the reason."""
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2, interval_max=0.5)
            celery_app.send_task(
                task, args=[job_id, task_id], queue=run_queue(), task_id=task_id, retry=False, connection=conn
            )
    except Exception as exc:  # noqa: BLE001 - kombu/redis raise many types for "broker down"
        _update(job_id, task_id, status="failed", error=f"could not queue: {exc}")


def _update(job_id: int, task_id: str, **fields: Any) -> bool:
    """Merge ``fields`` into the job's meta while the job still names ``task_id`` (row lock). A job
    being cancelled ends ``cancelled``, never ``succeeded``; one already cancelled stays so."""
    with transaction.atomic():
        job = Artifact.objects.select_for_update().filter(pk=job_id).first()
        if job is None or (job.meta or {}).get("task_id") != task_id:
            return False
        current = (job.meta or {}).get("status")
        if fields.get("status") == "succeeded" and current == "cancelling":
            fields = {**fields, "status": "cancelled"}
        if current == "cancelled" and fields.get("status") != "failed":
            fields = {k: v for k, v in fields.items() if k != "status"}
        job.meta = {**(job.meta or {}), **fields, "heartbeat": timezone.now().isoformat()}
        if fields.get("status") in ENDED:
            job.meta["finished"] = timezone.now().isoformat()
        job.save(update_fields=["meta"])
    return True


def cancel_gold_job(run: Run, job_id: int, user: Any = None) -> Artifact:
    """Cancel a gold job of ``run``: a queued one ends ``cancelled`` now, a running one is marked
    ``cancelling`` and its worker stops before the next evaluation step (what it scored is kept).
    A job that has ended, or is already being cancelled, is refused with its state."""
    _check_writable(run)
    with transaction.atomic():
        job, m, status = _locked_gold_job(run, job_id)
        if status not in ACTIVE:
            what = "is already being cancelled" if status == "cancelling" else f"has already ended ({status})"
            raise GoldJobError(
                "job", f"gold job {job.name!r} {what}; only a queued or running job can be cancelled"
            )
        m["cancelled_by"] = _username(user)
        if status == "queued":
            m.update(status="cancelled", finished=timezone.now().isoformat())
        else:
            m["status"] = "cancelling"
        job.meta = m
        job.save(update_fields=["meta"])
    return job


def _cancel_requested(job_id: int) -> bool:
    meta = Artifact.objects.filter(pk=job_id).values_list("meta", flat=True).first() or {}
    return meta.get("status") in ("cancelling", "cancelled")


def _claim(job_id: int, task_id: str) -> Artifact | None:
    """queued → running, once: a redelivered or stale message does nothing."""
    with transaction.atomic():
        job = Artifact.objects.select_for_update().filter(pk=job_id).first()
        m = (job.meta or {}) if job is not None else {}
        if job is None or m.get("task_id") != task_id or m.get("status") != "queued":
            return None
        now = timezone.now().isoformat()
        job.meta = {**m, "status": "running", "started": now, "heartbeat": now, "worker": _worker_name()}
        job.save(update_fields=["meta"])
    return job


def _worker_name() -> str:
    """The Celery worker's name (as runs record ``worker_host``), or host:pid outside a worker."""
    name = getattr(getattr(current_task, "request", None), "hostname", None)
    return name or f"{socket.gethostname()}:{os.getpid()}"


class _JobHeartbeat(threading.Thread):
    """Stamps the job's ``meta["heartbeat"]`` every ``GRUE_HEARTBEAT_INTERVAL`` from a side thread,
    as the runs' heartbeat does, so a long step (a checkpoint re-generating, a slow judge, a big
    model exported) does not look like a dead worker. Only while the job still names this task."""

    def __init__(self, job_id: int, task_id: str):
        super().__init__(name=f"job-heartbeat-{job_id}", daemon=True)
        self.job_id, self.task_id = job_id, task_id
        self._done = threading.Event()

    def run(self) -> None:
        try:
            while not self._done.wait(settings.GRUE_HEARTBEAT_INTERVAL):
                try:
                    _update(self.job_id, self.task_id)
                except Exception:  # noqa: BLE001 - a DB blip must not kill the job
                    log.warning("heartbeat of job %s failed", self.job_id, exc_info=True)
                    close_old_connections()
        finally:
            connection.close()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def fail_stale_jobs(
    older_than: float | None = None, *, worker_host: str | None = None, run_ids: Iterable[int] | None = None
) -> list[int]:
    """Jobs (gold or export) a dead worker left ``running`` (or ``cancelling``) end ``failed``
    (``cancelled`` when a cancel was asked), with an error saying the worker stopped; returns their
    ids. Stale: no heartbeat for ``older_than`` seconds (``GRUE_LOST_AFTER``, the runs' limit), or,
    with ``worker_host``, claimed by that host (a restarted worker runs nothing yet). ``run_ids``
    limits the check (the run page checks its own jobs). Decided again under the row's lock, so a
    beat that lands meanwhile keeps the job."""
    qs = Artifact.objects.filter(kind__in=JOB_KINDS, meta__status__in=list(HELD))
    if run_ids is not None:
        qs = qs.filter(run_id__in=list(run_ids))
    age = older_than if older_than is not None else settings.GRUE_LOST_AFTER
    limit = timezone.now() - timedelta(seconds=age)
    out = []
    for job_id in qs.values_list("pk", flat=True):
        with transaction.atomic():
            job = Artifact.objects.select_for_update().filter(pk=job_id).first()
            m = dict(job.meta or {}) if job is not None else {}
            if m.get("status") not in HELD:
                continue
            beat = m.get("heartbeat") or m.get("started") or ""
            if worker_host is not None:
                if m.get("worker") != worker_host:
                    continue
                why = f"the worker {worker_host} restarted while it held this job"
            else:
                if beat and datetime.fromisoformat(beat) >= limit:
                    continue
                why = f"the worker {m.get('worker') or '?'} stopped sending heartbeats (last: {beat or 'never'})"
            cancelled = m["status"] == "cancelling"
            m.update(
                status="cancelled" if cancelled else "failed", finished=timezone.now().isoformat(),
                error=f"Worker stopped: {why}. " + _stale_outcome(job, m, cancelled),
            )  # fmt: skip
            job.meta = m
            job.save(update_fields=["meta"])
            log.warning("%s %s: %s", job.kind, job_id, why)
            out.append(job_id)
    return out


def _stale_outcome(job: Artifact, m: Mapping[str, Any], cancelled: bool) -> str:
    """What a dead worker's job keeps, and what to do next (the end of its error)."""
    if job.kind == EXPORT_KIND:
        return "Nothing was exported (the directory is written whole or not at all); retry the export."
    return f"The steps it scored ({m.get('done', 0)}) are kept; " + (
        "the cancel is done." if cancelled else "retry the job to score the rest."
    )


@worker_ready.connect
def _on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    """A (re)started worker holds no job yet: the jobs it had claimed failed with it."""
    try:
        hostname = getattr(sender, "hostname", None)
        if hostname:
            fail_stale_jobs(worker_host=hostname)
        fail_stale_jobs()
    except Exception:  # noqa: BLE001 - never keep a worker from starting
        log.exception("stale job check at worker start failed")
    finally:
        connection.close()


# ------------------------------------------------------------------------------------ gold scoring


def eval_steps(run_id: int) -> list[int]:
    return sorted(
        set(
            Sample.objects.filter(run_id=run_id)
            .exclude(split__in=NOT_EVALUATION)
            .values_list("step", flat=True)
        )
    )


def eval_split(run: Run) -> str | None:
    """The evaluation split to score: the run's ``eval.split`` when it stored samples of it, else the
    non-training split logged at the most steps (an imported run may name its splits otherwise)."""
    counts: dict[str, set[int]] = defaultdict(set)
    for split, step in (
        Sample.objects.filter(run_id=run.pk).exclude(split__in=NOT_EVALUATION).values_list("split", "step")
    ):
        counts[split].add(int(step))
    configured = ((run.config or {}).get("eval") or {}).get("split")
    if configured in counts:
        return str(configured)
    return max(sorted(counts), key=lambda sp: len(counts[sp]), default=None)


def paired_samples(run: Run) -> dict[int, list[Sample]]:
    """Each evaluation step's generations of the prompts every step has (same sample id and the same
    prompt text at every step), in sample-id order, so step means differ by the policy only; without
    such common prompts, each step's own samples."""
    split = eval_split(run)
    by_step: dict[int, dict[str, Sample]] = defaultdict(dict)
    loose: dict[int, list[Sample]] = defaultdict(list)
    for s in Sample.objects.filter(run_id=run.pk, split=split).order_by("step", "id"):
        loose[int(s.step)].append(s)
        if s.sample_id:
            by_step[int(s.step)].setdefault(s.sample_id, s)
    steps = sorted(loose)
    common = (
        set.intersection(*(set(by_step[s]) for s in steps))
        if steps and all(by_step[s] for s in steps)
        else set()
    )
    common = {i for i in common if len({by_step[s][i].prompt for s in steps}) == 1}
    if common:
        order = sorted(common, key=lambda i: (0, int(i), "") if i.isdigit() else (1, 0, i))
        return {s: [by_step[s][i] for i in order] for s in steps}
    return {s: loose[s] for s in steps}


@dataclass(frozen=True)
class Batch:
    """One point's generations to score. ``checkpoint`` names the checkpoint they were re-generated
    from (they are then stored as the run's samples, with the masking of an NLPO policy recorded);
    empty for the stored evaluation generations, whose rows (``rows``, ``Sample`` ids) then get their
    per-sample gold (:func:`tag_stored`)."""

    prompts: list[str]
    generations: list[str]
    references: list[list[str]]
    sample_ids: list[str] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    checkpoint: str = ""
    masking: str = ""
    masking_note: str = ""


Produce = Callable[[], Batch]


def _work(run: Run, meta: Mapping[str, Any]) -> list[tuple[int, Produce]]:
    """``(step, produce)`` per point the job stores: the stored evaluation generations of each
    evaluation step (paired prompts), or, with ``prompts``, each checkpoint on disk re-generating on
    that many prompts of the evaluation split (loaded one at a time, when its turn comes)."""
    n = meta.get("prompts")
    if n:
        from engine.checkpoint_export import generate_from_checkpoint

        def regenerate(ckpt: Checkpoint) -> Produce:
            def produce() -> Batch:
                source = checkpoint_dir(ckpt)
                new = generate_from_checkpoint(run.config or {}, source, int(n))
                return Batch(
                    [s.prompt for s in new.samples], list(new.generations),
                    [list(s.references or []) for s in new.samples], [str(s.id) for s in new.samples],
                    checkpoint=source.name, masking=new.masking, masking_note=new.masking_note,
                )  # fmt: skip

            return produce

        return [(int(c.step), regenerate(c)) for c in existing_checkpoints(run.pk)[0]]

    def stored(samples: list[Sample]) -> Produce:
        return lambda: Batch(
            [s.prompt for s in samples],
            [s.generation for s in samples],
            [list(s.references or []) for s in samples],
            [s.sample_id for s in samples],
            rows=[s.pk for s in samples],
        )

    return [(step, stored(samples)) for step, samples in sorted(paired_samples(run).items())]


def run_gold_job(job_id: int, task_id: str) -> dict[str, Any]:
    """The worker's part: score every evaluation step's generations (or each checkpoint's new ones)
    with the gold and store the means (and the rubric's per-criterion means) as metric points, step
    by step, with progress; a cancel request stops it before the next step."""
    from engine.metrics.gold import GoldReward  # torch-bound rewards load in the worker only

    job = _claim(job_id, task_id)
    if job is None:
        return {"id": job_id, "status": "not claimed"}
    meta = job.meta
    work = _work(Run.objects.get(pk=job.run_id), meta)
    _update(job_id, task_id, total=len(work), done=len(meta.get("steps") or []))
    try:
        metric = GoldReward(reward=meta["spec"])
    except Exception as exc:  # noqa: BLE001 - the reason goes on the job, the page shows it
        _update(
            job_id, task_id, status="failed", error=f"could not build the gold: {type(exc).__name__}: {exc}"
        )
        return {"id": job_id, "status": "failed"}
    key = meta["key"]
    # A retried job keeps the steps its earlier attempts stored (their points are never overwritten).
    steps_out: list[dict[str, Any]] = list(meta.get("steps") or [])
    notes: dict[str, str] = dict(meta.get("masking_notes") or {})
    scored = {int(e["step"]) for e in steps_out}
    todo = [(step, produce) for step, produce in work if step not in scored]
    for done, (step, produce) in enumerate(todo, len(steps_out) + 1):
        if _cancel_requested(job_id):  # before each step: the steps already scored are kept
            _update(job_id, task_id, status="cancelled")
            return {"id": job_id, "status": "cancelled", "steps": len(steps_out)}
        try:
            batch = produce()
            result = metric.compute(batch.prompts, batch.generations, batch.references)
        except Exception as exc:  # noqa: BLE001
            _update(job_id, task_id, status="failed", error=f"step {step}: {type(exc).__name__}: {exc}")
            return {"id": job_id, "status": "failed"}
        values, mean = result["gold"]
        points = [(key, step, mean)]
        for name, (_vals, m) in result.items():
            if name != "gold":
                points.append((key + name[len("gold") :], step, m))
        entry = {
            "step": step,
            "mean": mean,
            "se": overopt.standard_error(values or []),
            "n": len(batch.generations),
        }
        if batch.checkpoint:
            entry.update(checkpoint=batch.checkpoint, masking=batch.masking)
            notes[batch.masking] = batch.masking_note
        steps_out.append(entry)
        progress = {"done": done, "steps": steps_out, **({"masking_notes": notes} if notes else {})}
        if not _store_step(job, task_id, step, batch, values or [], points, progress):
            return {"id": job_id, "status": "superseded"}
    _update(job_id, task_id, status="succeeded")  # "cancelled" if a cancel came during the last step
    status = "cancelled" if _cancel_requested(job_id) else "succeeded"
    return {"id": job_id, "status": status, "steps": len(steps_out)}


class _Superseded(Exception):
    """The job no longer names this worker's task: what the step stored is rolled back."""


def _store_step(
    job: Artifact,
    task_id: str,
    step: int,
    batch: Batch,
    values: list[float],
    points: list[tuple[str, int, float]],
    progress: dict[str, Any],
) -> bool:
    """Store one step in one transaction: its re-generated samples (if any), its metric points and the
    job's progress; a worker whose job was superseded stores nothing. A step done again (a retried
    job) replaces the samples it stored before and adds no point twice (points are idempotent on
    run, key and step), so nothing is ever stored twice."""
    try:
        with transaction.atomic():
            if batch.checkpoint:
                store_regenerated(job.run_id, job.name, step, batch, values)
            elif batch.rows:
                tag_stored(job.name, batch.rows, values)
            ingest.ingest_metrics(job.run_id, points, returning=False)
            if not _update(job.pk, task_id, **progress):
                raise _Superseded
    except _Superseded:
        return False
    return True


def store_regenerated(run_id: int, label: str, step: int, batch: Batch, values: list[float]) -> int:
    """Store a checkpoint's re-generated outputs as the run's samples: split :data:`REGEN_SPLIT`
    (source "gold re-generation"), the checkpoint's step, the task's sample id, and the sample's gold
    as ``metrics["gold:<label>"]`` (which tags the row with its job); they replace the rows this
    label stored at this step before. Returns the number stored. Call it inside a transaction."""
    tag = SAMPLE_KEY_PREFIX + label
    Sample.objects.filter(run_id=run_id, split=REGEN_SPLIT, step=int(step), metrics__has_key=tag).delete()
    ids = batch.sample_ids or [""] * len(batch.generations)
    rows = [
        Sample(
            run_id=run_id,
            step=int(step),
            split=REGEN_SPLIT,
            sample_id=sid[:200],
            prompt=prompt,
            generation=gen,
            references=[str(r) for r in refs],
            metrics={tag: clean_float(values[i]) if i < len(values) else None},
        )
        for i, (sid, prompt, gen, refs) in enumerate(
            zip(ids, batch.prompts, batch.generations, batch.references, strict=True)
        )
    ]
    return len(Sample.objects.bulk_create(rows, batch_size=500))


def tag_stored(label: str, rows: list[int], values: list[float]) -> int:
    """Give each scored evaluation sample its gold as ``metrics["gold:<label>"]``, as a re-generated
    sample has it: the watch then compares two evaluations of the job's gold over the prompts they
    share (``overopt_views.gold_scores``), and the samples table shows the gold beside the other
    per-sample metrics. A step scored again overwrites its values. Call it inside a transaction.
    Returns the number of rows tagged."""
    tag = SAMPLE_KEY_PREFIX + label
    by_pk = Sample.objects.select_for_update().in_bulk(rows)
    changed = []
    for pk, value in zip(rows, values, strict=False):
        sample = by_pk.get(pk)
        if sample is not None:
            sample.metrics = {**(sample.metrics or {}), tag: clean_float(value)}
            changed.append(sample)
    Sample.objects.bulk_update(changed, ["metrics"], batch_size=500)
    return len(changed)


def masking_summary(steps: list[Mapping[str, Any]], notes: Mapping[str, str]) -> list[dict[str, Any]]:
    """How an NLPO run's checkpoints were sampled, for the page: ``[{masking, note, steps}]`` per way
    (none for other algorithms and for stored evaluation generations)."""
    by: dict[str, list[int]] = defaultdict(list)
    for entry in steps:
        if entry.get("masking"):
            by[str(entry["masking"])].append(int(entry["step"]))
    return [{"masking": k, "note": notes.get(k, k), "steps": v} for k, v in sorted(by.items())]


def regenerated_for(run: Run, gold_key: str, jobs: Sequence[Artifact] | None = None) -> dict[str, Any] | None:
    """:func:`regenerated_table` of the run's re-generating gold job whose metric is ``gold_key`` (the
    gold the panel shows), or None when that gold was not re-generated. ``jobs``: the run's
    :func:`jobs_of`, when the caller has it already."""
    job = job_with_key(run, gold_key, jobs)
    m = (job.meta or {}) if job is not None else {}
    if job is None or not m.get("prompts"):
        return None
    return regenerated_table(run.pk, job.name, m.get("steps") or [])


def regenerated_table(
    run_id: int,
    label: str,
    job_steps: Sequence[Mapping[str, Any]] = (),
    limit: int = SHOWN_PROMPTS,
) -> dict[str, Any] | None:
    """The first ``limit`` prompts a re-generating gold job stored, each with every checkpoint's
    generation and its gold, under a header per checkpoint with the job's mean, standard error and
    masking (``job_steps``, the job's ``steps``), for the run page beside the gold by checkpoint; None
    when the job stored no samples. The template escapes the texts."""
    qs = Sample.objects.filter(run_id=run_id, split=REGEN_SPLIT, metrics__has_key=SAMPLE_KEY_PREFIX + label)
    steps = sorted(set(qs.values_list("step", flat=True)))
    if not steps:
        return None
    first = list(qs.filter(step=steps[0]).order_by("id").values_list("sample_id", "prompt"))
    shown = first[:limit]
    cells: dict[tuple[str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for sid, prompt, step, gen, metrics in qs.filter(sample_id__in=[s for s, _p in shown]).values_list(
        "sample_id", "prompt", "step", "generation", "metrics"
    ):
        cells[(sid, prompt)][int(step)] = {
            "generation": gen,
            "gold": (metrics or {}).get(SAMPLE_KEY_PREFIX + label),
        }
    rows = [
        {"sample_id": sid, "prompt": prompt, "cells": [cells[(sid, prompt)].get(st) for st in steps]}
        for sid, prompt in shown
    ]
    scored = {int(e["step"]): e for e in job_steps}
    columns = [{"step": st, **scored.get(st, {})} for st in steps]
    return {
        "label": label,
        "split": REGEN_SPLIT,
        "columns": columns,
        "rows": rows,
        "n_prompts": len(first),
        "n_samples": qs.count(),
    }


def run_export_job(job_id: int, task_id: str) -> dict[str, Any]:
    """The worker's part of an export: the paths are checked again here, right before reading."""
    from engine.checkpoint_export import export_checkpoint as export

    job = _claim(job_id, task_id)
    if job is None:
        return {"id": job_id, "status": "not claimed"}
    run = Run.objects.get(pk=job.run_id)
    try:
        ckpt = Checkpoint.objects.get(run_id=run.pk, step=job.meta["step"])
        source = checkpoint_dir(ckpt)
        out = export_dir(run, source)
        paths.check_output_dir(out.parent, what="export directory")
        export(run.config or {}, source, out)
    except Exception as exc:  # noqa: BLE001 - the reason goes on the job
        _update(job_id, task_id, status="failed", error=f"{type(exc).__name__}: {exc}")
        return {"id": job_id, "status": "failed"}
    _update(job_id, task_id, status="succeeded", done=1)
    return {"id": job_id, "status": "succeeded"}


def _as_task(kind: str, run: Any, job_id: int, task_id: str) -> dict[str, Any]:
    """A worker's job with fresh database connections and its heartbeat beside it (so a dead worker's
    job is found, :func:`fail_stale_jobs`); an unexpected error marks the job failed with its reason
    (so the page stops polling) and is re-raised for the worker's log."""
    close_old_connections()
    beat = _JobHeartbeat(job_id, task_id)
    beat.start()
    try:
        return run(job_id, task_id)
    except Exception as exc:
        log.exception("%s job %s failed", kind, job_id)
        _update(job_id, task_id, status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        beat.stop()
        close_old_connections()


@shared_task(name=GOLD_TASK, ignore_result=True)
def score_gold(job_id: int, task_id: str) -> dict[str, Any]:
    return _as_task("gold", run_gold_job, job_id, task_id)


@shared_task(name=EXPORT_TASK, ignore_result=True)
def export_checkpoint(job_id: int, task_id: str) -> dict[str, Any]:
    return _as_task("export", run_export_job, job_id, task_id)


# ------------------------------------------------------------------------------ launch from a checkpoint


def launch_from_checkpoint(request: Any, value: str) -> dict[str, Any]:
    """The launch form's ``?checkpoint=<run>:<step>`` source: the run's config with the exported
    checkpoint as ``model.name_or_path``; the path is the server's own export, inside the read roots."""
    m = re.fullmatch(r"([0-9]{1,12}):([0-9]{1,12})", value.strip())
    if not m:
        raise ValueError(f"checkpoint: expected <run id>:<step>, got {value[:40]!r}")
    run_id, step = int(m.group(1)), int(m.group(2))
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise ValueError(f"checkpoint: there is no run #{run_id}")
    job = succeeded_export(run_id, step)
    if job is None:
        raise ValueError(
            f"checkpoint: step {step} of run #{run_id} is not exported yet; export it on the run page first"
        )
    try:
        model_dir = paths.check_path(job.path, paths.read_roots())
    except PathNotAllowed as exc:
        raise ValueError(f"checkpoint: {exc}") from None
    config = dict(run.config or {})
    config["model"] = {**(config.get("model") or {}), "name_or_path": str(model_dir)}
    config["model"].pop("gguf_file", None)
    if config.get("tokenizer", {}).get("name_or_path"):
        config["tokenizer"] = {**config["tokenizer"], "name_or_path": None}  # the export has its own
    train = dict(config.get("train") or {})
    train.pop("output_dir", None)  # a new run writes a new directory
    config["train"] = train
    config["name"] = f"{run.name} from step {step}"[:200]
    return config


def register() -> None:
    """Called from the runs app's ``ready()``."""
    extensions.register_launch_source("checkpoint", launch_from_checkpoint)
