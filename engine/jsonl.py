"""The one JSON-lines reader of the engine.

Data files, preference pairs, intent-classifier fixtures and run outboxes are all JSON lines; reading
them in one place gives every caller the same rules (blank lines skipped, one object per line) and an
error that names the file and line, raised as the caller's own exception type so its users see the
message they already expect. Rows end at line breaks only (``\n``, ``\r\n``, ``\r``, as a file opened in
text mode splits them): ``str.splitlines`` would also split at U+2028, U+2029 and U+0085, which
``json.dumps(..., ensure_ascii=False)`` writes raw inside strings, cutting a row in two.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """The lines of JSON-lines text held in memory, split where reading the file would split them
    (never at a U+2028 inside a string, unlike ``str.splitlines``); a final line break leaves an empty
    last line, which the readers skip as blank."""
    return _LINE_BREAK.split(text)


def iter_jsonl(
    lines: Iterable[str | bytes],
    source: str,
    *,
    error: type[Exception] = ValueError,
    objects_only: bool = True,
    skip_invalid: bool = False,
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, value)`` for each non-blank line; a bad line raises ``error``, or is
    passed over with ``skip_invalid`` (a file this process writes itself, whose last line a crash may
    have cut short)."""
    for lineno, raw in enumerate(lines, 1):
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            if skip_invalid:
                continue
            raise error(f"{source}: line {lineno}: invalid JSON ({exc.msg})") from None
        if objects_only and not isinstance(value, dict):
            if skip_invalid:
                continue
            raise error(f"{source}: line {lineno}: expected a JSON object per line")
        yield lineno, value


def iter_jsonl_file(
    path: str | Path,
    *,
    source: str | None = None,
    error: type[Exception] = ValueError,
    objects_only: bool = True,
    skip_invalid: bool = False,
) -> Iterator[tuple[int, Any]]:
    """``iter_jsonl`` over a file read as it is streamed (a run's samples can be large); ``source``
    names it in errors (default: the path)."""
    p = Path(path)
    with p.open(encoding="utf-8") as fh:
        yield from iter_jsonl(
            fh, source or str(p), error=error, objects_only=objects_only, skip_invalid=skip_invalid
        )


def read_jsonl(
    path: str | Path,
    *,
    source: str | None = None,
    error: type[Exception] = ValueError,
    objects_only: bool = True,
    skip_invalid: bool = False,
) -> list[Any]:
    """All values of a JSON-lines file, in order (see ``iter_jsonl``)."""
    return [
        v
        for _n, v in iter_jsonl_file(
            path, source=source, error=error, objects_only=objects_only, skip_invalid=skip_invalid
        )
    ]
