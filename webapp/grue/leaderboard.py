"""The GRUE leaderboard as data: which runs fill which cell, and how a row is scored.

Kept free of HTTP so that the rules (how a run's config maps to a grid column, which run is the
best of a cell, how the per-task score is normalised) are unit-tested on plain dicts. Only
``load_runs`` touches the database.

* Column: from the run's config. ``train.n_iters == 0`` is Zero-shot (no SFT) or Supervised (SFT);
  otherwise the algorithm (PPO, NLPO, A2C, TRPO, the critic-free group algorithms, DPO), prefixed
  "Supervised +" when the SFT warm start is on. The paper's six columns, A2C, TRPO, GRPO and DPO are
  always shown; the others (RLOO, REINFORCE++, "Supervised +" A2C/TRPO/GRPO/...) once a run fills one.
* Row: the task id, with data-pool variants folded in (``imdb_seq2seq`` is IMDB, ``wmt16`` WMT16). A
  run on preference pairs (DPO's data, e.g. a campaign's export) joins the row whose first metric
  its final evaluation reports (IMDB for a sentiment evaluation).
* Metrics: the run's final evaluation, ``Run.summary["eval"]`` (``eval/<key>`` values written by
  the trainer), else the last ``eval/*`` metric points.
* Best run of a cell: highest (or lowest, for perplexity / TER) value of the task's first metric.
* Score: for each of the task's metrics, the cells of the row are min-max normalised (best cell 1,
  worst 0, direction-aware; a metric every cell ties on counts 1); a cell's score is the mean over
  the metrics it has. It ranks algorithms within a task; it is not comparable across tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from engine.presets import (
    ALGORITHM_LABELS,
    ALGORITHMS,
    EXTRA_ALGORITHMS,
    GROUP_ALGORITHMS,
    PREFERENCE_ALGORITHMS,
)
from engine.study.paper import PAPER_IMDB


@dataclass(frozen=True)
class MetricSpec:
    label: str
    keys: tuple[str, ...]  # alternatives, first present wins (e.g. learned vs VADER sentiment)
    higher_is_better: bool = True


@dataclass(frozen=True)
class TaskSpec:
    id: str
    title: str
    metrics: tuple[MetricSpec, ...]
    aliases: tuple[str, ...] = ()
    paper_model: str = ""
    paper: dict[str, tuple[float | None, ...]] = field(default_factory=dict)


SENTIMENT = MetricSpec(
    "Sentiment",
    ("semantic/learned_automodel_metric", "semantic/sentiment_tfidf", "semantic/sentiment_vader"),
)
PERPLEXITY = MetricSpec("Perplexity", ("fluency_metrics/perplexity",), higher_is_better=False)
METEOR = MetricSpec("METEOR", ("lexical/meteor",))
ROUGE1 = MetricSpec("ROUGE-1", ("lexical/rouge_rouge1",))
ROUGE2 = MetricSpec("ROUGE-2", ("lexical/rouge_rouge2",))
ROUGEL = MetricSpec("ROUGE-L", ("lexical/rouge_rougeL",))
BLEU = MetricSpec("BLEU", ("lexical/bleu",))
BERTSCORE = MetricSpec("BERTScore", ("semantic/bert_score",))
CIDER = MetricSpec("CIDEr", ("lexical/cider",))
PARENT = MetricSpec("PARENT", ("table_to_text/parent_overall_f_score",))
ROUGE_L_MAX = MetricSpec("ROUGE-L-max", ("lexical/rouge_l_max",))
SACREBLEU = MetricSpec("SacreBLEU", ("lexical/sacrebleu",))
CHRF = MetricSpec("chrF", ("lexical/chrf",))
TER = MetricSpec("TER", ("lexical/ter",), higher_is_better=False)
INTENT = MetricSpec("Intent acc.", ("intent/accuracy",))
REWARD = MetricSpec("Reward", ("reward_mean",))

TRANSLATION = (SACREBLEU, CHRF, TER, METEOR, BERTSCORE)

TASKS: tuple[TaskSpec, ...] = (
    TaskSpec(
        "imdb",
        "IMDB sentiment continuation",
        (SENTIMENT, PERPLEXITY),
        aliases=("imdb_seq2seq",),
        paper_model="GPT-2",
        # RL4LMs paper (Ramamurthy et al., ICLR 2023), IMDB test set, GPT-2: sentiment / perplexity,
        # kept once with the reproduction study that compares against it.
        paper=dict(PAPER_IMDB),
    ),
    TaskSpec("commongen", "CommonGen", (METEOR, CIDER, ROUGE2, BLEU, BERTSCORE)),
    TaskSpec("cnn_daily_mail", "Summarization (CNN/DM)", (ROUGE1, ROUGE2, ROUGEL, METEOR, BERTSCORE)),
    TaskSpec("totto", "Data-to-text (ToTTo)", (PARENT, BLEU, METEOR, BERTSCORE)),
    TaskSpec("narrative_qa", "Abstractive QA (NarrativeQA)", (ROUGE_L_MAX, METEOR, BLEU, BERTSCORE)),
    TaskSpec("iwslt2017en_de", "Translation (IWSLT2017 en-de)", TRANSLATION),
    TaskSpec("wmt16en_de", "Translation (WMT16 en-de)", TRANSLATION, aliases=("wmt16",)),
    TaskSpec("daily_dialog", "Dialogue (DailyDialog)", (INTENT, METEOR, PERPLEXITY, BERTSCORE)),
    TaskSpec("synthetic_increasing_numbers", "Synthetic: increasing numbers", (REWARD,)),
)
TASK_BY_ID = {t.id: t for t in TASKS}

#: Algorithms a run can be a column of (besides Zero-shot / Supervised).
TRAINED_ALGORITHMS = ("ppo", "nlpo", *EXTRA_ALGORITHMS, *GROUP_ALGORITHMS, *PREFERENCE_ALGORITHMS)
#: Columns always on the board: the paper's six, then RL4LMs's A2C and TRPO, GRPO and DPO.
FIXED_COLUMNS = (*ALGORITHMS, *EXTRA_ALGORITHMS, "grpo", *PREFERENCE_ALGORITHMS)
#: Columns shown once a run fills them, in this order.
OPTIONAL_COLUMNS = tuple(a for a in GROUP_ALGORITHMS if a not in FIXED_COLUMNS) + tuple(
    f"supervised_{a}" for a in TRAINED_ALGORITHMS if a not in ("ppo", "nlpo")
)
PAIR_TASKS = ("preference_pairs",)


def column_label(column: str) -> str:
    if column in ALGORITHM_LABELS:
        return ALGORITHM_LABELS[column]
    base = column.removeprefix("supervised_")
    return f"Supervised + {ALGORITHM_LABELS.get(base, base)}"


_ALIAS = {a: t.id for t in TASKS for a in (t.id, *t.aliases)}


def grid_task(task_id: str | None) -> str | None:
    return _ALIAS.get(task_id or "")


def grid_algorithm(config: dict[str, Any]) -> str | None:
    """The grid column a run's config belongs to (None when it fits none)."""
    cfg = config or {}
    alg = str((cfg.get("algorithm") or {}).get("id", "ppo"))
    n_iters = (cfg.get("train") or {}).get("n_iters", 10)
    sft = bool((cfg.get("supervised") or {}).get("enabled", False))
    try:
        n_iters = int(n_iters)
    except (TypeError, ValueError):
        return None
    if n_iters == 0 or alg == "sft":
        return "supervised" if (sft or alg == "sft") else "zero_shot"
    if alg not in TRAINED_ALGORITHMS:
        return None
    return f"supervised_{alg}" if sft else alg


