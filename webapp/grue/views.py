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
    data = {**build_board(load_runs(), model=model), "reference": study_board()}
    _mark_reference_cells(data)
    return data


def _mark_reference_cells(data: dict) -> None:
    """A leaderboard cell whose best run is a reference run says so (and that its study is partial while
    the grid is unfinished): one seed of an unfinished study must not read as the study's result."""
    studies = {}
    for study in data["reference"]:
        info = {k: study[k] for k in ("study", "partial", "n_runs", "expected_runs")}
        for c in study["cells"]:
            for r in c["runs"]:
                studies[r["id"]] = info
    for row in data["tasks"]:
        for cell in row["cells"]:
            run_id = (cell.get("run") or {}).get("id")
            cell["reference"] = studies.get(run_id) if run_id is not None else None


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
            paper_traces.append(_reference_trace(study, row["cells"], paper_algs))
        paper_title = f"{row['title']}: {label}"
        break
    else:
        paper_title = ""
    return {"scores": score_traces, "paper": paper_traces, "paper_title": paper_title}


def _reference_trace(study: dict, row_cells: list[dict], x: list[str]) -> dict:
    """The reference study's seed means as bars, with a ± std error bar only where a cell has two seeds or
    more (none drawn from one seed), named partial while the grid is unfinished, each bar's hover text
    saying how many seeds it stands on."""
    by_alg = {c["algorithm"]: c for c in study["cells"]}
    cells = [by_alg.get(c["algorithm"]) for c in row_cells]
    name = "reference runs (mean ± std over seeds)"
    if study["partial"]:
        name = (
            f"reference runs, partial: {study['n_runs']} of {study['expected_runs']} runs (seed mean ± std)"
        )

    def hover(c: dict | None) -> str:
        if not c or not c["runs"]:
            return "no reference run yet"
        seeds = f"{len(c['runs'])} of {c['n_seeds']} seeds" if c["n_seeds"] else f"{len(c['runs'])} seeds"
        return f"{c['label']}: {seeds}" + (" (partial)" if c["partial"] else "")

    return {
        "type": "bar",
        "name": name,
        "x": x,
        "y": [c["sentiment"]["mean"] if c else None for c in cells],
        "hovertext": [hover(c) for c in cells],
        "error_y": {
            "type": "data",
            "array": [c["sentiment"]["std"] if c else None for c in cells],
            "visible": True,
        },
    }


@require_GET
@researcher_required
def board(request: HttpRequest) -> HttpResponse:
    data = _board(request)
    return render(request, "grue/board.html", {"board": data, "chart": _chart(data, data["reference"])})


@require_GET
@researcher_required
def board_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(_board(request))
