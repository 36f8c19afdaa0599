"""``python manage.py up`` on a machine without PostgreSQL/Redis URLs: embedded services start,
the site serves and accepts the admin login, Ctrl-C stops every child, a second ``up`` finds its data."""

from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

import psutil

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
    )
    return proc, out


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


def test_up_starts_embedded_services_serves_and_stops_cleanly(wait_for):
    # Not under pytest's tmp root: pytest resets that to 0700, which PostgreSQL's own user needs to traverse.
    base = Path(tempfile.mkdtemp(prefix="grue-up-test-"))
    try:
        _up_twice(base / "var", wait_for)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _up_twice(data_dir: Path, wait_for) -> None:
    port = _free_port()
    proc, out = _start_up(data_dir, port)
    try:
        wait_for(
            lambda: "GRUE Studio is up" in out.read_text() or proc.poll() is not None,
            timeout=240,
            interval=0.3,
            what="up to start",
        )
        text = out.read_text()
        assert proc.poll() is None, text
        assert "embedded PostgreSQL, Redis running" in text
        assert "admin account created: boss" in text
        children = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        assert "daphne" in names and "celery" in names
        home = _login(port)
        assert "Log out" in home and "boss" in home
        services = (data_dir / "services.json").read_text()
        assert "DATABASE_URL" in services
    finally:
        _stop(proc)
    text = out.read_text()
    assert proc.returncode == 0, text
    assert "stopped" in text
    for child in children:
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, child
    assert not (data_dir / "postgres" / "postmaster.pid").exists()

    # second start: same data (the admin exists, nothing is created again), web only this time
    proc, out = _start_up(data_dir, port, "--no-worker")
    try:
        wait_for(
            lambda: "GRUE Studio is up" in out.read_text() or proc.poll() is not None,
            timeout=240,
            interval=0.3,
            what="second up",
        )
        assert "exists; password unchanged" in out.read_text(), out.read_text()
        assert "Log out" in _login(port)
    finally:
        _stop(proc)
    assert proc.returncode == 0
    assert not (data_dir / "postgres" / "postmaster.pid").exists()
