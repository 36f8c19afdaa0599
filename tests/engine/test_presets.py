"""Presets: the full GRUE grid exists, every preset validates, and every component id is registered."""

from __future__ import annotations

import inspect

import pytest

from engine.config import parse_config
from engine.presets import ALGORITHMS, PresetError, deep_merge, list_presets, load_preset
from engine.registry import metrics, rewards, tasks

PRESETS = list_presets()
NAMES = [p["name"] for p in PRESETS]
GRUE_TASKS = [
    "imdb",
    "commongen",
    "cnn_daily_mail",
    "totto",
    "narrative_qa",
    "iwslt2017en_de",
    "wmt16en_de",
    "daily_dialog",
]


def test_names_unique_and_rows_complete():
    assert len(NAMES) == len(set(NAMES))
    for p in PRESETS:
        assert set(p) == {"name", "task", "algorithm", "variant", "description"}
        assert p["variant"] in ("online", "offline") and p["algorithm"] in ALGORITHMS
        assert p["description"]


@pytest.mark.parametrize("task", GRUE_TASKS)
def test_every_task_has_the_whole_grid_in_both_variants(task):
    have = {(p["algorithm"], p["variant"]) for p in PRESETS if p["task"] == task}
    assert have == {(a, v) for a in ALGORITHMS for v in ("online", "offline")}


def test_quick_start_presets_exist():
    for name in ("synthetic_ppo", "synthetic_nlpo", "synthetic_supervised", "synthetic_zero_shot"):
        assert name in NAMES
    cfg = parse_config(load_preset("synthetic_ppo"))
    assert cfg.model.name_or_path == "builtin:tiny-gpt2"
    assert cfg.train.n_iters > 0 and cfg.algorithm.id == "ppo"


def _accepts(factory, args: dict) -> list[str]:
    sig = inspect.signature(factory)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return []
    return [k for k in args if k not in sig.parameters]


@pytest.mark.parametrize("name", NAMES)
def test_preset_validates_and_uses_registered_components(name):
    cfg = parse_config(load_preset(name), source=f"preset {name}")
    assert cfg.name == name
    assert cfg.task.id in tasks
    assert not _accepts(tasks.get(cfg.task.id), cfg.task.args), cfg.task.args
    if cfg.supervised.task is not None:
        assert cfg.supervised.enabled and cfg.supervised.task.id in tasks
        assert not _accepts(tasks.get(cfg.supervised.task.id), cfg.supervised.task.args)
    assert cfg.reward.id in rewards
    assert not _accepts(rewards.get(cfg.reward.id), cfg.reward.args), cfg.reward.args
    for m in cfg.eval.metrics:
        assert m.id in metrics, m.id
        assert not _accepts(metrics.get(m.id), m.args), (m.id, m.args)
    assert cfg.rollout.min_new_tokens <= cfg.rollout.max_new_tokens


@pytest.mark.parametrize("name", NAMES)
def test_algorithm_semantics(name):
    row = next(p for p in PRESETS if p["name"] == name)
    cfg = parse_config(load_preset(name))
    alg = row["algorithm"]
    if alg == "zero_shot":
        assert cfg.train.n_iters == 0 and not cfg.supervised.enabled
    elif alg == "supervised":
        assert cfg.train.n_iters == 0 and cfg.supervised.enabled and cfg.algorithm.id == "sft"
    else:
        assert cfg.train.n_iters > 0
        assert cfg.algorithm.id == ("nlpo" if alg.endswith("nlpo") else "ppo")
        assert cfg.supervised.enabled == alg.startswith("supervised_")
    if row["variant"] == "online":
        assert not cfg.model.name_or_path.startswith("builtin:") and ".gguf" not in cfg.model.name_or_path
    else:
        assert cfg.model.name_or_path.startswith("builtin:") or cfg.model.name_or_path.endswith(".gguf")
        assert not cfg.task.args.get("hub")


