"""The peer's side of the PPO benchmark: TRL's experimental ``PPOTrainer`` on the IMDB reference workload.

Not a test, and TRL is not a dependency of GRUE Studio: install it apart, e.g.
``pip install --no-deps --target /tmp/trlpkg112 "trl==1.12.*"`` and run with ``PYTHONPATH=/tmp/trlpkg112``.

Why it exists: the engine's speed claims for PPO (issues #9 and #30) are ratios against TRL, and a ratio
means something only when both programs ran on the same CPU in one sitting. ``bench/engine_step.py
--ppo-imdb`` measures the engine; this script measures TRL on the same work.

Workload (as ``bench/engine_step.py --ppo-imdb``): SmolLM2-135M-Instruct from the offline GGUF import,
2 threads; the 16 shipped IMDB prompts of 51–63 GPT-2 tokens (``bench/fixtures/imdb_ppo_reference.jsonl``),
left padded; exactly 48 sampled tokens (``min_new_tokens`` = 48 added to TRL's generation config,
temperature 1, no top-k/top-p); VADER compound score of the continuation as the reward; fixed KL
coefficient 0.05 (TRL's PPO has no adaptive controller); 4 PPO epochs × 4 minibatches of 4 (16 optimizer
steps per iteration); TRL's design: a separate value model (``AutoModelForSequenceClassification`` from the
same checkpoint, one label), a reference copy, AdamW. VADER is not a model, so TRL's ``get_reward`` is
wrapped: for the reward "model" (a placeholder module) it decodes the responses and scores them; the
value model still goes through TRL's own ``get_reward``. Each timed iteration is the wall time between
TRL's ``on_step_end`` callbacks (one rollout + scoring + 16 updates); the first is a warm-up.
Peak RSS is the process's high-water mark (``ru_maxrss``), which holds all of TRL's models.

    PYTHONPATH=/tmp/trlpkg112 .venv/bin/python bench/peer_trl_ppo.py --iterations 3 --json /tmp/trl_ppo.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--iterations", type=int, default=2, help="timed iterations after one warm-up (0: warm-up only)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="TRL's bf16 flag (autocast); fp32 otherwise")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--json", default="")
    ap.add_argument("--model", default="", help="a model folder instead of the SmolLM2 wheel's GGUF")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import trl
    import trl.experimental.ppo.ppo_trainer as ppo_mod
    from datasets import Dataset
    from engine_step import imdb_reference_prompts
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        TrainerCallback,
    )
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    from engine.assets import smollm2_gguf_path
    from engine.models.loading import resolve_model_path

    path = args.model or resolve_model_path(str(smollm2_gguf_path()))
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    prompts = imdb_reference_prompts()
    ids = [tok(p, truncation=True, max_length=128)["input_ids"] for p in prompts]
    vader = SentimentIntensityAnalyzer()

    class VaderReward(torch.nn.Module):
        """A placeholder for TRL's reward model slot; the wrapped ``get_reward`` scores with VADER."""

        def __init__(self) -> None:
            super().__init__()
            self.dummy = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    reward_model = VaderReward()
    trl_get_reward = ppo_mod.get_reward

    def get_reward(model: Any, query_responses: torch.Tensor, pad_token_id: int, context_length: int):
        if model is not reward_model:
            return trl_get_reward(model, query_responses, pad_token_id, context_length)
        texts = tok.batch_decode(query_responses[:, context_length:], skip_special_tokens=True)
        scores = [vader.polarity_scores(t)["compound"] for t in texts]
        return None, torch.tensor(scores, dtype=torch.float32, device=query_responses.device), None

    ppo_mod.get_reward = get_reward
    trl_generation_config = ppo_mod.GenerationConfig

    def generation_config(**kwargs: Any) -> Any:  # exactly 48 sampled tokens, as the engine's workload
        return trl_generation_config(min_new_tokens=kwargs["max_new_tokens"], **kwargs)

    ppo_mod.GenerationConfig = generation_config

    phases: dict[str, float] = {}
    trl_generate = ppo_mod.batch_generation

    def batch_generation(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return trl_generate(*a, **k)
        finally:
            phases["generate_s"] = phases.get("generate_s", 0.0) + time.perf_counter() - t0

    ppo_mod.batch_generation = batch_generation

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.rows: list[dict[str, float]] = []

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            now, cpu = time.perf_counter(), time.process_time()
            row = {
                "iteration_s": now - self.t0,
                "cpu_s": cpu - self.c0,
                "generate_s": phases.pop("generate_s", 0.0),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "load_average_1m": os.getloadavg()[0],
            }
            self.rows.append(row)
            print("trl ppo iteration", len(self.rows), row, flush=True)
            self.t0, self.c0 = time.perf_counter(), time.process_time()

    n_iter = args.iterations + 1
    dtype = torch.float32
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    value = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=dtype)
    value.config.pad_token_id = tok.pad_token_id
    data = Dataset.from_dict({"input_ids": ids})
    clock = Clock()
    with tempfile.TemporaryDirectory() as out_dir:
        cfg = PPOConfig(
            output_dir=out_dir,
            learning_rate=1e-6,
            # local batch 16 = per device 16 x accumulation 1; 4 minibatches of 4, each one micro batch and
            # one optimizer step (TRL's accumulation steps >1 would make accelerate skip 3 of 4 steps)
            per_device_train_batch_size=16,
            gradient_accumulation_steps=1,
            num_mini_batches=4,
            num_ppo_epochs=4,
            local_rollout_forward_batch_size=16,
            response_length=48,
            temperature=1.0,
            kl_coef=0.05,
            total_episodes=16 * n_iter,
            stop_token=None,
            missing_eos_penalty=None,
            num_sample_generations=0,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=args.device == "cpu",
            bf16=args.bf16,
            fp16=False,
            dataloader_num_workers=0,
            gradient_checkpointing=False,
            seed=0,
        )
        trainer = PPOTrainer(
            args=cfg,
            processing_class=tok,
            model=policy,
            ref_model=ref,
            reward_model=reward_model,
            train_dataset=data,
            eval_dataset=data,
            value_model=value,
            callbacks=[clock],
        )
        trainer.train()
    timed = clock.rows[1:]
    # --iterations 0: the warm-up alone (its peak RSS and CPU seconds, when a machine is too loaded for more)
    best = min(timed, key=lambda r: r["iteration_s"]) if timed else None
    out = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}, threads "
        f"{torch.get_num_threads()}",
        "trl": trl.__version__,
        "precision": "bf16" if args.bf16 else "fp32",
        "device": args.device,
        "warm_up": clock.rows[0],
        "best": best,
        "all_iteration_s": [round(r["iteration_s"], 2) for r in timed],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in clock.rows),
        "peak_mem_mb": (
            torch.cuda.max_memory_allocated() / 2**20
            if args.device == "cuda"
            else max(r["peak_rss_mb"] for r in clock.rows)
        ),
    }
    print(json.dumps(out, indent=2), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
