"""Campaigns from an uploaded JSONL file: validated completely, then imported in one transaction.

Every refusal is an ``UploadError`` naming the line and field, raised before any row is written:
the size, line count and UTF-8 of the file, JSON syntax, NaN/Infinity (not JSON, and not a score),
NUL characters (PostgreSQL text cannot hold them), over-long system ids, and the caps on systems
and items per campaign (``annotation.campaigns``) that keep a small file from creating half a
million items.
"""

from __future__ import annotations

import json
import math
import random
from itertools import combinations
from typing import Any

from django.conf import settings
from django.db import transaction

from annotation.campaigns import (
    items_cap,
    items_per_prompt,
    new_campaign,
    prompt_hash,
    shuffle_and_store,
    systems_cap,
)
from annotation.errors import AnnotationError, UploadError
from annotation.models import Campaign, CampaignKind, Item, Pairing
from engine.jsonl import split_lines

MAX_SYSTEM_ID = 200  # Item.system_a / system_b columns


def max_upload_bytes() -> int:
    return int(getattr(settings, "ANNOTATION_MAX_UPLOAD_BYTES", 20 * 1024 * 1024))


def max_upload_lines() -> int:
    return int(getattr(settings, "ANNOTATION_MAX_UPLOAD_LINES", 20_000))


class _NonFinite:
    """What ``NaN``/``Infinity`` parse to, so the field check that meets it can name its field."""

    def __init__(self, text: str):
        self.text = text


def _text_ok(value: str, line: int, field: str) -> None:
    if "\x00" in value:
        raise UploadError("contains a NUL character (\\u0000), which cannot be stored", line, field)


def _number_ok(value: Any, line: int, field: str) -> float:
    if isinstance(value, _NonFinite):
        raise UploadError(f"{value.text} is not allowed: scores must be finite numbers", line, field)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise UploadError("must be a number", line, field)
    if not math.isfinite(value):
        raise UploadError("must be a finite number (this one overflows to infinity)", line, field)
    return float(value)


def _system_ok(sys_id: Any, line: int, field: str) -> str:
    if not isinstance(sys_id, str) or not sys_id.strip():
        raise UploadError("missing system id", line, field)
    _text_ok(sys_id, line, field)
    if len(sys_id) > MAX_SYSTEM_ID:
        raise UploadError(f"system id is {len(sys_id)} characters (limit {MAX_SYSTEM_ID})", line, field)
    return sys_id


def _outputs_from_list(outputs: list[Any], lineno: int) -> dict[str, str]:
    """``[{system, text}, ...]`` as ``{system: text}``: the list form of a line's outputs."""
    conv = {}
    for j, o in enumerate(outputs):
        if not isinstance(o, dict):
            raise UploadError(
                "each output must be an object with 'system' and 'text'", lineno, f"outputs[{j}]"
            )
        sys_id = _system_ok(o.get("system"), lineno, f"outputs[{j}].system")
        text = o.get("text")
        if not isinstance(text, str):
            raise UploadError("must be a string", lineno, f"outputs[{j}].text")
        if sys_id in conv:
            raise UploadError(f"duplicate system id {sys_id!r}", lineno, f"outputs[{j}].system")
        conv[sys_id] = text
    return conv


def _metrics_ok(metrics: Any, outputs: dict[str, str], lineno: int) -> dict[str, dict[str, float]]:
    """``{system: {metric: number}}`` for systems the line has, names and numbers checked."""
    if not isinstance(metrics, dict):
        raise UploadError("must map system id -> {metric: number}", lineno, "metrics")
    clean_metrics: dict[str, dict[str, float]] = {}
    for sys_id, m in metrics.items():
        if sys_id not in outputs:
            raise UploadError(f"system {sys_id[:40]!r} has no output", lineno, f"metrics.{sys_id[:40]}")
        if not isinstance(m, dict):
            raise UploadError("must be an object of numbers", lineno, f"metrics.{sys_id}")
        clean_metrics[sys_id] = {}
        for name, v in m.items():
            field = f"metrics.{sys_id}.{name[:40]}"
            _text_ok(name, lineno, field)
            if len(name) > MAX_SYSTEM_ID:
                raise UploadError(
                    f"metric name is {len(name)} characters (limit {MAX_SYSTEM_ID})", lineno, field
                )
            clean_metrics[sys_id][name] = _number_ok(v, lineno, field)
    return clean_metrics


