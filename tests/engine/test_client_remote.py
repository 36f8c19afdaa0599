"""A run streamed from "another machine": a real CLI subprocess that knows only the dashboard's URL and
a token trains a tiny model and reports to a real daphne server through a TCP proxy that the test
cuts mid-run and reopens. Every point is stored exactly once, the run ends succeeded, and it has what
a worker's run has (iteration log lines, samples, checkpoints, progress, summary). Then the Python
client reads it back as a DataFrame.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, free_port
from tests.helpers import TcpProxy, run_dir_points

pytestmark = pytest.mark.django_db(transaction=True)

N_ITERS = 24
CONFIG = {
    "name": "remote-cli",
    "model": {"name_or_path": "builtin:tiny-gpt2"},
    "task": {"id": "synthetic_increasing_numbers", "args": {"n_samples": 8}},
    "reward": {"id": "increasing_numbers", "args": {"min_tokens": 20}},
    "rollout": {"max_new_tokens": 4, "batch_size": 8},
    "algorithm": {"id": "ppo", "n_epochs": 1, "minibatch_size": 8},
    "train": {
        "n_iters": N_ITERS,
        "prompts_per_iter": 8,
        "eval_every": 10,
        "save_every": 10,
        "log_samples": 2,
    },
    "eval": {"generation": {"max_new_tokens": 4, "do_sample": False}},
}


def _stored_steps(run_id: int) -> int:
    from webapp.runs.models import MetricPoint

    return MetricPoint.objects.filter(run_id=run_id, key="train/reward_mean").count()


def test_cli_run_streams_through_a_cut_connection_with_nothing_lost_or_duplicated(
    asgi_server, researcher, tmp_path, wait_for
):
    from webapp.api.auth import create_token
    from webapp.runs.models import Checkpoint, MetricPoint, Run, RunLog, Sample

    token = create_token(researcher, "cluster")[1]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    run_dir = tmp_path / "elsewhere" / "run"
    proxy = TcpProxy(asgi_server.port)
    # "Another machine": no database, no Django settings; only the URL and the token.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "DATABASE", "GRUE_", "REDIS"))}
    env.update(HF_HUB_OFFLINE="1", GRUE_TOKEN=token, GRUE_REMOTE_DRAIN_S="180", GRUE_REMOTE_MAX_BACKOFF_S="4")
    err = (tmp_path / "cli.err").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "train", str(cfg), "--quiet", "--report-to",
         f"http://127.0.0.1:{proxy.port}", "--set", f"train.output_dir={run_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
    )  # fmt: skip

    def alive() -> bool:
        if proc.poll() is not None:  # pytest.fail is not retried by wait_for
            pytest.fail(
                f"the CLI exited with {proc.returncode}:\n{(tmp_path / 'cli.err').read_text()[-3000:]}"
            )
        return True

    try:
        run = wait_for(
            lambda: alive() and Run.objects.filter(name="remote-cli").first(), timeout=120, what="run created"
        )
        wait_for(lambda: alive() and _stored_steps(run.pk) >= 3, timeout=120, what="first points stored")
        proxy.cut()
        cut_at = _stored_steps(run.pk)
        # Training goes on while the dashboard is unreachable: the trainer is not blocked by the sink.
        wait_for(
            lambda: len({s for (k, s) in run_dir_points(run_dir) if k == "train/reward_mean"}) >= cut_at + 4,
            timeout=120,
            what="four iterations trained during the outage",
        )
        assert _stored_steps(run.pk) <= cut_at + 1  # (one batch may have been in flight at the cut)
        # The outage lasts until the client has met it (a send that failed and was kept): on a fast
        # machine the four iterations can end while the first send through the cut still waits.
        wait_for(
            lambda: alive() and "buffering and retrying" in (tmp_path / "cli.err").read_text(),
            timeout=120,
            what="the client buffering during the outage",
        )
        proxy.restore()
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        err.close()
        proxy.close()
    stderr = (tmp_path / "cli.err").read_text()
    assert proc.returncode == 0, stderr[-3000:]
    assert "buffering and retrying" in stderr and "not delivered" not in stderr
    assert json.loads(out)["iterations"] == N_ITERS

    run.refresh_from_db()
    assert run.status == "succeeded" and run.progress == 1.0 and run.worker_host.startswith("remote:")
    assert run.current_iter == run.total_iters == N_ITERS and run.summary["iterations"] == N_ITERS
    local = run_dir_points(run_dir)
    stored = list(MetricPoint.objects.filter(run_id=run.pk).values_list("key", "step", "value"))
    assert len(stored) == len(local)  # exactly once (points are unique per run/key/step) ...
    # ... and every one of them; a NaN (null in metrics.jsonl) may be stored as NaN, as in test_outages.
    as_stored = {(k, s): None if v is not None and math.isnan(v) else v for k, s, v in stored}
    assert as_stored == pytest.approx(local)
    # What a worker's run shows: one log line per iteration and per evaluation, samples, checkpoints.
    lines = list(RunLog.objects.filter(run_id=run.pk).values_list("line", flat=True))
    assert sum(ln.startswith("step ") for ln in lines) == N_ITERS
    assert len(lines) == len(set(lines))
    local_samples = (run_dir / "samples.jsonl").read_text().splitlines()
    assert Sample.objects.filter(run_id=run.pk).count() == len(local_samples) > 0
    ckpt_events = [e for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
                   if e["event"] == "checkpoint"]  # fmt: skip
    assert Checkpoint.objects.filter(run_id=run.pk).count() == len({e["step"] for e in ckpt_events}) > 0
    assert (run_dir / "remote" / f"outbox-{run.pk}.jsonl").exists()

    # The Python client reads the run back.
    from engine.client import Client

    client = Client(asgi_server.url, token)
    assert run.pk in [r["id"] for r in client.runs(status="succeeded")]
    df = client.metrics(run.pk)
    assert len(df) == len(local) and set(df.columns) == {"key", "step", "value", "time"}
    rewards = df[df.key == "train/reward_mean"].sort_values("step")
    assert rewards.step.tolist() == list(range(1, N_ITERS + 1))  # every iteration, once
    assert str(df["time"].dt.tz) == "UTC"


def test_undelivered_batches_stay_in_the_outbox_and_push_sends_them_once(
    asgi_server, researcher, tmp_path, capsys
):
    """The dashboard is unreachable for the whole run: close() gives up with the batches on disk, and
    ``python -m engine push`` delivers them later, exactly once (a second push sends nothing)."""
    from engine.cli import main
    from engine.client import Client
    from engine.remote import RemoteSink, start_remote_run
    from webapp.api.auth import create_token
    from webapp.runs.models import MetricPoint, Run, RunLog

    token = create_token(researcher, "t")[1]
    client = Client(asgi_server.url, token)
    run = start_remote_run(client, {**CONFIG, "name": "offline"})
    dead = Client(f"http://127.0.0.1:{free_port()}", token)  # nothing listens there
    sink = RemoteSink(dead, run["id"], max_delay=0.05, max_backoff=0.2)
    sink.run_started(CONFIG, str(tmp_path))
    for step in range(1, 4):
        sink.progress(step, 3, 1.0)
        sink.metrics(step, {"train/reward_mean": step / 10, "train/kl": 0.01})
    sink.log("a line")
    sink.finished({"iterations": 3})
    assert sink.close(timeout=2) > 0 and sink.retries > 0
    assert not MetricPoint.objects.filter(run_id=run["id"]).exists()

    assert main(["push", str(tmp_path), "--report-to", asgi_server.url, "--token", token]) == 0
    assert f"run #{run['id']}:" in capsys.readouterr().out
    stored = sorted(MetricPoint.objects.filter(run_id=run["id"]).values_list("key", "step", "value"))
    assert stored == sorted(
        [("train/kl", s, 0.01) for s in (1, 2, 3)] + [("train/reward_mean", s, s / 10) for s in (1, 2, 3)]
    )
    r = Run.objects.get(pk=run["id"])
    assert r.status == "succeeded" and r.current_iter == 3
    lines = RunLog.objects.filter(run_id=run["id"]).count()
    assert main(["push", str(tmp_path), "--report-to", asgi_server.url, "--token", token]) == 0
    assert "0 batch(es) stored" in capsys.readouterr().out
    assert (
        MetricPoint.objects.filter(run_id=run["id"]).count() == 6
        and RunLog.objects.filter(run_id=run["id"]).count() == lines
    )


def test_an_idle_sink_keeps_the_run_alive_with_empty_batches(asgi_server, researcher, wait_for):
    """An iteration of a large model can outlast GRUE_LOST_AFTER: the sink's empty batches keep the
    remote run's heartbeat fresh while the trainer emits nothing."""
    from datetime import timedelta

    from django.utils import timezone

    from engine.client import Client
    from engine.remote import RemoteSink, start_remote_run
    from webapp.api.auth import create_token
    from webapp.runs.models import Run

    client = Client(asgi_server.url, create_token(researcher, "t")[1])
    run = start_remote_run(client, {**CONFIG, "name": "idle"})
    old = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk=run["id"]).update(heartbeat_at=old)
    sink = RemoteSink(client, run["id"], max_delay=0.05, heartbeat_s=0.2)
    wait_for(lambda: Run.objects.get(pk=run["id"]).heartbeat_at > old, timeout=30, what="a heartbeat batch")
    assert sink.close(timeout=10) == 0 and sink.sent >= 1 and not sink.rejected


