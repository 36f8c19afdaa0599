"""Tiny real models (random GPT-2 / T5 with the real GPT-2 tokenizer) for engine-core tests."""

from __future__ import annotations

import os

# The hub is unreachable here: fail fast instead of retrying (set before transformers is imported).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy  # noqa: E402
from typing import Any

import pytest
import torch

import engine.data.synthetic  # noqa: F401  (registers the synthetic task even if engine.data changes)
import engine.rewards.synthetic  # noqa: F401
from engine.models.builtin import builtin_model_dir
from engine.models.loading import load_lm, load_tokenizer
from engine.models.policy import ActorCritic

KINDS = {"causal": "builtin:tiny-gpt2", "seq2seq": "builtin:tiny-t5"}


@pytest.fixture(scope="session")
def tiny_dirs() -> dict[str, str]:
    return {kind: str(builtin_model_dir(name)) for kind, name in KINDS.items()}


@pytest.fixture
def make_policy(tiny_dirs):
    """``make_policy(kind, value_head="shared") -> (policy, tokenizer)`` with fresh tiny weights."""

    def _make(kind: str, value_head: str = "shared") -> tuple[ActorCritic, Any]:
        torch.manual_seed(0)
        lm = load_lm(tiny_dirs[kind], kind)
        tok = load_tokenizer(tiny_dirs[kind])
        return ActorCritic(lm, kind == "seq2seq", value_head), tok

    return _make


BASE_CONFIG: dict[str, Any] = {
    "name": "test",
    "model": {"name_or_path": "builtin:tiny-gpt2"},
    "task": {"id": "synthetic_increasing_numbers", "args": {"n_samples": 16}},
    "reward": {"id": "digit_fraction"},
    "rollout": {"max_new_tokens": 6, "batch_size": 8},
    "algorithm": {"id": "ppo", "learning_rate": 1e-3, "n_epochs": 1, "minibatch_size": 8},
    "train": {"n_iters": 2, "prompts_per_iter": 8, "eval_every": 0, "save_every": 0, "log_samples": 2},
    "eval": {"generation": {"max_new_tokens": 6, "do_sample": False, "batch_size": 8}},
}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def small_config(tmp_path):
    """``small_config(**sections)``: a seconds-long run config writing into tmp_path."""

    def _cfg(**over: Any) -> dict[str, Any]:
        cfg = merge(BASE_CONFIG, over)
        cfg.setdefault("train", {}).setdefault("output_dir", str(tmp_path / "run"))
        return cfg

    return _cfg
