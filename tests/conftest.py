"""Shared fixtures for the whole suite: users of each role, logged-in clients, a REAL Celery
worker process and a REAL daphne server against pytest-django's test database, and ``wait_for``.

Another process only sees committed rows: tests that use ``celery_worker`` or ``asgi_server``
must be ``@pytest.mark.django_db(transaction=True)``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- services

NO_SERVICES_MESSAGE = """\
These tests need PostgreSQL and Redis, and DATABASE_URL / REDIS_URL are not set.
  make test PYTEST_ARGS="{args}"
      starts an embedded PostgreSQL and Redis for the run (nothing to install), or
  .venv/bin/python -m webapp.embedded run-with-services -- .venv/bin/python -m pytest {args}
      does the same for any pytest command, or
  DATABASE_URL=postgres://USER:PASSWORD@HOST:PORT/DB REDIS_URL=redis://:PASSWORD@HOST:PORT/N pytest ...
      uses services you run (pytest-django creates and drops its own test database).
The engine tests alone (tests/engine) need neither."""


def _needs_services(path: Path) -> bool:
    """Every test outside tests/engine, and the engine files that talk to the web app, use the
    database or Redis (the same split as tests/run_suite.py's two halves)."""
    from tests.run_suite import ENGINE_WITH_SERVICES

    rel = path.resolve().relative_to(ROOT).as_posix() if path.resolve().is_relative_to(ROOT) else ""
    return not rel.startswith("tests/engine/") or rel in ENGINE_WITH_SERVICES


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[Any]) -> None:
    """Stop before running anything when services are needed and not given. Without this the
    settings' development defaults (127.0.0.1:5432 and :6379) were used silently: on a machine
    without them every test errored, and on one with them the suite wrote into whatever they were."""
    missing = [v for v in ("DATABASE_URL", "REDIS_URL") if not os.environ.get(v)]
    if missing and any(_needs_services(Path(str(item.path))) for item in items):
        args = " ".join(config.invocation_params.args) or "tests"
        pytest.exit(
            f"{' and '.join(missing)} not set.\n" + NO_SERVICES_MESSAGE.format(args=args), returncode=4
        )


@dataclass(frozen=True)
class PgTcp:
    """Where the suite's PostgreSQL answers over TCP, with the credentials to log in there."""

    host: str
    port: int
    user: str
    password: str

    def url(self, dbname: str, host: str | None = None, port: int | None = None) -> str:
        """A URL for ``dbname`` with these credentials (``host``/``port``: a proxy in front)."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        return f"postgres://{auth}@{host or self.host}:{port or self.port}/{quote(dbname, safe='')}"


@pytest.fixture(scope="session")
def pg_tcp() -> PgTcp:
    """TCP access to the suite's PostgreSQL (for a proxy that cuts or hangs it): the settings' own
    host when it is a TCP host, else the embedded server's loopback port (GRUE_DATABASE_TCP_URL,
    exported by ``webapp.embedded run-with-services``). Never an assumed 127.0.0.1:5432."""
    import dj_database_url
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["HOST"] and not str(db["HOST"]).startswith("/"):
        return PgTcp(str(db["HOST"]), int(db["PORT"] or 5432), db["USER"], db["PASSWORD"] or "")
    tcp_url = os.environ.get("GRUE_DATABASE_TCP_URL")
    if not tcp_url:
        pytest.fail(
            f"this test needs TCP access to PostgreSQL, but DATABASE_URL is a unix socket ({db['HOST'] or 'default'}) "
            "and GRUE_DATABASE_TCP_URL is not set: run it under `make test` or "
            "`python -m webapp.embedded run-with-services -- pytest ...` (the embedded server listens on a "
            "loopback port too), or set GRUE_DATABASE_TCP_URL=postgres://USER:PASSWORD@HOST:PORT/DB for the "
            "same server"
        )
    t = dj_database_url.parse(tcp_url)
    return PgTcp(str(t["HOST"]), int(t["PORT"] or 5432), t["USER"], t["PASSWORD"] or "")


@dataclass(frozen=True)
class RedisAddress:
    host: str
    port: int
    password: str
    db: int

    def url(self, host: str | None = None, port: int | None = None) -> str:
        """A URL with this password and database (``host``/``port``: a proxy in front)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{host or self.host}:{port or self.port}/{self.db}"


@pytest.fixture(scope="session")
def redis_address() -> RedisAddress:
    """The suite's Redis (from REDIS_URL: host, port, password, database), for tests that put a
    proxy in front of it."""
    from urllib.parse import unquote, urlsplit

    from django.conf import settings

    u = urlsplit(settings.REDIS_URL)
    if u.scheme not in ("redis", "rediss") or not u.hostname:
        pytest.fail(f"this test needs Redis over TCP; REDIS_URL is {u.scheme}://…")
    db = int((u.path or "/0").strip("/") or 0)
    return RedisAddress(u.hostname, u.port or 6379, unquote(u.password or ""), db)


