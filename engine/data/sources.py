"""Where a task's rows come from: a local file, a shipped fixture, or the HuggingFace hub.

Every GRUE task reads plain dict rows from one of three sources and turns them into ``Sample``s the way
RL4LMs's data pools do. The source logic lives here once so that every task gives the same clear error
for a missing file or a bad line, and so that local files never need the network or a datasets cache.
Local files are parsed with the standard library (not ``datasets``) on purpose: it is fast, writes no
cache, and lets a malformed line be reported with its file and line number.
"""

from __future__ import annotations

import csv
import inspect
import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.data.base import SPLITS, Sample
from engine.jsonl import read_jsonl

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"
LOCAL_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")
# Split names used by RL4LMs ("val") and by some data set releases ("dev") map onto ours.
SPLIT_ALIASES = {
    "train": "train",
    "validation": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
}
_FILE_STEMS = {
    "train": ("train",),
    "validation": ("validation", "val", "dev"),
    "test": ("test",),
}


class DataError(ValueError):
    """Task data that cannot be loaded; the message names the task, the file and what to do."""


def normalize_split(split: str) -> str:
    try:
        return SPLIT_ALIASES[split]
    except KeyError:
        raise DataError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}") from None


def read_records(path: str | Path, task_id: str = "task") -> list[dict[str, Any]]:
    """Read a JSONL, JSON (list, or {"data": [...]}) , CSV or TSV file into dict rows."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(
            f"task {task_id!r}: data file not found: {p} — fix the path in task.args "
            "(path / train_path / validation_path / test_path), or remove it to use the built-in fixture"
        )
    if p.is_dir():
        raise DataError(f"task {task_id!r}: {p} is a directory; give a JSON/JSONL/CSV file")
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        return read_jsonl(p, source=f"task {task_id!r}: {p}", error=DataError)
    if suffix == ".json":
        text = p.read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            # Many "json" files are really JSON lines; accept them rather than fail on a file name.
            if exc.msg == "Extra data":
                return read_records_lines(p, task_id)
            raise DataError(f"task {task_id!r}: {p}: line {exc.lineno}: bad JSON: {exc.msg}") from None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataError(f'task {task_id!r}: {p}: expected a list of objects (or {{"data": [...]}})')
        return data
    if suffix in (".csv", ".tsv"):
        with p.open(encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ",")
            if reader.fieldnames is None:
                raise DataError(f"task {task_id!r}: {p}: empty file (a header row is required)")
            return [dict(r) for r in reader]
    raise DataError(
        f"task {task_id!r}: {p}: unsupported file type {suffix!r}; use one of {', '.join(LOCAL_SUFFIXES)}"
    )


def read_records_lines(p: Path, task_id: str) -> list[dict[str, Any]]:
    return read_jsonl(p, source=f"task {task_id!r}: {p}", error=DataError, objects_only=False)


def find_split_file(directory: Path, split: str) -> Path | None:
    for stem in _FILE_STEMS[split]:
        for suffix in LOCAL_SUFFIXES:
            cand = directory / f"{stem}{suffix}"
            if cand.exists():
                return cand
    return None


def as_list(value: Any) -> list[str]:
    """References may be a list, a JSON-encoded list (CSV cells) or a single string."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("[") and s.endswith("]"):
            try:
                parsed = json.loads(s)
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, list):
                return [str(v) for v in parsed]
        return [value]
    return [str(value)]


def seeded_shuffle(items: list[Any], seed: int | str) -> list[Any]:
    out = list(items)
    random.Random(seed).shuffle(out)
    return out


