"""Weights & Biases export: one W&B run per GRUE run, online or offline.

What lands where: the config as the run config (nested, as in ``config.json``); every finite metric in
the history, each with the engine's step in a step column of its own: ``sft/*`` metrics against
``sft/step``, every other metric against ``step`` (``define_metric``), because the SFT phase and the
RL phase both count from 1 and W&B's own ``_step`` must only grow; sample rows as a ``wandb.Table``
per event (``samples/<split>``, a ``step`` column first); the last checkpoint path and the status in
the summary (``grue/last_checkpoint``, ``grue/status``); the end as the run's exit code (0, or 1 when
the run failed). A resumed run continues the same W&B run (``resume="allow"`` with the id kept in
``<run dir>/trackers.json``).

Options (``train.trackers.wandb``), each falling back to W&B's own variables when unset: ``project``
(``WANDB_PROJECT``, else ``grue-studio``), ``entity`` (``WANDB_ENTITY``), ``mode`` (``WANDB_MODE``;
``offline`` writes ``<dir>/wandb/offline-run-*`` for ``wandb sync``), ``dir`` (``WANDB_DIR``, else the
run directory). Console capture is off: the run's log lines stay in GRUE's own log.
"""

from __future__ import annotations

import os
from typing import Any

import wandb

from engine.trackers.base import Tracker, load_state, sample_table, save_state, scalars


class WandbTracker(Tracker):
    """A W&B run per GRUE run (see the module docstring for what goes where)."""

    tracker_id = "wandb"

    def open(self, config: dict[str, Any]) -> None:
        saved = load_state(self.run_dir, self.tracker_id)
        self.run = wandb.init(
            project=self.options.get("project") or os.environ.get("WANDB_PROJECT") or "grue-studio",
            entity=self.options.get("entity") or None,
            mode=self.options.get("mode") or None,
            dir=self.options.get("dir") or os.environ.get("WANDB_DIR") or str(self.run_dir),
            name=self.run_dir.name,
            config=config,
            id=saved.get("run_id"),
            resume="allow" if saved.get("run_id") else None,
            reinit="create_new",  # a worker process runs one run after another, never sharing one
            settings=wandb.Settings(console="off", silent=True),
        )
        save_state(self.run_dir, self.tracker_id, {"run_id": self.run.id, "project": self.run.project})
        self.run.define_metric("step")
        self.run.define_metric("sft/step")
        self.defined: set[str] = set()

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        numbers = scalars(values)
        if not numbers:
            return
        sft = all(k.startswith("sft/") for k in numbers)
        step_key = "sft/step" if sft else "step"
        for key in numbers:
            if key not in self.defined:
                self.run.define_metric(key, step_metric="sft/step" if key.startswith("sft/") else "step")
                self.defined.add(key)
        self.run.log({**numbers, step_key: step})

    def write_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        columns, data = sample_table(step, rows)
        self.run.log({f"samples/{split}": wandb.Table(columns=columns, data=data), "step": step})

    def write_checkpoint(self, step: int, path: str) -> None:
        self.run.summary["grue/last_checkpoint"] = path

    def close(self, status: str, summary: dict[str, Any]) -> None:
        self.run.summary["grue/status"] = status
        if summary.get("error"):
            self.run.summary["grue/error"] = str(summary["error"])[:5000]
        self.run.finish(exit_code=1 if status == "failed" else 0)
