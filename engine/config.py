"""The typed run configuration.

One pydantic model describes a whole run so that the CLI, the web form (generated from the JSON
Schema) and the trainer agree on every field, and so that a typo is an error naming its path
instead of a silently ignored key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from engine import yamlio
from engine.trackers import TRACKER_IDS


class ConfigError(ValueError):
    """A config that cannot be used; ``errors`` holds ``(field path, message)`` pairs."""

    def __init__(self, message: str, errors: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.errors = errors or []


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Component(Strict):
    """A registered component chosen by id, with its keyword arguments."""

    id: str = Field(description="Registered id of the component.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the component.")


class WeightedComponent(Component):
    weight: float = Field(1.0, description="Weight of this component in a weighted sum.")


RIGHT_PADDING_CAUSAL = (
    "tokenizer.padding_side: 'right' is not allowed for a causal model: generation continues after the "
    "last prompt column, which would be padding for every shorter prompt. Use 'left' (the default)."
)


class LoraSettings(Strict):
    """LoRA (PEFT) on the policy: only the adapter and the value head train; the reference is the base."""

    enabled: bool = Field(
        False,
        description=(
            "Train a LoRA adapter instead of all weights. A config that gives model.lora settings without "
            "this key turns it on."
        ),
    )
    r: int = Field(8, ge=1, description="Rank of the adapter's update matrices.")
    alpha: float = Field(16.0, gt=0, description="Scaling numerator: the update is scaled by alpha / r.")
    dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on the adapter's input (0 keeps PPO ratios exact)."
    )
    target_modules: list[str] = Field(
        default_factory=list,
        description=(
            "Module names (or name suffixes) that get an adapter, e.g. ['q_proj', 'v_proj']; 'all-linear' "
            "for every linear layer; empty: PEFT's default for the architecture (GPT-2: c_attn; T5: q, v; "
            "Llama/SmolLM2: q_proj, v_proj)."
        ),
    )
    save: Literal["merged", "adapter"] = Field(
        "merged",
        description=(
            "Final model in <run dir>/model: 'merged' (adapter folded into the weights, a plain HF model) "
            "or 'adapter' (adapter files only, naming the base model; loadable as a model path)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _settings_mean_enabled(cls, data: Any) -> Any:
        # `model.lora: {r: 8}` in a YAML file means "use LoRA"; the form always sends `enabled`.
        if isinstance(data, dict) and data and "enabled" not in data:
            data = {**data, "enabled": True}
        return data


class ModelConfig(Strict):
    name_or_path: str = Field(
        "builtin:tiny-gpt2",
        description=(
            "Hub model id, local directory, path to a .gguf file, or a builtin tiny model "
            "('builtin:tiny-gpt2', 'builtin:tiny-t5') that needs no download."
        ),
    )
    type: Literal["auto", "causal", "seq2seq"] = Field(
        "auto", description="Model family; 'auto' reads it from the model's config."
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    gguf_file: str | None = Field(
        None, description="File name of a GGUF checkpoint inside name_or_path (imported once to safetensors)."
    )
    value_head: Literal["shared", "separate"] = Field(
        "shared",
        description="'shared': a value head on the policy's trunk (one model); 'separate': a full critic copy.",
    )
    device: str = Field(
        "auto", description="'auto' (CUDA when available, else CPU), 'cpu', 'cuda', 'cuda:1'."
    )
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = Field(
        "auto",
        description="Autocast precision for forward passes; master weights stay fp32. 'auto' = bf16 where supported.",
    )
    gradient_checkpointing: bool = Field(False, description="Trade compute for memory on large models.")
    compile: bool = Field(
        False,
        description="Compile the transformer blocks with torch.compile (inductor) for the RL update's "
        "forward and backward passes: faster per pass (fused elementwise work), a one-time compile "
        "(seconds per model), the same numbers up to float rounding. Needs a C++ compiler on the CPU. "
        "Generation and scoring stay eager.",
    )
    reference_name_or_path: str | None = Field(
        None, description="Frozen reference model for the KL penalty; default: the initial policy."
    )
    offload_reference: bool = Field(
        False,
        description="Keep the frozen reference's weights in a file in the run folder between its uses "
        "(the rollout's scoring pass, the drift read) and read them back for each: the update, where "
        "peak memory is reached, runs without them (one model's size less), same numbers, a file as "
        "large as the model. Not with LoRA, DPO, model.compile or FSDP.",
    )
    lora: LoraSettings = Field(
        default_factory=LoraSettings,
        description=(
            "LoRA adapter (PEFT) for any algorithm (enabled, r, alpha, dropout, target_modules, save); off: "
            "full fine-tuning. With LoRA the reference model is the base model with the adapter disabled."
        ),
    )


class TokenizerConfig(Strict):
    name_or_path: str | None = Field(None, description="Tokenizer id or path; default: the model's.")
    padding_side: Literal["left", "right"] = Field(
        "left",
        description=(
            "Padding side of causal prompts: must be 'left' (generation continues after the last prompt "
            "token; 'right' is rejected for causal models). Encoder-decoder prompts are always right "
            "padded, whatever this says (BART-like learned positions ignore the attention mask)."
        ),
    )
    truncation_side: Literal["left", "right"] = Field(
        "left", description="Which end of a long prompt is cut."
    )
    pad_token_as_eos_token: bool = Field(
        True, description="Use EOS as the pad token when the tokenizer has none (masks keep them apart)."
    )
    max_prompt_length: int = Field(64, ge=1, description="Prompts are truncated to this many tokens.")


class TaskConfig(Strict):
    id: str = Field("synthetic_increasing_numbers", description="Registered task (data pool) id.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Task arguments, e.g. local data paths or hub dataset names."
    )
    max_train_samples: int | None = Field(None, ge=1, description="Cap on training prompts.")
    max_eval_samples: int | None = Field(None, ge=1, description="Cap on evaluation prompts.")
    seed: int = Field(42, description="Seed for shuffling and subsampling the data.")


class RewardConfig(Strict):
    id: str = Field(
        "increasing_numbers", description="Registered reward id ('weighted_sum' combines several)."
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Reward arguments.")
    components: list[WeightedComponent] = Field(
        default_factory=list, description="For id 'weighted_sum': the rewards to add, each with a weight."
    )
    include_prompt: bool = Field(
        False, description="Score prompt + generation instead of the generation alone."
    )
    subtract_prompt_score: bool = Field(
        False,
        description="With include_prompt: the reward minus the score of the prompt alone (a per-prompt "
        "baseline: same optimal policy and expected gradient, less variance).",
    )
    transform: Literal["identity", "logit"] = Field(
        "identity",
        description="'logit': score in log-odds, log(p / (1 - p)), for a reward that is a probability "
        "(a classifier's P(positive)); applied before subtract_prompt_score. RL4LMs scores the "
        "probability itself (identity).",
    )

    @model_validator(mode="after")
    def _check_prompt_baseline(self) -> RewardConfig:
        if self.subtract_prompt_score and not self.include_prompt:
            raise ValueError(
                "reward.subtract_prompt_score needs reward.include_prompt: true (it subtracts the score "
                "of the prompt alone from the score of prompt + generation)"
            )
        return self


class GenerationConfig(Strict):
    max_new_tokens: int = Field(20, ge=1, description="Episode length limit (tokens generated per prompt).")
    min_new_tokens: int = Field(0, ge=0, description="EOS is forbidden before this many tokens.")
    do_sample: bool = Field(True, description="Sample (True) or greedy/beam decode (False).")
    temperature: float = Field(1.0, gt=0, description="Softmax temperature of sampling.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens (0 = off).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (1.0 = off).")
    num_beams: int = Field(1, ge=1, description="Beam search width (evaluation only).")
    batch_size: int = Field(16, ge=1, description="Prompts generated per forward batch.")

    @model_validator(mode="after")
    def _check(self) -> GenerationConfig:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError("min_new_tokens must not exceed max_new_tokens")
        return self


class NLPOConfig(Strict):
    top_mask: float = Field(
        0.9, gt=0, le=1, description="Top-p mass of the masking policy kept as the action space."
    )
    min_tokens_to_keep: int = Field(
        100, ge=1, description="Never mask the action space below this many tokens."
    )
    mask_update_interval: int = Field(
        5, ge=1, description="Refresh the masking policy from the current policy every N iterations."
    )
    masked_eval: bool = Field(
        True,
        description=(
            "Evaluate through the masked generation (as RL4LMs, which evaluates an NLPO policy with its "
            "mask); false: evaluate the policy's own, unmasked distribution."
        ),
    )


class A2CConfig(Strict):
    """RL4LMs's A2C (SB3's): one gradient step per rollout, RMSprop unless ``use_rms_prop: false``."""

    optimizer: Literal["rmsprop", "adamw"] = Field(
        "rmsprop",
        description=(
            "Optimizer of the A2C step: 'rmsprop' as RL4LMs/SB3 (use_rms_prop: true, the default) or "
            "'adamw' (use_rms_prop: false). Learning rate and weight decay come from the algorithm section."
        ),
    )
    rms_prop_alpha: float = Field(
        0.99,
        gt=0,
        lt=1,
        description="RMSprop smoothing constant of the squared-gradient average (RL4LMs: 0.99).",
    )
    rms_prop_eps: float = Field(
        1e-5, gt=0, description="RMSprop epsilon added to the denominator (RL4LMs: 1e-5)."
    )


class TRPOConfig(Strict):
    """RL4LMs's TRPO (SB3-contrib's): natural-gradient step inside a KL trust region, critic fitted apart."""

    target_kl: float = Field(
        0.01,
        gt=0,
        description=(
            "Trust region: the accepted step keeps the mean per-token KL(new || old policy) below this "
            "(RL4LMs: 0.01). Not the KL penalty's target (kl.target)."
        ),
    )
    cg_max_steps: int = Field(
        15,
        ge=1,
        description="Conjugate-gradient iterations solving F x = g for the step direction (RL4LMs: 15).",
    )
    cg_damping: float = Field(
        0.1, ge=0, description="Damping added to the Fisher-vector product: (F + damping I) v (RL4LMs: 0.1)."
    )
    line_search_shrinking_factor: float = Field(
        0.8,
        gt=0,
        lt=1,
        description="Backtracking line search: the step shrinks by this factor per try (RL4LMs: 0.8).",
    )
    line_search_max_iter: int = Field(
        10,
        ge=1,
        description="Backtracking tries before the step is rejected and the policy kept (RL4LMs: 10).",
    )
    n_critic_updates: int = Field(
        10,
        ge=0,
        description=(
            "Epochs of value regression after the policy step, in minibatches of algorithm.minibatch_size "
            "episodes at algorithm.learning_rate (RL4LMs: 10). The policy's parameters are not changed."
        ),
    )
    sub_sampling_factor: int = Field(
        1,
        ge=1,
        description="Natural-gradient step on every n-th episode of the rollout, for speed (RL4LMs: 1).",
    )


class GroupConfig(Strict):
    """Critic-free group algorithms (GRPO, RLOO, REINFORCE++): G completions per prompt, no value head."""

    group_size: int = Field(
        4,
        ge=1,
        description=(
            "G: completions sampled per prompt (each prompt of train.prompts_per_iter is repeated G times, "
            "so an iteration has prompts_per_iter * G episodes). GRPO, RLOO and reinforce_pp_baseline "
            "need G >= 2; reinforce_pp uses no group and may take 1."
        ),
    )
    beta: float = Field(
        0.04,
        ge=0,
        description=(
            "KL coefficient to the reference model (replaces the kl section for these algorithms). GRPO: "
            "weight of the KL loss term; RLOO: beta * sum_t KL_t is taken from each episode's reward; "
            "REINFORCE++: -beta * KL_t is each token's reward. 0: no KL and no reference model loaded."
        ),
    )
    kl_estimator: Literal["k1", "k3"] | None = Field(
        None,
        description=(
            "Per-token KL estimator on the sampled tokens' log-probs; empty: the algorithm's own (GRPO: "
            "'k3' = (r - 1) - log r, r = pi_ref / pi, as TRL; RLOO and REINFORCE++: 'k1' = log pi - log "
            "pi_ref, as TRL's RLOO and OpenRLHF)."
        ),
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description=(
            "GRPO: divide (r - group mean) by the group's std ('group', the original GRPO), by the whole "
            "batch's std ('batch'), or not at all ('none', Dr. GRPO). A group of equal rewards gets 0."
        ),
    )
    loss_aggregation: Literal["token_mean", "sequence_mean"] = Field(
        "token_mean",
        description=(
            "How per-token losses become one loss: 'token_mean' over every token of the optimizer step "
            "(DAPO, TRL's default), or 'sequence_mean': each episode's token mean, averaged over episodes "
            "(the original GRPO; short episodes weigh more per token)."
        ),
    )


class DPOConfig(Strict):
    """Direct preference optimisation from (prompt, chosen, rejected) pairs (id 'dpo' only)."""

    beta: float = Field(
        0.1,
        gt=0,
        description=(
            "beta: strength of the implicit KL to the reference (larger = stay closer). Implicit reward of a "
            "response = beta * (log pi(y|x) - log pi_ref(y|x))."
        ),
    )
    loss_type: Literal["sigmoid", "ipo"] = Field(
        "sigmoid",
        description=(
            "'sigmoid': DPO, -log sigmoid(beta * h) with h = (log-ratio of chosen) - (log-ratio of rejected), "
            "summed token log-probs; 'ipo': IPO, (h - 1 / (2 beta))^2 on per-token mean log-probs (as TRL)."
        ),
    )
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="sigmoid only: assumed share of flipped labels (conservative DPO); 0 = plain DPO.",
    )
    max_response_length: int = Field(
        128, ge=1, description="Chosen and rejected responses are truncated to this many tokens (plus EOS)."
    )


# RL4LMs defaults that differ between algorithms, applied when a config names the algorithm and
# leaves the field out (YAML, CLI, API). The launch form shows every field, so it shows them as set.
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "a2c": {"gae_lambda": 1.0, "whiten_advantages": False},
    # Critic-free group algorithms: one pass over each generation batch and gradient norm 1.0 (TRL's
    # GRPOTrainer / RLOOTrainer, OpenRLHF); REINFORCE++ returns are undiscounted (OpenRLHF's gamma 1).
    "grpo": {"n_epochs": 1, "max_grad_norm": 1.0},
    "rloo": {"n_epochs": 1, "max_grad_norm": 1.0},
    "reinforce_pp": {"n_epochs": 1, "max_grad_norm": 1.0, "gamma": 1.0},
    "reinforce_pp_baseline": {"n_epochs": 1, "max_grad_norm": 1.0, "gamma": 1.0},
}


class AlgorithmConfig(Strict):
    id: str = Field(
        "ppo",
        description=(
            "Registered algorithm id: 'ppo', 'nlpo', 'a2c', 'trpo', critic-free 'grpo', 'rloo', 'reinforce_pp', "
            "'reinforce_pp_baseline' (RL), offline 'dpo' (preference pairs) or 'sft' (supervised only). "
            "For 'a2c' a config that omits "
            "gae_lambda / whiten_advantages gets RL4LMs's A2C values (1.0, false); the critic-free ones get "
            "n_epochs 1 and max_grad_norm 1.0 (REINFORCE++: gamma 1.0) unless set."
        ),
    )
    learning_rate: float = Field(
        1e-5, gt=0, description="Learning rate (AdamW; A2C: its optimizer; TRPO: the critic only)."
    )
    n_epochs: int = Field(
        4,
        ge=1,
        description="Optimisation epochs over each rollout batch (PPO, NLPO; A2C and TRPO take one step).",
    )
    minibatch_size: int = Field(16, ge=1, description="Episodes per gradient step (before accumulation).")
    grad_accumulation: int = Field(1, ge=1, description="Minibatches accumulated per optimizer step.")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor of GAE.")
    gae_lambda: float = Field(
        0.95, ge=0, le=1, description="GAE lambda (RL4LMs: 0.95 for PPO, NLPO and TRPO; 1.0 for A2C)."
    )
    clip_range: float = Field(0.2, gt=0, description="PPO ratio clip epsilon.")
    clip_range_value: float | None = Field(
        None, description="Value clipping range (None = no value clipping, the RL4LMs / SB3 default)."
    )
    vf_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    ent_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    max_grad_norm: float = Field(0.5, gt=0, description="Gradient clipping norm.")
    clip_grad_per_model: bool = Field(
        False,
        description=(
            "PPO/NLPO with model.value_head 'separate': clip the policy's and the critic's gradients each by "
            "its own norm and step each model before the other's backward, so one model's gradients are alive "
            "at a time (SmolLM2-135M fp32: 0.5 GB less). Off: one norm over both models, as RL4LMs / SB3 and "
            "TRL; on: as OpenRLHF and verl, whose actor and critic have their own optimizers."
        ),
    )
    target_kl: float | None = Field(
        None,
        description="Stop the epoch loop early when the approximate KL to the rollout policy exceeds this.",
    )
    whiten_advantages: bool = Field(
        True,
        description="Normalise advantages to zero mean, unit variance (RL4LMs: on, except A2C: off).",
    )
    advantage_normalization: Literal["minibatch", "rollout"] = Field(
        "minibatch",
        description=(
            "PPO/NLPO: where advantages are normalised when whiten_advantages is on: 'minibatch' (RL4LMs / SB3: "
            "each minibatch's valid tokens, sample std + 1e-8) or 'rollout' (once per rollout, population "
            "variance, as TRL). Other algorithms always normalise once per rollout."
        ),
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    nlpo: NLPOConfig = Field(
        default_factory=NLPOConfig, description="NLPO masking settings (id 'nlpo' only)."
    )
    a2c: A2CConfig = Field(default_factory=A2CConfig, description="A2C optimizer settings (id 'a2c' only).")
    trpo: TRPOConfig = Field(
        default_factory=TRPOConfig, description="TRPO trust region and critic settings (id 'trpo' only)."
    )
    group: GroupConfig = Field(
        default_factory=GroupConfig,
        description="Group size, KL and loss settings of 'grpo', 'rloo', 'reinforce_pp', 'reinforce_pp_baseline'.",
    )
    dpo: DPOConfig = Field(
        default_factory=DPOConfig,
        description="DPO / IPO settings (id 'dpo' only; data: a preference_pairs task).",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict, description="Arguments for user-registered algorithms."
    )

    @model_validator(mode="before")
    @classmethod
    def _algorithm_defaults(cls, data: Any) -> Any:
        # Only keys the config leaves out: an explicit value always wins.
        if isinstance(data, dict) and data.get("id") in ALGORITHM_DEFAULTS:
            data = {**ALGORITHM_DEFAULTS[data["id"]], **data}
        return data


class KLConfig(Strict):
    controller: Literal["adaptive", "ziegler", "fixed"] = Field(
        "adaptive",
        description=(
            "'adaptive': RL4LMs's controller; reads the per-TOKEN mean KL of each rollout and sets "
            "beta *= 1 + 0.1 * clip((KL - target) / target, -0.2, 0.2) once per rollout. "
            "'ziegler': Ziegler et al. (2019); reads the per-EPISODE SUM of KL and sets "
            "beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * episodes / horizon. 'fixed': constant beta."
        ),
    )
    init_coef: float = Field(0.1, ge=0, description="Initial KL penalty coefficient beta.")
    target: float | None = Field(
        0.1,
        gt=0,
        description=(
            "Target KL in the controller's units: nats per token for 'adaptive' (RL4LMs's target_kl), "
            "nats per episode (sum over its tokens) for 'ziegler'; unused by 'fixed'."
        ),
    )
    horizon: int = Field(10000, ge=1, description="'ziegler' only: horizon in episodes.")
    estimator: Literal["k1", "k3", "full"] = Field(
        "k1",
        description=(
            "Per-token KL of the penalty, always between the FULL-vocabulary distributions of policy and "
            "reference at the sampling temperature (never the top-k/top-p/NLPO-restricted ones): "
            "'k1' = log pi - log pi_ref of the sampled token (RL4LMs); 'k3' = (r - 1) - log r, "
            "r = pi_ref / pi (non-negative); 'full' = the exact KL summed over the vocabulary."
        ),
    )


class SupervisedConfig(Strict):
    enabled: bool = Field(
        False, description="Run supervised fine-tuning on references before RL (warm start)."
    )
    epochs: float = Field(1.0, gt=0, description="Passes over the training references.")
    learning_rate: float = Field(1e-4, gt=0, description="SFT learning rate.")
    batch_size: int = Field(16, ge=1, description="SFT batch size.")
    max_target_length: int = Field(64, ge=1, description="References are truncated to this many tokens.")
    max_steps: int | None = Field(None, ge=1, description="Cap on SFT optimizer steps.")
    # Validated as a TaskConfig (unknown keys are errors), but advertised in the JSON Schema as one
    # optional mapping: a schema-driven form then shows a single "empty = the run's task" box
    # instead of a full task section that would always be filled in with the default task.
    task: Annotated[
        TaskConfig | None,
        WithJsonSchema({"anyOf": [{"type": "object"}, {"type": "null"}]}),
    ] = Field(
        None,
        description=(
            "Task whose train references the SFT phase learns from (a task section: id, args, "
            "max_train_samples, ...); empty or null: the run's task. RL and evaluation always use the "
            "run's task, e.g. SFT on imdb_seq2seq (positive reviews) then PPO on imdb, as RL4LMs."
        ),
    )

    @field_validator("task", mode="before")
    @classmethod
    def _empty_task_is_none(cls, value: Any) -> Any:
        # An empty mapping (what an empty YAML box in a form gives) means "no separate SFT task",
        # not "the default synthetic task".
        return None if value == {} else value


class TensorBoardOptions(Strict):
    log_dir: str | None = Field(None, description="Event-file directory (default <run dir>/tensorboard).")


class MLflowOptions(Strict):
    tracking_uri: str | None = Field(
        None,
        description="Tracking server URL or file-store path (default MLFLOW_TRACKING_URI, else "
        "<runs dir>/mlruns).",
    )
    experiment: str | None = Field(
        None, description="Experiment name (default MLFLOW_EXPERIMENT_NAME, else 'grue-studio')."
    )


class WandbOptions(Strict):
    project: str | None = Field(None, description="W&B project (default WANDB_PROJECT, else 'grue-studio').")
    entity: str | None = Field(None, description="W&B entity, a user or team (default WANDB_ENTITY).")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None, description="online, offline (local files for `wandb sync`) or disabled (default WANDB_MODE)."
    )
    dir: str | None = Field(
        None, description="Where W&B writes its files (default WANDB_DIR, else the run dir)."
    )


class TrackersConfig(Strict):
    """Options of the trackers selected in ``train.report_to``; unset fields use the trackers' env vars."""

    tensorboard: TensorBoardOptions = Field(default_factory=TensorBoardOptions, description="TensorBoard.")
    mlflow: MLflowOptions = Field(default_factory=MLflowOptions, description="MLflow.")
    wandb: WandbOptions = Field(default_factory=WandbOptions, description="Weights & Biases.")
    flush_timeout_s: float = Field(
        60.0, gt=0, description="Seconds the end of a run waits for a tracker to deliver what it holds."
    )


