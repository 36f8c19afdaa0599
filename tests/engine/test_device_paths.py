"""The device code paths ``bench/gpu_check.py`` exercises on a GPU, run here on whatever device
``GRUE_TEST_DEVICE`` names (default ``cpu``): placement of policy, critic and reference, autocast in
bf16, the SDPA attention switch, and a short PPO run end to end.

Marked ``gpu``: the GPU check runs exactly these with ``GRUE_TEST_DEVICE=cuda``; in the ordinary suite
they run on the CPU (bf16 autocast there too), so none of them is ever skipped.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

import engine
from engine.data.base import Sample
from engine.models.attention import NAME
from engine.models.builtin import builtin_model_dir
from engine.models.loading import load_lm, load_tokenizer
from engine.models.policy import ActorCritic, EosBan, HeadLogits, token_logprobs
from engine.rollout import SamplingSpec, collect
from tests.engine.conftest import BASE_CONFIG, merge

pytestmark = pytest.mark.gpu
DEVICE = torch.device(os.environ.get("GRUE_TEST_DEVICE", "cpu"))


def _policy(value_head: str) -> tuple[ActorCritic, object]:
    torch.manual_seed(0)
    path = str(builtin_model_dir("builtin:tiny-gpt2"))
    return ActorCritic(load_lm(path, "causal"), False, value_head).to(DEVICE), load_tokenizer(path)


@pytest.mark.parametrize("value_head", ["shared", "separate"])
def test_bf16_update_forward_on_the_device(value_head):
    """The update's forward under bf16 autocast on the device: fused head (HeadLogits), values from the
    value head (shared) or the critic's trunk (separate), all on the device, finite, with gradients."""
    policy, _ = _policy(value_head)
    assert policy.lm.config._attn_implementation == NAME
    # the zero-initialised value head would pass no gradient into the critic (nor would a constant one:
    # a LayerNorm's output sums to zero over its features)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        policy.value_head.linear.weight.copy_(torch.randn(policy.value_head.linear.weight.shape, generator=g))
    batch = {
        "prompt_ids": torch.tensor([[50256, 464, 3807], [15496, 995, 13]], device=DEVICE),
        "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]], device=DEVICE),
        "gen_ids": torch.tensor([[16, 17, 18, 19], [18, 19, 20, 21]], device=DEVICE),
        "gen_mask": torch.ones(2, 4, device=DEVICE),
    }
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        logits, values = policy.forward_tokens(batch, lazy_head=True)
    assert isinstance(logits, HeadLogits) and logits.compute_dtype == torch.bfloat16
    sampled, full, entropy = token_logprobs(logits, batch["gen_ids"], 1.0, EosBan(50256, 2))
    assert sampled.device.type == DEVICE.type and values.device.type == DEVICE.type
    assert bool(torch.isfinite(sampled).all()) and bool((full <= 0).all()) and bool((entropy > 0).all())
    (sampled.sum() + values.float().pow(2).sum()).backward()
    assert policy.lm.get_output_embeddings().weight.grad.abs().sum() > 0
    if value_head == "separate":
        assert policy.critic.get_input_embeddings().weight.grad.abs().sum() > 0


def test_rollout_on_the_device_under_bf16():
    """Generation and scoring on the device under bf16 autocast: exactly ``min_new_tokens`` tokens,
    log-probs and values on the device."""
    policy, tok = _policy("shared")
    samples = [Sample(id=str(i), prompt=p, references=[""]) for i, p in enumerate(["The film", "A long"])]
    spec = SamplingSpec(min_new_tokens=5, max_new_tokens=5, eos_id=tok.eos_token_id)
    batch = collect(
        policy,
        None,
        tok,
        samples,
        spec,
        16,
        2,
        DEVICE,
        torch.Generator().manual_seed(0),
        autocast_dtype=torch.bfloat16,
    )
    assert batch.gen_ids.shape == (2, 5) and batch.gen_ids.device.type == DEVICE.type
    assert bool(batch.gen_mask.bool().all()) and bool(torch.isfinite(batch.logprobs).all())
    assert batch.values.device.type == DEVICE.type


@pytest.mark.parametrize("value_head", ["shared", "separate"])
def test_ppo_runs_end_to_end_on_the_device(tmp_path: Path, value_head: str):
    """Two PPO iterations of the tiny model on the device in bf16, through ``engine.train``: every
    logged loss finite, the policy stepped away from the reference (its weights' relative drift).

    Not the sampled KL: that is a one-sample estimate per token (log π − log π_ref at the sampled
    token) and can be negative after two small steps; on the H200 it was −0.012 for the separate critic."""
    cfg = merge(
        BASE_CONFIG,
        {
            "name": f"device-{value_head}",
            "model": {"device": DEVICE.type, "mixed_precision": "bf16", "value_head": value_head},
            "rollout": {"max_new_tokens": 6, "min_new_tokens": 6, "batch_size": 8},
            "algorithm": {"id": "ppo", "learning_rate": 1e-3, "n_epochs": 2, "minibatch_size": 4},
            "train": {"n_iters": 2, "save_final_model": False, "output_dir": str(tmp_path / "run")},
        },
    )
    engine.train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl" and "loss/total" in r]
    assert len(rl) == 2
    assert all(torch.isfinite(torch.tensor(r["loss/total"])) for r in rl)
    assert all(math.isfinite(r["train/kl"]) for r in rl)
    assert all(r["policy/param_drift"] > 0 for r in rl)


def test_a_run_resumes_on_the_device(tmp_path: Path):
    """A run checkpointed on the device resumes there. The checkpoint's state file is loaded onto the
    run's device, so on CUDA its saved RNG states came back as CUDA tensors, which numpy and torch's
    setters refuse: resuming the over-optimisation run on an H200 failed so before ``_set_rng_state``
    moved them to the host."""
    run = tmp_path / "run"
    cfg = merge(
        BASE_CONFIG,
        {
            "name": "device-resume",
            "model": {"device": DEVICE.type, "mixed_precision": "bf16"},
            "rollout": {"max_new_tokens": 4, "min_new_tokens": 4, "batch_size": 8},
            "algorithm": {"id": "ppo", "learning_rate": 1e-3, "n_epochs": 1, "minibatch_size": 4},
            "train": {"n_iters": 2, "save_every": 1, "save_final_model": False, "output_dir": str(run)},
        },
    )
    engine.train(cfg)
    engine.train(merge(cfg, {"train": {"n_iters": 3}}), resume_from=str(run))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = sorted(r["step"] for r in rows if r.get("phase") == "rl" and "loss/total" in r)
    assert steps == [1, 2, 3]
