"""LoRA: only the adapter and the value head train, the reference is the base model (adapter off, no
copy), checkpoints hold the trainable tensors and resume, and the final model round-trips merged or as
an adapter directory. Real PEFT on the builtin tiny GPT-2 and T5, fp32 on CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import engine
from engine.config import ConfigError, parse_config
from engine.events import MultiSink
from engine.models.builtin import builtin_model_dir
from engine.models.loading import detect_kind, load_lm, load_tokenizer
from engine.models.lora import AdapterDisabledReference, adapter_disabled
from engine.sinks import RunDirSink
from engine.trainer import STATE_FILE, Trainer, latest_checkpoint

NAMES = {"causal": "builtin:tiny-gpt2", "seq2seq": "builtin:tiny-t5"}


def _lora_config(small_config: Any, kind: str, **train: Any) -> dict[str, Any]:
    return small_config(
        model={
            "name_or_path": NAMES[kind],
            "mixed_precision": "no",
            "lora": {"r": 4, "alpha": 8, **train.pop("lora", {})},
        },
        algorithm={"learning_rate": 1e-2},
        train={"save_final_model": True, **train},
    )


def _trainer(cfg: dict[str, Any]) -> Trainer:
    rc = parse_config(cfg)
    run_dir = Path(rc.train.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sink = RunDirSink(run_dir)
    return Trainer(rc, MultiSink(sink, None), run_dir, sink)


def _probe(tok: Any, kind: str) -> dict[str, torch.Tensor]:
    enc = tok(["1 2 3 4 and then", "hello"], return_tensors="pt", padding=True)
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if kind == "seq2seq":
        inputs["decoder_input_ids"] = torch.tensor([[0, 5, 6], [0, 7, 8]])
    return inputs


def _logits(lm: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    lm.eval()
    with torch.no_grad():
        return lm(**inputs).logits


def test_lora_section_in_config_and_schema():
    assert parse_config({}).model.lora.enabled is False
    assert parse_config({"model": {"lora": {"r": 4}}}).model.lora.enabled is True  # settings mean "on"
    assert parse_config({"model": {"lora": {"enabled": False, "r": 4}}}).model.lora.enabled is False
    props = engine.config.json_schema()["$defs"]["LoraSettings"]["properties"]
    assert {"enabled", "r", "alpha", "dropout", "target_modules", "save"} <= set(props)
    with pytest.raises(ConfigError, match="model.lora.save"):
        parse_config({"model": {"lora": {"save": "both"}}})


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_only_adapter_and_value_head_change(small_config, kind):
    cfg = _lora_config(small_config, kind)
    untouched = _trainer(cfg | {"train": {**cfg["train"], "output_dir": cfg["train"]["output_dir"] + "-0"}})
    trained = _trainer(cfg)
    trained.run()
    before = dict(untouched.policy.named_parameters())
    changed = set()
    for name, p in trained.policy.named_parameters():
        if not torch.equal(p.detach(), before[name].detach()):
            changed.add(name)
    trainable = {n for n, p in trained.policy.named_parameters() if p.requires_grad}
    assert changed and changed <= trainable
    assert all("lora_" in n or n.startswith("value_head.") for n in trainable)
    assert any(n.startswith("value_head.") for n in changed)
    lora_b = [n for n in trainable if "lora_B" in n]
    assert lora_b and set(lora_b) <= changed  # B starts at zero: every adapter moved
    # The base weights equal the model on disk.
    base = dict(load_lm(str(builtin_model_dir(NAMES[kind])), kind).named_parameters())
    for name, p in trained.policy.lm.named_parameters():
        if "lora_" in name:
            continue
        plain = name.replace("base_model.model.", "").replace(".base_layer", "")
        assert torch.equal(p.detach(), base[plain].detach()), name


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_reference_is_the_base_model_without_a_copy(small_config, kind):
    trainer = _trainer(_lora_config(small_config, kind))
    trainer.run()
    assert isinstance(trainer.ref_lm, AdapterDisabledReference)
    assert list(trainer.ref_lm.parameters()) == []  # no second copy of the weights
    tok = load_tokenizer(str(builtin_model_dir(NAMES[kind])))
    inputs = _probe(tok, kind)
    original = _logits(load_lm(str(builtin_model_dir(NAMES[kind])), kind), inputs)
    adapted = _logits(trainer.policy.lm, inputs)
    assert (adapted - original).abs().max() > 1e-4  # training moved the policy
    with adapter_disabled(trainer.policy.lm):
        assert torch.allclose(_logits(trainer.policy.lm, inputs), original, atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(trainer.ref_lm(**inputs).logits, original, atol=1e-5)
    assert torch.allclose(_logits(trainer.policy.lm, inputs), adapted)  # the adapter is back on


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
@pytest.mark.parametrize("mode", ["merged", "adapter"])
def test_final_model_round_trips(small_config, kind, mode):
    trainer = _trainer(_lora_config(small_config, kind, lora={"save": mode}))
    summary = trainer.run()
    model_dir = Path(summary["model_dir"])
    if mode == "adapter":
        assert (model_dir / "adapter_config.json").exists() and not (model_dir / "config.json").exists()
    else:
        assert (model_dir / "config.json").exists() and not (model_dir / "adapter_config.json").exists()
    assert (model_dir / "value_head.safetensors").exists()
    assert detect_kind(str(model_dir)) == kind
    loaded = load_lm(str(model_dir), kind)
    assert not any("lora_" in n for n, _ in loaded.named_parameters())  # a plain model either way
    tok = load_tokenizer(str(model_dir))
    inputs = _probe(tok, kind)
    assert torch.allclose(_logits(loaded, inputs), _logits(trainer.policy.lm, inputs), atol=1e-4)


def test_checkpoint_holds_the_adapter_and_resume_follows_the_same_trajectory(small_config, tmp_path):
    full = _lora_config(small_config, "causal", n_iters=4, output_dir=str(tmp_path / "full"))
    engine.train(full)
    part = _lora_config(small_config, "causal", n_iters=4, output_dir=str(tmp_path / "part"))
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    assert engine.train(part, should_stop=stop)["stopped"]
    ck = latest_checkpoint(tmp_path / "part")
    state = torch.load(ck / STATE_FILE, weights_only=True)
    assert state["policy"] and all("lora_" in k or k.startswith("value_head.") for k in state["policy"])
    engine.train(part, resume_from=str(tmp_path / "part"))

    def rewards(run: str) -> list[float]:
        rows = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [r["train/reward_mean"] for r in rows if "train/reward_mean" in r]

    assert len(rewards("full")) == 4
    assert rewards("part") == pytest.approx(rewards("full"), abs=1e-6)


def test_resume_with_other_lora_settings_is_refused(small_config, tmp_path):
    cfg = _lora_config(small_config, "causal", n_iters=3, output_dir=str(tmp_path / "r"))
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 1

    engine.train(cfg, should_stop=stop)
    other = json.loads((tmp_path / "r" / "config.json").read_text())
    other["model"]["lora"]["target_modules"] = ["c_attn", "c_fc"]
    with pytest.raises(ValueError, match="does not match this run's LoRA adapter"):
        engine.train(other, resume_from=str(tmp_path / "r"))


def test_dpo_with_lora_starts_at_log2_and_learns(small_config, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps(
                {"prompt": f"About {t}.", "chosen": f" {i} {i + 1} {i + 2}", "rejected": f" {t} is fine"}
            )
            + "\n"
            for i, t in enumerate(["cats", "dogs", "rain", "music"])
        )
    )
    cfg = _lora_config(
        small_config,
        "causal",
        n_iters=8,
        prompts_per_iter=4,
        save_final_model=False,
        lora={"target_modules": ["all-linear"], "alpha": 32},
    )
    cfg["task"] = {"id": "preference_pairs", "args": {"path": str(pairs), "heldout_fraction": 0.0}}
    cfg["reward"] = {"id": "rouge_l_max"}
    cfg["algorithm"] = {"id": "dpo", "learning_rate": 5e-2, "minibatch_size": 4}
    trainer = _trainer(cfg)
    trainer.run()
    assert isinstance(trainer.ref_lm, AdapterDisabledReference)
    loss = [h["train/loss"] for h in trainer.history]
    assert loss[0] == pytest.approx(0.6931, abs=1e-3)
    # An adapter on the attention/MLP layers of the tiny GPT-2 cannot move the (tied) embeddings, so it
    # learns slower than full fine-tuning: measured loss 0.58-0.59, margin about 0.2 after 6-8 steps.
    assert loss[-1] < 0.66 and trainer.history[-1]["rewards/margin"] > 0.1
    assert trainer.history[-1]["rewards/accuracy"] == 1.0