def discard_broken_db_connections() -> list[str]:
    """Close every Django connection of this thread that is unusable: broken, closed under Django, or
    still in the middle of a command (a test interrupted during a query, e.g. by its timeout; psycopg
    then answers every later query with "another command is already in progress"). Returns the
    aliases closed. A transaction in error is left alone: the test's rollback ends it."""
    if "django.db" not in sys.modules:
        return []
    from django.db import connections
    from psycopg import pq

    closed = []
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None:
            continue
        status = raw.info.transaction_status
        if raw.closed or raw.broken or status in (pq.TransactionStatus.ACTIVE, pq.TransactionStatus.UNKNOWN):
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - it is broken already; Django opens a new one when asked
                conn.connection = None
            closed.append(conn.alias)
    return closed


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Before the test's fixtures are torn down (pytest-django's rollback or flush among them):
    one test that leaves a broken connection behind must not fail every later test of the process."""
    discard_broken_db_connections()


def wait_for_condition(
    cond: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``cond`` until it returns a truthy value (returned) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = cond()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last_exc = exc
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout}s waiting for {what or getattr(cond, '__name__', 'condition')}"
            if last_exc is not None:
                msg += f" (last error: {last_exc!r})"
            raise AssertionError(msg)
        time.sleep(interval)


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """``wait_for(cond, timeout=30, interval=0.05, what="")``: poll until truthy, else fail."""
    return wait_for_condition


# --------------------------------------------------------------------------- users


def _make_user(username: str, group: str | None, superuser: bool = False) -> Any:
    from django.contrib.auth.models import Group, User

    if superuser:
        user = User.objects.create_superuser(username, f"{username}@example.org", "pw-" + username + "-123")
    else:
        user = User.objects.create_user(username, f"{username}@example.org", "pw-" + username + "-123")
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


@pytest.fixture
def researcher(db: Any) -> Any:
    return _make_user("rita", "researcher")


@pytest.fixture
def annotator(db: Any) -> Any:
    return _make_user("ann", "annotator")


@pytest.fixture
def admin(db: Any) -> Any:
    return _make_user("root", None, superuser=True)


@pytest.fixture
def nobody(db: Any) -> Any:
    """A logged-in user without any role."""
    return _make_user("nobody", None)


def user_password(user: Any) -> str:
    return "pw-" + user.username + "-123"


@pytest.fixture
def password_of() -> Callable[[Any], str]:
    """The password of a fixture user (for real logins through the form or a browser)."""
    return user_password


def session_cookie(user: Any) -> str:
    """A ``Cookie`` header value carrying the user's real session (for websocket tests)."""
    from django.conf import settings
    from django.test import Client

    c = Client()
    c.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={c.cookies[settings.SESSION_COOKIE_NAME].value}"


@pytest.fixture
def researcher_client(client: Any, researcher: Any) -> Any:
    client.force_login(researcher)
    return client


@pytest.fixture
def annotator_client(client: Any, annotator: Any) -> Any:
    client.force_login(annotator)
    return client


@pytest.fixture
def admin_user_client(client: Any, admin: Any) -> Any:
    client.force_login(admin)
    return client


