"""The command line: train/eval/schema/presets/import-gguf and its error messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from engine.cli import main

TINY = {
    "name": "cli",
    "model": {"name_or_path": "builtin:tiny-gpt2"},
    "task": {"id": "synthetic_increasing_numbers", "args": {"n_samples": 8}},
    "reward": {"id": "increasing_numbers", "args": {"min_tokens": 20}},
    "rollout": {"max_new_tokens": 4, "batch_size": 8},
    "algorithm": {"id": "ppo", "n_epochs": 1, "minibatch_size": 8},
    "train": {"n_iters": 1, "prompts_per_iter": 8, "eval_every": 0, "log_samples": 1},
    "eval": {"generation": {"max_new_tokens": 4, "do_sample": False}},
}


def _write(tmp_path: Path, data: dict, name: str = "cfg.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_train_then_eval_then_resume_finished_run(tmp_path, capsys):
    cfg = _write(tmp_path, TINY)
    run = tmp_path / "run"
    assert (
        main(["train", str(cfg), "--quiet", "--set", f"train.output_dir={run}", "--set", "train.n_iters=2"])
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["iterations"] == 2 and Path(summary["model_dir"]).is_dir()
    assert json.loads((run / "config.json").read_text())["train"]["n_iters"] == 2
    out = tmp_path / "eval.json"
    assert (
        main(["eval", "--run", str(run), "--split", "test", "--output", str(out), "--max-samples", "3"]) == 0
    )
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    assert printed["n_samples"] == 3 and saved["split"] == "test"
    assert "reward_mean" in saved["metrics"] and len(saved["samples"]) == 3
    # a second fresh run into the same directory is refused with the way out
    assert main(["train", str(cfg), "--quiet", "--set", f"train.output_dir={run}"]) == 2
    assert f"--resume {run}" in capsys.readouterr().err
    # resuming a finished run needs no CONFIG and does no more iterations
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["iterations"] == 2


def test_errors_name_what_is_wrong(tmp_path, capsys):
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel:\n  name_or_path: [unclosed\ntrain: {}\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad YAML" in err and "line" in err

    cfg = _write(tmp_path, TINY)
    assert main(["train", str(cfg), "--set", "train.n_itrs=3"]) == 2
    assert "train.n_itrs: unknown key" in capsys.readouterr().err

    assert (
        main(
            [
                "train",
                str(cfg),
                "--quiet",
                "--set",
                "reward.id=no_such_reward",
                "--set",
                f"train.output_dir={tmp_path / 'r'}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "no_such_reward" in err and "increasing_numbers" in err and "digit_fraction" in err

    assert (
        main(
            [
                "train",
                str(cfg),
                "--quiet",
                "--set",
                "model.name_or_path=nobody/not-a-model",
                "--set",
                f"train.output_dir={tmp_path / 'h'}",
            ]
        )
        == 2
    )
    assert "local directory" in capsys.readouterr().err

    assert main(["import-gguf", str(tmp_path / "nope.gguf")]) == 2
    assert "GGUF file not found" in capsys.readouterr().err

    assert main(["train"]) == 2
    assert "--preset" in capsys.readouterr().err


def test_schema_presets_and_components(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "rollout" in schema["properties"] and "algorithm" in schema["properties"]
    assert main(["presets"]) == 0
    assert "synthetic" in capsys.readouterr().out
    assert main(["components"]) == 0
    out = capsys.readouterr().out
    assert "ppo" in out and "nlpo" in out and "sft" in out and "adaptive" in out


def test_the_config_reference_in_docs_is_the_generated_one(capsys):
    # docs/engine.md's field table is what `python -m engine schema --markdown` prints: a field added
    # to the pydantic models without regenerating the table fails here, naming the missing rows.
    assert main(["schema", "--markdown"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    doc = (Path(__file__).resolve().parents[2] / "docs" / "engine.md").read_text().splitlines()
    missing = [row for row in table if row not in doc]
    assert not missing, "docs/engine.md lacks (run python -m engine schema --markdown):\n" + "\n".join(
        missing
    )


def test_python_dash_m_entry_point():
    res = subprocess.run(
        [sys.executable, "-m", "engine", "--help"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and "import-gguf" in res.stdout
