"""Reads for pages and APIs: the run table, metric series with peak-keeping downsampling,
cursors for live catch-up, exports and comparisons. No function here changes state."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.core.cache import cache
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.db.models import F, FloatField, Q, QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from engine.dotted import flatten  # also forms.py's queries.flatten (config field paths)
from webapp import csvsafe
from webapp.runs.ingest import ROLLUP_LEVELS, rollup_width
from webapp.runs.models import (
    CHUNK_SHIFT,
    MetricChunk,
    MetricPoint,
    MetricRollup,
    Run,
    RunLog,
    RunStatus,
    Sample,
)
from webapp.runs.protocol import clean_float, log_line, sample_row, status_message

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- run table

SORTABLE = {
    "id": "id",
    "name": "name",
    "status": "status",
    "created": "created",
    "started": "started_at",
    "finished": "finished_at",
    "algorithm": "algorithm",
    "task": "task",
    "model": "model_name",
    "progress": "progress",
}
DEFAULT_METRIC_COLUMNS = ["train/reward_mean", "train/kl"]


@dataclass
class RunTable:
    rows: list[Run]
    total: int
    page: int
    per_page: int
    pages: int
    sort: str
    metric_columns: list[str]
    filters: dict[str, str] = field(default_factory=dict)
    facets: dict[str, list[str]] = field(default_factory=dict)

    def metric_value(self, run: Run, key: str) -> float | None:
        return (run.last_metrics or {}).get(key)


def _get(params: Mapping[str, Any], name: str) -> str:
    v = params.get(name, "")
    if isinstance(v, (list, tuple)):
        v = v[-1] if v else ""
    return str(v or "").strip()


def filter_runs(params: Mapping[str, Any], qs: QuerySet[Run] | None = None) -> QuerySet[Run]:
    """Filters: status, tag, task, algorithm, project, user (username), q (name/notes/tags/model/id)."""
    qs = qs if qs is not None else Run.objects.all()
    if status := _get(params, "status"):
        qs = qs.filter(status__in=[s for s in status.split(",") if s])
    if tag := _get(params, "tag"):
        qs = qs.filter(tags__contains=[tag])
    if task := _get(params, "task"):
        qs = qs.filter(task=task)
    if algo := _get(params, "algorithm"):
        qs = qs.filter(algorithm=algo)
    if project := _get(params, "project"):
        qs = qs.filter(project__name=project)
    if user := _get(params, "user"):
        qs = qs.filter(created_by__username=user)
    if q := _get(params, "q"):
        cond = (
            Q(name__icontains=q) | Q(notes__icontains=q) | Q(model_name__icontains=q) | Q(tags__contains=[q])
        )
        if q.lstrip("#").isdigit():
            cond |= Q(pk=int(q.lstrip("#")))
        qs = qs.filter(cond)
    return qs


def run_table(
    params: Mapping[str, Any] | None = None,
    *,
    metric_columns: Sequence[str] | None = None,
    per_page: int = 50,
) -> RunTable:
    """One page of the run table. ``params`` is the URL query (so the URL holds the table state):
    filters (see ``filter_runs``), ``sort`` (a SORTABLE name or ``metric:<key>``, ``-`` prefix for
    descending; default ``-created``), ``page`` (1-based), ``per_page``, ``metrics`` (comma list)."""
    params = params or {}
    qs = filter_runs(params).select_related("created_by", "project")
    if metric_columns is None:
        # ``metrics`` may repeat (the column chooser's checkboxes) and each value may be a comma list.
        raw = params.getlist("metrics") if hasattr(params, "getlist") else [_get(params, "metrics")]
        chosen = [m.strip() for v in raw for m in str(v or "").split(",") if m.strip()]
        metric_columns = list(dict.fromkeys(chosen)) if chosen else list(DEFAULT_METRIC_COLUMNS)
    sort = _get(params, "sort") or "-created"
    desc = sort.startswith("-")
    name = sort.lstrip("-")
    if name.startswith("metric:"):
        key = name[len("metric:") :]
        qs = qs.annotate(_sortval=Cast(KeyTextTransform(key, "last_metrics"), FloatField()))
        order = F("_sortval").desc(nulls_last=True) if desc else F("_sortval").asc(nulls_last=True)
        qs = qs.order_by(order, "-id")
    elif name in SORTABLE:
        col = SORTABLE[name]
        qs = qs.order_by(F(col).desc(nulls_last=True) if desc else F(col).asc(nulls_last=True), "-id")
    else:
        sort = "-created"
        qs = qs.order_by("-created", "-id")
    try:
        per_page = max(1, min(500, int(_get(params, "per_page") or per_page)))
    except ValueError:
        pass
    total = qs.count()
    pages = max(1, (total + per_page - 1) // per_page)
    try:
        page = int(_get(params, "page") or 1)
    except ValueError:
        page = 1
    page = max(1, min(page, pages))
    rows = list(qs[(page - 1) * per_page : page * per_page])
    filters = {k: _get(params, k) for k in ("status", "tag", "task", "algorithm", "project", "user", "q")}
    return RunTable(
        rows=rows,
        total=total,
        page=page,
        per_page=per_page,
        pages=pages,
        sort=sort,
        metric_columns=list(metric_columns),
        filters={k: v for k, v in filters.items() if v},
        facets=facets(),
    )


def facets() -> dict[str, list[str]]:
    """Distinct values for the filter dropdowns, each once. The model's default ordering (created,
    id) must be cleared: DISTINCT over a query ordered by other columns is distinct per row."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT DISTINCT unnest(tags) FROM {Run._meta.db_table} ORDER BY 1")
        tags = [r[0] for r in cur.fetchall()]

    def distinct(column: str) -> list[str]:
        return [v for v in Run.objects.order_by(column).values_list(column, flat=True).distinct() if v]

    return {
        "status": [s.value for s in RunStatus],
        "task": distinct("task"),
        "algorithm": distinct("algorithm"),
        "tag": tags,
    }


