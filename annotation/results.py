"""Results of a campaign: the ranking, win rates, agreement, Likert means, metric–human agreement.

``rank_systems`` is the one function that turns pairwise judgments into a ranking; the results
page, the human leaderboard and the run page's panel all show what it returns, so the same
campaign shows the same ratings and intervals everywhere (fixed bootstrap size and seed).
Below ``ANNOTATION_MIN_COMPARISONS`` (10) comparisons for some system, the ranking says "too little
data to rank" and gives no ranks: ratings and their (wide) intervals are still shown.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import combinations
from typing import Any

from django.conf import settings

from annotation import ai_judges, stats
from annotation.assignment import adaptive_explore
from annotation.campaigns import assignment_description, run_system
from annotation.models import Campaign, CampaignKind, CampaignStatus, Choice, Judgment

RANK_BOOTSTRAP = 1000
RANK_SEED = 0
#: The Likert scale of every axis: Fleiss's categories and Krippendorff's ordinal values.
LIKERT_SCALE = [1, 2, 3, 4, 5]


def min_comparisons_to_rank() -> int:
    return int(getattr(settings, "ANNOTATION_MIN_COMPARISONS", 10))


def judgment_rows(camp: Campaign) -> list[dict[str, Any]]:
    return list(
        Judgment.objects.filter(campaign=camp)
        .select_related("item")
        .values(
            "id", "annotator_id", "annotator__username", "item_id", "choice", "scores", "seconds", "rationale",
            "left_is_a", "created", "item__system_a", "item__system_b", "item__gold", "item__prompt",
            "item__output_a", "item__output_b", "item__metrics_a", "item__metrics_b", "item__key",
        )
        .order_by("id")
    )  # fmt: skip


def rank_systems(camp: Campaign, comps: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Bradley–Terry ranking with intervals and win rates of a pairwise campaign's comparisons.

    ``comps`` are ``(system_a, system_b, choice)`` of its non-gold judgments. Returns the raw
    ``bradley_terry`` and ``win_rates`` (for charts and JSON) and ``rows`` sorted by rating, with
    ``rank`` None when there is too little data to rank (``enough_data``, ``message``).
    """
    wr = stats.win_rate_matrix(comps, camp.systems)
    bt = stats.bradley_terry(comps, camp.systems, n_bootstrap=RANK_BOOTSTRAP, seed=RANK_SEED)
    overall = {o["system"]: o for o in wr["overall"]}
    need = min_comparisons_to_rank()
    short = [s for s in camp.systems if overall[s]["n"] < need]
    enough = bool(camp.systems) and not short
    rows = []
    for i, s in enumerate(bt["systems"]):
        o = overall[s]
        rows.append(
            {"system": s, "label": camp.label(s), "run_id": int(s[4:]) if s.startswith("run:") else None,
             "rating": bt["rating"][i], "low": bt["low"][i], "high": bt["high"][i],
             "rank": bt["rank"][i] if enough else None,
             "win_rate": o["rate"], "win_low": o["low"], "win_high": o["high"], "n": o["n"]}
        )  # fmt: skip
    rows.sort(key=lambda r: -r["rating"])
    message = ""
    if not enough:
        fewest = min(short, key=lambda s: overall[s]["n"]) if short else ""
        message = (
            f"Too little data to rank: every system needs at least {need} comparisons "
            f"(ties included); {camp.label(fewest)} has {overall[fewest]['n'] if fewest else 0}."
        )
    return {
        "rows": rows,
        "enough_data": enough,
        "min_comparisons": need,
        "message": message,
        "n": bt["n"],
        "prior_sd": bt["prior_sd"],
        "bradley_terry": bt,
        "win_rates": wr,
    }


def ranking(camp: Campaign) -> dict[str, Any]:
    """:func:`rank_systems` of a campaign's judgments (what leaderboards and run pages show)."""
    comps = [
        (r["item__system_a"], r["item__system_b"], r["choice"])
        for r in Judgment.objects.filter(campaign=camp, item__gold="").values(
            "item__system_a", "item__system_b", "choice"
        )
    ]
    return rank_systems(camp, comps)