# A list of tracker ids, advertised in the JSON Schema as a set of choices (checkboxes in the form).
ReportTo = Annotated[
    list[str],
    WithJsonSchema(
        {"type": "array", "items": {"type": "string", "enum": list(TRACKER_IDS)}, "uniqueItems": True}
    ),
]


class TrainConfig(Strict):
    # The bound refuses absurd values at validation (10^9 iterations would never end, and 3·10^9 does
    # not fit the database's iteration column) instead of queueing them.
    n_iters: int = Field(10, ge=0, le=10_000_000, description="RL iterations (rollout + update).")
    prompts_per_iter: int = Field(16, ge=1, description="Episodes collected per iteration.")
    seed: int = Field(0, description="Seed of torch, numpy and Python's random.")
    eval_every: int = Field(5, ge=0, description="Evaluate every N iterations (0 = only at the end).")
    eval_at_start: bool = Field(
        False,
        description="Also evaluate the starting policy (after a supervised warm start) at step 0, before "
        "the first RL iteration, as RL4LMs's trainer does: the first point of every eval curve, e.g. "
        "the gold at KL 0 of the over-optimisation watch. Not repeated when a run resumes.",
    )
    save_every: int = Field(5, ge=0, description="Checkpoint every N iterations (0 = only at the end).")
    log_samples: int = Field(8, ge=0, description="Generations per iteration sent to the sink.")
    output_dir: str | None = Field(None, description="Run directory; default runs/<name>-<timestamp>.")
    keep_checkpoints: int = Field(2, ge=1, description="How many checkpoints to keep.")
    save_final_model: bool = Field(True, description="Write the final model in HF format to <run dir>/model.")
    report_to: ReportTo = Field(
        default_factory=list,
        description="Also export the run to these trackers: " + ", ".join(TRACKER_IDS) + " "
        "(optional packages: pip install 'grue-studio[trackers]').",
    )
    trackers: TrackersConfig = Field(default_factory=TrackersConfig, description="Tracker options.")

    @field_validator("report_to", mode="before")
    @classmethod
    def _known_trackers(cls, value: Any) -> Any:
        # "tensorboard,mlflow" (a --set or env value) as well as a list; unknown ids list the known ones.
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            return value
        for item in value:
            if item not in TRACKER_IDS:
                raise ValueError(f"unknown tracker id {item!r}; known tracker ids: {', '.join(TRACKER_IDS)}")
        return list(dict.fromkeys(value))


