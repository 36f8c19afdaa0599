"""Nothing lost on the way in (issue 29; 31 item 6; the remote client of 25 item 2): the API under
bodies between Django's 5 MiB form limit and its own 8 MiB limit, numbers no column can hold, NUL
characters, a database outage, concurrent duplicate sends and a run deleted under a send; the remote
client splitting what the server cannot take in one batch, setting refused and poison events aside
while the stream goes on, and sending its token only where it is safe.

Real parts throughout: a daphne server (``asgi_server``) on the test database, the remote sink and
client as a training process uses them, a Celery worker for the worker path, PostgreSQL locks to make
two requests meet at the same row.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from tests.conftest import ROOT, _subprocess_env, free_port, wait_for_condition
from tests.helpers import tiny_run_config

pytestmark = pytest.mark.django_db(transaction=True)

CONFIG = {
    "name": "faults",
    "model": {"name_or_path": "builtin:tiny-gpt2"},
    "task": {"id": "synthetic_increasing_numbers", "args": {"n_samples": 8}},
    "reward": {"id": "increasing_numbers"},
    "train": {"n_iters": 3},
}
MiB = 1024 * 1024


@pytest.fixture
def token(researcher: Any) -> str:
    from webapp.api.auth import create_token

    return create_token(researcher, "faults")[1]


def _remote_run(url: str, token: str, name: str = "faults") -> tuple[Any, int]:
    from engine.client import Client
    from engine.remote import start_remote_run

    client = Client(url, token)
    return client, start_remote_run(client, {**CONFIG, "name": name})["id"]


def _raw_post(url: str, token: str, body: bytes) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def _rows(n: int, size: int, tag: str) -> list[dict[str, Any]]:
    return [
        {"prompt": f"{tag}{i}", "generation": "x" * size, "references": ["r"], "reward": 1.0}
        for i in range(n)
    ]


# --------------------------------------------------------------------------- 29.1 sizes


def test_the_api_takes_bodies_up_to_its_8_mib_limit_and_answers_json_above(asgi_server, token):
    """Django's 5 MiB form limit used to refuse a 6 MiB batch with an HTML 400 before the API's own
    documented 8 MiB limit applied."""
    from webapp.runs.models import MetricPoint, Sample

    _client, run_id = _remote_run(asgi_server.url, token)
    events = [
        {"type": "samples", "step": 1, "split": "train", "rows": _rows(70, 90_000, "p")},
        {"type": "metrics", "step": 2, "values": {"train/reward_mean": 0.5}},
    ]
    body = json.dumps({"batch_id": "six-mib", "events": events}).encode()
    assert 5 * MiB < len(body) < 8 * MiB
    status, ctype, raw = _raw_post(f"{asgi_server.url}/api/v1/runs/{run_id}/events", token, body)
    assert status == 200, raw[:300]
    assert json.loads(raw)["points"] == 1
    assert Sample.objects.filter(run_id=run_id).count() == 70
    assert MetricPoint.objects.filter(run_id=run_id, step=2).count() == 1

    big = json.dumps({"batch_id": "nine-mib", "events": [{**events[0], "rows": _rows(100, 95_000, "q")}]})
    assert 8 * MiB < len(big) < 64 * MiB  # under the server-wide limit: the API's own limit answers
    status, ctype, raw = _raw_post(f"{asgi_server.url}/api/v1/runs/{run_id}/events", token, big.encode())
    assert status == 413 and ctype.startswith("application/json"), raw[:300]
    assert json.loads(raw)["field"] == "body" and str(8 * MiB) in json.loads(raw)["error"]
    assert Sample.objects.filter(run_id=run_id).count() == 70  # nothing of the refused batch


def test_the_client_splits_what_one_batch_cannot_hold_and_keeps_what_the_server_takes(
    asgi_server, token, tmp_path
):
    """Samples travel apart from metrics, a samples event over the limit goes in appended parts, and
    an event the server refuses is set aside alone: every metric point that can be stored is."""
    from engine.remote import RemoteSink, refused_path
    from webapp.runs.models import MetricPoint, RunLog, Sample

    client, run_id = _remote_run(asgi_server.url, token)
    sink = RemoteSink(client, run_id, max_delay=60)  # one seal at close: everything in one "batch"
    sink.run_started(CONFIG, str(tmp_path))
    sink.metrics(1, {"train/reward_mean": 0.1})
    sink.samples(1, "train", _rows(70, 90_000, "a"))  # ~6 MiB
    sink.metrics(2, {"train/reward_mean": 0.2})
    sink.samples(2, "train", _rows(230, 90_000, "b"))  # ~20 MiB: over the limit on its own
    sink.metrics(3, {"train/reward_mean": 0.3, "k" * 300: 1.0})  # a key the server refuses
    sink.metrics(4, {"train/reward_mean": 0.4})
    sink.log("after the refused event")
    assert sink.close(timeout=300) == 0

    steps = sorted(
        MetricPoint.objects.filter(run_id=run_id, key="train/reward_mean").values_list("step", flat=True)
    )
    assert steps == [1, 2, 4]
    assert Sample.objects.filter(run_id=run_id, step=1).count() == 70
    assert Sample.objects.filter(run_id=run_id, step=2).count() == 230  # parts appended, not replaced
    refused = [json.loads(ln) for ln in refused_path(tmp_path / "remote", run_id).read_text().splitlines()]
    assert len(refused) == 1 and refused[0]["events"][0]["step"] == 3
    assert "metric keys" in refused[0]["reason"]
    assert len(sink.rejected) == 1 and "step 3" in sink.rejected[0]
    lines = list(RunLog.objects.filter(run_id=run_id).values_list("line", flat=True))
    assert any("after the refused event" in ln for ln in lines)
    assert any("not stored" in ln and "metrics at step 3" in ln for ln in lines)  # the run page says so


# --------------------------------------------------------------------------- 29.2 NUL, poison batches


def test_nul_text_is_stored_visibly_through_the_api(asgi_server, token):
    from webapp.runs.models import MetricPoint, RunLog, Sample

    client, run_id = _remote_run(asgi_server.url, token)
    reply = client.send_events(run_id, "nul-1", [
        {"type": "metrics", "step": 1, "values": {"a\x00b": 1.0}},
        {"type": "log", "message": "line\x00x", "key": "k1"},
        {"type": "samples", "step": 1, "split": "train",
         "rows": [{"prompt": "p\x00q", "generation": "g\x00", "references": ["r\x00"], "meta": {"m\x00": "v\x00"}}]},
        {"type": "checkpoint", "step": 1, "path": "/x\x00/ckpt"},
    ])  # fmt: skip
    assert reply["points"] == 1
    assert list(MetricPoint.objects.filter(run_id=run_id).values_list("key", flat=True)) == ["a\u2400b"]
    assert RunLog.objects.filter(run_id=run_id, line="line\u2400x").exists()
    sample = Sample.objects.get(run_id=run_id)
    assert sample.prompt == "p\u2400q" and sample.generation == "g\u2400"
    # A run's settings are refused whole, naming the field, rather than stored changed.
    from engine.client import ApiError

    with pytest.raises(ApiError) as exc:
        client.create_run({**CONFIG, "name": "n\x00"})
    assert exc.value.status == 400 and exc.value.field == "config.name"


def test_nul_text_is_stored_the_same_way_by_a_worker(
    worker_factory, researcher, settings, tmp_path, wait_for
):
    """On a worker the same text used to fail the run in 3 s with a PostgreSQL DataError."""
    from webapp.runs import lifecycle
    from webapp.runs.models import Run, Sample

    data = tmp_path / "gsm"
    data.mkdir()
    for split in ("train", "test"):
        rows = [{"question": f"How much is {i}\x00+1?", "answer": f"{i}+1\n#### {i + 1}"} for i in range(10)]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings.ALLOWED_ROOTS = [tmp_path.resolve(), *settings.ALLOWED_ROOTS]
    worker = worker_factory(extra_env={"GRUE_ALLOWED_ROOTS": f"{tmp_path.resolve()}:{settings.RUNS_DIR}"})
    settings.CELERY_TASK_DEFAULT_QUEUE = worker.queue
    cfg = tiny_run_config(
        1, "nul-worker", save_every=0,
        task={"id": "gsm8k", "max_train_samples": 4, "max_eval_samples": 2,
              "args": {"train_path": str(data / "train.jsonl"), "test_path": str(data / "test.jsonl")}},
        reward={"id": "math_accuracy"},
    )  # fmt: skip
    run = lifecycle.launch_run(cfg, user=researcher)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status in ("succeeded", "failed"), timeout=300, what="run ended"
    )
    run.refresh_from_db()
    assert run.status == "succeeded", f"{run.error}\n{worker.log()[-3000:]}"
    prompts = list(Sample.objects.filter(run_id=run.pk).values_list("prompt", flat=True))
    assert prompts and all("\u2400+1?" in p and "\x00" not in p for p in prompts)


class FaultyHttp:
    """An HTTP proxy in front of the real server that answers 500 to any request whose body holds
    ``poison`` (a batch that breaks the server), and forwards everything else unchanged."""

    def __init__(self, upstream: str, poison: bytes):
        self.failed = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if poison in body:
                    outer.failed += 1
                    self._answer(500, "text/html", b"<h1>Server Error (500)</h1>")
                    return
                req = urllib.request.Request(upstream + self.path, data=body or None, method=self.command)
                for name in ("Authorization", "Content-Type"):
                    if self.headers.get(name):
                        req.add_header(name, self.headers[name])
                try:
                    with urllib.request.urlopen(req, timeout=60) as resp:
                        self._answer(resp.status, resp.headers.get("Content-Type", ""), resp.read())
                except urllib.error.HTTPError as exc:
                    self._answer(exc.code, exc.headers.get("Content-Type", ""), exc.read())

            def _answer(self, status: int, ctype: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_poison_batch_is_set_aside_and_the_stream_goes_on(asgi_server, token, tmp_path):
    """A batch the server answers 500 to, again and again while it takes other batches, used to block
    the outbox for good (nothing after it stored; the run ended lost). Now: bounded retries, the
    offending event set aside on disk, the run page's log says so, everything else is stored."""
    from engine.client import Client
    from engine.remote import POISON_ATTEMPTS, RemoteSink, refused_path
    from webapp.runs.models import MetricPoint, Run, RunLog

    _c, run_id = _remote_run(asgi_server.url, token)
    proxy = FaultyHttp(asgi_server.url, b"POISON")
    try:
        sink = RemoteSink(Client(proxy.url, token), run_id, max_delay=0.05, max_backoff=0.1)
        sink.run_started(CONFIG, str(tmp_path))
        sink.metrics(1, {"train/reward_mean": 0.1})
        sink.log("POISON in a log line")
        sink.metrics(2, {"train/reward_mean": 0.2})
        for step in range(3, 6):
            sink.metrics(step, {"train/reward_mean": step / 10})
        sink.finished({"iterations": 5})
        assert sink.close(timeout=120) == 0, sink.rejected
    finally:
        proxy.close()
    assert proxy.failed >= POISON_ATTEMPTS
    steps = sorted(MetricPoint.objects.filter(run_id=run_id).values_list("step", flat=True))
    assert steps == [1, 2, 3, 4, 5]
    assert Run.objects.get(pk=run_id).status == "succeeded"
    refused = [json.loads(ln) for ln in refused_path(tmp_path / "remote", run_id).read_text().splitlines()]
    assert [e["message"] for r in refused for e in r["events"]] == ["POISON in a log line"]
    assert "HTTP 500" in refused[0]["reason"]
    assert RunLog.objects.filter(run_id=run_id, line__contains="not stored").exists()


