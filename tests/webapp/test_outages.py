"""Outages of the real services, injected with a TCP proxy the test controls.

PostgreSQL: a real Celery worker reaches the database only through the proxy; cutting it (every
open connection dropped, new ones refused) makes the database unreachable for the worker while the
test still sees it. Redis: a proxy that accepts connections and never answers is a hung Redis.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from webapp.asgi import application
from webapp.runs import lifecycle, queries
from webapp.runs.broadcast import broadcast
from webapp.runs.errors import BrokerUnavailable
from webapp.runs.models import MetricPoint, Run, RunLog, RunStatus
from webapp.runs.recorder import Recorder

pytestmark = pytest.mark.django_db(transaction=True)


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``upstream``. ``cut()``: drop every connection and refuse new
    ones (a network partition, a dead server); ``hang()``: accept and read, never answer (a hung
    server); ``restore()``: forward again."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.mode = "forward"
        self.refused = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.mode == "cut":
                self.refused += 1
                client.close()
                continue
            if self.mode == "hang":
                with self._lock:
                    self._open.append(client)
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            try:
                up = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, up]
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @staticmethod
    def _swallow(client: socket.socket) -> None:
        try:
            while client.recv(65536):
                pass
        except OSError:
            pass

    def _drop_all(self) -> None:
        with self._lock:
            conns, self._open = self._open, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def cut(self) -> None:
        self.mode = "cut"
        self._drop_all()

    def hang(self) -> None:
        self.mode = "hang"
        self._drop_all()

    def restore(self) -> None:
        self.mode = "forward"

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self._drop_all()


def tiny(n_iters: int) -> dict:
    return {
        "name": "outage",
        "model": {"name_or_path": "builtin:tiny-gpt2", "device": "cpu"},
        "task": {"id": "synthetic_increasing_numbers", "max_train_samples": 8, "max_eval_samples": 2},
        "reward": {"id": "increasing_numbers"},
        "rollout": {"max_new_tokens": 4, "batch_size": 2},
        "algorithm": {"id": "ppo", "n_epochs": 1, "minibatch_size": 2},
        "train": {
            "n_iters": n_iters,
            "prompts_per_iter": 2,
            "eval_every": 0,
            "save_every": 0,
            "log_samples": 2,
            "save_final_model": False,
        },
        "eval": {"generation": {"max_new_tokens": 4, "do_sample": False}},
    }


@pytest.fixture
def pg_proxy():
    from django.db import connection

    s = connection.settings_dict
    proxy = TcpProxy((s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)))
    yield proxy
    proxy.close()


def _worker_through(worker_factory, proxy: TcpProxy, give_up_s: float):
    from django.db import connection

    s = connection.settings_dict
    url = f"postgres://{s['USER']}@127.0.0.1:{proxy.port}/{s['NAME']}"
    return worker_factory(extra_env={"DATABASE_URL": url, "GRUE_RECORDER_GIVE_UP_S": str(give_up_s)})


def _jsonl_points(run_dir: Path) -> dict[tuple[str, int], float | None]:
    """What the engine itself wrote: the ground truth the database must match."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        obj = json.loads(line)
        for k, v in obj.items():
            if k in ("step", "phase", "time") or isinstance(v, bool):
                continue
            if v is None or isinstance(v, float | int):  # None: a NaN the engine wrote as null
                out[(k, obj["step"])] = None if v is None else float(v)
    return out


def test_a_database_outage_is_ridden_out_and_every_point_stored_once(
    worker_factory, pg_proxy, settings, wait_for, researcher
):
    worker = _worker_through(worker_factory, pg_proxy, give_up_s=600)
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
    truth = _jsonl_points(Path(run.run_dir))
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
    worker_factory, pg_proxy, settings, wait_for, researcher
):
    worker = _worker_through(worker_factory, pg_proxy, give_up_s=3)
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
def hung_redis(settings, monkeypatch):
    """Channels, the cache-less broadcast path and Celery pointed at a Redis that never answers."""
    from webapp.celery import app

    proxy = TcpProxy(("127.0.0.1", 6379))
    proxy.hang()
    url = f"redis://127.0.0.1:{proxy.port}/0"
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
    def cookie() -> str:
        from django.conf import settings
        from django.test import Client

        c = Client()
        c.force_login(researcher)
        return f"{settings.SESSION_COOKIE_NAME}={c.cookies[settings.SESSION_COOKIE_NAME].value}"

    run = await database_sync_to_async(Run.objects.create)(name="hung", config={}, status="running")
    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    headers.append((b"cookie", (await database_sync_to_async(cookie)()).encode()))
    comm = WebsocketCommunicator(application, f"/ws/runs/{run.pk}/", headers=headers)
    assert (await comm.connect(timeout=30))[0]
    msg = await comm.receive_json_from(timeout=30)
    assert msg == {"type": "error", "error": "live updates unavailable"}
    out = await comm.receive_output(timeout=30)
    assert out["type"] == "websocket.close" and out["code"] == 1011  # the page retries with backoff