class GrueTask:
    """Base of the GRUE data pools: resolves the source of a split and builds samples from its rows.

    Sources, in order: ``<split>_path`` (a file), ``path`` (a file used for any split, or a directory
    holding ``train/validation/test`` files), ``hub`` (the data set RL4LMs loads from the HuggingFace hub;
    ``True`` for its default name), else the small fixture shipped in ``engine/data/fixtures/<id>/``.
    """

    task_id = "task"
    fixture_name = ""
    #: Other shipped samples of this task that ``fixture`` may name (e.g. the study's larger IMDB sample).
    fixture_variants: tuple[str, ...] = ()
    hub_name: str | tuple[str, ...] = ""
    default_reward: dict[str, Any] = {}
    default_metrics: list[dict[str, Any]] = []

    def __init_subclass__(cls, **kw: Any) -> None:
        """Publish the full argument list (own + source arguments) instead of ``**source``.

        Config tools (the RL4LMs import, forms) read factory signatures to know which arguments a
        task takes; a bare ``**source`` would hide them.
        """
        super().__init_subclass__(**kw)
        params: list[inspect.Parameter] = []
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            for p in list(inspect.signature(init).parameters.values())[1:]:
                if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or any(q.name == p.name for q in params):
                    continue
                params.append(p.replace(kind=p.KEYWORD_ONLY))
            if klass is GrueTask:
                break
        cls.__signature__ = inspect.Signature(params)

    def __init__(
        self,
        path: str | None = None,
        train_path: str | None = None,
        validation_path: str | None = None,
        test_path: str | None = None,
        hub: bool | str = False,
        fixture: str | None = None,
    ):
        split_paths = {"train": train_path, "validation": validation_path, "test": test_path}
        if hub and (path or any(split_paths.values())):
            raise DataError(f"task {self.task_id!r}: give either hub or local paths (path/…_path), not both")
        if fixture is not None:
            # A name from a fixed list, never a path: configs from the web choose shipped data by id.
            allowed = (self.fixture_name or self.task_id, *self.fixture_variants)
            if fixture not in allowed:
                raise DataError(
                    f"task {self.task_id!r}: task.args.fixture must be one of {', '.join(allowed)} (got {fixture!r})"
                )
            if hub or path or any(split_paths.values()):
                raise DataError(f"task {self.task_id!r}: give either fixture or hub / local paths, not both")
            self.fixture_name = fixture
        self.path = path
        self.split_paths = split_paths
        self.hub = hub

    # --- source resolution -------------------------------------------------------------------------
    def local_file(self, split: str) -> Path | None:
        """The local file of a split, or None when the split must come from the hub or is absent."""
        explicit = self.split_paths.get(split)
        if explicit:
            return Path(explicit).expanduser()
        if self.path:
            p = Path(self.path).expanduser()
            if p.is_dir():
                return find_split_file(p, split)
            if not p.exists():
                read_records(p, self.task_id)  # raises the file-not-found error with advice
            return p
        if self.hub or any(self.split_paths.values()):
            return None  # user data never silently mixes with the fixture
        return find_split_file(FIXTURES_DIR / (self.fixture_name or self.task_id), split)

    def rows(self, split: str) -> list[dict[str, Any]]:
        if self.hub:
            return [dict(r) for r in self.hub_rows(split)]
        f = self.local_file(split)
        if f is None:
            if self.path or any(self.split_paths.values()):
                where = f"the given data ({self.path or 'per-split paths'})"
            else:
                where = str(FIXTURES_DIR / (self.fixture_name or self.task_id))
            raise DataError(
                f"task {self.task_id!r}: no {split!r} data in {where} — set task.args.{split}_path "
                f"(or put a {split}.jsonl in the data directory)"
            )
        return read_records(f, self.task_id)

    def hub_rows(self, split: str) -> Iterable[dict[str, Any]]:
        """Rows of a split from the hub data set RL4LMs uses (needs internet)."""
        name = self.hub if isinstance(self.hub, str) else self.hub_name
        names = (name,) if isinstance(name, str) else tuple(name)
        return load_hub_split(self.task_id, names, split)

    # --- samples -----------------------------------------------------------------------------------
    def load(self, split: str) -> list[Sample]:
        split = normalize_split(split)
        return self.build(self.rows(split), split)

    def build(self, rows: list[dict[str, Any]], split: str) -> list[Sample]:
        raise NotImplementedError

    def field(self, row: dict[str, Any], *names: str, index: int = 0, split: str = "") -> Any:
        """The first present field among ``names``; a missing one names the row and the choices."""
        for n in names:
            cur: Any = row
            ok = True
            for part in n.split("."):
                if isinstance(cur, dict) and part in cur:
                    cur = cur[part]
                else:
                    ok = False
                    break
            if ok and cur is not None:
                return cur
        raise DataError(
            f"task {self.task_id!r}: {split} row {index}: missing field {' / '.join(repr(n) for n in names)} "
            f"(row keys: {sorted(row)})"
        )


def load_hub_split(task_id: str, names: tuple[str, ...], split: str) -> Iterable[dict[str, Any]]:
    """``datasets.load_dataset(*names)[split]`` with an offline error that says how to use local files."""
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a dependency
        raise DataError(f"task {task_id!r}: the 'datasets' package is needed for hub data") from exc
    try:
        ds = datasets.load_dataset(*names)
    except Exception as exc:
        raise DataError(
            f"task {task_id!r}: could not load hub data set {'/'.join(names)} ({type(exc).__name__}: {exc}). "
            "Offline? Use local files instead: task.args.path (a directory with train/validation/test "
            "JSONL files) or train_path/validation_path/test_path, or drop 'hub' to use the built-in fixture."
        ) from exc
    if split not in ds:
        raise DataError(f"task {task_id!r}: hub data set {'/'.join(names)} has no split {split!r}")
    return ds[split]
