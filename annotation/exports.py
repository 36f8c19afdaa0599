"""Judgments out of the app: preference pairs (JSONL, for reward models and DPO) and a CSV of
every judgment with spreadsheet formulas neutralised."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from annotation.ai_judges import ai_verdicts, check_source
from annotation.models import AIJudgment, Campaign
from annotation.results import judgment_rows
from webapp.csvsafe import cell  # the one spreadsheet-formula guard, shared with the runs' CSV


def preference_pairs(
    camp: Campaign, include_gold: bool = False, source: str = "human"
) -> list[dict[str, Any]]:
    """Every decided pairwise judgment as ``{prompt, chosen, rejected, meta}`` (ties/both-bad dropped).

    ``meta.group`` names the input (campaign and item key): ``engine.reward_model.split_heldout``
    keeps a group on one side of the held-out split. ``source`` chooses human judgments, AI judges'
    verdicts (one per judge and item, after the swap rule) or both; ``meta.source`` says which."""
    source = check_source(source)
    out = []
    if source in ("human", "both"):
        for r in judgment_rows(camp):
            if r["choice"] in ("a", "b") and (include_gold or not r["item__gold"]):
                out.append(
                    _pair(
                        camp, r["choice"] == "a", r["item__prompt"], r["item__key"],
                        (r["item__output_a"], r["item__output_b"]), (r["item__system_a"], r["item__system_b"]),
                        {
                            "item": r["item_id"], "judgment": r["id"], "annotator": r["annotator_id"],
                            "rationale": r["rationale"], "seconds": r["seconds"], "gold": bool(r["item__gold"]),
                            "source": "human",
                        },
                    )
                )  # fmt: skip
    if source in ("ai", "both"):
        for v in ai_verdicts(camp, include_gold=include_gold):
            if v["choice"] in ("a", "b"):
                out.append(
                    _pair(
                        camp, v["choice"] == "a", v["prompt"], v["key"],
                        (v["output_a"], v["output_b"]), (v["system_a"], v["system_b"]),
                        {
                            "item": v["item_id"], "judgment": None, "annotator": None, "rationale": "",
                            "seconds": None, "gold": bool(v["gold"]), "source": "ai", "ai_judge": v["judge"],
                        },
                    )
                )  # fmt: skip
    return out


def _pair(
    camp: Campaign,
    a_won: bool,
    prompt: str,
    item_key: str,
    outputs: tuple[str, str],
    systems: tuple[str, str],
    meta: dict[str, Any],
) -> dict[str, Any]:
    """One decided judgment (human or AI) as a preference pair; the same shape for both sources so a
    reward model or DPO run can mix them."""
    win, lose = (0, 1) if a_won else (1, 0)
    return {
        "prompt": prompt,
        "chosen": outputs[win],
        "rejected": outputs[lose],
        "meta": {
            "campaign": camp.pk,
            # Held-out splits group on this: every pair about one input (any two systems, any
            # annotator or judge) lands on the same side, so no held-out text was trained on.
            "group": f"{camp.pk}:{item_key}",
            "system_chosen": systems[win],
            "system_rejected": systems[lose],
            **meta,
        },
    }


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
