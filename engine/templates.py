"""Prompt templates written by users: ``{name}`` placeholders, nothing else.

Why not ``str.format``: a template is user text (a launch form, a campaign's judge), and ``format``
follows attribute and index lookups (``{prompt.__class__}``) and obeys format specs, so
``{question:>1000000}`` pads every prompt to a megabyte and a width of 2e9 asks the worker for 2 GB per
prompt. Here a template may use only bare names from a fixed list; literal braces are written ``{{``
and ``}}`` (as with ``format``), and values are inserted verbatim, never formatted again.

Used by GSM8K's ``prompt_template`` and by the AI judges' prompt templates (``annotation/ai_judges.py``).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping

MAX_TEMPLATE_CHARS = 20_000


class TemplateError(ValueError):
    """A template that may not be used; the message names the first problem."""


def check_template(
    template: str,
    fields: Iterable[str],
    required: Iterable[str] = (),
    *,
    what: str = "prompt template",
    max_chars: int = MAX_TEMPLATE_CHARS,
) -> str:
    """``template`` when it uses only bare ``{field}`` placeholders from ``fields`` and contains every
    one of ``required``; otherwise :class:`TemplateError` naming the placeholder."""
    fields = tuple(fields)
    if not template or not template.strip():
        raise TemplateError(f"{what}: empty")
    if len(template) > max_chars:
        raise TemplateError(f"{what}: longer than {max_chars:,} characters")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise TemplateError(f"{what}: {exc} (write {{{{ and }}}} for literal braces)") from None
    used = set()
    for _literal, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in fields or spec or conversion:
            shown = (
                "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            )
            allowed = ", ".join("{" + f + "}" for f in fields)
            raise TemplateError(
                f"{what}: unknown placeholder {shown}; use {allowed} (write {{{{ and }}}} for literal braces)"
            )
        used.add(field)
    missing = [f for f in required if f not in used]
    if missing:
        raise TemplateError(f"{what}: must contain {' and '.join('{' + m + '}' for m in missing)}")
    return template


def render_template(template: str, values: Mapping[str, str]) -> str:
    """Substitute the fields of a checked template; the values are inserted verbatim."""
    out = []
    for literal, field, _spec, _conv in string.Formatter().parse(template):
        out.append(literal)
        if field is not None:
            out.append(values[field])
    return "".join(out)
