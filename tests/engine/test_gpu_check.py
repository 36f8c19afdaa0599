"""``bench/gpu_check.py`` on the CPU: the commands it would run on a GPU, its deadline and missing-TRL
handling, and the one stage that fits in a test run for real (a one-process torchrun PPO run, gloo here,
nccl there), through the same code that writes the summary table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check  # its dataclasses look their module up
_spec.loader.exec_module(gpu_check)


def test_cuda_stages_ask_for_bf16_nccl_and_the_gpu_marked_tests(tmp_path: Path):
    stages = {s.name: s for s in gpu_check.build_stages("cuda", tmp_path, tmp_path / "t12", tmp_path / "t16")}
    assert list(stages) == list(gpu_check.STAGES)
    assert stages["tests"].env == {"GRUE_TEST_DEVICE": "cuda"} and "gpu" in stages["tests"].cmd
    ppo = stages["ppo"].cmd
    assert ppo[ppo.index("--device") + 1] == "cuda" and ppo[ppo.index("--precision") + 1] == "bf16"
    separate = stages["ppo-separate"].cmd
    assert separate[separate.index("--value-head") + 1] == "separate"
    assert separate[separate.index("--precision") + 1] == "bf16"
    assert "--bf16" in stages["trl-ppo"].cmd and stages["trl-ppo"].env["PYTHONPATH"] == str(tmp_path / "t12")
    assert "--bf16" in stages["trl-grpo"].cmd and stages["trl-grpo"].needs == tmp_path / "t16"
    assert stages["torchrun"].env["GRUE_DIST_BACKEND"] == "nccl"
    cfg = json.loads(
        Path(stages["torchrun"].cmd[stages["torchrun"].cmd.index("--torchrun-child") + 1]).read_text()
    )
    assert cfg["model"]["device"] == "cuda" and cfg["model"]["mixed_precision"] == "bf16"
    total = sum(s.timeout_s for s in stages.values())
    assert total >= 480  # each stage's own cap; the overall deadline (480 s) is what bounds the run


def test_no_cuda_device_is_a_clear_error():
    if torch.cuda.is_available():  # on a GPU machine the check itself is the test
        assert "cuda" in gpu_check.device_name("cuda")
        return
    with pytest.raises(SystemExit, match="no CUDA device visible"):
        gpu_check.main(["--device", "cuda", "--stages", "torchrun"])


def test_unknown_stage_and_missing_trl_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "cpu", "--stages", "tests,gpu-magic"])
    assert "gpu-magic" in capsys.readouterr().err
    stages = gpu_check.build_stages("cpu", tmp_path, tmp_path / "absent", tmp_path / "absent")
    stage = next(s for s in stages if s.name == "trl-ppo")
    result = gpu_check.run_stage(stage, 100.0)
    assert result.status == "missing" and "absent" in result.summary
    assert gpu_check.run_stage(
        gpu_check.build_stages("cpu", tmp_path, tmp_path, tmp_path)[1], 1.0
    ).status == ("timeout")


def test_summary_cells_read_the_bench_scripts_json():
    ppo = {
        "results": {"iteration_s": 3.5, "generate_s": 1, "score_s": 0.5, "update_s": 2, "peak_mem_mb": 900}
    }
    assert gpu_check.summarise("ppo", ppo).startswith("3.50 s/iteration (generate 1.00")
    assert gpu_check.summarise("trl-ppo", {"best": {"iteration_s": 7.25}, "peak_mem_mb": 1200}).startswith(
        "7.25 s"
    )
    assert gpu_check.summarise("trl-grpo", {"beta=0.04": {"best_wall_s": 2.0}}) == "2.00 s/step"
    assert gpu_check.summarise(
        "grpo", {"results": {"beta=0.04": {"iteration_s": 1.5, "peak_mem_mb": 10}}}
    ) == ("1.50 s/step, peak 10 MB")


def test_torchrun_stage_runs_one_process_and_fills_the_table(tmp_path: Path):
    """The one-process torchrun launch, for real (gloo on the CPU; the GPU check sets nccl)."""
    rc = gpu_check.main(
        ["--device", "cpu", "--stages", "torchrun", "--out", str(tmp_path), "--deadline-s", "900"]
    )
    table = (tmp_path / "summary.md").read_text()
    assert rc == 0, table
    assert (
        "| torchrun | ok |" in table and "2 PPO iterations logged, loss finite: True, backend gloo" in table
    )
    assert json.loads((tmp_path / "summary.json").read_text())[0]["status"] == "ok"


def test_a_model_folder_reaches_every_smollm2_stage_and_threads_are_equal(tmp_path: Path):
    stages = {
        s.name: s
        for s in gpu_check.build_stages(
            "cuda", tmp_path, tmp_path / "t12", tmp_path / "t16", model="/m/random", threads=6
        )
    }
    for name in ("ppo", "ppo-separate", "trl-ppo", "grpo", "trl-grpo"):
        cmd = stages[name].cmd
        assert cmd[cmd.index("--model") + 1] == "/m/random", name
        assert cmd[cmd.index("--threads") + 1] == "6", name
    # only the module that holds the gpu-marked tests is collected (the rest imports the web stack)
    assert gpu_check.DEVICE_TESTS in stages["tests"].cmd and "tests/engine" not in stages["tests"].cmd
    default = gpu_check.build_stages("cuda", tmp_path, tmp_path, tmp_path)
    assert all("--model" not in s.cmd for s in default)


def test_random_weights_keep_the_architecture_and_tokenizer_but_not_the_weights(tmp_path: Path):
    """What travels to a device machine is a config and a tokenizer (``--export-arch``); the weights
    are drawn there. Shown with the builtin tiny GPT-2 as the architecture."""
    import shutil

    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    from engine.models.builtin import builtin_model_dir

    src = builtin_model_dir("builtin:tiny-gpt2")
    arch = tmp_path / "arch"
    arch.mkdir()
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(gpu_check.WEIGHT_FILES):
            shutil.copy2(f, arch / f.name)
    out = gpu_check.random_weights(arch, tmp_path / "model", seed=3)
    assert AutoConfig.from_pretrained(out).to_dict()["n_embd"] == AutoConfig.from_pretrained(src).n_embd
    assert (
        AutoTokenizer.from_pretrained(out)("hello world").input_ids
        == AutoTokenizer.from_pretrained(src)("hello world").input_ids
    )
    drawn = load_file(str(next(out.glob("*.safetensors"))))
    original = load_file(str(next(src.glob("*.safetensors"))))
    key = "transformer.h.0.attn.c_attn.weight"
    assert drawn[key].shape == original[key].shape and not torch.equal(drawn[key], original[key])
    again = gpu_check.random_weights(arch, tmp_path / "again", seed=3)  # seeded: the same draw
    assert torch.equal(load_file(str(next(again.glob("*.safetensors"))))[key], drawn[key])


def test_a_stage_keeps_the_callers_pythonpath_after_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Packages carried to a device machine sit on the caller's PYTHONPATH: a TRL stage that puts its
    own folder first must not drop them."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "carried"))
    probe = gpu_check.Stage(
        "probe",
        [sys.executable, "-c", "import os; print(os.environ['PYTHONPATH'])"],
        {"PYTHONPATH": str(tmp_path / "trl")},
    )
    result = gpu_check.run_stage(probe, 60.0)
    assert result.status == "ok"
    parts = result.tail.strip().split(":")
    assert parts == [str(tmp_path / "trl"), str(REPO), str(tmp_path / "carried")]
