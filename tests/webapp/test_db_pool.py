"""The web server borrows PostgreSQL connections from a pool (issue #15: a new connection per request
was a quarter of a chart-data request). A real daphne subprocess (``webapp.asgi`` turns the pool on)
must serve many requests over the same backends, and survive the database killing them."""

from __future__ import annotations

import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from tests.conftest import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def _server_backends(db_name: str) -> set[int]:
    """PIDs of the backends connected to the test database, other than this test's own."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [db_name]
        )
        return {r[0] for r in cur.fetchall()}


def _get(url: str, cookie: str) -> str:
    """The page's HTML; a redirect to the login page fails (the session must be read from the
    database: with a misconfigured pool the session middleware saw no session at all)."""
    req = urllib.request.Request(url, headers={"Cookie": cookie})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert "/accounts/login/" not in resp.url, "the server did not read the session"
        return resp.read().decode()


def test_requests_reuse_pooled_connections_and_survive_killed_backends(
    asgi_server, researcher, test_db_name, wait_for
):
    cookie = session_cookie(researcher)  # every request reads its session and user from the database
    url = f"{asgi_server.url}/"  # the run table
    assert 'class="runs-table"' in _get(url, cookie)
    before = _server_backends(test_db_name)
    assert before, "the server keeps its connection after the request (pooled)"
    for _ in range(10):
        assert 'class="runs-table"' in _get(url, cookie)
    after = _server_backends(test_db_name)
    assert after == before  # no connection opened or closed per request

    # Concurrent requests fill the pool with several connections, as a busy server's is.
    with ThreadPoolExecutor(8) as pool:
        assert all('class="runs-table"' in html for html in pool.map(lambda _: _get(url, cookie), range(32)))
    before = _server_backends(test_db_name)
    assert len(before) >= 3, before

    # The database kills the pooled backends (a restart looks the same to the server): the pool
    # checks a connection before lending it, so the next request still succeeds on a fresh one. With
    # psycopg's own check, the backoff between failed checks (1 s, 2 s, 4 s …) made the first request
    # after killing eight connections time out (HTTP 500); webapp/pgpool sweeps them in one pass.
    # pg_terminate_backend only signals the backend; on a loaded machine it can still answer the
    # pool's check before it exits (a race a restart does not have), so wait until it is gone.
    with connection.cursor() as cur:
        for pid in before:
            cur.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_for(
        lambda: not (_server_backends(test_db_name) & before), timeout=30, what="the killed backends exiting"
    )
    for _ in range(3):
        assert 'class="runs-table"' in _get(url, cookie)
    assert _server_backends(test_db_name).isdisjoint(before)


def test_importing_the_asgi_app_leaves_no_pool_setting_for_child_processes(monkeypatch):
    """The pool is for the server process only: ``webapp.asgi`` must not leave GRUE_DB_POOL in the
    environment, or every process started later (the suite's workers, ``manage.py up``'s children)
    would inherit it and keep idle pooled connections (``up`` then failed to stop in time)."""
    import importlib

    import webapp.asgi

    monkeypatch.delenv("GRUE_DB_POOL", raising=False)
    importlib.reload(webapp.asgi)
    assert "GRUE_DB_POOL" not in os.environ
    monkeypatch.setenv("GRUE_DB_POOL", "0")  # an explicit choice is left alone
    importlib.reload(webapp.asgi)
    assert os.environ["GRUE_DB_POOL"] == "0"


def test_the_server_process_freezes_its_start_up_objects():
    """A server process's full garbage collections must not walk the objects of its start-up: they
    took ~100 ms each, so one chart-data request in a few took 140 ms instead of 30 (issue #15)."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import gc, webapp.asgi; print(gc.get_freeze_count())"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, cwd=root
    )
    frozen = int(out.stdout.split()[-1])
    assert frozen > 50_000, frozen  # Django, the apps and their imports are in the permanent generation