def _parse_line(obj: Any, lineno: int, kind: str) -> dict[str, Any]:
    """One upload line checked field by field (the error names the line and the field), as the dict
    the import stores."""
    if not isinstance(obj, dict):
        raise UploadError("expected a JSON object", lineno)
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UploadError("missing or empty (a non-empty string is required)", lineno, "prompt")
    _text_ok(prompt, lineno, "prompt")
    outputs = obj.get("outputs")
    if isinstance(outputs, list):
        outputs = _outputs_from_list(outputs, lineno)
    if not isinstance(outputs, dict):
        raise UploadError(
            "must map system id -> output text (or be a list of {system, text})", lineno, "outputs"
        )
    if len(outputs) > systems_cap():
        raise UploadError(
            f"{len(outputs)} outputs, more than the limit of {systems_cap()} systems per campaign",
            lineno,
            "outputs",
        )
    for sys_id, text in outputs.items():
        _system_ok(sys_id, lineno, f"outputs.{str(sys_id)[:40]}")
        if not isinstance(text, str):
            raise UploadError("output text must be a string", lineno, f"outputs.{sys_id}")
        _text_ok(text, lineno, f"outputs.{sys_id}")
    need = 2 if kind == CampaignKind.PAIRWISE else 1
    if len(outputs) < need:
        raise UploadError(f"needs at least {need} outputs for a {kind} campaign", lineno, "outputs")
    refs = obj.get("references", [])
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise UploadError("must be a list of strings", lineno, "references")
    for j, r in enumerate(refs):
        _text_ok(r, lineno, f"references[{j}]")
    clean_metrics = _metrics_ok(obj.get("metrics", {}), outputs, lineno)
    gold = obj.get("gold")
    if gold is not None:
        if kind != CampaignKind.PAIRWISE:
            raise UploadError("gold answers are supported for pairwise campaigns only", lineno, "gold")
        if len(outputs) != 2:
            raise UploadError("a gold item must have exactly 2 outputs", lineno, "gold")
        if gold not in outputs and gold not in ("tie", "both_bad"):
            raise UploadError("must be one of the line's system ids, 'tie' or 'both_bad'", lineno, "gold")
    item_id = obj.get("id", "")
    if not isinstance(item_id, str | int) or isinstance(item_id, bool):
        raise UploadError("must be a string or integer", lineno, "id")
    if isinstance(item_id, str):
        _text_ok(item_id, lineno, "id")
    return {
        "line": lineno,
        "id": str(item_id),
        "prompt": prompt,
        "outputs": outputs,
        "references": refs,
        "metrics": clean_metrics,
        "gold": gold,
    }


