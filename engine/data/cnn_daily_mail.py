"""CNN/DailyMail summarisation (GRUE): ``prompt_prefix + article + prompt_suffix`` → highlights.

As RL4LMs's ``CNNDailyMail`` pool with the GRUE config (``prompt_prefix: "Summarize: "``). The hub data
set is ``cnn_dailymail`` 3.0.0 (reference = ``highlights``). The shipped fixture comes from the SumLLM
subset, whose references are LLM-written summaries (``summary_gpt4``), see its PROVENANCE.md.
"""

from __future__ import annotations

from typing import Any

from engine.data.base import Sample
from engine.data.sources import GrueTask, as_list
from engine.registry import tasks

SUMMARIZATION_METRICS = [
    {"id": "meteor", "args": {}},
    {"id": "rouge", "args": {}},
    {"id": "bleu", "args": {}},
    {"id": "bertscore", "args": {}},
    {"id": "diversity", "args": {}},
]


class CNNDailyMailTask(GrueTask):
    """CNN/DailyMail 3.0.0 summarisation (RL4LMs ``cnn_daily_mail``); reward ROUGE-1."""

    task_id = "cnn_daily_mail"
    fixture_name = "cnn_daily_mail"
    hub_name = ("cnn_dailymail", "3.0.0")
    default_reward: dict[str, Any] = {"id": "rouge", "args": {"rouge_type": "rouge1"}}
    default_metrics = SUMMARIZATION_METRICS

    def __init__(
        self,
        prompt_prefix: str = "Summarize: ",
        prompt_suffix: str = "",
        truncate_article: int | None = None,
        max_size: int | None = None,
        reference_field: str | None = None,
        **source: Any,
    ):
        super().__init__(**source)
        self.prompt_prefix = prompt_prefix
        self.prompt_suffix = prompt_suffix
        self.truncate_article = truncate_article
        self.max_size = max_size
        self.reference_field = reference_field

    def build(self, rows: list[dict[str, Any]], split: str) -> list[Sample]:
        ref_fields = (
            (self.reference_field,) if self.reference_field else ("highlights", "summary_gpt4", "summary")
        )
        out = []
        for i, row in enumerate(rows):
            article = str(self.field(row, "article", "document", index=i, split=split))
            if self.truncate_article is not None:
                # RL4LMs truncates with NLTK word_tokenize (needs a download); whitespace words here.
                article = " ".join(article.split()[: self.truncate_article])
            refs = as_list(self.field(row, *ref_fields, index=i, split=split))
            out.append(
                Sample(
                    id=str(row.get("id", f"{split}_{i}")),
                    prompt=self.prompt_prefix + article + self.prompt_suffix,
                    references=refs,
                    meta={},
                )
            )
            if self.max_size is not None and len(out) >= self.max_size:
                break
        return out


tasks.register("cnn_daily_mail")(CNNDailyMailTask)
