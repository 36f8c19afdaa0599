"""GSM8K maths word problems (question -> worked solution -> ``#### <number>``) for verifiable rewards.

Each sample's prompt is the question in a plain template (no chat template: the engine feeds raw text),
its reference is the worked solution ending in GSM8K's ``#### n`` line — so supervised training teaches
the answer format the ``math_accuracy`` reward reads — and ``meta['answer']`` is the gold number, which
the reward and the metric compare against exactly.

Sources as every task: the hub (``hub: true`` loads ``openai/gsm8k``, config ``main``, via ``datasets``),
local files with ``question``/``answer`` rows, else the 50 + 50 real problems shipped in
``fixtures/gsm8k`` (see its PROVENANCE.md). GSM8K has no validation split: it is carved out of train
(the last ``validation_ratio`` of a seeded shuffle), as the IMDB task does.
"""

from __future__ import annotations

import re
from typing import Any

from engine.data.base import Sample
from engine.data.sources import DataError, GrueTask, seeded_shuffle
from engine.registry import tasks
from engine.templates import TemplateError, check_template, render_template

DEFAULT_TEMPLATE = "Question: {question}\nAnswer:"
GSM8K_METRICS = [{"id": "math_accuracy", "args": {}}]
_CALCULATOR = re.compile(r"<<[^<>]*>>")
_FINAL = re.compile(r"####\s*(.+?)\s*$")


def split_solution(answer: str) -> tuple[str, str]:
    """(reasoning, final answer text) of a GSM8K ``answer`` field; the final answer follows ``####``."""
    m = _FINAL.search(answer.rstrip())
    if m is None:
        raise ValueError("no '#### <answer>' line")
    return answer[: m.start()].rstrip(), m.group(1).strip()


class GSM8KTask(GrueTask):
    """GSM8K: prompt = question in ``prompt_template``; reference = worked solution; meta answer = gold number."""

    task_id = "gsm8k"
    fixture_name = "gsm8k"
    hub_name = ("openai/gsm8k", "main")
    default_reward: dict[str, Any] = {"id": "math_accuracy", "args": {}}
    default_metrics = GSM8K_METRICS

    def __init__(
        self,
        prompt_template: str = DEFAULT_TEMPLATE,
        calculator_annotations: bool = False,
        validation_ratio: float = 0.1,
        split_seed: int = 0,
        **source: Any,
    ):
        super().__init__(**source)
        # Bare {question} only (engine.templates): str.format would obey "{question:>1000000}" and
        # make megabyte prompts, and follow "{question.__class__}".
        try:
            check_template(prompt_template, ("question",), what="task 'gsm8k': prompt_template")
        except TemplateError as exc:
            raise DataError(f"{exc}; it may only use the field {{question}}") from None
        if "{question}" not in prompt_template:
            raise DataError(
                f"task 'gsm8k': prompt_template must contain '{{question}}', got {prompt_template[:200]!r}"
            )
        if not 0 < validation_ratio < 1:
            raise DataError(f"task 'gsm8k': validation_ratio must be between 0 and 1, got {validation_ratio}")
        self.prompt_template = prompt_template
        self.calculator_annotations = calculator_annotations
        self.validation_ratio = validation_ratio
        self.split_seed = split_seed

    def rows(self, split: str) -> list[dict[str, Any]]:
        # The hub and the shipped files have only train/test: validation is carved out of train.
        if split in ("train", "validation") and (self.hub or self.local_file("validation") is None):
            rows = seeded_shuffle(super().rows("train"), self.split_seed)
            cut = len(rows) - max(1, int(len(rows) * self.validation_ratio))
            return rows[:cut] if split == "train" else rows[cut:]
        return super().rows(split)

    def build(self, rows: list[dict[str, Any]], split: str) -> list[Sample]:
        out = []
        for i, row in enumerate(rows):
            question = str(self.field(row, "question", index=i, split=split)).strip()
            solution = str(self.field(row, "answer", "solution", index=i, split=split))
            try:
                _reasoning, final = split_solution(solution)
            except ValueError:
                raise DataError(
                    f"task 'gsm8k': {split} row {i}: the answer field has no '#### <answer>' line "
                    f"(it ends {solution[-60:]!r})"
                ) from None
            if not self.calculator_annotations:
                solution = _CALCULATOR.sub("", solution)
            sid = str(row.get("id", f"{split}_{i}"))
            out.append(
                Sample(
                    id=sid,
                    prompt=render_template(self.prompt_template, {"question": question}),
                    references=[" " + solution.strip()],
                    meta={"answer": final, "question": question},
                )
            )
        return out


tasks.register("gsm8k")(GSM8KTask)
