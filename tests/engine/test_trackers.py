"""Tracker exports (``train.report_to``): a real tiny-model run read back with each tracker's own reader.

TensorBoard's EventAccumulator, MLflow's client on a local file store and W&B's offline run file
(decoded with wandb's own protobuf ``Record``) must each hold every finite metric of the run's
``metrics.jsonl`` at the same step. A tracker whose server is down must not stop the run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import socket
import struct
from pathlib import Path
from typing import Any

import pytest
from mlflow.artifacts import load_dict
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

import engine
import engine.trackers
from engine.cli import main as cli_main
from engine.client import Client
from engine.config import ConfigError, parse_config
from engine.remote import start_remote_run
from engine.trackers import TrackerUnavailable, check_available
from engine.trackers.base import flatten
from engine.trackers.tensorboard import samples_markdown

ALL = ["tensorboard", "mlflow", "wandb"]


def expected_series(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` from the run directory's metrics.jsonl (finite numbers only)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key in ("step", "phase") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                series.setdefault(key, []).append((row["step"], float(value)))
    return series


def wandb_records(path: Path) -> list[Any]:
    """The records of a W&B run file (``run-<id>.wandb``): W&B's LevelDB-style log (a 7-byte ``:W&B``
    header, 32 KiB blocks, 7-byte record headers: crc32c, length, type FULL/FIRST/MIDDLE/LAST), each
    record a wandb ``Record`` protobuf."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, pos, parts, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        assert kind in (1, 2, 3, 4), f"bad record type {kind} at byte {pos}"
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def test_a_run_exports_every_metric_to_tensorboard_mlflow_and_wandb(small_config, tmp_path, monkeypatch):
    store = tmp_path / "mlruns"
    # The trackers' own variables are honoured: the MLflow store, the experiment and W&B's mode.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "trackers-test")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "grue-tests")
    cfg = small_config(
        supervised={"enabled": True, "max_steps": 2, "batch_size": 8},
        # SFT steps 1, 2 then RL iteration 1: W&B's own _step only grows, so the RL point must not be
        # logged at "step 1 after step 2" (it goes against its own step column); one iteration and no
        # saved model keep the run short.
        train={"n_iters": 1, "eval_every": 0, "save_final_model": False, "report_to": ALL},
    )
    summary = engine.train(cfg)
    run_dir = Path(summary["run_dir"])
    want = expected_series(run_dir)
    assert {"sft/loss", "train/reward_mean", "eval/reward_mean"} <= set(want), sorted(want)
    assert [s for s, _ in want["sft/loss"]] == [1, 2] and [s for s, _ in want["train/reward_mean"]] == [1]
    log = (run_dir / "events.jsonl").read_text()
    assert "export failed" not in log and "still busy" not in log

    # TensorBoard: every scalar at the engine's steps, samples and config as text.
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for key, points in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in points], key
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-6), key
    texts = set(acc.Tags()["tensors"])
    assert {"config/text_summary", "samples/train/text_summary", "status/text_summary"} <= texts, texts

    # MLflow (file store from MLFLOW_TRACKING_URI): params, metric histories, samples table, status.
    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.get_experiment_by_name("trackers-test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["grue.status"] == "succeeded"
    assert run.data.params["algorithm.learning_rate"] == "0.001"
    assert run.data.params["train.report_to"] == json.dumps(ALL)
    assert len(run.data.params) == len(flatten(parse_config(cfg).to_dict()))
    for key, points in want.items():
        got = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert got == points, key
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "samples/train")}
    assert artifacts == {"samples/train/step-000001.json"}, artifacts
    assert [a.path for a in client.list_artifacts(run.info.run_id, "samples/validation")] == [
        "samples/validation/step-000001.json"
    ]
    table = load_dict(f"{run.info.artifact_uri}/samples/train/step-000001.json")
    assert table["columns"][0] == "step" and {"prompt", "generation"} <= set(table["columns"])
    assert {row[0] for row in table["data"]} == {1} and len(table["data"]) == 2

    # W&B offline: the run file in <run dir>/wandb holds the config, every metric against its step
    # column, the sample tables, the summary status and exit code 0.
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    kinds = [r.WhichOneof("record_type") for r in records]
    (run_record,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run_record.project == "grue-tests" and run_record.display_name == run_dir.name
    config = {_key(i): json.loads(i.value_json) for i in run_record.config.update}
    assert config["algorithm"]["learning_rate"] == 0.001 and config["train"]["report_to"] == ALL
    got: dict[str, list[tuple[int, float]]] = {}
    tables = set()
    for r in records:
        if r.WhichOneof("record_type") != "history":
            continue
        row = {_key(i): json.loads(i.value_json) for i in r.history.item}
        for key, value in row.items():
            if key.endswith("/_type") and value == "table-file":  # a wandb.Table, stored as a file
                name = key.removesuffix("/_type")
                tables.add(name)
                table = json.loads((run_file.parent / "files" / row[f"{name}/path"]).read_text())
                assert table["columns"][0] == "step" and "generation" in table["columns"]
            elif key in want:
                got.setdefault(key, []).append((row["sft/step" if key.startswith("sft/") else "step"], value))
    for key, points in want.items():
        assert [s for s, _ in got[key]] == [s for s, _ in points], key
        assert [v for _, v in got[key]] == pytest.approx([v for _, v in points], rel=1e-12), key
    assert {"samples/train", "samples/validation"} <= tables, tables
    summary_items = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary_items.update({_key(i): json.loads(i.value_json) for i in r.summary.update})
    assert summary_items["grue/status"] == "succeeded", summary_items
    (exit_record,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 0, kinds


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_tracker_whose_server_is_down_does_not_stop_training(small_config, tmp_path, monkeypatch):
    # MLflow retries a refused connection 7 times with backoff by default; one try keeps the test short.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"http://127.0.0.1:{_closed_port()}"
    cfg = small_config(
        train={
            "n_iters": 1,
            "save_final_model": False,
            "report_to": ["mlflow", "tensorboard"],
            "trackers": {"mlflow": {"tracking_uri": uri}},
        }
    )
    summary = engine.train(cfg)
    run_dir = Path(summary["run_dir"])
    assert summary["stopped"] is False and summary["iterations"] == 1
    assert [s for s, _ in expected_series(run_dir)["train/reward_mean"]] == [1]
    logs = [
        json.loads(line)["message"]
        for line in (run_dir / "events.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "log"
    ]
    failures = [m for m in logs if m.startswith("mlflow export failed")]
    assert len(failures) == 1, logs  # warned once
    assert "the run goes on without mlflow" in failures[0]
    # The other tracker is unaffected.
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/reward_mean")] == [1]


def test_report_to_is_validated_with_the_known_ids():
    with pytest.raises(ConfigError) as info:
        parse_config({"train": {"report_to": ["tensorboard", "tensorbord"]}})
    assert info.value.errors == [
        (
            "train.report_to",
            "Value error, unknown tracker id 'tensorbord'; known tracker ids: tensorboard, mlflow, wandb",
        )
    ]
    # A comma-separated string (a --set value) works; repeats collapse.
    cfg = parse_config({"train": {"report_to": "mlflow, tensorboard,mlflow"}})
    assert cfg.train.report_to == ["mlflow", "tensorboard"]
    assert parse_config({}).train.report_to == []
    with pytest.raises(ConfigError) as info:
        parse_config({"train": {"trackers": {"wandb": {"mode": "cloud"}}}})
    assert info.value.errors[0][0] == "train.trackers.wandb.mode"


def test_a_missing_tracker_package_names_the_pip_install(monkeypatch, small_config, tmp_path):
    info = engine.trackers.TRACKERS["wandb"]
    monkeypatch.setitem(
        engine.trackers.TRACKERS, "wandb", dataclasses.replace(info, package="grue_no_such_package")
    )
    with pytest.raises(TrackerUnavailable) as exc:
        check_available(["tensorboard", "wandb"])
    assert str(exc.value) == (
        "train.report_to: tracker 'wandb' needs the wandb package, which is not installed: "
        "pip install 'grue-studio[trackers]' (or pip install wandb)"
    )
    # A run fails with that message before it writes anything.
    cfg = small_config(train={"report_to": ["wandb"]})
    with pytest.raises(TrackerUnavailable):
        engine.train(cfg)
    assert not (tmp_path / "run").exists()


def test_samples_markdown_keeps_one_row_per_sample():
    text = samples_markdown(
        [{"prompt": "a|b", "generation": "x\ny", "reward": 0.5}, {"prompt": "c", "extra": [1]}]
    )
    assert text.splitlines() == [
        "| prompt | generation | reward | extra |",
        "|---|---|---|---|",
        "| a\\|b | x<br>y | 0.5 |  |",
        "| c |  |  | [1] |",
    ]


def test_the_cli_lists_the_trackers(capsys):
    assert cli_main(["components"]) == 0
    out = capsys.readouterr().out
    listed = out[out.index("trackers:") :].splitlines()[1:4]
    assert [line.split()[0] for line in listed] == sorted(ALL)


@pytest.mark.django_db(transaction=True)
def test_a_remote_run_keeps_its_tracker_options_on_its_own_machine(asgi_server, researcher, small_config):
    from webapp.api.auth import create_token
    from webapp.runs.models import Run

    client = Client(asgi_server.url, create_token(researcher, "trackers")[1])
    cfg = small_config(
        train={
            "report_to": ["tensorboard", "mlflow"],
            "trackers": {
                "tensorboard": {"log_dir": "/home/someone/tb"},  # the training machine's paths and server
                "mlflow": {"tracking_uri": "http://mlflow.cluster.internal:5000"},
            },
        }
    )
    run = start_remote_run(client, parse_config(cfg).to_dict())
    stored = Run.objects.get(pk=run["id"]).config
    assert stored["train"]["report_to"] == ["tensorboard", "mlflow"]
    assert stored["train"]["trackers"] == parse_config({}).train.trackers.model_dump()
