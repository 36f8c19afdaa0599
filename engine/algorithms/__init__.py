"""Built-in algorithms; importing the package registers "ppo", "nlpo", "a2c", "trpo", "sft" and the
critic-free "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", and the offline "dpo"."""

from engine.algorithms import a2c, dpo, group, nlpo, ppo, sft, trpo  # noqa: F401
from engine.algorithms.base import Algorithm

__all__ = ["Algorithm"]
