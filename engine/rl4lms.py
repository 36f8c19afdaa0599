"""Import of RL4LMs task configs (``tokenizer / reward_fn / datapool / env / alg / train_evaluation``).

RL4LMs users have a directory of YAML task configs; they should be able to run them unchanged
(``python -m engine train scripts/training/task_configs/imdb_text_continuation/gpt2_ppo.yml``).
The two formats differ in shape (RL4LMs counts token *transitions* per environment, we count
*episodes* per iteration) and in ids, so the import is a translation, not a copy: every key is
either mapped onto a RunConfig field, accepted as meaningless here (logging verbosity), or
reported back in the ``unhonoured`` list *and* logged, so that nothing is silently dropped.

Hub names (``lvwerra/gpt2-imdb``, ``t5-base`` ...) cannot be downloaded on an offline machine;
a *model map* rewrites them to local paths everywhere they occur (policy, tokenizer, reward and
metric models). It comes from, in increasing priority:

* the ``GRUE_MODEL_MAP`` environment variable: ``name=path,name2=path2`` or the path of a
  YAML/JSON file holding a ``{hub name: local path}`` mapping;
* a top-level ``model_map:`` mapping in the RL4LMs YAML itself (our extension; RL4LMs ignores it);
* the ``model_map`` argument of :func:`convert_rl4lms`.

``--set model.name_or_path=...`` on the command line still applies after the conversion.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import yaml

from engine import registry, yamlio
from engine.config import ConfigError
from engine.registry import algorithms
from engine.rewards.grue import PYROUGE_ONLY_ARGS

log = logging.getLogger("engine.rl4lms")

MODEL_MAP_ENV = "GRUE_MODEL_MAP"

# RL4LMs datapool id -> our task id.
TASK_IDS: dict[str, str] = {
    "imdb": "imdb",
    "imdb_seq2seq": "imdb_seq2seq",
    "dummy_pool": "synthetic_increasing_numbers",
    "commongen": "commongen",
    "cnn_daily_mail": "cnn_daily_mail",
    "totto": "totto",
    "narrative_qa": "narrative_qa",
    "iwslt2017en_de": "iwslt2017en_de",
    "wmt16en_de": "wmt16en_de",
    "daily_dialog": "daily_dialog",
}

# RL4LMs reward_fn id -> our reward id. engine/rewards registers RL4LMs's ids with RL4LMs's argument
# names (learned_reward, meteor + shaping_fn, rouge + rouge_type, rouge_l_max, ter, intent_accuracy ...),
# so most map onto themselves; only ids we do not register are translated here.
REWARD_IDS: dict[str, str] = {
    "spider": "cider",  # SPICE is unavailable: CIDEr part only (noted)
    "learned_batched_reward": "learned_reward",
}

# RL4LMs metric id -> our metric id.
METRIC_IDS: dict[str, str] = {
    "learned_reward": "sentiment",  # with variant "learned": P(label) of a classifier
    "causal_perplexity": "perplexity",
    "diversity": "diversity",
    "meteor": "meteor",
    "rouge": "rouge",
    "rouge_l_max": "rouge_l_max",
    "bleu": "bleu",
    "bleu_totto": "bleu",
    "sacre_bleu": "sacrebleu",
    "ter": "ter",
    "chrf": "chrf",
    "bert_score": "bertscore",
    "cider": "cider",
    "parent_totto": "parent",
    "intent_accuracy": "intent_accuracy",
    "increasing_numbers": "increasing_numbers",
}

# Metrics that cannot run offline or at all here; dropped with a note.
UNAVAILABLE_METRICS: dict[str, str] = {
    "spice": "SPICE needs Java and Stanford CoreNLP downloads; not available (see docs/grue.md)",
    "bleurt": "BLEURT needs a TensorFlow checkpoint download; not available",
    "summaCZS": "SummaC needs model downloads; not available",
    "summaCConv": "SummaC needs model downloads; not available",
}

#: HF ``generate``'s default ``top_k`` (GenerationConfig), which RL4LMs's sampling uses when its
#: generation kwargs do not set one.
HF_DEFAULT_TOP_K = 50

ALGORITHM_IDS: dict[str, str] = {
    "ppo": "ppo",
    "nlpo": "nlpo",
    "a2c": "a2c",
    "trpo": "trpo",
    "supervised": "sft",
}

# SB3 / SB3-contrib defaults of RL4LMs's A2C and TRPO where they differ from ours; an imported config
# that leaves them out gets RL4LMs's value. (PPO's learning rate etc. are always given by RL4LMs configs.)
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "a2c": {"learning_rate": 7e-4, "gae_lambda": 1.0, "whiten_advantages": False},
    "trpo": {"learning_rate": 1e-3, "gae_lambda": 0.95, "whiten_advantages": True},
}
TRPO_BATCH_SIZE = 128  # SB3-contrib's critic minibatch, in transitions
# RL4LMs alg.args of TRPO -> algorithm.trpo fields (same names), with their types.
TRPO_ARGS: dict[str, type] = {
    "target_kl": float,
    "cg_max_steps": int,
    "cg_damping": float,
    "line_search_shrinking_factor": float,
    "line_search_max_iter": int,
    "n_critic_updates": int,
    "sub_sampling_factor": int,
}
# Arguments an algorithm's SB3 class does not take (RL4LMs would fail on them): noted and dropped.
NOT_APPLICABLE_ARGS: dict[str, set[str]] = {
    "a2c": {"n_epochs", "batch_size", "clip_range", "clip_range_vf", "target_kl"},
    "trpo": {"n_epochs", "clip_range", "clip_range_vf", "ent_coef", "vf_coef", "max_grad_norm"},
}

# RL4LMs argument names -> ours, per "<kind>:<our id>". Everything else passes through if the
# registered factory accepts it (checked by signature) and is reported otherwise.
ARG_RENAMES: dict[str, dict[str, str]] = {
    "metric:rouge_l_max": {"stemming": "use_stemmer"},
    "metric:sentiment": {"model_name": "model_path", "label_ix": "label_index"},
}

# Arguments that only steer RL4LMs internals (batching, striding) and do not change results here.
IGNORED_ARGS: dict[str, set[str]] = {
    "metric:perplexity": {"model_type"},
    "metric:sentiment": {"batch_size"},
}

# Arguments whose RL4LMs meaning we deliberately do not reproduce: dropped with this note.
CHANGED_ARGS: dict[str, dict[str, str]] = {
    "metric:perplexity": {
        "use_text_from_meta_data": "the policy's perplexity is computed on the task's references "
        "(RL4LMs can read meta_data['reference'] instead)",
        "tokenizer_id": "the references are tokenized with the policy's own tokenizer",
    },
    "metric:bertscore": {"language": "BERTScore uses the encoder in args.model (default: offline MiniLM)"},
    "reward:bert_score": {"language": "BERTScore uses the encoder in args.model (default: offline MiniLM)"},
    # py-rouge options RL4LMs passes to ROUGE-L-max; rouge-score has no equivalent (the reward accepts and
    # ignores them, so say so here).
    "reward:rouge_l_max": {
        k: "py-rouge option; ROUGE-L-max here is rouge-score's ROUGE-L F (stemming kept)"
        for k in sorted(PYROUGE_ONLY_ARGS)
    },
}

# Keys with no meaning beyond RL4LMs's own logging / bookkeeping: accepted quietly.
QUIET_ALG_ARGS = {"verbose", "tensorboard_log", "policy_kwargs", "_init_setup_model"}
QUIET_TRAINING_ARGS = {"logging_steps", "save_total_limit", "output_dir", "report_to", "save_strategy"}


class _Converter:
    def __init__(self, data: dict[str, Any], model_map: dict[str, str]):
        self.src = data
        self.model_map = model_map
        self.unhonoured: list[str] = []
        self.out: dict[str, Any] = {}

    # -- helpers -------------------------------------------------------------------------------
    def note(self, key: str, why: str) -> None:
        self.unhonoured.append(f"{key}: {why}")

    def map_name(self, name: Any) -> Any:
        if isinstance(name, str) and name in self.model_map:
            return self.model_map[name]
        return name

    def section(self, name: str) -> dict[str, Any]:
        return self.out.setdefault(name, {})

    def _sweep(self, value: Any, key: str) -> Any:
        """RL4LMs's ``{expand: True, values: [...]}`` is a hyperparameter sweep: take the first."""
        if isinstance(value, dict) and "values" in value and isinstance(value["values"], list):
            if len(value["values"]) > 1:
                self.note(
                    key, f"hyperparameter sweep over {len(value['values'])} values; only the first is used"
                )
            return value["values"][0] if value["values"] else None
        return value

    def _component_args(
        self, registry_name: str, our_id: str, args: dict[str, Any] | None, where: str
    ) -> dict[str, Any]:
        """Rename arguments, map model names, and drop those the registered factory cannot take."""
        args = dict(args or {})
        out: dict[str, Any] = {}
        kind = f"{registry_name}:{our_id}"
        renames = ARG_RENAMES.get(kind, {})
        ignored = IGNORED_ARGS.get(kind, set())
        changed = CHANGED_ARGS.get(kind, {})
        accepted = _accepted_args(registry_name, our_id)
        for key, value in args.items():
            if key in ignored:
                continue
            if key in changed:
                self.note(f"{where}.args.{key}", changed[key])
                continue
            new_key = renames.get(key, key)
            if "model" in new_key or "tokenizer" in new_key:
                value = self.map_name(value)
            if accepted is not None and new_key not in accepted and key in accepted:
                new_key = key
            if accepted is not None and new_key not in accepted:
                self.note(
                    f"{where}.args.{key}", f"{registry_name} {our_id!r} takes no such argument; dropped"
                )
                continue
            out[new_key] = value
        return out

    # -- sections ------------------------------------------------------------------------------
    def convert(self) -> tuple[dict[str, Any], list[str]]:
        src = self.src
        known = {"tokenizer", "reward_fn", "datapool", "env", "alg", "train_evaluation", "model_map"}
        for key in src:
            if key not in known:
                self.note(key, "unknown top-level RL4LMs section; ignored")
        alg = src.get("alg") or {}
        if not isinstance(alg, dict):
            raise ConfigError("RL4LMs config: 'alg' must be a mapping", [("alg", "expected a mapping")])
        alg_id = alg.get("id")
        if alg_id not in ALGORITHM_IDS:
            if alg_id in algorithms:
                our_alg = alg_id
            else:
                raise ConfigError(
                    f"RL4LMs config: alg.id {alg_id!r} is not supported; supported: "
                    f"{', '.join(sorted(ALGORITHM_IDS))}",
                    [("alg.id", f"unsupported algorithm {alg_id!r}")],
                )
        else:
            our_alg = ALGORITHM_IDS[alg_id]
        self.supervised = our_alg == "sft"

        model_name = self._policy_model_name(alg)
        self._model(alg, model_name)
        self._tokenizer(src.get("tokenizer") or {}, model_name)
        self._datapool(src.get("datapool") or {})
        if self.supervised:
            self._supervised(alg)
            if "reward_fn" in src:
                self._reward(src["reward_fn"])
            if "env" in src:
                self.note("env", "supervised runs have no environment; ignored")
        else:
            self._reward(src.get("reward_fn"))
            episode = self._env(src.get("env") or {}, alg)
            self._alg(alg, our_alg, episode)
        self._train_evaluation(src.get("train_evaluation") or {})
        self.out["name"] = _run_name(src, alg_id)
        for msg in self.unhonoured:
            log.warning("RL4LMs import: not honoured: %s", msg)
        return self.out, self.unhonoured

    def _policy_model_name(self, alg: dict[str, Any]) -> str | None:
        if self.supervised:
            return alg.get("model_name")
        policy = alg.get("policy") or {}
        return (policy.get("args") or {}).get("model_name")

    def _model(self, alg: dict[str, Any], model_name: str | None) -> None:
        model = self.section("model")
        if model_name:
            model["name_or_path"] = self.map_name(model_name)
        else:
            self.note("alg.policy.args.model_name", "missing; the default model is used")
        if self.supervised:
            mtype = alg.get("model_type")
            if mtype in ("causal", "seq2seq"):
                model["type"] = mtype
            elif mtype is not None:
                self.note("alg.model_type", f"unknown model type {mtype!r}; detected automatically")
        else:
            pid = str((alg.get("policy") or {}).get("id", ""))
            if "seq2seq" in pid:
                model["type"] = "seq2seq"
            elif "causal" in pid:
                model["type"] = "causal"
            elif pid:
                self.note("alg.policy.id", f"unknown policy {pid!r}; model type detected automatically")

    def _tokenizer(self, tok: dict[str, Any], model_name: str | None) -> None:
        out = self.section("tokenizer")
        for key, value in tok.items():
            if key == "model_name":
                mapped_model = model_name is not None and model_name in self.model_map
                if value == model_name or (mapped_model and value not in self.model_map):
                    # Same tokenizer as the model (or the model was mapped to a local copy that
                    # carries its own tokenizer): follow the model.
                    out["name_or_path"] = None
                else:
                    out["name_or_path"] = self.map_name(value)
            elif key in ("padding_side", "truncation_side", "pad_token_as_eos_token"):
                out[key] = value
            elif key == "max_length":
                out["max_prompt_length"] = int(value)
            else:
                self.note(f"tokenizer.{key}", "unknown tokenizer option; ignored")

    def _datapool(self, pool: dict[str, Any]) -> None:
        pid = pool.get("id")
        if pid is None:
            raise ConfigError("RL4LMs config: datapool.id is missing", [("datapool.id", "missing")])
        our = TASK_IDS.get(pid, pid)
        task: dict[str, Any] = {"id": our}
        args = dict(pool.get("args") or {})
        if "seed" in args:
            task["seed"] = int(args.pop("seed"))
        task["args"] = self._component_args("task", our, args, "datapool")
        if pid in TASK_IDS and pid != "dummy_pool" and not ({"path", "train_path", "hub"} & set(args)):
            # RL4LMs's pools read the hub; to use local files instead:
            # --set task.args.hub=false [--set task.args.path=DIR] (without a path: the shipped fixture).
            task["args"]["hub"] = True
        self.out["task"] = task

    def _reward(self, rf: Any) -> None:
        if rf is None:
            self.note("reward_fn", "missing; the default reward is used")
            return
        if isinstance(rf, dict) and "values" in rf and "id" not in rf:
            values = rf.get("values") or []
            if len(values) > 1:
                self.note(
                    "reward_fn.values", f"reward sweep over {len(values)} rewards; only the first is used"
                )
            rf = values[0] if values else {}
        rid = rf.get("id")
        our = REWARD_IDS.get(rid, rid)
        args = dict(rf.get("args") or {})
        reward: dict[str, Any] = {"id": our}
        if rid == "spider":
            spice = float(args.pop("spice_coeff", 0.0) or 0.0)
            args.pop("cider_coeff", None)
            if spice:
                self.note("reward_fn.args.spice_coeff", "SPICE is not available; the reward uses CIDEr only")
            if args.pop("shaping_fn", None):
                self.note("reward_fn.args.shaping_fn", "shaping is not applied to the CIDEr reward")
        reward["args"] = self._component_args("reward", our, args, "reward_fn")
        self.out["reward"] = reward

    def _env(self, env: dict[str, Any], alg: dict[str, Any]) -> int:
        args = env.get("args") or {}
        tok = self.section("tokenizer")
        rollout = self.section("rollout")
        episode = int(args.get("max_episode_length", 20))
        for key, value in args.items():
            if key == "max_prompt_length":
                tok["max_prompt_length"] = int(value)
            elif key == "max_episode_length":
                rollout["max_new_tokens"] = int(value)
            elif key == "terminate_on_eos":
                if not value:
                    self.note("env.args.terminate_on_eos", "episodes always end at EOS here")
            elif key == "prompt_truncation_side":
                tok["truncation_side"] = value
            elif key == "context_start_token":
                if int(value) != 0:
                    self.note(
                        "env.args.context_start_token",
                        "the decoder starts from the model's decoder_start_token_id",
                    )
            else:
                self.note(f"env.args.{key}", "unknown env option; ignored")
        n_envs = int(env.get("n_envs", 1))
        n_steps = int((alg.get("args") or {}).get("n_steps", episode))
        per_env = max(1, math.ceil(n_steps / max(1, episode)))
        self.section("train")["prompts_per_iter"] = n_envs * per_env
        self.note(
            "env.n_envs",
            f"no parallel environments here; RL4LMs's n_envs x n_steps transitions become "
            f"n_envs x ceil(n_steps / max_episode_length) = {n_envs * per_env} episodes per iteration",
        )
        for key in env:
            if key not in ("n_envs", "args"):
                self.note(f"env.{key}", "unknown env option; ignored")
        return episode

    def _generation(self, kwargs: dict[str, Any], where: str, default_new: int | None) -> dict[str, Any]:
        gen: dict[str, Any] = {}
        min_len = None
        for key, value in (kwargs or {}).items():
            if key in ("do_sample", "temperature", "top_k", "top_p", "num_beams", "max_new_tokens"):
                gen[key] = value
            elif key == "min_length":
                # RL4LMs counts min_length in generated tokens for both model families.
                min_len = int(value)
            elif key == "min_new_tokens":
                min_len = int(value)
            elif key == "max_length":
                gen.setdefault("max_new_tokens", int(value))
                self.note(f"{where}.max_length", "read as max_new_tokens (generated tokens only)")
            elif key == "post_processing_fn":
                if value is not None:
                    self.note(f"{where}.post_processing_fn", "post-processing functions are not supported")
            else:
                self.note(f"{where}.{key}", "generation option not supported; ignored")
        if "max_new_tokens" not in gen and default_new:
            gen["max_new_tokens"] = default_new
        if min_len is not None:
            cap = gen.get("max_new_tokens", default_new or 20)
            gen["min_new_tokens"] = min(min_len, cap)
        if gen.get("do_sample") and gen.get("top_k") is None:
            # RL4LMs samples through HF generate, whose default top_k is 50 (GPT-2 and most configs);
            # top_k: null there also means that default. Our own default is 0 (off), so say it here.
            gen["top_k"] = HF_DEFAULT_TOP_K
        if gen.get("top_k") is None:
            gen.pop("top_k", None)
        temperature = gen.get("temperature")
        if temperature is not None and float(temperature) != 1.0:
            self.note(
                f"{where}.temperature",
                "the KL penalty compares policy and reference at the sampling temperature "
                "(RL4LMs: at temperature 1)",
            )
        return gen

    def _alg(self, alg: dict[str, Any], our_alg: str, episode: int) -> None:
        """RL4LMs's ``alg`` section: its ``args``, ``kl_div`` and ``policy`` parts, in that order."""
        algo = self.section("algorithm")
        algo["id"] = our_alg
        algo["clip_range_value"] = None  # SB3/RL4LMs default clip_range_vf: no value clipping
        self._alg_args(dict(alg.get("args") or {}), our_alg, episode)
        self._kl_div(alg.get("kl_div") or {})
        self._alg_policy(alg.get("policy") or {}, our_alg, episode)
        for key in alg:
            if key not in ("id", "args", "kl_div", "policy"):
                self.note(f"alg.{key}", "unknown algorithm section; ignored")

    def _alg_args(self, args: dict[str, Any], our_alg: str, episode: int) -> None:
        """``alg.args``: SB3's constructor arguments, mapped onto ``algorithm`` (and a few other sections)."""
        algo = self.section("algorithm")
        train = self.section("train")
        for key, raw in args.items():
            value = self._sweep(raw, f"alg.args.{key}")
            if key in QUIET_ALG_ARGS or key == "n_steps":
                continue
            if key in NOT_APPLICABLE_ARGS.get(our_alg, ()):
                self.note(f"alg.args.{key}", f"RL4LMs's {our_alg} takes no such argument; ignored")
            elif our_alg == "trpo" and key in TRPO_ARGS:
                # target_kl here is TRPO's trust region, not PPO's early stop
                algo.setdefault("trpo", {})[key] = TRPO_ARGS[key](value)
            elif our_alg == "a2c" and key == "rms_prop_eps":
                algo.setdefault("a2c", {})["rms_prop_eps"] = float(value)
            elif our_alg == "a2c" and key == "use_rms_prop":
                algo.setdefault("a2c", {})["optimizer"] = "rmsprop" if value else "adamw"
            elif key in ("use_sde", "sde_sample_freq") and our_alg in ("a2c", "trpo"):
                if value not in (False, -1, None):
                    self.note(
                        f"alg.args.{key}", "state-dependent exploration is for continuous actions; ignored"
                    )
            elif key == "batch_size":
                # RL4LMs minibatches count token transitions; ours count episodes.
                algo["minibatch_size"] = max(1, math.ceil(int(value) / max(1, episode)))
                self.note(
                    "alg.args.batch_size",
                    f"{value} transitions per minibatch become {algo['minibatch_size']} episode(s) "
                    f"of up to {episode} tokens",
                )
            elif key == "learning_rate":
                algo["learning_rate"] = float(value)
            elif key == "n_epochs":
                algo["n_epochs"] = int(value)
            elif key in ("ent_coef", "vf_coef", "gamma", "gae_lambda", "clip_range", "max_grad_norm"):
                algo[key] = float(value)
            elif key == "clip_range_vf":
                algo["clip_range_value"] = None if value is None else float(value)
            elif key == "target_kl":
                algo["target_kl"] = None if value is None else float(value)
            elif key == "normalize_advantage":
                algo["whiten_advantages"] = bool(value)
            elif key == "seed":
                train["seed"] = int(value)
            elif key == "device":
                self.section("model")["device"] = str(value)
            else:
                self.note(f"alg.args.{key}", "unknown algorithm option; ignored")
        for key, value in ALGORITHM_DEFAULTS.get(our_alg, {}).items():
            algo.setdefault(key, value)
        if our_alg == "trpo" and "minibatch_size" not in algo:
            algo["minibatch_size"] = max(1, math.ceil(TRPO_BATCH_SIZE / max(1, episode)))

    def _kl_div(self, kl_div: dict[str, Any]) -> None:
        """``alg.kl_div``: the KL coefficient, adaptive when it has a target."""
        kl = self.section("kl")
        if "coeff" in kl_div:
            kl["init_coef"] = float(kl_div["coeff"])
        if kl_div.get("target_kl") is not None:
            kl["controller"] = "adaptive"
            kl["target"] = float(kl_div["target_kl"])
        else:
            kl["controller"] = "fixed"
            kl["target"] = None
        for key in kl_div:
            if key not in ("coeff", "target_kl"):
                self.note(f"alg.kl_div.{key}", "unknown KL option; ignored")

    def _alg_policy(self, policy: dict[str, Any], our_alg: str, episode: int) -> None:
        """``alg.policy.args``: generation settings, NLPO's mask and the optimizer's options."""
        algo = self.section("algorithm")
        pargs = dict(policy.get("args") or {})
        nlpo: dict[str, Any] = {}
        for key, value in pargs.items():
            if key == "model_name":
                continue
            if key == "generation_kwargs":
                self.section("rollout").update(
                    self._generation(value, "alg.policy.args.generation_kwargs", episode)
                )
            elif key == "apply_model_parallel":
                if value:
                    self.note(
                        "alg.policy.args.apply_model_parallel",
                        "naive model parallelism is not implemented; the model runs on one device "
                        "(use model.device, or accelerate for multi-GPU)",
                    )
            elif key == "prompt_truncation_side":
                self.section("tokenizer")["truncation_side"] = value
            elif key == "top_mask":
                nlpo["top_mask"] = float(value)
            elif key == "min_tokens_to_keep":
                nlpo["min_tokens_to_keep"] = int(value)
            elif key == "target_update_iterations":
                nlpo["mask_update_interval"] = int(value)
            elif key == "mask_type":
                if value != "learned_top_p":
                    self.note(
                        "alg.policy.args.mask_type", f"only 'learned_top_p' masking exists, not {value!r}"
                    )
            elif key == "optimizer_kwargs":
                for okey, ovalue in (value or {}).items():
                    if okey == "weight_decay":
                        algo["weight_decay"] = float(ovalue)
                    elif okey == "lr":
                        algo["learning_rate"] = float(ovalue)
                    else:
                        self.note(f"alg.policy.args.optimizer_kwargs.{okey}", "optimizer option ignored")
            elif key == "weight_decay":
                algo["weight_decay"] = float(value)
            else:
                self.note(f"alg.policy.args.{key}", "unknown policy option; ignored")
        if nlpo:
            if our_alg == "nlpo":
                algo["nlpo"] = nlpo
            else:
                self.note("alg.policy.args", f"NLPO options {sorted(nlpo)} given for {our_alg!r}; ignored")

    def _supervised(self, alg: dict[str, Any]) -> None:
        self.section("algorithm")["id"] = "sft"
        sup = self.section("supervised")
        sup["enabled"] = True
        train = self.section("train")
        train["n_iters"] = 0
        for key, raw in (alg.get("training_args") or {}).items():
            value = self._sweep(raw, f"alg.training_args.{key}")
            if key in QUIET_TRAINING_ARGS:
                continue
            if key in ("per_device_train_batch_size", "train_batch_size"):
                sup["batch_size"] = int(value)
            elif key == "num_train_epochs":
                sup["epochs"] = float(value)
            elif key == "learning_rate":
                sup["learning_rate"] = float(value)
            elif key == "max_steps":
                if int(value) > 0:
                    sup["max_steps"] = int(value)
            elif key == "seed":
                train["seed"] = int(value)
            elif key == "lr_scheduler_type":
                if value not in ("constant", None):
                    self.note(
                        "alg.training_args.lr_scheduler_type", f"{value!r} schedule not supported; constant"
                    )
            else:
                self.note(f"alg.training_args.{key}", "trainer option not supported; ignored")
        gen = alg.get("generation_kwargs")
        if gen:
            new = (gen or {}).get("max_new_tokens")
            self.section("eval")["generation"] = self._generation(gen, "alg.generation_kwargs", new)
            if "max_new_tokens" in self.out["eval"]["generation"]:
                sup["max_target_length"] = int(self.out["eval"]["generation"]["max_new_tokens"])
        for key in alg:
            if key not in ("id", "training_args", "model_type", "model_name", "generation_kwargs"):
                self.note(f"alg.{key}", "unknown supervised option; ignored")

    def _train_evaluation(self, te: dict[str, Any]) -> None:
        train = self.section("train")
        ev = self.section("eval")
        for key, value in te.items():
            if key == "n_iters":
                if not self.supervised:
                    train["n_iters"] = int(value)
            elif key == "eval_every":
                train["eval_every"] = int(value)
            elif key == "save_every":
                train["save_every"] = int(value)
            elif key == "eval_batch_size":
                ev.setdefault("generation", {})["batch_size"] = int(value)
            elif key == "metrics":
                ev["metrics"] = self._metrics(value or [])
            elif key == "generation_kwargs":
                rollout = self.out.get("rollout", {})
                gen = self._generation(
                    value, "train_evaluation.generation_kwargs", rollout.get("max_new_tokens")
                )
                gen.setdefault("do_sample", False)
                ev.setdefault("generation", {}).update(gen)
            else:
                self.note(f"train_evaluation.{key}", "unknown evaluation option; ignored")
        gen = ev.setdefault("generation", {})
        if "generation_kwargs" not in te and not self.supervised:
            # RL4LMs evaluates with the policy's generation kwargs when none are given.
            for key, value in self.out.get("rollout", {}).items():
                if key != "batch_size":
                    gen.setdefault(key, value)
        if self.supervised and "max_new_tokens" not in gen:
            gen["max_new_tokens"] = self.out.get("supervised", {}).get("max_target_length", 20)

    def _metrics(self, metrics: list[Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for i, m in enumerate(metrics):
            if not isinstance(m, dict) or "id" not in m:
                self.note(f"train_evaluation.metrics[{i}]", "expected a mapping with an id; ignored")
                continue
            mid = m["id"]
            if mid in UNAVAILABLE_METRICS:
                self.note(f"train_evaluation.metrics[{i}] ({mid})", UNAVAILABLE_METRICS[mid])
                continue
            our = METRIC_IDS.get(mid, mid)
            reward = self.out.get("reward") or {}
            if not _registered("metric", our) and reward.get("id") == our:
                self.note(
                    f"train_evaluation.metrics[{i}] ({mid})",
                    "no metric of that id; it is the training reward, reported as eval/reward_mean",
                )
                continue
            args = self._component_args("metric", our, m.get("args") or {}, f"train_evaluation.metrics[{i}]")
            if mid == "learned_reward":
                args = {"variant": "learned", **args}
            key = json.dumps([our, args], sort_keys=True, default=str)
            if key in seen:  # RL4LMs's IWSLT configs list bleu twice
                continue
            seen.add(key)
            out.append({"id": our, "args": args})
        return out


def _registered(registry_name: str, our_id: str) -> bool:

    reg = {"task": registry.tasks, "reward": registry.rewards, "metric": registry.metrics}[registry_name]
    return our_id in reg


def _accepted_args(registry_name: str, our_id: str) -> set[str] | None:
    """Parameter names of a registered factory; None when unknown or it takes ``**kwargs``."""

    reg = {"task": registry.tasks, "reward": registry.rewards, "metric": registry.metrics}[registry_name]
    try:
        factory = reg.get(our_id)
    except Exception:  # not registered (yet): keep the arguments, the run will name the id
        return None
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    names = set()
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            names.add(p.name)
    names.discard("self")
    return names


def _run_name(src: dict[str, Any], alg_id: Any) -> str:
    pool = (src.get("datapool") or {}).get("id", "task")
    return f"rl4lms-{pool}-{alg_id}"


def model_map_from_env() -> dict[str, str]:
    """Read ``GRUE_MODEL_MAP``: ``name=path,...`` or a YAML/JSON file of ``{name: path}``."""
    raw = os.environ.get(MODEL_MAP_ENV, "").strip()
    if not raw:
        return {}
    p = Path(raw).expanduser()
    if "=" not in raw and p.exists():
        try:
            data = yamlio.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{MODEL_MAP_ENV}={raw}: bad YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{MODEL_MAP_ENV}={raw}: expected a mapping of hub name to local path")
        return {str(k): str(v) for k, v in data.items()}
    out: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise ConfigError(
                f"{MODEL_MAP_ENV}: {item!r} is neither name=path nor an existing file "
                "(example: GRUE_MODEL_MAP='gpt2=/models/gpt2,t5-base=builtin:tiny-t5')"
            )
        name, path = item.split("=", 1)
        out[name.strip()] = path.strip()
    return out


def convert_rl4lms(
    data: dict[str, Any], model_map: dict[str, str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Translate an RL4LMs task config into a RunConfig dict and the list of keys not honoured.

    The result is a plain dict (validate it with ``engine.config.parse_config``) so that
    ``--set`` overrides can still be applied on top.
    """
    if not isinstance(data, dict):
        raise ConfigError("RL4LMs config: expected a mapping at the top level")
    mapping = model_map_from_env()
    file_map = data.get("model_map") or {}
    if not isinstance(file_map, dict):
        raise ConfigError(
            "RL4LMs config: model_map must map hub names to local paths", [("model_map", "not a mapping")]
        )
    mapping.update({str(k): str(v) for k, v in file_map.items()})
    mapping.update(model_map or {})
    return _Converter(copy.deepcopy(data), mapping).convert()
