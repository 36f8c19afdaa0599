"""Built-in algorithms; importing the package registers "ppo", "nlpo", "a2c", "trpo" and "sft"."""

from engine.algorithms import a2c, nlpo, ppo, sft, trpo  # noqa: F401
from engine.algorithms.base import Algorithm

__all__ = ["Algorithm"]
