"""``supervised.task`` gives the SFT phase its own data; a finished run writes ``eval_results.json`` in the
format of ``python -m engine eval --output``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import engine
from engine.config import ConfigError, parse_config
from engine.events import NullSink

IMDB4 = {"id": "imdb", "max_train_samples": 4}
SFT = {"enabled": True, "batch_size": 2, "epochs": 2, "learning_rate": 1e-3, "max_target_length": 16}


class Recorder(NullSink):
    def __init__(self) -> None:
        self.sft_losses: list[float] = []
        self.logs: list[str] = []
        self.train_prompts: list[str] = []

    def metrics(self, step, values):
        if "sft/loss" in values:
            self.sft_losses.append(values["sft/loss"])

    def samples(self, step, split, rows):
        if split == "train":
            self.train_prompts += [r["prompt"] for r in rows]

    def log(self, message):
        self.logs.append(message)


def _run(cfg: dict) -> tuple[dict, Recorder]:
    rec = Recorder()
    return engine.train(cfg, sink=rec), rec


def test_supervised_task_is_the_sft_data_and_rl_keeps_the_run_task(small_config, tmp_path):
    # Reference: a plain SFT run whose own task is 4 IMDB reviews. The same seed gives the same
    # batches and dropout, so an SFT phase on the same data reproduces its losses exactly.
    ref_cfg = small_config(
        algorithm={"id": "sft"}, supervised=SFT, train={"n_iters": 0, "output_dir": str(tmp_path / "ref")}
    )
    ref_cfg["task"] = dict(IMDB4)  # replaced whole: the synthetic task's arguments do not apply
    ref, ref_rec = _run(ref_cfg)
    assert ref["sft_steps"] == 4 and len(ref_rec.sft_losses) == 4

    # Supervised + PPO: RL on the synthetic task, SFT on supervised.task.
    warm, warm_rec = _run(
        small_config(
            supervised={**SFT, "task": IMDB4},
            train={"n_iters": 1, "output_dir": str(tmp_path / "warm")},
        )
    )
    assert warm["sft_steps"] == 4 and warm["iterations"] == 1
    assert warm_rec.sft_losses == pytest.approx(ref_rec.sft_losses, rel=1e-6)
    assert any("task 'imdb'" in m and "4 (prompt, reference) pairs" in m for m in warm_rec.logs)
    # RL and evaluation stay on the run's task (the synthetic prompt is the EOS token).
    assert warm_rec.train_prompts and set(warm_rec.train_prompts) == {"<|endoftext|>"}
    results = json.loads(Path(warm["eval_results"]).read_text())
    assert {r["prompt"] for r in results["samples"]} == {"<|endoftext|>"}

    # A pure "sft" run with supervised.task trains on it and evaluates on its own task.
    pure, pure_rec = _run(
        small_config(
            algorithm={"id": "sft"},
            supervised={**SFT, "task": IMDB4},
            train={"n_iters": 0, "output_dir": str(tmp_path / "pure")},
        )
    )
    assert pure_rec.sft_losses == pytest.approx(ref_rec.sft_losses, rel=1e-6)
    results = json.loads((tmp_path / "pure" / "eval_results.json").read_text())
    assert {r["prompt"] for r in results["samples"]} == {"<|endoftext|>"}


def test_supervised_task_validation(small_config):
    with pytest.raises(ConfigError, match=r"supervised\.task\.idd: unknown key"):
        parse_config(small_config(supervised={"enabled": True, "task": {"idd": "imdb"}}))
    # An empty mapping (an empty YAML box in the launch form) means "the run's task".
    assert parse_config(small_config(supervised={"task": {}})).supervised.task is None
    assert parse_config(small_config(supervised={"task": {"id": "imdb"}})).supervised.task.id == "imdb"


def test_run_writes_eval_results_like_the_eval_command(small_config, tmp_path):
    cfg = small_config(train={"n_iters": 1, "output_dir": str(tmp_path / "run")})
    summary = engine.train(cfg)
    path = tmp_path / "run" / "eval_results.json"
    assert summary["eval_results"] == str(path)
    run_doc = json.loads(path.read_text())
    assert run_doc["split"] == "validation" and run_doc["model"] == summary["model_dir"]
    assert run_doc["metrics"] == {k.removeprefix("eval/"): v for k, v in summary["eval"].items()}
    assert run_doc["n_samples"] == len(run_doc["samples"]) == 16
    # Generation, reward and each configured metric (by its first key) are timed, nothing else.
    metric_keys = {k for k in run_doc["metrics"] if not k.startswith("reward_")}
    assert {"generate", "reward"} <= set(run_doc["timings_s"]) <= {"generate", "reward"} | metric_keys
    assert len(run_doc["timings_s"]) == 2 + len(parse_config(cfg).eval.metrics)

    # Re-evaluating the saved model with greedy decoding gives the same document.
    out = tmp_path / "eval.json"
    engine.evaluate(parse_config(cfg), model_path=summary["model_dir"], output=str(out))
    eval_doc = json.loads(out.read_text())
    assert list(eval_doc) == list(run_doc)
    assert [list(r) for r in eval_doc["samples"]] == [list(r) for r in run_doc["samples"]]
    assert [r["generation"] for r in eval_doc["samples"]] == [r["generation"] for r in run_doc["samples"]]
    assert eval_doc["metrics"] == pytest.approx(run_doc["metrics"])


def test_zero_shot_and_stopped_runs(small_config, tmp_path):
    zs = engine.train(
        small_config(train={"n_iters": 0, "save_final_model": False, "output_dir": str(tmp_path / "zs")})
    )
    assert json.loads(Path(zs["eval_results"]).read_text())["model"] == "builtin:tiny-gpt2"
    stopped = engine.train(
        small_config(train={"n_iters": 2, "output_dir": str(tmp_path / "stop")}), should_stop=lambda: True
    )
    assert stopped["stopped"] and "eval_results" not in stopped
    assert not (tmp_path / "stop" / "eval_results.json").exists()
