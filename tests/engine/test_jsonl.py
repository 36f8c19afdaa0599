"""The one JSON-lines reader (engine/jsonl.py) and the run-directory sink that rewrites its own files.

Rows are written with ``ensure_ascii=False``, so a generated U+2028, U+2029 or U+0085 stays raw inside
a string; ``str.splitlines`` would cut such a row in two and a tolerant reader would then drop it."""

from __future__ import annotations

import json

import pytest

from engine.jsonl import iter_jsonl, iter_jsonl_file, read_jsonl, split_lines
from engine.sinks import RunDirSink

ODD = "a\u2028b\u2029c\x85d"


def _dump(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def test_split_lines_breaks_at_line_ends_only():
    text = _dump([{"t": ODD}, {"t": 2}])
    assert len(text.splitlines()) == 5  # what the readers must not do
    lines = split_lines(text)
    assert lines[-1] == ""  # the final line break
    assert [v for _n, v in iter_jsonl(lines, "mem")] == [{"t": ODD}, {"t": 2}]
    assert split_lines("{}\r\n{}\r{}") == ["{}", "{}", "{}"]  # as a file read in text mode


def test_file_readers_keep_rows_and_name_file_and_line(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text(_dump([{"t": ODD}]) + "\n" + '{"t": 3}\n' + '{"t": 4', encoding="utf-8")
    assert list(iter_jsonl_file(p, skip_invalid=True)) == [(1, {"t": ODD}), (3, {"t": 3})]
    assert read_jsonl(p, skip_invalid=True) == [{"t": ODD}, {"t": 3}]
    with pytest.raises(KeyError, match=rf"{p.name}: line 4: invalid JSON"):
        read_jsonl(p, error=KeyError)
    with pytest.raises(ValueError, match=r"^data: line 4"):
        list(iter_jsonl_file(p, source="data"))


def test_truncate_after_keeps_a_row_with_a_line_separator_and_drops_a_cut_line(tmp_path):
    sink = RunDirSink(tmp_path)
    sink.metrics(1, {"m": 1.0})
    sink.samples(1, "train", [{"prompt": "p", "generation": ODD}])
    sink.samples(2, "train", [{"prompt": "p", "generation": "later"}])
    with open(tmp_path / "samples.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"step": 3, "split": "tr')  # a crash mid-write
    sink.truncate_after(1)
    rows = read_jsonl(tmp_path / "samples.jsonl")
    assert rows == [{"step": 1, "split": "train", "prompt": "p", "generation": ODD}]
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "phase": "rl", "m": 1.0}]
