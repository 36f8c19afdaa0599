"""What an algorithm is: one small base per family, each declaring what the trainer asks of it.

An algorithm owns only its loss and update; rollout, rewards, KL shaping and GAE are the trainer's.
The trainer reads the capabilities below as plain attributes and methods (never a ``getattr`` probe,
``tests/engine/test_algorithm_contract.py`` holds that), so every default lives here:

* :class:`ActorCriticAlgorithm` (PPO, NLPO, A2C, TRPO): on-policy with a value function; the trainer
  computes GAE advantages and returns from the KL-shaped rewards.
* :class:`CriticFreeGroupAlgorithm` (GRPO, RLOO, REINFORCE++): on-policy without a value function; the
  trainer samples ``group_size`` completions per prompt and the algorithm turns task rewards into
  advantages itself (:meth:`Algorithm.advantages`).
* :class:`OfflinePreferenceAlgorithm` (DPO, IPO): no rollout; the trainer hands each iteration to
  :meth:`Algorithm.offline_iteration` with the narrow :class:`TrainerView` of itself.
* :class:`SupervisedAlgorithm` (SFT): no RL loop at all; the trainer's supervised phase does the work.

The two on-policy families share one update signature, declared once in :meth:`OnPolicyAlgorithm.update`;
each algorithm implements :meth:`OnPolicyAlgorithm.learn` on an :class:`UpdateInputs`.

User algorithms register a factory ``factory(cfg: AlgorithmConfig)`` in ``engine.registry.algorithms``;
one subclassing :class:`Algorithm` directly gets the actor-critic defaults.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class TrainerView(Protocol):
    """The part of the trainer an algorithm may use; nothing else (no private attribute) is read.

    ``offline_iteration`` gets the trainer as this view; on-policy algorithms get their inputs as
    arguments of :meth:`OnPolicyAlgorithm.update` and need no view at all."""

    cfg: Any  #: the run's ``RunConfig``
    iteration: int  #: iterations done so far (the trainer advances it after each one)
    policy: Any  #: the ``ActorCritic`` being trained
    optimizer: Any  #: the RL optimizer (``Algorithm.make_optimizer`` or the trainer's AdamW)
    tokenizer: Any
    device: torch.device
    ref_lm: Any | None  #: the frozen reference, None where there is none (LoRA: the adapter is switched off)
    scaler: Any | None  #: fp16's gradient scaler, None otherwise

    def prompts_for(self, iteration: int) -> list[Any]:
        """This iteration's samples (every rank's), in the run's seeded per-epoch order."""
        ...

    def autocast(self) -> AbstractContextManager:
        """The run's mixed-precision context (``engine.models.precision``)."""
        ...


class Algorithm:
    """Every capability the trainer asks for, with the default of an actor-critic RL algorithm."""

    #: False for purely supervised algorithms: the trainer then skips the RL loop.
    is_rl: bool = True
    #: True when there is no rollout: the trainer calls :meth:`offline_iteration` instead.
    offline: bool = False
    #: True when the trainer computes GAE from a value function (and reports ``value/*`` metrics);
    #: False when :meth:`advantages` computes them without one.
    uses_critic: bool = True
    #: Completions sampled per prompt, consecutively (rows ``[i*G, (i+1)*G)`` share a prompt).
    group_size: int = 1
    #: False when no reference model is needed at all (the trainer neither copies nor loads one).
    needs_reference: bool = True
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

    def needs_rollout_scores(self, n_episodes: int) -> bool:
        """Whether the rollout must score the policy's log-probs of ``n_episodes`` before the update
        (a one-step critic-free update scores them in its own forward instead)."""
        return True

    def on_iteration_start(self, iteration: int, policy: Any) -> None:
        """Hook before each rollout (NLPO refreshes its masking policy here)."""

    def masking_model(self) -> Any | None:
        """The model whose top-p mask restricts sampling (NLPO), or None."""
        return None

    def update(self, policy: Any, optimizer: Any, batch: Any, **kwargs: Any) -> dict[str, float]:
        """One update on a rollout batch; returns the statistics to log. See :class:`OnPolicyAlgorithm`."""
        raise NotImplementedError

    def advantages(self, task_rewards: torch.Tensor, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages (B, T), per-token rewards (B, T)); called only when :attr:`uses_critic` is False."""
        raise NotImplementedError(f"{type(self).__name__} uses a critic: the trainer computes GAE")

    def offline_iteration(self, trainer: TrainerView) -> dict[str, float]:
        """One iteration without rollout (called only when :attr:`offline`); returns its metrics, which
        the trainer logs after advancing its iteration count."""
        raise NotImplementedError(f"{type(self).__name__} is not an offline algorithm")

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the algorithm (NLPO: its masking policy)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` on resume."""


