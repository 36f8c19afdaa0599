"""English→German translation (GRUE): IWSLT2017 and WMT16, ``"translate English to German: " + en``.

As RL4LMs's ``IWSLT2017EnDe`` and ``WMT`` pools: the prompt is ``prompt_prefix + source + prompt_suffix``
and the reference is the target side of the ``translation`` pair. Local rows may hold the pair as
``{"translation": {"en": ..., "de": ...}}`` (the hub layout) or as flat ``en`` / ``de`` columns (CSV).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.data.base import Sample
from engine.data.sources import DataError, GrueTask, load_hub_split
from engine.registry import tasks

TRANSLATION_PREFIX = "translate English to German: "

TRANSLATION_METRICS = [
    {"id": "meteor", "args": {}},
    {"id": "rouge", "args": {}},
    {"id": "bleu", "args": {}},
    {"id": "sacre_bleu", "args": {}},
    {"id": "chrf", "args": {}},
    {"id": "ter", "args": {}},
    {"id": "bertscore", "args": {}},
    {"id": "diversity", "args": {}},
]


class TranslationTask(GrueTask):
    default_reward: dict[str, Any] = {"id": "ter", "args": {}}
    default_metrics = TRANSLATION_METRICS

    def __init__(
        self,
        prompt_prefix: str = TRANSLATION_PREFIX,
        prompt_suffix: str = "",
        source_language: str = "en",
        target_language: str = "de",
        **source: Any,
    ):
        super().__init__(**source)
        self.prompt_prefix = prompt_prefix
        self.prompt_suffix = prompt_suffix
        self.src = source_language
        self.tgt = target_language

    def build(self, rows: list[dict[str, Any]], split: str) -> list[Sample]:
        out = []
        for i, row in enumerate(rows):
            pair = row.get("translation") if isinstance(row.get("translation"), dict) else row
            if self.src not in pair or self.tgt not in pair:
                raise DataError(
                    f"task {self.task_id!r}: {split} row {i}: needs {self.src!r} and {self.tgt!r} "
                    f"(under 'translation' or as columns); row keys: {sorted(row)}"
                )
            meta = {"tokenized": bool(row["tokenized"])} if "tokenized" in row else {}
            out.append(
                Sample(
                    id=str(row.get("id", f"{split}_{i}")),
                    prompt=self.prompt_prefix + str(pair[self.src]) + self.prompt_suffix,
                    references=[str(pair[self.tgt])],
                    meta=meta,
                )
            )
        return out


class IWSLT2017Task(TranslationTask):
    """IWSLT2017 en→de TED talks (RL4LMs ``iwslt2017en_de``); reward 1 − TER."""

    task_id = "iwslt2017en_de"
    fixture_name = "iwslt2017en_de"
    hub_name = ("iwslt2017", "iwslt2017-de-en")


class WMT16Task(TranslationTask):
    """WMT16 en→de news (RL4LMs ``wmt16``); reward 1 − TER."""

    task_id = "wmt16en_de"
    fixture_name = "wmt16en_de"

    def __init__(self, wmt_id: str = "wmt16", **kw: Any):
        super().__init__(**kw)
        self.wmt_id = wmt_id

    def hub_rows(self, split: str) -> Iterable[dict[str, Any]]:
        # RL4LMs tries "en-de" and falls back to "de-en" (the hub only has the latter for WMT16).
        name = self.hub if isinstance(self.hub, str) else self.wmt_id
        try:
            return load_hub_split(self.task_id, (name, f"{self.src}-{self.tgt}"), split)
        except DataError:
            return load_hub_split(self.task_id, (name, f"{self.tgt}-{self.src}"), split)


tasks.register("iwslt2017en_de")(IWSLT2017Task)
tasks.register("wmt16en_de")(WMT16Task)
tasks.add("wmt16", WMT16Task, "WMT16 en→de news (RL4LMs id 'wmt16'); alias of wmt16en_de")
