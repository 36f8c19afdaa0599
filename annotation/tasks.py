"""Celery tasks: train a reward model from a campaign's pairwise judgments; run an AI judge over a
campaign. Both record their progress on their row."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import close_old_connections

from annotation.ai_judges import JUDGE_TASK, run_judging
from annotation.reward_models import TRAIN_TASK, run_reward_training

log = logging.getLogger(__name__)


@shared_task(name=TRAIN_TASK)
def train_reward_model(reward_model_id: int) -> dict:
    """Receives an id (never a row); progress and held-out accuracy are written to the RewardModel row."""
    close_old_connections()
    try:
        rm = run_reward_training(reward_model_id)
    except Exception:
        log.exception("reward model %s failed", reward_model_id)
        raise
    finally:
        close_old_connections()
    return {"id": rm.pk, "status": rm.status, "heldout_accuracy": (rm.metrics or {}).get("heldout_accuracy")}


@shared_task(name=JUDGE_TASK)
def run_ai_judge(judge_id: int, task_id: str | None = None) -> dict:
    """Receives an id and the task id chosen at queueing (a stale or cancelled message judges nothing)."""
    close_old_connections()
    try:
        judge = run_judging(judge_id, task_id=task_id)
    except Exception:
        log.exception("AI judge %s failed", judge_id)
        raise
    finally:
        close_old_connections()
    return {"id": judge.pk, "status": judge.status, "done": judge.n_done, "errors": judge.n_errors}
