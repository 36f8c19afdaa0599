"""Checkpoint / resume continues the same trajectory; the stop flag leaves a consistent checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

import engine
from engine.events import NullSink


class StepWatcher(NullSink):
    def __init__(self):
        self.rl_step = 0
        self.sft_step = 0

    def metrics(self, step, values):
        if "train/reward_mean" in values:
            self.rl_step = step
        if "sft/loss" in values:
            self.sft_step = step


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.parametrize(
    "variant,stop_at,eval_at_start",
    [
        ("ppo", ("rl", 2), False),
        ("supervised_nlpo", ("sft", 2), False),
        ("supervised_nlpo", ("rl", 1), False),
        # the step-0 evaluation: once in the uninterrupted run, once in the split one (a run resumed in
        # RL does not repeat it; a run resumed in its supervised phase has not had it yet)
        ("ppo", ("rl", 2), True),
        ("supervised_nlpo", ("sft", 2), True),
    ],
)
def test_stop_and_resume_reproduce_the_uninterrupted_run(
    small_config, tmp_path, variant, stop_at, eval_at_start
):
    over = {
        "train": {"n_iters": 4, "save_every": 2, "eval_every": 2, "eval_at_start": eval_at_start},
        "kl": {"controller": "adaptive", "init_coef": 0.2, "target": 0.05, "horizon": 50},
    }
    if variant == "supervised_nlpo":
        over["algorithm"] = {
            "id": "nlpo",
            "nlpo": {"top_mask": 0.5, "min_tokens_to_keep": 20, "mask_update_interval": 2},
        }
        over["supervised"] = {"enabled": True, "max_steps": 4, "batch_size": 4}
        over["train"]["n_iters"] = 3
    full_dir, split_dir = tmp_path / "full", tmp_path / "split"
    full = engine.train(small_config(**{**over, "train": {**over["train"], "output_dir": str(full_dir)}}))
    assert not full["stopped"]

    watcher = StepWatcher()
    phase, at = stop_at
    stop = (lambda: watcher.rl_step >= at) if phase == "rl" else (lambda: watcher.sft_step >= at)
    cfg = small_config(**{**over, "train": {**over["train"], "output_dir": str(split_dir)}})
    part = engine.train(cfg, sink=watcher, should_stop=stop)
    assert part["stopped"] and part["model_dir"] is None
    assert not (split_dir / "eval_results.json").exists()  # only a finished run has a final evaluation
    latest = json.loads((split_dir / "checkpoints" / "latest.json").read_text())["name"]
    assert latest == f"{phase}-{at:06d}"  # the checkpoint is exactly where the run stopped
    state = json.loads((split_dir / "checkpoints" / latest / "trainer_state.json").read_text())
    assert state["phase"] == phase and (state["iteration"] if phase == "rl" else state["sft_step"]) == at

    resumed = engine.train(cfg, resume_from=str(split_dir))
    assert not resumed["stopped"] and resumed["iterations"] == full["iterations"]
    assert _metrics(split_dir) == _metrics(full_dir)
    eval_steps = [r["step"] for r in _metrics(full_dir) if "eval/reward_mean" in r]
    expected = list(range(0 if eval_at_start else 2, over["train"]["n_iters"] + 1, 2))
    if over["train"]["n_iters"] % 2:
        expected.append(over["train"]["n_iters"])  # the final evaluation off the eval_every grid
    assert eval_steps == expected
    # The resumed run's final evaluation file matches the uninterrupted run's (model paths and the
    # wall-clock timings aside).
    docs = [json.loads((d / "eval_results.json").read_text()) for d in (full_dir, split_dir)]
    assert docs[0]["model"] == full["model_dir"] and docs[1]["model"] == resumed["model_dir"]
    assert docs[0]["timings_s"].keys() == docs[1]["timings_s"].keys()
    full_doc, split_doc = ({k: v for k, v in d.items() if k not in ("model", "timings_s")} for d in docs)
    assert split_doc == full_doc


def test_run_directory_contents(small_config, tmp_path):
    run = tmp_path / "run"
    summary = engine.train(small_config(train={"output_dir": str(run), "n_iters": 2, "eval_every": 1}))
    assert json.loads((run / "config.json").read_text())["name"] == "test"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*metrics)
    for k in (
        "train/reward_mean",
        "train/reward_std",
        "train/kl",
        "train/kl_coef",
        "loss/policy",
        "loss/value",
        "loss/total",
        "policy/entropy",
        "policy/approx_kl",
        "policy/clipfrac",
        "value/mean",
        "value/explained_var",
        "time/iteration_s",
        "eval/reward_mean",
    ):
        assert k in keys, k
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {"prompt", "generation", "references", "reward", "split", "step"} <= set(samples[0])
    assert {s["split"] for s in samples} == {"train", "validation"}
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert events[0] == "run_started" and events[-1] == "finished" and "progress" in events
    model_dir = Path(summary["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.n_layer == 2 and tok.eos_token == "<|endoftext|>"
    assert (model_dir / "value_head.safetensors").exists()
