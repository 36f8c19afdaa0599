"""NLPO: PPO restricted to the top-p action space of a periodically refreshed masking policy.

RL4LMs builds its generation-time mask processor once from the initial model, so the mask used
for sampling never follows the refreshed masking policy. Here the masking model object passed to
generation *is* the one refreshed every ``mask_update_interval`` iterations, and the stored
per-step support makes the PPO update use the same masked, renormalised distribution.
"""

from __future__ import annotations

from typing import Any

from engine.algorithms.ppo import PPO
from engine.models.policy import frozen_copy
from engine.registry import algorithms


@algorithms.register("nlpo", "Natural Language Policy Optimization: PPO with a top-p masking policy.")
class NLPO(PPO):
    uses_masking_policy = True

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self._masker: Any | None = None
        self.refreshed_at = 0
        self.n_refreshes = 0

    def setup(self, policy: Any) -> None:
        # Only the LM (trunk + LM head) is copied: no value head, no critic, no optimizer state.
        self._masker = frozen_copy(policy.lm)
        self.refreshed_at = 0

    def on_iteration_start(self, iteration: int, policy: Any) -> None:
        if self._masker is None:
            self.setup(policy)
        interval = self.cfg.nlpo.mask_update_interval
        if iteration > 0 and iteration % interval == 0 and iteration != self.refreshed_at:
            self.refresh(policy, iteration)

    def refresh(self, policy: Any, iteration: int) -> None:
        self._masker.load_state_dict(policy.lm.state_dict())
        self.refreshed_at = iteration
        self.n_refreshes += 1

    def masking_model(self) -> Any | None:
        return self._masker

    def state_dict(self) -> dict[str, Any]:
        return {
            "masker": self._masker.state_dict() if self._masker is not None else None,
            "refreshed_at": self.refreshed_at,
            "n_refreshes": self.n_refreshes,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("masker") is not None and self._masker is not None:
            self._masker.load_state_dict(state["masker"])
        self.refreshed_at = int(state.get("refreshed_at", 0))
        self.n_refreshes = int(state.get("n_refreshes", 0))
