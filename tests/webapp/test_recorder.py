"""The recorder with real parts: its own thread and PostgreSQL connection, the real Redis channel
layer as the receiver, the real engine for a resume that re-executes steps.

Transactional tests: the recorder's thread only sees committed rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from channels.layers import get_channel_layer

import engine
from engine.events import MultiSink, NullSink
from tests.helpers import tiny_run_config
from webapp.runs import ingest, protocol, queries
from webapp.runs.models import MetricPoint, MetricRollup, Run, RunLog, Sample, group_name
from webapp.runs.recorder import Recorder

pytestmark = pytest.mark.django_db(transaction=True)

HEADLINE = {"train/reward_mean": 0.5, "train/kl": 0.01}  # an iteration's keys: they make a log line


def _new_run() -> Run:
    return Run.objects.create(name="rec", config={}, status="running")


def _flat(msg: dict) -> list[dict]:
    return [x for m in msg["messages"] for x in _flat(m)] if msg["type"] == "batch" else [msg]


async def test_one_flush_stores_points_and_log_lines_in_order_and_once():
    import asyncio

    from channels.db import database_sync_to_async

    run = await database_sync_to_async(_new_run)()
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group_name(run.pk), channel)
    sink = Recorder(run.pk, batch_points=10_000, max_delay=3600)
    for step in range(6):
        sink.metrics(step, {**HEADLINE, "loss": float(step)})
        if step == 2:
            sink.log("a free line between steps 2 and 3")
    await asyncio.to_thread(sink.flush)
    await layer.group_send(group_name(run.pk), {"type": "run.message", "message": {"type": "marker"}})

    first = await asyncio.wait_for(layer.receive(channel), 10)
    after = await asyncio.wait_for(layer.receive(channel), 10)
    assert after["message"] == {"type": "marker"}  # the flush was ONE group message
    assert sink.flushes == 1
    parts = _flat(first["message"])
    # The flush's points first (one metrics message, each key's points in emission order), then its
    # log lines in event order, the free line where it was logged: one message, as they are adjacent.
    assert [m["type"] for m in parts] == ["metrics", "log"]
    series = {s["key"]: s for s in parts[0]["series"]}
    assert sorted(series) == sorted([*HEADLINE, "loss"])
    for s in series.values():
        assert s["steps"] == list(range(6)) and s["ids"] == sorted(s["ids"])
    assert series["loss"]["values"] == [float(x) for x in range(6)]
    expected = [f"step {step}" for step in range(6)]
    expected.insert(3, "a free line between steps 2 and 3")
    assert [x["line"].split(":")[0] for x in parts[1]["lines"]] == expected
    points = list(protocol.message_points(parts[0]))
    lines = parts[1]["lines"]

    def stored():
        pts = list(MetricPoint.objects.filter(run_id=run.pk).order_by("id").values_list("id", "key", "step"))
        logs = list(RunLog.objects.filter(run_id=run.pk).order_by("id").values_list("id", "line"))
        return pts, logs

    pts, logs = await database_sync_to_async(stored)()
    # Exactly once, and the broadcast carries the stored ids (ids are per key chunk, so the stored
    # id order groups a flush's points by key).
    assert sorted((p["id"], p["key"], p["step"]) for p in points) == pts and len(pts) == 6 * 3
    assert len({p["id"] for p in points}) == 6 * 3
    assert [(x["id"], x["line"]) for x in lines] == logs and len(logs) == 7
    await layer.group_discard(group_name(run.pk), channel)
    await asyncio.to_thread(sink.close)


def test_a_flush_with_changing_key_sets_stores_every_point_once():
    """The flush turns runs of events with the same keys into columns: key sets that change, come
    back, skip a non-number and repeat a step must still store each (key, step) once, first wins."""
    run = _new_run()
    sink = Recorder(run.pk, batch_points=10_000, max_delay=3600)
    emitted = [
        (0, {"a": 0.0, "b": 10.0}),
        (1, {"a": 1.0, "b": 11.0}),
        (1, {"c": 21.0}),
        (2, {"a": 2.0, "b": "not a number", "c": 22.0}),
        (2, {"a": 99.0}),  # a repeated step: the first value stays
        (3, {"a": 3.0, "b": 13.0}),
    ]
    for step, values in emitted:
        sink.metrics(step, values)
    sink.flush()
    sink.close()
    stored = sorted(MetricPoint.objects.filter(run=run).values_list("key", "step", "value"))
    assert stored == [
        ("a", 0, 0.0), ("a", 1, 1.0), ("a", 2, 2.0), ("a", 3, 3.0),
        ("b", 0, 10.0), ("b", 1, 11.0), ("b", 3, 13.0),
        ("c", 1, 21.0), ("c", 2, 22.0),
    ]  # fmt: skip
    assert sink.flushes == 1 and sink.points_stored == 9


def test_a_published_checkpoint_has_every_step_before_it_stored(tmp_path: Path):
    """The CI race this guards: a worker killed just after checkpoint N became the resume point, with
    step N's metrics still queued, lost step N for good (the resumed run starts at N + 1). The recorder
    here holds events for an hour, so without the trainer's flush before publishing a checkpoint no
    point would be stored when the checkpoint appears; each checkpoint event arrives after its pointer
    is written, and at that moment the database must hold every step up to it."""
    run = Run.objects.create(name="durable", config={}, status="running")
    cfg = tiny_run_config(3, "durable", save_every=1)
    cfg["train"]["output_dir"] = str(tmp_path / "run")
    seen: dict[int, list[int]] = {}

    class AtPublication(NullSink):
        def checkpoint(self, step: int, path: str) -> None:
            pointer = json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())
            assert pointer["name"] == Path(path).name  # published: a resume would start after ``step``
            seen[step] = sorted(
                MetricPoint.objects.filter(run=run, key="train/reward_mean").values_list("step", flat=True)
            )

    recorder = Recorder(run.pk, batch_points=10**9, max_delay=3600)
    engine.train(cfg, sink=MultiSink(recorder, AtPublication()))
    recorder.close()
    assert seen == {1: [1], 2: [1, 2], 3: [1, 2, 3]}


def test_resume_that_re_executes_steps_stores_samples_and_log_lines_once(tmp_path: Path):
    """A real engine run crashes after step 3 with its last checkpoint at step 2; resuming re-executes
    step 3. Points were idempotent before; now the re-executed step's samples and log lines are too."""
    run = Run.objects.create(name="resume", config={}, status="running")
    cfg = tiny_run_config(4, "resume", save_every=2)
    cfg["train"]["output_dir"] = str(tmp_path / "run")
    calls = {"n": 0}

    def crash_after_step_3() -> bool:
        calls["n"] += 1  # called before each iteration: the 4th call comes after step 3
        if calls["n"] == 4:
            raise RuntimeError("worker died")
        return False

    first = Recorder(run.pk)
    with pytest.raises(RuntimeError, match="worker died"):
        engine.train(cfg, sink=first, should_stop=crash_after_step_3)
    first.close()
    step3_samples = list(Sample.objects.filter(run=run, step=3).values_list("id", flat=True))
    assert len(step3_samples) == 2
    assert RunLog.objects.filter(run=run, line__startswith="step 3:").count() == 1

    second = Recorder(run.pk)
    engine.train(cfg, sink=second, resume_from=str(tmp_path / "run"))
    second.close()
    # Step 3 ran twice; its samples and its log line are stored once (the re-execution's samples
    # replaced the first ones), and every other step's too.
    for step in (1, 2, 3, 4):
        assert Sample.objects.filter(run=run, step=step, split="train").count() == 2, step
        assert RunLog.objects.filter(run=run, line__startswith=f"step {step}:").count() == 1, step
    assert not Sample.objects.filter(pk__in=step3_samples).exists()
    assert RunLog.objects.filter(run=run, line__startswith="checkpoint at step 2:").count() == 1
    assert RunLog.objects.filter(run=run, line__startswith="resumed from").count() == 1
    keys = MetricPoint.objects.filter(run=run).values_list("key", "step")
    assert len(keys) == len(set(keys)) and {s for _k, s in keys} >= {1, 2, 3, 4}


