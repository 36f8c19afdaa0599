"""TensorBoard export: event files that ``tensorboard --logdir`` shows beside any other run.

What lands where: every finite metric as a scalar at the engine's step (SFT metrics, ``sft/*``, at the
SFT step, the others at the RL iteration, as in ``metrics.jsonl``); the config as text (``config``) and,
at the end, as hparams with the last value of each metric; sample rows as a markdown table per event
(``samples/<split>``); checkpoints and the final status as text.
"""

from __future__ import annotations

import json
import os
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from engine.trackers.base import Tracker, cell, flatten, sample_columns, scalars


def _md_cell(value: Any) -> str:
    text = "" if value is None else str(cell(value))
    # A table cell: no pipes or newlines; TensorBoard's markdown renderer escapes HTML itself.
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", "<br>")


def samples_markdown(rows: list[dict[str, Any]]) -> str:
    """Rows as one markdown table (columns in first-seen order)."""
    columns = sample_columns(rows)
    lines = ["| " + " | ".join(_md_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_md_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


class TensorBoardTracker(Tracker):
    """Event files under ``train.trackers.tensorboard.log_dir`` (default ``<run dir>/tensorboard``)."""

    tracker_id = "tensorboard"

    def open(self, config: dict[str, Any]) -> None:
        log_dir = self.options.get("log_dir") or os.path.join(self.run_dir, "tensorboard")
        self.log_dir = os.path.expanduser(str(log_dir))
        self.writer = SummaryWriter(log_dir=self.log_dir)
        self.last: dict[str, float] = {}
        self.writer.add_text("config", "```json\n" + json.dumps(config, indent=2) + "\n```", 0)

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        for key, value in scalars(values).items():
            self.writer.add_scalar(key, value, step)
            self.last[key] = value

    def write_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.writer.add_text(f"samples/{split}", samples_markdown(rows), step)

    def write_checkpoint(self, step: int, path: str) -> None:
        self.writer.add_text("checkpoints", path, step)

    def close(self, status: str, summary: dict[str, Any]) -> None:
        try:
            text = status if status != "failed" else f"failed: {summary.get('error', '')}"
            self.writer.add_text("status", text, 0)
            if status != "failed":
                # The hparams dashboard: the config's scalars against the last value of each metric,
                # written into the same directory (run_name ".") so it stays one run in TensorBoard.
                params = {
                    k: (v if isinstance(v, (int, float, str, bool)) else str(v))
                    for k, v in flatten(self.config).items()
                }
                metrics = {f"final/{k}": v for k, v in self.last.items()}
                self.writer.add_hparams(params, metrics, run_name=".")
        finally:
            self.writer.close()
