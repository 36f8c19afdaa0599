"""Safe defaults and hardening (issue 14 items 4, 5, 10; issue 16 items 1, 3, 6), against the real
services: the Redis cache never unpickles, Celery refuses pickle, logins are throttled, passwords are
validated, pages carry a CSP, ``check --deploy`` passes with the documented production settings, and
a 200 MB body is refused by the real server before it is buffered."""

from __future__ import annotations

import os
import re
import secrets
import socket
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.cache import cache
from django.core.exceptions import ValidationError

from tests.conftest import ROOT, _subprocess_env, free_port, wait_for_condition
from webapp.private import read_or_create_secret
from webapp.runs.ingest import ingest_metrics
from webapp.runs.models import Run
from webapp.security import JsonSerializer, _throttle_key


class _Payload:
    """Unpickling this creates a directory: proof that somebody ran code from the stored bytes."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


# --------------------------------------------------------------------------- cache and broker


@pytest.mark.django_db
def test_a_pickle_planted_in_the_cache_is_never_unpickled(researcher_client, tmp_path):
    import pickle

    run = Run.objects.create(name="cache-victim", config={})
    ingest_metrics(run.pk, [("train/reward_mean", s, float(s)) for s in range(1, 6)])
    url = f"/runs/{run.pk}/series.json"
    first = researcher_client.get(url)
    assert first.status_code == 200
    client = cache._cache.get_client(write=True)
    keys = client.keys(cache.make_key("grue:series:*"))
    assert keys, "the chart-data path should have cached its series"
    marker = tmp_path / "pwned"
    for key in keys:
        client.set(key, pickle.dumps(_Payload(marker)))
    second = researcher_client.get(url)
    assert second.status_code == 200
    assert not marker.exists()
    assert second.json()["series"] == first.json()["series"]  # the planted bytes were a cache miss
    with pytest.raises(ValueError):
        JsonSerializer().loads(pickle.dumps(_Payload(marker)))
    assert not marker.exists()


def test_a_value_that_is_not_json_in_the_cache_is_a_miss():
    """Issue 25.5: ``cache.get`` raised the serializer's ValueError for planted bytes, so any caller
    without its own guard failed instead of recomputing."""
    raw = cache._cache.get_client(write=True)
    cache.set("h25:good", {"a": 1}, 60)
    for planted in (b"\x80\x04not json", b"{oops", b"\xff\xfe"):
        raw.set(cache.make_key("h25:planted"), planted)
        assert cache.get("h25:planted", "miss") == "miss"
        assert cache.get("h25:planted") is None
        assert cache.get_many(["h25:planted", "h25:good"]) == {"h25:good": {"a": 1}}
        assert cache.get_or_set("h25:planted", {"fresh": True}, 60) == {"fresh": True}
        assert cache.get("h25:planted") == {"fresh": True}  # recomputed and stored again
    cache.delete_many(["h25:planted", "h25:good"])


def test_cache_serializer_round_trips_json_and_keeps_integers_raw():
    s = JsonSerializer()
    value = {"series": {"a": {"x": [1, 2], "y": [0.5, None]}}, "n": 3}
    assert s.loads(s.dumps(value)) == value
    assert s.dumps(7) == 7 and s.loads(b"7") == 7  # incr/decr stay atomic in Redis


@pytest.mark.django_db(transaction=True)
def test_celery_worker_refuses_a_pickled_message(celery_worker, tmp_path):
    from kombu import Producer

    from webapp.celery import app

    assert app.conf.accept_content == ["json"]
    assert app.conf.task_serializer == "json" and app.conf.result_serializer == "json"
    marker = tmp_path / "pwned-by-celery"
    with app.connection_for_write() as conn:
        Producer(conn.default_channel).publish(
            {"args": [_Payload(marker)]},
            serializer="pickle",
            exchange="",
            routing_key=celery_worker.queue,
            headers={"task": "webapp.runs.tasks.mark_lost_runs", "id": uuid.uuid4().hex, "lang": "py"},
        )
    wait_for_condition(
        lambda: "untrusted content of type pickle" in celery_worker.log(), timeout=60, what="worker refusal"
    )
    assert not marker.exists()


# --------------------------------------------------------------------------- logins and passwords


@pytest.mark.django_db
def test_logins_are_throttled_per_user_and_address(client, researcher, password_of, settings):
    for name in ("rita", "someone-else"):
        cache.delete(_throttle_key(name, "127.0.0.1"))
    url = "/accounts/login/"
    for _ in range(settings.GRUE_LOGIN_MAX_FAILURES):
        r = client.post(url, {"username": "rita", "password": "wrong-password"})
        assert r.status_code == 200  # the form again, with its error
    # Even the right password is refused now, with 429 and a clear message.
    r = client.post(url, {"username": "rita", "password": password_of(researcher)})
    assert r.status_code == 429
    assert "Too many failed logins" in r.content.decode() and r["Retry-After"]
    assert "_auth_user_id" not in client.session
    # Another account from the same address is not affected.
    r = client.post(url, {"username": "someone-else", "password": "wrong-password"})
    assert r.status_code == 200
    cache.delete(_throttle_key("rita", "127.0.0.1"))
    r = client.post(url, {"username": "rita", "password": password_of(researcher)})
    assert r.status_code == 302


def test_password_validators_refuse_weak_passwords():
    for weak in ("12345678", "password123", "1234567890"):
        with pytest.raises(ValidationError):
            validate_password(weak)
    validate_password("correct-horse-battery-42")


# --------------------------------------------------------------------------- headers and settings


@pytest.mark.django_db
def test_pages_carry_a_csp_and_inline_scripts_its_nonce(client, researcher_client):
    r1, r2 = client.get("/accounts/login/"), client.get("/accounts/login/")
    csp = r1["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "object-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert csp != r2["Content-Security-Policy"]  # a fresh nonce per response
    page = researcher_client.get("/grue/")
    nonce = re.search(r"'nonce-([^']+)'", page["Content-Security-Policy"]).group(1)
    html = page.content.decode()
    inline = [a for a in re.findall(r"<script(?![^>]*\bsrc=)([^>]*)>", html) if "application/json" not in a]
    assert inline and all(f'nonce="{nonce}"' in attrs for attrs in inline)
    assert not re.search(r"\son[a-z]+=\"", html)  # no inline event handlers


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "GRUE_HTTPS", "GRUE_TRUST_PROXY")}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_is_clean_with_the_documented_production_settings():
    prod = {
        "SECRET_KEY": secrets.token_urlsafe(64),
        "DEBUG": "0",
        "GRUE_HTTPS": "1",
        "GRUE_TRUST_PROXY": "1",
        "ALLOWED_HOSTS": "grue.example.org",
        "CSRF_TRUSTED_ORIGINS": "https://grue.example.org",
    }
    res = _manage("manage.py", "check", "--deploy", "--fail-level", "WARNING", **prod)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no issues" in res.stdout
    # Without HTTPS settings the same check fails: it is not vacuous.
    plain = {k: v for k, v in prod.items() if k not in ("GRUE_HTTPS",)}
    res = _manage("manage.py", "check", "--deploy", "--fail-level", "WARNING", **plain)
    assert res.returncode != 0 and "security.W004" in res.stderr + res.stdout


def test_debug_is_off_unless_enabled():
    code = "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)"
    res = _manage("-c", code, DJANGO_SETTINGS_MODULE="webapp.settings")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_secret_is_created_0600_atomically_even_with_an_open_umask(tmp_path):
    old = os.umask(0)
    try:
        value = read_or_create_secret(tmp_path / "key")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "key").stat().st_mode) == 0o600
    assert read_or_create_secret(tmp_path / "key") == value  # a second starter reads the same one


# --------------------------------------------------------------------------- request size limits


class _Server:
    """The real web server as ``up`` and the deploy files start it: ``python -m webapp.server``."""

    def __init__(self, test_db_name: str, runs_dir: Path):
        self.port = free_port()
        self.log_path = runs_dir / f"server-{self.port}.log"
        self._log = self.log_path.open("w")
        env = _subprocess_env(test_db_name, GRUE_RUNS_DIR=str(runs_dir))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "webapp.server", "-b", "127.0.0.1", "-p", str(self.port)]
            + ["webapp.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_condition(self._ready, timeout=60, interval=0.2, what="web server listening")
        # one real request, so the process has imported and set up everything before measuring
        self.request(b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log_path.read_text()
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def request(self, head: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(head)
            return _read_all(s)

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def stop(self) -> None:
        os.killpg(self.proc.pid, 15)
        self.proc.wait(timeout=20)
        self._log.close()


def _read_all(s: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except OSError:
        pass
    return data


class _PeakRss(threading.Thread):
    def __init__(self, server: _Server):
        super().__init__(daemon=True)
        self.server, self.peak, self.done = server, server.rss(), threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.server.rss())
            self.done.wait(0.02)  # sample every 20 ms until stopped


@pytest.fixture
def web_server(test_db_name, runs_dir):
    server = _Server(test_db_name, runs_dir)
    yield server
    server.stop()


BODY = 200 * 1024 * 1024
CHUNK = b"x" * (1024 * 1024)


def _send_body(s: socket.socket, chunked: bool) -> int:
    """Send up to 200 MB; returns how many bytes the server let through before cutting us off."""
    sent = 0
    try:
        while sent < BODY:
            part = (b"%x\r\n" % len(CHUNK)) + CHUNK + b"\r\n" if chunked else CHUNK
            s.sendall(part)
            sent += len(CHUNK)
        if chunked:
            s.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    return sent


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_200mb_anonymous_post_is_refused_before_buffering(web_server, chunked, settings):
    limit = settings.GRUE_MAX_REQUEST_BYTES
    head = b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += b"Content-Type: application/x-www-form-urlencoded\r\n"
    head += b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"Content-Length: %d\r\n\r\n" % BODY
    before = web_server.rss()
    watch = _PeakRss(web_server)
    watch.start()
    with socket.create_connection(("127.0.0.1", web_server.port), timeout=30) as s:
        s.sendall(head)
        sent = _send_body(s, chunked)
        reply = _read_all(s)
    watch.done.set()
    watch.join()
    assert sent < BODY  # the server closed the connection instead of reading 200 MB
    if reply:  # the 413 may be lost to a reset when the client was still sending
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    grown = watch.peak - before
    print(
        f"200 MB POST ({'chunked' if chunked else 'content-length'}): {sent / 2**20:.0f} MiB sent, peak RSS +{grown / 2**20:.1f} MiB"
    )
    assert grown < 64 * 1024 * 1024, (
        f"web process grew by {grown / 2**20:.0f} MiB (limit {limit / 2**20:.0f} MiB)"
    )
    assert web_server.proc.poll() is None
    # The declared-length case answers 413 as soon as the headers are in.
    if not chunked:
        assert web_server.request(head).startswith(b"HTTP/1.1 413")
    # Normal requests still work.
    assert (
        web_server.request(b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")[
            :12
        ]
        == b"HTTP/1.1 200"
    )


@pytest.mark.django_db
def test_form_bodies_over_the_form_limit_are_a_400_not_a_crash(client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
    r = client.post("/accounts/login/", {"username": "x", "password": "y" * (2 * 1024 * 1024)})
    assert r.status_code == 400


def test_asgi_body_limit_counts_streamed_bodies():
    import asyncio

    from webapp.limits import AsgiBodyLimit

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run(chunks: int, declared: int | None) -> int:
        sent: list[dict] = []
        queue = [
            {"type": "http.request", "body": b"x" * 1000, "more_body": i < chunks - 1} for i in range(chunks)
        ]

        async def receive():
            return queue.pop(0)

        async def send(msg):
            sent.append(msg)

        headers = [(b"content-length", str(declared).encode())] if declared is not None else []
        await AsgiBodyLimit(app, limit=10_000)({"type": "http", "headers": headers}, receive, send)
        return sent[0]["status"]

    assert asyncio.run(run(5, None)) == 200
    assert asyncio.run(run(50, None)) == 413  # no length given: counted as it streams
    assert asyncio.run(run(1, 20_000)) == 413  # declared too large: refused before reading
