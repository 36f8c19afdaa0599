"""``model.compile``: the blocks compiled for the RL update train the same model as eager blocks (up
to float rounding), the compiled call is on only inside the update, and what cannot be combined with
it is refused by name before anything trains."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import engine
from engine.launch_checks import config_errors
from engine.models.builtin import builtin_model_dir
from engine.models.compiled import BlockCompiler, CompileError, blocks_of, check_compiler, compiled_blocks


def _run(small_config, tmp_path, name, over, compile_):
    over = {**over, "model": {"mixed_precision": "no", **over.get("model", {}), "compile": compile_}}
    # No KL penalty: at the first iteration policy and reference are the same model, so the KL terms
    # are float noise (~1e-6) that whitening would blow up into the advantages, and a rounding
    # difference in the reference's scores would change the update (the scoring pass is compared on
    # its own below).
    over.setdefault("kl", {"controller": "fixed", "init_coef": 0.0})
    cfg = small_config(**{**over, "train": {"n_iters": 1, "output_dir": str(tmp_path / name)}})
    engine.train(cfg)
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    weights = load_file(str(tmp_path / name / "model" / "model.safetensors"))
    return rows, weights


PPO_2_EPOCHS = {"id": "ppo", "learning_rate": 1e-3, "n_epochs": 2, "minibatch_size": 4}


@pytest.mark.parametrize(
    "variant,over,tolerance",
    [
        ("gpt2", {"algorithm": PPO_2_EPOCHS}, 1e-3),
        ("gpt2-separate-critic", {"algorithm": PPO_2_EPOCHS, "model": {"value_head": "separate"}}, 1e-3),
        # GRPO's update runs each prompt once and its completions on the prompt's KV cache
        ("gpt2-grpo", {"algorithm": {"id": "grpo", "learning_rate": 1e-3, "group": {"group_size": 4}}}, 1e-3),
        # T5's blocks carry the relative position bias from block to block. Adam's first step moves a
        # weight by about lr * sign(gradient): where a gradient is ~1e-7 a rounding difference can flip
        # its sign, 2e-3 for that weight, so the measure is over all weights (0.5 % here)
        ("t5", {"algorithm": PPO_2_EPOCHS, "model": {"name_or_path": "builtin:tiny-t5"}}, 0.03),
    ],
)
def test_compiled_update_trains_the_same_model_as_the_eager_one(
    small_config, tmp_path, variant, over, tolerance
):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager_rows, eager_w = _run(small_config, tmp_path, "eager", over, False)
    assert not torch._dynamo.utils.counters["stats"]["unique_graphs"]  # nothing compiled without the flag
    comp_rows, comp_w = _run(small_config, tmp_path, "compiled", over, True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the blocks did run compiled

    def pick(rows, key):
        return [r[key] for r in rows if key in r]

    # the rollout precedes the update: the same episodes and rewards exactly
    assert pick(comp_rows, "train/reward_mean") == pick(eager_rows, "train/reward_mean")
    # the update's losses equal up to float rounding (fused kernels sum in another order)
    for key in ("loss/total",):
        assert len(pick(eager_rows, key)) == 1, key
        assert pick(comp_rows, key) == pytest.approx(pick(eager_rows, key), rel=1e-3, abs=1e-5), key
    # the trained weights: the difference between the two is a small fraction of what the update moved
    source = over.get("model", {}).get("name_or_path", "builtin:tiny-gpt2")
    initial = load_file(str(builtin_model_dir(source) / "model.safetensors"))
    assert eager_w.keys() == comp_w.keys()
    apart = sum((eager_w[k] - comp_w[k]).pow(2).sum().item() for k in eager_w)
    moved = sum((eager_w[k] - initial[k]).pow(2).sum().item() for k in eager_w if k in initial)
    assert moved > 0 and (apart / moved) ** 0.5 < tolerance


@pytest.mark.parametrize("value_head", ["shared", "separate"])
def test_the_compiled_scoring_pass_scores_as_the_eager_one(tiny_dirs, value_head):
    # The rollout's scoring pass (no gradients) with the compiled blocks: the reference's log-probs, and
    # the policy's log-probs and values, against the eager pass, for a policy that differs from its
    # reference (a separate critic runs its own blocks).
    from engine.models.loading import load_lm
    from engine.models.policy import ActorCritic, frozen_copy
    from engine.rollout import reference_logprobs, score

    torch.manual_seed(0)
    policy = ActorCritic(load_lm(tiny_dirs["causal"], "causal"), False, value_head)
    ref = frozen_copy(policy.lm)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    policy.eval()
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[0, :3] = 0  # a left-padded prompt
    inputs = {
        "prompt_ids": torch.randint(0, 1000, (4, 12)),
        "prompt_mask": mask,
        "gen_ids": torch.randint(0, 1000, (4, 6)),
        "gen_mask": torch.ones(4, 6),
    }
    comp = BlockCompiler([policy.lm, policy.critic])
    comp.add(ref)
    comp.add(ref)  # once only
    assert len(comp.blocks) == 2 * (3 if value_head == "separate" else 2)

    def both():
        return reference_logprobs(ref, policy, inputs, 1.0, None), score(policy, ref, inputs, None, 1.0, None)

    e_ref, e_sc = both()
    with compiled_blocks(comp):
        c_ref, c_sc = both()
    assert (e_ref - c_ref).abs().max() < 1e-4
    assert (e_ref - torch.zeros_like(e_ref)).abs().max() > 1  # real log-probs, not an empty comparison
    for name, e in vars(e_sc).items():
        assert (e - getattr(c_sc, name)).abs().max() < 1e-4, name


def test_the_compiled_call_is_on_only_inside_the_update(tiny_dirs):
    from engine.models.loading import load_lm

    lm = load_lm(tiny_dirs["causal"], "causal")
    blocks = blocks_of(lm)
    assert [type(b).__name__ for b in blocks] == ["GPT2Block", "GPT2Block"]
    comp = BlockCompiler([lm, None])
    assert all(b._compiled_call_impl is None for b in blocks)
    with comp.active():
        assert all(b._compiled_call_impl is not None for b in blocks)
    assert all(b._compiled_call_impl is None for b in blocks)
    with pytest.raises(CompileError, match="declares no transformer blocks"):
        BlockCompiler([torch.nn.Linear(2, 2)])


def test_a_missing_cxx_compiler_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no g++, c++ or clang++
    with pytest.raises(CompileError, match="no C\\+\\+ compiler.*model.compile: false"):
        check_compiler(torch.device("cpu"))


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"algorithm": {"id": "trpo"}}, "algorithm 'trpo' cannot use compiled blocks"),
        ({"model": {"gradient_checkpointing": True}}, "model.gradient_checkpointing together"),
        ({"resources": {"strategy": "fsdp"}}, "resources.strategy 'fsdp'"),
    ],
)
def test_what_compile_cannot_run_with_is_refused_by_name(small_config, tmp_path, over, needle):
    cfg = small_config(**over)
    cfg["model"] = {**cfg.get("model", {}), "compile": True, **over.get("model", {})}
    errors = [(f, m) for f, m in config_errors(cfg) if f == "model.compile"]
    assert len(errors) == 1 and needle in errors[0][1]
    if "resources" not in over:  # the engine refuses it too, before loading anything heavy
        with pytest.raises(ValueError, match="model.compile: .*" + needle.split("'")[0]):
            engine.train(cfg)
    assert not [e for e in config_errors(small_config()) if e[0] == "model.compile"]
