"""IMDB sentiment continuation (GRUE): the prompt is the first half of a review's words.

Mirrors RL4LMs's ``IMDB`` and ``IMDBForSeq2Seq`` pools: the prompt is the first 50% of the
whitespace-separated words; ``imdb`` keeps the whole review as the reference, ``imdb_seq2seq`` keeps the
remaining half (and, for the train split, only positive reviews, so that supervised training teaches
positive continuations). The validation split is the last 20% of a seeded shuffle of the train split, as
in RL4LMs (which used an unseeded shuffle) whenever the source has no validation file of its own.
"""

from __future__ import annotations

from typing import Any

from engine.data.base import Sample
from engine.data.sources import GrueTask, seeded_shuffle
from engine.registry import tasks

IMDB_METRICS = [
    {"id": "sentiment", "args": {}},
    {"id": "perplexity", "args": {}},
    {"id": "diversity", "args": {}},
]


def split_words(text: str, ratio: float = 0.5) -> tuple[str, str]:
    """(first ``ratio`` of the words, the rest), split on single spaces exactly as RL4LMs does."""
    words = text.split(" ")
    cut = int(len(words) * ratio)
    return " ".join(words[:cut]), " ".join(words[cut:])


class IMDBTask(GrueTask):
    """IMDB reviews: prompt = first half of a review (RL4LMs ``imdb``); reward = positive sentiment."""

    task_id = "imdb"
    fixture_name = "imdb"
    fixture_variants = ("imdb_large",)
    hub_name = "imdb"
    default_reward: dict[str, Any] = {"id": "sentiment_vader", "args": {}}
    default_metrics = IMDB_METRICS

    def __init__(
        self,
        prompt_ratio: float = 0.5,
        train_ratio: float = 0.8,
        split_seed: int = 0,
        **source: Any,
    ):
        super().__init__(**source)
        if not 0 < prompt_ratio < 1:
            raise ValueError("prompt_ratio must be between 0 and 1")
        if not 0 < train_ratio < 1:
            raise ValueError("train_ratio must be between 0 and 1")
        self.prompt_ratio = prompt_ratio
        self.train_ratio = train_ratio
        self.split_seed = split_seed

    def rows(self, split: str) -> list[dict[str, Any]]:
        # The hub and the shipped files have only train/test: validation is carved out of train.
        if split in ("train", "validation") and (self.hub or self.local_file("validation") is None):
            rows = seeded_shuffle(super().rows("train"), self.split_seed)
            cut = int(len(rows) * self.train_ratio)
            return rows[:cut] if split == "train" else rows[cut:]
        return super().rows(split)

    def text_label(self, row: dict[str, Any], i: int, split: str) -> tuple[str, int | None]:
        text = str(self.field(row, "text", "review", index=i, split=split))
        label = row.get("label", row.get("sentiment"))
        if isinstance(label, str):
            label = {"pos": 1, "positive": 1, "neg": 0, "negative": 0}.get(label.lower(), label)
        try:
            return text, int(label) if label is not None else None
        except (TypeError, ValueError):
            return text, None

    def build(self, rows: list[dict[str, Any]], split: str) -> list[Sample]:
        out = []
        for i, row in enumerate(rows):
            text, label = self.text_label(row, i, split)
            prompt, _rest = split_words(text, self.prompt_ratio)
            sid = str(row.get("id", f"{split}_{i}"))
            out.append(Sample(id=sid, prompt=prompt, references=[text], meta={"label": label}))
        return out


class IMDBSeq2SeqTask(IMDBTask):
    """IMDB for supervised training (RL4LMs ``imdb_seq2seq``): reference = the review's second half."""

    task_id = "imdb_seq2seq"

    def __init__(self, positive_ratio: float = 1.0, **kw: Any):
        super().__init__(**kw)
        self.positive_ratio = positive_ratio

    def build(self, rows: list[dict[str, Any]], split: str) -> list[Sample]:
        out = []
        for i, row in enumerate(rows):
            text, label = self.text_label(row, i, split)
            if split == "train" and label != 1:
                continue
            prompt, rest = split_words(text, self.prompt_ratio)
            sid = str(row.get("id", f"{split}_{i}"))
            out.append(
                Sample(id=sid, prompt=prompt, references=[rest], meta={"label": label, "reference": text})
            )
        if split == "train":
            out = out[: int(len(out) * self.positive_ratio)]
        return out


tasks.register("imdb")(IMDBTask)
tasks.register("imdb_seq2seq")(IMDBSeq2SeqTask)
