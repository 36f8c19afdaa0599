"""Celery task: train a reward model from a campaign's pairwise judgments, with progress."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import close_old_connections

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