# --------------------------------------------------------------------------- 29.4 numbers, outages


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"type": "metrics", "step": 1e300, "values": {"a": 1.0}}, "events[0].step"),
        ({"type": "metrics", "step": 2**63, "values": {"a": 1.0}}, "events[0].step"),
        ({"type": "metrics", "step": 1, "values": {"a": 10**400}}, "events[0].values.a"),
        ({"type": "progress", "iteration": 2**40, "total": 3, "eta_seconds": None}, "events[0].iteration"),
        ({"type": "progress", "iteration": 1, "total": 2**31, "eta_seconds": None}, "events[0].total"),
        ({"type": "samples", "step": 1e300, "rows": []}, "events[0].step"),
    ],
)
def test_numbers_no_column_can_hold_are_a_json_400_naming_the_field(client, token, event, field):
    from webapp.runs.models import MetricPoint

    r = client.post("/api/v1/runs", json.dumps({"config": CONFIG}), content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
    run_id = r.json()["id"]
    client.post(f"/api/v1/runs/{run_id}/status", json.dumps({"status": "running"}),
                content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
    r = client.post(f"/api/v1/runs/{run_id}/events", json.dumps({"batch_id": "b", "events": [event]}),
                    content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
    assert r.status_code == 400 and r["Content-Type"] == "application/json", r.content[:300]
    assert r.json()["field"] == field
    assert not MetricPoint.objects.filter(run_id=run_id).exists()


def test_absurd_iteration_counts_and_unknown_paths_answer_json(client, token):
    r = client.post("/api/v1/runs", json.dumps({"config": {**CONFIG, "train": {"n_iters": 3 * 10**9}}}),
                    content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
    assert r.status_code == 400 and r.json()["field"] == "config.train.n_iters", r.content[:300]
    r = client.get("/api/v1/no-such-thing", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert r.status_code == 404 and r["Content-Type"] == "application/json" and r.json()["field"] == "path"
    r = client.post("/api/v1/runs", "{}", content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {token}", CONTENT_LENGTH="abc")  # fmt: skip
    assert r.status_code == 400 and r.json()["field"] == "Content-Length"


@pytest.fixture
def server_without_database(test_db_name: str, runs_dir: Path) -> Iterator[str]:
    """A real daphne whose PostgreSQL is down (nothing listens at its database address)."""
    port = free_port()
    env = _subprocess_env(test_db_name, GRUE_RUNS_DIR=str(runs_dir))
    env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{free_port()}/gone"
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    log = (runs_dir / f"daphne-nodb-{port}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "webapp.asgi:application"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip

    def listening() -> bool:
        assert proc.poll() is None, (runs_dir / f"daphne-nodb-{port}.log").read_text()[-3000:]
        import socket

        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for_condition(listening, timeout=60, what="daphne listening")
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
        log.close()


def test_a_database_outage_answers_json_503_on_the_api(server_without_database):
    for path, body in (("/api/v1/runs", None), ("/api/v1/runs/1/events", b'{"batch_id": "x", "events": []}')):
        req = urllib.request.Request(
            server_without_database + path, data=body, method="POST" if body else "GET"
        )
        req.add_header("Authorization", "Bearer grue_whatever")
        req.add_header("Content-Type", "application/json")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=60)
        assert exc.value.code == 503 and exc.value.headers["Content-Type"] == "application/json"
        assert "database is unavailable" in json.loads(exc.value.read())["error"]


# --------------------------------------------------------------------------- 31.6, 29.8 duplicates


def _waiting_on_apibatch() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_locks WHERE relation = 'api_apibatch'::regclass AND NOT granted")
        return cur.fetchone()[0]


def _send_in_threads(client: Any, run_id: int, batches: list[tuple[str, list]]) -> list[Any]:
    from engine.client import ApiError

    out: list[Any] = [None] * len(batches)

    def send(i: int, batch_id: str, events: list) -> None:
        try:
            out[i] = client.send_events(run_id, batch_id, events)
        except ApiError as exc:
            out[i] = exc

    threads = [threading.Thread(target=send, args=(i, b, e)) for i, (b, e) in enumerate(batches)]
    for t in threads:
        t.start()
    return [threads, out]


def test_two_identical_batches_at_once_are_stored_once_and_both_delivered(asgi_server, token):
    """Both requests pass the "already stored?" check before either commits (the test holds the
    batch table until both wait on it), so one of them meets the other's row in the unique index."""
    from webapp.runs.models import MetricPoint

    client, run_id = _remote_run(asgi_server.url, token)
    events = [{"type": "metrics", "step": s, "values": {"a": float(s)}} for s in range(1, 4)]
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("LOCK TABLE api_apibatch IN SHARE ROW EXCLUSIVE MODE")
        threads, out = _send_in_threads(client, run_id, [("same", events), ("same", events)])
        wait_for_condition(lambda: _waiting_on_apibatch() == 2, timeout=60, what="both sends at the insert")
    for t in threads:
        t.join(60)
    assert sorted(r["duplicate"] for r in out) == [False, True], out
    assert sorted(r["points"] for r in out) == [0, 3]
    assert MetricPoint.objects.filter(run_id=run_id).count() == 3


def test_a_batch_for_a_run_deleted_meanwhile_is_refused_not_called_a_duplicate(asgi_server, token):
    """The deleted run's foreign key fails the insert; answering "duplicate" would make the client drop
    the batch as delivered."""
    from engine.client import ApiError
    from webapp.runs.models import Run

    client, run_id = _remote_run(asgi_server.url, token)
    full = [{"type": "metrics", "step": 1, "values": {"a": 1.0}}]
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("LOCK TABLE api_apibatch IN SHARE ROW EXCLUSIVE MODE")
        threads, out = _send_in_threads(client, run_id, [("empty", []), ("full", full)])
        wait_for_condition(lambda: _waiting_on_apibatch() == 2, timeout=60, what="both sends at the insert")
        Run.objects.filter(pk=run_id).delete()
    for t in threads:
        t.join(60)
    for reply in out:
        assert isinstance(reply, ApiError) and reply.status == 404 and reply.field == "run_id", out
        assert not reply.retryable  # the client reports it instead of sending it forever


def test_points_count_what_was_stored_not_what_was_sent(asgi_server, token):
    client, run_id = _remote_run(asgi_server.url, token)
    first = client.send_events(
        run_id, "one", [{"type": "metrics", "step": 1, "values": {"a": 1.0, "b": 2.0}}]
    )
    assert first["points"] == 2 and first["points_sent"] == 2
    again = client.send_events(run_id, "two", [
        {"type": "metrics", "step": 1, "values": {"a": 9.0}},  # (a, 1) is stored already: first wins
        {"type": "metrics", "step": 2, "values": {"a": 3.0}},
    ])  # fmt: skip
    assert again["points"] == 1 and again["points_sent"] == 2 and not again["duplicate"]
    resent = client.send_events(run_id, "two", [{"type": "metrics", "step": 3, "values": {"a": 0.0}}])
    assert resent["duplicate"] and resent["points"] == 0


# --------------------------------------------------------------------------- 25.2 the remote client


def test_the_client_sends_its_token_only_over_https_or_to_loopback():
    from engine.client import Client

    for url in (
        "http://grue.example.org",
        "http://10.0.0.7:8000",
        "http://0177.0.0.1",
        "http://169.254.169.254",
    ):
        with pytest.raises(ValueError, match="plain http"):
            Client(url, "grue_t")
    with pytest.raises(ValueError):
        Client("ftp://grue.example.org", "grue_t")
    for url in (
        "https://grue.example.org",
        "http://127.0.0.1:8000",
        "http://localhost:8000",
        "http://[::1]:80",
    ):
        Client(url, "grue_t")


def test_the_client_follows_no_redirect(asgi_server, token):
    """A redirect would carry ``Authorization`` to wherever it points."""
    from engine.client import ApiError, Client

    seen: list[str | None] = []

    class Target(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Target)
    to = f"http://127.0.0.1:{target.server_address[1]}/api/v1/runs"

    class Redirect(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(307)
            self.send_header("Location", to)
            self.send_header("Content-Length", "0")
            self.end_headers()

    hop = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for srv in (target, hop):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ApiError) as exc:
            Client(f"http://127.0.0.1:{hop.server_address[1]}", token).runs()
        assert exc.value.status == 307 and not exc.value.retryable and to in str(exc.value)
        assert seen == []
    finally:
        for srv in (target, hop):
            srv.shutdown()
            srv.server_close()


def test_the_token_from_the_environment_wins_over_the_command_line(
    asgi_server, token, tmp_path, monkeypatch, capsys
):
    from engine.cli import main
    from engine.client import Client
    from engine.remote import RemoteSink
    from webapp.runs.models import MetricPoint

    _c, run_id = _remote_run(asgi_server.url, token)
    dead = Client(f"http://127.0.0.1:{free_port()}", token)
    sink = RemoteSink(dead, run_id, max_delay=0.05, max_backoff=0.1)
    sink.run_started(CONFIG, str(tmp_path))
    sink.metrics(1, {"a": 1.0})
    assert sink.close(timeout=1) > 0
    monkeypatch.setenv("GRUE_TOKEN", token)
    assert main(["push", str(tmp_path), "--report-to", asgi_server.url, "--token", "grue_not-the-token"]) == 0
    assert "--token ignored" in capsys.readouterr().err
    assert MetricPoint.objects.filter(run_id=run_id).count() == 1


def test_a_streamed_runs_paths_are_the_clients_not_checked_against_the_servers_roots(asgi_server, token):
    """``--report-to`` used to be refused when the run's data files lay outside the *server's* allowed
    roots, although they are read on the client's machine; a run for the server's workers still is."""
    from engine.client import ApiError, Client
    from engine.remote import start_remote_run

    client = Client(asgi_server.url, token)
    cfg = {**CONFIG, "task": {"id": "gsm8k", "args": {"train_path": "/home/someone/gsm/train.jsonl"}}}
    with pytest.raises(ApiError) as exc:
        client.create_run(cfg, launch=True)
    assert exc.value.status == 400 and exc.value.field == "config.task.args.train_path"
    with pytest.raises(ApiError) as exc:
        client.create_run(cfg, launch=True, remote=True)
    assert exc.value.status == 400 and exc.value.field == "remote"
    run = client.run(start_remote_run(client, cfg)["id"])
    assert run["status"] == "running" and run["config"]["task"]["args"]["train_path"].startswith(
        "/home/someone"
    )
