"""The verdicts on the paper's three claims: each claim, the comparisons of cells that decide it and
the rule (the difference of seed means against two standard errors).

Apart from the report's formatting because the rule is the part a reader checks: it is written once
here and stated again, in words, under the report's verdicts."""

from __future__ import annotations

import math
from typing import Any

from engine.study.common import PERPLEXITY, SENTIMENT


def compare(table: dict[str, Any], a: str, b: str, metric: str, higher: bool = True) -> dict[str, Any]:
    """Is cell ``a`` better than cell ``b`` on ``metric``, beyond the seed noise?

    The rule (not a significance test): the difference of the means against two standard errors of
    that difference (Welch). ``better`` when it exceeds them in the claimed direction, ``worse`` when
    it exceeds them the other way, ``within noise`` otherwise, ``too few seeds`` below 2 per cell."""
    ma = table["cells"].get(a, {}).get("metrics", {}).get(metric)
    mb = table["cells"].get(b, {}).get("metrics", {}).get(metric)
    if not ma or not mb or ma["mean"] is None or mb["mean"] is None:
        return {"a": a, "b": b, "metric": metric, "outcome": "missing"}
    d = ma["mean"] - mb["mean"]
    if not higher:
        d = -d
    res = {"a": a, "b": b, "metric": metric, "diff": d, "mean_a": ma["mean"], "mean_b": mb["mean"]}
    if ma["n"] < 2 or mb["n"] < 2:
        return {**res, "outcome": "too few seeds"}
    se = math.sqrt(ma["std"] ** 2 / ma["n"] + mb["std"] ** 2 / mb["n"])
    res["two_se"] = 2 * se
    outcome = "better" if d > 2 * se else ("worse" if d < -2 * se else "within noise")
    return {**res, "outcome": outcome}


def _combine(outcomes: list[str]) -> str:
    if any(o in ("missing", "too few seeds") for o in outcomes):
        return "inconclusive"
    if all(o == "better" for o in outcomes):
        return "supported"
    if any(o == "worse" for o in outcomes):
        return "not supported at this scale"
    return "inconclusive"


# Largest perplexity rise over zero-shot among the paper's RL cells (Supervised+PPO: 35.05 / 32.17 = +9 %).
FLUENCY_TOLERANCE = 0.10


def verdicts(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The paper's three claims, each with the comparisons that decide it and a verdict:
    ``supported``, ``not supported at this scale`` or ``inconclusive``."""
    cells = table["cells"]
    c1 = [
        compare(table, rl, "supervised", SENTIMENT)
        for rl in ("ppo", "nlpo", "supervised_ppo", "supervised_nlpo")
    ]
    c2 = [compare(table, rl, "zero_shot", SENTIMENT) for rl in ("ppo", "nlpo")]
    fluency = []
    for rl in ("ppo", "nlpo"):
        p = cells.get(rl, {}).get("metrics", {}).get(PERPLEXITY)
        z = cells.get("zero_shot", {}).get("metrics", {}).get(PERPLEXITY)
        if not p or not z or p["mean"] is None or z["mean"] is None:
            fluency.append({"cell": rl, "outcome": "missing"})
            continue
        rise = p["mean"] / z["mean"] - 1.0
        fluency.append(
            {
                "cell": rl,
                "ppl": p["mean"],
                "ppl_zero_shot": z["mean"],
                "rise": rise,
                "outcome": "better" if rise <= FLUENCY_TOLERANCE else "worse",
            }
        )
    c3 = [
        compare(table, "nlpo", "ppo", SENTIMENT),
        compare(table, "supervised_nlpo", "supervised_ppo", SENTIMENT),
    ]
    stab = []
    for a, b in (("nlpo", "ppo"), ("supervised_nlpo", "supervised_ppo")):
        sa = cells.get(a, {}).get("metrics", {}).get(SENTIMENT, {}).get("std")
        sb = cells.get(b, {}).get("metrics", {}).get(SENTIMENT, {}).get("std")
        stab.append({"a": a, "b": b, "std_a": sa, "std_b": sb})
    return [
        {
            "claim": "RL beats supervised learning at aligning the LM to the reward (test sentiment: "
            "PPO, NLPO, Supervised+PPO and Supervised+NLPO each above Supervised).",
            "comparisons": c1,
            "verdict": _combine([c["outcome"] for c in c1]),
        },
        {
            "claim": "The KL penalty keeps the LM fluent while the reward rises (PPO and NLPO: test sentiment "
            f"above Zero-shot, and policy perplexity at most {FLUENCY_TOLERANCE:.0%} above Zero-shot's).",
            "comparisons": c2 + fluency,
            "verdict": _combine([c["outcome"] for c in c2 + fluency]),
            "note": "No no-KL ablation is run, so this tests 'reward up, perplexity held', not the penalty's causal role.",
        },
        {
            "claim": "NLPO is better than PPO (test sentiment: NLPO above PPO, Supervised+NLPO above "
            "Supervised+PPO); its seed spread is reported for stability.",
            "comparisons": c3,
            "stability": stab,
            "verdict": _combine([c["outcome"] for c in c3]),
        },
    ]