#: Algorithms that read the reference in their update, where model.offload_reference has it on disk.
OFFLOAD_UNSUPPORTED = {
    "dpo": "DPO reads the reference in every update step (its log-ratio), where offloading it would "
    "read it back per minibatch: keep it resident",
}

#: Algorithms that cannot train sharded parameters (resources.strategy fsdp), with the reason.
FSDP_UNSUPPORTED = {
    "trpo": "its natural-gradient step works on one flat vector of every parameter (conjugate "
    "gradient with Fisher-vector products from torch.autograd.grad, then a line search that writes the "
    "flat vector back), which sharded parameters (DTensor shards, gradients reduce-scattered only by "
    "FSDP's backward hooks) do not offer",
    "nlpo": "its masking policy is a periodically refreshed deep copy of the policy, and sharded "
    "modules cannot be deep-copied",
}


class ResourcesConfig(Strict):
    """What a run needs to run: read by the web app to route it to a worker that has it, and by
    ``torchrun`` launches (docs/engine.md "Distributed runs", docs/platform.md "Queues")."""

    devices: Literal["cpu", "cuda"] = Field(
        "cpu", description="Device kind the run needs: 'cpu' or 'cuda' (a GPU worker's queue)."
    )
    processes: int = Field(
        1, ge=1, le=1024, description="Processes (torchrun ranks) sharing the run's batch; 1 = no torchrun."
    )
    gpus_per_process: int = Field(0, ge=0, le=16, description="GPUs each process needs (devices: cuda).")
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description=(
            "How several processes hold the model: 'ddp' = a full replica per process, gradients "
            "averaged; 'fsdp' = parameters, gradients and optimizer state sharded per transformer "
            "block (FSDP2 fully_shard), for models that do not fit one device. One process: no effect."
        ),
    )
    collective_timeout_s: float = Field(
        600.0,
        gt=0,
        le=86400,
        description="Seconds a rank waits in a collective before the run fails (a dead rank never hangs it).",
    )
    retain_freed_memory: bool = Field(
        True,
        description=(
            "CPU runs on Linux (glibc): keep freed memory in the process instead of returning big blocks "
            "to the kernel, so each step's large tensors reuse pages instead of faulting in fresh ones "
            "(a GRPO update of SmolLM2 ~1 s faster). The process keeps its peak heap; false = glibc's defaults."
        ),
    )

    @model_validator(mode="after")
    def _gpus_match_devices(self) -> ResourcesConfig:
        if self.devices == "cpu" and self.gpus_per_process:
            raise ValueError("gpus_per_process must be 0 when devices is 'cpu'")
        return self


