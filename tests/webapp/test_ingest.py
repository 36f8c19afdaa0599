"""Bulk metric ingestion (binary COPY of one chunk per key and batch, idempotent on run/key/step, with
the min/max rollup) and the recorder that stores a run's events in batches from a background thread."""

from __future__ import annotations

import math
import random
import threading

import pytest
from django.db import IntegrityError, connection, transaction

from webapp.runs import ingest, lifecycle, protocol, queries
from webapp.runs.models import MetricChunk, MetricPoint, Run, RunStatus
from webapp.runs.recorder import Recorder


@pytest.fixture
def run(db):
    return Run.objects.create(name="ingest", config={})


def test_bulk_copy_inserts_everything_and_returns_cursor_ids(run):
    pts = [(f"k{i % 5}", i // 5, i * 0.5) for i in range(20_000)]
    res = ingest.ingest_metrics(run.pk, pts)
    assert res.received == 20_000 and len(res.inserted) == 20_000 and res.duplicates == 0
    ids = [r[0] for r in res.inserted]
    assert [(k, s, v) for _i, k, s, v in res.inserted] == pts  # in the order given
    assert len(set(ids)) == 20_000
    # cursor ids: increasing per key with the step, and a later batch's ids above every earlier id
    for key in {k for k, _s, _v in pts}:
        assert [i for i, k, _s, _v in res.inserted if k == key] == sorted(
            i for i, k, _s, _v in res.inserted if k == key
        )
    later = ingest.ingest_metrics(run.pk, [("k0", 10_000, 1.0), ("new", 0, 2.0)])
    assert min(i for i, *_ in later.inserted) > max(ids)
    assert queries.metric_cursor(run.pk) == max(i for i, *_ in later.inserted)
    assert [r[0] for r in queries.metrics_after(run.pk, max(ids))] == sorted(i for i, *_ in later.inserted)
    assert MetricPoint.objects.filter(run=run).count() == 20_002
    assert MetricPoint.objects.filter(run=run, id__in=ids).count() == 20_000  # the view shows the same ids
    assert MetricPoint.objects.get(run=run, key="k3", step=10).value == pytest.approx((10 * 5 + 3) * 0.5)


def test_replayed_batches_are_idempotent(run):
    batch = [("train/kl", s, s / 10) for s in range(100)]
    first = ingest.ingest_metrics(run.pk, batch)
    again = ingest.ingest_metrics(run.pk, batch)
    assert len(first.inserted) == 100 and again.inserted == [] and again.duplicates == 100
    # a replay that overlaps with new steps stores only the new ones; first value wins
    mixed = ingest.ingest_metrics(run.pk, [("train/kl", 99, 123.0), ("train/kl", 100, 10.0)])
    assert [(k, s, v) for _i, k, s, v in mixed.inserted] == [("train/kl", 100, 10.0)]
    assert MetricPoint.objects.get(run=run, key="train/kl", step=99).value == pytest.approx(9.9)
    assert MetricPoint.objects.filter(run=run).count() == 101


def test_duplicates_inside_one_batch_and_special_values(run):
    res = ingest.ingest_metrics(
        run.pk, [("a", 1, 1.0), ("a", 1, 2.0), ("b", 1, float("nan")), ("c", 1, float("inf")), ("d", 1, None)]
    )
    assert len(res.inserted) == 4
    vals = dict(MetricPoint.objects.filter(run=run).values_list("key", "value"))
    assert vals["a"] == 1.0 and math.isnan(vals["b"]) and vals["c"] == math.inf and vals["d"] is None
    # the live/export path turns non-finite values into null
    live = protocol.metrics_message(queries.metrics_after(run.pk, 0))
    assert {p["key"]: p["value"] for p in protocol.message_points(live)} == {
        "a": 1.0,
        "b": None,
        "c": None,
        "d": None,
    }


def test_failed_batch_rolls_back_and_retry_creates_no_duplicates(transactional_db):
    # committed transactions, as in production
    run = Run.objects.create(name="ingest", config={})
    good = [("x", s, float(s)) for s in range(50)]
    with pytest.raises(IntegrityError, match=f"run {run.pk + 10_000} does not exist"):
        ingest.ingest_metrics(run.pk + 10_000, good)
    assert MetricPoint.objects.count() == 0
    ingest.ingest_metrics(run.pk, good[:30])  # partial success, then the whole batch is retried
    ingest.ingest_metrics(run.pk, good)
    assert MetricPoint.objects.filter(run=run).count() == 50
    # the retry stored only the 20 missing steps, as one chunk after the first one
    chunks = list(MetricChunk.objects.filter(run=run).order_by("id").values_list("first_step", "last_step"))
    assert chunks == [(0, 29), (30, 49)]


def test_deleting_a_run_while_a_batch_is_being_stored_leaves_no_orphan_points(transactional_db, wait_for):
    """Metric points have no FK constraint (ingest speed): the run-row locks must do its job. A batch
    in an open transaction holds the run's KEY SHARE lock; ``delete_run`` waits for it, then removes
    its points with the run; a batch arriving after the delete stores nothing."""
    run = Run.objects.create(name="ingest", config={}, status=RunStatus.SUCCEEDED)
    stored, go_on, deleted = threading.Event(), threading.Event(), threading.Event()

    def writer() -> None:
        try:
            with transaction.atomic():
                ingest.ingest_metrics(run.pk, [("x", s, 1.0) for s in range(500)])
                stored.set()
                go_on.wait(30)
        finally:
            connection.close()

    def deleter() -> None:
        try:
            lifecycle.delete_run(Run.objects.get(pk=run.pk))
            deleted.set()
        finally:
            connection.close()

    threads = [threading.Thread(target=writer)]
    threads[0].start()
    wait_for(stored.is_set, timeout=30, what="the batch is inserted (uncommitted)")
    threads.append(threading.Thread(target=deleter))
    threads[1].start()
    # the delete is blocked on the batch's lock for as long as the batch's transaction is open
    wait_for(lambda: _waiting_on_a_lock(), timeout=30, what="delete_run waits on the run row's lock")
    assert not deleted.is_set()
    go_on.set()
    for t in threads:
        t.join(30)
    assert deleted.is_set()
    assert not Run.objects.filter(pk=run.pk).exists()
    assert MetricPoint.objects.filter(run_id=run.pk).count() == 0
    with pytest.raises(IntegrityError, match="does not exist"):
        ingest.ingest_metrics(run.pk, [("x", 1000, 1.0)])
    assert MetricPoint.objects.filter(run_id=run.pk).count() == 0


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cur.fetchone()[0] > 0


def test_recorder_batches_and_keeps_last_values(transactional_db):
    run = Run.objects.create(name="ingest", config={})
    sink = Recorder(run.pk, batch_points=1000, max_delay=3600, broadcast_enabled=False)
    for step in range(10):
        sink.metrics(step, {"train/reward_mean": step * 1.0, "train/kl": 0.1})
    sink.progress(10, 10, 0.0)
    sink.flush()  # waits until the background thread has stored everything emitted so far
    assert MetricPoint.objects.filter(run=run).count() == 20
    assert sink.flushes == 1  # under the batch size and the delay: one flush for all of it
    run.refresh_from_db()
    assert run.last_metrics == {"train/reward_mean": 9.0, "train/kl": 0.1}
    assert run.progress == 1.0 and run.current_iter == 10
    sink.samples(
        3,
        "train",
        [{"prompt": "p", "generation": "g", "references": "r", "reward": 0.3, "metrics": {"m": 1}}],
    )
    sink.close()
    s = run.samples.get()
    assert s.references == ["r"] and s.metrics == {"m": 1.0} and s.reward == pytest.approx(0.3)


def test_downsampling_keeps_peaks_and_zoom_gives_full_resolution(run):
    n = 100_000
    pts = [("loss", s, math.sin(s / 1000.0)) for s in range(n)]
    pts[54_321] = ("loss", 54_321, 50.0)  # one spike
    pts[77_777] = ("loss", 77_777, -40.0)  # one dip
    ingest.ingest_metrics(run.pk, pts, returning=False)
    s = queries.metric_series(run.pk, "loss", max_points=1000)
    assert s["downsampled"] and s["total"] == n and len(s["x"]) <= 1000
    assert max(s["y"]) == 50.0 and 54_321 in s["x"]
    assert min(s["y"]) == -40.0 and 77_777 in s["x"]
    assert s["x"][0] == 0 and s["x"][-1] == n - 1 and s["x"] == sorted(s["x"])
    # a downsampled zoom keeps the range's own first and last point (inside chunks, not at their ends)
    d = queries.metric_series(run.pk, "loss", max_points=1000, x0=1000.5, x1=60_000)
    assert d["downsampled"] and d["x"][0] == 1001 and d["x"][-1] == 60_000 and 54_321 in d["x"]
    assert d["y"][0] == pytest.approx(math.sin(1.001)) and d["y"][-1] == pytest.approx(math.sin(60.0))
    z = queries.metric_series(run.pk, "loss", max_points=1000, x0=54_000, x1=54_500)
    assert not z["downsampled"] and z["x"] == list(range(54_000, 54_501))
    assert z["y"][321] == 50.0


def test_series_cache_sees_new_points(run):
    ingest.ingest_metrics(run.pk, [("r", s, 0.0) for s in range(5000)], returning=False)
    first = queries.metric_series(run.pk, "r", max_points=100)
    assert max(first["y"]) == 0.0 and first["total"] == 5000
    assert queries.metric_series(run.pk, "r", max_points=100) == first  # served again (cached)
    ingest.ingest_metrics(run.pk, [("r", 5000, 7.0)])
    again = queries.metric_series(run.pk, "r", max_points=100)
    assert again["total"] == 5001 and again["x"][-1] == 5000 and max(again["y"]) == 7.0


def test_sink_survives_a_dropped_connection_without_duplicates(transactional_db, caplog):
    """A real fault: the sink's PostgreSQL backend is terminated between two batches. Only that
    backend: other clients of the test database (the session's worker, servers) are left alone, and
    the test's own connection (the suite's credentials, whatever the server) does the terminating."""
    run = Run.objects.create(name="blip", config={})
    before = _client_backends()  # the recorder thread opens its connection at its first flush
    sink = Recorder(run.pk, broadcast_enabled=False)
    sink.metrics(0, {"a": 0.0, "b": 0.0})
    sink.flush()
    new = _client_backends() - before
    assert len(new) == 1, f"the recorder thread holds one new connection, got {new}"
    with connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", [new.pop()])
    sink.metrics(1, {"a": 1.0, "b": -1.0})  # first try hits the dead connection, the retry stores it
    sink.metrics(1, {"a": 1.0, "b": -1.0})  # a replay of the same batch
    sink.close()
    assert sorted(MetricPoint.objects.filter(run=run).values_list("key", "step")) == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
        ("b", 1),
    ]
    assert sink.points_stored == 4
    assert "retrying" in caplog.text  # the fault really happened and was retried


def _client_backends() -> set[int]:
    """Client backends of the test database other than this test's own connection."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return {r[0] for r in cur.fetchall()}


def test_rollup_from_the_batch_in_hand_equals_the_rollup_computed_by_sql_from_stored_points(run):
    """The ingest aggregates every rollup level in Python (``ingest._rollup_levels``: new buckets
    copied, buckets that may hold stored points merged); ``ingest._rollup_sql`` computes them in SQL
    from the stored points. Both must agree: ties, null, NaN and infinities included, over batches
    that extend, revisit, reverse and interleave a key's steps."""
    rng = random.Random(7)
    specials = [None, float("nan"), float("inf"), -float("inf"), 0.5, 0.5]
    for start in (0, 700, 1500):
        pts = []
        for step in range(start, start + 700):
            for key in ("a", "b/c", "ü"):
                v = rng.choice(specials) if rng.random() < 0.2 else round(rng.gauss(0, 1), 1)  # many ties
                pts.append((key, step, v))
        ingest.ingest_metrics(run.pk, pts)
    # The merging path too: a batch that revisits stored steps, fills the gap 1400-1499, goes past
    # the tail, backwards, and repeats a step (only its new points count); and a key whose second
    # batch interleaves with its first.
    back = [("a", s, rng.gauss(0, 1)) for s in range(2300, 1350, -1)] + [("a", 2200, 99.0)]
    ingest.ingest_metrics(run.pk, back + [("gap", s, float(s % 7)) for s in range(0, 3000, 2)])
    ingest.ingest_metrics(run.pk, [("gap", s, -float(s % 5)) for s in range(1, 3000, 2)])
    assert MetricPoint.objects.filter(run=run, key="a").count() == 2301
    assert MetricPoint.objects.filter(run=run, key="gap").count() == 3000
    cols = "key, level, bucket, n, min_value, min_step, max_value, max_step"

    def rollup() -> list[tuple]:
        with connection.cursor() as cur:
            cur.execute(f"SELECT {cols} FROM runs_metricrollup WHERE run_id = %s ORDER BY 1, 2, 3", [run.pk])
            return [
                tuple("nan" if isinstance(x, float) and math.isnan(x) else x for x in r)
                for r in cur.fetchall()
            ]

    fast = rollup()
    with connection.cursor() as cur:
        cur.execute("DELETE FROM runs_metricrollup WHERE run_id = %s", [run.pk])
        cur.execute(
            "WITH src AS (SELECT key, step, value FROM runs_metricpoint WHERE run_id = %s),\n"
            + ingest._rollup_sql("src")
            + "\nSELECT 1",
            [run.pk, run.pk],
        )
    assert fast == rollup()
    assert len(fast) > 100 and {r[1] for r in fast} == set(range(ingest.ROLLUP_LEVELS))
