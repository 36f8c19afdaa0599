"""A live run page never moves past a gap (issue 29 item 3).

A broadcast can be lost while a page's socket stays open: the recorder pauses its broadcasts for 5 s
after a failed one (Redis restarting), and a page that reconnected and caught up during the pause
never received the flushes stored in it; the next message moved its cursor past them. Each flush now
carries the run's cursors from before it (``since``): a consumer that is behind reads the gap from the
database before forwarding, and a ping does the same check for a lost last flush.

Here the flushes are stored with a recorder that does not broadcast (exactly what a paused or failed
broadcast leaves behind), on the real Redis channel layer and PostgreSQL; tests/e2e/
test_live_gaps_browser.py kills a real Redis twice under a worker's run with the page open in chromium.
"""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async

from tests.webapp.test_consumers import _connect, _points, _receive_until
from webapp.runs.models import MetricPoint, Run
from webapp.runs.recorder import Recorder

pytestmark = pytest.mark.django_db(transaction=True)


def _ids(run_id: int) -> list[int]:
    return list(MetricPoint.objects.filter(run_id=run_id).order_by("id").values_list("id", flat=True))


async def test_a_lost_broadcast_is_read_from_the_database_before_the_next_message(researcher):
    run = await database_sync_to_async(lambda: Run.objects.create(name="gap", config={}, status="running"))()
    live = Recorder(run.pk)
    silent = Recorder(run.pk, broadcast_enabled=False)  # a flush whose broadcast was lost

    async def store(sink: Recorder, step: int) -> None:
        sink.metrics(step, {"a": step, "b": -step})
        await asyncio.to_thread(sink.flush)

    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {"metric_cursor": 0}})
    await _receive_until(comm, "caught_up")
    await store(live, 1)
    got = _points([await comm.receive_json_from(timeout=10)])
    assert sorted(p["step"] for p in got) == [1, 1]

    await store(silent, 2)
    await store(silent, 3)
    await store(live, 4)
    got = []
    while len(got) < 6:
        got += _points([await comm.receive_json_from(timeout=10)])
    ids = await database_sync_to_async(_ids)(run.pk)
    assert sorted(p["id"] for p in got) == ids[2:]  # steps 2 and 3 from the database, then 4

    # The run's last flush lost: nothing follows to reveal it, the page's ping finds it.
    await store(silent, 5)
    await comm.send_json_to({"type": "ping"})
    msgs = await _receive_until(comm, "pong")
    assert sorted(p["step"] for p in _points(msgs)) == [5, 5]
    await comm.send_json_to({"type": "ping"})
    assert _points(await _receive_until(comm, "pong")) == []  # nothing twice
    await comm.disconnect()
    live.close()
    silent.close()
