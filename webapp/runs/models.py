"""Database rows of the experiment manager.

``MetricPoint.id`` is a BigAutoField used as the cursor of live updates: a browser that
(re)connects asks for ids greater than the last one it saw, so nothing is lost or repeated.
Metric points are unique per (run, key, step) so replayed batches are idempotent.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q


class Project(models.Model):
    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RunStatus(models.TextChoices):
    DRAFT = "draft", "draft"
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    LOST = "lost", "lost"


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)
FINISHED_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.LOST)


class Run(models.Model):
    name = models.CharField(max_length=200)
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    config = models.JSONField(default=dict)
    status = models.CharField(
        max_length=16, choices=RunStatus.choices, default=RunStatus.DRAFT, db_index=True
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    worker_host = models.CharField(max_length=200, blank=True)
    worker_pid = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    tags = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    notes = models.TextField(blank=True)
    cloned_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="clones"
    )
    progress = models.FloatField(default=0.0)
    phase = models.CharField(max_length=32, blank=True)
    eta_seconds = models.FloatField(null=True, blank=True)
    total_iters = models.IntegerField(null=True, blank=True)
    current_iter = models.IntegerField(null=True, blank=True)
    # A run directory belongs to exactly one run (unique when set; stored resolved). ``run_dir_owned``:
    # the worker created it for this run, the only case in which deleting the run may remove it.
    run_dir = models.CharField(max_length=1000, blank=True)
    run_dir_owned = models.BooleanField(default=False)
    # Run directory whose last checkpoint the next execution continues from (resume in place).
    resume_from = models.CharField(max_length=1000, blank=True)
    cancel_requested = models.BooleanField(default=False)
    task_id = models.CharField(max_length=64, blank=True)
    attempts = models.IntegerField(default=0)
    # Automatic resumes after a lost worker (webapp.watchdog), capped by GRUE_AUTO_RESUME_LIMIT.
    auto_resumes = models.IntegerField(default=0)
    # Denormalised from config so the run table filters with plain indexed columns.
    algorithm = models.CharField(max_length=64, blank=True, db_index=True)
    task = models.CharField(max_length=128, blank=True, db_index=True)
    model_name = models.CharField(max_length=300, blank=True)
    # Final/last metric values ({key: value}) and the engine's summary, for tables and compare.
    summary = models.JSONField(default=dict, blank=True)
    last_metrics = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [GinIndex(fields=["tags"], name="run_tags_gin")]
        constraints = [
            models.UniqueConstraint(fields=["run_dir"], condition=~Q(run_dir=""), name="run_dir_one_owner")
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def group_name(self) -> str:
        return group_name(self.pk)


def group_name(run_id: int) -> str:
    """The Channels group that receives a run's live messages."""
    return f"run-{run_id}"


class MetricPoint(models.Model):
    id = models.BigAutoField(primary_key=True)
    # No database FK constraint and no index of its own (issue #15): a deferred FK check costs a trigger
    # per inserted point (a third of the server's ingest work) and ``run_id`` leads both indexes below.
    # Integrity is kept by locking instead: every writer takes the run row's KEY SHARE lock in its
    # transaction (``ingest._lock_run``) and ``lifecycle.delete_run`` locks the row FOR UPDATE before
    # deleting, so no point can be committed for a run that is being or has been deleted.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="metric_points", db_constraint=False, db_index=False
    )
    key = models.CharField(max_length=200)
    step = models.BigIntegerField()
    value = models.FloatField(null=True)
    time = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key", "step"], name="metric_run_key_step_uniq")
        ]
        indexes = [models.Index(fields=["run", "id"], name="metric_run_id_idx")]


class Sample(models.Model):
    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="samples")
    step = models.BigIntegerField()
    split = models.CharField(max_length=32, default="train")
    sample_id = models.CharField(max_length=200, blank=True)
    prompt = models.TextField()
    generation = models.TextField()
    references = models.JSONField(default=list, blank=True)
    reward = models.FloatField(null=True, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["run", "id"], name="sample_run_id_idx"),
            models.Index(fields=["run", "split", "step"], name="sample_run_split_step_idx"),
            models.Index(fields=["run", "sample_id"], name="sample_run_sid_idx"),
        ]


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.BigIntegerField()
    path = models.CharField(max_length=1000)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="checkpoint_run_step_uniq")]


class Artifact(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=32, default="file")
    path = models.CharField(max_length=1000)
    meta = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]


class RunLog(models.Model):
    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="logs")
    line = models.TextField()
    time = models.DateTimeField(auto_now_add=True)
    # Lines that belong to a step ("iter:12", "eval:12", "ckpt:12") are stored once per run, so a
    # resumed run that re-executes steps does not repeat them; free lines have no key.
    key = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run", "id"], name="runlog_run_id_idx")]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "key"], condition=~models.Q(key=""), name="runlog_run_key_uniq"
            )
        ]


class MetricRollup(models.Model):
    """Min/max per bucket of steps, maintained at ingest (``webapp.runs.ingest``) so that a chart of a
    long metric reads ~1,000 rows instead of every point. Level ``l`` buckets are
    ``ROLLUP_BASE * ROLLUP_FACTOR**l`` steps wide and aligned at multiples of the width."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_rollups")
    key = models.CharField(max_length=200)
    level = models.SmallIntegerField()
    bucket = models.BigIntegerField()
    n = models.IntegerField()
    min_value = models.FloatField(null=True)
    min_step = models.BigIntegerField(null=True)
    max_value = models.FloatField(null=True)
    max_step = models.BigIntegerField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "key", "level", "bucket"], name="rollup_run_key_level_bucket_uniq"
            )
        ]