def metric_keys(run_ids: int | Iterable[int]) -> list[str]:
    """All metric keys of one or more runs (sorted)."""
    ids = [run_ids] if isinstance(run_ids, int) else list(run_ids)
    if not ids:
        return []
    # Loose index scan on the chunks' (run, key, last_step) index: one probe per distinct key, not a
    # scan of every chunk (a run with 20 keys costs 21 index probes).
    table = _CHUNKS
    keys: set[str] = set()
    with connection.cursor() as cur:
        for rid in ids:
            cur.execute(
                f"""
                WITH RECURSIVE k(key) AS (
                  (SELECT key FROM {table} WHERE run_id = %s ORDER BY key LIMIT 1)
                  UNION ALL
                  SELECT (SELECT m.key FROM {table} m WHERE m.run_id = %s AND m.key > k.key
                          ORDER BY m.key LIMIT 1)
                  FROM k WHERE k.key IS NOT NULL
                )
                SELECT key FROM k WHERE key IS NOT NULL
                """,
                [rid, rid],
            )
            keys.update(r[0] for r in cur.fetchall())
    return sorted(keys)


# --------------------------------------------------------------------------- metric series

_CHUNKS = MetricChunk._meta.db_table


def _points_of_key(x0: int | None, x1: int | None) -> tuple[str, list[Any]]:
    """A FROM item with the (step, value) points of one run's key, reading only the chunks that
    overlap ``[x0, x1]`` (either end may be None), and the parameters that follow run id and key."""
    chunk_where, point_where, args = "", [], []
    if x0 is not None:
        chunk_where += " AND c.last_step >= %s"
        args.append(x0)
    if x1 is not None:
        chunk_where += " AND c.first_step <= %s"
        args.append(x1)
    if x0 is not None:
        point_where.append("p.step >= %s")
        args.append(x0)
    if x1 is not None:
        point_where.append("p.step <= %s")
        args.append(x1)
    where = (" WHERE " + " AND ".join(point_where)) if point_where else ""
    return (
        f"(SELECT u.step, u.value FROM {_CHUNKS} c CROSS JOIN LATERAL unnest(c.steps, c.vals) AS u(step, value)"
        f" WHERE c.run_id = %s AND c.key = %s{chunk_where}) AS p{where}",
        args,
    )


