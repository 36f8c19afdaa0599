"""Re-generating from a checkpoint for a gold (``engine.checkpoint_export.generate_from_checkpoint``)
samples the policy as the engine's evaluation of the run's algorithm does: an NLPO policy through the
masking policy its checkpoint holds (RL4LMs evaluates NLPO masked), with the policy as its own mask
when the checkpoint holds none, unmasked when the run turned masked evaluation off; the way used is
returned. Real tiny GPT-2 checkpoints written as the trainer writes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine import presets
from engine.checkpoint_export import MASKING, CheckpointExportError, generate_from_checkpoint
from engine.models.loading import load_lm, load_tokenizer, resolve_model_path

#: The token the test's masking policy keeps ("&"): its masked generations are made of it only.
FORCED = "&"
N_TOKENS = 6


def config(algorithm: str = "nlpo", masked_eval: bool = True) -> dict[str, Any]:
    """The synthetic preset (tiny GPT-2) as ``algorithm``; EOS banned until the last token, so
    every generation has ``N_TOKENS`` tokens."""
    cfg = dict(presets.load_preset("synthetic_ppo"))
    algo = {**cfg["algorithm"], "id": algorithm}
    if algorithm == "nlpo":
        algo["nlpo"] = {"top_mask": 0.9, "min_tokens_to_keep": 1, "masked_eval": masked_eval}
    cfg["algorithm"] = algo
    gen = {**cfg["eval"]["generation"], "min_new_tokens": N_TOKENS, "max_new_tokens": N_TOKENS}
    cfg["eval"] = {**cfg["eval"], "generation": gen}
    return cfg


def forcing_masker(lm: Any, token: int) -> dict[str, torch.Tensor]:
    """A masking policy whose top-p set is ``token`` alone at every position: its final layer norm
    outputs a constant hidden state along the token's (enlarged, tied) embedding."""
    state = {k: v.clone() for k, v in lm.state_dict().items()}
    state["transformer.wte.weight"][token] *= 100.0
    state["lm_head.weight"] = state["transformer.wte.weight"]
    state["transformer.ln_f.weight"].zero_()
    state["transformer.ln_f.bias"].copy_(state["transformer.wte.weight"][token])
    return state


def write_checkpoint(path: Path, masker: dict[str, torch.Tensor] | None) -> None:
    """``state.pt`` as the trainer writes it: the policy's ``lm.*`` tensors and, for NLPO, the
    algorithm's state with its masking policy (``NLPO.state_dict``)."""
    lm = load_lm(resolve_model_path("builtin:tiny-gpt2"), "causal")
    state: dict[str, Any] = {"policy": {f"lm.{k}": v for k, v in lm.state_dict().items()}, "phase": "rl"}
    if masker is not None:
        state["algorithm"] = {"masker": masker, "refreshed_at": 5, "n_refreshes": 1}
    path.mkdir(parents=True, exist_ok=True)
    torch.save(state, path / "state.pt")


@pytest.fixture(scope="module")
def forced_token() -> int:
    tok = load_tokenizer(resolve_model_path("builtin:tiny-gpt2"))
    ids = tok.encode(FORCED)
    assert len(ids) == 1
    return ids[0]


def test_nlpo_is_sampled_through_the_checkpoints_masking_policy(tmp_path: Path, forced_token: int) -> None:
    lm = load_lm(resolve_model_path("builtin:tiny-gpt2"), "causal")
    write_checkpoint(tmp_path / "rl-000010", forcing_masker(lm, forced_token))
    out = generate_from_checkpoint(config(), tmp_path / "rl-000010", 5)
    assert out.masking == "checkpoint" and out.masking_note == MASKING["checkpoint"]
    assert out.generations == [FORCED * N_TOKENS] * 5
    # The same policy unmasked (PPO) samples other tokens: the mask is what made them all "&".
    plain = generate_from_checkpoint(config("ppo"), tmp_path / "rl-000010", 5)
    assert plain.masking == "" and all(g != FORCED * N_TOKENS for g in plain.generations)
    assert [s.prompt for s in plain.samples] == [s.prompt for s in out.samples]


def test_without_a_masking_policy_the_policy_masks_itself_and_says_so(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "rl-000010", masker=None)
    out = generate_from_checkpoint(config(), tmp_path / "rl-000010", 5)
    assert out.masking == "policy"
    assert "holds no NLPO masking policy" in out.masking_note
    assert len(out.generations) == 5 and all(g != FORCED * N_TOKENS for g in out.generations)


def test_masked_eval_off_samples_unmasked_as_the_runs_evaluations(tmp_path: Path, forced_token: int) -> None:
    lm = load_lm(resolve_model_path("builtin:tiny-gpt2"), "causal")
    write_checkpoint(tmp_path / "rl-000010", forcing_masker(lm, forced_token))
    off = generate_from_checkpoint(config(masked_eval=False), tmp_path / "rl-000010", 4)
    assert off.masking == "off" and "masked_eval false" in off.masking_note
    assert off.generations == generate_from_checkpoint(config("ppo"), tmp_path / "rl-000010", 4).generations


def test_a_masking_policy_that_does_not_fit_is_refused_by_name(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "rl-000010", masker={"transformer.no_such.weight": torch.zeros(2)})
    with pytest.raises(CheckpointExportError, match="rl-000010: its masking policy does not fit"):
        generate_from_checkpoint(config(), tmp_path / "rl-000010", 2)
