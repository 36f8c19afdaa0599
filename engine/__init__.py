"""GRUE Studio engine: RL and supervised fine-tuning for HuggingFace language models.

Algorithms (``engine/algorithms/``, chosen by ``algorithm.id``), in four families whose bases in
``engine/algorithms/base.py`` declare what the trainer asks of them: the actor-critic on-policy ``ppo``,
``nlpo``, ``a2c`` and ``trpo``; the critic-free group algorithms ``grpo``, ``rloo``, ``reinforce_pp``
and ``reinforce_pp_baseline``; offline preference optimisation ``dpo`` (DPO, or IPO with
``loss_type: ipo``); and ``sft``, supervised fine-tuning (also the warm start of an RL run).

The public API is small on purpose; the web app and the CLI both drive runs through it.
Heavy modules (torch, transformers) are imported only when a run starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.config import ConfigError, RunConfig, parse_config
from engine.config_files import load_config

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.events import EventSink

__all__ = ["ConfigError", "RunConfig", "evaluate", "load_config", "parse_config", "train"]


def train(
    config: RunConfig | dict[str, Any],
    sink: EventSink | None = None,
    should_stop: Callable[[], bool] | None = None,
    resume_from: str | None = None,
) -> dict[str, Any]:
    """Run SFT and/or RL as the config says; returns the final summary (also sent as ``finished``)."""
    from engine.trainer import train as _train

    return _train(parse_config(config), sink=sink, should_stop=should_stop, resume_from=resume_from)


def evaluate(config: RunConfig | dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Generate on a split and compute the config's metrics; see ``engine.evaluation``."""
    from engine.evaluation import evaluate as _evaluate

    return _evaluate(parse_config(config), **kwargs)