def test_flush_journals_to_the_outbox_without_waiting_for_the_server(asgi_server, researcher, tmp_path):
    """The trainer flushes before publishing a checkpoint. A remote sink cannot wait for the server (an
    outage must not stop training), so its flush writes what was emitted to the outbox: a process
    killed right after the checkpoint has those steps on disk, and ``engine push`` delivers them. The
    sink here would otherwise seal nothing for an hour."""
    from engine.cli import main
    from engine.client import Client
    from engine.jsonl import read_jsonl
    from engine.remote import RemoteSink, outbox_path, start_remote_run
    from webapp.api.auth import create_token
    from webapp.runs.models import MetricPoint

    token = create_token(researcher, "t")[1]
    run = start_remote_run(Client(asgi_server.url, token), {**CONFIG, "name": "flushed"})
    dead = Client(f"http://127.0.0.1:{free_port()}", token)  # the dashboard is unreachable
    sink = RemoteSink(dead, run["id"], max_delay=3600, max_backoff=0.2)
    sink.run_started(CONFIG, str(tmp_path))
    for step in (1, 2):
        sink.metrics(step, {"train/reward_mean": step / 10})
    sink.flush()
    journaled = [
        (ev["step"], ev["values"]["train/reward_mean"])
        for item in read_jsonl(outbox_path(tmp_path / "remote", run["id"]))
        for ev in item.get("events", [])
        if ev["type"] == "metrics"
    ]
    assert journaled == [(1, 0.1), (2, 0.2)]
    # The process "dies" here (its sender never reaches the server); push delivers the journal.
    assert main(["push", str(tmp_path), "--report-to", asgi_server.url, "--token", token]) == 0
    stored = sorted(MetricPoint.objects.filter(run_id=run["id"]).values_list("step", "value"))
    assert stored == [(1, 0.1), (2, 0.2)]
    sink.close(timeout=0.5)
