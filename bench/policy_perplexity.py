"""Benchmark RL4LMs's perplexity metric (the policy on the references) on the study's workload:
SmolLM2-135M-Instruct (the offline GGUF import) on IMDB test reviews, stride 512, window 1024, fp32.

Times the metric as shipped (logits for the scored positions only, ``logits_to_keep``, and a logsumexp)
against the code it replaced (logits for every position and a full log-softmax), on the same windows,
alternating, and prints both values: they agree to rounding. In the study's test evaluation this metric
was 80 % of the time (e.g. 550 of 692 s, studies/grue-imdb/runs/supervised_ppo-seed1/result.json).
Results in docs/benchmarks.md ("Policy perplexity").

Usage:
  python bench/policy_perplexity.py                    # 100 test reviews, 2 threads
  python bench/policy_perplexity.py --reviews 500      # the study's whole test set
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from engine.assets import SMOLLM2_FILE, smollm2_dir
from engine.config import TaskConfig
from engine.data import load_task
from engine.registry import metrics


def replaced(lm, ids: torch.Tensor, stride: int, window: int) -> float:
    """The metric before 2026-12-05: every position's logits, a full log-softmax, then the scored tail."""
    n, total, end = ids.shape[1], 0.0, 0
    with torch.no_grad():
        for i in range(0, n, stride):
            begin, end = max(i + stride - window, 0), min(i + stride, n)
            trg_len, x = end - i, ids[:, begin:end]
            logp = torch.log_softmax(lm(input_ids=x).logits.float()[0, :-1], dim=-1)
            nll = -logp.gather(-1, x[0, 1:, None]).squeeze(-1)
            scored = nll[-trg_len:] if trg_len < x.shape[1] else nll
            total += float(scored.mean()) * trg_len if scored.numel() else 0.0
    return math.exp(total / end)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reviews", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_FILE)
    lm = AutoModelForCausalLM.from_pretrained(
        smollm2_dir(), gguf_file=SMOLLM2_FILE, dtype=torch.float32
    ).eval()
    samples = load_task(TaskConfig(id="imdb", args={"fixture": "imdb_large"}), "test")[: args.reviews]
    refs = [s.references for s in samples]
    ids = tok("\n\n".join(r for rs in refs for r in rs), return_tensors="pt")["input_ids"]
    windows = math.ceil(ids.shape[1] / 512)
    print(f"{len(refs)} test reviews, {ids.shape[1]} tokens, {windows} windows, {args.threads} thread(s)")
    metric = metrics.build("perplexity", stride=512)
    metric.bind_policy(lm, False, tok, torch.device("cpu"))
    for _ in range(args.repeats):
        t = time.perf_counter()
        old = replaced(lm, ids, 512, 1024)
        t_old = time.perf_counter() - t
        t = time.perf_counter()
        new = metric.compute([""] * len(refs), [""] * len(refs), refs, None)["fluency_metrics/perplexity"][1]
        t_new = time.perf_counter() - t
        print(
            f"replaced {t_old:.1f} s ({t_old / windows:.2f} s/window), shipped {t_new:.1f} s "
            f"({t_new / windows:.2f} s/window), ratio {t_new / t_old:.2f}; perplexity {old:.5f} vs {new:.5f}"
        )


if __name__ == "__main__":
    main()
