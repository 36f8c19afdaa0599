"""Database rows of the experiment manager.

``MetricPoint.id`` is the cursor of live updates: a browser that (re)connects asks for ids greater
than the last one it saw, so nothing is lost or repeated. Metric points are stored in chunks
(``MetricChunk``, one row per run/key/write) and read through the ``MetricPoint`` view; they are
unique per (run, key, step) so replayed batches are idempotent.
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


#: ``worker_host`` of a reference run (``webapp/grue/reference.py``): shipped study results, read-only.
REFERENCE_PREFIX = "reference:"
#: The tag people filter reference runs by; only the reference loader sets it (services drop it).
REFERENCE_TAG = "reference"


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

    @property
    def is_reference(self) -> bool:
        """Shipped study results: read-only (no cancel, retry, resume, delete or edit of tags and
        notes; clone & edit stays). The mark is ``worker_host``, which only the server writes."""
        return (self.worker_host or "").startswith(REFERENCE_PREFIX)

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


# A chunk holds at most CHUNK_POINTS points. Readers that need one point unnest its whole chunk (the
# arrays are one compressed value), so chunks stay small: a 65,536-point chunk made finding a series'
# first and last point cost 75 ms instead of ~2 ms. The view's point id is ``chunk id << CHUNK_SHIFT |
# position``, room for 65,536 points per chunk.
CHUNK_POINTS = 4096
CHUNK_SHIFT = 16


class MetricChunk(models.Model):
    """The stored form of metric points (issue #15): one row per (run, key, write) holding that
    write's points as arrays, steps strictly increasing inside a chunk. One row per point capped the
    ingest at PostgreSQL's per-row cost (two btree entries, a heap tuple and a rollup read-back per
    point, ~100k rows/s on an AVX2 server); a chunk of 500 points costs about as much as one row.
    Readers see points through ``MetricPoint`` (a view that unnests the chunks); only
    ``webapp.runs.ingest`` writes chunks.
    """

    id = models.BigAutoField(primary_key=True)
    # No database FK constraint (as the per-point table before): integrity by locking, see
    # ``ingest._lock_run`` and ``lifecycle.delete_run``. Django still cascades the delete of a run.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="metric_chunks", db_constraint=False, db_index=False
    )
    key = models.CharField(max_length=200)
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    steps = ArrayField(models.BigIntegerField())
    vals = ArrayField(models.FloatField(null=True))
    times = ArrayField(models.DateTimeField())

    class Meta:
        indexes = [
            models.Index(fields=["run", "key", "last_step"], name="chunk_run_key_last_idx"),
            models.Index(fields=["run", "id"], name="chunk_run_id_idx"),
        ]


class MetricPoint(models.Model):
    """One metric point, read from the SQL view ``runs_metricpoint`` over ``MetricChunk`` (read only:
    write through ``webapp.runs.ingest.ingest_metrics``). ``id`` is ``chunk id << 16 | ordinal - 1``:
    it grows in insertion order within a run (the writers of a run are serialized), so it stays the
    cursor of live updates. Points are unique per (run, key, step) by construction of the writer."""

    id = models.BigIntegerField(primary_key=True)
    run = models.ForeignKey(
        Run, on_delete=models.DO_NOTHING, related_name="metric_points", db_constraint=False, db_index=False
    )
    key = models.CharField(max_length=200)
    step = models.BigIntegerField()
    value = models.FloatField(null=True)
    time = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "runs_metricpoint"


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
    # No FK constraint and no index of its own, as ``MetricChunk.run`` (issue #15): the deferred FK
    # trigger per row was most of the server's rollup work (~800 rows per 10k points), and the unique
    # constraint below leads with ``run_id``. The writers' run-row lock keeps integrity.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="metric_rollups", db_constraint=False, db_index=False
    )
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