@dataclass(frozen=True)
class UpdateInputs:
    """What the trainer hands an on-policy update besides policy, optimizer and rollout batch."""

    #: (B, T) advantages: GAE's (whitened unless the algorithm whitens per minibatch) or the algorithm's own
    advantages: torch.Tensor | None = None
    #: (B, T) value targets (critic-free algorithms get their advantages here and ignore them)
    returns: torch.Tensor | None = None
    #: seeds the minibatch shuffles, ``(train.seed, iteration)``, so a resume repeats them
    generator: torch.Generator | None = None
    #: the sampling temperature, so the ratio is to the distribution sampled from
    temperature: float = 1.0
    #: mixed-precision dtype of the forward passes (None: fp32), see ``engine.models.precision``
    autocast_dtype: torch.dtype | None = None
    #: fp16's gradient scaler, or None
    scaler: Any | None = None


class OnPolicyAlgorithm(Algorithm):
    """Rollout-based algorithms: the update-loop signature, declared once for both on-policy families."""

    #: Whether ``learn`` takes its gradients from ``loss.backward()`` into ``.grad`` (then a tied
    #: embedding adds its rows there in place: :func:`engine.models.policy.embedding_rows_into_grad`);
    #: False for a loop that calls ``torch.autograd.grad`` (TRPO).
    grads_from_backward: bool = True

    def update(
        self,
        policy: Any,
        optimizer: Any,
        batch: Any,
        *,
        advantages: torch.Tensor | None = None,
        returns: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
        autocast_dtype: torch.dtype | None = None,
        scaler: Any | None = None,
    ) -> dict[str, float]:
        """Update ``policy`` on one rollout ``batch`` with ``optimizer``; returns the statistics to log."""
        from engine.models.policy import embedding_rows_into_grad  # torch: imported when used

        inputs = UpdateInputs(advantages, returns, generator, temperature, autocast_dtype, scaler)
        with embedding_rows_into_grad(self.grads_from_backward):
            return self.learn(policy, optimizer, batch, inputs)

    def learn(self, policy: Any, optimizer: Any, batch: Any, inputs: UpdateInputs) -> dict[str, float]:
        """The algorithm's update loop."""
        raise NotImplementedError


class ActorCriticAlgorithm(OnPolicyAlgorithm):
    """PPO, NLPO, A2C, TRPO: a value function, GAE advantages computed by the trainer."""

    uses_critic = True


class CriticFreeGroupAlgorithm(OnPolicyAlgorithm):
    """GRPO, RLOO, REINFORCE++: no value function; the baseline comes from the other completions."""

    uses_critic = False

    def advantages(self, task_rewards: torch.Tensor, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages (B, T), per-token rewards (B, T)) of a rollout whose rows come in groups of G."""
        raise NotImplementedError


class OfflinePreferenceAlgorithm(Algorithm):
    """DPO, IPO: preference pairs instead of rollouts; the reference is the starting policy."""

    offline = True
    uses_critic = False

    def offline_iteration(self, trainer: TrainerView) -> dict[str, float]:
        raise NotImplementedError


class SupervisedAlgorithm(Algorithm):
    """SFT: the trainer's supervised phase on the task's references; no RL loop."""

    is_rl = False
    uses_critic = False
    needs_reference = False


#: The families; every registered algorithm is an instance of exactly one.
FAMILIES: tuple[type[Algorithm], ...] = (
    ActorCriticAlgorithm,
    CriticFreeGroupAlgorithm,
    OfflinePreferenceAlgorithm,
    SupervisedAlgorithm,
)
