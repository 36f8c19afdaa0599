"""Reference runs: a reproduction study's runs shipped with the repository and loaded as read-only runs.

``python -m engine study export DIR --out webapp/grue/reference/<study>.json.gz`` writes the compact file
(metrics, samples, test evaluation; no weights; format in ``engine.study.reference``). ``manage.py
load_reference_runs`` (also run by ``manage.py up``) loads every file in ``REFERENCE_DIR`` with
:func:`load_reference_file`: one succeeded Run per (cell, seed), tagged ``reference`` and
``study:<id>``, its final evaluation (``summary["eval"]``) being the study's test evaluation so that
the GRUE page compares it with the paper's test-set numbers.

How a run is marked without a schema change: the tags say it to people and to the run table's tag
filter, but tags are editable by any researcher, so the mark the server trusts is
``worker_host = "reference:<study>"``, a field only the server writes (a worker's claim, or this
loader). ``webapp.runs.lifecycle.is_reference`` reads it and every ``can_*`` check refuses cancel,
retry, resume and delete for such a run.

Idempotent: each run carries ``summary["reference"]`` = {study, key, digest}; loading the same file
again changes nothing, a changed run (a new export) replaces the old one, and a run no longer in the
file is removed. Loads of the same study are serialised with a transaction-level advisory lock.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from engine.presets import ALGORITHM_LABELS, ALGORITHMS
from engine.study.common import PERPLEXITY, SENTIMENT, StudyError, mean_std
from engine.study.paper import PAPER_IMDB
from engine.study.reference import local_config, read_reference
from webapp.runs.ingest import ingest_metrics, ingest_samples
from webapp.runs.models import REFERENCE_PREFIX, REFERENCE_TAG, Run, RunStatus

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
MARKER_PREFIX = REFERENCE_PREFIX
#: The studies the GRUE page announces (and whose shipped file it expects).
KNOWN_STUDIES = {"grue-imdb": "GRUE IMDB reproduction study"}


def marker(study: str) -> str:
    return f"{MARKER_PREFIX}{study}"[:200]


def reference_runs(study: str | None = None) -> Any:
    """The reference runs (of one study), as a queryset."""
    qs = Run.objects.filter(worker_host__startswith=MARKER_PREFIX)
    return qs.filter(worker_host=marker(study)) if study else qs


def _digest(run: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(run, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:32]


def _grid(doc: dict[str, Any]) -> dict[str, Any]:
    cells = [str(c) for c in doc.get("cells") or []]
    seeds = [int(x) for x in doc.get("seeds") or []]
    return {"cells": cells, "seeds": seeds, "expected_runs": len(cells) * len(seeds)}


def _points(run: dict[str, Any], last_step: int) -> list[tuple[str, int, float | None]]:
    out: list[tuple[str, int, float | None]] = []
    for key, series in (run.get("metrics") or {}).items():
        for step, value in series:
            out.append((str(key)[:200], int(step), None if value is None else float(value)))
    for key, value in (run["test"].get("metrics") or {}).items():
        if isinstance(value, (int, float)):
            out.append((f"test/{key}"[:200], last_step, float(value)))
    return out


def _last_values(points: Iterable[tuple[str, int, float | None]]) -> dict[str, float | None]:
    last: dict[str, tuple[int, float | None]] = {}
    for key, step, value in points:
        if key not in last or step >= last[key][0]:
            last[key] = (step, value)
    return {k: v for k, (_s, v) in last.items()}


def _create(doc: dict[str, Any], run: dict[str, Any], digest: str, source: str) -> Run:
    study = doc["study"]
    cfg = local_config(run["config"]) if isinstance(run.get("config"), dict) else {}
    summary_in = run.get("summary") or {}
    steps = [int(s) for series in (run.get("metrics") or {}).values() for s, _v in series]
    last_step = max(steps, default=0)
    test_metrics = {
        k: v for k, v in (run["test"].get("metrics") or {}).items() if isinstance(v, (int, float))
    }
    now = timezone.now()
    label = ALGORITHM_LABELS.get(run["cell"], run["cell"])
    obj = Run.objects.create(
        name=f"{study} · {label} · seed {run['seed']}"[:200],
        config=cfg,
        status=RunStatus.SUCCEEDED,
        tags=[REFERENCE_TAG, f"study:{study}"[:64]],
        notes=(
            f"Reference run of the {study} reproduction study ({doc.get('budget', {}).get('name', '?')} budget), "
            f"loaded from {source}. Read-only. Its final evaluation is the study's test evaluation "
            f"({run['test'].get('n_samples')} test prompts); the curves' eval/* points are on validation prompts."
        ),
        worker_host=marker(study),
        started_at=now,
        finished_at=now,
        progress=1.0,
        eta_seconds=0.0,
        phase="done",
        total_iters=int((cfg.get("train") or {}).get("n_iters") or 0),
        current_iter=last_step,
        algorithm=str((cfg.get("algorithm") or {}).get("id", ""))[:64],
        task=str((cfg.get("task") or {}).get("id", ""))[:128],
        model_name=str((cfg.get("model") or {}).get("name_or_path", ""))[:300],
        summary={
            "eval": {f"eval/{k}": v for k, v in test_metrics.items()},
            "eval_split": "test",
            "validation_eval": summary_in.get("eval") or {},
            "iterations": summary_in.get("iterations"),
            "sft_steps": summary_in.get("sft_steps"),
            "reference": {
                "study": study,
                "key": run["key"],
                "cell": run["cell"],
                "seed": run["seed"],
                "digest": digest,
                "budget": doc.get("budget", {}).get("name"),
                # the grid the file belongs to, so that the page can say "partial: n of m runs"
                "grid": _grid(doc),
            },
        },
    )
    points = _points(run, last_step)
    for start in range(0, len(points), 20000):
        ingest_metrics(obj.pk, points[start : start + 20000], returning=False)
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in run.get("samples") or []:
        groups.setdefault((int(row.get("step", 0)), str(row.get("split", "train"))), []).append(row)
    if run.get("test_samples"):
        groups[(last_step, "test")] = list(run["test_samples"])
    for (step, split), rows in groups.items():
        ingest_samples(obj.pk, step, split, rows)
    last = {k: v for k, v in _last_values(points).items()}
    Run.objects.filter(pk=obj.pk).update(last_metrics={k: v for k, v in last.items() if v is None or v == v})
    return obj


def load_reference_file(path: str | Path) -> dict[str, int]:
    """Load one reference file; returns counts ``{created, replaced, unchanged, removed}``."""
    path = Path(path)
    doc = read_reference(path)
    study = str(doc["study"])
    counts = {"created": 0, "replaced": 0, "unchanged": 0, "removed": 0}
    with transaction.atomic():
        with connection.cursor() as cur:  # one loader per study at a time (two `up`s, a test and `up`)
            cur.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", [0x6A7E, zlib.crc32(study.encode()) & 0x7FFFFFFF]
            )
        existing = {
            (r.summary or {}).get("reference", {}).get("key"): r
            for r in reference_runs(study).select_for_update()
        }
        seen = set()
        for run in doc["runs"]:
            key = run["key"]
            seen.add(key)
            # the grid is part of the digest: a file that grew re-stamps every run with the new grid
            digest = _digest({"run": run, "grid": _grid(doc)})
            old = existing.get(key)
            if old is not None and (old.summary or {}).get("reference", {}).get("digest") == digest:
                counts["unchanged"] += 1
                continue
            if old is not None:
                old.delete()
                counts["replaced"] += 1
            else:
                counts["created"] += 1
            _create(doc, run, digest, path.name)
        for key, old in existing.items():
            if key not in seen:
                old.delete()
                counts["removed"] += 1
    return counts


def shipped_files() -> list[Path]:
    return sorted(REFERENCE_DIR.glob("*.json.gz")) if REFERENCE_DIR.is_dir() else []


def load_shipped(paths: Iterable[str | Path] | None = None) -> dict[str, dict[str, int]]:
    """Load the given files, or every shipped one; ``{file name: counts}``."""
    return {Path(p).name: load_reference_file(p) for p in (paths if paths is not None else shipped_files())}


def study_board() -> list[dict[str, Any]]:
    """The GRUE page's reference section: per known (or loaded) study, per cell, the test sentiment and
    perplexity as mean ± std over seeds beside the paper's numbers, and the runs (one per seed). While the
    grid is unfinished the study is ``partial`` (n of m runs) and so is each cell short of its seeds: the page
    must not pass such a mean off as the study's result (and a std needs two seeds: ``mean_std``)."""
    runs = list(reference_runs().only("id", "name", "summary", "worker_host").order_by("id"))
    studies = dict.fromkeys(KNOWN_STUDIES)
    for r in runs:
        studies.setdefault(r.worker_host[len(MARKER_PREFIX) :], None)
    out = []
    for study in studies:
        mine = [r for r in runs if r.worker_host == marker(study)]
        cells = []
        for cell in ALGORITHMS:
            seeds = sorted(
                (r for r in mine if (r.summary or {}).get("reference", {}).get("cell") == cell),
                key=lambda r: (r.summary or {}).get("reference", {}).get("seed", 0),
            )
            values = {}
            for label, key in (("sentiment", SENTIMENT), ("perplexity", PERPLEXITY)):
                vals = [(r.summary or {}).get("eval", {}).get(f"eval/{key}") for r in seeds]
                m, s = mean_std([v for v in vals if isinstance(v, (int, float))])
                values[label] = {"mean": m, "std": s}
            paper = PAPER_IMDB.get(cell) if study == "grue-imdb" else None
            cells.append(
                {
                    "algorithm": cell,
                    "label": ALGORITHM_LABELS[cell],
                    "runs": [
                        {"id": r.pk, "seed": (r.summary or {}).get("reference", {}).get("seed")}
                        for r in seeds
                    ],
                    "sentiment": values["sentiment"],
                    "perplexity": values["perplexity"],
                    "paper": {"sentiment": paper[0], "perplexity": paper[1]} if paper else None,
                }
            )
        budget = next(((r.summary or {}).get("reference", {}).get("budget") for r in mine), None)
        grid = next(((r.summary or {}).get("reference", {}).get("grid") for r in mine), None) or {}
        expected = int(grid.get("expected_runs") or 0)
        n_seeds = len(grid.get("seeds") or [])
        for c in cells:
            # a cell short of its seeds is provisional even when the whole grid is not (an old file
            # without a grid says nothing about seeds: n_seeds 0, never partial)
            c["n_seeds"] = n_seeds
            c["partial"] = 0 < len(c["runs"]) < n_seeds
        shipped = (REFERENCE_DIR / f"{study}.json.gz").exists()
        out.append(
            {
                "study": study,
                "title": KNOWN_STUDIES.get(study, study),
                "n_runs": len(mine),
                "expected_runs": expected,
                "partial": bool(mine) and len(mine) < expected,
                "budget": budget,
                "shipped": shipped,
                "cells": cells,
            }
        )
    return out


__all__ = [
    "REFERENCE_DIR",
    "REFERENCE_TAG",
    "StudyError",
    "load_reference_file",
    "load_shipped",
    "marker",
    "reference_runs",
    "shipped_files",
    "study_board",
]