def test_rollup_matches_the_points_and_ignores_replays():
    run = _new_run()
    n = 50_000
    vals = [math.sin(s / 300.0) for s in range(n)]
    vals[12_345] = 9.0
    vals[40_001] = -9.0
    vals[777] = float("nan")
    pts = [("m", s, v) for s, v in enumerate(vals)]
    for i in range(0, n, 7_000):  # batches that cut through buckets
        ingest.ingest_metrics(run.pk, pts[i : i + 7_000], returning=False)
    ingest.ingest_metrics(run.pk, pts[:20_000], returning=False)  # a replay adds nothing
    for level in (0, 3):
        width = 16 * 4**level
        expected: dict[int, list] = {}  # bucket -> [count, (min value, step), (max value, step)]
        for s, v in enumerate(vals):
            cell = expected.setdefault(s // width, [0, None, None])
            cell[0] += 1
            if not math.isnan(v):
                cell[1] = min(cell[1] or (v, s), (v, s))
                cell[2] = max(cell[2] or (v, s), (v, s))
        rows = MetricRollup.objects.filter(run=run, key="m", level=level)
        got = {r.bucket: [r.n, (r.min_value, r.min_step), (r.max_value, r.max_step)] for r in rows}
        assert got == expected


def test_cold_chart_reads_the_rollup_and_keeps_the_peaks():
    run = _new_run()
    n = 100_000
    pts = [("loss", s, math.sin(s / 1000.0)) for s in range(n)]
    pts[54_321] = ("loss", 54_321, 50.0)
    pts[77_777] = ("loss", 77_777, -40.0)
    ingest.ingest_metrics(run.pk, pts, returning=False)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        s = queries.metric_series(run.pk, "loss", max_points=1000)
    rollup_reads = [q["sql"] for q in ctx.captured_queries if "runs_metricrollup" in q["sql"]]
    assert len(rollup_reads) == 1
    # ~1,000 rollup rows at most were read, never the 100k points
    assert not any("GROUP BY" in q["sql"] for q in ctx.captured_queries)
    assert s["downsampled"] and s["total"] == n and len(s["x"]) <= 1000
    assert max(s["y"]) == 50.0 and 54_321 in s["x"] and min(s["y"]) == -40.0 and 77_777 in s["x"]
    assert s["x"][0] == 0 and s["x"][-1] == n - 1 and s["x"] == sorted(s["x"])
    # Every returned point is a stored point.
    stored = dict(MetricPoint.objects.filter(run=run, step__in=s["x"]).values_list("step", "value"))
    assert [stored[x] for x in s["x"]] == s["y"]
