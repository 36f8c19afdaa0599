from __future__ import annotations

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
