"""The study's report (``python -m engine study report``): the results table (mean ± std over seeds
beside the paper's numbers), learning curves with seed bands (JSON, CSV, SVG), the verdicts, and the
section of docs/reproduction.md between the study markers.

The report reads whatever runs have finished, so a partial study is reported as such and its
verdicts are marked provisional."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path
from typing import Any

from engine.presets import ALGORITHM_LABELS
from engine.study.charts import svg_chart
from engine.study.common import (
    PERPLEXITY,
    RESULT_FILE,
    SENTIMENT,
    SENTIMENT_CONTINUATION,
    SENTIMENT_VADER,
    StudyError,
    mean_std,
)
from engine.study.paper import PAPER_IMDB
from engine.study.reading import curve_points, load_study
from engine.study.verdicts import verdicts

# The paper's IMDB columns (RL4LMs Table: sentiment, fluency, diversity), in table order.
TABLE_METRICS: tuple[tuple[str, str, bool], ...] = (
    (SENTIMENT, "Sentiment", True),
    (SENTIMENT_CONTINUATION, "Sentiment (continuation)", True),
    (SENTIMENT_VADER, "VADER (continuation)", True),
    (PERPLEXITY, "Perplexity ↓", False),
    ("fluency_metrics/generation_perplexity", "Gen. perplexity ↓", False),
    ("diversity_metrics/msttr-100", "MSTTR", True),
    ("diversity_metrics/distinct-1", "Distinct-1", True),
    ("diversity_metrics/distinct-2", "Distinct-2", True),
    ("diversity_metrics/entropy-1", "H1", True),
    ("diversity_metrics/mean_pred_length", "Mean length", True),
)
# Curves with seed bands: (metric key in metrics.jsonl, title, file stem).
CURVES: tuple[tuple[str, str, str], ...] = (
    ("train/reward_mean", "Training reward (TF-IDF classifier P(positive), mean per iteration)", "reward"),
    ("train/kl", "KL to the reference model (per token, nats)", "kl"),
    ("eval/" + PERPLEXITY, "Policy perplexity on validation references", "perplexity"),
    ("eval/" + SENTIMENT, "Validation sentiment (TF-IDF classifier, prompt + continuation)", "sentiment"),
)
DOC_START = "<!-- study:results:start -->"
DOC_END = "<!-- study:results:end -->"


def results_table(study: dict[str, Any], points: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per cell and test metric: mean, std over seeds, n and the per-seed values; ``points`` as for
    :func:`run_rows`."""
    cells: dict[str, Any] = {}
    for cell in study["meta"]["cells"]:
        runs = [r for r in study["runs"] if r["cell"] == cell]
        metrics: dict[str, Any] = {}
        keys = sorted({k for r in runs for k in r["result"]["test"]["metrics"]})
        for k in keys:
            per_seed = {
                str(r["seed"]): r["result"]["test"]["metrics"].get(k)
                for r in runs
                if isinstance(r["result"]["test"]["metrics"].get(k), (int, float))
            }
            m, s = mean_std(list(per_seed.values()))
            metrics[k] = {"mean": m, "std": s, "n": len(per_seed), "seeds": per_seed}
        cells[cell] = {
            "label": ALGORITHM_LABELS[cell],
            "n_runs": len(runs),
            "seeds": [r["seed"] for r in runs],
            "metrics": metrics,
            "paper": dict(zip(("sentiment", "perplexity"), PAPER_IMDB[cell])) if cell in PAPER_IMDB else None,
        }
    expected = len(study["meta"]["cells"]) * len(study["meta"].get("seeds") or []) or len(study["runs"])
    return {
        "study": study["meta"]["study"],
        "budget": study["meta"]["budget"],
        "cells": cells,
        "n_runs": len(study["runs"]),
        "expected_runs": expected,
        "complete": len(study["runs"]) >= expected,
        "runs": run_rows(study, points),
    }


