"""Built-in algorithms; importing the package registers "ppo", "nlpo" and "sft"."""

from engine.algorithms import nlpo, ppo, sft  # noqa: F401
from engine.algorithms.base import Algorithm

__all__ = ["Algorithm"]