def _points_at(cur: Any, run_id: int, key: str, steps: list[int]) -> list[tuple[int, float | None]]:
    """(step, value) of the given steps of one key, unnesting only the chunks whose step range holds
    one of them."""
    cur.execute(
        f"SELECT u.step, u.value FROM unnest(%s::int8[]) AS q(s) JOIN {_CHUNKS} c "
        "ON c.run_id = %s AND c.key = %s AND c.last_step >= q.s AND c.first_step <= q.s "
        "CROSS JOIN LATERAL unnest(c.steps, c.vals) AS u(step, value) WHERE u.step = q.s",
        [list(dict.fromkeys(steps)), run_id, key],
    )
    return cur.fetchall()


def _end_points(cur: Any, run_id: int, key: str, lo: int, hi: int) -> list[tuple[int, float | None]]:
    """The first and last point, (step, value), of one run's key spanning steps ``[lo, hi]``: the
    first element of the chunk starting at ``lo`` and the last of the chunk ending at ``hi`` (steps
    are sorted inside a chunk and unique per key), without unnesting any chunk."""
    cur.execute(
        f"(SELECT first_step, vals[1] FROM {_CHUNKS} WHERE run_id = %s AND key = %s AND first_step = %s "
        "LIMIT 1) UNION ALL "
        f"(SELECT last_step, vals[array_upper(vals, 1)] FROM {_CHUNKS} "
        "WHERE run_id = %s AND key = %s AND last_step = %s LIMIT 1)",
        [run_id, key, lo, run_id, key, hi],
    )
    return cur.fetchall()


# Points per series in a run page's first paint: 500 min/max buckets, more than a chart's pixel width.
# The worker warms the cache at this size when a run ends, so a finished run's charts come from Redis.
OVERVIEW_POINTS = 1000


def metric_series(
    run_id: int,
    key: str,
    *,
    max_points: int = 2000,
    x0: float | None = None,
    x1: float | None = None,
    _version: tuple[int, list[Any]] | None = None,
) -> dict[str, Any]:
    """Points of one metric for a chart: ``{"key", "x": [...steps], "y": [...], "total", "downsampled",
    "x0", "x1", "last_id"}``.

    When the range holds more than ``max_points`` points, the steps are cut into equal buckets and
    each bucket keeps the point with its minimum and the point with its maximum (plus the range's
    first and last point): spikes survive, unlike averaging or striding. A zoom range
    ``[x0, x1]`` (steps) gets full resolution once it holds at most ``max_points`` points.
    Results are cached per (run, key, range, newest metric id of the run), so a finished run's
    chart is computed once and a live run's chart is recomputed only when it has new points.
    """
    max_points = max(8, int(max_points))
    lo_arg = None if x0 is None else math.ceil(float(x0))
    hi_arg = None if x1 is None else math.floor(float(x1))
    src, src_args = _points_of_key(lo_arg, hi_arg)
    args: list[Any] = [run_id, key, *src_args]
    version, run_ident = _version or _series_version(run_id)
    ident = [run_ident, key, max_points, [a for a in (lo_arg, hi_arg) if a is not None], version]
    ck = "grue:series:" + hashlib.sha1(json.dumps(ident).encode()).hexdigest()
    cached = _cache_get(ck)
    if cached is not None:
        return cached
    with connection.cursor() as cur:
        if x0 is None and x1 is None:  # both ends from the chunks' step ranges: no point is read
            cur.execute(
                f"SELECT min(first_step), max(last_step) FROM {_CHUNKS} WHERE run_id = %s AND key = %s",
                [run_id, key],
            )
        else:
            cur.execute(f"SELECT min(step), max(step) FROM {src}", args)
        lo, hi = cur.fetchone()
        pts: list[tuple[int, float | None]] = []
        downsampled = False
        total = 0
        rolled = None
        if lo is not None and x0 is None and x1 is None and hi - lo + 1 > max_points:
            rolled = _from_rollup(cur, run_id, key, lo, hi, max_points)
        if rolled is not None:
            total, chosen = rolled
            if total > max_points:
                downsampled = True
                pts = sorted(chosen.items())
        elif lo is not None and hi - lo + 1 > max_points:
            whole = x0 is None and x1 is None  # then lo and hi are the series' ends
            total, chosen = _bucket_extremes(cur, src, args, run_id, key, lo, hi, max_points, whole)
            if total > max_points:
                downsampled = True
                pts = sorted(chosen.items())
        if lo is not None and not downsampled:
            cur.execute(f"SELECT step, value FROM {src} ORDER BY step", args)
            pts = cur.fetchall()
            total = len(pts)
    result = {
        "key": key,
        "x": [p[0] for p in pts],
        "y": [clean_float(p[1]) for p in pts],
        "total": total,
        "downsampled": downsampled,
        "x0": lo,
        "x1": hi,
        "last_id": version,
    }
    _cache_set(ck, result)
    return result


