"""Reward models learned from a campaign's pairwise judgments: queued, trained in the worker,
offered to the launch form, and reported with honest held-out numbers.

Held-out accuracy on a handful of pairs says little, so it is always shown with its count and a
Wilson 95% interval, and below ``ANNOTATION_MIN_HELDOUT`` (20) held-out pairs the pages say the
held-out set is too small to measure accuracy instead of showing "1.00".
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from annotation.ai_judges import check_source
from annotation.errors import AnnotationError
from annotation.models import Campaign, CampaignKind, RewardModel, RewardModelStatus
from annotation.pairs import preference_pairs
from annotation.stats import wilson_interval
from engine.reward_model import parse_pairs, train_reward_model
from webapp.celery import app as celery_app
from webapp.runs import paths
from webapp.runs.workers import run_queue

TRAIN_TASK = "annotation.tasks.train_reward_model"
MIN_PAIRS = 4


def min_heldout() -> int:
    return int(getattr(settings, "ANNOTATION_MIN_HELDOUT", 20))


@dataclass
class TrainRequest:
    name: str
    backbone: str = "minilm"
    epochs: float = 3.0
    learning_rate: float = 5e-5
    batch_size: int = 16
    max_length: int = 128
    heldout_fraction: float = 0.2
    include_prompt: bool = False
    # Whose judgments make the pairs: "human", "ai" (AI judges' verdicts) or "both"; chosen explicitly.
    source: str = "human"


def check_backbone(backbone: str) -> str:
    """The shipped MiniLM, a builtin model, a hub id, or a local directory inside the read roots."""
    backbone = (backbone or "minilm").strip()
    if backbone in ("minilm", "default") or paths.is_model_reference_safe(backbone):
        return backbone
    return str(paths.check_path(backbone, paths.read_roots()))


def create_reward_model(
    camp: Campaign, req: TrainRequest, user: Any = None, enqueue: bool = True
) -> RewardModel:
    """Register a reward model and queue its training (Celery) after the transaction commits."""
    if camp.kind != CampaignKind.PAIRWISE:
        raise AnnotationError("reward models are trained from pairwise judgments")
    req.source = check_source(req.source)
    n = len(preference_pairs(camp, source=req.source))
    if n < MIN_PAIRS:
        raise AnnotationError(
            f"need at least {MIN_PAIRS} decided pairwise judgments ({req.source}) to train a reward model, have {n}"
        )
    backbone = check_backbone(req.backbone)
    with transaction.atomic():
        rm = RewardModel.objects.create(
            name=req.name or f"{camp.name} reward model", campaign=camp, backbone=backbone,
            params={k: v for k, v in req.__dict__.items() if k not in ("name", "backbone")},
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )  # fmt: skip
        rm.path = str(paths.reward_models_dir() / f"rm-{rm.pk}")
        rm.save(update_fields=["path"])
        if enqueue:
            rm_id = rm.pk
            transaction.on_commit(lambda: _enqueue_training(rm_id))
    return rm


def _enqueue_training(rm_id: int) -> None:
    """Send the task by name (this module never imports the worker's task module); a broker that
    does not answer fails the reward model with the reason instead of hanging the request."""
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2, interval_max=0.5)
            res = celery_app.send_task(
                TRAIN_TASK, args=[rm_id], queue=run_queue(), retry=False, connection=conn
            )
    except Exception as exc:  # noqa: BLE001 - kombu/redis raise many types for "broker down"
        RewardModel.objects.filter(pk=rm_id).update(
            status=RewardModelStatus.FAILED, error=f"could not queue: {exc}"
        )
        return
    RewardModel.objects.filter(pk=rm_id).update(task_id=res.id or "")


def run_reward_training(rm_id: int, should_stop: Any = None) -> RewardModel:
    """Train (in the current process) and record progress/metrics; used by the Celery task."""
    rm = RewardModel.objects.select_related("campaign").get(pk=rm_id)
    RewardModel.objects.filter(pk=rm_id).update(status=RewardModelStatus.RUNNING, progress=0.0, error="")
    try:
        pairs = parse_pairs(
            [
                json.dumps(p)
                for p in preference_pairs(rm.campaign, source=(rm.params or {}).get("source", "human"))
            ],
            source=f"campaign {rm.campaign_id}",
        )
        p = rm.params or {}
        last = {"t": 0.0}

        def progress(step: int, total: int, info: dict[str, Any]) -> None:
            now = time.time()
            if step == total or now - last["t"] > 0.5:
                last["t"] = now
                RewardModel.objects.filter(pk=rm_id).update(
                    progress=step / total, metrics={"step": step, "total": total, "loss": info.get("loss")}
                )

        res = train_reward_model(
            pairs, rm.path, backbone=rm.backbone, epochs=float(p.get("epochs", 3.0)),
            learning_rate=float(p.get("learning_rate", 5e-5)), batch_size=int(p.get("batch_size", 16)),
            max_length=int(p.get("max_length", 128)), heldout_fraction=float(p.get("heldout_fraction", 0.2)),
            include_prompt=bool(p.get("include_prompt", False)), progress=progress, should_stop=should_stop,
        )  # fmt: skip
    except Exception as exc:
        RewardModel.objects.filter(pk=rm_id).update(
            status=RewardModelStatus.FAILED, error=f"{type(exc).__name__}: {exc}", finished_at=timezone.now()
        )
        raise
    metrics = res.to_dict()
    metrics.update(heldout_summary(metrics))
    RewardModel.objects.filter(pk=rm_id).update(
        status=RewardModelStatus.SUCCEEDED, progress=1.0, metrics=metrics, finished_at=timezone.now()
    )
    return RewardModel.objects.get(pk=rm_id)


def heldout_summary(metrics: dict[str, Any] | None) -> dict[str, Any]:
    """Held-out accuracy with its count and Wilson 95% interval, and whether the count is too small.

    ``heldout_text`` is what pages show, e.g. "0.83 (95% CI 0.66–0.93, n=30)" or
    "too few held-out pairs to measure (n=2, need 20)".
    """
    m = metrics or {}
    n = int(m.get("heldout_pairs") or 0)
    acc = m.get("heldout_accuracy")
    need = min_heldout()
    if not isinstance(acc, int | float) or n == 0:
        return {"heldout_n": n, "heldout_low": None, "heldout_high": None, "heldout_too_small": True,
                "heldout_text": f"no held-out pairs (n=0, need {need})"}  # fmt: skip
    low, high = wilson_interval(acc * n, n)
    too_small = n < need
    text = (
        f"too few held-out pairs to measure (n={n}, need {need}; {acc:.2f} observed)"
        if too_small
        else f"{acc:.2f} (95% CI {low:.2f}–{high:.2f}, n={n})"
    )
    return {"heldout_n": n, "heldout_low": low, "heldout_high": high, "heldout_too_small": too_small,
            "heldout_text": text}  # fmt: skip


def learned_reward_config(rm: RewardModel) -> dict[str, Any]:
    return {"id": "learned", "args": {"model_path": rm.path, "label_index": 0}}


def choice_id(rm: RewardModel | int) -> str:
    """The launch form's id of a reward model (``/launch/?reward=<id>`` preselects it)."""
    return f"learned-rm-{rm if isinstance(rm, int) else rm.pk}"


def reward_choices() -> list[dict[str, Any]]:
    """Trained reward models as launch-form choices (``webapp.runs.extensions`` format)."""
    out = []
    for rm in RewardModel.objects.filter(status=RewardModelStatus.SUCCEEDED).order_by("-created"):
        held = heldout_summary(rm.metrics)
        out.append(
            {
                "id": choice_id(rm),
                "label": f"Learned reward: {rm.name} (#{rm.pk}, held-out accuracy {held['heldout_text']})",
                "config": learned_reward_config(rm),
            }
        )
    return out
