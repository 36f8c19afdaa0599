"""``python manage.py up`` on a machine without PostgreSQL/Redis URLs: embedded services start,
the site serves and accepts the admin login, Ctrl-C stops every child, a second ``up`` finds its data.
``up`` supervises: a SIGKILLed worker, Redis or PostgreSQL comes back while the web keeps answering,
and no process it started survives it. Files it creates are private to its user."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_up(data_dir: Path, port: int, *extra: str) -> tuple[subprocess.Popen, Path]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "GRUE_TEST_DB_NAME")}
    env.update(
        GRUE_DATA_DIR=str(data_dir),
        GRUE_ADMIN_USER="boss",
        GRUE_ADMIN_PASSWORD="correct-horse-42",
        PYTHONUNBUFFERED="1",
    )
    out = data_dir.parent / f"up-{port}.out"
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port), *extra],
        cwd=ROOT,
        env=env,
        stdout=out.open("w"),
        stderr=subprocess.STDOUT,
        # Ctrl-C must reach `up` as it does in a terminal: a suite started as a background job
        # (`cmd &` in a script) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt
        # handler, so the SIGINT of _stop would be lost and `up` never stop.
        preexec_fn=_default_sigint,
    )
    return proc, out


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _login(port: int) -> str:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"http://127.0.0.1:{port}/accounts/login/", timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    data = urllib.parse.urlencode(
        {"username": "boss", "password": "correct-horse-42", "csrfmiddlewaretoken": token, "next": "/"}
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/accounts/login/",
        data=data,
        headers={"Referer": f"http://127.0.0.1:{port}/accounts/login/"},
    )
    return opener.open(req, timeout=60).read().decode()


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)


def _wait_output(wait_for, proc: subprocess.Popen, out: Path, needle: str, what: str, **kw: Any) -> None:
    """Until ``up`` prints ``needle`` (or exits: the caller's assertions then show its output)."""
    kw.setdefault("timeout", 240)
    kw.setdefault("interval", 0.3)
    wait_for(lambda: needle in out.read_text() or proc.poll() is not None, what=what, **kw)


def _assert_stopped_cleanly(proc: subprocess.Popen, out: Path, data_dir: Path) -> str:
    text = out.read_text()
    assert proc.returncode == 0 and "stopped" in text and "Traceback" not in text, text
    assert not (data_dir / "postgres" / "postmaster.pid").exists()
    return text


def test_up_starts_embedded_services_serves_and_stops_cleanly(wait_for):
    # Not under pytest's tmp root: pytest resets that to 0700, which PostgreSQL's own user needs to traverse.
    base = Path(tempfile.mkdtemp(prefix="grue-up-test-"))
    try:
        _up_twice(base / "var", wait_for)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _up_twice(data_dir: Path, wait_for) -> None:
    port = _free_port()
    # One CPU worker and one GPU worker; no GPU here, so the GPU worker's count is given.
    proc, out = _start_up(data_dir, port, "--gpu-workers", "1", "--gpus-per-worker", "2")
    try:
        _wait_output(wait_for, proc, out, "GRUE Studio is up", "up to start")
        text = out.read_text()
        assert proc.poll() is None, text
        assert "embedded PostgreSQL, Redis running" in text
        assert "admin account created: boss" in text
        children = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        assert "webapp.server" in names and "celery" in names and "watch_runs" in names
        # The GPU worker consumes only the GPU queue and advertises 2 GPUs; the CPU worker only the CPU one.
        gpu = _child(proc, "-n grue-gpu1@")
        cpu = _child(proc, "-n grue1@")
        assert gpu is not None and cpu is not None, names
        queue = os.environ.get("CELERY_QUEUE", "runs")
        assert gpu.cmdline()[gpu.cmdline().index("-Q") + 1] == f"{queue}-gpu"
        assert gpu.environ()["GRUE_WORKER_DEVICES"] == "cuda" and gpu.environ()["GRUE_WORKER_GPUS"] == "2"
        assert cpu.cmdline()[cpu.cmdline().index("-Q") + 1] == queue
        assert cpu.environ()["GRUE_WORKER_DEVICES"] == "cpu"
        assert "GPU worker grue-gpu1@" in text and "2 GPU(s)" in text
        gpu_log = data_dir / "logs" / "gpu-worker1.log"
        wait_for(lambda: "ready" in gpu_log.read_text(), timeout=120, what="the GPU worker ready")
        home = _login(port)
        assert "Log out" in home and "boss" in home
        services = (data_dir / "services.json").read_text()
        assert "DATABASE_URL" in services
    finally:
        _stop(proc)
    _assert_stopped_cleanly(proc, out, data_dir)
    for child in children:
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, child

    # second start: same data (the admin exists, nothing is created again), web only this time
    proc, out = _start_up(data_dir, port, "--no-worker")
    try:
        _wait_output(wait_for, proc, out, "GRUE Studio is up", "second up")
        assert "exists; password unchanged" in out.read_text(), out.read_text()
        assert "Log out" in _login(port)
        # Ctrl-C, and Ctrl-C again while it stops: the second one is acknowledged, not obeyed, so the
        # shutdown still stops the server and PostgreSQL (an interrupted one would leave them running).
        proc.send_signal(signal.SIGINT)
        _wait_output(wait_for, proc, out, "stopping ...", "stopping", timeout=60, interval=0.1)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    finally:
        _stop(proc)
    _assert_stopped_cleanly(proc, out, data_dir)

    # third start, interrupted while it prepares the database (migrations run in a child process):
    # it stops as cleanly, without serving and without a traceback
    proc, out = _start_up(data_dir, port, "--no-worker")
    try:
        _wait_output(
            wait_for, proc, out, "embedded PostgreSQL, Redis running", "third up's services", interval=0.1
        )
    finally:
        _stop(proc)
    text = _assert_stopped_cleanly(proc, out, data_dir)
    assert "stopping ..." in text and "GRUE Studio is up" not in text, text


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _status(port: int) -> int:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=30).status
    except OSError:
        return 0


