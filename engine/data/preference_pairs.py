"""Preference pairs (``prompt``, ``chosen``, ``rejected``) from a local file: the data of DPO / IPO.

The annotation app's JSONL pairs export has exactly this shape, so a campaign's judgments train a
policy directly. Every sample keeps its pair in ``meta`` (``chosen``, ``rejected``); its reference is
the chosen response, so evaluation can score generations against what the judges preferred.

The held-out split (``validation`` / ``test``) groups pairs by ``meta.group`` when present (the
annotation export puts every pair about one input in one group) and by prompt otherwise, so no
held-out prompt was trained on.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from engine.data.base import Sample
from engine.data.sources import DataError, read_records
from engine.registry import tasks

FIELDS = ("prompt", "chosen", "rejected")


def _line_of(path: Path, index: int) -> str:
    return f"line {index + 1}" if path.suffix.lower() == ".jsonl" else f"record {index + 1}"


def read_pairs(path: str | Path, task_id: str = "preference_pairs") -> list[dict[str, Any]]:
    """Validated pair rows; a missing or non-string field is an error naming the file and line."""
    p = Path(path).expanduser()
    rows = read_records(p, task_id)
    out = []
    for i, row in enumerate(rows):
        for key in FIELDS:
            value = row.get(key)
            if not isinstance(value, str):
                got = "missing" if value is None else f"a {type(value).__name__}"
                raise DataError(
                    f"task {task_id!r}: {p}: {_line_of(p, i)}: field {key!r} must be a string ({got}); "
                    "each pair needs 'prompt', 'chosen' and 'rejected'"
                )
        if not row["chosen"].strip() or not row["rejected"].strip():
            raise DataError(
                f"task {task_id!r}: {p}: {_line_of(p, i)}: 'chosen' and 'rejected' must not be empty"
            )
        if row["chosen"] == row["rejected"]:
            raise DataError(
                f"task {task_id!r}: {p}: {_line_of(p, i)}: 'chosen' and 'rejected' are the same text"
            )
        meta = row.get("meta") if isinstance(row.get("meta"), dict) else {}
        out.append(
            {"prompt": row["prompt"], "chosen": row["chosen"], "rejected": row["rejected"], "meta": meta}
        )
    if not out:
        raise DataError(f"task {task_id!r}: {p}: no preference pairs in the file")
    return out


def _heldout(group: str, fraction: float, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{group}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


@tasks.register(
    "preference_pairs",
    "Preference pairs {prompt, chosen, rejected} from a JSONL/JSON/CSV file (DPO, IPO; the annotation export).",
)
class PreferencePairsTask:
    default_reward: dict[str, Any] = {"id": "rouge_l_max", "args": {}}
    default_metrics: list[dict[str, Any]] = [{"id": "rouge_l_max", "args": {}}]

    def __init__(self, path: str, heldout_fraction: float = 0.1, seed: int = 0):
        if not isinstance(path, str) or not path:
            raise DataError("task 'preference_pairs': task.args.path must name the pairs file")
        if not 0.0 <= float(heldout_fraction) < 1.0:
            raise DataError("task 'preference_pairs': task.args.heldout_fraction must be in [0, 1)")
        self.path = path
        self.heldout_fraction = float(heldout_fraction)
        self.seed = int(seed)

    def load(self, split: str) -> list[Sample]:
        pairs = read_pairs(self.path)
        train, held = [], []
        for i, pair in enumerate(pairs):
            group = str(pair["meta"].get("group") or pair["prompt"])
            sample = Sample(
                id=str(pair["meta"].get("judgment", i)),
                prompt=pair["prompt"],
                references=[pair["chosen"]],
                meta={"chosen": pair["chosen"], "rejected": pair["rejected"], "group": group},
            )
            (held if _heldout(group, self.heldout_fraction, self.seed) else train).append(sample)
        if split == "train":
            if not train:
                raise DataError(
                    f"task 'preference_pairs': {self.path}: every pair fell in the held-out split; "
                    "lower task.args.heldout_fraction"
                )
            return train
        # Too few inputs for a held-out part: evaluate on the training prompts rather than on nothing.
        return held or train
