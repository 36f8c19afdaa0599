"""RL4LMs task-config import: the four verbatim RL4LMs configs convert, validate and say what they drop."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from engine.config import ConfigError, parse_config
from engine.config_files import load_config
from engine.registry import metrics, rewards, tasks
from engine.rl4lms import MODEL_MAP_ENV, convert_rl4lms

FIXTURES = Path(__file__).parent / "fixtures" / "rl4lms"
CONFIGS = sorted(FIXTURES.glob("*.yml"))


def _load(name: str) -> dict:
    return yaml.safe_load((FIXTURES / name).read_text())


@pytest.fixture(autouse=True)
def _no_env_map(monkeypatch):
    monkeypatch.delenv(MODEL_MAP_ENV, raising=False)


def test_fixture_configs_present():
    assert len(CONFIGS) == 4
    assert (FIXTURES / "PROVENANCE.md").exists()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_fixture_converts_and_validates(path):
    data, unhonoured = convert_rl4lms(yaml.safe_load(path.read_text()))
    cfg = parse_config(data, source=str(path))
    # Every id the import produced is one we registered.
    assert cfg.task.id in tasks
    if cfg.algorithm.id != "sft":
        assert cfg.reward.id in rewards
    for m in cfg.eval.metrics:
        assert m.id in metrics, m.id
    assert all(isinstance(u, str) and ":" in u for u in unhonoured)


def test_imdb_ppo_mapping_values(caplog):
    caplog.set_level(logging.WARNING, logger="engine.rl4lms")
    data, unhonoured = convert_rl4lms(_load("imdb_text_continuation_gpt2_ppo.yml"))
    cfg = parse_config(data)
    assert cfg.model.name_or_path == "lvwerra/gpt2-imdb"
    assert cfg.model.type == "causal"
    assert cfg.tokenizer.name_or_path is None  # same as the model
    assert cfg.tokenizer.max_prompt_length == 64
    assert cfg.task.id == "imdb" and cfg.task.seed == 42 and cfg.task.args["hub"] is True
    assert cfg.reward.id == "learned_reward"
    assert cfg.reward.args == {
        "model_name": "lvwerra/distilbert-imdb",
        "label_ix": 1,
        "include_prompt_for_eval": True,
    }
    assert cfg.rollout.max_new_tokens == 48 and cfg.rollout.min_new_tokens == 48 and cfg.rollout.do_sample
    assert cfg.algorithm.id == "ppo"
    assert cfg.algorithm.learning_rate == pytest.approx(1e-6)
    assert cfg.algorithm.n_epochs == 5
    # 64 transitions of 48-token episodes -> 2 episodes; 10 envs x ceil(128/48) = 30 episodes.
    assert cfg.algorithm.minibatch_size == 2
    assert cfg.train.prompts_per_iter == 30
    assert cfg.kl.controller == "adaptive" and cfg.kl.init_coef == 0.1 and cfg.kl.target == 0.1
    assert (cfg.train.n_iters, cfg.train.eval_every, cfg.train.save_every) == (50, 10, 10)
    assert cfg.eval.generation.batch_size == 64
    # No eval generation_kwargs in the file: RL4LMs evaluates with the policy's kwargs.
    assert cfg.eval.generation.do_sample and cfg.eval.generation.max_new_tokens == 48
    assert [m.id for m in cfg.eval.metrics] == ["sentiment", "perplexity", "diversity"]
    assert cfg.eval.metrics[0].args == {
        "variant": "learned",
        "model_path": "lvwerra/distilbert-imdb",
        "label_index": 1,
    }
    ppl = cfg.eval.metrics[1]
    # RL4LMs's perplexity: the policy on the references, with RL4LMs's stride; its separate tokenizer
    # (tokenizer_id: gpt2) is replaced by the policy's own, and that is listed.
    assert ppl.args == {"stride": 512}
    # RL4LMs samples with HF generate's default top_k (50) when its kwargs set none (rollout and eval).
    assert cfg.rollout.top_k == 50 and cfg.eval.generation.top_k == 50
    # SB3/RL4LMs: no value clipping unless clip_range_vf is set.
    assert cfg.algorithm.clip_range_value is None
    keys = " ".join(unhonoured)
    assert "train_evaluation.metrics[1].args.tokenizer_id" in keys
    assert "alg.policy.args.apply_model_parallel" in keys
    assert "env.n_envs" in keys
    assert "alg.args.batch_size" in keys
    # Also logged, one warning per key.
    logged = [r.getMessage() for r in caplog.records if r.name == "engine.rl4lms"]
    assert len(logged) == len(unhonoured)
    assert any("apply_model_parallel" in m for m in logged)


def test_nlpo_options():
    data, _ = convert_rl4lms(_load("imdb_text_continuation_gpt2_nlpo.yml"))
    cfg = parse_config(data)
    assert cfg.algorithm.id == "nlpo"
    assert cfg.algorithm.nlpo.top_mask == 0.9
    assert cfg.algorithm.nlpo.min_tokens_to_keep == 100
    assert cfg.algorithm.nlpo.mask_update_interval == 5
    assert cfg.algorithm.nlpo.masked_eval  # RL4LMs evaluates NLPO through its masked generation
    assert cfg.kl.controller == "adaptive"  # RL4LMs's per-token controller, not Ziegler's


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"do_sample": True}, 50),  # RL4LMs: HF generate's default
        ({"do_sample": True, "top_k": None}, 50),  # null also means HF's default there
        ({"do_sample": True, "top_k": 0}, 0),  # explicitly off stays off
        ({"do_sample": True, "top_k": 20}, 20),
        ({"do_sample": False}, 0),  # greedy: no top-k
    ],
)
def test_generation_top_k_follows_hf_generate_defaults(kwargs, expected):
    raw = _load("imdb_text_continuation_gpt2_ppo.yml")
    raw["alg"]["policy"]["args"]["generation_kwargs"] = {"max_new_tokens": 8, **kwargs}
    raw["alg"]["args"]["clip_range_vf"] = 0.3
    data, _ = convert_rl4lms(raw)
    cfg = parse_config(data)
    assert cfg.rollout.top_k == expected
    assert cfg.algorithm.clip_range_value == pytest.approx(0.3)  # a given value is kept


def test_supervised_config():
    data, unhonoured = convert_rl4lms(_load("imdb_text_continuation_gpt2_supervised.yml"))
    cfg = parse_config(data)
    assert cfg.algorithm.id == "sft" and cfg.supervised.enabled and cfg.train.n_iters == 0
    assert cfg.task.id == "imdb_seq2seq" and cfg.task.args["positive_ratio"] == 1.0
    assert cfg.supervised.batch_size == 16 and cfg.supervised.epochs == 10
    assert cfg.supervised.learning_rate == pytest.approx(1e-5)
    assert cfg.tokenizer.name_or_path == "gpt2"  # differs from the model in the file
    assert cfg.eval.generation.batch_size == 256 and cfg.eval.generation.max_new_tokens == 48
    # use_text_from_meta_data scored the references in RL4LMs: we score generations, and say so.
    assert any("use_text_from_meta_data" in u for u in unhonoured)


def test_synthetic_config():
    data, _ = convert_rl4lms(_load("synthetic_generate_increasing_numbers_gpt2_ppo.yml"))
    cfg = parse_config(data)
    assert cfg.task.id == "synthetic_increasing_numbers"
    assert cfg.reward.id == "increasing_numbers" and cfg.reward.args == {"min_tokens": 20}
    assert cfg.algorithm.ent_coef == pytest.approx(0.001)
    assert cfg.kl.init_coef == 0.02 and cfg.kl.target == 2.0
    assert cfg.eval.metrics == []  # the reward is the metric: eval/reward_mean


def test_model_map_argument_env_and_file(monkeypatch, tmp_path):
    src = _load("imdb_text_continuation_gpt2_ppo.yml")
    data, _ = convert_rl4lms(src, model_map={"lvwerra/gpt2-imdb": "builtin:tiny-gpt2"})
    assert data["model"]["name_or_path"] == "builtin:tiny-gpt2"
    # The mapped model carries its own tokenizer.
    assert data["tokenizer"]["name_or_path"] is None

    monkeypatch.setenv(MODEL_MAP_ENV, "lvwerra/gpt2-imdb=/models/a, lvwerra/distilbert-imdb=/models/clf")
    data, _ = convert_rl4lms(src)
    assert data["model"]["name_or_path"] == "/models/a"
    assert data["reward"]["args"]["model_name"] == "/models/clf"
    assert data["eval"]["metrics"][0]["args"]["model_path"] == "/models/clf"

    f = tmp_path / "map.yaml"
    f.write_text("lvwerra/distilbert-imdb: /models/file-clf\n")
    monkeypatch.setenv(MODEL_MAP_ENV, str(f))
    data, _ = convert_rl4lms(src)
    assert data["eval"]["metrics"][0]["args"]["model_path"] == "/models/file-clf"

    # A model_map inside the RL4LMs file wins over the environment.
    data, _ = convert_rl4lms({**src, "model_map": {"lvwerra/distilbert-imdb": "/elsewhere"}})
    assert data["eval"]["metrics"][0]["args"]["model_path"] == "/elsewhere"
    assert data["reward"]["args"]["model_name"] == "/elsewhere"

    monkeypatch.setenv(MODEL_MAP_ENV, "no-equals-sign-and-no-file")
    with pytest.raises(ConfigError, match=MODEL_MAP_ENV):
        convert_rl4lms(src)


def test_load_config_detects_rl4lms_and_applies_overrides():
    path = FIXTURES / "synthetic_generate_increasing_numbers_gpt2_ppo.yml"
    cfg = load_config(path, ["model.name_or_path=builtin:tiny-gpt2", "train.n_iters=2"])
    assert cfg.model.name_or_path == "builtin:tiny-gpt2"
    assert cfg.train.n_iters == 2
    assert cfg.reward.id == "increasing_numbers"


def test_unsupported_algorithm_names_the_key():
    src = _load("imdb_text_continuation_gpt2_ppo.yml")
    src["alg"]["id"] = "reinforce_plus_plus"  # not an algorithm of RL4LMs nor a registered one
    with pytest.raises(ConfigError) as exc:
        convert_rl4lms(src)
    assert "alg.id" in str(exc.value) and "reinforce_plus_plus" in str(exc.value)
    assert exc.value.errors[0][0] == "alg.id"


def test_other_task_formats_seq2seq_sweeps_and_unavailable_metrics():
    """Shapes used by RL4LMs's CommonGen, dialogue and NarrativeQA configs (written here, not copied)."""
    src = {
        "tokenizer": {
            "model_name": "t5-base",
            "padding_side": "left",
            "truncation_side": "left",
            "pad_token_as_eos_token": False,
        },
        "reward_fn": {"id": "meteor", "args": {"shaping_fn": "common_gen_repeat_penalty"}},
        "datapool": {
            "id": "commongen",
            "args": {
                "concept_end_token": ".",
                "concept_separator_token": " ",
                "prefix": "generate a sentence with: ",
            },
        },
        "env": {
            "n_envs": 10,
            "args": {
                "max_prompt_length": 20,
                "max_episode_length": 20,
                "terminate_on_eos": True,
                "context_start_token": 0,
                "prompt_truncation_side": "right",
            },
        },
        "alg": {
            "id": "nlpo",
            "args": {
                "n_steps": 256,
                "batch_size": 64,
                "learning_rate": 2e-6,
                "n_epochs": 5,
                "ent_coef": {"expand": True, "values": [0.01, 0.0]},
            },
            "kl_div": {"coeff": 0.001, "target_kl": 2.0},
            "policy": {
                "id": "maskable_seq2seq_lm_actor_critic_policy",
                "args": {
                    "model_name": "t5-base",
                    "apply_model_parallel": True,
                    "top_mask": 0.9,
                    "mask_type": "learned_top_p",
                    "target_update_iterations": 20,
                    "generation_kwargs": {
                        "do_sample": True,
                        "top_k": 50,
                        "min_length": 5,
                        "max_new_tokens": 20,
                    },
                },
            },
        },
        "train_evaluation": {
            "eval_batch_size": 20,
            "n_iters": 200,
            "eval_every": 20,
            "save_every": 1,
            "metrics": [
                {"id": "meteor", "args": {}},
                {"id": "rouge"},
                {"id": "bleu", "args": {}},
                {"id": "bert_score", "args": {"language": "en"}},
                {"id": "cider"},
                {"id": "spice"},
                {"id": "bleu", "args": {}},
                {"id": "diversity", "args": {}},
            ],
            "generation_kwargs": {
                "num_beams": 5,
                "min_length": 5,
                "max_new_tokens": 20,
                "length_penalty": 0.6,
            },
        },
    }
    data, unhonoured = convert_rl4lms(src)
    cfg = parse_config(data)
    assert cfg.model.type == "seq2seq" and cfg.model.name_or_path == "t5-base"
    assert cfg.tokenizer.truncation_side == "right" and cfg.tokenizer.pad_token_as_eos_token is False
    assert cfg.reward.id == "meteor" and cfg.reward.args == {"shaping_fn": "common_gen_repeat_penalty"}
    assert cfg.algorithm.ent_coef == 0.01  # first value of the sweep
    assert cfg.algorithm.nlpo.mask_update_interval == 20
    assert cfg.rollout.top_k == 50 and cfg.rollout.min_new_tokens == 5
    assert cfg.eval.generation.num_beams == 5 and not cfg.eval.generation.do_sample
    assert cfg.eval.generation.batch_size == 20
    ids = [m.id for m in cfg.eval.metrics]
    assert ids == ["meteor", "rouge", "bleu", "bertscore", "cider", "diversity"]  # spice gone, bleu once
    text = "\n".join(unhonoured)
    assert "spice" in text and "SPICE" in text
    assert "alg.args.ent_coef" in text and "sweep" in text
    assert "length_penalty" in text
    assert "language" in text


