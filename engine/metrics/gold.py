"""``gold``: any registered reward scored on a run's evaluations, as the "gold" of the
over-optimisation watch (:mod:`engine.overopt`).

Why a metric and not a second reward: the gold must never reach the policy's gradient. A run optimises
its ``reward`` (the proxy); the gold is only measured on the periodic evaluations (``eval.metrics``),
so it shows whether what the proxy stands for still rises (Gao et al. 2022, "Scaling Laws for Reward
Model Overoptimization"). The gold can be a rubric scored by an AI judge (``rubric``), a held-out
reward model (``learned``), or any metric through the ``metric`` reward::

    eval:
      metrics:
        - id: gold
          args: {reward: {id: rubric, args: {criteria: [...], judge: {backend: local}}}}

The corpus value is ``eval/gold`` (the mean); a reward with per-sample details (the rubric's
per-criterion scores) adds their means as ``eval/gold/<detail>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.metrics.base import Metric, MetricError, MetricResult, check_inputs
from engine.registry import metrics
from engine.rewards import build_reward, call_reward


@metrics.register(
    "gold", "A registered reward (rubric, learned, metric) scored on evaluations only: the gold signal"
)
class GoldReward(Metric):
    """``gold``: per-sample values of ``reward`` (a ``{id, args}`` reward config) and their mean."""

    reward_key = "gold"

    def __init__(self, reward: Mapping[str, Any] | None = None, key: str = "gold") -> None:
        if not isinstance(reward, Mapping) or not isinstance(reward.get("id"), str):
            raise MetricError("gold: args.reward must be a reward config like {id: rubric, args: {...}}")
        if reward.get("id") == "gold":
            raise MetricError("gold: args.reward.id cannot be 'gold'")
        self.key = key
        self.reward = build_reward(dict(reward))

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta)
        meta = list(meta) if meta is not None else [{} for _ in generations]
        values = call_reward(self.reward, prompts, generations, references, meta, name="gold")
        n = max(len(values), 1)
        out: MetricResult = {self.key: (values, sum(values) / n)}
        details = getattr(getattr(self.reward, "inner", None), "sample_details", None)
        if details is not None:
            rows = details(list(prompts), list(generations), [list(r) for r in references], meta)
            names = sorted({k for row in rows for k, v in row.items() if isinstance(v, int | float)})
            for name in names:
                col = [float(row[name]) for row in rows if isinstance(row.get(name), int | float)]
                short = name.split("/", 1)[-1]
                out[f"{self.key}/{short}"] = (None, sum(col) / max(len(col), 1))
        return out
