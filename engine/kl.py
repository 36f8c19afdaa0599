"""The KL penalty: per-token estimators and the controllers of its coefficient beta.

Units matter here, because a target only means something in the units its controller reads:

* ``adaptive`` (RL4LMs's ``KLController``, the default): reads the **per-token mean** KL of a
  rollout (RL4LMs's ``rollout_info/kl_div_mean``) and updates once per rollout:
  ``beta <- beta * (1 + 0.1 * clip((KL - target) / target, -0.2, 0.2))``.
* ``ziegler`` (Ziegler et al. 2019, TRL's ``AdaptiveKLController``): reads the **per-episode sum**
  of KL and moves in proportion to the episodes seen:
  ``beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_episodes / horizon)``.
* ``fixed``: beta never changes.

Controller state is a plain dict so checkpoints restore it exactly and resumed runs keep the same beta.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.registry import kl_controllers

#: Per-token KL estimators of ``kl.estimator`` (see :func:`kl_estimate`).
KL_ESTIMATORS = ("k1", "k3", "full")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the log-probs of the sampled tokens.

    ``k1``: log pi - log pi_ref (unbiased, can be negative per token; RL4LMs's penalty).
    ``k3``: (r - 1) - log r with r = pi_ref / pi (unbiased, never negative, lower variance; Schulman 2020).
    ``full`` needs both whole distributions: :func:`engine.models.policy.kl_from_logprobs`.
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(
        f"kl.estimator {estimator!r}: the per-token estimators are 'k1' and 'k3' "
        "('full' is computed from the whole distributions while scoring)"
    )


@kl_controllers.register("fixed", "Constant KL coefficient beta.")
class FixedKLController:
    #: What ``update`` reads: the per-token mean KL of the rollout ("token") or the per-episode sum.
    unit = "token"

    def __init__(self, init_coef: float = 0.1, **_: Any):
        self.value = float(init_coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


@kl_controllers.register(
    "adaptive",
    "RL4LMs's adaptive controller: per-token mean KL of a rollout vs kl.target, "
    "beta *= 1 + 0.1 * clip((KL - target) / target, -0.2, 0.2) once per rollout.",
)
class AdaptiveKLController:
    """RL4LMs's ``KLController.step``, once per rollout on the per-token mean KL."""

    unit = "token"

    def __init__(self, init_coef: float = 0.1, target: float | None = 0.1, **_: Any):
        if target is None or target <= 0:
            raise ValueError("kl.target must be a positive number for the adaptive controller")
        self.value = float(init_coef)
        self.target = float(target)

    def update(self, current_kl: float, n_steps: int = 0) -> float:
        err = min(max((current_kl - self.target) / self.target, -0.2), 0.2)
        self.value *= 1.0 + 0.1 * err
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))


@kl_controllers.register(
    "ziegler",
    "Ziegler et al. (2019) proportional controller: per-episode SUM of KL vs kl.target, "
    "beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * episodes / kl.horizon.",
)
class ZieglerKLController:
    """beta <- beta * (1 + clip(KL/target - 1, -0.2, 0.2) * n_steps / horizon), KL summed per episode."""

    unit = "episode"

    def __init__(self, init_coef: float = 0.1, target: float | None = 6.0, horizon: int = 10000, **_: Any):
        if target is None or target <= 0:
            raise ValueError("kl.target must be a positive number for the ziegler controller")
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
