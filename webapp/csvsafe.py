"""One guard for every CSV the apps export (run metrics, annotation judgments).

Why: a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is run as a formula
when the file is opened in a spreadsheet ("=HYPERLINK(...)" in a run name, a metric key, a prompt or a
model's output). Such text cells get a leading apostrophe, which spreadsheets show as plain text;
numbers are left alone, so a negative value stays a number.
"""

from __future__ import annotations

from typing import Any

FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def cell(value: Any) -> Any:
    """``value`` made safe for a spreadsheet cell (text only; other types pass through)."""
    if isinstance(value, str) and value[:1] in FORMULA_PREFIXES:
        return "'" + value
    return value


def row(values: Any) -> list[Any]:
    """Every cell of a CSV row through ``cell``."""
    return [cell(v) for v in values]
