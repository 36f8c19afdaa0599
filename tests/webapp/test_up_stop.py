"""Stopping ``manage.py up`` during a run (issue 29 item 7): the worker stops the run at its next step
with a checkpoint and exits (measured: ``up`` gone 8.6 s after Ctrl-C on a loaded 2-core machine,
not asserted here: no timing in tests), and the run is left ``lost``
with the reason "Interrupted at iteration N …" (status and log tail), and the next ``up`` resumes it
from that checkpoint by itself. Before, the worker waited for the run to end, ``up`` killed it after
30 s, and the run stayed ``running`` until the next ``up`` marked it lost as if its worker had crashed.

Real parts: ``up`` with its own embedded PostgreSQL and Redis in a temporary data directory, its
Celery worker and watchdog, the API with a token made through the settings page.
"""

from __future__ import annotations

import http.cookiejar
import re
import shutil
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import tiny_run_config
from tests.webapp.test_up import _free_port, _start_up, _stop


def _session(port: int) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"http://127.0.0.1:{port}/accounts/login/", timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    data = urllib.parse.urlencode(
        {"username": "boss", "password": "correct-horse-42", "csrfmiddlewaretoken": token, "next": "/"}
    ).encode()
    opener.open(
        urllib.request.Request(
            f"http://127.0.0.1:{port}/accounts/login/", data=data,
            headers={"Referer": f"http://127.0.0.1:{port}/accounts/login/"},
        ),
        timeout=60,
    )  # fmt: skip
    return opener


def _api_token(opener: urllib.request.OpenerDirector, port: int) -> str:
    url = f"http://127.0.0.1:{port}/settings/tokens/"
    page = opener.open(url, timeout=30).read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    data = urllib.parse.urlencode({"name": "stop-test", "csrfmiddlewaretoken": csrf}).encode()
    page = opener.open(urllib.request.Request(url, data=data, headers={"Referer": url}), timeout=30)
    return re.search(r"grue_[A-Za-z0-9_-]{20,}", page.read().decode()).group(0)


def _wait_up(proc: Any, out: Path, wait_for: Any) -> None:
    def up() -> bool:
        assert proc.poll() is None, out.read_text()[-4000:]
        return "GRUE Studio is up" in out.read_text()

    wait_for(up, timeout=600, interval=0.5, what="manage.py up ready")


@pytest.mark.timeout(1500)
def test_stopping_up_during_a_run_interrupts_it_resumably_and_the_next_up_resumes_it(wait_for):
    from engine.client import Client

    data_dir = Path(tempfile.mkdtemp(prefix="grue-up-stop-")) / "var"
    port = _free_port()
    proc, out = _start_up(data_dir, port)
    try:
        _wait_up(proc, out, wait_for)
        token = _api_token(_session(port), port)
        client = Client(
            f"http://127.0.0.1:{port}", token, timeout=120
        )  # a cold first launch on a busy machine
        run_id = client.create_run(tiny_run_config(2000, "stop-me", save_every=0), launch=True)["id"]
        wait_for(
            lambda: (client.run(run_id)["current_iter"] or 0) >= 3, timeout=600, interval=0.5,
            what="the run training",
        )  # fmt: skip
        _stop(proc)  # SIGINT, as Ctrl-C; waits for up to exit
        assert out.read_text().rstrip().endswith("stopped")

        # The next up (no worker, so the resumed run waits where the test can see it).
        proc, out = _start_up(data_dir, port, "--no-worker")
        _wait_up(proc, out, wait_for)
        run = wait_for(
            lambda: (r := client.run(run_id))["status"] == "queued" and r,
            timeout=300, interval=0.5, what="the interrupted run resumed by the watchdog",
        )  # fmt: skip
        assert run["status"] == "queued" and run["current_iter"] < 2000
        opener, run_page = _session(port), f"http://127.0.0.1:{port}/runs/{run_id}/"
        resumed_line = "interrupted by a shutdown; resumed automatically from its checkpoint"
        # The watchdog logs its line right after it commits the resume: wait for it, not the status.
        page = wait_for(
            lambda: resumed_line in (text := opener.open(run_page, timeout=30).read().decode()) and text,
            timeout=60, interval=0.5, what="the watchdog's resume line on the run page",
        )  # fmt: skip
        assert "Interrupted at iteration" in page  # the log tail says why it stopped ...
        assert resumed_line in page  # ... and resumed
        points = client.metric_series(run_id, ["train/reward_mean"])["train/reward_mean"]["steps"]
        assert points == list(range(1, len(points) + 1))  # every step up to the interruption, once
    finally:
        if proc.poll() is None:
            _stop(proc)
            proc.wait(timeout=300)
        shutil.rmtree(data_dir.parent, ignore_errors=True)