def _bucket_extremes(
    cur: Any,
    src: str,
    args: list[Any],
    run_id: int,
    key: str,
    lo: int,
    hi: int,
    max_points: int,
    whole: bool,
) -> tuple[int, dict[int, float | None]]:
    """The number of points in ``[lo, hi]`` and, per equal step bucket, the points holding its
    minimum and maximum plus the range's two ends (``{step: value}``): spikes survive downsampling.
    ``whole``: the range is the whole series, whose ends the chunks know without a scan."""
    nb = max(1, (max_points - 2) // 2)
    width = -(-(hi - lo + 1) // nb)  # ceil: integer bucket width in steps
    ok = "value IS NOT NULL AND value <> 'NaN'::float8"
    cur.execute(
        f"""
        SELECT count(*), min(ARRAY[value, step::float8]) FILTER (WHERE {ok}),
               max(ARRAY[value, step::float8]) FILTER (WHERE {ok})
        FROM {src} GROUP BY (step - %s) / %s
        """,
        [*args, lo, width],
    )
    rows = cur.fetchall()
    total = sum(r[0] for r in rows)
    chosen: dict[int, float | None] = {}
    if total <= max_points:
        return total, chosen
    for _n, mn, mx in rows:
        for pair in (mn, mx):
            if pair is not None:
                chosen[int(pair[1])] = pair[0]
    ends = _end_points(cur, run_id, key, lo, hi) if whole else _points_at(cur, run_id, key, [lo, hi])
    for step, value in ends:
        chosen[step] = value
    return total, chosen


def _from_rollup(
    cur: Any, run_id: int, key: str, lo: int, hi: int, max_points: int
) -> tuple[int, dict[int, float | None]] | None:
    """The whole series from the ingest-time rollup: (point count, {step: value} of each bucket's min
    and max plus the first and last point), reading at most ~4 rows per output bucket instead of every
    point. None when no rollup level is coarse enough to pay off (short series: read the points)."""
    nb = max(1, (max_points - 2) // 2)
    span = hi - lo + 1
    level = None
    for lvl in range(ROLLUP_LEVELS):
        if rollup_width(lvl) * nb <= span:
            level = lvl
    if level is None:
        return None
    cur.execute(
        f"SELECT bucket, n, min_value, min_step, max_value, max_step FROM {MetricRollup._meta.db_table} "
        "WHERE run_id = %s AND key = %s AND level = %s ORDER BY bucket",
        [run_id, key, level],
    )
    rows = cur.fetchall()
    if not rows:
        return None
    first = rows[0][0]
    group = -(-(rows[-1][0] - first + 1) // nb)  # consecutive rollup buckets per output bucket
    total = 0
    merged: dict[int, list[Any]] = {}
    for bucket, n, mn_v, mn_s, mx_v, mx_s in rows:
        total += n
        g = (bucket - first) // group
        cell = merged.get(g)
        if cell is None:
            merged[g] = [mn_v, mn_s, mx_v, mx_s]
            continue
        if mn_v is not None and (cell[0] is None or (mn_v, mn_s) < (cell[0], cell[1])):
            cell[0], cell[1] = mn_v, mn_s
        if mx_v is not None and (cell[2] is None or (mx_v, mx_s) > (cell[2], cell[3])):
            cell[2], cell[3] = mx_v, mx_s
    chosen: dict[int, float | None] = {}
    for mn_v, mn_s, mx_v, mx_s in merged.values():
        if mn_s is not None:
            chosen[mn_s] = mn_v
        if mx_s is not None:
            chosen[mx_s] = mx_v
    for step, value in _end_points(cur, run_id, key, lo, hi):
        chosen[step] = value
    return total, chosen


def _series_version(run_id: int) -> tuple[int, list[Any]]:
    """(newest metric id of the run, identity of the run). Ids restart in a re-created database
    (tests): the database name and the run's creation time keep such runs' cache entries apart."""
    created = Run.objects.filter(pk=run_id).values_list("created", flat=True).first()
    return metric_cursor(run_id), [connection.settings_dict["NAME"], run_id, str(created)]


# After a cache error (Redis down or hung: each call waits for the cache's socket timeout), chart
# requests skip the cache for this long and read PostgreSQL, which answers them in milliseconds.
CACHE_PAUSE_S = 30.0
_cache_paused_until = 0.0


def _cache_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    global _cache_paused_until
    if time.monotonic() < _cache_paused_until:
        return None
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a cache outage only costs time
        _cache_paused_until = time.monotonic() + CACHE_PAUSE_S
        log.warning(
            "chart cache unavailable (%s: %s); reading the database for %.0f s",
            type(exc).__name__,
            exc,
            CACHE_PAUSE_S,
        )
        return None


def _cache_get(key: str) -> Any:
    return _cache_call(cache.get, key)


def _cache_set(key: str, value: Any) -> None:
    _cache_call(cache.set, key, value, timeout=24 * 3600)


def metric_series_many(
    run_id: int,
    keys: Iterable[str] | None = None,
    *,
    max_points: int = 2000,
    x0: float | None = None,
    x1: float | None = None,
    _version: tuple[int, list[Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """``metric_series`` for several keys (all keys of the run by default)."""
    keys = list(keys) if keys is not None else metric_keys(run_id)
    version = _version or _series_version(run_id)
    return {k: metric_series(run_id, k, max_points=max_points, x0=x0, x1=x1, _version=version) for k in keys}


def cached_series_text(
    run_id: int, ident: list[Any], build: Callable[[tuple[int, list[Any]]], str]
) -> tuple[int, str]:
    """``(cursor, text)``: the run's newest metric id, read first, and ``build(version)``'s text,
    cached per (run identity, that id, ``ident``) like :func:`metric_series` (``build`` passes the
    version on to :func:`metric_series_many`, so nothing reads it twice). A run page's overview of 20
    series is then one cache read of its finished JSON (~230 kB) instead of 20 reads, their decoding
    and the response's encoding (~30 ms of the web server's CPU, which on a 2-core machine a first
    visit's browser is waiting for)."""
    version = _series_version(run_id)
    ck = "grue:text:" + hashlib.sha1(json.dumps([version[1], version[0], ident]).encode()).hexdigest()
    text = _cache_get(ck)
    if not isinstance(text, str):
        text = build(version)
        _cache_set(ck, text)
    return version[0], text


def run_series_text(
    run: Run,
    keys: list[str] | None,
    *,
    max_points: int,
    x0: float | None,
    x1: float | None,
    group_of: Callable[[str], str],
) -> str:
    """The run page's chart data as JSON text: ``{"run", "cursor", "status", "series", "groups"}``.

    The series part comes from the chart cache as finished JSON text (``cached_series_text``; the
    cursor is the newest metric id, read BEFORE the series, so the websocket catch-up from it can
    only repeat points, never miss one); the run's name and status are read fresh by the caller
    (``run`` needs ``pk``, ``name`` and ``protocol.STATUS_FIELDS``) and spliced in front of it as
    text, so a cached overview is never decoded and encoded again. ``group_of`` names a key's chart
    group (the page's layout, which the view owns)."""

    def series_json(version: tuple[int, list[Any]]) -> str:
        series = metric_series_many(run.pk, keys, max_points=max_points, x0=x0, x1=x1, _version=version)
        groups = {k: group_of(k) for k in series}
        return json.dumps({"series": series, "groups": groups}, cls=DjangoJSONEncoder)

    cursor, tail = cached_series_text(run.pk, ["series.json", keys, max_points, x0, x1], series_json)
    head = json.dumps(
        {"run": {"id": run.pk, "name": run.name}, "cursor": cursor, "status": status_message(run)},
        cls=DjangoJSONEncoder,
    )
    return head[:-1] + ", " + tail[1:]  # both are JSON objects: one object with the keys of both


def metric_cursor(run_id: int) -> int:
    """The largest metric point id of a run: the cursor to subscribe after a full page load (the last
    point of the run's newest chunk, one index probe)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT (id << {CHUNK_SHIFT}) + cardinality(steps) - 1 FROM {_CHUNKS} "
            "WHERE run_id = %s ORDER BY id DESC LIMIT 1",
            [run_id],
        )
        row = cur.fetchone()
    return row[0] if row else 0


def run_cursors(run_id: int) -> dict[str, int]:
    """The run's newest id in each live stream (``metric_cursor``, ``sample_cursor``, ``log_cursor``):
    one statement, three index probes. A flush's broadcast carries these as read before its rows
    (``since``), so a consumer whose cursors are behind knows it missed a broadcast and reads the gap
    from the database; a ping compares them with the consumer's cursors the same way."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT (SELECT (id << {CHUNK_SHIFT}) + cardinality(steps) - 1 FROM {_CHUNKS} "
            "WHERE run_id = %s ORDER BY id DESC LIMIT 1), "
            f"(SELECT id FROM {Sample._meta.db_table} WHERE run_id = %s ORDER BY id DESC LIMIT 1), "
            f"(SELECT id FROM {RunLog._meta.db_table} WHERE run_id = %s ORDER BY id DESC LIMIT 1)",
            [run_id, run_id, run_id],
        )
        metric, sample, line = cur.fetchone()
    return {"metric_cursor": metric or 0, "sample_cursor": sample or 0, "log_cursor": line or 0}


# --------------------------------------------------------------------------- live catch-up


def metrics_after(
    run_id: int, cursor: int, *, limit: int | None = None
) -> list[tuple[int, str, int, float | None]]:
    """Points ``(id, key, step, value)`` with id > cursor in id order (what a reconnecting browser
    missed; ``protocol.metrics_message`` makes the message). Only the chunks at or after the cursor's
    chunk (``cursor >> CHUNK_SHIFT``) are read, from the (run, id) index."""
    cursor = max(0, int(cursor))
    sql = (
        f"SELECT * FROM (SELECT (c.id << {CHUNK_SHIFT}) + u.ord - 1 AS id, c.key, u.step, u.value "
        f"FROM {_CHUNKS} c CROSS JOIN LATERAL unnest(c.steps, c.vals) WITH ORDINALITY AS u(step, value, ord) "
        "WHERE c.run_id = %s AND c.id >= %s) AS p WHERE p.id > %s ORDER BY p.id"
    )
    args: list[Any] = [run_id, cursor >> CHUNK_SHIFT, cursor]
    if limit:
        sql += " LIMIT %s"
        args.append(int(limit))
    with connection.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall()


def samples_after(run_id: int, cursor: int, *, limit: int | None = 500) -> list[dict[str, Any]]:
    qs = Sample.objects.filter(run_id=run_id, id__gt=cursor).order_by("id")
    if limit:
        qs = qs[:limit]
    return [sample_row(s) for s in qs]


def logs_after(run_id: int, cursor: int, *, limit: int | None = 1000) -> list[dict[str, Any]]:
    qs = RunLog.objects.filter(run_id=run_id, id__gt=cursor).order_by("id").values_list("id", "line", "time")
    if limit:
        qs = qs[:limit]
    return [log_line(i, line, t) for i, line, t in qs]


def latest_samples(run_id: int, *, split: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """The newest generations (newest first) for the run page."""
    qs = Sample.objects.filter(run_id=run_id)
    if split:
        qs = qs.filter(split=split)
    return [sample_row(s) for s in qs.order_by("-id")[:limit]]


def run_status_message(run_id: int) -> dict[str, Any] | None:
    run = Run.objects.filter(pk=run_id).first()
    return status_message(run) if run else None


# --------------------------------------------------------------------------- export


EXPORT_COLUMNS = ["run_id", "run_name", "key", "step", "value", "time"]


def export_rows(run_ids: Iterable[int], keys: Iterable[str] | None = None) -> Iterator[tuple[Any, ...]]:
    """(run_id, run_name, key, step, value, time) rows, streamed from a server-side cursor."""
    ids = list(run_ids)
    names = dict(Run.objects.filter(pk__in=ids).values_list("pk", "name"))
    qs = MetricPoint.objects.filter(run_id__in=ids)
    if keys:
        qs = qs.filter(key__in=list(keys))
    qs = qs.order_by("run_id", "key", "step").values_list("run_id", "key", "step", "value", "time")
    for run_id, key, step, value, t in qs.iterator(chunk_size=5000):
        yield run_id, names.get(run_id, ""), key, step, value, t.isoformat()


def metrics_csv(run_ids: Iterable[int], keys: Iterable[str] | None = None) -> Iterator[str]:
    """CSV text chunks (for a StreamingHttpResponse)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(EXPORT_COLUMNS)
    n = 0
    for row in export_rows(run_ids, keys):
        writer.writerow(csvsafe.row(row))  # run names and metric keys are user text
        n += 1
        if n % 2000 == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def metrics_json(run_ids: Iterable[int], keys: Iterable[str] | None = None) -> dict[str, Any]:
    """``{"runs": [{"id", "name", "status", "config", "summary", "metrics": {key: [[step, value], ...]}}]}``."""
    ids = list(run_ids)
    runs = {r.pk: r for r in Run.objects.filter(pk__in=ids)}
    out: dict[int, dict[str, Any]] = {
        rid: {
            "id": rid,
            "name": r.name,
            "status": r.status,
            "config": r.config,
            "summary": r.summary,
            "metrics": {},
        }
        for rid, r in runs.items()
    }
    for run_id, _name, key, step, value, _t in export_rows(ids, keys):
        out[run_id]["metrics"].setdefault(key, []).append([step, clean_float(value)])
    return {"runs": [out[i] for i in ids if i in out]}


def metrics_json_text(run_ids: Iterable[int], keys: Iterable[str] | None = None) -> str:
    return json.dumps(metrics_json(run_ids, keys), allow_nan=False)


# --------------------------------------------------------------------------- compare


def config_diff(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Only the config keys whose values differ between runs: ``[{"key", "values": [...per run]}]``."""
    flats = [flatten(r.config or {}) for r in runs]
    keys = sorted(set().union(*[f.keys() for f in flats])) if flats else []
    missing = object()
    diff = []
    for k in keys:
        vals = [f.get(k, missing) for f in flats]
        if any(
            json.dumps(v, sort_keys=True, default=str) != json.dumps(vals[0], sort_keys=True, default=str)
            for v in vals[1:]
        ):
            diff.append({"key": k, "values": [None if v is missing else v for v in vals]})
    return diff


# Which way is better, for highlighting the best run of each final metric. Keys not named here
# (β, entropy, value statistics, ...) have no "best" and are not highlighted.
LOWER_IS_BETTER_NAMES = ("loss", "perplexity", "ter", "kl", "approx_kl", "kl_episode", "clipfrac")


def metric_direction(key: str) -> str | None:
    """``"higher"``, ``"lower"`` or None (no better direction) for a metric key."""
    name = key.rsplit("/", 1)[-1].lower()
    if key.startswith(("loss/", "time/")) or "loss" in name or name in LOWER_IS_BETTER_NAMES:
        return "lower"
    if key.startswith("eval/") or name == "reward_mean":
        return "higher"
    return None


def final_metrics(runs: Sequence[Run], keys: Iterable[str] | None = None) -> dict[str, Any]:
    """The compare page's final-metrics table, both ways round:
    ``{"keys", "rows": [{"run", "values": {key: last value}}],
    "table": [{"key", "values": [per run], "best": [run indexes], "direction"}]}``.
    ``table`` has one row per metric (30+ metrics stay readable as rows, runs are the few columns);
    ``best`` lists the runs holding the best finite value when at least two runs differ."""
    if keys is None:
        ks: set[str] = set()
        for r in runs:
            ks.update((r.last_metrics or {}).keys())
        keys = sorted(ks)
    keys = list(keys)
    table = []
    for k in keys:
        values = [clean_float((r.last_metrics or {}).get(k)) for r in runs]
        direction = metric_direction(k)
        finite = [v for v in values if isinstance(v, (int, float))]
        best: list[int] = []
        if direction and len(finite) >= 2 and min(finite) != max(finite):
            target = max(finite) if direction == "higher" else min(finite)
            best = [i for i, v in enumerate(values) if v == target]
        table.append({"key": k, "values": values, "best": best, "direction": direction})
    return {
        "keys": keys,
        "rows": [{"run": r, "values": {k: (r.last_metrics or {}).get(k) for k in keys}} for r in runs],
        "table": table,
    }


def samples_side_by_side(
    runs: Sequence[Run], *, split: str | None = None, limit: int = 20
) -> list[dict[str, Any]]:
    """Generations for the same prompts across runs, from each run's newest step of that split
    (``split`` default: "validation"/"test" if present, else "train").
    ``[{"prompt", "references", "by_run": {run_id: {"generation", "reward", "step"} | None}}]``."""
    ids = [r.pk for r in runs]
    if not ids:
        return []
    if split is None:
        splits = set(Sample.objects.filter(run_id__in=ids).values_list("split", flat=True).distinct())
        split = next((s for s in ("validation", "test", "eval", "train") if s in splits), None)
        if split is None:
            return []
    latest: dict[int, int] = {}
    for rid in ids:
        step = (
            Sample.objects.filter(run_id=rid, split=split)
            .order_by("-step")
            .values_list("step", flat=True)
            .first()
        )
        if step is not None:
            latest[rid] = step
    table: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for rid, step in latest.items():
        for s in Sample.objects.filter(run_id=rid, split=split, step=step).order_by("id"):
            key = s.sample_id or s.prompt
            if key not in table:
                table[key] = {"prompt": s.prompt, "references": s.references, "by_run": dict.fromkeys(ids)}
                order.append(key)
            table[key]["by_run"][rid] = {
                "generation": s.generation,
                "reward": s.reward,
                "step": s.step,
                "metrics": s.metrics,
            }
    # Prompts every run answered first.
    order.sort(key=lambda k: -sum(v is not None for v in table[k]["by_run"].values()))
    return [table[k] for k in order[:limit]]


# One colour per run on every chart that shows several runs (compare, sweep): a run's colour is
# fixed by its position in the page's run list, not by its position among the runs that report
# one metric, so a run keeps its colour from chart to chart (issue 26.2). Twelve colours for the
# at most twelve compared runs; the legend on each page says which is which.
RUN_COLORS: tuple[str, ...] = (
    "#2f6fed",
    "#d64545",
    "#1f9d55",
    "#c77c02",
    "#8e44ad",
    "#16a2b8",
    "#e67e22",
    "#34495e",
    "#e84393",
    "#6c5ce7",
    "#00b894",
    "#b33939",
)


def run_color(index: int) -> str:
    """The colour of the ``index``-th run of a page (cycling after twelve)."""
    return RUN_COLORS[index % len(RUN_COLORS)]
