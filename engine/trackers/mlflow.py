"""MLflow export: one MLflow run per GRUE run, on a tracking server or a local file store.

What lands where: the flattened config as params (``algorithm.learning_rate`` ...) and as the artifact
``config.json``; every finite metric as a metric at the engine's step (``sft/*`` at the SFT step, the
others at the RL iteration); sample rows as table artifacts ``samples/<split>/step-<step>.json`` (MLflow's
table JSON, ``{"columns", "data"}``, a ``step`` column first; one file per event); the last checkpoint path as the tag
``grue.last_checkpoint``; the end as the run status (succeeded → FINISHED, stopped → KILLED,
failed → FAILED) and the tag ``grue.status``. A resumed run continues the same MLflow run (its id is
kept in ``<run dir>/trackers.json``).

Where: ``train.trackers.mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the file store
``<parent of the run dir>/mlruns`` (so the runs of one runs directory share a store: ``mlflow ui
--backend-store-uri <that dir>``). MLflow 3 only writes a file store when ``MLFLOW_ALLOW_FILE_STORE``
is set; selecting one here sets it for this process. The experiment is
``train.trackers.mlflow.experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else ``grue-studio``. A server
that does not answer is retried by MLflow itself (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, default 7 with
backoff) before the export gives up; training never waits for it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from engine.trackers.base import Tracker, flatten, load_state, sample_table, save_state, scalars

# MLflow's own limits (mlflow.utils.validation): key length, param value length, batch sizes.
MAX_KEY = 250
MAX_PARAM_VALUE = 6000
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
_BAD_KEY_CHARS = re.compile(r"[^\w./\- :]")
STATUS = {"succeeded": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}


def mlflow_key(key: str) -> str:
    """A metric or param name MLflow accepts (letters, digits, ``_ - . / : space``)."""
    return _BAD_KEY_CHARS.sub("_", key)[:MAX_KEY]


def resolve_tracking_uri(option: str | None, run_dir: Path) -> str:
    """Config option, then ``MLFLOW_TRACKING_URI``, then a file store beside the run directory;
    a plain path becomes a ``file:`` URI."""
    uri = option or os.environ.get("MLFLOW_TRACKING_URI") or str(Path(run_dir).resolve().parent / "mlruns")
    if is_file_store(uri) and not uri.startswith("file:"):
        uri = Path(os.path.expanduser(uri)).resolve().as_uri()
    return uri


def is_file_store(uri: str) -> bool:
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


class MLflowTracker(Tracker):
    """An MLflow run per GRUE run (see the module docstring for what goes where)."""

    tracker_id = "mlflow"

    def open(self, config: dict[str, Any]) -> None:
        self.uri = resolve_tracking_uri(self.options.get("tracking_uri"), self.run_dir)
        if is_file_store(self.uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.uri)
        experiment = (
            self.options.get("experiment") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "grue-studio"
        )
        saved = load_state(self.run_dir, self.tracker_id)
        if saved.get("tracking_uri") == self.uri and saved.get("run_id"):
            self.run_id = saved["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run = self.client.create_run(
                self._experiment_id(experiment),
                run_name=self.run_dir.name,
                tags={"grue.run_dir": str(self.run_dir), "grue.config_name": str(config.get("name", ""))},
            )
            self.run_id = run.info.run_id
            save_state(self.run_dir, self.tracker_id, {"tracking_uri": self.uri, "run_id": self.run_id})
        params = [Param(mlflow_key(k), str(v)[:MAX_PARAM_VALUE]) for k, v in sorted(flatten(config).items())]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + PARAMS_PER_BATCH])
        self.client.log_dict(self.run_id, config, "config.json")

    def _experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:
            found = self.client.get_experiment_by_name(name)  # another run created it meanwhile
            if found is None:
                raise
            return found.experiment_id

    def write_metrics(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(mlflow_key(k), v, now, int(step)) for k, v in scalars(values).items()]
        for i in range(0, len(batch), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i : i + METRICS_PER_BATCH])

    def write_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        # One file per event in MLflow's table JSON ({"columns", "data"}): log_table would download
        # and rewrite one growing file on every event.
        columns, data = sample_table(step, rows)
        path = f"samples/{mlflow_key(split)}/step-{int(step):06d}.json"
        self.client.log_dict(self.run_id, {"columns": columns, "data": data}, path)

    def write_checkpoint(self, step: int, path: str) -> None:
        self.client.set_tag(self.run_id, "grue.last_checkpoint", path)

    def close(self, status: str, summary: dict[str, Any]) -> None:
        self.client.set_tag(self.run_id, "grue.status", status)
        if summary.get("error"):
            self.client.set_tag(self.run_id, "grue.error", str(summary["error"])[:5000])
        self.client.set_terminated(self.run_id, STATUS[status])