def run_points(study: dict[str, Any]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Every finished run's metric series by run key, read once for the curves and the runs table."""
    return {r["key"]: curve_points(Path(r["dir"])) for r in study["runs"] if r.get("dir") is not None}


def run_rows(study: dict[str, Any], points: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Where, when and how fast each finished run was made. Why: the grid is run in pieces on whatever
    machine a sitting gets, so a reader needs each run's CPU and precision beside its timings (which
    compare only within one machine) instead of a narrative of sittings. ``points``: the runs' series
    (:func:`run_points`), read here when not given."""
    points = run_points(study) if points is None else points
    rows = []
    for r in study["runs"]:
        res = r["result"]
        machine = res.get("machine") or {}
        iter_s = [v for _s, v in points.get(r["key"], {}).get("time/iteration_s", [])]
        rows.append(
            {
                "key": r["key"],
                "cell": r["cell"],
                "seed": r["seed"],
                "cpu": machine.get("cpu"),
                "gpu": machine.get("gpu"),
                "native_bf16": machine.get("native_bf16"),
                "precision": machine.get("mixed_precision"),
                "engine_commit": machine.get("engine_commit"),
                "train_s": res.get("train_s"),
                "test_eval_s": res.get("test_eval_s"),
                "iterations": len(iter_s),
                "mean_iteration_s": sum(iter_s) / len(iter_s) if iter_s else None,
                "finished_at": res.get("finished_at"),
            }
        )
    return rows


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    minutes = round(seconds / 60)
    if minutes < 1:
        return f"{seconds:.0f} s"
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


_PRECISION = {"no": "fp32", None: "—"}


def runs_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The report's provenance table: one line per finished run (see :func:`run_rows`)."""
    lines = [
        "### Runs",
        "",
        "Where each finished run was made. Timings compare only within one machine.",
        "",
        "| run | machine | precision | training | RL iteration (mean × count) | test evaluation | finished (UTC) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        where = r["gpu"] or r["cpu"] or "—"
        if r["native_bf16"] is not None and not r["gpu"]:
            where += ", native bf16" if r["native_bf16"] else ", no native bf16"
        per_iter = f"{r['mean_iteration_s']:.0f} s × {r['iterations']}" if r["mean_iteration_s"] else "—"
        finished = (r["finished_at"] or "—").replace("T", " ").removesuffix("Z")[:16]
        lines.append(
            f"| {ALGORITHM_LABELS.get(r['cell'], r['cell'])}, seed {r['seed']} | {where} | "
            f"{_PRECISION.get(r['precision'], r['precision'])} | {_duration(r['train_s'])} | {per_iter} | "
            f"{_duration(r['test_eval_s'])} | {finished} |"
        )
    return lines


def curves(study: dict[str, Any], points: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per curve metric and cell: steps, mean, std and n over seeds, and the per-seed series;
    ``points`` as for :func:`run_rows`."""
    out: dict[str, Any] = {}
    per_run = run_points(study) if points is None else points
    for key, title, _stem in CURVES:
        by_cell: dict[str, Any] = {}
        for cell in study["meta"]["cells"]:
            runs = [r for r in study["runs"] if r["cell"] == cell]
            seeds = {str(r["seed"]): dict(per_run[r["key"]].get(key, [])) for r in runs}
            steps = sorted({s for series in seeds.values() for s in series})
            if not steps:
                continue
            mean, std, n = [], [], []
            for s in steps:
                m, sd = mean_std([series[s] for series in seeds.values() if s in series])
                mean.append(m)
                std.append(sd)
                n.append(sum(s in series for series in seeds.values()))
            by_cell[cell] = {
                "steps": steps,
                "mean": mean,
                "std": std,
                "n": n,
                "seeds": {k: [v.get(s) for s in steps] for k, v in seeds.items()},
            }
        out[key] = {"title": title, "cells": by_cell}
    return out


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None or not math.isfinite(v):
        return "—"
    return f"{v:.{digits}f}" if abs(v) < 1000 else f"{v:.4g}"


def _cell_value(entry: dict[str, Any] | None, digits: int) -> str:
    if not entry or entry["mean"] is None:
        return "—"
    if entry["std"] is None:
        return f"{_fmt(entry['mean'], digits)} (n={entry['n']})"
    std = f"{entry['std']:.3g}" if abs(entry["mean"]) >= 1000 else _fmt(entry["std"], digits)
    return f"{_fmt(entry['mean'], digits)} ± {std}"


def verdict_lines(claims: list[dict[str, Any]]) -> list[str]:
    """Each claim's verdict, the comparisons that decided it, its seed spreads, note and likely reason, as
    Markdown lines. Apart from the report's table so each piece stays short enough to read at once."""
    lines: list[str] = []
    for i, c in enumerate(claims, 1):
        lines.append(f"**Claim {i}: {c['claim']}** — **{c['verdict']}**.")
        for comp in c["comparisons"]:
            if "rise" in comp:
                lines.append(
                    f"- {ALGORITHM_LABELS[comp['cell']]} perplexity {_fmt(comp['ppl'], 2)} vs Zero-shot "
                    f"{_fmt(comp['ppl_zero_shot'], 2)} ({comp['rise']:+.1%}): {comp['outcome']}"
                )
            elif "diff" in comp:
                noise = f", 2 SE {_fmt(comp['two_se'])}" if "two_se" in comp else ""
                lines.append(
                    f"- {ALGORITHM_LABELS[comp['a']]} − {ALGORITHM_LABELS[comp['b']]} sentiment "
                    f"{comp['diff']:+.3f}{noise}: {comp['outcome']}"
                )
            else:
                names = [
                    ALGORITHM_LABELS.get(x, str(x))
                    for x in (comp.get("cell"), comp.get("a"), comp.get("b"))
                    if x
                ]
                who = " vs ".join(names)
                lines.append(f"- {who}: {comp['outcome']}")
        for s in c.get("stability", []):
            lines.append(
                f"- seed std of sentiment: {ALGORITHM_LABELS[s['a']]} {_fmt(s['std_a'])}, "
                f"{ALGORITHM_LABELS[s['b']]} {_fmt(s['std_b'])}"
            )
        if c.get("note"):
            lines.append(f"- {c['note']}")
        if c.get("why"):
            lines.append(f"- {c['why']}")
        lines.append("")
    return lines


def markdown_report(table: dict[str, Any], claims: list[dict[str, Any]], figures: dict[str, str]) -> str:
    """The results section of docs/reproduction.md: table, paper numbers, figures, verdicts."""
    b = table["budget"]
    lines = []
    if not table.get("complete", True):
        lines += [
            f"**Partial: {table.get('n_runs')} of {table.get('expected_runs')} runs finished** — the table and "
            "the verdicts below are provisional until every cell has all its seeds.",
            "",
        ]
    lines += [
        f"Study `{table['study']}`, budget `{b['name']}`: {b['description']}. Test split, "
        f"{'all' if b['test_prompts'] is None else b['test_prompts']} prompts per run; mean ± std over seeds "
        "(sample std; `n=1`: one seed, no spread).",
        "",
        "| cell | seeds | "
        + " | ".join(label for _k, label, _h in TABLE_METRICS)
        + " | paper sentiment / perplexity |",
        "|---|---|" + "---|" * len(TABLE_METRICS) + "---|",
    ]
    for c in table["cells"].values():
        vals = [
            _cell_value(c["metrics"].get(k), 2 if "perplexity" in k or "length" in k else 3)
            for k, _l, _h in TABLE_METRICS
        ]
        paper = f"{c['paper']['sentiment']:.3f} / {c['paper']['perplexity']:.2f}" if c["paper"] else "—"
        lines.append(f"| {c['label']} | {len(c['seeds'])} | " + " | ".join(vals) + f" | {paper} |")
    lines += [
        "",
        "The paper's numbers are GPT-2 on the full IMDB test set with a DistilBERT sentiment classifier; ours "
        f"are {b.get('model') or 'SmolLM2-135M-Instruct'} with the shipped TF-IDF + logistic-regression "
        "classifier trained on the IMDB train split (0.905 test accuracy; VADER as a second column), so compare "
        "orderings, not values. "
        "Perplexity is the same metric "
        "(the policy's perplexity on the reference reviews, RL4LMs's definition).",
        "",
    ]
    for _key, title, stem in CURVES:
        if stem in figures:
            lines.append(f"![{title}]({figures[stem]})")
    lines += ["", "### Verdicts", ""]
    lines += verdict_lines(claims)
    lines.append(
        "Rule: a comparison counts when the difference of the seed means exceeds two standard errors of the "
        "difference (Welch); a claim is *supported* when all its comparisons count in its direction, *not "
        "supported at this scale* when one counts against it, *inconclusive* otherwise (within noise, or "
        "fewer than two seeds). Two standard errors over three seeds is a coarse rule, not a significance test."
    )
    if table.get("runs"):
        lines += ["", *runs_markdown(table["runs"])]
    return "\n".join(lines) + "\n"


def write_report(out: str | Path, docs: str | Path | None = None) -> dict[str, Any]:
    """Write ``DIR/report/``: results.json/.md, curves.json/.csv, one SVG per curve, verdicts.
    With ``docs`` (docs/reproduction.md) the section between its study markers is replaced."""
    study = load_study(out)
    if not study["runs"]:
        raise StudyError(f"{out}: no finished run yet (each run writes {RESULT_FILE} when evaluated)")
    rep = Path(out) / "report"
    rep.mkdir(parents=True, exist_ok=True)
    points = run_points(study)
    table = results_table(study, points)
    curve_data = curves(study, points)
    claims = verdicts(table)
    (rep / "results.json").write_text(json.dumps({**table, "verdicts": claims}, indent=2))
    (rep / "curves.json").write_text(json.dumps(curve_data, indent=2))
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["metric", "cell", "step", "mean", "std", "n"])
    for key, c in curve_data.items():
        for cell, d in c["cells"].items():
            for s, m, sd, n in zip(d["steps"], d["mean"], d["std"], d["n"]):
                w.writerow([key, cell, s, m, "" if sd is None else sd, n])
    (rep / "curves.csv").write_text(buf.getvalue())
    figures = {}
    for key, title, stem in CURVES:
        (rep / f"{stem}.svg").write_text(svg_chart(title, curve_data.get(key, {})))
        figures[stem] = f"{stem}.svg"
    md = markdown_report(table, claims, figures)
    (rep / "results.md").write_text(md)
    if docs is not None:
        docs = Path(docs)
        fig_dir = docs.parent / "reproduction"
        fig_dir.mkdir(parents=True, exist_ok=True)
        for stem in figures:
            shutil.copyfile(rep / f"{stem}.svg", fig_dir / f"{stem}.svg")
        section = markdown_report(table, claims, {s: f"reproduction/{s}.svg" for s in figures})
        text = docs.read_text()
        if DOC_START not in text or DOC_END not in text:
            raise StudyError(f"{docs}: no {DOC_START} ... {DOC_END} markers to fill")
        head, rest = text.split(DOC_START, 1)
        _old, tail = rest.split(DOC_END, 1)
        docs.write_text(f"{head}{DOC_START}\n{section}{DOC_END}{tail}")
    return {"table": table, "verdicts": claims, "dir": str(rep)}
