"""Reading a study directory: its ``study.json``, the finished runs and their metric series.

The report, the learning check and the reference export all read runs through these, so a run counts
as finished (``result.json``) and a metric point as valid by the same rules everywhere."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from engine.jsonl import read_jsonl as _read_jsonl_file
from engine.study.common import RESULT_FILE, STUDY_FILE, StudyError, run_key


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's JSON-lines file (metrics, samples, events) through the engine's one reader;
    a missing file is an empty run, and a line cut short by a kill is passed over (the trainer truncates
    after a resume anyway), so a study killed mid-write still reports."""
    return _read_jsonl_file(path, skip_invalid=True) if path.exists() else []


def load_study(out: str | Path) -> dict[str, Any]:
    """``study.json`` plus every finished run: ``{meta, runs: [{key, cell, seed, dir, result}]}``."""
    out = Path(out)
    path = out / STUDY_FILE
    if not path.exists():
        raise StudyError(f"{out}: no {STUDY_FILE} (not a study directory made by `python -m engine study`)")
    meta = json.loads(path.read_text())
    runs = []
    for cell in meta["cells"]:
        for seed in meta["seeds"]:
            d = out / "runs" / run_key(cell, seed)
            if (d / RESULT_FILE).exists():
                runs.append(
                    {
                        "key": run_key(cell, seed),
                        "cell": cell,
                        "seed": seed,
                        "dir": d,
                        "result": json.loads((d / RESULT_FILE).read_text()),
                    }
                )
    return {"meta": meta, "runs": runs}


def curve_points(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric key: [(step, value)]}`` of a run's RL phase (SFT lines are ``sft/*`` keys)."""
    series: dict[str, dict[int, float]] = {}
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        step = row.get("step")
        if not isinstance(step, int):
            continue
        for k, v in row.items():
            if k in ("step", "phase") or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if math.isfinite(float(v)):
                series.setdefault(k, {})[step] = float(v)  # a re-executed step: the last line wins
    return {k: sorted(v.items()) for k, v in series.items()}
