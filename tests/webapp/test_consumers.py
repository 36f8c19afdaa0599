"""The run websocket through Channels' WebsocketCommunicator, on the real Redis channel layer, fed
by the real recorder (its own thread and database connection).

Consumers read the database from another thread, so these tests commit (transaction=True).
Ordering is proven with an explicit barrier, never with sleeps: ``ping`` is answered with a ``pong``
that carries how many live group messages the consumer has received on the connection, so
"everything broadcast so far has been handled" is a condition the test waits for.
"""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from webapp.asgi import application
from webapp.runs import consumers, ingest, lifecycle, protocol
from webapp.runs.models import Run
from webapp.runs.recorder import Recorder

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


async def _barrier(comm: WebsocketCommunicator, live: int, timeout: float = 10) -> list[dict]:
    """Ping until the consumer has handled ``live`` group messages; returns every message that
    arrived before the final pong (so "nothing else was sent" is an exact assertion)."""
    got: list[dict] = []
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        await comm.send_json_to({"type": "ping"})
        msgs = await _receive_until(comm, "pong", timeout=timeout)
        got.extend(msgs[:-1])
        if msgs[-1]["live"] >= live:
            assert msgs[-1]["live"] == live, msgs[-1]
            return got
        assert asyncio.get_running_loop().time() < deadline, f"consumer saw {msgs[-1]['live']} of {live}"


def _flat(msgs: list[dict]) -> list[dict]:
    """Batches unpacked, in order."""
    out = []
    for m in msgs:
        out.extend(_flat(m["messages"]) if m["type"] == "batch" else [m])
    return out


def _points(msgs: list[dict]) -> list[dict]:
    return [p for m in _flat(msgs) for p in protocol.message_points(m)]


async def _close_code(comm: WebsocketCommunicator, timeout: float = 10) -> int:
    """Skip data frames until the server closes; the close code."""
    while True:
        out = await comm.receive_output(timeout=timeout)
        if out["type"] == "websocket.close":
            return out.get("code", 1000)


def _new_run() -> Run:
    return Run.objects.create(name="live", config={}, status="running")


async def test_refusals_reach_the_browser_as_close_codes(researcher, annotator):
    run = await database_sync_to_async(_new_run)()
    # Accept-then-close: the browser sees 4403/4404 and stops retrying (a refused handshake has no code).
    for user in (None, annotator):
        comm = await _connect(user, run.pk)
        connected, _ = await comm.connect()
        assert connected
        assert await _close_code(comm) == 4403, user
    comm = await _connect(researcher, run.pk + 999)
    assert (await comm.connect())[0]
    assert await _close_code(comm) == 4404
    # A foreign origin is refused at the handshake (cross-site websocket hijacking).
    comm = await _connect(researcher, run.pk, b"http://evil.example")
    connected, _ = await comm.connect()
    assert not connected
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "ping"})
    assert await comm.receive_json_from() == {"type": "pong", "live": 0}
    await comm.disconnect()


async def test_catch_up_from_cursor_then_live_without_gaps_or_duplicates(researcher):
    run = await database_sync_to_async(_new_run)()
    sink = Recorder(run.pk)

    async def store(step: int) -> None:
        sink.metrics(step, {"a": step, "b": -step})
        await asyncio.to_thread(sink.flush)  # stored and broadcast: one flush, one group message

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
    caught = _points(msgs)
    assert sorted(p["id"] for p in caught) == first_ids[4:]  # a message is grouped per key
    assert msgs[-1]["metric_cursor"] == first_ids[-1]

    # live: new points arrive; a replayed step is stored once and not re-sent (no broadcast at all)
    await store(5)
    await store(5)
    await store(6)
    live = _points(await _barrier(comm, live=2))
    assert [(p["key"], p["step"]) for p in live] == [("a", 5), ("b", 5), ("a", 6), ("b", 6)]
    all_ids = [p["id"] for p in caught + live]
    assert len(all_ids) == len(set(all_ids))
    for key in "ab":  # each key's points arrive in id (= step) order
        ids = [p["id"] for p in caught + live if p["key"] == key]
        assert ids == sorted(ids)
    await comm.disconnect()

    # reconnect with the last cursor: only what was stored while disconnected comes back
    await store(7)
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {"metric_cursor": all_ids[-1]}})
    msgs = await _receive_until(comm, "caught_up")
    again = _points(msgs)
    assert [(p["key"], p["step"], p["value"]) for p in again] == [("a", 7, 7.0), ("b", 7, -7.0)]
    await comm.disconnect()
    await asyncio.to_thread(sink.close)