def pairs_row(metrics: dict[str, float]) -> str | None:
    """The row of a run on preference pairs: the first task whose first metric the run's final
    evaluation reports (the synthetic task's generic reward excluded: every run has one)."""
    for spec in TASKS:
        if spec.metrics[0] is not REWARD and metric_value(metrics, spec.metrics[0]) is not None:
            return spec.id
    return None


def final_eval(summary: dict[str, Any] | None, points: dict[str, float] | None = None) -> dict[str, float]:
    """``{metric key without 'eval/': value}`` of a run's final evaluation."""
    src = (summary or {}).get("eval") or {}
    if not isinstance(src, dict) or not src:
        src = points or {}
    out: dict[str, float] = {}
    for key, value in src.items():
        if not isinstance(key, str) or not key.startswith("eval/"):
            continue
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if v == v:  # drop NaN
            out[key[len("eval/") :]] = v
    return out


def metric_value(values: dict[str, float], spec: MetricSpec) -> float | None:
    for key in spec.keys:
        if key in values:
            return values[key]
    return None


def model_label(name: str) -> str:
    """Short display name: a local path shows its last part (a GGUF file its stem)."""
    if not name or name.startswith("builtin:") or ("/" not in name and "\\" not in name):
        return name
    p = PurePath(name)
    if len(p.parts) <= 2 and not name.startswith(("/", ".", "~")):
        return name  # hub id like lvwerra/gpt2-imdb
    return p.stem if p.suffix == ".gguf" else p.name


def _rank_key(run: dict[str, Any], spec: TaskSpec) -> tuple:
    primary = spec.metrics[0]
    v = metric_value(run["metrics"], primary)
    has = v is not None
    oriented = (v if primary.higher_is_better else -v) if has else float("-inf")
    n_present = sum(metric_value(run["metrics"], m) is not None for m in spec.metrics)
    return (has, oriented, n_present, run.get("id", 0))


