"""The registered ``rubric`` reward: a rubric (:mod:`engine.rewards.rubric`) scored by a judge
(:mod:`engine.rewards.rubric_judges`), aggregated to one scalar per generation, judged once.

Why a cache inside the reward: a judge call is the most expensive part of a rubric reward (a forward
pass per criterion, or an HTTP round trip), and an RL run shows the judge the same text many times —
identical completions within a GRPO group, the run page's logged samples (``sample_details``) right
after the batch was rewarded, a periodic evaluation's greedy generations that rarely change. The
cache is keyed by a hash of (prompt, generation) and bounded (least recently used dropped first);
``judged`` and ``cache_hits`` count what went where.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from engine.registry import rewards
from engine.rewards import rubric_judges
from engine.rewards.rubric import DETAIL_PREFIX, RubricError, cache_key, parse_rubric

__all__ = ["RUBRIC_ARGS", "RubricReward", "check_args"]

RUBRIC_ARGS = ("criteria", "instructions", "judge", "cache_size")


def check_args(args: Any, where: str = "reward.args") -> list[tuple[str, str]]:
    """``(field, message)`` for a rubric reward's args, without loading a judge (the launch checks)."""
    try:
        if not isinstance(args, Mapping):
            raise RubricError(f"{where}: must be a mapping with a criteria list")
        unknown = sorted(set(args) - set(RUBRIC_ARGS))
        if unknown:
            raise RubricError(
                f"{where}.{unknown[0]}: unknown key; a rubric reward takes {', '.join(RUBRIC_ARGS)}"
            )
        parse_rubric(args, where)
        rubric_judges.check_spec(args.get("judge"), f"{where}.judge")
        _cache_size(args.get("cache_size", 200_000), where)
    except RubricError as exc:
        fld, _, msg = str(exc).partition(": ")
        return [(fld, msg or str(exc))]
    return []


def _cache_size(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RubricError(f"{where}.cache_size: must be a positive whole number, got {value!r}")
    return value


class RubricReward:
    """The weighted-mean rubric score of each generation, in [0, 1], judged once per (prompt, generation)."""

    check_args = staticmethod(check_args)

    def __init__(
        self,
        criteria: Sequence[Mapping[str, Any]],
        instructions: str | None = None,
        judge: Mapping[str, Any] | None = None,
        cache_size: int = 200_000,
    ) -> None:
        self.rubric = parse_rubric({"criteria": criteria, "instructions": instructions})
        self.judge = rubric_judges.build_judge(judge, "reward.args.judge")
        self.cache_size = _cache_size(cache_size, "reward.args")
        self._cache: OrderedDict[str, dict[str, float]] = OrderedDict()
        #: Generations sent to the judge, and those answered from the cache.
        self.judged = 0
        self.cache_hits = 0

    def scores(self, prompts: Sequence[str], generations: Sequence[str]) -> list[dict[str, float]]:
        """Per-criterion scores of each generation; only never-seen ones go to the judge, once each."""
        keys = [cache_key(p, g) for p, g in zip(prompts, generations)]
        todo: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k in self._cache or k in todo:
                self.cache_hits += 1
                if k in self._cache:
                    self._cache.move_to_end(k)
            else:
                todo[k] = i
        if todo:
            idx = list(todo.values())
            judged = self.judge.score(self.rubric, [prompts[i] for i in idx], [generations[i] for i in idx])
            if len(judged) != len(idx):
                raise RubricError(
                    f"rubric judge {self.judge.name}: {len(judged)} answers for {len(idx)} generations"
                )
            for k, s in zip(todo, judged):
                missing = [n for n in self.rubric.names if n not in s]
                if missing:
                    raise RubricError(f"rubric judge {self.judge.name}: no score for criteria {missing}")
                self._cache[k] = {n: float(v) for n, v in s.items()}
            self.judged += len(idx)
        out = [dict(self._cache[k]) for k in keys]
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    def __call__(self, prompts, generations, references, meta) -> list[float]:
        return [self.rubric.aggregate(s) for s in self.scores(prompts, generations)]

    def sample_details(self, prompts, generations, references, meta) -> list[dict[str, float]]:
        """``rubric/<criterion>`` scores for the run page's samples table (from the cache)."""
        return [
            {DETAIL_PREFIX + n: round(v, 4) for n, v in s.items()} for s in self.scores(prompts, generations)
        ]


rewards.add(
    "rubric",
    RubricReward,
    "Rubric scored by an AI judge (local SmolLM2 by default): weighted criteria on small scales, "
    "each generation judged once",
)
