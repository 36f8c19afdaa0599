"""Checks of a config against what this installation has: registered component ids, each
component's arguments, which task, algorithm and reward settings go together, and the model's context
length.

Why beside the schema and not in it: the schema (``engine.config``) describes any run, and stays
importable without the components; these checks need the registries and the model's size. Without
them an unknown task id or a ``max_new_tokens`` of 10^6 passes validation, is queued, and fails on a
worker (``UnknownComponentError`` after the model loaded; ``IndexError`` in the position embedding
after 23 s). The web app's one validator (``webapp.runs.services.validate_config``: launch form, YAML
view and API) reports these errors together with the schema's and the path rules', each naming its
field. Free of torch and transformers at import: it reads a local model's ``config.json`` as JSON
(a registry lookup loads the built-in components, as any lookup does).

``config_errors`` works on a raw mapping too (values of the wrong type are skipped, the schema names
them), so a config that fails the schema still gets its component, argument and compatibility errors
in the same report: a user fixes everything in one round instead of one stage at a time.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine import registry
from engine.models.builtin import BUILTIN_MODELS, BUILTIN_PREFIX

_POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")

#: Tasks whose samples carry a (chosen, rejected) pair, the data of 'dpo'. A user-registered task
#: factory says so with a ``provides_pairs = True`` attribute.
PAIR_TASKS = frozenset({"preference_pairs"})
#: Algorithms that learn from preference pairs instead of a reward (what they need from a task).
PAIR_ALGORITHMS = frozenset({"dpo"})


def _section(cfg: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = cfg.get(key)
    return value if isinstance(value, Mapping) else {}


def component_errors(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(field, message)`` for every component id of ``cfg`` that no registry holds."""
    errors: list[tuple[str, str]] = []

    def check(field: str, value: Any, reg: registry.Registry[Any]) -> None:
        if isinstance(value, str) and value not in reg:
            known = ", ".join(reg.ids())
            errors.append((field, f"unknown {reg.kind} id {value!r}; registered: {known}"))

    check("task.id", _section(cfg, "task").get("id"), registry.tasks)
    sft_task = _section(cfg, "supervised").get("task")
    if isinstance(sft_task, Mapping):
        check("supervised.task.id", sft_task.get("id"), registry.tasks)
    reward = _section(cfg, "reward")
    check("reward.id", reward.get("id"), registry.rewards)
    components = reward.get("components")
    for i, comp in enumerate(components if isinstance(components, list) else []):
        if isinstance(comp, Mapping):
            check(f"reward.components[{i}].id", comp.get("id"), registry.rewards)
    check("algorithm.id", _section(cfg, "algorithm").get("id"), registry.algorithms)
    metrics = _section(cfg, "eval").get("metrics")
    for i, metric in enumerate(metrics if isinstance(metrics, list) else []):
        if isinstance(metric, Mapping):
            check(f"eval.metrics[{i}].id", metric.get("id"), registry.metrics)
    return errors


def model_context(name_or_path: str, *, local_files: bool = True) -> tuple[int | None, bool]:
    """``(positions, encoder_decoder)`` of a builtin model or (``local_files``) a local model
    directory; positions is None when unknown (a hub id not on disk, a GGUF file, relative position
    encodings, a path on another machine)."""
    if name_or_path.startswith(BUILTIN_PREFIX):
        spec = BUILTIN_MODELS.get(name_or_path[len(BUILTIN_PREFIX) :]) or {}
        return spec.get("n_positions"), spec.get("kind") == "seq2seq"
    if not local_files:
        return None, False
    config = Path(name_or_path).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except (OSError, ValueError):
        return None, False
    if not isinstance(data, dict):
        return None, False
    positions = next((data[k] for k in _POSITION_KEYS if isinstance(data.get(k), int)), None)
    return positions, bool(data.get("is_encoder_decoder"))


