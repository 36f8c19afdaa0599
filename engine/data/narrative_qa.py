"""NarrativeQA abstractive QA (GRUE): ``question \\n summary`` (UnifiedQA format) → free-form answer.

RL4LMs reads UnifiedQA's NarrativeQA TSV files (``<question> \\n <summary>`` with a literal backslash-n,
tab, answer), lowercases the input and the answers (UnifiedQA's normalisation), and groups the answers of
identical inputs into one sample with several references. This pool reads those TSV files, the hub
layout (``document.summary.text``, ``question.text``, ``answers[].text``) from JSONL, or flat
``question`` / ``summary`` / ``answers`` rows. NarrativeQA cannot be downloaded here, so the shipped
fixture is synthetic (template-written stories) in the hub layout; see its PROVENANCE.md.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.data.base import Sample
from engine.data.sources import DataError, GrueTask, as_list, load_hub_split
from engine.registry import tasks

UNIFIEDQA_URLS = {
    "train": "https://storage.googleapis.com/unifiedqa/data/narrativeqa/train.tsv",
    "validation": "https://storage.googleapis.com/unifiedqa/data/narrativeqa/dev.tsv",
    "test": "https://storage.googleapis.com/unifiedqa/data/narrativeqa/test.tsv",
}

QA_METRICS = [
    {"id": "meteor", "args": {}},
    {"id": "rouge", "args": {}},
    {"id": "bleu", "args": {}},
    {"id": "bertscore", "args": {}},
    {"id": "rouge_l_max", "args": {}},
    {"id": "diversity", "args": {}},
]


def unifiedqa_input(question: str, summary: str) -> str:
    return f"{question.strip()} \\n {summary.strip()}"


def normalize_text(text: str, strip: bool) -> str:
    """UnifiedQA's normalisation as RL4LMs applies it (its quote removal is a no-op there too)."""
    text = text.lower()
    return text.strip() if strip else text


def read_unifiedqa_tsv(path: Path) -> list[dict[str, Any]]:
    """Header-less ``input<TAB>answer`` lines."""
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 2:
                raise DataError(f"task 'narrative_qa': {path}: line {lineno}: expected 'input<TAB>answer'")
            rows.append({"input": parts[0], "answers": [parts[1]]})
    return rows


class NarrativeQATask(GrueTask):
    """NarrativeQA question answering over story summaries (RL4LMs ``narrative_qa``); reward ROUGE-L max."""

    task_id = "narrative_qa"
    fixture_name = "narrative_qa"
    hub_name = "narrativeqa"
    default_reward: dict[str, Any] = {"id": "rouge_l_max", "args": {}}
    default_metrics = QA_METRICS

    def rows(self, split: str) -> list[dict[str, Any]]:
        f = None if self.hub else self.local_file(split)
        if f is not None and f.suffix.lower() == ".tsv":
            if not f.exists():
                return super().rows(split)  # the standard file-not-found error
            return read_unifiedqa_tsv(f)
        return super().rows(split)

    def hub_rows(self, split: str) -> Iterable[dict[str, Any]]:
        if isinstance(self.hub, str):  # an HF data set in the deepmind/narrativeqa layout
            return load_hub_split(self.task_id, (self.hub,), split)
        # hub: true → the UnifiedQA TSV files RL4LMs downloads.
        cache = Path(os.environ.get("GRUE_CACHE", Path.home() / ".cache" / "grue-studio")) / "narrative_qa"
        cache.mkdir(parents=True, exist_ok=True)
        dest = cache / f"{split}.tsv"
        if not dest.exists():
            try:
                urllib.request.urlretrieve(UNIFIEDQA_URLS[split], dest)  # noqa: S310 - fixed https URL
            except OSError as exc:
                dest.unlink(missing_ok=True)
                raise DataError(
                    f"task 'narrative_qa': could not download {UNIFIEDQA_URLS[split]} ({exc}). Offline? Put "
                    "UnifiedQA TSV or JSONL files in a directory and set task.args.path, or drop 'hub'."
                ) from exc
        return read_unifiedqa_tsv(dest)

    def input_and_answers(self, row: dict[str, Any], i: int, split: str) -> tuple[str, list[str]]:
        if "input" in row:
            return str(row["input"]), as_list(row.get("answers"))
        question = self.field(row, "question.text", "question", index=i, split=split)
        summary = self.field(row, "document.summary.text", "summary", "context", index=i, split=split)
        answers = row.get("answers", [])
        if isinstance(answers, list):
            answers = [a["text"] if isinstance(a, dict) else str(a) for a in answers]
        else:
            answers = as_list(answers)
        return unifiedqa_input(str(question), str(summary)), answers

    def build(self, rows: list[dict[str, Any]], split: str) -> list[Sample]:
        grouped: dict[str, list[str]] = {}
        for i, row in enumerate(rows):
            prompt, answers = self.input_and_answers(row, i, split)
            grouped.setdefault(prompt, []).extend(answers)
        return [
            Sample(
                id=f"{split}_{ix}",
                prompt=normalize_text(prompt, False),
                references=[normalize_text(a, True) for a in answers],
                meta={},
            )
            for ix, (prompt, answers) in enumerate(grouped.items())
        ]


tasks.register("narrative_qa")(NarrativeQATask)