def _child(proc: subprocess.Popen, needle: str) -> psutil.Process | None:
    for c in psutil.Process(proc.pid).children(recursive=True):
        try:
            if needle in " ".join(c.cmdline()):
                return c
        except psutil.NoSuchProcess:
            continue
    return None


def test_up_restarts_killed_children_and_services_and_leaves_no_orphans(wait_for):
    base = Path(tempfile.mkdtemp(prefix="grue-up-test-"))
    data_dir = base / "var"
    port = _free_port()
    proc, out = _start_up(data_dir, port)
    seen: list[psutil.Process] = []
    try:
        _wait_output(wait_for, proc, out, "GRUE Studio is up", "up to start")
        assert proc.poll() is None, out.read_text()
        seen += psutil.Process(proc.pid).children(recursive=True)

        # Private files (umask 077, secret key and passwords 0600, data and log dirs not listable).
        assert _mode(data_dir) & 0o066 == 0
        for d in ("logs", "redis", "secrets"):
            assert _mode(data_dir / d) == 0o700, d
        for f in (
            "secret_key",
            "services.json",
            "redis/password",
            "redis/redis.conf",
            "redis/appendonly.aof",
        ):
            assert _mode(data_dir / f) == 0o600, f
        for log in (data_dir / "logs").iterdir():
            assert _mode(log) == 0o600, log
        assert "rename-command CONFIG" in (data_dir / "redis" / "redis.conf").read_text()
        # The children connect as a data-only role: it reads and writes rows, it cannot change the schema.
        state = json.loads((data_dir / "services.json").read_text())
        assert state["DATABASE_URL_APP"].startswith("postgres://grue_app:")
        with psycopg.connect(state["DATABASE_URL_APP"], autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM auth_user").fetchone()[0] >= 1
            assert not conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[
                0
            ]
            for ddl in (
                "CREATE TABLE grue_probe (i int)",
                "DROP TABLE auth_user",
                "ALTER TABLE auth_user ADD x int",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(ddl)

        # SIGKILL the worker: the web keeps answering, a new worker process comes up.
        worker = _child(proc, "celery")
        worker.kill()
        wait_for(
            lambda: (w := _child(proc, "celery")) is not None and w.pid != worker.pid,
            timeout=60,
            what="a new worker",
        )
        assert _status(port) == 200
        wait_for(lambda: "restarted (pid" in out.read_text(), timeout=30, what="the restart report")
        assert "was killed by SIGKILL; restarting" in out.read_text()
        seen += psutil.Process(proc.pid).children(recursive=True)

        # SIGKILL the embedded Redis and PostgreSQL: both come back, and so does the site.
        _child(proc, "redis-server").kill()
        pg_pid = int((data_dir / "postgres" / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pg_pid, signal.SIGKILL)
        wait_for(lambda: "embedded Redis had exited" in out.read_text(), timeout=60, what="Redis restart")
        wait_for(
            lambda: "embedded PostgreSQL had stopped; restarted" in out.read_text(),
            timeout=120,
            what="PostgreSQL restart",
        )
        wait_for(lambda: _status(port) == 200, timeout=60, interval=0.5, what="site answering again")
        assert "Log out" in _login(port)  # session in PostgreSQL, through a fresh connection
        seen += psutil.Process(proc.pid).children(recursive=True)
        assert proc.poll() is None
    finally:
        _stop(proc)
        try:
            text = out.read_text()
            assert proc.returncode == 0, text
            assert "stopped" in text
            # No orphan: every process up ever started (workers, watchdog, web, Redis) is gone.
            try:
                wait_for(
                    lambda: not any(_alive(c) for c in seen),
                    timeout=10,
                    interval=0.2,
                    what="every child of up to exit",
                )
            except AssertionError:
                pass  # the assertion below names the survivors
            left = [c for c in seen if _alive(c)]
            assert not left, left
            assert not (data_dir / "postgres" / "postmaster.pid").exists()
        finally:
            shutil.rmtree(base, ignore_errors=True)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_up_refuses_debug_on_a_public_address():
    base = Path(tempfile.mkdtemp(prefix="grue-up-test-"))
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.update(GRUE_DATA_DIR=str(base / "var"))
        res = subprocess.run(
            [sys.executable, "manage.py", "up", "--debug", "--host", "0.0.0.0", "--port", str(_free_port())],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode != 0
        assert "refusing --debug on 0.0.0.0" in res.stderr + res.stdout
        assert not (base / "var" / "postgres").exists()  # refused before anything started
    finally:
        shutil.rmtree(base, ignore_errors=True)
