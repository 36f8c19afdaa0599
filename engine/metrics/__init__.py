"""Evaluation metrics, each registered by id in ``engine.registry.metrics``.

Every metric object has ``compute(prompts, generations, references, meta)`` returning
``{key: (per_sample | None, corpus)}``. Submodules are imported here so that their ``@register``
decorators run when the registry first looks up a metric.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import time
from collections.abc import Iterable, Sequence
from typing import Any

from engine.metrics.base import Metric, MetricError, check_inputs
from engine.registry import metrics as registry

__all__ = ["Metric", "MetricError", "build_metrics", "check_inputs", "compute_all"]

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_") and _info.name not in ("base", "intent"):  # intent: via dialog.py
        importlib.import_module(f"{__name__}.{_info.name}")


def build_metrics(components: Iterable[Any]) -> list[Any]:
    """Instantiate metrics from Component objects or ``{"id", "args"}`` dicts (the config's ``eval.metrics``)."""

    built = []
    for i, comp in enumerate(components):
        if isinstance(comp, str):
            cid, args = comp, {}
        elif isinstance(comp, dict):
            cid, args = comp.get("id"), comp.get("args") or {}
        else:
            cid, args = getattr(comp, "id", None), getattr(comp, "args", None) or {}
        if not cid:
            raise MetricError(f"eval.metrics[{i}]: missing metric id")
        try:
            built.append(registry.build(cid, **args))
        except MetricError as exc:
            raise MetricError(f"eval.metrics[{i}] ({cid}): {exc}") from exc
    return built


def compute_all(
    metric_objs: Sequence[Any],
    prompts: Sequence[str],
    generations: Sequence[str],
    references: Sequence[Sequence[str]],
    meta: Sequence[dict[str, Any]] | None = None,
    timings: dict[str, float] | None = None,
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Run several metrics and flatten their results into corpus values and per-sample lists.

    Keys must be unique across metrics so that two metrics cannot silently overwrite each other.
    ``timings``, when given, receives each metric's wall seconds under its first result key: a test
    evaluation of hundreds of prompts takes many minutes on a CPU, and which metric costs them decides
    what is worth making faster.
    """
    meta = list(meta) if meta is not None else [{} for _ in generations]
    check_inputs(prompts, generations, references, meta)
    corpus: dict[str, float] = {}
    per_sample: dict[str, list[float]] = {}
    for m in metric_objs:
        started = time.perf_counter()
        result = m.compute(list(prompts), list(generations), [list(r) for r in references], list(meta))
        if timings is not None:
            label = next(iter(result), type(m).__name__)
            timings[label] = timings.get(label, 0.0) + time.perf_counter() - started
        for key, (scores, value) in result.items():
            if key in corpus:
                raise MetricError(
                    f"metric key {key!r} produced twice (by {type(m).__name__} and an earlier metric)"
                )
            corpus[key] = float(value) if value is not None else math.nan
            if scores is not None:
                if len(scores) != len(generations):
                    raise MetricError(
                        f"metric {key!r} returned {len(scores)} per-sample scores for {len(generations)} generations"
                    )
                per_sample[key] = [float(s) for s in scores]
    return corpus, per_sample