# --------------------------------------------------------------------------- subprocesses


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _subprocess_env(test_db_name: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
    env["GRUE_TEST_DB_NAME"] = test_db_name
    env.setdefault("GRUE_HEARTBEAT_INTERVAL", "0.5")
    # Tests read these processes' logs while they run: daphne writes its access log to stdout without
    # flushing, so a block-buffered stdout (a file) held back lines a test waits for.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


class WorkerProcess:
    """A real ``celery -A webapp worker`` on its own queue, stopped (or killed) by the test."""

    def __init__(
        self,
        test_db_name: str,
        runs_dir: Path,
        queue: str | None = None,
        name: str | None = None,
        extra_env: dict[str, str] | None = None,
    ):
        self.queue = queue or f"test-{uuid.uuid4().hex[:10]}"
        self.name = name or f"{self.queue}@{socket.gethostname()}"
        self.log_path = runs_dir / f"worker-{self.queue}-{uuid.uuid4().hex[:4]}.log"
        env = _subprocess_env(test_db_name, GRUE_RUNS_DIR=str(runs_dir), **(extra_env or {}))
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "webapp",
                "worker",
                "--pool=solo",
                "--concurrency=1",
                "-Q",
                self.queue,
                "-n",
                self.name,
                "--without-gossip",
                "--without-mingle",
                "--loglevel=INFO",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_condition(self._ready, timeout=120, interval=0.2, what=f"celery worker {self.name} ready")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"celery worker exited with {self.proc.returncode}:\n{self.log()[-5000:]}")
        return "ready." in self.log_path.read_text(errors="replace")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL, like an OOM kill or a pulled plug: no cleanup code runs."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def start_watchdog(test_db_name: str, runs_dir: Path, log_path: Path, **env: str) -> subprocess.Popen:
    """``manage.py watch_runs`` (the run watchdog) in its own process group, output to ``log_path``;
    ``env`` overrides its settings (``GRUE_LOST_AFTER``…). Stop it with ``os.killpg(proc.pid, 15)``."""
    with log_path.open("w") as log:
        return subprocess.Popen(
            [sys.executable, "manage.py", "watch_runs"],
            cwd=ROOT,
            env=_subprocess_env(test_db_name, GRUE_RUNS_DIR=str(runs_dir), **env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture(scope="session")
def test_db_name(django_db_setup: Any, django_db_blocker: Any) -> str:
    from django.db import connection

    return connection.settings_dict["NAME"]


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("grue-runs")


@pytest.fixture(scope="session")
def worker_factory(test_db_name: str, runs_dir: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start extra workers (e.g. one to kill): ``worker_factory(queue=None, name=None)``."""
    started: list[WorkerProcess] = []

    def start(**kwargs: Any) -> WorkerProcess:
        w = WorkerProcess(test_db_name, runs_dir, **kwargs)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture(scope="session")
def _session_worker(worker_factory: Callable[..., WorkerProcess]) -> WorkerProcess:
    return worker_factory()


@pytest.fixture
def celery_worker(_session_worker: WorkerProcess, settings: Any) -> WorkerProcess:
    """A real Celery worker process (session-wide) whose queue launches in this test go to."""
    if _session_worker.proc.poll() is not None:
        pytest.fail(f"the session's celery worker died:\n{_session_worker.log()}")
    settings.CELERY_TASK_DEFAULT_QUEUE = _session_worker.queue
    return _session_worker


@pytest.fixture(scope="session")
def _loopback_judge_worker(worker_factory: Callable[..., WorkerProcess]) -> WorkerProcess:
    return worker_factory(extra_env={"GRUE_OUTBOUND_ALLOW": "127.0.0.1"})


@pytest.fixture
def loopback_judge_worker(_loopback_judge_worker: WorkerProcess, settings: Any) -> WorkerProcess:
    """A real Celery worker (session-wide) that may call AI-judge endpoints on 127.0.0.1, as a
    deployment allows its own judge server with ``GRUE_OUTBOUND_ALLOW``; this test's launches and
    judges go to its queue and the test process allows 127.0.0.1 too. The session's ordinary worker
    keeps the default policy (loopback refused)."""
    if _loopback_judge_worker.proc.poll() is not None:
        pytest.fail(f"the judge worker died:\n{_loopback_judge_worker.log()}")
    settings.CELERY_TASK_DEFAULT_QUEUE = _loopback_judge_worker.queue
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]
    return _loopback_judge_worker


class AsgiServer:
    """A real daphne serving ``webapp.asgi:application`` on a free loopback port."""

    def __init__(self, test_db_name: str, runs_dir: Path, queue: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.log_path = runs_dir / f"daphne-{self.port}.log"
        env = _subprocess_env(test_db_name, GRUE_RUNS_DIR=str(runs_dir))
        # The browser fixture's async-unsafe exemption is for the test process only.
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        if queue:
            env["CELERY_QUEUE"] = queue  # launches from this server go to that worker's queue
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "webapp.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_condition(self._ready, timeout=60, interval=0.2, what="daphne listening")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"daphne exited with {self.proc.returncode}:\n{self.log()[-5000:]}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="session")
def asgi_server(test_db_name: str, runs_dir: Path) -> Iterator[AsgiServer]:
    """daphne in a subprocess against the test database (``.url``, ``.ws_url``); for browser tests.
    Use with ``django_db(transaction=True)`` so the server sees the test's rows."""
    server = AsgiServer(test_db_name, runs_dir)
    yield server
    server.stop()


# --------------------------------------------------------------------------- runs and queues


def status_of(run_id: int) -> str:
    """A run's status read fresh from the database (what another process last committed)."""
    from webapp.runs.models import Run

    return Run.objects.values_list("status", flat=True).get(pk=run_id)


def queued_messages(queue: str) -> list[dict[str, Any]]:
    """The Celery messages waiting on ``queue`` in the real broker (as the list holds them)."""
    from django.conf import settings

    r = redis.Redis.from_url(settings.REDIS_URL)
    return [json.loads(m) for m in r.lrange(queue, 0, -1)]


@pytest.fixture
def scratch_queue(settings: Any) -> Iterator[str]:
    """Launches in the test go to a queue no worker reads (so it can look at what was enqueued); the
    queue is deleted afterwards."""
    queue = f"scratch-{uuid.uuid4().hex[:8]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    yield queue
    redis.Redis.from_url(settings.REDIS_URL).delete(queue)


@pytest.fixture(autouse=True)
def _isolated_runs_dir(request: pytest.FixtureRequest, runs_dir: Path) -> None:
    """Every test's runs go to its own folder. Where pytest-django is not installed (a GPU machine
    that runs only the engine's device tests, bench/gpu_check.py) there are no Django settings to
    point: nothing to isolate, and the engine tests still run."""
    if importlib.util.find_spec("pytest_django") is None:
        return
    request.getfixturevalue("settings").RUNS_DIR = runs_dir
