"""Template helpers of the run pages: number formatting and URL query state (the run table keeps
its filters, sort and page in the query string so that a URL reproduces the view)."""

from __future__ import annotations

import math
from typing import Any

from django import template
from django.http import QueryDict

register = template.Library()


@register.filter
def metric(value: Any) -> str:
    """Compact number for tables: 4 significant digits, '—' for missing/NaN."""
    if value is None or value == "":
        return "—"
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(f):
        return "—"
    if f != 0 and (abs(f) >= 1e5 or abs(f) < 1e-3):
        return f"{f:.3e}"
    return f"{f:.4g}"


@register.filter
def detail(value: Any) -> str:
    """A per-sample detail (a score, or a value a reward extracted, e.g. a maths answer): whole numbers
    exactly, others to 4 decimals (4 significant digits below 1). Why not ``|metric``'s 4 significant
    digits: an extracted answer 1250.5 shown as 1250 would contradict its verdict ("correct 0 · gold 1250")."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    f = float(value)
    if not math.isfinite(f):
        return "—"
    if f.is_integer() and abs(f) < 1e15:
        return str(int(f))
    if abs(f) < 1:
        return f"{f:.4g}"
    return f"{round(f, 4)}" if abs(f) < 1e15 else f"{f:.6g}"


@register.filter
def percent(value: Any) -> str:
    try:
        return f"{100 * float(value):.0f}%"
    except (TypeError, ValueError):
        return "0%"


@register.simple_tag(takes_context=True)
def query_with(context: dict[str, Any], **changes: Any) -> str:
    """The current query string with some parameters replaced (None/'' removes them)."""
    request = context.get("request")
    params: QueryDict = request.GET.copy() if request is not None else QueryDict(mutable=True)
    for key, value in changes.items():
        if value is None or value == "":
            params.pop(key, None)
        else:
            params[key] = str(value)
    encoded = params.urlencode()
    return f"?{encoded}" if encoded else "?"


@register.simple_tag(takes_context=True)
def sort_query(context: dict[str, Any], column: str) -> str:
    """Link target that sorts by ``column``, toggling the direction when it is already the sort key
    (new sorts start descending for metrics and dates, ascending for names)."""
    request = context.get("request")
    current = request.GET.get("sort", "-created") if request is not None else "-created"
    if current.lstrip("-") == column:
        new = column if current.startswith("-") else f"-{column}"
    else:
        new = column if column in ("name", "status", "task", "algorithm", "model") else f"-{column}"
    return query_with(context, sort=new, page=None)


@register.simple_tag(takes_context=True)
def sort_mark(context: dict[str, Any], column: str) -> str:
    request = context.get("request")
    current = request.GET.get("sort", "-created") if request is not None else "-created"
    if current.lstrip("-") != column:
        return ""
    return "▼" if current.startswith("-") else "▲"


@register.filter
def dotted(name: str) -> str:
    """Form field name → config path (``algorithm__nlpo__top_mask`` → ``algorithm.nlpo.top_mask``)."""
    return str(name).replace("__", ".")
