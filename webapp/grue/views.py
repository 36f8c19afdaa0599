"""GRUE leaderboard views: thin wrappers around ``leaderboard`` (researchers and admins only)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from engine.presets import ALGORITHMS
from webapp.access import researcher_required
from webapp.grue.leaderboard import build_board, load_runs
from webapp.grue.reference import study_board


def _board(request: HttpRequest) -> dict:
    model = request.GET.get("model", "").strip() or None
    return {**build_board(load_runs(), model=model), "reference": study_board()}


def _chart(board: dict, reference: list[dict] | None = None) -> dict:
    """Plotly traces: the normalised task score per algorithm (one trace per task with results),
    and, where the paper reports results, our primary metric beside the paper's (plus the reference
    study's seed mean with ± std error bars, when its runs are loaded)."""
    algs = [a["label"] for a in board["algorithms"]]
    score_traces = []
    for row in board["tasks"]:
        if not row["n_filled"]:
            continue
        score_traces.append(
            {"type": "bar", "name": row["title"], "x": algs, "y": [c["score"] for c in row["cells"]]}
        )
    # The paper's chart keeps the paper's columns (A2C, GRPO, ... have no paper number to stand beside).
    paper_cols = [i for i, a in enumerate(board["algorithms"]) if a["id"] in ALGORITHMS]
    paper_algs = [algs[i] for i in paper_cols]
    paper_traces = []
    for row in board["tasks"]:
        if not row["has_paper"]:
            continue
        row = {**row, "cells": [row["cells"][i] for i in paper_cols]}
        label = row["metrics"][0]["label"]
        paper_traces.append(
            {
                "type": "bar",
                "name": f"RL4LMs paper ({row['paper_model']})",
                "x": paper_algs,
                "y": [c["paper"][0] if c["paper"] else None for c in row["cells"]],
            }
        )
        paper_traces.append(
            {
                "type": "bar",
                "name": "GRUE Studio (best run)",
                "x": paper_algs,
                "y": [c["values"][0] for c in row["cells"]],
            }
        )
        for study in reference or []:
            if study["study"] != "grue-imdb" or row["task"] != "imdb" or not study["n_runs"]:
                continue
            by_alg = {c["algorithm"]: c for c in study["cells"]}
            cells = [by_alg.get(c["algorithm"]) for c in row["cells"]]
            paper_traces.append(
                {
                    "type": "bar",
                    "name": "reference runs (mean ± std over seeds)",
                    "x": paper_algs,
                    "y": [c["sentiment"]["mean"] if c else None for c in cells],
                    "error_y": {
                        "type": "data",
                        "array": [(c["sentiment"]["std"] or 0) if c else 0 for c in cells],
                        "visible": True,
                    },
                }
            )
        paper_title = f"{row['title']}: {label}"
        break
    else:
        paper_title = ""
    return {"scores": score_traces, "paper": paper_traces, "paper_title": paper_title}


@require_GET
@researcher_required
def board(request: HttpRequest) -> HttpResponse:
    data = _board(request)
    return render(request, "grue/board.html", {"board": data, "chart": _chart(data, data["reference"])})


@require_GET
@researcher_required
def board_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(_board(request))
