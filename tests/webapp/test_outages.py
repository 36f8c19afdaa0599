"""Outages of the real services, injected with a TCP proxy the test controls.

PostgreSQL: a real Celery worker reaches the database only through the proxy; cutting it (every
open connection dropped, new ones refused) makes the database unreachable for the worker while the
test still sees it. Redis: a proxy that accepts connections and never answers is a hung Redis.
"""

from __future__ import annotations

import math
import threading

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from tests.conftest import session_cookie
from tests.helpers import TcpProxy, run_dir_points, tiny_run_config
from webapp.asgi import application
from webapp.runs import lifecycle, protocol, queries
from webapp.runs.broadcast import broadcast
from webapp.runs.errors import BrokerUnavailable
from webapp.runs.models import MetricPoint, Run, RunLog, RunStatus
from webapp.runs.recorder import Recorder

pytestmark = pytest.mark.django_db(transaction=True)


def tiny(n_iters: int) -> dict:
    return tiny_run_config(n_iters, "outage", save_every=0)


@pytest.fixture
def pg_proxy(pg_tcp):
    """A proxy in front of the suite's PostgreSQL over TCP (the settings' host, or the embedded
    server's loopback port): never an assumed 127.0.0.1:5432, which is another server or none."""
    proxy = TcpProxy((pg_tcp.host, pg_tcp.port))
    yield proxy
    proxy.close()


def _worker_through(worker_factory, proxy: TcpProxy, pg_tcp, test_db_name: str, give_up_s: float):
    """A worker whose only way to the test database is the proxy, with the suite's credentials."""
    url = pg_tcp.url(test_db_name, host="127.0.0.1", port=proxy.port)
    return worker_factory(extra_env={"DATABASE_URL": url, "GRUE_RECORDER_GIVE_UP_S": str(give_up_s)})


