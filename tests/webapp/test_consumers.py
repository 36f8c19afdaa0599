"""The run websocket through Channels' WebsocketCommunicator, on the real Redis channel layer.

Consumers read the database from another thread, so these tests commit (transaction=True).
"""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from webapp.asgi import application
from webapp.runs import services
from webapp.runs.models import Run
from webapp.runs.tasks import DbSink

pytestmark = pytest.mark.django_db(transaction=True)


async def _connect(user, run_id: int, origin: bytes = b"http://127.0.0.1") -> WebsocketCommunicator:
    """A communicator carrying the user's real session cookie (AuthMiddlewareStack reads it)."""
    headers = [(b"origin", origin), (b"host", b"127.0.0.1")]
    if user is not None:
        cookie = await database_sync_to_async(_session_cookie)(user)
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)


def _session_cookie(user) -> str:
    from django.conf import settings
    from django.test import Client

    c = Client()
    c.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={c.cookies[settings.SESSION_COOKIE_NAME].value}"


async def _receive_until(comm: WebsocketCommunicator, kind: str, timeout: float = 10) -> list[dict]:
    """All messages up to and including the first of type ``kind``."""
    out = []
    while True:
        msg = await comm.receive_json_from(timeout=timeout)
        out.append(msg)
        if msg["type"] == kind:
            return out


def _new_run() -> Run:
    return Run.objects.create(name="live", config={}, status="running")


async def test_rejects_anonymous_annotator_and_foreign_origin(researcher, annotator):
    run = await database_sync_to_async(_new_run)()
    for user, origin in (
        (None, b"http://127.0.0.1"),
        (annotator, b"http://127.0.0.1"),
        (researcher, b"http://evil.example"),
    ):
        comm = await _connect(user, run.pk, origin)
        connected, code = await comm.connect()
        assert not connected, (user, origin)
        await comm.disconnect()
    comm = await _connect(researcher, run.pk + 999)
    connected, code = await comm.connect()
    assert not connected and code == 4404
    comm = await _connect(researcher, run.pk)
    connected, _ = await comm.connect()
    assert connected
    await comm.send_json_to({"type": "ping"})
    assert await comm.receive_json_from() == {"type": "pong"}
    await comm.disconnect()


async def test_catch_up_from_cursor_then_live_without_gaps_or_duplicates(researcher):
    run = await database_sync_to_async(_new_run)()
    sink = DbSink(run.pk)
    store = database_sync_to_async(lambda step: sink.metrics(step, {"a": step, "b": -step}))
    for step in range(5):
        await store(step)
    first_ids = await database_sync_to_async(
        lambda: list(run.metric_points.order_by("id").values_list("id", flat=True))
    )()
    cursor = first_ids[3]  # the browser already has the first 4 points

    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {"metric_cursor": cursor}})
    msgs = await _receive_until(comm, "caught_up")
    assert msgs[0]["type"] == "status" and msgs[0]["status"] == "running"
    caught = [p for m in msgs if m["type"] == "metrics" for p in m["points"]]
    assert [p["id"] for p in caught] == first_ids[4:]
    assert msgs[-1]["metric_cursor"] == first_ids[-1]

    # live: new points arrive; a replayed batch is stored once and not re-sent
    await store(5)
    await store(5)
    await store(6)
    live = []
    while len(live) < 4:
        m = await comm.receive_json_from(timeout=10)
        if m["type"] == "metrics":
            live.extend(m["points"])
    assert [(p["key"], p["step"]) for p in live] == [("a", 5), ("b", 5), ("a", 6), ("b", 6)]
    assert await comm.receive_nothing(timeout=0.3)
    all_ids = [p["id"] for p in caught + live]
    assert len(all_ids) == len(set(all_ids)) and all_ids == sorted(all_ids)
    await comm.disconnect()

    # reconnect with the last cursor: only what was stored while disconnected comes back
    await store(7)
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {"metric_cursor": all_ids[-1]}})
    msgs = await _receive_until(comm, "caught_up")
    again = [p for m in msgs if m["type"] == "metrics" for p in m["points"]]
    assert [(p["key"], p["step"], p["value"]) for p in again] == [("a", 7, 7.0), ("b", 7, -7.0)]
    await comm.disconnect()


async def test_samples_logs_and_status_are_streamed(researcher):
    run = await database_sync_to_async(_new_run)()
    sink = DbSink(run.pk)
    await database_sync_to_async(sink.samples)(
        1, "train", [{"prompt": "<b>p</b>", "generation": "g", "reward": 1}]
    )
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {}})
    msgs = await _receive_until(comm, "caught_up")
    rows = [r for m in msgs if m["type"] == "samples" for r in m["rows"]]
    assert [(r["prompt"], r["reward"]) for r in rows] == [("<b>p</b>", 1.0)]

    await database_sync_to_async(sink.log)("hello\nworld")
    m = await comm.receive_json_from(timeout=10)
    assert m["type"] == "log" and [x["line"] for x in m["lines"]] == ["hello", "world"]
    await database_sync_to_async(sink.progress)(3, 4, 12.5)
    m = await comm.receive_json_from(timeout=10)
    assert m["type"] == "status" and m["progress"] == 0.75 and m["eta_seconds"] == 12.5
    await database_sync_to_async(services.cancel_run)(run)
    m = await comm.receive_json_from(timeout=10)
    assert m["type"] == "status" and m["cancel_requested"] is True
    await comm.disconnect()


async def test_messages_before_subscribe_are_not_lost(researcher):
    run = await database_sync_to_async(_new_run)()
    sink = DbSink(run.pk)
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await database_sync_to_async(lambda: sink.metrics(0, {"x": 1.0}))()  # broadcast before subscribe
    await asyncio.sleep(0)  # let the group message reach the consumer
    await comm.send_json_to({"type": "subscribe", "after": {"metric_cursor": 0}})
    msgs = await _receive_until(comm, "caught_up")
    got = [p for m in msgs if m["type"] == "metrics" for p in m["points"]]
    assert [(p["key"], p["value"]) for p in got] == [("x", 1.0)]
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_subscribe_reveals_a_run_whose_worker_stopped_heartbeating(researcher):
    from datetime import timedelta

    from django.utils import timezone

    def make() -> Run:
        old = timezone.now() - timedelta(hours=1)
        return Run.objects.create(
            name="stale",
            config={},
            status="running",
            heartbeat_at=old,
            started_at=old,
            worker_host="gone@host",
        )

    run = await database_sync_to_async(make)()
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {}})
    msgs = await _receive_until(comm, "caught_up")
    assert msgs[0]["type"] == "status" and msgs[0]["status"] == "lost" and "gone@host" in msgs[0]["error"]
    await comm.disconnect()
