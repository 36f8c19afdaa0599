"""Built-in algorithms; importing the package registers them. One family base each
(``engine/algorithms/base.py``): actor-critic "ppo", "nlpo", "a2c", "trpo"; critic-free group "grpo",
"rloo", "reinforce_pp", "reinforce_pp_baseline"; offline preference "dpo"; supervised "sft"."""

from engine.algorithms import a2c, dpo, group, nlpo, ppo, sft, trpo  # noqa: F401
from engine.algorithms.base import (
    FAMILIES,
    ActorCriticAlgorithm,
    Algorithm,
    CriticFreeGroupAlgorithm,
    OfflinePreferenceAlgorithm,
    OnPolicyAlgorithm,
    SupervisedAlgorithm,
    TrainerView,
    UpdateInputs,
)

__all__ = [
    "FAMILIES",
    "ActorCriticAlgorithm",
    "Algorithm",
    "CriticFreeGroupAlgorithm",
    "OfflinePreferenceAlgorithm",
    "OnPolicyAlgorithm",
    "SupervisedAlgorithm",
    "TrainerView",
    "UpdateInputs",
]
