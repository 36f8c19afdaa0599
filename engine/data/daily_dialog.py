"""DailyDialog (GRUE): the last ``context_size`` utterances → the next one.

As RL4LMs's ``DailyDialog`` pool: for every utterance that has at least ``context_size`` utterances
before it, the prompt is those utterances joined by ``<EOU>`` followed by ``" <EOU>"``, the reference is
the utterance followed by ``<EOU>``, and ``meta`` carries the utterance's dialogue act
(``intent``: 1 inform, 2 question, 3 directive, 4 commissive) and ``emotion`` as one-element lists, which
the intent-accuracy reward and metric compare against.
"""

from __future__ import annotations

from typing import Any

from engine.data.base import Sample
from engine.data.sources import DataError, GrueTask
from engine.registry import tasks

EOU_TOKEN = "<EOU>"

DIALOG_METRICS = [
    {"id": "intent_accuracy", "args": {}},
    {"id": "perplexity", "args": {}},
    {"id": "meteor", "args": {}},
    {"id": "rouge", "args": {}},
    {"id": "bleu", "args": {}},
    {"id": "bertscore", "args": {}},
    {"id": "diversity", "args": {}},
]


def dialog_prompt(history: list[str], context_size: int) -> str:
    return EOU_TOKEN.join(history[-context_size:]) + " " + EOU_TOKEN


class DailyDialogTask(GrueTask):
    """DailyDialog next-utterance generation (RL4LMs ``daily_dialog``); reward intent accuracy + METEOR."""

    task_id = "daily_dialog"
    fixture_name = "daily_dialog"
    hub_name = "daily_dialog"
    default_reward: dict[str, Any] = {
        "id": "intent_accuracy",
        "args": {"intent_coeff": 0.5, "auto_coeff": 0.5},
    }
    default_metrics = DIALOG_METRICS

    def __init__(self, context_size: int = 5, **source: Any):
        super().__init__(**source)
        if context_size < 1:
            raise ValueError("context_size must be at least 1")
        self.context_size = context_size

    def build(self, rows: list[dict[str, Any]], split: str) -> list[Sample]:
        out = []
        utterance_id = 0
        for i, row in enumerate(rows):
            dialog = self.field(row, "dialog", index=i, split=split)
            if isinstance(dialog, str):
                dialog = [u.strip() for u in dialog.split("__eou__") if u.strip()]
            acts = row.get("act") or [None] * len(dialog)
            emotions = row.get("emotion") or [None] * len(dialog)
            if not isinstance(acts, list) or not isinstance(emotions, list):
                raise DataError(f"task {self.task_id!r}: {split} row {i}: 'act' and 'emotion' must be lists")
            contexts: list[str] = []
            # zip stops at the shortest list, as RL4LMs does for the one train dialogue whose
            # label count differs from its utterance count.
            for utterance, emotion, intent in zip(dialog, emotions, acts):
                if len(contexts) >= self.context_size:
                    out.append(
                        Sample(
                            id=f"{row.get('id', f'{split}_{i}')}_{len(contexts)}",
                            prompt=dialog_prompt(contexts, self.context_size),
                            references=[utterance + EOU_TOKEN],
                            meta={
                                "emotion": [emotion],
                                "intent": [intent],
                                "history": contexts[-self.context_size :],
                                "utterance_id": utterance_id,
                            },
                        )
                    )
                contexts.append(utterance)
                utterance_id += 1
        return out


tasks.register("daily_dialog")(DailyDialogTask)