def test_a_database_outage_is_ridden_out_and_every_point_stored_once(
    worker_factory, pg_proxy, pg_tcp, test_db_name, settings, wait_for, researcher
):
    worker = _worker_through(worker_factory, pg_proxy, pg_tcp, test_db_name, give_up_s=600)
    settings.CELERY_TASK_DEFAULT_QUEUE = worker.queue
    n_iters = 20
    run = lifecycle.launch_run(tiny(n_iters=n_iters), user=researcher)

    def step(cond, timeout: float, what: str) -> None:
        try:
            wait_for(cond, timeout=timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nworker log:\n{worker.log()[-4000:]}") from None

    step(lambda: MetricPoint.objects.filter(run_id=run.pk).exists(), 600, "first points")
    pg_proxy.cut()
    # Several failed attempts in a row: the outage outlasts the old ~1.4 s limit (0.2+0.4+0.8 s of
    # backoff before the 4th attempt). Training goes on meanwhile (its events queue up, and the
    # final flush waits for the database).
    step(lambda: worker.log().count("database error while storing run") >= 5, 300, "retries")
    pg_proxy.restore()
    step(
        lambda: Run.objects.get(pk=run.pk).status not in (RunStatus.QUEUED, RunStatus.RUNNING),
        600,
        "the run to end",
    )
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, (run.error, worker.log()[-3000:])
    truth = run_dir_points(run.run_dir)
    stored = {
        (k, s): v for k, s, v in MetricPoint.objects.filter(run=run).values_list("key", "step", "value")
    }
    assert MetricPoint.objects.filter(run=run).count() == len(stored)  # unique rows
    assert stored.keys() == truth.keys() and len(truth) > 10
    for key, value in truth.items():
        if value is None:
            assert stored[key] is None or math.isnan(stored[key]), key
        else:
            assert stored[key] == pytest.approx(value), key
    # Every iteration's log line exactly once, in order.
    lines = [x for x in RunLog.objects.filter(run=run).order_by("id").values_list("line", flat=True)]
    steps = [int(x.split(":")[0].split()[1]) for x in lines if x.startswith("step ")]
    assert steps == list(range(1, n_iters + 1))


def test_an_outage_past_the_limit_fails_the_run_with_the_real_cause(
    worker_factory, pg_proxy, pg_tcp, test_db_name, settings, wait_for, researcher
):
    worker = _worker_through(worker_factory, pg_proxy, pg_tcp, test_db_name, give_up_s=3)
    settings.CELERY_TASK_DEFAULT_QUEUE = worker.queue
    run = lifecycle.launch_run(tiny(n_iters=200), user=researcher)
    wait_for(lambda: MetricPoint.objects.filter(run_id=run.pk).exists(), timeout=300, what="first points")
    pg_proxy.cut()
    wait_for(lambda: "gives up" in worker.log(), timeout=120, what="the recorder to give up")
    pg_proxy.restore()  # the database is back: the failure and its cause can be recorded
    wait_for(lambda: Run.objects.get(pk=run.pk).status == RunStatus.FAILED, timeout=120, what="failed")
    run.refresh_from_db()
    assert "RecorderError" in run.error and "database was unreachable" in run.error, run.error


# --------------------------------------------------------------------------- a hung Redis


@pytest.fixture
def hung_redis(settings, monkeypatch, redis_address):
    """Channels, the cache-less broadcast path and Celery pointed at a Redis that never answers: a
    proxy in front of the suite's own Redis (its address and password from REDIS_URL)."""
    from webapp.celery import app

    proxy = TcpProxy((redis_address.host, redis_address.port))
    proxy.hang()
    url = redis_address.url(host="127.0.0.1", port=proxy.port)
    layers = dict(settings.CHANNEL_LAYERS)
    cfg = dict(layers["default"]["CONFIG"])
    cfg["hosts"] = [{**cfg["hosts"][0], "address": url}]
    settings.CHANNEL_LAYERS = {"default": {**layers["default"], "CONFIG": cfg}}  # channels resets layers
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": url}}  # Django resets caches
    monkeypatch.setattr(queries, "_cache_paused_until", 0.0)
    old_broker = app.conf.broker_url
    app.conf.broker_url = url
    yield proxy
    app.conf.broker_url = old_broker
    proxy.close()


def _in_thread(fn, limit: float = 60.0):
    """Run ``fn`` in a thread; a call that never returns fails the test instead of hanging it."""
    box: dict = {}

    def target() -> None:
        from django.db import connection

        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc
        finally:
            connection.close()  # this thread's own connection

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"{fn} still blocked after {limit} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_a_hung_redis_never_stalls_storing_or_requests(hung_redis, researcher):
    run = Run.objects.create(name="hung", config={}, status="running")
    sink = Recorder(run.pk, broadcast_timeout=0.5)
    for step in range(30):
        sink.metrics(step, {"train/reward_mean": float(step), "train/kl": 0.0})
        _in_thread(sink.flush)  # every flush is stored although no broadcast gets through
    _in_thread(sink.close)
    assert MetricPoint.objects.filter(run=run).count() == 60
    assert sink._broadcaster.sent == 0 and sink._broadcaster.failures >= 1
    # After a failed send the recorder stops trying for a while instead of waiting on every flush.
    assert sink._broadcaster.failures < sink.flushes
    # Chart data is read from PostgreSQL when the cache hangs (after one timeout, without asking it).
    for _ in range(2):
        series = _in_thread(lambda: queries.metric_series(run.pk, "train/reward_mean"))
        assert series["x"] == list(range(30)) and series["y"][-1] == 29.0
    # A status broadcast from a request gives up at its timeout.
    assert _in_thread(lambda: broadcast(run.pk, {"type": "status"}, timeout=0.5)) is False
    # Launch answers with a clear message and keeps the run as a draft.
    with pytest.raises(BrokerUnavailable) as err:
        _in_thread(lambda: lifecycle.launch_run(tiny(n_iters=1), user=researcher))
    assert "broker" in str(err.value)
    assert Run.objects.exclude(pk=run.pk).get().status == RunStatus.DRAFT


async def test_a_hung_redis_closes_the_websocket_with_a_reason(hung_redis, researcher):
    run = await database_sync_to_async(Run.objects.create)(name="hung", config={}, status="running")
    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    headers.append((b"cookie", (await database_sync_to_async(session_cookie)(researcher)).encode()))
    comm = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=headers)
    assert (await comm.connect(timeout=30))[0]
    msg = await comm.receive_json_from(timeout=30)
    assert msg == {"type": "error", "error": "live updates unavailable"}
    out = await comm.receive_output(timeout=30)
    # 4503, not 1011: daphne refuses 1011 from an application (the close raised there); the page retries.
    assert out["type"] == "websocket.close" and out["code"] == protocol.CLOSE_UNAVAILABLE
