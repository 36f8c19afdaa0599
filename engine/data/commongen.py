"""CommonGen (GRUE): write a sentence that uses every concept of a set.

Prompt as RL4LMs's ``CommonGen`` pool builds it with the GRUE config's arguments:
``prefix + concept_separator_token.join(concepts) + concept_end_token``, e.g.
``"generate a sentence with: drill field run team."``. The hub data set (``gem/common_gen``) has one
row per (concept set, target) and RL4LMs keeps that single target as the reference. The local files
(CommonGen's own JSONL: ``concepts`` + a ``scene`` list) are expanded the same way for training (one
sample per scene) and kept whole for evaluation (one sample per concept set, every scene a reference),
which is how CommonGen is scored.
"""

from __future__ import annotations

import re
from typing import Any

from engine.data.base import Sample
from engine.data.sources import GrueTask, as_list
from engine.registry import tasks

PREFIX = "generate a sentence with: "

COMMONGEN_METRICS = [
    {"id": "meteor", "args": {}},
    {"id": "rouge", "args": {}},
    {"id": "bleu", "args": {}},
    {"id": "bertscore", "args": {}},
    {"id": "cider", "args": {}},
    {"id": "diversity", "args": {}},
]


def parse_concepts(value: Any) -> list[str]:
    """A list, or a string as CommonGen writes it (``field_N#look_V``) or space separated."""
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    s = str(value)
    parts = s.split("#") if "#" in s else s.split()
    return [re.sub(r"_[A-Z]$", "", p.strip()) for p in parts if p.strip()]


class CommonGenTask(GrueTask):
    """CommonGen concept-to-sentence (RL4LMs ``commongen``); reward METEOR + repeat penalty."""

    task_id = "commongen"
    fixture_name = "commongen"
    hub_name = ("gem", "common_gen")
    default_reward: dict[str, Any] = {
        "id": "meteor",
        "args": {"shaping_fn": "common_gen_repeat_penalty"},
    }
    default_metrics = COMMONGEN_METRICS

    def __init__(
        self,
        concept_separator_token: str = " ",
        concept_end_token: str = ".",
        prefix: str = PREFIX,
        expand_train_references: bool = True,
        **source: Any,
    ):
        super().__init__(**source)
        self.sep = concept_separator_token
        self.end = concept_end_token
        self.prefix = prefix
        self.expand = expand_train_references

    def prompt(self, concepts: list[str]) -> str:
        return self.prefix + self.sep.join(concepts) + self.end

    def build(self, rows: list[dict[str, Any]], split: str) -> list[Sample]:
        out = []
        for i, row in enumerate(rows):
            concepts = parse_concepts(self.field(row, "concepts", "concept_set", index=i, split=split))
            if "target" in row:  # gem/common_gen: one target per row (RL4LMs)
                refs = [str(row["target"]) or "empty reference"]
            else:
                refs = as_list(self.field(row, "scene", "references", "scenes", index=i, split=split))
                refs = [r for r in refs if r.strip()] or ["empty reference"]
            base_id = str(row["id"]) if "id" in row else f"{split}_{row.get('concept_set_idx', i)}"
            meta = {"concepts": concepts}
            if split == "train" and self.expand and len(refs) > 1:
                for j, ref in enumerate(refs):
                    out.append(
                        Sample(id=f"{base_id}_{j}", prompt=self.prompt(concepts), references=[ref], meta=meta)
                    )
            else:
                out.append(Sample(id=base_id, prompt=self.prompt(concepts), references=refs, meta=meta))
        return out


tasks.register("commongen")(CommonGenTask)
