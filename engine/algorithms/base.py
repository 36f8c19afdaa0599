"""The interface every algorithm implements.

An algorithm owns only its loss and update; rollout, rewards, KL shaping and advantages are shared
by the trainer. User algorithms register a factory ``factory(cfg: AlgorithmConfig)`` in
``engine.registry.algorithms``.
"""

from __future__ import annotations

from typing import Any


class Algorithm:
    #: False for purely supervised algorithms: the trainer then skips the RL loop.
    is_rl: bool = True
    #: True when generation must be restricted by a masking policy (NLPO).
    uses_masking_policy: bool = False
    #: True when the algorithm normalises advantages per minibatch itself (PPO/NLPO, as SB3): the
    #: trainer then hands it GAE's raw advantages instead of whitening them once per rollout.
    whitens_per_minibatch: bool = False

    def __init__(self, cfg: Any):
        self.cfg = cfg

    def setup(self, policy: Any) -> None:
        """Called once the policy exists (after a warm start); NLPO copies its masking policy here."""

    def make_optimizer(self, params: list[Any]) -> Any | None:
        """The RL optimizer over ``params``; None lets the trainer use AdamW (A2C returns RMSprop).

        The trainer owns the optimizer so that checkpoints and resumes restore its state."""
        return None

    def update(self, policy: Any, optimizer: Any, batch: Any, **kwargs: Any) -> dict[str, float]:
        raise NotImplementedError

    def on_iteration_start(self, iteration: int, policy: Any) -> None:
        """Hook before each rollout (NLPO refreshes its masking policy here)."""

    def masking_model(self) -> Any | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
