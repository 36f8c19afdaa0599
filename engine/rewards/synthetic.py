"""Synthetic rewards for smoke tests and demos.

``increasing_numbers`` is RL4LMs's IncreasingNumbersinText. A random tiny model almost never emits
numbers, so its signal is sparse; ``digit_fraction`` is a dense, easily learnable companion (the
share of non-space characters that are digits) that tests use to check that learning happens.
"""

from __future__ import annotations

from typing import Any

from engine.registry import rewards


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def increasing_numbers_score(text: str, min_tokens: int) -> float:
    """Length of the leading strictly increasing run of numbers / max(#words, min_tokens / 2)."""
    words = text.split()
    numbers = [float(w) for w in words if _is_number(w)]
    if not numbers:
        return 0.0
    count, prev = 1, numbers[0]
    for x in numbers[1:]:
        if x > prev:
            count += 1
            prev = x
        else:
            break
    return count / max(len(words), min_tokens / 2)


@rewards.register(
    "increasing_numbers", "Leading run of increasing numbers in the text (RL4LMs synthetic task)."
)
class IncreasingNumbersReward:
    def __init__(self, min_tokens: int = 20):
        self.min_tokens = int(min_tokens)

    def __call__(
        self,
        prompts: list[str],
        generations: list[str],
        references: list[list[str]],
        meta: list[dict[str, Any]],
    ) -> list[float]:
        return [increasing_numbers_score(g, self.min_tokens) for g in generations]


def digit_fraction(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c.isdigit() for c in chars) / len(chars)


@rewards.register("digit_fraction", "Share of non-space characters that are digits (dense synthetic reward).")
class DigitFractionReward:
    def __call__(
        self,
        prompts: list[str],
        generations: list[str],
        references: list[list[str]],
        meta: list[dict[str, Any]],
    ) -> list[float]:
        return [digit_fraction(g) for g in generations]