def _decode(data: bytes | str) -> str:
    if isinstance(data, str):
        return data
    if len(data) > max_upload_bytes():
        raise UploadError(f"file too large: {len(data):,} bytes (limit {max_upload_bytes():,})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UploadError(f"the file is not UTF-8 text (byte {exc.start})", line) from None


def parse_upload(
    data: bytes | str, kind: str, pairing: str = Pairing.ALL_PAIRS, baseline: str = ""
) -> list[dict[str, Any]]:
    """Validate a whole JSONL upload before anything is written; the first error names line and field.

    The caps are checked line by line as the systems and items accumulate, so the error points at
    the line that crossed the limit.
    """
    text = _decode(data)
    if not text.strip():
        raise UploadError("the file is empty: expected one JSON object per line")
    rows = []
    systems: dict[str, None] = {}
    n_items = 0
    n_lines = 0
    # Rows end at line breaks only: a U+2028 inside an output's string does not split its row.
    for lineno, line in enumerate(split_lines(text), 1):
        if not line.strip():
            continue
        n_lines += 1
        if n_lines > max_upload_lines():
            raise UploadError(f"too many lines (limit {max_upload_lines():,} items per file)", lineno)
        try:
            obj = json.loads(line, parse_constant=_NonFinite)
        except json.JSONDecodeError as exc:
            raise UploadError(f"invalid JSON ({exc.msg} at column {exc.colno})", lineno) from None
        except RecursionError:
            raise UploadError("JSON nested too deeply", lineno) from None
        row = _parse_line(obj, lineno, kind)
        rows.append(row)
        if row["gold"] is not None:
            n_items += 1
            continue
        for s in row["outputs"]:
            if s not in systems:
                systems[s] = None
                if len(systems) > systems_cap():
                    raise UploadError(
                        f"system {s[:40]!r} is system number {len(systems)}, more than the limit of "
                        f"{systems_cap()} per campaign (all pairs grow with the square of the number of systems)",
                        lineno,
                        "outputs",
                    )
        n_present = len(row["outputs"])
        if kind == CampaignKind.PAIRWISE and pairing == Pairing.VS_BASELINE:
            n_items += n_present - 1 if baseline in row["outputs"] else 0
        else:
            n_items += items_per_prompt(kind, n_present, Pairing.ALL_PAIRS)
        if n_items > items_cap():
            raise UploadError(
                f"the campaign would have more than {items_cap():,} items (pairs or outputs) at this line; "
                "upload fewer prompts or systems",
                lineno,
            )
    if not rows:
        raise UploadError("the file holds no items")
    return rows


@transaction.atomic
def create_campaign_from_upload(
    name: str,
    data: bytes | str,
    *,
    kind: str = CampaignKind.PAIRWISE,
    user: Any = None,
    pairing: str = Pairing.ALL_PAIRS,
    baseline_system: str = "",
    overlap: int = 3,
    instructions: str = "",
    axes: Any = None,
    seed: int = 0,
    assignment_mode: str = "uniform",
) -> Campaign:
    """JSONL lines ``{"prompt", "outputs": {system: text}, "references"?, "metrics"?, "gold"?, "id"?}``.

    All-or-nothing: the file is validated completely first and the campaign is created in one
    transaction, so a malformed file imports nothing.
    """
    rows = parse_upload(data, kind, pairing, baseline_system)
    systems = list(dict.fromkeys(s for r in rows if r["gold"] is None for s in r["outputs"]))
    if pairing == Pairing.VS_BASELINE and baseline_system not in systems:
        raise AnnotationError(
            f"baseline system {baseline_system!r} does not occur in the upload (systems: {systems[:20]})"
        )
    for r in rows:
        if pairing == Pairing.VS_BASELINE and r["gold"] is None and baseline_system not in r["outputs"]:
            raise UploadError(f"baseline system {baseline_system!r} has no output", r["line"], "outputs")
    camp = new_campaign(
        name, kind, user, overlap=overlap, pairing=pairing, baseline_system=baseline_system,
        instructions=instructions, axes=axes, source="upload",
        build_report={"lines": len(rows), "systems": len(systems)}, assignment_mode=assignment_mode,
    )  # fmt: skip
    camp.systems, camp.system_labels = systems, {s: s for s in systems}
    camp.save(update_fields=["systems", "system_labels"])
    rng = random.Random(seed)
    items = []
    for r in rows:
        key = r["id"] or "sha1:" + prompt_hash(r["prompt"])
        outs = r["outputs"]
        common = {"campaign": camp, "prompt": r["prompt"], "references": r["references"]}
        if r["gold"] is not None:
            sa, sb = list(outs)
            gold = "a" if r["gold"] == sa else "b" if r["gold"] == sb else r["gold"]
            items.append(
                Item(**common, key=f"gold:{key}"[:300], system_a=sa, output_a=outs[sa], system_b=sb,
                     output_b=outs[sb], gold=gold)
            )  # fmt: skip
            continue
        if kind == CampaignKind.PAIRWISE:
            present = [s for s in systems if s in outs]
            if pairing == Pairing.VS_BASELINE:
                pairs = [(baseline_system, s) for s in present if s != baseline_system]
            else:
                pairs = list(combinations(present, 2))
            for sa, sb in pairs:
                if rng.random() < 0.5:
                    sa, sb = sb, sa
                items.append(
                    Item(**common, key=key[:300],
                         system_a=sa, output_a=outs[sa], metrics_a=r["metrics"].get(sa, {}),
                         system_b=sb, output_b=outs[sb], metrics_b=r["metrics"].get(sb, {}))
                )  # fmt: skip
        else:
            for s, text in outs.items():
                items.append(
                    Item(
                        **common, key=key[:300], system_a=s, output_a=text, metrics_a=r["metrics"].get(s, {})
                    )
                )
    shuffle_and_store(items, rng)
    return camp