def campaign_results(camp: Campaign, source: str = "human") -> dict[str, Any]:
    """Everything the results page shows, in plain JSON-able values.

    ``source`` (human, ai, both) chooses whose judgments the ranking and win rates count: an AI judge
    counts once per item (its verdict after the swap rule). Agreement, annotator and metric statistics
    are always the humans'; ``ai_judges`` holds each AI judge's own panel.
    """
    source = ai_judges.check_source(source)
    rows = judgment_rows(camp)
    real = [r for r in rows if not r["item__gold"]]
    out: dict[str, Any] = {
        "kind": camp.kind,
        "n_judgments": len(rows),
        "n_items": camp.items.filter(gold="").count(),
        "n_items_complete": camp.items.filter(gold="", judgment_count__gte=camp.overlap).count(),
        "systems": camp.systems,
        "labels": {s: camp.label(s) for s in camp.systems},
        "assignment": {
            "mode": camp.assignment_mode,
            "description": assignment_description(camp, adaptive_explore()),
        },
    }
    ann_names = {r["annotator_id"]: r["annotator__username"] for r in rows}
    if camp.kind == CampaignKind.PAIRWISE:
        ann_rows = _pairwise_results(camp, rows, real, source, ann_names, out)
    else:
        ann_rows = _likert_results(camp, rows, real, ann_names, out)
    out["annotators"] = stats.annotator_stats(ann_rows)
    return out


def _agreement_panel(
    labels: list[tuple[int, int, Any]], categories: list[Any], level: str, ann_names: dict[int, str]
) -> dict[str, Any]:
    """Inter-annotator agreement on one kind of label, given as ``(item, annotator, label)`` triples:
    Fleiss's κ over ``categories``, Krippendorff's α at ``level`` (nominal for pairwise choices, ordinal
    for a Likert axis, whose scale is its values) and Cohen's κ per pair of annotators with two items in
    common, named. Pairwise choices and every Likert axis share it, so both panels count alike."""
    units: dict[int, list[Any]] = defaultdict(list)
    by_ann: dict[int, dict[int, Any]] = defaultdict(dict)
    for item, annotator, label in labels:
        units[item].append(label)
        by_ann[annotator][item] = label
    multi = [v for v in units.values() if len(v) >= 2]
    values = categories if level == "ordinal" else None
    return {
        "fleiss_kappa": stats.fleiss_kappa(stats.ratings_to_table(multi, categories)) if multi else None,
        "krippendorff_alpha": stats.krippendorff_alpha(multi, level, values=values),
        "cohen": [
            {**c, "a": ann_names[c["a"]], "b": ann_names[c["b"]]}
            for c in stats.pairwise_cohen(by_ann, min_common=2)
        ],
        "n_multi": len(multi),
    }


def _pairwise_results(
    camp: Campaign,
    rows: list[dict[str, Any]],
    real: list[dict[str, Any]],
    source: str,
    ann_names: dict[int, str],
    out: dict[str, Any],
) -> list[dict[str, Any]]:
    """A pairwise campaign's ranking, position bias, agreement and metric agreement, added to
    ``out``; returns the per-annotator rows for ``annotator_stats``."""
    comps = [] if source == "ai" else [(r["item__system_a"], r["item__system_b"], r["choice"]) for r in real]
    if source != "human":
        comps += [(v["system_a"], v["system_b"], v["choice"]) for v in ai_judges.ai_verdicts(camp)]
    out["source"] = source
    out["n_comparisons"] = len(comps)
    out["ai_judges"] = ai_judges.judge_panel(camp)
    ranked = rank_systems(camp, comps)
    out["win_rates"] = ranked.pop("win_rates")
    out["bradley_terry"] = ranked.pop("bradley_terry")
    out["ranking"] = ranked
    out["choice_counts"] = dict(Counter(r["choice"] for r in real))
    # Position bias: how often the LEFT output won among decided judgments.
    decided = [r for r in real if r["choice"] in ("a", "b")]
    left_wins = sum(1 for r in decided if (r["choice"] == "a") == r["left_is_a"])
    out["left_win_rate"] = left_wins / len(decided) if decided else None
    choices = [(r["item_id"], r["annotator_id"], r["choice"]) for r in rows]
    out["agreement"] = {
        **_agreement_panel(choices, list(Choice.values), "nominal", ann_names),
        "krippendorff_level": "nominal",
    }
    ann_rows = [
        {"annotator": r["annotator__username"], "item": r["item_id"], "label": r["choice"], "seconds": r["seconds"],
         "gold": r["item__gold"] or None}
        for r in rows
    ]  # fmt: skip
    # Metric–human agreement on items whose judgments have a majority a/b decision.
    per_item: dict[int, dict[str, Any]] = {}
    for r in real:
        d = per_item.setdefault(
            r["item_id"], {"labels": [], "ma": r["item__metrics_a"], "mb": r["item__metrics_b"]}
        )
        d["labels"].append(r["choice"])
    pairs = []
    for d in per_item.values():
        maj = stats.majority_label(d["labels"])
        names = set(d["ma"] or {}) & set(d["mb"] or {})
        pairs.append({"human": maj, "metrics": {n: (d["ma"][n], d["mb"][n]) for n in names}})
    out["metric_agreement"] = stats.metric_human_agreement(pairs)
    return ann_rows


