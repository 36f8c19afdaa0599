"""``{% load annotation_tags %}``: ``{{ text|special_tokens }}`` shows model control tokens as markers.

Generations often end in ``<|endoftext|>`` or carry ``</s>``/``<pad>``; escaped as plain text they
look like markup to an annotator, and unescaped they would be markup. The filter escapes all text
and turns each known control token into a labelled marker (the raw token in its tooltip).
"""

from __future__ import annotations

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

SPECIAL_TOKEN = re.compile(
    r"<\|[A-Za-z0-9_.:-]{1,40}\|>"  # GPT-2 / SmolLM / ChatML style: <|endoftext|>, <|im_end|>
    r"|</?s>|<(?:pad|unk|mask|eos|bos|sep|cls)>"  # T5 / BART / Llama style
    r"|<extra_id_\d{1,3}>"  # T5 sentinels
    r"|\[(?:PAD|SEP|CLS|UNK|MASK)\]"  # BERT style
)

_NAMES = {
    "endoftext": "end of text",
    "eos": "end of text",
    "/s": "end of text",
    "s": "start of text",
    "bos": "start of text",
    "pad": "padding",
    "unk": "unknown token",
    "mask": "mask",
    "sep": "separator",
    "cls": "classifier token",
}


def marker_name(token: str) -> str:
    core = token.strip("<>[]|").lower()
    return _NAMES.get(core, core.replace("_", " "))


@register.filter(is_safe=True)
def special_tokens(text: object) -> SafeString:
    """Escaped text with each control token shown as ``⟦end of text⟧`` (raw token on hover)."""
    raw = "" if text is None else str(text)
    out = []
    pos = 0
    for m in SPECIAL_TOKEN.finditer(raw):
        out.append(escape(raw[pos : m.start()]))
        out.append(
            f'<span class="special-token" title="model control token {escape(m.group(0))}">'
            f"⟦{escape(marker_name(m.group(0)))}⟧</span>"
        )
        pos = m.end()
    out.append(escape(raw[pos:]))
    return mark_safe("".join(out))  # noqa: S308 - every piece above is escaped


@register.filter
def metrics_text(metrics: object) -> str:
    """An item's per-system metrics as ``bleu 0.1235 · rouge 0.5`` (4 significant digits, keys in
    order) instead of a Python dict's repr, for the preview's researcher-only lines (issue 26.9).
    Returns plain text: the template escapes it."""
    if not isinstance(metrics, dict):
        return "" if metrics is None else str(metrics)
    parts = []
    for key in sorted(metrics):
        value = metrics[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            shown = str(value)
        else:
            shown = f"{value:.4g}"
        parts.append(f"{key} {shown}")
    return " · ".join(parts)