def build_board(runs: list[dict[str, Any]], model: str | None = None) -> dict[str, Any]:
    """The leaderboard from run records ``{id, name, task, config, metrics, model}``.

    ``metrics`` is the run's final evaluation (see :func:`final_eval`).
    """
    models = sorted({r.get("model") or "" for r in runs} - {""})
    if model:
        runs = [r for r in runs if (r.get("model") or "") == model]
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        task_id = r.get("task") or (r.get("config") or {}).get("task", {}).get("id")
        task = grid_task(task_id)
        if task is None and task_id in PAIR_TASKS:
            task = pairs_row(r.get("metrics") or {})
        alg = grid_algorithm(r.get("config") or {})
        if task is None or alg is None or not r.get("metrics"):
            continue
        cells.setdefault((task, alg), []).append(r)
    filled = {alg for _task, alg in cells}
    columns = [*FIXED_COLUMNS, *(a for a in OPTIONAL_COLUMNS if a in filled)]

    rows = []
    for spec in TASKS:
        row_cells: dict[str, dict[str, Any]] = {}
        for alg in columns:
            candidates = cells.get((spec.id, alg), [])
            paper = spec.paper.get(alg)
            cell: dict[str, Any] = {
                "algorithm": alg,
                "n_runs": len(candidates),
                "run": None,
                "values": [None] * len(spec.metrics),
                "score": None,
                "paper": list(paper) if paper else None,
            }
            if candidates:
                best = max(candidates, key=lambda r, s=spec: _rank_key(r, s))
                cell["run"] = {
                    "id": best.get("id"),
                    "name": best.get("name", ""),
                    "model": best.get("model", ""),
                    "model_label": model_label(best.get("model", "")),
                }
                cell["values"] = [metric_value(best["metrics"], m) for m in spec.metrics]
            row_cells[alg] = cell
        _score_row(spec, row_cells)
        rows.append(
            {
                "task": spec.id,
                "title": spec.title,
                "metrics": [
                    {"label": m.label, "higher_is_better": m.higher_is_better, "keys": list(m.keys)}
                    for m in spec.metrics
                ],
                "paper_model": spec.paper_model,
                "has_paper": bool(spec.paper),
                "cells": [row_cells[a] for a in columns],
                "n_filled": sum(1 for c in row_cells.values() if c["run"]),
            }
        )
    return {
        "algorithms": [{"id": a, "label": column_label(a)} for a in columns],
        "tasks": rows,
        "models": [{"name": m, "label": model_label(m)} for m in models],
        "model": model or "",
    }


def _score_row(spec: TaskSpec, cells: dict[str, dict[str, Any]]) -> None:
    filled = [c for c in cells.values() if c["run"]]
    if not filled:
        return
    per_cell: dict[str, list[float]] = {c["algorithm"]: [] for c in filled}
    for i, m in enumerate(spec.metrics):
        vals = [c["values"][i] for c in filled if c["values"][i] is not None]
        if not vals:
            continue
        lo, hi = min(vals), max(vals)
        for c in filled:
            v = c["values"][i]
            if v is None:
                continue
            if hi == lo:
                norm = 1.0
            else:
                norm = (v - lo) / (hi - lo)
                if not m.higher_is_better:
                    norm = 1.0 - norm
            per_cell[c["algorithm"]].append(norm)
    for c in filled:
        vals = per_cell[c["algorithm"]]
        c["score"] = round(sum(vals) / len(vals), 4) if vals else None


def load_runs() -> list[dict[str, Any]]:
    """Succeeded runs with their final evaluation, read in two queries."""
    from webapp.runs.models import MetricPoint, Run, RunStatus

    runs = list(
        Run.objects.filter(status=RunStatus.SUCCEEDED)
        .only("id", "name", "task", "config", "summary", "model_name", "finished_at")
        .order_by("id")
    )
    need_points = [r.pk for r in runs if not final_eval(r.summary)]
    points: dict[int, dict[str, float]] = {}
    if need_points:
        last = (
            MetricPoint.objects.filter(run_id__in=need_points, key__startswith="eval/")
            .order_by("run_id", "key", "-step")
            .distinct("run_id", "key")
            .values_list("run_id", "key", "value")
        )
        for run_id, key, value in last:
            if value is not None:
                points.setdefault(run_id, {})[key] = value
    out = []
    for r in runs:
        cfg = r.config if isinstance(r.config, dict) else {}
        out.append(
            {
                "id": r.pk,
                "name": r.name,
                "task": r.task or (cfg.get("task") or {}).get("id", ""),
                "config": cfg,
                "model": r.model_name or (cfg.get("model") or {}).get("name_or_path", ""),
                "metrics": final_eval(r.summary, points.get(r.pk)),
            }
        )
    return out