def _likert_results(
    camp: Campaign,
    rows: list[dict[str, Any]],
    real: list[dict[str, Any]],
    ann_names: dict[int, str],
    out: dict[str, Any],
) -> list[dict[str, Any]]:
    """A Likert campaign's means, per-axis agreement and metric agreement (systems compared per
    prompt by their mean score), added to ``out``; returns the per-annotator rows."""
    triples = []
    for r in real:
        for ax, v in (r["scores"] or {}).items():
            triples.append((r["item__system_a"], ax, v))
    out["likert"] = stats.likert_means(triples)
    out["axes"] = [a["name"] for a in camp.axes]
    agreement = {}
    for ax in out["axes"]:
        scores = [
            (r["item_id"], r["annotator_id"], r["scores"][ax]) for r in rows if ax in (r["scores"] or {})
        ]
        agreement[ax] = _agreement_panel(scores, LIKERT_SCALE, "ordinal", ann_names)
    out["agreement"] = {"per_axis": agreement, "krippendorff_level": "ordinal"}
    ann_rows = []
    for r in rows:
        sc = r["scores"] or {}
        ann_rows.append(
            {"annotator": r["annotator__username"], "item": r["item_id"],
             "label": tuple(sc.get(a) for a in out["axes"]), "seconds": r["seconds"], "gold": None}
        )  # fmt: skip
    # Metric–human agreement for Likert: pairs of systems on the same prompt, mean score per axis.
    item_scores: dict[int, dict[str, Any]] = {}
    for r in real:
        d = item_scores.setdefault(
            r["item_id"],
            {"key": r["item__key"], "sys": r["item__system_a"], "m": r["item__metrics_a"], "s": []},
        )
        d["s"].append(sum((r["scores"] or {}).values()) / max(1, len(r["scores"] or {})))
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in item_scores.values():
        by_key[d["key"]].append(d)
    pairs = []
    for group in by_key.values():
        for x, y in combinations(group, 2):
            mx, my = sum(x["s"]) / len(x["s"]), sum(y["s"]) / len(y["s"])
            human = "a" if mx > my else "b" if my > mx else None
            names = set(x["m"] or {}) & set(y["m"] or {})
            pairs.append({"human": human, "metrics": {n: (x["m"][n], y["m"][n]) for n in names}})
    out["metric_agreement"] = stats.metric_human_agreement(pairs)
    return ann_rows


def human_eval_for_run(run: Any) -> list[dict[str, Any]]:
    """Human-evaluation results of every started campaign that judged this run (for run pages)."""
    system = run_system(run.pk)
    out = []
    for camp in Campaign.objects.exclude(status=CampaignStatus.DRAFT).filter(systems__contains=[system]):
        n_judgments = camp.judgments.count()
        if not n_judgments:
            continue
        entry: dict[str, Any] = {
            "campaign_id": camp.pk, "campaign": camp.name, "kind": camp.kind, "status": camp.status,
            "n_judgments": n_judgments, "n_systems": len(camp.systems),
        }  # fmt: skip
        if camp.kind == CampaignKind.PAIRWISE:
            ranked = ranking(camp)
            row = next(r for r in ranked["rows"] if r["system"] == system)
            entry.update(row, enough_data=ranked["enough_data"], message=ranked["message"])
        else:
            res = campaign_results(camp)
            entry["likert"] = {ax: res["likert"].get(ax, {}).get(system) for ax in res["axes"]}
        out.append(entry)
    return out


def leaderboard() -> list[dict[str, Any]]:
    """One table per started pairwise campaign with judgments: :func:`ranking` of each."""
    boards = []
    for camp in Campaign.objects.exclude(status=CampaignStatus.DRAFT).filter(kind=CampaignKind.PAIRWISE):
        n_judgments = camp.judgments.count()
        if not n_judgments:
            continue
        boards.append({"campaign": camp, "ranking": ranking(camp), "n_judgments": n_judgments})
    return boards
