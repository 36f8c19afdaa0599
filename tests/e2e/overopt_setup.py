"""Shared setup of the over-optimisation watch's browser tests (issue 28 §2): a finished run with
stored evaluation generations, a checkpoint on disk, a gold job (queued, or as a dead worker left
it), and the answer to the page's confirmation dialogs. Kept here so the gold job tests
(test_overopt_checkpoints_browser.py, test_gold_retry_browser.py) build their runs one way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

#: A deterministic gold: the stub judge scores the share of digits in each continuation.
RUBRIC_YAML = """criteria:
  - name: numeric
    description: Is the continuation made of numbers?
    scale: {min: 1, max: 5}
judge: {backend: stub}
"""

#: One prompt at two evaluation steps, the smallest run a gold can be scored on.
TWO_STEPS: Mapping[int, Sequence[str]] = {0: ["1"], 10: ["1"]}


def finished_run(researcher: Any, name: str, generations: Mapping[int, Sequence[str]] = TWO_STEPS) -> Any:
    """A succeeded run that stored ``generations`` (per evaluation step, one per sample id, all of the
    prompt "p") on its evaluation split, as the trainer's evaluations do."""
    from webapp.runs import services
    from webapp.runs.models import Run, Sample

    run = services.create_run({"name": name}, user=researcher)
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    for step, gens in generations.items():
        for i, gen in enumerate(gens):
            Sample.objects.create(
                run=run, step=step, split="validation", sample_id=str(i), prompt="p", generation=gen
            )
    run.refresh_from_db()
    return run


def queued_gold_job(run: Any, label: str) -> Any:
    """The rubric gold :data:`RUBRIC_YAML` on ``run``, queued but sent to no worker (the test decides
    who runs it, and when)."""
    from webapp.runs import gold_jobs

    spec, label = gold_jobs.clean_gold_request("reward:rubric", RUBRIC_YAML, label)
    return gold_jobs.start_gold_job(run, spec, label, enqueue=False)


def checkpoint_on_disk(run: Any, runs_dir: Path, step: int) -> Path:
    """A checkpoint of ``run`` at ``step`` as the trainer writes it (the tiny GPT-2's policy in
    ``rl-<step>/state.pt``, under the run's directory in the runs dir), recorded on the run."""
    from tests.webapp.test_gold_jobs import _write_checkpoint
    from webapp.runs.models import Checkpoint

    path = runs_dir / f"run-{run.pk}/checkpoints/rl-{step:06d}"
    _write_checkpoint(path, marker=0.5)
    Checkpoint.objects.create(run=run, step=step, path=str(path))
    return path


def left_by_a_dead_worker(job: Any, worker: str = "gone@host", **meta: Any) -> Any:
    """``job`` as a worker that died holding it leaves it: claimed (``running``) by ``worker``, its
    last heartbeat ten minutes old (past ``GRUE_LOST_AFTER``), with ``meta`` (progress) merged in."""
    from django.utils import timezone

    from webapp.runs import gold_jobs
    from webapp.runs.models import Artifact

    assert gold_jobs._claim(job.pk, job.meta["task_id"]) is not None
    job.refresh_from_db()
    old = (timezone.now() - timedelta(minutes=10)).isoformat()
    Artifact.objects.filter(pk=job.pk).update(meta={**job.meta, **meta, "heartbeat": old, "worker": worker})
    job.refresh_from_db()
    return job


class Dialogs:
    """Answers the page's next confirmation dialog (accept or dismiss) and keeps its message."""

    def __init__(self, page: Any):
        self.page = page
        self.messages: list[str] = []

    def answer_next(self, accept: bool) -> None:
        def handler(dialog: Any) -> None:
            self.messages.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        self.page.once("dialog", handler)
