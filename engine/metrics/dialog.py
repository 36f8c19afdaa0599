"""Registration of the DailyDialog intent-accuracy metric (implementation in ``intent.py``).

Kept apart so that importing the metrics package does not import ``intent.py``: that module is also a
CLI (``python -m engine.metrics.intent train``), and runpy warns when a ``-m`` module is imported first.
"""

from __future__ import annotations

from typing import Any

from engine.metrics.intent import IntentAccuracy
from engine.registry import metrics


@metrics.register("intent_accuracy", "DailyDialog: predicted act of the generation == the reference's act")
def intent_accuracy(model_dir: str | None = None) -> Any:
    """IntentAccuracy with the shipped classifier, or one trained by ``python -m engine.metrics.intent train``."""

    return IntentAccuracy(model_dir)
