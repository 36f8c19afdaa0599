"""Synthetic task: "generate increasing numbers" (RL4LMs's dummy pool), learnable by a tiny model in minutes.

Every prompt is the same fixed string (by default GPT-2's ``<|endoftext|>``), as in RL4LMs; the
references are increasing number sequences so that supervised warm start has something to learn.
"""

from __future__ import annotations

import random

from engine.data.base import Sample
from engine.registry import tasks


@tasks.register("synthetic_increasing_numbers", "Synthetic: generate increasing numbers (RL4LMs dummy pool).")
class SyntheticIncreasingNumbers:
    default_reward = {"id": "increasing_numbers", "args": {"min_tokens": 20}}
    default_metrics = [{"id": "increasing_numbers", "args": {"min_tokens": 20}}]

    def __init__(
        self, n_samples: int = 100, prompt: str = "<|endoftext|>", reference_length: int = 10, seed: int = 0
    ):
        if n_samples < 1:
            raise ValueError("synthetic_increasing_numbers: n_samples must be >= 1")
        self.n_samples = int(n_samples)
        self.prompt = prompt
        self.reference_length = int(reference_length)
        self.seed = int(seed)

    def load(self, split: str) -> list[Sample]:
        rng = random.Random(f"{self.seed}:{split}")
        out = []
        for i in range(self.n_samples):
            start = rng.randint(0, 20)
            refs = [" ".join(str(start + k) for k in range(self.reference_length))]
            out.append(Sample(id=f"{split}_{i}", prompt=self.prompt, references=refs, meta={}))
        return out
