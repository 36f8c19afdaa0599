"""The SQL that stores a run's live data: metric points (with their min/max rollup), log lines,
samples and checkpoints, one batch at a time.

Why one module: the recorder's flush, the CLI-run import and the benchmarks all write through these
functions, so the idempotency rules (metric points unique per run/key/step, keyed log lines unique per
run/key, a step's samples replaced when the step is re-executed) and the rollup that makes cold charts
cheap hold for every writer.

Metric points are stored in chunks (``MetricChunk``: one row per run, key and batch, the points as
arrays; issue #15): one row per point capped ingestion at PostgreSQL's per-row cost. A batch is one
binary COPY of its chunk rows, encoded here with numpy. Idempotency is checked per key against the
largest step stored (the common case, steps increasing past it, needs no other read); the writers of
one run are serialized by an advisory lock so that check-then-insert is safe and point ids grow in
commit order.

Rollup: for every new point, each level ``l`` of ``metric_rollup`` keeps count, min and max (with their
steps) of the bucket ``step // (ROLLUP_BASE * ROLLUP_FACTOR**l)``. It is written in the same
transaction as the points and only from the points really inserted, so replays do not count twice;
the aggregates are computed here from the batch in hand (``_rollup_levels``), buckets no stored point
can be in are COPYed, the others merged with an upsert.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import psycopg
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from webapp.runs.models import (
    CHUNK_POINTS,
    CHUNK_SHIFT,
    Checkpoint,
    MetricChunk,
    MetricRollup,
    Run,
    RunLog,
    Sample,
)
from webapp.runs.protocol import STATUS_FIELDS, clean_float, columns_by_key

NUL_MARK = "\u2400"  # "␀": what a NUL character in run text is stored as


def pg_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: a NUL character (which no text or jsonb value may hold;
    inserting one fails the whole flush with a ``DataError``) becomes a visible "␀". Every string of
    a run's data passes here, in the worker's recorder and the API's alike, so both store the same."""
    return text.replace("\x00", NUL_MARK) if "\x00" in text else text