class EvalConfig(Strict):
    split: Literal["validation", "test"] = Field("validation", description="Split evaluated during training.")
    metrics: list[Component] = Field(
        default_factory=list, description="Metrics computed on evaluation generations (by registered id)."
    )
    generation: GenerationConfig = Field(
        default_factory=lambda: GenerationConfig(do_sample=False),
        description="Decoding used for evaluation.",
    )


class RunConfig(Strict):
    """A complete, reproducible description of one run."""

    name: str = Field("run", description="Human-readable name of the run.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    tokenizer: TokenizerConfig = Field(
        default_factory=TokenizerConfig, description="Tokenizer and prompt handling."
    )
    task: TaskConfig = Field(default_factory=TaskConfig, description="Data pool.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Training reward.")
    rollout: GenerationConfig = Field(
        default_factory=GenerationConfig, description="Generation during rollouts."
    )
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm.")
    kl: KLConfig = Field(default_factory=KLConfig, description="KL penalty to the reference model.")
    supervised: SupervisedConfig = Field(
        default_factory=SupervisedConfig, description="Supervised warm start."
    )
    train: TrainConfig = Field(default_factory=TrainConfig, description="Training loop.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation.")
    resources: ResourcesConfig = Field(
        default_factory=ResourcesConfig, description="Processes and devices the run needs."
    )

    @model_validator(mode="after")
    def _causal_prompts_left_padded(self) -> RunConfig:
        causal = self.model.type == "causal" or (
            self.model.type == "auto" and self.model.name_or_path == "builtin:tiny-gpt2"
        )
        if causal and self.tokenizer.padding_side == "right":
            raise ValueError(RIGHT_PADDING_CAUSAL)
        return self

    @model_validator(mode="after")
    def _fsdp_supported(self) -> RunConfig:
        # docs/engine.md "Distributed runs", FSDP: what cannot run on sharded parameters, and why.
        if self.resources.strategy != "fsdp":
            return self
        if self.algorithm.id in FSDP_UNSUPPORTED:
            raise ValueError(
                f"resources.strategy 'fsdp' does not support algorithm {self.algorithm.id!r}: "
                f"{FSDP_UNSUPPORTED[self.algorithm.id]}; use strategy 'ddp'"
            )
        if self.model.lora.enabled:
            raise ValueError("resources.strategy 'fsdp' does not support model.lora (use strategy 'ddp')")
        return self

    @model_validator(mode="after")
    def _offload_reference_supported(self) -> RunConfig:
        if not self.model.offload_reference:
            return self
        why = None
        if self.model.lora.enabled:
            why = "with model.lora the reference is the base model with the adapter off: there is no copy to offload"
        elif self.algorithm.id in OFFLOAD_UNSUPPORTED:
            why = OFFLOAD_UNSUPPORTED[self.algorithm.id]
        elif self.model.compile:
            why = "model.compile's blocks hold the reference's weights (turn one off)"
        elif self.resources.strategy == "fsdp":
            why = "resources.strategy 'fsdp' shards the reference across ranks (use 'ddp')"
        if why:
            raise ValueError(f"model.offload_reference: {why}")
        return self

    @model_validator(mode="after")
    def _per_model_clip_needs_two_models(self) -> RunConfig:
        if not self.algorithm.clip_grad_per_model:
            return self
        if self.algorithm.id not in ("ppo", "nlpo"):
            raise ValueError(
                f"algorithm.clip_grad_per_model applies to 'ppo' and 'nlpo', not {self.algorithm.id!r}"
            )
        if self.model.value_head != "separate":
            raise ValueError(
                "algorithm.clip_grad_per_model needs model.value_head 'separate' (a shared trunk is one model)"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """Flatten pydantic errors into ``(dotted.path, message)`` pairs for forms and the CLI."""
    errs = []
    for e in exc.errors():
        loc = _format_loc(tuple(e["loc"])) or "(root)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        errs.append((loc, msg))
    return errs


def parse_config(data: dict[str, Any] | RunConfig, source: str = "config") -> RunConfig:
    """Validate a mapping; errors become a ConfigError naming every bad field."""
    if isinstance(data, RunConfig):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        errs = validation_errors(exc)
        lines = "\n".join(f"  {loc}: {msg}" for loc, msg in errs)
        raise ConfigError(f"{source}: invalid config\n{lines}", errs) from None


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. train.n_iters=20")
        key, raw = item.split("=", 1)
        try:
            value = yamlio.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        out.append((key.strip(), value))
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML/JSON file; a syntax error names the file and line."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file not found: {p}")
    text = p.read_text()
    try:
        yamlio.check_size(text)
        data = yamlio.safe_load(text) if p.suffix != ".json" else json.loads(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{p}:{where}: bad YAML: {getattr(exc, 'problem', exc)}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: line {exc.lineno}: bad JSON: {exc.msg}") from None
    return data or {}


def is_rl4lms_config(data: dict[str, Any]) -> bool:
    return isinstance(data, dict) and (
        "datapool" in data or "reward_fn" in data or "alg" in data or "env" in data
    )


def json_schema() -> dict[str, Any]:
    return RunConfig.model_json_schema()
