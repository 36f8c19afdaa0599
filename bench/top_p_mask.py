"""Benchmark the top-p set (NLPO's mask, the sampler's top-p): ``rollout.top_p_keep`` against the
full sort of the vocabulary it replaced (that code's arithmetic: a softmax of the sorted row), on rows
from peaked to flat.

Not a test. tests/engine/test_nlpo_mask.py checks the slice against the same rule on a full sort with
its own arithmetic (bit for bit); against the replaced code's arithmetic a token at the cut can differ
at rounding level. One thread by default, as the engine half of the suite runs; results in
docs/benchmarks.md ("Test suite").

Usage:
  python bench/top_p_mask.py                 # 32 x 50,257 logits (GPT-2's vocabulary), one thread
  python bench/top_p_mask.py --rows 8 --vocab 49152 --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.rollout import top_p_keep


def full_sort_keep(logits: torch.Tensor, top_p: float, min_keep: int) -> torch.Tensor:
    """The rule on a sort of the whole vocabulary: kept when the mass ranked above is below top_p."""
    ranked, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(ranked, dim=-1)
    keep = probs.cumsum(-1) - probs < top_p
    keep[..., : max(1, min_keep)] = True
    return torch.zeros_like(keep).scatter(-1, order, keep)


def best_ms(fn, logits: torch.Tensor, p: float, repeats: int) -> float:
    fn(logits, p, 100)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(logits, p, 100)
        times.append(time.perf_counter() - t)
    return 1000 * min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print(f"{args.rows} x {args.vocab} logits, {args.threads} thread(s), best of {args.repeats}")
    print("scale  top_p  kept   full sort ms  slice ms  ratio")
    for scale in (3.0, 1.0, 0.3):  # normal logits times scale: peaked to flat rows
        logits = torch.randn(args.rows, args.vocab, generator=g) * scale
        for p in (0.1, 0.5, 0.9):
            kept = int(top_p_keep(logits, p, 100).sum(-1).float().mean())
            old = best_ms(full_sort_keep, logits, p, args.repeats)
            new = best_ms(top_p_keep, logits, p, args.repeats)
            print(f"{scale:5.1f}  {p:5.2f}  {kept:6d}  {old:12.1f}  {new:8.1f}  {new / old:5.2f}")


if __name__ == "__main__":
    main()
