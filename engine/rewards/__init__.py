"""Reward functions, each registered by id in ``engine.registry.rewards``, and ``build_reward``.

A reward is batched: ``reward(prompts, generations, references, meta) -> list[float]`` (one terminal
reward per episode). Importing this package imports every submodule so that their decorators run.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from collections.abc import Callable, Sequence
from typing import Any

from engine.config import RewardConfig
from engine.registry import rewards

RewardFn = Callable[[list[str], list[str], list[list[str]], list[dict[str, Any]]], list[float]]

__all__ = ["RewardError", "RewardFn", "WeightedSum", "build_reward", "call_reward", "construct"]


class RewardError(ValueError):
    """A reward that cannot be built or returned bad values; the message names the component."""


def call_reward(
    fn: Any,
    prompts: Sequence[str],
    generations: Sequence[str],
    references: Sequence[Sequence[str]] | None = None,
    meta: Sequence[dict[str, Any]] | None = None,
    name: str = "reward",
) -> list[float]:
    """Call a reward and check that it returned one finite float per generation."""
    n = len(generations)
    references = [list(r) for r in references] if references is not None else [[] for _ in range(n)]
    meta = list(meta) if meta is not None else [{} for _ in range(n)]
    if len(prompts) != n or len(references) != n or len(meta) != n:
        raise RewardError(
            f"{name}: got {len(prompts)} prompts, {n} generations, {len(references)} reference lists, "
            f"{len(meta)} meta dicts; they must have the same length"
        )
    out = fn(list(prompts), list(generations), references, meta)
    try:
        values = [float(v) for v in out]
    except (TypeError, ValueError) as exc:
        raise RewardError(f"{name}: returned non-numeric values ({exc})") from exc
    if len(values) != n:
        raise RewardError(f"{name}: returned {len(values)} values for {n} generations")
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        raise RewardError(f"{name}: non-finite reward at positions {bad[:5]}")
    return values


class WeightedSum:
    """``sum_i w_i * r_i`` of several rewards, e.g. intent accuracy + METEOR for DailyDialog."""

    def __init__(self, components: Sequence[tuple[str, float, Any]]):
        if not components:
            raise RewardError("weighted_sum: needs at least one component (reward.components)")
        self.components = list(components)

    def __call__(self, prompts, generations, references, meta) -> list[float]:
        total = [0.0] * len(generations)
        for name, weight, fn in self.components:
            if weight == 0:
                continue
            vals = call_reward(fn, prompts, generations, references, meta, name=name)
            total = [t + weight * v for t, v in zip(total, vals)]
        return total


def construct(cid: str, args: dict[str, Any]) -> Any:
    """``rewards.build`` without its ``key`` parameter, which would clash with a reward's own ``key`` arg."""
    factory = rewards.get(cid)
    try:
        return factory(**args)
    except TypeError as exc:
        raise TypeError(f"reward {cid!r}: bad arguments {sorted(args)}: {exc}") from exc


def _build_component(cid: str, args: dict[str, Any]) -> Any:
    if cid == "weighted_sum":
        return _weighted_sum_factory(**args)
    return construct(cid, args)


def _weighted_sum_factory(components: Sequence[Any] = ()) -> WeightedSum:
    built = []
    for i, comp in enumerate(components):
        if isinstance(comp, dict):
            cid, args, weight = comp.get("id"), comp.get("args") or {}, comp.get("weight", 1.0)
        else:
            cid, args, weight = comp.id, comp.args, comp.weight
        if not cid:
            raise RewardError(f"reward.components[{i}]: missing id")
        built.append((f"reward.components[{i}] ({cid})", float(weight), _build_component(cid, dict(args))))
    return WeightedSum(built)


rewards.add("weighted_sum", _weighted_sum_factory, "Weighted sum of several rewards (reward.components)")


class _WithPrompt:
    """Scores ``prompt + generation``: a sentiment classifier judges the whole review, not its tail."""

    def __init__(self, fn: Any):
        self.fn = fn

    def __call__(self, prompts, generations, references, meta) -> list[float]:
        return self.fn(prompts, [p + g for p, g in zip(prompts, generations)], references, meta)


