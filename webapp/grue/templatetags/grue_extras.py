from __future__ import annotations

import functools
from typing import Any

from django import template

register = template.Library()

_PREFIX = {"synthetic_increasing_numbers": "synthetic"}


@register.filter
def index(seq: Any, i: int) -> Any:
    try:
        return seq[i]
    except (IndexError, KeyError, TypeError):
        return None


@register.filter
def metricfmt(value: Any) -> str:
    """Three decimals below 10 (scores in [0, 1]), two above (perplexity); '–' when missing."""
    if value is None:
        return "–"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "–"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.2f}"


@register.filter
def preset_prefix(task_id: str) -> str:
    return _PREFIX.get(task_id, task_id)


@register.filter
def cpu_preset(task_id: str, algorithm: str) -> str:
    """The preset that fills an empty board cell on a CPU without downloads (``<task>_<algo>_offline``),
    else the full one, else ''. Empty cells once named the GPU preset as plain text (issue 26.8); now
    they link to the launch form with this preset loaded."""
    names = _preset_names()
    base = f"{preset_prefix(task_id)}_{algorithm}"
    # DPO's presets train on a task's preference pairs: ``imdb_preferences_dpo``.
    pairs = f"{preset_prefix(task_id)}_preferences_{algorithm}"
    for name in (f"{base}_offline", base, f"{pairs}_offline", pairs):
        if name in names:
            return name
    return ""


@functools.lru_cache(maxsize=1)
def _preset_names() -> frozenset[str]:
    from engine import presets  # the presets are fixed for the life of the process

    return frozenset(str(p["name"]) for p in presets.list_presets())
