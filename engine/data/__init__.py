"""Task data (data pools): ``Sample``, the registered GRUE tasks and ``load_task``.

Importing this package imports every submodule so that their ``@tasks.register`` decorators run;
the registry imports it lazily on the first lookup.
"""

from __future__ import annotations

import importlib
import pkgutil
import random
from typing import TYPE_CHECKING

from engine.data.base import SPLITS, Sample, Task
from engine.data.sources import DataError, normalize_split
from engine.registry import tasks

if TYPE_CHECKING:
    from engine.config import TaskConfig

__all__ = ["SPLITS", "DataError", "Sample", "Task", "build_task", "load_task"]

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_") and _mod.name not in ("base", "sources"):
        importlib.import_module(f"{__name__}.{_mod.name}")


def build_task(task_cfg: TaskConfig):
    """The task object of a config; unknown ids list the registered ones, bad args name the task."""
    return tasks.build(task_cfg.id, **task_cfg.args)


def load_task(task_cfg: TaskConfig, split: str) -> list[Sample]:
    """Samples of one split with the config's caps applied.

    A cap takes a seed-shuffled subset (seeded by ``task.seed``) so that a small run sees a
    representative slice of the data rather than its first rows, and the same slice every time.
    """
    split = normalize_split(split)
    task = build_task(task_cfg)
    samples = list(task.load(split))
    if not samples:
        raise DataError(f"task {task_cfg.id!r}: split {split!r} is empty")
    cap = task_cfg.max_train_samples if split == "train" else task_cfg.max_eval_samples
    if cap is not None and cap < len(samples):
        rng = random.Random(f"{task_cfg.seed}:{split}")
        idx = rng.sample(range(len(samples)), cap)
        samples = [samples[i] for i in idx]
    return samples
