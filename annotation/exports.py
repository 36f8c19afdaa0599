"""Judgments out of the app: preference pairs as JSONL (built by ``annotation.pairs``, for reward
models and DPO) and a CSV of every judgment with spreadsheet formulas neutralised."""

from __future__ import annotations

import csv
import io
import json

from annotation.ai_judges import ai_verdicts
from annotation.models import AIJudgment, Campaign
from annotation.pairs import preference_pairs
from annotation.results import judgment_rows
from webapp.csvsafe import cell  # the one spreadsheet-formula guard, shared with the runs' CSV


def export_jsonl(camp: Campaign, source: str = "human") -> str:
    return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in preference_pairs(camp, source=source))


CSV_FIELDS = [
    "judgment", "campaign", "item", "annotator", "system_a", "system_b", "choice", "winner", "left_is_a",
    "scores", "seconds", "rationale", "gold", "created", "prompt", "output_a", "output_b",
]  # fmt: skip


def export_csv(camp: Campaign) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_FIELDS)
    for r in judgment_rows(camp):
        winner = (
            r["item__system_a"] if r["choice"] == "a" else r["item__system_b"] if r["choice"] == "b" else ""
        )
        w.writerow(
            [cell(v) for v in [r["id"], camp.pk, r["item_id"], r["annotator__username"], r["item__system_a"], r["item__system_b"],
             r["choice"], winner, r["left_is_a"], json.dumps(r["scores"] or {}), r["seconds"], r["rationale"],
             r["item__gold"], r["created"].isoformat(), r["item__prompt"], r["item__output_a"], r["item__output_b"]]]
        )  # fmt: skip
    return buf.getvalue()


AI_CSV_FIELDS = [
    "judge", "judge_model", "item", "system_a", "system_b", "a_shown_first", "label", "choice", "p_first",
    "p_second", "item_verdict", "reply", "prompt",
]  # fmt: skip


def export_ai_csv(camp: Campaign) -> str:
    """Every AI pass (two per judged item) with its label, probabilities, raw reply and the item's
    verdict after the swap rule, so a researcher can audit the judges (formula-safe cells)."""
    verdicts = {(v["judge_id"], v["item_id"]): v["choice"] for v in ai_verdicts(camp, include_gold=True)}
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(AI_CSV_FIELDS)
    rows = (
        AIJudgment.objects.filter(campaign=camp)
        .select_related("judge", "item")
        .order_by("judge_id", "item_id", "-a_first")
    )
    for r in rows:
        w.writerow(
            [cell(v) for v in [r.judge.name, r.judge.model, r.item_id, r.item.system_a, r.item.system_b, r.a_first,
             r.label, r.choice, r.p_first, r.p_second, verdicts.get((r.judge_id, r.item_id), ""), r.reply, r.item.prompt]]
        )  # fmt: skip
    return buf.getvalue()