def test_rl4lms_hyperparameters_mirrored():
    imdb = parse_config(load_preset("imdb_ppo"))
    assert imdb.model.name_or_path == "lvwerra/gpt2-imdb"
    assert imdb.algorithm.learning_rate == pytest.approx(1e-6) and imdb.algorithm.n_epochs == 5
    assert (imdb.kl.init_coef, imdb.kl.target) == (0.1, 0.1)
    assert imdb.rollout.max_new_tokens == 48 and imdb.rollout.min_new_tokens == 48
    assert imdb.tokenizer.max_prompt_length == 64 and imdb.train.n_iters == 50
    assert imdb.reward.id == "learned_reward"
    nlpo = parse_config(load_preset("imdb_nlpo"))
    assert nlpo.algorithm.nlpo.top_mask == 0.9 and nlpo.algorithm.nlpo.mask_update_interval == 5
    assert parse_config(load_preset("imdb_supervised_ppo")).kl.target == 0.5
    sup = parse_config(load_preset("imdb_supervised"))
    assert sup.task.id == "imdb_seq2seq" and sup.supervised.epochs == 10 and sup.supervised.batch_size == 16
    # Supervised + RL: SFT on positive reviews (imdb_seq2seq), RL and evaluation on imdb, as RL4LMs.
    for name in ("imdb_supervised_ppo", "imdb_supervised_nlpo"):
        for suffix in ("", "_offline"):
            both = parse_config(load_preset(name + suffix))
            assert both.task.id == "imdb" and "positive_ratio" not in both.task.args
            assert both.supervised.task.id == "imdb_seq2seq"
            assert both.supervised.task.args["positive_ratio"] == 1.0
            assert both.supervised.task.args.get("hub", False) == both.task.args.get("hub", False)
    assert parse_config(load_preset("commongen_supervised_ppo")).supervised.task is None
    cg = parse_config(load_preset("commongen_ppo"))
    assert cg.model.name_or_path == "t5-base" and cg.model.type == "seq2seq"
    assert cg.reward.args == {"shaping_fn": "common_gen_repeat_penalty"}
    assert (cg.kl.init_coef, cg.kl.target, cg.algorithm.ent_coef) == (0.001, 2.0, 0.01)
    assert cg.eval.generation.num_beams == 5
    iwslt = parse_config(load_preset("iwslt2017en_de_nlpo"))
    assert iwslt.algorithm.nlpo.top_mask == 0.5 and iwslt.reward.id == "ter" and iwslt.rollout.top_k == 10
    # Switching reward id replaces the arguments instead of merging them.
    summ = parse_config(load_preset("cnn_daily_mail_nlpo"))
    assert summ.reward.id == "meteor" and summ.reward.args == {}
    assert parse_config(load_preset("cnn_daily_mail_ppo")).reward.args == {"rouge_type": "rouge1"}
    dd = parse_config(load_preset("daily_dialog_nlpo"))
    assert dd.reward.args == {"intent_coeff": 0.75, "auto_coeff": 0.25} and dd.kl.init_coef == 0.2
    wmt = parse_config(load_preset("wmt16en_de_ppo"))
    assert wmt.task.id == "wmt16en_de" and wmt.task.args["prompt_prefix"] == "translate English to German: "


def test_offline_uses_smollm2_gguf_that_exists():
    from pathlib import Path

    cfg = parse_config(load_preset("imdb_ppo_offline"))
    assert Path(cfg.model.name_or_path).is_file() and cfg.model.name_or_path.endswith(".gguf")
    assert cfg.reward.id == "sentiment_vader"


def test_unknown_preset_lists_names():
    with pytest.raises(PresetError, match="synthetic_ppo"):
        load_preset("nope")


def test_deep_merge_rules():
    base = {"a": {"x": 1, "y": [1, 2]}, "reward": {"id": "rouge", "args": {"rouge_type": "rouge1"}}}
    out = deep_merge(base, {"a": {"y": [3]}, "reward": {"id": "meteor", "args": {}}})
    assert out == {"a": {"x": 1, "y": [3]}, "reward": {"id": "meteor", "args": {}}}
    out = deep_merge({"task": {"id": "imdb", "args": {"hub": True}}}, {"task": {"id": "imdb_seq2seq"}})
    assert out["task"] == {"id": "imdb_seq2seq", "args": {"hub": True}}
    assert base["a"]["y"] == [1, 2]  # inputs untouched
