"""The peer's side of the GRPO benchmark: TRL's ``GRPOTrainer`` on the same workload, on this machine.

Not a test, and TRL is not a dependency of GRUE Studio: install it apart, e.g.
``pip install --no-deps --target /tmp/trlpkg "trl==1.16.0"`` and run with ``PYTHONPATH=/tmp/trlpkg``.

Why it exists: the group-algorithm issue quotes TRL 1.16 at ~25 s (β 0.04) and ~21 s (β 0) per step of
this workload on the machine the issue was written on (AVX-512 BF16). A later machine without native bf16
is slower for both programs, so the ratio is only meaningful when both run on the same CPU: this script
measures TRL here, and ``bench/engine_step.py --grpo`` measures the engine.

Workload (as ``bench/engine_step.py --grpo``): SmolLM2-135M-Instruct from the offline GGUF import, fp32,
2 threads; 4 IMDB prompts (first half of the words of a review from the shipped fixture, at most 64
tokens) × 4 completions × exactly 48 sampled tokens (``min_new_tokens`` = 48, temperature 1, no top-k /
top-p); VADER compound score of the completion as reward; one optimizer step on the 16 completions
(``per_device_train_batch_size`` 16, one gradient-accumulation step, ``num_iterations`` 1); β 0.04
(reference model) or 0 (none). Each timed step = one generation + scoring + update, timed by callback;
the first step of each trainer is a warm-up.

    PYTHONPATH=/tmp/trlpkg .venv/bin/python bench/peer_trl.py --steps 3 --json /tmp/trl.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def imdb_prompts(n: int) -> list[str]:
    """The first ``n`` training reviews' first halves (RL4LMs's IMDB prompt), as the engine's task."""
    from engine.data.imdb import split_words
    from engine.jsonl import read_jsonl

    rows = read_jsonl(ROOT / "engine/data/fixtures/imdb/train.jsonl")
    return [split_words(r["text"])[0] for r in rows[:n]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step, per beta")
    ap.add_argument("--betas", default="0.04,0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("--model", default="", help="a model folder instead of the SmolLM2 wheel's GGUF")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--bf16", action="store_true", help="TRL's bf16 flag; fp32 otherwise")
    ap.add_argument(
        "--gradient-checkpointing",
        choices=["trl-default", "on", "off"],
        default="off",
        help="TRL's configs turn it on by default (memory for compute); off is the faster peer",
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    from engine.assets import smollm2_gguf_path
    from engine.models.loading import resolve_model_path

    path = args.model or resolve_model_path(str(smollm2_gguf_path()))
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    prompts = [tok.decode(tok(p).input_ids[:64]) for p in imdb_prompts(4)]
    vader = SentimentIntensityAnalyzer()

    def reward(completions: list[str], **_: Any) -> list[float]:
        return [vader.polarity_scores(c)["compound"] for c in completions]

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.steps.append(
                {
                    "wall_s": time.perf_counter() - self.t0,
                    "cpu_s": time.process_time() - self.c0,
                    "load_average_1m": os.getloadavg()[0],
                }
            )
            print("step", len(self.steps), self.steps[-1], flush=True)

    out: dict[str, Any] = {
        "trl": __import__("trl").__version__,
        "torch": torch.__version__,
        "gradient_checkpointing": args.gradient_checkpointing,
    }
    for beta in [float(b) for b in args.betas.split(",")]:
        n_steps = args.steps + 1
        # GRPO's sampler repeats each prompt num_generations times; a generation batch of 16 = 4 prompts.
        data = Dataset.from_dict({"prompt": prompts * n_steps})
        clock = Clock()
        with tempfile.TemporaryDirectory() as out_dir:
            cfg = GRPOConfig(
                output_dir=out_dir,
                learning_rate=1e-6,
                per_device_train_batch_size=16,
                gradient_accumulation_steps=1,
                num_generations=4,
                max_completion_length=48,
                generation_kwargs={"min_new_tokens": 48},
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                beta=beta,
                num_iterations=1,
                max_steps=n_steps,
                logging_steps=1,
                save_strategy="no",
                report_to=[],
                use_cpu=args.device == "cpu",
                bf16=args.bf16,
                fp16=False,
                dataloader_num_workers=0,
                seed=0,
                **(
                    {}
                    if args.gradient_checkpointing == "trl-default"
                    else {"gradient_checkpointing": args.gradient_checkpointing == "on"}
                ),
            )
            trainer = GRPOTrainer(
                model=path,
                reward_funcs=reward,
                args=cfg,
                train_dataset=data,
                processing_class=tok,
                callbacks=[clock],
            )
            trainer.train()
        timed = clock.steps[1:]
        best = min(timed, key=lambda r: r["wall_s"])
        out[f"beta={beta}"] = {
            "warm_up": clock.steps[0],
            "best_wall_s": best["wall_s"],
            "best_cpu_s": best["cpu_s"],
            "all_wall_s": [round(r["wall_s"], 2) for r in timed],
            "all_cpu_s": [round(r["cpu_s"], 2) for r in timed],
            "load_average_1m": [round(r["load_average_1m"], 2) for r in timed],
        }
        print("beta", beta, out[f"beta={beta}"], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