class _LogOdds:
    """``log(p / (1 - p))`` of a reward that is a probability.

    Why: a classifier's probability saturates. IMDB prompts are mostly clearly positive or negative
    reviews, whose P(positive) sits near 0 or 1 whatever the continuation says, so the same change in
    the text moves the reward a hundredth of what it does for a neutral prompt. In log-odds (for a
    logistic classifier, its linear score) a change counts the same wherever the prompt starts.
    Probabilities are clamped to [1e-6, 1 - 1e-6] (log-odds within ±13.8)."""

    EPS = 1e-6

    def __init__(self, fn: Any, name: str):
        self.fn = fn
        self.name = name

    def __call__(self, prompts, generations, references, meta) -> list[float]:
        values = call_reward(self.fn, prompts, generations, references, meta, name=self.name)
        bad = [i for i, v in enumerate(values) if not 0.0 <= v <= 1.0]
        if bad:
            raise RewardError(
                f"{self.name}: reward.transform 'logit' needs probabilities in [0, 1]; got "
                f"{values[bad[0]]!r} at position {bad[0]}"
            )
        out = []
        for v in values:
            p = min(max(v, self.EPS), 1.0 - self.EPS)
            out.append(math.log(p / (1.0 - p)))
        return out


class _MinusPromptScore:
    """``score(prompt + generation) − score(prompt)``: a baseline that depends on the prompt alone.

    Why: when the prompt decides most of a score (IMDB's sentiment of prompt + continuation: the prompt
    explains ~90 % of its variance over test reviews), that part is noise to the policy gradient, since
    no action changes it, and a critic must learn it before the signal shows. Subtracting a function of
    the prompt, which is part of every state, leaves the expected gradient and the optimal policy as
    they are. The prompt's score is computed once per distinct prompt (bounded cache)."""

    CACHE_SIZE = 65536

    def __init__(self, fn: Any):
        self.fn = fn  # the unwrapped reward, called on the prompt alone
        self.with_prompt = _WithPrompt(fn)
        self._cache: dict[str, float] = {}

    def _prompt_scores(self, prompts: list[str]) -> list[float]:
        missing = list(dict.fromkeys(p for p in prompts if p not in self._cache))
        if missing:
            if len(self._cache) + len(missing) > self.CACHE_SIZE:
                self._cache.clear()
            scores = call_reward(self.fn, missing, missing, None, None, name="prompt baseline")
            self._cache.update(zip(missing, (float(x) for x in scores)))
        return [self._cache[p] for p in prompts]

    def __call__(self, prompts, generations, references, meta) -> list[float]:
        prompts = list(prompts)
        full = self.with_prompt(prompts, generations, references, meta)
        base = self._prompt_scores(prompts)
        return [float(f) - b for f, b in zip(full, base)]


def build_reward(cfg: Any) -> RewardFn:
    """The callable of a RewardConfig (or its dict): one reward, or a weighted sum of ``components``.

    The result checks its own output (one finite float per generation) so that a broken user reward
    fails with its name instead of corrupting advantages.
    """
    if isinstance(cfg, dict):
        cfg = RewardConfig.model_validate(cfg)
    if cfg.id == "weighted_sum":
        # Its only argument is the component list: anything else would be silently ignored.
        unknown = sorted(set(cfg.args) - {"components"})
        if unknown or (cfg.components and cfg.args):
            raise RewardError(
                f"reward 'weighted_sum': unexpected reward.args {unknown or sorted(cfg.args)}; give the "
                "rewards to add in reward.components (each with its own args and weight)"
            )
        comps = cfg.components or cfg.args.get("components", [])
        fn: Any = _weighted_sum_factory(comps)
    else:
        if cfg.components:
            raise RewardError(f"reward.components is only used with id 'weighted_sum' (got id {cfg.id!r})")
        fn = construct(cfg.id, dict(cfg.args))
    if cfg.transform == "logit":
        fn = _LogOdds(fn, f"reward {cfg.id!r}")
    if cfg.subtract_prompt_score:
        fn = _MinusPromptScore(fn)
    elif cfg.include_prompt:
        fn = _WithPrompt(fn)
    name = f"reward {cfg.id!r}"

    def reward(prompts, generations, references=None, meta=None) -> list[float]:
        return call_reward(fn, prompts, generations, references, meta, name=name)

    reward.inner = fn  # type: ignore[attr-defined]
    return reward


for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")