def size_errors(cfg: Mapping[str, Any], *, local_files: bool = True) -> list[tuple[str, str]]:
    """Generation lengths that do not fit the model's context: a causal model holds the prompt and the
    generation in one window (``tokenizer.max_prompt_length + max_new_tokens``); an encoder-decoder
    holds each on its side. ``local_files=False``: read no model directory (builtins only)."""
    model = cfg.get("model") or {}
    name = model.get("name_or_path")
    if not isinstance(name, str):
        return []
    positions, enc_dec = model_context(name, local_files=local_files)
    if not positions:
        return []
    enc_dec = enc_dec or model.get("type") == "seq2seq"
    prompt = int((cfg.get("tokenizer") or {}).get("max_prompt_length") or 0)
    errors: list[tuple[str, str]] = []
    if prompt > positions:
        errors.append(
            (
                "tokenizer.max_prompt_length",
                f"{prompt} is more than the model's context ({positions} positions, {name})",
            )
        )
    room = positions if enc_dec else positions - prompt
    for field, section in (
        ("rollout.max_new_tokens", cfg.get("rollout") or {}),
        ("eval.generation.max_new_tokens", (cfg.get("eval") or {}).get("generation") or {}),
    ):
        new = section.get("max_new_tokens")
        if isinstance(new, int) and new > room:
            where = "" if enc_dec else f" with tokenizer.max_prompt_length {prompt}"
            errors.append(
                (field, f"{new} tokens do not fit: at most {max(room, 0)}{where} in the model's context "
                        f"of {positions} positions ({name})")
            )  # fmt: skip
    return errors


def _parameters(factory: Any) -> tuple[dict[str, bool], bool] | None:
    """``({name: required}, takes_any_keyword)`` of a factory's keyword parameters; None when its
    signature cannot be read (a builtin, a C extension): then nothing is checked."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    named: dict[str, bool] = {}
    any_keyword = False
    for name, param in sig.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            any_keyword = True
        elif param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            named[name] = param.default is inspect.Parameter.empty
    return named, any_keyword


def _argument_errors(field: str, cid: Any, args: Any, reg: registry.Registry[Any]) -> list[tuple[str, str]]:
    """Unknown and missing keyword arguments of one component (built as ``factory(**args)``)."""
    if not isinstance(cid, str) or cid not in reg or not isinstance(args, Mapping):
        return []
    spec = _parameters(reg.get(cid))
    if spec is None:
        return []
    named, any_keyword = spec
    errors: list[tuple[str, str]] = []
    takes = ", ".join(named) or "no arguments"
    if not any_keyword:
        for key in args:
            if key not in named:
                errors.append(
                    (f"{field}.args.{key}", f"{reg.kind} {cid!r} has no argument {key!r} (it takes: {takes})")
                )
    for name, required in named.items():
        if required and name not in args:
            errors.append(
                (f"{field}.args.{name}", f"{reg.kind} {cid!r} needs this argument ({field}.args.{name})")
            )
    # A component that can check its arguments' values without loading anything offers
    # ``check_args(args, where) -> [(field, message)]`` (the rubric reward: criteria, scales, judge).
    checker = getattr(reg.get(cid), "check_args", None)
    if not errors and callable(checker):
        errors.extend(checker(args, f"{field}.args"))
    return errors


def argument_errors(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(field, message)`` for every component argument its factory does not take, and every one it
    needs that is missing: without this check ``task.args: {pth: x}`` is queued and fails on a worker
    with a TypeError when the data loads."""
    errors: list[tuple[str, str]] = []
    task = _section(cfg, "task")
    errors += _argument_errors(
        "task", task.get("id", "synthetic_increasing_numbers"), task.get("args") or {}, registry.tasks
    )
    sft_task = _section(cfg, "supervised").get("task")
    if isinstance(sft_task, Mapping):
        errors += _argument_errors(
            "supervised.task", sft_task.get("id"), sft_task.get("args") or {}, registry.tasks
        )
    reward = _section(cfg, "reward")
    rid = reward.get("id", "increasing_numbers")
    components = reward.get("components") or []
    args = reward.get("args") or {}
    if rid == "weighted_sum":
        listed = components or (args.get("components") if isinstance(args, Mapping) else None)
        if not listed:
            errors.append(
                ("reward.components", "reward 'weighted_sum' adds the rewards listed here: give at least one")
            )
        extra = sorted(set(args) - {"components"}) if isinstance(args, Mapping) else []
        if extra or (components and args):
            errors.append(
                ("reward.args", f"reward 'weighted_sum' takes no reward.args ({', '.join(extra or sorted(args))}); "
                                "give each component its own args in reward.components")
            )  # fmt: skip
    else:
        errors += _argument_errors("reward", rid, args, registry.rewards)
        if components:
            errors.append(
                ("reward.components", f"only reward id 'weighted_sum' adds components (reward.id is {rid!r})")
            )
    if isinstance(components, list):
        for i, comp in enumerate(components):
            if isinstance(comp, Mapping) and comp.get("id") != "weighted_sum":
                errors += _argument_errors(
                    f"reward.components[{i}]", comp.get("id"), comp.get("args") or {}, registry.rewards
                )
    metrics = _section(cfg, "eval").get("metrics") or []
    if isinstance(metrics, list):
        for i, metric in enumerate(metrics):
            if isinstance(metric, Mapping):
                errors += _argument_errors(
                    f"eval.metrics[{i}]", metric.get("id"), metric.get("args") or {}, registry.metrics
                )
    return errors


