"""KL penalty controllers: fixed beta, or the adaptive controller of Ziegler et al. (2019).

Their state is a plain dict so checkpoints restore it exactly and resumed runs keep the same beta.
"""

from __future__ import annotations

from typing import Any

from engine.registry import kl_controllers


@kl_controllers.register("fixed", "Constant KL coefficient beta.")
class FixedKLController:
    def __init__(self, init_coef: float = 0.1, **_: Any):
        self.value = float(init_coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


@kl_controllers.register("adaptive", "Ziegler et al. proportional controller towards a target KL.")
class AdaptiveKLController:
    """beta <- beta * (1 + clip(KL/target - 1, -0.2, 0.2) * n_steps / horizon)."""

    def __init__(self, init_coef: float = 0.1, target: float | None = 0.1, horizon: int = 10000, **_: Any):
        if target is None or target <= 0:
            raise ValueError("kl.target must be a positive number for the adaptive controller")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        err = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = int(state.get("horizon", self.horizon))


def build_kl_controller(cfg: Any) -> Any:
    """From a KLConfig."""
    return kl_controllers.build(
        cfg.controller, init_coef=cfg.init_coef, target=cfg.target, horizon=cfg.horizon
    )
