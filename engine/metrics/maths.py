"""Accuracy of maths answers (GSM8K): the evaluation twin of the ``math_accuracy`` reward.

Same parser and the same gold as the reward (``engine.rewards.maths``), so the eval accuracy a run reports
is exactly the share of evaluation generations the reward would call correct. ``math/format`` tells a
model that reasons right but never writes an answer line from one that answers wrongly.
"""

from __future__ import annotations

from engine.metrics.base import Metric, MetricError, MetricResult, check_inputs
from engine.registry import metrics
from engine.rewards.maths import MODES, extract, gold_answer


@metrics.register("math_accuracy", "Maths answer accuracy (exact final number) and share of marked answers")
class MathAccuracy(Metric):
    """``math/accuracy``: share of generations whose final number equals the gold answer; ``math/format``:
    share that mark their answer (``#### n``; flexible mode also ``\\boxed{n}``, "the answer is n")."""

    reward_key = "math/accuracy"

    def __init__(self, mode: str = "flexible"):
        if mode not in MODES:
            raise MetricError(f"math_accuracy: mode must be one of {MODES}, got {mode!r}")
        self.mode = mode

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta)
        meta = list(meta) if meta is not None else [{} for _ in generations]
        correct: list[float] = []
        marked: list[float] = []
        for i, (gen, refs, m) in enumerate(zip(generations, references, meta)):
            try:
                gold = gold_answer(list(refs), dict(m or {}), i)
            except ValueError as exc:
                raise MetricError(f"math_accuracy: {exc}") from None
            ex = extract(gen, self.mode)  # type: ignore[arg-type]
            correct.append(1.0 if ex.value is not None and ex.value == gold else 0.0)
            marked.append(1.0 if ex.marked else 0.0)
        n = max(len(generations), 1)
        return {
            "math/accuracy": (correct, sum(correct) / n),
            "math/format": (marked, sum(marked) / n),
        }
