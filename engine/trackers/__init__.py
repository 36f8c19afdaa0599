"""Tracker exports: a run's events also go to TensorBoard, MLflow or Weights & Biases.

``train.report_to: [tensorboard, mlflow, wandb]`` selects them; ``engine.train`` adds one sink per
selected tracker beside the run directory and the caller's sink, so a worker run, a CLI run and a
``--report-to`` remote run all export the same way.

This module stays free of the trackers' packages (they are optional: ``pip install
'grue-studio[trackers]'``) and of torch, because ``engine.config`` imports the ids from here in the
web process. A tracker's own module imports its package at the top and is imported only when the
tracker is built, so a missing package is reported as the ``pip install`` to run.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.registry import Registry


@dataclass(frozen=True)
class TrackerInfo:
    """What the config validation and the install advice need to know without importing a tracker."""

    module: str
    cls: str
    package: str  # the import name checked with find_spec
    pip: str  # the distribution to install
    description: str


TRACKERS: dict[str, TrackerInfo] = {
    "tensorboard": TrackerInfo(
        "engine.trackers.tensorboard",
        "TensorBoardTracker",
        "tensorboard",
        "tensorboard",
        "TensorBoard event files: scalars, config and samples as text, hparams at the end",
    ),
    "mlflow": TrackerInfo(
        "engine.trackers.mlflow",
        "MLflowTracker",
        "mlflow",
        "mlflow-skinny",
        "MLflow run: params, metric history, sample tables as artifacts, final status",
    ),
    "wandb": TrackerInfo(
        "engine.trackers.wandb",
        "WandbTracker",
        "wandb",
        "wandb",
        "Weights & Biases run: config, history, samples as Tables, summary and exit status",
    ),
}
TRACKER_IDS: tuple[str, ...] = tuple(TRACKERS)


class TrackerUnavailable(ImportError):
    """A selected tracker whose package is not installed; the message says what to install."""


def install_hint(tracker_id: str) -> str:
    info = TRACKERS[tracker_id]
    return (
        f"train.report_to: tracker {tracker_id!r} needs the {info.pip} package, which is not installed: "
        f"pip install 'grue-studio[trackers]' (or pip install {info.pip})"
    )


def missing(report_to: list[str]) -> list[str]:
    """The selected trackers whose package cannot be found (checked without importing it)."""
    return [t for t in report_to if t in TRACKERS and importlib.util.find_spec(TRACKERS[t].package) is None]


def check_available(report_to: list[str]) -> None:
    """Raise TrackerUnavailable naming the ``pip install`` for every selected tracker that is missing."""
    gone = missing(report_to)
    if gone:
        raise TrackerUnavailable("; ".join(install_hint(t) for t in gone))


def _factory(tracker_id: str) -> Callable[..., Any]:
    info = TRACKERS[tracker_id]

    def build(**kwargs: Any) -> Any:
        # Imported here on purpose: the module imports the optional package at its top.
        module = importlib.import_module(info.module)
        return getattr(module, info.cls)(**kwargs)

    build.__doc__ = info.description
    return build


trackers: Registry[Any] = Registry("tracker")
for _id in TRACKER_IDS:
    trackers.add(_id, _factory(_id), TRACKERS[_id].description)


def build_trackers(
    report_to: list[str],
    options: dict[str, Any],
    config: dict[str, Any],
    run_dir: str | Path,
    warn: Callable[[str], None] | None = None,
) -> list[Any]:
    """One sink per selected tracker, in the order given. ``options`` is ``train.trackers`` as a dict;
    ``warn`` receives the one-line warning a failing tracker gives (the run's log)."""
    check_available(report_to)
    flush_timeout = float(options.get("flush_timeout_s", 60.0))
    out = []
    for tracker_id in report_to:
        out.append(
            trackers.build(
                tracker_id,
                options=dict(options.get(tracker_id) or {}),
                config=config,
                run_dir=Path(run_dir),
                warn=warn,
                flush_timeout_s=flush_timeout,
            )
        )
    return out
