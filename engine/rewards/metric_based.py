"""Any registered metric as a reward, and GRUE's metric-based (and shaped) rewards under RL4LMs's ids.

``metric`` turns a metric's per-sample scores into rewards (``shift + scale * score``). The GRUE rewards
below are thin, named combinations of it so that RL4LMs configs (``reward_fn: {id: meteor, args:
{shaping_fn: common_gen_repeat_penalty}}``) map one to one. ``engine.metrics`` is imported lazily (through
the registry), so building a reward never loads metric assets it does not use.
"""

from __future__ import annotations

from typing import Any

from engine.registry import metrics, rewards


class MetricReward:
    """Per-sample scores of metric ``metric_id`` (key ``key``, default the metric's ``reward_key``)."""

    def __init__(
        self,
        metric_id: str,
        key: str | None = None,
        metric_args: dict[str, Any] | None = None,
        scale: float = 1.0,
        shift: float = 0.0,
    ):
        self.metric_id = metric_id
        self.metric = metrics.build(metric_id, **(metric_args or {}))
        self.key = key or getattr(self.metric, "reward_key", None)
        self.scale, self.shift = float(scale), float(shift)

    def _pick(self, result: dict[str, tuple[list[float] | None, float]]) -> str:
        if self.key:
            if self.key not in result:
                raise KeyError(
                    f"metric reward: metric {self.metric_id!r} has no key {self.key!r}; its keys: {sorted(result)}"
                )
            return self.key
        with_scores = [k for k, (s, _) in result.items() if s is not None]
        if len(with_scores) != 1:
            raise KeyError(
                f"metric reward: metric {self.metric_id!r} gives per-sample keys {with_scores}; choose one "
                "with reward.args.key"
            )
        return with_scores[0]

    def raw(self, prompts, generations, references, meta) -> list[float]:
        result = self.metric.compute(
            list(prompts), list(generations), [list(r) for r in references], list(meta)
        )
        key = self._pick(result)
        per = result[key][0]
        if per is None:  # a corpus-only metric: score each sample as a corpus of one
            per = [
                self.metric.compute([p], [g], [list(r)], [m])[key][1]
                for p, g, r, m in zip(prompts, generations, references, meta)
            ]
        return [float(v) for v in per]

    def __call__(self, prompts, generations, references, meta) -> list[float]:
        return [self.shift + self.scale * v for v in self.raw(prompts, generations, references, meta)]


rewards.register("metric")(MetricReward)