def test_dialog_reward_sweep_takes_first_and_says_so():
    src = {
        "tokenizer": {"model_name": "gpt2"},
        "reward_fn": {
            "expand": True,
            "values": [
                {"id": "intent_accuracy", "args": {"intent_coeff": 0.5, "auto_coeff": 0.5}},
                {"id": "intent_accuracy", "args": {"intent_coeff": 0.25, "auto_coeff": 0.75}},
            ],
        },
        "datapool": {"id": "daily_dialog", "args": {"context_size": 5}},
        "env": {"n_envs": 10, "args": {"max_prompt_length": 128, "max_episode_length": 20}},
        "alg": {
            "id": "ppo",
            "args": {"n_steps": 128, "batch_size": 64},
            "policy": {"id": "causal_lm_actor_critic_policy", "args": {"model_name": "gpt2"}},
        },
        "train_evaluation": {
            "metrics": [
                {"id": "intent_accuracy"},
                {
                    "id": "causal_perplexity",
                    "args": {"tokenizer_id": "gpt2", "stride": 128, "model_type": "causal"},
                },
            ]
        },
    }
    data, unhonoured = convert_rl4lms(src)
    cfg = parse_config(data)
    assert cfg.reward.id == "intent_accuracy"
    assert cfg.reward.args == {"intent_coeff": 0.5, "auto_coeff": 0.5}
    assert any(u.startswith("reward_fn.values") for u in unhonoured)
    assert cfg.eval.metrics[1].args == {"stride": 128}  # the policy on the references, RL4LMs stride
    assert cfg.kl.controller == "fixed"  # no target_kl given


def test_bad_input_is_a_config_error():
    with pytest.raises(ConfigError, match="datapool.id"):
        convert_rl4lms({"alg": {"id": "ppo"}, "datapool": {}})
    with pytest.raises(ConfigError):
        convert_rl4lms(["not", "a", "mapping"])  # type: ignore[arg-type]
