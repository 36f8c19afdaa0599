"""The REST API (``/api/v1/``): tokens, roles, CSRF, validation naming the field, idempotent batches
stored and broadcast exactly like the worker's recorder, status through the lifecycle, limits,
campaign pairs, and an OpenAPI document that matches the routes."""

from __future__ import annotations

import hashlib
import json

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import Client as DjangoClient
from django.urls import get_resolver

from webapp.api.auth import create_token
from webapp.api.models import ApiBatch, ApiToken
from webapp.runs.models import Checkpoint, MetricPoint, Run, RunLog, Sample, group_name
from webapp.runs.recorder import Recorder

CONFIG = {
    "name": "remote",
    "model": {"name_or_path": "builtin:tiny-gpt2"},
    "task": {"id": "synthetic_increasing_numbers", "args": {"n_samples": 8}},
    "reward": {"id": "increasing_numbers"},
    "train": {"n_iters": 3},
}
HEADLINE = {"train/reward_mean": 0.5, "train/kl": 0.01}


def _auth(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def _post(client, url: str, body, token: str | None = None, **extra):
    headers = _auth(token) if token else {}
    return client.post(url, data=json.dumps(body), content_type="application/json", **headers, **extra)


@pytest.fixture
def token(researcher) -> str:
    return create_token(researcher, "test")[1]


def _remote_run(client, token: str) -> int:
    r = _post(client, "/api/v1/runs", {"config": CONFIG, "tags": ["api"]}, token)
    assert r.status_code == 201, r.content
    run_id = r.json()["id"]
    r = _post(client, f"/api/v1/runs/{run_id}/status", {"status": "running", "host": "cluster-7"}, token)
    assert r.status_code == 200 and r.json()["status"] == "running" and r.json()["remote"], r.content
    return run_id


# --------------------------------------------------------------------------- tokens and access


@pytest.mark.django_db
def test_token_page_shows_a_new_token_once_stores_its_hash_and_revokes(client, researcher):
    client.force_login(researcher)
    page = client.post("/settings/tokens/", {"name": "laptop"})
    assert page.status_code == 200 and page["Cache-Control"] == "no-store"
    clear = page.context["new_token"]
    assert clear.startswith("grue_") and clear in page.content.decode()
    row = ApiToken.objects.get(user=researcher)
    assert row.digest == hashlib.sha256(clear.encode()).hexdigest() and clear not in row.digest
    assert clear not in client.get("/settings/tokens/").content.decode()  # shown once
    api = DjangoClient()
    assert api.get("/api/v1/runs", **_auth(clear)).status_code == 200
    client.post("/settings/tokens/", {"revoke": str(row.pk)})
    r = api.get("/api/v1/runs", **_auth(clear))
    assert r.status_code == 401 and r.json() == {
        "error": "this API token was revoked",
        "field": "Authorization",
    }


@pytest.mark.django_db
def test_only_researchers_use_the_api(client, annotator, nobody, admin):
    assert client.get("/api/v1/runs").status_code == 401
    r = client.get("/api/v1/runs", HTTP_AUTHORIZATION="Bearer grue_not-a-token")
    assert r.status_code == 401 and r.json()["field"] == "Authorization"
    for user in (annotator, nobody):
        r = client.get("/api/v1/runs", **_auth(create_token(user, "x")[1]))
        assert r.status_code == 403 and "researcher" in r.json()["error"]
    assert client.get("/api/v1/openapi.json", **_auth(create_token(admin, "x")[1])).status_code == 200
    client.force_login(annotator)
    assert client.get("/settings/tokens/").status_code == 302  # annotators have no tokens page


@pytest.mark.django_db
def test_csrf_applies_to_session_writes_but_not_to_token_writes(researcher, token):
    browser = DjangoClient(enforce_csrf_checks=True)
    browser.force_login(researcher)
    r = _post(browser, "/api/v1/runs", {"config": CONFIG})
    assert r.status_code == 403 and "CSRF" in r.json()["error"]
    assert browser.get("/api/v1/runs").status_code == 200  # reads need no CSRF token
    assert (
        _post(DjangoClient(enforce_csrf_checks=True), "/api/v1/runs", {"config": CONFIG}, token).status_code
        == 201
    )


# --------------------------------------------------------------------------- creating runs


@pytest.mark.django_db
def test_create_run_validates_like_the_launch_form_and_names_the_field(client, token, tmp_path):
    r = _post(client, "/api/v1/runs", {"name": "x"}, token)
    assert r.status_code == 400 and r.json()["field"] == "config"
    bad_algo = {**CONFIG, "algorithm": {"id": "ppo", "n_epochs": "many"}}
    r = _post(client, "/api/v1/runs", {"config": bad_algo}, token)
    assert r.status_code == 400 and r.json()["field"] == "config.algorithm.n_epochs", r.json()
    outside = {**CONFIG, "train": {"n_iters": 3, "output_dir": "/etc/grue"}}
    r = _post(client, "/api/v1/runs", {"config": outside}, token)
    assert r.status_code == 400 and r.json()["field"] == "config.train.output_dir"
    r = _post(
        client, "/api/v1/runs", {"config": {**CONFIG, "model": {"name_or_path": "/root/secret-model"}}}, token
    )
    assert r.status_code == 400 and r.json()["field"].startswith("config.model"), r.json()
    r = client.post("/api/v1/runs", data="{not json", content_type="application/json", **_auth(token))
    assert r.status_code == 400 and r.json()["field"] == "body"
    assert not Run.objects.exists()  # nothing saved by a refused request
    r = _post(client, "/api/v1/runs", {"config": CONFIG, "tags": ["a", "b"], "project": "p"}, token)
    body = r.json()
    assert r.status_code == 201 and body["status"] == "draft" and body["tags"] == ["a", "b"]
    assert body["config"]["train"]["n_iters"] == 3 and body["created_by"] == "rita"


# --------------------------------------------------------------------------- streaming


def _events(step: int) -> list[dict]:
    return [
        {"type": "progress", "iteration": step + 1, "total": 3, "eta_seconds": 2.0, "phase": "rl"},
        {"type": "metrics", "step": step, "values": {**HEADLINE, "loss": float(step), "odd": "NaN"}},
        {"type": "log", "message": f"note {step}", "key": f"n{step}"},
        {"type": "samples", "step": step, "split": "train",
         "rows": [{"prompt": "p", "generation": f"g{step}", "references": ["r"], "reward": 1.0}]},
        {"type": "checkpoint", "step": step, "path": f"/elsewhere/ckpt-{step}"},
    ]  # fmt: skip


def _receive_one(run_id: int, action) -> dict:
    """Run ``action`` while listening to the run's group; the first message it caused."""
    layer = get_channel_layer()

    async def go():
        import asyncio

        channel = await layer.new_channel()
        await layer.group_add(group_name(run_id), channel)
        await asyncio.to_thread(action)
        msg = await asyncio.wait_for(layer.receive(channel), 10)
        await layer.group_discard(group_name(run_id), channel)
        return msg["message"]

    return async_to_sync(go)()


def _shape(msg):
    """A live message without what differs between two runs (row ids, times, start time)."""
    if isinstance(msg, dict):
        return {
            k: _shape(v)
            for k, v in msg.items()
            if k not in ("id", "ids", "time", "started_at", "finished_at")
        }
    if isinstance(msg, list):
        return [_shape(v) for v in msg]
    return msg


@pytest.mark.django_db(transaction=True)
def test_a_batch_is_stored_once_and_broadcast_like_a_recorder_flush(client, researcher, token):
    run_id = _remote_run(client, token)
    events = _events(0)
    url = f"/api/v1/runs/{run_id}/events"
    api_msg = _receive_one(run_id, lambda: _post(client, url, {"batch_id": "b-0", "events": events}, token))

    # The same events through the worker's recorder, for a worker run: the same live message.
    worker_run = Run.objects.create(name="w", config={}, status="running")
    rec = Recorder(worker_run.pk, max_delay=3600)

    def record():
        rec.progress(1, 3, 2.0, "rl")
        rec.metrics(0, {**HEADLINE, "loss": 0.0, "odd": float("nan")})
        rec.log("note 0")
        rec.samples(0, "train", [{"prompt": "p", "generation": "g0", "references": ["r"], "reward": 1.0}])
        rec.checkpoint(0, "/elsewhere/ckpt-0")
        rec.flush()

    worker_msg = _receive_one(worker_run.pk, record)
    rec.close()
    assert api_msg["type"] == "batch" and _shape(api_msg) == _shape(worker_msg)

    # Re-sent (its reply was lost): nothing more is stored.
    again = _post(client, url, {"batch_id": "b-0", "events": events}, token)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert MetricPoint.objects.filter(run_id=run_id).count() == 4
    assert (
        Sample.objects.filter(run_id=run_id).count() == 1
        and Checkpoint.objects.filter(run_id=run_id).count() == 1
    )
    lines = list(RunLog.objects.filter(run_id=run_id).order_by("id").values_list("line", flat=True))
    assert lines == list(
        RunLog.objects.filter(run_id=worker_run.pk).order_by("id").values_list("line", flat=True)
    )
    assert ApiBatch.objects.filter(run_id=run_id).count() == 1
    run = Run.objects.get(pk=run_id)
    assert run.current_iter == 1 and run.last_metrics["loss"] == 0.0 and run.last_metrics["odd"] is None

    # The end goes through the lifecycle; a re-sent end is a no-op; a later start is refused.
    started = {"type": "run_started", "config": CONFIG, "run_dir": "/home/me/runs/x"}
    for step in (1, 2):
        body = {"batch_id": f"b-{step}", "events": [started, *_events(step)] if step == 1 else _events(step)}
        assert _post(client, url, body, token).json()["duplicate"] is False
    started_line = RunLog.objects.filter(run_id=run_id, line__startswith="started on").get().line
    assert "cluster-7 (remote)" in started_line and "/home/me/runs/x" in started_line
    assert Run.objects.get(pk=run_id).run_dir == ""  # the client's directory is not this server's
    done = _post(
        client, f"/api/v1/runs/{run_id}/status", {"status": "succeeded", "summary": {"iterations": 3}}, token
    )
    assert done.status_code == 200 and done.json()["status"] == "succeeded" and done.json()["progress"] == 1.0
    assert _post(client, f"/api/v1/runs/{run_id}/status", {"status": "succeeded"}, token).status_code == 200
    r = _post(client, f"/api/v1/runs/{run_id}/status", {"status": "failed"}, token)
    assert r.status_code == 409 and r.json()["field"] == "status"
    series = client.get(f"/api/v1/runs/{run_id}/metrics?keys=loss", **_auth(token)).json()["series"]
    assert series == {
        "loss": {"steps": [0, 1, 2], "values": [0.0, 1.0, 2.0], "times": series["loss"]["times"]}
    }


@pytest.mark.django_db
def test_writes_are_refused_for_worker_runs_other_users_runs_and_bad_events(client, researcher, admin, token):
    worker_run = Run.objects.create(name="w", config={}, status="running", created_by=researcher)
    r = _post(client, f"/api/v1/runs/{worker_run.pk}/events", {"batch_id": "x", "events": []}, token)
    assert r.status_code == 409 and r.json()["field"] == "run_id"
    run_id = _remote_run(client, token)
    other = create_token(_other_researcher(), "o")[1]
    r = _post(client, f"/api/v1/runs/{run_id}/events", {"batch_id": "x", "events": []}, other)
    assert r.status_code == 403 and "another user" in r.json()["error"]
    bad = [_events(0)[1], {"type": "metrics", "step": "three", "values": {"a": 1}}]
    r = _post(client, f"/api/v1/runs/{run_id}/events", {"batch_id": "bad", "events": bad}, token)
    assert r.status_code == 400 and r.json() == {"error": "must be an integer", "field": "events[1].step"}
    r = _post(client, f"/api/v1/runs/{run_id}/events", {"batch_id": "", "events": []}, token)
    assert r.status_code == 400 and r.json()["field"] == "batch_id"
    r = _post(
        client, f"/api/v1/runs/{run_id}/events", {"batch_id": "t", "events": [{"type": "telemetry"}]}, token
    )
    assert r.status_code == 400 and r.json()["field"] == "events[0].type"
    assert not MetricPoint.objects.filter(run_id=run_id).exists()  # a refused batch stores nothing
    assert client.get("/api/v1/runs/999999", **_auth(token)).json()["field"] == "run_id"


def _other_researcher():
    from tests.conftest import _make_user

    return _make_user("otto", "researcher")


@pytest.mark.django_db
def test_rate_and_size_limits_answer_429_and_413(client, token, settings):
    from django.core.cache import cache

    run_id = _remote_run(client, token)
    cache.clear()
    settings.GRUE_API_WRITES_PER_MIN = 3
    url = f"/api/v1/runs/{run_id}/events"
    codes = [_post(client, url, {"batch_id": f"r{i}", "events": []}, token).status_code for i in range(5)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
    r = _post(client, url, {"batch_id": "r9", "events": []}, token)
    assert int(r["Retry-After"]) >= 1 and "rate limit" in r.json()["error"]
    assert client.get("/api/v1/runs", **_auth(token)).status_code == 200  # reads are not limited
    settings.GRUE_API_WRITES_PER_MIN = 1000
    settings.GRUE_API_MAX_BODY = 2000
    r = _post(client, url, {"batch_id": "big", "events": [_events(0)[2]] * 40}, token)
    assert r.status_code == 413 and "smaller batches" in r.json()["error"]
    settings.GRUE_API_MAX_BODY = 10**8
    many = [{"type": "log", "message": "x"}] * 5001
    r = _post(client, url, {"batch_id": "many", "events": many}, token)
    assert r.status_code == 413 and r.json()["field"] == "events"


# --------------------------------------------------------------------------- reads


@pytest.mark.django_db
def test_campaigns_and_their_pairs(client, token):
    from annotation import assignment, campaigns, invites
    from annotation.pairs import preference_pairs
    from tests.annotation.conftest import make_run, make_user

    prompts = [f"Prompt number {i}:" for i in range(3)]
    a = make_run("good-run", prompts, [f"a good answer {i}" for i in range(3)])
    b = make_run("bad-run", prompts, [f"a bad answer {i}" for i in range(3)])
    camp = campaigns.create_campaign_from_runs("api pairs", [a.pk, b.pk], overlap=1)
    judge = make_user("judge")
    invites.add_member(camp, judge)
    campaigns.start_campaign(camp)
    while (asg := assignment.next_item(camp, judge)) is not None:
        assignment.record_judgment(judge, asg.token, item_id=asg.item_id, choice="left", seconds=1.0)
    listed = client.get("/api/v1/campaigns", **_auth(token)).json()["campaigns"]
    assert [(c["id"], c["name"], c["kind"]) for c in listed] == [(camp.pk, "api pairs", "pairwise")]
    pairs = client.get(f"/api/v1/campaigns/{camp.pk}/pairs", **_auth(token)).json()["pairs"]
    assert len(pairs) == 3 and pairs == json.loads(json.dumps(preference_pairs(camp)))
    assert {p["meta"]["source"] for p in pairs} == {"human"}
    # no AI judge in this campaign: its AI pairs are none, "both" are the human ones
    assert client.get(f"/api/v1/campaigns/{camp.pk}/pairs?source=ai", **_auth(token)).json()["pairs"] == []
    both = client.get(f"/api/v1/campaigns/{camp.pk}/pairs?source=both", **_auth(token)).json()
    assert both["source"] == "both" and len(both["pairs"]) == 3
    bad = client.get(f"/api/v1/campaigns/{camp.pk}/pairs?source=robots", **_auth(token))
    assert bad.status_code == 400 and bad.json()["field"] == "source"
    assert client.get("/api/v1/campaigns/424242/pairs", **_auth(token)).status_code == 404


@pytest.mark.django_db
def test_runs_list_filters_and_pages(client, token):
    for i in range(3):
        _post(
            client,
            "/api/v1/runs",
            {"config": CONFIG, "name": f"r{i}", "tags": ["even" if i % 2 == 0 else "odd"]},
            token,
        )
    body = client.get("/api/v1/runs?tag=even&limit=1", **_auth(token)).json()
    assert body["count"] == 2 and [r["name"] for r in body["runs"]] == ["r2"]
    r = client.get("/api/v1/runs?limit=0", **_auth(token))
    assert r.status_code == 400 and r.json()["field"] == "limit"
    assert client.get("/api/v1/runs?status=sleeping", **_auth(token)).json()["field"] == "status"


@pytest.mark.django_db
def test_openapi_describes_exactly_the_routed_endpoints(client, token):
    doc = client.get("/api/v1/openapi.json", **_auth(token)).json()
    assert doc["openapi"].startswith("3.") and doc["servers"] == [{"url": "/api/v1"}]
    routed = set()
    for p in get_resolver().url_patterns:
        for sub in getattr(p, "url_patterns", [p]):
            route = str(sub.pattern)
            if route.startswith("api/v1/"):
                routed.add("/" + route[len("api/v1/") :].replace("<int:", "{").replace(">", "}"))
    assert routed == set(doc["paths"])
    for path, ops in doc["paths"].items():
        for op in ops.values():
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    assert "{" + param["name"] + "}" in path


@pytest.mark.django_db
def test_any_batch_is_the_remote_runs_heartbeat_so_the_watchdog_keeps_it(client, token):
    from datetime import timedelta

    from django.utils import timezone

    from webapp.runs import lifecycle

    run_id = _remote_run(client, token)
    Run.objects.filter(pk=run_id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    r = _post(client, f"/api/v1/runs/{run_id}/events", {"batch_id": "hb-1", "events": []}, token)
    assert r.status_code == 200
    assert lifecycle.mark_lost_runs(older_than=600, run_ids=[run_id]) == []
    Run.objects.filter(pk=run_id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert lifecycle.mark_lost_runs(older_than=600, run_ids=[run_id]) == [run_id]  # silence: lost


@pytest.mark.django_db
def test_a_lost_remote_run_is_not_resumed_by_the_watchdog_and_its_client_still_finishes_it(
    client, token, settings
):
    from webapp import watchdog
    from webapp.runs import lifecycle

    settings.CELERY_TASK_DEFAULT_QUEUE = "api-test-nobody-listens"
    run_id = _remote_run(client, token)
    assert (
        _post(
            client, f"/api/v1/runs/{run_id}/events", {"batch_id": "c", "events": _events(0)}, token
        ).status_code
        == 200
    )
    assert lifecycle.mark_lost(run_id)
    assert watchdog.auto_resume_lost_runs() == [] and Run.objects.get(pk=run_id).status == "lost"
    # The client was only out of reach: its later batches are stored and its end wins.
    assert not _post(
        client, f"/api/v1/runs/{run_id}/events", {"batch_id": "d", "events": _events(1)}, token
    ).json()["duplicate"]
    r = _post(
        client, f"/api/v1/runs/{run_id}/status", {"status": "succeeded", "summary": {"iterations": 2}}, token
    )
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    assert MetricPoint.objects.filter(run_id=run_id, key="loss").count() == 2
