"""The SQL that stores a run's live data: metric points (with their min/max rollup), log lines,
samples and checkpoints, one batch at a time.

Why one module: the recorder's flush, the CLI-run import and the benchmarks all write through these
functions, so the idempotency rules (metric points unique per run/key/step, keyed log lines unique per
run/key, a step's samples replaced when the step is re-executed) and the rollup that makes cold charts
cheap hold for every writer.

Rollup: for every new point, each level ``l`` of ``metric_rollup`` keeps count, min and max (with their
steps) of the bucket ``step // (ROLLUP_BASE * ROLLUP_FACTOR**l)``. It is updated in the same statement
as the insert and only from the rows that were really inserted, so replays do not count twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from webapp.runs.models import Checkpoint, MetricPoint, MetricRollup, Run, RunLog, Sample
from webapp.runs.protocol import clean_float

ROLLUP_BASE = 16
ROLLUP_FACTOR = 4
ROLLUP_LEVELS = 8  # widths 16, 64, …, 262,144 steps
_BASE_SHIFT = ROLLUP_BASE.bit_length() - 1
_FACTOR_SHIFT = ROLLUP_FACTOR.bit_length() - 1


def rollup_width(level: int) -> int:
    return ROLLUP_BASE * ROLLUP_FACTOR**level


def _rollup_sql(source: str | None) -> str:
    """CTEs that aggregate ``source`` (key, step, value) level by level (each level from the one
    below it, so the work shrinks by ROLLUP_FACTOR per level) and upsert them into the rollup table.
    ``source`` None: level 0 comes aggregated already, as a JSON parameter (see ``_level0``).
    Expects the run id as the next ``%s`` parameter (after the JSON one)."""
    ok = "value IS NOT NULL AND value <> 'NaN'::float8"
    if source is None:
        r0 = """r0 AS (
          SELECT t.key, t.bucket::bigint AS bucket, t.n::int AS n,
                 CASE WHEN t.mnv IS NULL THEN NULL ELSE ARRAY[t.mnv::float8, t.mns::float8] END AS mn,
                 CASE WHEN t.mxv IS NULL THEN NULL ELSE ARRAY[t.mxv::float8, t.mxs::float8] END AS mx
          FROM (SELECT %s::json AS j) AS p,
               ROWS FROM (json_array_elements_text(p.j -> 0), json_array_elements_text(p.j -> 1),
                          json_array_elements_text(p.j -> 2), json_array_elements_text(p.j -> 3),
                          json_array_elements_text(p.j -> 4), json_array_elements_text(p.j -> 5),
                          json_array_elements_text(p.j -> 6)) AS t(key, bucket, n, mnv, mns, mxv, mxs))"""
    else:
        r0 = f"""r0 AS (
          SELECT key, step >> {_BASE_SHIFT} AS bucket, count(*)::int AS n,
                 min(ARRAY[value, step::float8]) FILTER (WHERE {ok}) AS mn,
                 max(ARRAY[value, step::float8]) FILTER (WHERE {ok}) AS mx
          FROM {source} GROUP BY 1, 2)"""
    parts = [r0]
    for lvl in range(1, ROLLUP_LEVELS):
        parts.append(
            f"""r{lvl} AS (
          SELECT key, bucket >> {_FACTOR_SHIFT} AS bucket, sum(n)::int AS n, min(mn) AS mn, max(mx) AS mx
          FROM r{lvl - 1} GROUP BY 1, 2)"""
        )
    union = " UNION ALL ".join(
        f"SELECT {lvl} AS level, key, bucket, n, mn, mx FROM r{lvl}" for lvl in range(ROLLUP_LEVELS)
    )
    t = MetricRollup._meta.db_table
    newer_min = "t.min_value IS NULL OR (EXCLUDED.min_value IS NOT NULL AND (EXCLUDED.min_value, EXCLUDED.min_step) < (t.min_value, t.min_step))"
    newer_max = "t.max_value IS NULL OR (EXCLUDED.max_value IS NOT NULL AND (EXCLUDED.max_value, EXCLUDED.max_step) > (t.max_value, t.max_step))"
    parts.append(
        f"""rollup AS (
          INSERT INTO {t} AS t (run_id, key, level, bucket, n, min_value, min_step, max_value, max_step)
          SELECT %s, key, level, bucket, n, mn[1], mn[2]::bigint, mx[1], mx[2]::bigint
          FROM ({union}) AS agg
          ON CONFLICT (run_id, key, level, bucket) DO UPDATE SET
            n = t.n + EXCLUDED.n,
            min_value = CASE WHEN {newer_min} THEN EXCLUDED.min_value ELSE t.min_value END,
            min_step = CASE WHEN {newer_min} THEN EXCLUDED.min_step ELSE t.min_step END,
            max_value = CASE WHEN {newer_max} THEN EXCLUDED.max_value ELSE t.max_value END,
            max_step = CASE WHEN {newer_max} THEN EXCLUDED.max_step ELSE t.max_step END)"""
    )
    return ",\n".join(parts)


_INSERT_POINTS_SQL = (
    f"WITH ins AS (INSERT INTO {MetricPoint._meta.db_table} (run_id, key, step, value, time) "
    "SELECT %s, key, step, value, time FROM _grue_metric_in ORDER BY ord "
    "ON CONFLICT (run_id, key, step) DO NOTHING RETURNING id, key, step, value),\n" + _rollup_sql("ins")
)


@dataclass
class IngestResult:
    inserted: list[tuple[int, str, int, float | None]]  # (id, key, step, value) of new rows, id order
    received: int

    @property
    def duplicates(self) -> int:
        return self.received - len(self.inserted)


def _as_value(v: Any) -> float | None:
    return None if v is None else float(v)


def _copy_points(cur: Any, rows: Sequence[tuple[str, int, float | None, datetime]]) -> None:
    """COPY (binary) the rows into the session's temp table, numbered in arrival order."""
    cur.execute(
        "CREATE TEMP TABLE IF NOT EXISTS _grue_metric_in "
        "(ord bigint, key text, step bigint, value double precision, time timestamptz) ON COMMIT DELETE ROWS"
    )
    raw = cur.cursor  # the psycopg 3 cursor (Django's wrapper has no COPY API)
    with raw.copy("COPY _grue_metric_in (ord, key, step, value, time) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "text", "int8", "float8", "timestamptz"])
        for i, row in enumerate(rows):
            copy.write_row((i, *row))


_ROLLUP_FROM_LEVEL0_SQL = "WITH " + _rollup_sql(None) + "\nSELECT 1"


def _json_float(v: float) -> float | str:
    """JSON has no inf; PostgreSQL's float8 input reads 'inf' / '-inf'."""
    return v if math.isfinite(v) else str(v)


def _level0(rows: Sequence[tuple[str, int, float | None, datetime]]) -> str:
    """Level 0 of the rollup (count, min and max with their steps per key and bucket), computed here
    from the rows in hand: reading the just-copied rows back from the table cost the server more than
    a third of the COPY. Ties as the SQL path: the smallest step for the min, the largest for the max;
    null and NaN values are counted but are never a min or max."""
    agg: dict[tuple[str, int], list[Any]] = {}
    shift = _BASE_SHIFT
    for k, s, v, _t in rows:
        e = agg.get((k, s >> shift))
        if e is None:
            e = agg[(k, s >> shift)] = [0, None, None, None, None]
        e[0] += 1
        if v is None or v != v:
            continue
        if e[1] is None or (v, s) < (e[1], e[2]):
            e[1], e[2] = v, s
        if e[3] is None or (v, s) > (e[3], e[4]):
            e[3], e[4] = v, s
    cols: list[list[Any]] = [[], [], [], [], [], [], []]
    for (k, b), (n, mnv, mns, mxv, mxs) in agg.items():
        for col, x in zip(
            cols,
            (
                k,
                b,
                n,
                None if mnv is None else _json_float(mnv),
                mns,
                None if mxv is None else _json_float(mxv),
                mxs,
            ),
            strict=True,
        ):
            col.append(x)
    return json.dumps(cols)


_SEQUENCE: dict[str, str] = {}


def _id_sequence(cur: Any) -> str:
    """The metric table's id sequence, looked up once per process: ``pg_get_serial_sequence`` called
    per row made id reservation cost more than the COPY itself (2.5 s per 100k ids vs 0.26 s)."""
    alias = connection.alias
    if alias not in _SEQUENCE:
        cur.execute("SELECT pg_get_serial_sequence(%s, 'id')", [MetricPoint._meta.db_table])
        _SEQUENCE[alias] = cur.fetchone()[0]
    return _SEQUENCE[alias]


def _lock_run(cur: Any, run_id: int) -> None:
    """Take the run row's KEY SHARE lock for the rest of the transaction, as a foreign-key check
    would (metric points have no FK constraint, see ``MetricPoint.run``): a concurrent
    ``delete_run`` (which locks the row FOR UPDATE first) waits for this batch to commit and then
    deletes its points too; a run already deleted raises here and the batch stores nothing."""
    cur.execute(f"SELECT 1 FROM {Run._meta.db_table} WHERE id = %s FOR KEY SHARE", [run_id])
    if cur.fetchone() is None:
        raise IntegrityError(f"run {run_id} does not exist")


def _insert_points(
    run_id: int, rows: Sequence[tuple[str, int, float | None, datetime]], returning: bool
) -> list[tuple[int, str, int, float | None]]:
    """Inside the caller's transaction: store points and their rollup; the new rows in id order.

    Fast path (every point new, the common case): reserve ids from the sequence in one statement, COPY
    the rows straight into the table, and roll up that id range. A point the run already has (a
    replay, a resumed step, a duplicate inside the batch) makes the COPY fail on the unique index; the
    savepoint is rolled back and the batch goes through the temp table with ``ON CONFLICT DO NOTHING``.
    The fast path avoids the speculative insertion of ON CONFLICT, the costliest part of an ingest.
    """
    if not rows:
        return []
    table = MetricPoint._meta.db_table
    with connection.cursor() as cur:
        _lock_run(cur, run_id)
        cur.execute(
            "SELECT nextval(%s::regclass) FROM generate_series(1, %s)", [_id_sequence(cur), len(rows)]
        )
        ids = [r[0] for r in cur.fetchall()]
        try:
            with transaction.atomic():  # a savepoint
                raw = cur.cursor  # the psycopg 3 cursor (Django's wrapper has no COPY API)
                with raw.copy(
                    f"COPY {table} (id, run_id, key, step, value, time) FROM STDIN (FORMAT BINARY)"
                ) as copy:
                    # write_row streams: the server inserts while Python encodes the next rows (a
                    # numpy-built payload written at once measured 2x the CPU and lost that overlap).
                    copy.set_types(["int8", "int8", "text", "int8", "float8", "timestamptz"])
                    for i, row in zip(ids, rows, strict=True):
                        copy.write_row((i, run_id, *row))
        except (IntegrityError, psycopg.errors.IntegrityError):  # the raw COPY raises psycopg's
            pass  # some points exist already: take the idempotent path below
        else:
            cur.execute(_ROLLUP_FROM_LEVEL0_SQL, [_level0(rows), run_id])
            return [(i, k, s, v) for i, (k, s, v, _t) in zip(ids, rows, strict=True)] if returning else []
        _copy_points(cur, rows)
        cur.execute(
            _INSERT_POINTS_SQL + "\nSELECT id, key, step, value FROM ins ORDER BY id", [run_id, run_id]
        )
        inserted = [tuple(r) for r in cur.fetchall()]
        return inserted if returning else []


def ingest_metrics(
    run_id: int,
    points: Iterable[tuple[str, int, float | None] | Mapping[str, Any]],
    *,
    time: datetime | None = None,
    returning: bool = True,
) -> IngestResult:
    """Store metric points in bulk, idempotent on (run, key, step): replays insert nothing.

    ``points`` are ``(key, step, value)`` tuples or ``{"key","step","value"[,"time"]}`` dicts.
    COPY (binary) into a temporary table, then one ``INSERT … ON CONFLICT DO NOTHING`` that also
    updates the rollup. Returns the rows that were new, with their cursor ids (when ``returning``).
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
    epoch = {t: t.timestamp() for t in set(times)}
    # One JSON parameter instead of three arrays: psycopg dumps list elements one by one in Python,
    # json.dumps does it in C. Only (id, key) come back; the rest is what was sent.
    payload = json.dumps([lines, [epoch[t] for t in times], keys])
    with connection.cursor() as cur:
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


_STATUS_COLUMNS = (
    "status",
    "progress",
    "eta_seconds",
    "current_iter",
    "total_iters",
    "phase",
    "error",
    "cancel_requested",
    "started_at",
    "finished_at",
)


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
            f"UPDATE {Run._meta.db_table} SET {', '.join(sets)} WHERE id = %s RETURNING {', '.join(_STATUS_COLUMNS)}",
            [*args, run_id],
        )
        row = cur.fetchone()
    return None if row is None else _Row(dict(zip(_STATUS_COLUMNS, row, strict=True)))
