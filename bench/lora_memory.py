"""Peak memory of one PPO iteration on SmolLM2-135M with and without LoRA (CPU: peak RSS).

Not a test. Each variant runs in its own fresh Python process (so one variant's freed memory cannot
hide the other's peak): ``engine.train`` with one PPO iteration (4 prompts x 16 tokens, shared value
head, fp32), evaluation on one prompt, no final model. The process's peak resident set (``VmHWM`` from
``/proc/self/status``, kept by the kernel, so no sampling gap) and its trainable parameter count are
printed; the parent adds the load from ``uptime``.

What differs: full fine-tuning holds a frozen reference copy of the model and AdamW moments for every
weight; LoRA holds neither (the reference is the base with the adapter off; AdamW moments exist only for
the adapter and the value head).

Usage:
  python bench/lora_memory.py                # both variants, a table
  python bench/lora_memory.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def vm_hwm_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def config(variant: str, out: str) -> dict:
    from engine.assets import smollm2_gguf_path

    model: dict = {"name_or_path": str(smollm2_gguf_path()), "mixed_precision": "no", "device": "cpu"}
    if variant == "lora":
        model["lora"] = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    return {
        "name": f"lora-memory-{variant}",
        "model": model,
        "task": {
            "id": "synthetic_increasing_numbers",
            "args": {"n_samples": 16, "prompt": "Count upwards: 1 2 3"},
            "max_eval_samples": 1,
        },
        "reward": {"id": "increasing_numbers", "args": {"min_tokens": 20}},
        "rollout": {"max_new_tokens": 16, "min_new_tokens": 16, "batch_size": 4},
        "algorithm": {"id": "ppo", "n_epochs": 1, "minibatch_size": 4},
        "train": {"n_iters": 1, "prompts_per_iter": 4, "eval_every": 0, "save_every": 0, "output_dir": out,
                  "save_final_model": False, "log_samples": 0},
        "eval": {"generation": {"max_new_tokens": 1, "do_sample": False}},
    }  # fmt: skip


def child(variant: str) -> None:
    import torch

    import engine
    from engine.trainer import Trainer

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    counts: dict[str, int] = {}
    original = Trainer.run

    def run(self: Trainer):  # count the parameters of the model actually trained
        counts["trainable"] = sum(p.numel() for p in self.policy.parameters() if p.requires_grad)
        counts["total"] = sum(p.numel() for p in self.policy.parameters())
        return original(self)

    Trainer.run = run
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        summary = engine.train(config(variant, str(Path(tmp) / "run")))
        seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "variant": variant,
                "peak_rss_mb": round(vm_hwm_mb(), 1),
                "trainable_params": counts["trainable"],
                "total_params": counts["total"],
                "iteration_s": round(summary["final_metrics"].get("time/iteration_s", float("nan")), 2),
                "process_s": round(seconds, 1),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", choices=["full", "lora"], help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    rows = []
    for variant in ("full", "lora"):
        load = os.getloadavg()
        out = subprocess.run(
            [sys.executable, __file__, "--child", variant],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["load_before"] = [round(x, 1) for x in load]
        rows.append(row)
    print(
        f"{'variant':8} {'peak RSS MiB':>13} {'trainable':>12} {'total':>12} {'iter s':>7}  load (1/5/15 min)"
    )
    for r in rows:
        print(
            f"{r['variant']:8} {r['peak_rss_mb']:13.1f} {r['trainable_params']:12,d} {r['total_params']:12,d} "
            f"{r['iteration_s']:7.2f}  {r['load_before']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
