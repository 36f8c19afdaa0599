"""An uploaded campaign file is split into rows at line breaks only (engine/jsonl.py ``split_lines``):
outputs written with ``ensure_ascii=False`` may hold a raw U+2028 or U+0085, which ``str.splitlines``
would treat as the end of the row and report as invalid JSON."""

from __future__ import annotations

import json

import pytest

from annotation import uploads
from annotation.errors import UploadError
from annotation.models import CampaignKind


def test_a_line_separator_inside_an_output_stays_in_its_row():
    rows = [
        {"prompt": "p1", "outputs": {"a": "one\u2028two", "b": "three\x85four"}},
        {"prompt": "p2", "outputs": {"a": "x", "b": "y"}},
    ]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows)
    parsed = uploads.parse_upload(text, CampaignKind.PAIRWISE)
    assert [r["outputs"] for r in parsed] == [rows[0]["outputs"], rows[1]["outputs"]]
    with pytest.raises(UploadError, match=r"line 3: invalid JSON"):
        uploads.parse_upload(text + '{"prompt": "p3", "outputs": {"a": "\u2028', CampaignKind.PAIRWISE)
