"""The suite runs on any machine (issues 25.1 and 31.8): it gets PostgreSQL and Redis from its
settings or from the embedded servers, never from assumed ports; plain pytest without services stops
at once and says how to get them; a test that leaves a broken database connection does not fail the
tests after it; missing system packages are named with the command that installs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from engine.metrics.base import MetricError
from engine.metrics.meteor import ensure_wordnet
from tests.conftest import ROOT, discard_broken_db_connections
from tests.e2e.conftest import require_chromium
from webapp.embedded import EmbeddedPostgres


def _pytest_without_services(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "GRUE_DATABASE_TCP_URL")
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_plain_pytest_without_services_stops_and_says_how_to_get_them():
    """Before: the settings' defaults (127.0.0.1:5432 and :6379) were used silently."""
    out = _pytest_without_services("tests/webapp/test_paths.py")
    text = out.stdout + out.stderr
    assert out.returncode == 4, text[-3000:]
    assert "DATABASE_URL and REDIS_URL not set" in text
    assert "make test" in text and "webapp.embedded run-with-services" in text
    assert " passed" not in text and " error" not in text  # nothing ran
    # The engine tests need no services and still run.
    engine = _pytest_without_services("tests/engine/test_netguard.py", "-k", "numeric")
    assert engine.returncode == 0, (engine.stdout + engine.stderr)[-3000:]


@pytest.mark.django_db(transaction=True)
def test_pg_tcp_reaches_the_suites_database_with_its_credentials(pg_tcp, test_db_name):
    """The TCP address tests use for proxies is the suite's own server, logged into with the suite's
    credentials: the settings' host, or the embedded server's loopback port, never 5432 assumed."""
    with psycopg.connect(pg_tcp.url(test_db_name), connect_timeout=10) as conn:
        port, db = conn.execute("SELECT inet_server_port(), current_database()").fetchone()
        server_id = conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0]
    assert port == pg_tcp.port and db == test_db_name  # TCP (a socket has no port)
    with connection.cursor() as cur:
        cur.execute("SELECT system_identifier FROM pg_control_system()")
        assert cur.fetchone()[0] == server_id  # the same server the suite's settings name
    if str(connection.settings_dict["HOST"]).startswith("/"):
        assert pg_tcp.port != 5432  # the embedded server's own port


@pytest.mark.django_db(transaction=True)
def test_a_connection_left_in_the_middle_of_a_command_is_discarded():
    """A test interrupted during a query (its timeout, say) left psycopg answering every later query
    with "another command is already in progress": 75 tests errored after one failure."""
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    connection.connection.pgconn.send_query(b"SELECT 1")  # sent, its result never read
    with pytest.raises(Exception, match="another command is already in progress"):
        with connection.cursor() as cur:
            cur.execute("SELECT 2")
    assert discard_broken_db_connections() == ["default"]
    with connection.cursor() as cur:
        cur.execute("SELECT 3")
        assert cur.fetchone() == (3,)
    assert discard_broken_db_connections() == []  # a healthy connection is kept


def test_embedded_postgres_listens_on_a_loopback_port_with_a_password(tmp_path: Path):
    """``run-with-services`` gives tests TCP to the embedded server: a free loopback port, and a
    login there needs the superuser's password (the socket stays in its private directory)."""
    pg = EmbeddedPostgres(tmp_path / "data", tcp=True)
    try:
        pg.start()
        assert pg.tcp_port and pg.tcp_port != 5432
        assert pg.tcp_url.startswith("postgres://postgres:") and f"@127.0.0.1:{pg.tcp_port}/" in pg.tcp_url
        with psycopg.connect(pg.tcp_url, connect_timeout=10) as conn:
            assert conn.execute("SELECT inet_server_port()").fetchone()[0] == pg.tcp_port
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(f"postgres://postgres@127.0.0.1:{pg.tcp_port}/grue", connect_timeout=10)
        with psycopg.connect(pg.url, connect_timeout=10) as conn:  # the socket URL still works
            assert conn.execute("SELECT inet_server_port()").fetchone()[0] is None
    finally:
        pg.stop()


def test_missing_system_packages_are_named_with_the_command_that_installs_them(tmp_path: Path):
    with pytest.raises(MetricError, match="make system-packages"):
        ensure_wordnet(source=tmp_path / "empty", nltk_dir=tmp_path / "nltk")
    with pytest.raises(pytest.fail.Exception, match="make system-packages"):
        require_chromium(str(tmp_path / "no-chromium"))