async def test_catch_up_of_more_than_one_chunk(researcher):
    run = await database_sync_to_async(_new_run)()
    n = consumers.CATCHUP_CHUNK * 2 + 123  # three pages of points
    await database_sync_to_async(ingest.ingest_metrics)(run.pk, [("k", s, float(s)) for s in range(n)])
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {}})
    msgs = await _receive_until(comm, "caught_up", timeout=30)
    pages = [m for m in msgs if m["type"] == "metrics"]
    assert [len(m["series"][0]["ids"]) for m in pages] == [
        consumers.CATCHUP_CHUNK,
        consumers.CATCHUP_CHUNK,
        123,
    ]
    steps = [p["step"] for p in _points(pages)]
    assert steps == list(range(n))
    assert msgs[-1]["metric_cursor"] == _points(pages)[-1]["id"]
    await comm.disconnect()


async def test_samples_logs_and_status_are_streamed(researcher):
    run = await database_sync_to_async(_new_run)()
    sink = Recorder(run.pk)
    sink.samples(1, "train", [{"prompt": "<b>p</b>", "generation": "g", "reward": 1}])
    await asyncio.to_thread(sink.flush)
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {}})
    msgs = await _receive_until(comm, "caught_up")
    rows = [r for m in msgs if m["type"] == "samples" for r in m["rows"]]
    assert [(r["prompt"], r["reward"]) for r in rows] == [("<b>p</b>", 1.0)]

    sink.log("hello\nworld")
    sink.progress(3, 4, 12.5)
    await asyncio.to_thread(sink.flush)
    flat = _flat(await _barrier(comm, live=1))
    assert [m["type"] for m in flat] == ["log", "status"]
    assert [x["line"] for x in flat[0]["lines"]] == ["hello", "world"]
    assert flat[1]["progress"] == 0.75 and flat[1]["eta_seconds"] == 12.5
    await database_sync_to_async(lifecycle.cancel_run)(run)
    m = await comm.receive_json_from(timeout=10)
    assert m["type"] == "status" and m["cancel_requested"] is True
    await comm.disconnect()
    await asyncio.to_thread(sink.close)


async def test_messages_before_subscribe_are_not_lost(researcher):
    run = await database_sync_to_async(_new_run)()
    sink = Recorder(run.pk)
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    sink.metrics(0, {"x": 1.0})
    await asyncio.to_thread(sink.flush)
    # The broadcast has reached the consumer (and was held back: not subscribed yet) ...
    assert await _barrier(comm, live=1) == []
    # ... and the subscription's catch-up reads the point from the database, exactly once.
    await comm.send_json_to({"type": "subscribe", "after": {"metric_cursor": 0}})
    msgs = await _receive_until(comm, "caught_up")
    assert [(p["key"], p["value"]) for p in _points(msgs)] == [("x", 1.0)]
    assert await _barrier(comm, live=1) == []
    await comm.disconnect()
    await asyncio.to_thread(sink.close)


async def test_a_second_subscribe_is_refused(researcher):
    run = await database_sync_to_async(_new_run)()
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {}})
    await _receive_until(comm, "caught_up")
    await comm.send_json_to({"type": "subscribe", "after": {}})  # would repeat the full catch-up
    msg = await comm.receive_json_from(timeout=10)
    assert msg["type"] == "error" and "already subscribed" in msg["error"]
    assert await _close_code(comm) == 4409


@pytest.mark.parametrize("how", ["logout", "demoted"])
async def test_a_logged_out_or_demoted_user_stops_streaming(researcher, monkeypatch, how):
    from django.contrib.auth.models import Group
    from django.contrib.sessions.models import Session

    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.2)
    run = await database_sync_to_async(_new_run)()
    sink = Recorder(run.pk)
    comm = await _connect(researcher, run.pk)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "subscribe", "after": {}})
    await _receive_until(comm, "caught_up")
    sink.metrics(0, {"x": 0.0})
    await asyncio.to_thread(sink.flush)
    assert [p["step"] for p in _points(await _barrier(comm, live=1))] == [0]

    if how == "logout":  # logging out deletes the session row (this user has only this session)
        await database_sync_to_async(lambda: Session.objects.all().delete())()
    else:
        await database_sync_to_async(lambda: researcher.groups.remove(Group.objects.get(name="researcher")))()
    # The periodic re-check closes the socket with 4403: the page stops and says why.
    assert await _close_code(comm) == 4403
    await asyncio.to_thread(sink.close)


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
