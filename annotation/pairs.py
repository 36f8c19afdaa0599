"""Preference pairs: the domain's one definition of "a decided comparison" as ``{prompt, chosen,
rejected, meta}``, built from human judgments and AI judges' verdicts alike.

Why its own module: reward models (``annotation.reward_models``), DPO runs (``annotation.dpo``), the
API and the JSONL export all consume pairs; building them is the domain's rule (ties and both-bad
dropped, gold items optional, held-out groups by item), not an export format.
"""

from __future__ import annotations

from typing import Any

from annotation.ai_judges import ai_verdicts, check_source
from annotation.models import Campaign
from annotation.results import judgment_rows


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