def pg_safe(obj: Any) -> Any:
    """``pg_text`` through dicts (keys too) and lists; other values unchanged."""
    if isinstance(obj, str):
        return pg_text(obj)
    if isinstance(obj, dict):
        return {pg_safe(k) if isinstance(k, str) else k: pg_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [pg_safe(v) for v in obj]
    return obj


ROLLUP_BASE = 16
ROLLUP_FACTOR = 4
ROLLUP_LEVELS = 8  # widths 16, 64, …, 262,144 steps
_BASE_SHIFT = ROLLUP_BASE.bit_length() - 1
_FACTOR_SHIFT = ROLLUP_FACTOR.bit_length() - 1


def rollup_width(level: int) -> int:
    return ROLLUP_BASE * ROLLUP_FACTOR**level


def _rollup_sql(source: str) -> str:
    """CTEs that aggregate ``source`` (key, step, value) level by level (each level from the one
    below it, so the work shrinks by ROLLUP_FACTOR per level) and upsert them into the rollup table;
    expects the run id as the next ``%s`` parameter. The ingest computes the same aggregates in
    Python (``_rollup_levels``); this SQL is the reference it is tested against, and a way to rebuild
    a run's rollup from its points."""
    ok = "value IS NOT NULL AND value <> 'NaN'::float8"
    parts = [
        f"""r0 AS (
          SELECT key, step >> {_BASE_SHIFT} AS bucket, count(*)::int AS n,
                 min(ARRAY[value, step::float8]) FILTER (WHERE {ok}) AS mn,
                 max(ARRAY[value, step::float8]) FILTER (WHERE {ok}) AS mx
          FROM {source} GROUP BY 1, 2)"""
    ]
    for lvl in range(1, ROLLUP_LEVELS):
        parts.append(
            f"""r{lvl} AS (
          SELECT key, bucket >> {_FACTOR_SHIFT} AS bucket, sum(n)::int AS n, min(mn) AS mn, max(mx) AS mx
          FROM r{lvl - 1} GROUP BY 1, 2)"""
        )
    union = " UNION ALL ".join(
        f"SELECT {lvl} AS level, key, bucket, n, mn, mx FROM r{lvl}" for lvl in range(ROLLUP_LEVELS)
    )
    parts.append(
        f"""rollup AS (
          INSERT INTO {_ROLLUP} AS t (run_id, key, level, bucket, n, min_value, min_step, max_value, max_step)
          SELECT %s, key, level, bucket, n, mn[1], mn[2]::bigint, mx[1], mx[2]::bigint
          FROM ({union}) AS agg
          {_ROLLUP_MERGE})"""
    )
    return ",\n".join(parts)


_ROLLUP = MetricRollup._meta.db_table
_NEWER_MIN = (
    "t.min_value IS NULL OR (EXCLUDED.min_value IS NOT NULL AND "
    "(EXCLUDED.min_value, EXCLUDED.min_step) < (t.min_value, t.min_step))"
)
_NEWER_MAX = (
    "t.max_value IS NULL OR (EXCLUDED.max_value IS NOT NULL AND "
    "(EXCLUDED.max_value, EXCLUDED.max_step) > (t.max_value, t.max_step))"
)
_ROLLUP_MERGE = f"""ON CONFLICT (run_id, key, level, bucket) DO UPDATE SET
            n = t.n + EXCLUDED.n,
            min_value = CASE WHEN {_NEWER_MIN} THEN EXCLUDED.min_value ELSE t.min_value END,
            min_step = CASE WHEN {_NEWER_MIN} THEN EXCLUDED.min_step ELSE t.min_step END,
            max_value = CASE WHEN {_NEWER_MAX} THEN EXCLUDED.max_value ELSE t.max_value END,
            max_step = CASE WHEN {_NEWER_MAX} THEN EXCLUDED.max_step ELSE t.max_step END"""
_ROLLUP_UPSERT_SQL = (
    f"INSERT INTO {_ROLLUP} AS t (run_id, key, level, bucket, n, min_value, min_step, max_value, max_step) "
    "SELECT %s, * FROM unnest(%s::text[], %s::int2[], %s::int8[], %s::int4[], %s::float8[], %s::int8[], "
    "%s::float8[], %s::int8[]) " + _ROLLUP_MERGE
)
_ROLLUP_COLUMNS = ["key", "level", "bucket", "n", "min_value", "min_step", "max_value", "max_step"]


def _reduce_buckets(
    kidx: np.ndarray,
    bucket: np.ndarray,
    n: np.ndarray,
    mnv: np.ndarray,
    mns: np.ndarray,
    mxv: np.ndarray,
    mxs: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """Merge rows with the same (key index, bucket): counts add up, the min is the smallest
    (value, step), the max the largest (value, step); NaN (no value) loses to any value. One sort by
    (key, bucket, value, step) puts each group's min first (NaN sorts last), one by
    (key, bucket, -value, -step) its max."""
    lo = np.lexsort((mns, mnv, bucket, kidx))
    hi = np.lexsort((-mxs, -mxv, bucket, kidx))
    k_sorted, b_sorted = kidx[lo], bucket[lo]
    change = np.r_[True, (b_sorted[1:] != b_sorted[:-1]) | (k_sorted[1:] != k_sorted[:-1])]
    starts = np.flatnonzero(change)
    mn, mx = lo[starts], hi[starts]
    return (
        k_sorted[starts],
        b_sorted[starts],
        np.add.reduceat(n[lo], starts),
        mnv[mn],
        mns[mn],
        mxv[mx],
        mxs[mx],
    )


def _rollup_levels(
    keyed: Sequence[tuple[str, np.ndarray, np.ndarray]], tails: Sequence[int | None]
) -> tuple[list[tuple[Any, ...]], list[list[Any]]]:
    """Every rollup level of the new points in hand (``(key, steps, values)``, values float64 with
    null as NaN), computed here: reading the points back in SQL cost the server more than storing
    them. Level 0 from the points, each level above from the one below. Ties as ``_rollup_sql``: the
    smallest step for the min, the largest for the max; null and NaN are counted, never a min or max.

    Returns (rows of buckets no stored point can be in, for a plain COPY; columns of the other
    buckets, for the merging upsert). ``tails[i]``: the largest step stored for ``keyed[i]`` before
    this batch, when every new point of the key lies above it (None: no point stored), else
    ``ROLLUP_ALL_MERGED``. A bucket above the tail's bucket has no rollup row yet."""
    keyed = [x for x in keyed if len(x[1])]
    if not keyed:
        return [], [[] for _ in _ROLLUP_COLUMNS]
    steps = np.concatenate([st for _k, st, _v in keyed])
    values = np.concatenate([v for _k, _st, v in keyed])
    kidx = np.repeat(np.arange(len(keyed)), [len(st) for _k, st, _v in keyed])
    tail = np.array(
        [np.iinfo(np.int64).min if t is None else t for t, _x in zip(tails, keyed, strict=False)],
        dtype=np.int64,
    )
    names = [k for k, _st, _v in keyed]
    levels = []
    cur = _reduce_buckets(
        kidx, steps >> _BASE_SHIFT, np.ones(len(steps), dtype=np.int64), values, steps, values, steps
    )
    levels.append(cur)
    for _lvl in range(1, ROLLUP_LEVELS):
        k, b, n, mnv, mns, mxv, mxs = cur
        cur = _reduce_buckets(k, b >> _FACTOR_SHIFT, n, mnv, mns, mxv, mxs)
        levels.append(cur)
    new_rows: list[tuple[Any, ...]] = []
    merge: list[list[Any]] = [[] for _ in _ROLLUP_COLUMNS]
    for lvl, (k, b, n, mnv, mns, mxv, mxs) in enumerate(levels):
        shift = _BASE_SHIFT + _FACTOR_SHIFT * lvl
        fresh = b > (tail[k] >> shift)
        cols = (
            k.tolist(),
            b.tolist(),
            n.tolist(),
            mnv.tolist(),
            mns.tolist(),
            mxv.tolist(),
            mxs.tolist(),
            fresh.tolist(),
        )
        for ki, bi, ni, a, a_s, z, z_s, is_new in zip(*cols, strict=True):
            row = (
                names[ki],
                lvl,
                bi,
                ni,
                None if a != a else a,
                None if a != a else a_s,
                None if z != z else z,
                None if z != z else z_s,
            )
            if is_new:
                new_rows.append(row)
            else:
                for col, x in zip(merge, row, strict=True):
                    col.append(x)
    return new_rows, merge


ROLLUP_ALL_MERGED = np.iinfo(np.int64).max


def _store_rollup(cur: Any, run_id: int, new_rows: list[tuple[Any, ...]], merge: list[list[Any]]) -> None:
    """Buckets no stored point can be in: one binary COPY; the others: one merging upsert."""
    if new_rows:
        with cur.cursor.copy(
            f"COPY {_ROLLUP} (run_id, {', '.join(_ROLLUP_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(["int8", "text", "int2", "int8", "int4", "float8", "int8", "float8", "int8"])
            for row in new_rows:
                copy.write_row((run_id, *row))
    if merge[0]:
        cur.execute(_ROLLUP_UPSERT_SQL, [run_id, *merge])


@dataclass
class IngestResult:
    inserted: list[tuple[int, str, int, float | None]]  # (id, key, step, value) of new points, given order
    received: int

    @property
    def duplicates(self) -> int:
        return self.received - len(self.inserted)


def _as_value(v: Any) -> float | None:
    return None if v is None else float(v)


# --------------------------------------------------------------------------- chunk rows, binary COPY

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\0" + b"\0" * 8  # header, no flags, no extension
_COPY_TRAILER = b"\xff\xff"
_CHUNK_COLUMNS = 8
_ROW_START = struct.Struct("!hiqiq")  # field count; id; run_id
_STEP_RANGE = struct.Struct("!iqiq")  # first_step; last_step
_TEXT_LEN = struct.Struct("!i")
_ARRAY_HEAD = struct.Struct("!iiiIii")  # byte length; ndim 1, has-null flag, element type, length, lbound 1
_INT8_OID, _FLOAT8_OID, _TIMESTAMPTZ_OID = 20, 701, 1184
_NULL = b"\xff\xff\xff\xff"
_LEN_FLOAT8 = struct.Struct("!id")
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def _array8(values: np.ndarray, oid: int) -> bytes:
    """A one-dimensional array field without nulls, 8-byte elements: the elements are interleaved
    with their lengths by numpy (psycopg's array dumper packs element by element in Python and was
    most of a flush's client time)."""
    n = len(values)
    rec = np.empty(n, dtype=[("len", ">i4"), ("v", ">f8" if oid == _FLOAT8_OID else ">i8")])
    rec["len"] = 8
    rec["v"] = values
    return _ARRAY_HEAD.pack(20 + 12 * n, 1, 0, oid, n, 1) + rec.tobytes()


def _float_array_with_nulls(values: Sequence[float | None]) -> bytes:
    body = b"".join(_NULL if v is None else _LEN_FLOAT8.pack(8, v) for v in values)
    return _ARRAY_HEAD.pack(20 + len(body), 1, 1, _FLOAT8_OID, len(values), 1) + body


def _chunk_row(
    chunk_id: int,
    run_id: int,
    key: str,
    steps: np.ndarray,
    values: Sequence[float | None],
    values_np: np.ndarray,
    micros: np.ndarray,
) -> bytes:
    """One ``runs_metricchunk`` row in PostgreSQL's binary COPY format."""
    kb = key.encode()
    return b"".join(
        (
            _ROW_START.pack(_CHUNK_COLUMNS, 8, chunk_id, 8, run_id),
            _TEXT_LEN.pack(len(kb)),
            kb,
            _STEP_RANGE.pack(8, int(steps[0]), 8, int(steps[-1])),
            _array8(steps, _INT8_OID),
            _float_array_with_nulls(values) if None in values else _array8(values_np, _FLOAT8_OID),
            _array8(micros, _TIMESTAMPTZ_OID),
        )
    )


def _micros(t: datetime) -> int:
    """A timestamptz as PostgreSQL stores it: microseconds since 2000-01-01 UTC."""
    if t.tzinfo is None:
        t = timezone.make_aware(t)
    return (t - _PG_EPOCH) // _ONE_US


_SEQUENCE: dict[tuple[str, str], str] = {}


def _serial_sequence(cur: Any, table: str) -> str:
    """A table's id sequence, looked up once per process and table: ids are reserved ahead of each
    COPY (``pg_get_serial_sequence`` per batch is not free)."""
    key = (connection.alias, table)
    if key not in _SEQUENCE:
        cur.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
        _SEQUENCE[key] = cur.fetchone()[0]
    return _SEQUENCE[key]


# Advisory lock namespace of the metric writers of one run (key = this + run id).
_WRITE_LOCK_BASE = 0x6772_7565 << 32


def _lock_run(cur: Any, run_id: int) -> None:
    """Serialize the metric writers of the run and take the run row's KEY SHARE lock, both for the
    rest of the transaction.

    The advisory lock makes the check-then-insert of ``_insert_points`` safe (two writers of one run
    cannot both find a step missing and store it twice) and makes chunk ids, taken under it, grow in
    commit order within a run, which the live cursor relies on. The KEY SHARE lock is what a
    foreign-key check would take (chunks have no FK constraint, see ``MetricChunk.run``): a
    concurrent ``delete_run`` (which locks the row FOR UPDATE first) waits for this batch to commit
    and then deletes its chunks too; a run already deleted raises here and the batch stores nothing."""
    cur.execute("SELECT pg_advisory_xact_lock(%s)", [_WRITE_LOCK_BASE + int(run_id)])
    cur.execute(f"SELECT 1 FROM {Run._meta.db_table} WHERE id = %s FOR KEY SHARE", [run_id])
    if cur.fetchone() is None:
        raise IntegrityError(f"run {run_id} does not exist")


_STORED_TAIL_SQL = (
    f"SELECT q.key, (SELECT c.last_step FROM {MetricChunk._meta.db_table} c "
    "WHERE c.run_id = %s AND c.key = q.key ORDER BY c.last_step DESC LIMIT 1) "
    "FROM unnest(%s::text[]) AS q(key)"
)
_STORED_STEPS_SQL = (
    f"SELECT q.key, u.step FROM unnest(%s::text[], %s::int8[], %s::int8[]) AS q(key, lo, hi) "
    f"JOIN {MetricChunk._meta.db_table} c ON c.run_id = %s AND c.key = q.key "
    "AND c.last_step >= q.lo AND c.first_step <= q.hi, "
    "unnest(c.steps) AS u(step) WHERE u.step BETWEEN q.lo AND q.hi"
)


PointGroups = dict[str, tuple[list[int], list[float | None], list[datetime]]]


def insert_point_groups(run_id: int, groups: PointGroups) -> tuple[dict[str, Sequence[int | None]], int]:
    """Inside the caller's transaction: store points as chunks, and their rollup.

    ``groups``: ``{key: (steps, values, times)}``, each key's points in the order they were emitted.
    Returns (``{key: the id of each of those points, None where it was not stored}``, the number of
    points stored). Point ids are ``chunk id << CHUNK_SHIFT | position in the chunk``.

    Per key the batch becomes one chunk (more above ``CHUNK_POINTS``). Fast path (the common case):
    the key's steps are strictly increasing and start above the last step stored for the key, so
    every point is new and the chunk is written as it is. Otherwise (a replay, a resumed step, a
    duplicate inside the batch) the first occurrence of a step in the batch wins, steps the run
    already has are dropped (read from the chunks overlapping the batch's step range), and the rest
    is stored sorted by step. Then one binary COPY of the chunk rows (encoded here with numpy), and
    the rollup of the new points (aggregated here, ``_rollup_levels``).
    """
    keys = [k for k, g in groups.items() if g[0]]
    if not keys:
        return {}, 0
    with connection.cursor() as cur:
        _lock_run(cur, run_id)
        cur.execute(_STORED_TAIL_SQL, [run_id, keys])
        tail = dict(cur.fetchall())
        stored_groups, steps_np, slow = _new_points(cur, run_id, groups, keys, tail)
        # One chunk per CHUNK_POINTS points of a key; ids reserved in one statement.
        chunks: list[tuple[str, int, int]] = []  # (key, start, end) into the key's lists
        for k in keys:
            n = len(stored_groups[k][0])
            for start in range(0, n, CHUNK_POINTS):
                chunks.append((k, start, min(n, start + CHUNK_POINTS)))
        if not chunks:
            return {k: [None] * len(groups[k][0]) for k in keys}, 0
        cur.execute(
            "SELECT nextval(%s::regclass) FROM generate_series(1, %s)",
            [_serial_sequence(cur, MetricChunk._meta.db_table), len(chunks)],
        )
        chunk_ids = [r[0] for r in cur.fetchall()]
        micros: dict[datetime, int] = {}
        data = [_COPY_SIGNATURE]
        keyed = []
        by_key: dict[str, list[tuple[int, int, int]]] = {}
        for cid, (k, a, b) in zip(chunk_ids, chunks, strict=True):
            by_key.setdefault(k, []).append((cid, a, b))
        for k in keys:
            _st, vs, ts = stored_groups[k]
            if not ts:
                continue
            for t in set(ts).difference(micros):
                micros[t] = _micros(t)
            st_np = steps_np[k]
            vs_np = np.array(vs, dtype=np.float64)  # null becomes NaN: for the rollup only
            ts_np = np.array([micros[t] for t in ts], dtype=np.int64)
            keyed.append((k, st_np, vs_np))
            for cid, a, b in by_key[k]:
                data.append(_chunk_row(cid, run_id, k, st_np[a:b], vs[a:b], vs_np[a:b], ts_np[a:b]))
        data.append(_COPY_TRAILER)
        with cur.cursor.copy(  # the psycopg 3 cursor: Django's wrapper has no COPY API
            f"COPY {MetricChunk._meta.db_table} (id, run_id, key, first_step, last_step, steps, vals, times) "
            "FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.write(b"".join(data))
        _store_rollup(
            cur,
            run_id,
            *_rollup_levels(keyed, [ROLLUP_ALL_MERGED if k in slow else tail.get(k) for k in keys]),
        )
    return _point_ids(keys, slow, by_key, groups, stored_groups)


def _new_points(
    cur: Any, run_id: int, groups: PointGroups, keys: list[str], tail: dict[str, int]
) -> tuple[PointGroups, dict[str, np.ndarray], list[str]]:
    """The points of ``groups`` to store, their steps as arrays, and the keys that took the slow path.

    Fast path: a key's steps strictly increase and start above its stored tail, so all are new.
    Otherwise the first occurrence of a step in the batch wins, steps the run already has (read from
    the chunks overlapping the batch's step range) are dropped, and the rest is sorted by step."""
    steps_np: dict[str, np.ndarray] = {}
    slow = []
    for k in keys:
        st = groups[k][0]
        arr = steps_np[k] = np.array(st, dtype=np.int64)
        last = tail.get(k)
        if not ((last is None or st[0] > last) and (len(st) == 1 or bool((arr[1:] > arr[:-1]).all()))):
            slow.append(k)
    stored_groups = dict(groups)
    if not slow:
        return stored_groups, steps_np, slow
    cur.execute(
        _STORED_STEPS_SQL,
        [slow, [min(groups[k][0]) for k in slow], [max(groups[k][0]) for k in slow], run_id],
    )
    stored: dict[str, set[int]] = {k: set() for k in slow}
    for k, step in cur.fetchall():
        stored[k].add(step)
    for k in slow:
        st, vs, ts = groups[k]
        seen = stored[k]
        keep: dict[int, tuple[float | None, datetime]] = {}
        for s, v, t in zip(st, vs, ts, strict=True):
            if s not in seen and s not in keep:
                keep[s] = (v, t)
        order = sorted(keep)
        stored_groups[k] = (order, [keep[s][0] for s in order], [keep[s][1] for s in order])
        steps_np[k] = np.array(order, dtype=np.int64)
    return stored_groups, steps_np, slow


def _point_ids(
    keys: list[str],
    slow: list[str],
    by_key: dict[str, list[tuple[int, int, int]]],
    groups: PointGroups,
    stored_groups: PointGroups,
) -> tuple[dict[str, Sequence[int | None]], int]:
    """Each emitted point's id (``chunk id << CHUNK_SHIFT | position``), None where it was not
    stored, and the number stored: slow-path keys map back to the emitted order."""
    ids: dict[str, Sequence[int | None]] = {}
    stored_n = 0
    for k in keys:
        parts = [range(cid << CHUNK_SHIFT, (cid << CHUNK_SHIFT) + b - a) for cid, a, b in by_key.get(k, [])]
        new_ids = parts[0] if len(parts) == 1 else list(itertools.chain.from_iterable(parts))
        stored_n += len(new_ids)
        if k not in slow:
            ids[k] = new_ids
        else:  # the first occurrence of a new step gets its id
            by_step = dict(zip(stored_groups[k][0], new_ids, strict=True))
            ids[k] = [by_step.pop(s, None) for s in groups[k][0]]
    return ids, stored_n


def _insert_points(
    run_id: int, rows: Sequence[tuple[str, int, float | None, datetime]], returning: bool
) -> list[tuple[int, str, int, float | None]]:
    """``insert_point_groups`` for rows ``(key, step, value, time)``; returns the points that were new
    as ``(id, key, step, value)`` in the order of ``rows`` (when ``returning``)."""
    groups: PointGroups = columns_by_key(rows, 0)
    ids, _n = insert_point_groups(run_id, groups)
    if not returning:
        return []
    it = {k: iter(v) for k, v in ids.items()}
    out = []
    for k, s, v, _t in rows:
        i = next(it[k])
        if i is not None:
            out.append((i, k, s, v))
    return out


def ingest_metrics(
    run_id: int,
    points: Iterable[tuple[str, int, float | None] | Mapping[str, Any]],
    *,
    time: datetime | None = None,
    returning: bool = True,
) -> IngestResult:
    """Store metric points in bulk, idempotent on (run, key, step): replays insert nothing.

    ``points`` are ``(key, step, value)`` tuples or ``{"key","step","value"[,"time"]}`` dicts.
    Stored as one chunk per key (binary COPY, see ``_insert_points``) with the rollup updated from
    the same batch. Returns the rows that were new, with their cursor ids (when ``returning``).
    """
    now = time or timezone.now()
    rows: list[tuple[str, int, float | None, datetime]] = []
    for p in points:
        if isinstance(p, Mapping):
            rows.append((str(p["key"]), int(p["step"]), _as_value(p.get("value")), p.get("time") or now))
        else:
            rows.append((str(p[0]), int(p[1]), _as_value(p[2]), now))
    if not rows:
        return IngestResult([], 0)
    # A committed batch is durable (synchronous commit): the recorder never resends a batch it saw
    # commit, so skipping the WAL flush could silently drop points on a server crash.
    with transaction.atomic():
        inserted = _insert_points(run_id, rows, returning)
    return IngestResult(inserted, len(rows))


def update_last_metrics(run_id: int, values: Mapping[str, float | None]) -> None:
    """Keep the newest value per key on the Run (metric columns of the run table)."""
    clean = {k: clean_float(v) for k, v in values.items()}
    if not clean:
        return
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {Run._meta.db_table} SET last_metrics = last_metrics || %s::jsonb WHERE id = %s",
            [json.dumps(clean), run_id],
        )


def _sample_objects(run_id: int, step: int, split: str, rows: Iterable[Mapping[str, Any]]) -> list[Sample]:
    objs = []
    for r in rows:
        refs = r.get("references") or []
        if isinstance(refs, str):
            refs = [refs]
        metrics = {k: clean_float(v) for k, v in (r.get("metrics") or {}).items()}
        objs.append(
            Sample(
                run_id=run_id,
                step=int(step),
                split=str(split or "train")[:32],
                sample_id=str(r.get("sample_id") or "")[:200],
                prompt=str(r.get("prompt", "")),
                generation=str(r.get("generation", "")),
                references=[str(x) for x in refs],
                reward=clean_float(r.get("reward")),
                metrics=metrics,
            )
        )
    return objs


def ingest_samples(
    run_id: int, step: int, split: str, rows: Iterable[Mapping[str, Any]], *, replace: bool = False
) -> list[Sample]:
    """Store generations (prompt, generation, references, reward, per-sample metrics).

    ``replace``: first delete the run's samples of this step and split. The recorder replaces on the
    first samples event of a (step, split) in an execution, so a resumed run that re-executes a step
    ends with that step's samples once, and a retried flush does not store them twice."""
    objs = _sample_objects(run_id, step, split, rows)
    with transaction.atomic():
        if replace:
            Sample.objects.filter(run_id=run_id, step=int(step), split=str(split or "train")[:32]).delete()
        return Sample.objects.bulk_create(objs, batch_size=500)


def add_log_lines(
    run_id: int,
    lines: Sequence[str],
    *,
    keys: Sequence[str] | None = None,
    times: Sequence[datetime] | None = None,
) -> list[tuple[int, str, datetime, str]]:
    """Store log lines in order; a line whose non-empty key the run already has is skipped.
    Returns the stored lines ``(id, line, time, key)`` in id (= given) order."""
    if not lines:
        return []
    now = timezone.now()
    keys = list(keys) if keys is not None else [""] * len(lines)
    times = list(times) if times is not None else [now] * len(lines)
    table = RunLog._meta.db_table
    lines = [str(x)[:10000] for x in lines]
    keys = [str(k)[:64] for k in keys]
    with connection.cursor() as cur:
        # Ids for every line (in line order: the log cursor) in one statement, then one binary COPY,
        # optimistically: a keyed line the run has already (a resumed run re-executing a step, a
        # flush retried after an ambiguous commit) or a concurrent writer of the same key is a unique
        # violation, and then the batch goes down the ON CONFLICT path instead.
        cur.execute(
            "SELECT nextval(%s::regclass) FROM generate_series(1, %s)",
            [_serial_sequence(cur, table), len(lines)],
        )
        ids = [r[0] for r in cur.fetchall()]
        seen: set[str] = set()
        out: list[tuple[int, str, datetime, str]] = []
        for line_id, line, t, key in zip(ids, lines, times, keys, strict=True):
            if key:
                if key in seen:
                    continue
                seen.add(key)
            out.append((line_id, line, t, key))
        if not out:
            return []
        try:
            with transaction.atomic():  # a savepoint
                with cur.cursor.copy(
                    f"COPY {table} (id, run_id, line, time, key) FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    copy.set_types(["int8", "int8", "text", "timestamptz", "text"])
                    for line_id, line, t, key in out:
                        copy.write_row((line_id, run_id, line, t, key))
        except (IntegrityError, psycopg.errors.IntegrityError):  # the raw COPY raises psycopg's
            return _add_log_lines_on_conflict(cur, run_id, lines, keys, times)
    return out


def _add_log_lines_on_conflict(
    cur: Any, run_id: int, lines: list[str], keys: list[str], times: list[datetime]
) -> list[tuple[int, str, datetime, str]]:
    """``add_log_lines`` with ``INSERT … ON CONFLICT DO NOTHING``: safe against a concurrent writer."""
    table = RunLog._meta.db_table
    epoch = {t: t.timestamp() for t in set(times)}
    # One JSON parameter instead of three arrays: psycopg dumps list elements one by one in Python,
    # json.dumps does it in C. Only (id, key) come back; the rest is what was sent.
    payload = json.dumps([lines, [epoch[t] for t in times], keys])
    cur.execute(
        f"""
        WITH src AS (
          SELECT t.line, to_timestamp(t.epoch::float8) AS time, t.key, t.ord
          FROM (SELECT %s::json AS j) AS p,
               ROWS FROM (json_array_elements_text(p.j -> 0), json_array_elements_text(p.j -> 1),
                          json_array_elements_text(p.j -> 2)) WITH ORDINALITY AS t(line, epoch, key, ord)),
        ins AS (
          INSERT INTO {table} (run_id, line, time, key)
          SELECT %s, line, time, key FROM src ORDER BY ord
          ON CONFLICT (run_id, key) WHERE key <> '' DO NOTHING
          RETURNING id, key)
        SELECT id, key FROM ins ORDER BY id
        """,
        [payload, run_id],
    )
    returned = cur.fetchall()
    # Rows come back in input order (ids follow ORDER BY ord); a keyed line is missing when the run
    # (or an earlier line of this batch) already had its key. Unkeyed lines never conflict.
    new_keys = {k for _i, k in returned if k}
    out: list[tuple[int, str, datetime, str]] = []
    it = iter(returned)
    seen: set[str] = set()
    for line, t, key in zip(lines, times, keys, strict=True):
        if key:
            if key not in new_keys or key in seen:
                continue
            seen.add(key)
        line_id, _k = next(it)
        out.append((line_id, line, t, key))
    return out


def add_checkpoint(run_id: int, step: int, path: str) -> Checkpoint:
    ckpt, _ = Checkpoint.objects.update_or_create(run_id=run_id, step=int(step), defaults={"path": str(path)})
    return ckpt


class _Row:
    def __init__(self, values: Mapping[str, Any]):
        self.__dict__.update(values)


def update_run(
    run_id: int, fields: Mapping[str, Any], *, last_metrics: Mapping[str, float | None] | None = None
) -> Any | None:
    """One UPDATE of the run's columns (and a merge into ``last_metrics``); returns an object with the
    status-message fields of the updated row (None if the run is gone)."""
    sets = []
    args: list[Any] = []
    for name, value in fields.items():
        if name == "summary":
            sets.append("summary = %s::jsonb")
            args.append(json.dumps(value))
        elif name == "run_dir":  # the worker's lifecycle records (and owns) it; fill it only if unset
            sets.append("run_dir = CASE WHEN run_dir = '' THEN %s ELSE run_dir END")
            args.append(value)
        else:
            sets.append(f"{name} = %s")
            args.append(value)
    if last_metrics:
        sets.append("last_metrics = last_metrics || %s::jsonb")
        args.append(json.dumps({k: clean_float(v) for k, v in last_metrics.items()}))
    if not sets:
        sets.append("id = id")
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {Run._meta.db_table} SET {', '.join(sets)} WHERE id = %s RETURNING {', '.join(STATUS_FIELDS)}",
            [*args, run_id],
        )
        row = cur.fetchone()
    return None if row is None else _Row(dict(zip(STATUS_FIELDS, row, strict=True)))
