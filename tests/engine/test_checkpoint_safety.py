"""Resume never runs code from a checkpoint: the state file loads with ``weights_only=True`` and only
checkpoint names the engine writes are followed (issue 16 item 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import engine
from engine.trainer import STATE_FILE, CheckpointError, latest_checkpoint


class _Payload:
    """Unpickling this creates a file: proof that a loader ran code from the checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.fixture
def stopped_run(small_config, tmp_path):
    """A run stopped after its first iteration, with a real checkpoint to tamper with."""
    out = tmp_path / "run"
    cfg = small_config(train={"n_iters": 3, "save_every": 1, "eval_every": 0, "output_dir": str(out)})
    summary = engine.train(cfg, should_stop=lambda: (out / "checkpoints" / "latest.json").exists())
    assert summary["stopped"]
    return cfg, out


def test_tampered_checkpoint_is_refused_and_its_payload_never_runs(stopped_run, tmp_path):
    cfg, out = stopped_run
    ck = latest_checkpoint(out)
    marker = tmp_path / "pwned"
    torch.save({"phase": "rl", "iteration": 1, "policy": _Payload(marker)}, ck / STATE_FILE)
    with pytest.raises(CheckpointError, match="refusing to load"):
        engine.train(cfg, resume_from=str(out))
    assert not marker.exists()


@pytest.mark.parametrize("name", ["/etc", "../../elsewhere/rl-000001", "rl-000001/../../x", "model", ""])
def test_checkpoint_names_the_engine_does_not_write_are_refused(stopped_run, name):
    cfg, out = stopped_run
    (out / "checkpoints" / "latest.json").write_text(json.dumps({"name": name}))
    with pytest.raises(CheckpointError, match="refusing checkpoint name"):
        engine.train(cfg, resume_from=str(out))


def test_a_genuine_checkpoint_still_resumes(stopped_run):
    cfg, out = stopped_run
    summary = engine.train(cfg, resume_from=str(out))
    assert not summary["stopped"] and summary["iterations"] == 3