def _provides_pairs(task_id: Any) -> bool:
    if task_id in PAIR_TASKS:
        return True
    return (
        isinstance(task_id, str)
        and task_id in registry.tasks
        and bool(getattr(registry.tasks.get(task_id), "provides_pairs", False))
    )


def compatibility_errors(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Task × algorithm × settings that cannot run together, each on the field to change: 'dpo'
    on a task without preference pairs, a group algorithm (GRPO, RLOO, REINFORCE++ with baseline)
    with fewer than 2 completions per prompt, TRPO with gradient checkpointing. These failed on a
    worker after the model loaded (the DPO one only at its first iteration)."""
    errors: list[tuple[str, str]] = []
    algorithm = _section(cfg, "algorithm")
    alg = algorithm.get("id", "ppo")
    task_id = _section(cfg, "task").get("id", "synthetic_increasing_numbers")
    if not isinstance(alg, str) or alg not in registry.algorithms:
        return errors
    if alg in PAIR_ALGORITHMS and isinstance(task_id, str) and not _provides_pairs(task_id):
        errors.append(
            (
                "algorithm.id",
                f"{alg!r} learns from preference pairs (prompt, chosen, rejected), and task {task_id!r} has "
                "none: use task.id 'preference_pairs' with task.args.path (e.g. a campaign's pairs export), "
                "or an RL algorithm such as 'ppo' or 'grpo' for this task",
            )
        )
    if getattr(registry.algorithms.get(alg), "needs_group", False):
        group = _section(algorithm, "group")
        size = group.get("group_size", 4)
        if isinstance(size, int) and not isinstance(size, bool) and size < 2:
            errors.append(
                (
                    "algorithm.group.group_size",
                    f"{alg!r} compares the completions of each prompt with each other, so it needs at least "
                    f"2 per prompt (got {size})",
                )
            )
    if alg == "trpo" and _section(cfg, "model").get("gradient_checkpointing") is True:
        errors.append(
            (
                "model.gradient_checkpointing",
                "algorithm 'trpo' needs second derivatives (Fisher-vector products), which gradient "
                "checkpointing does not support: turn it off",
            )
        )
    errors += compile_errors(cfg)
    return errors


#: Algorithms whose update differentiates twice: compiled graphs have no double backward.
COMPILE_DOUBLE_BACKWARD = {"trpo": "its Fisher-vector products differentiate the KL's gradient again"}


def compile_errors(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What ``model.compile`` cannot be combined with (the trainer raises the same before training)."""
    model = _section(cfg, "model")
    if model.get("compile") is not True:
        return []
    errors = []
    alg = _section(cfg, "algorithm").get("id", "ppo")
    if alg in COMPILE_DOUBLE_BACKWARD:
        errors.append(
            (
                "model.compile",
                f"algorithm {alg!r} cannot use compiled blocks: {COMPILE_DOUBLE_BACKWARD[alg]}, and compiled "
                "graphs have no double backward; set model.compile: false",
            )
        )
    if model.get("gradient_checkpointing") is True:
        errors.append(
            (
                "model.compile",
                "model.compile and model.gradient_checkpointing together are not supported (the "
                "checkpointed blocks would be recomputed outside the compiled graph): turn one off",
            )
        )
    if _section(cfg, "resources").get("strategy") == "fsdp":
        errors.append(
            (
                "model.compile",
                "model.compile is not supported with resources.strategy 'fsdp' (sharded blocks gather their "
                "parameters in hooks the compiled call would bypass): use 'ddp' or turn it off",
            )
        )
    return errors


def config_errors(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Component, argument and compatibility errors: everything checkable without the model, on a
    parsed config or on a raw mapping that failed the schema."""
    return component_errors(cfg) + argument_errors(cfg) + compatibility_errors(cfg)


def launch_errors(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every error of a schema-valid config this module finds (empty when it can run here)."""
    return config_errors(cfg) + size_errors(cfg)
