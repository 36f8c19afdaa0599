"""File-backed frozen copies (engine/models/offload.py): same numbers, writes survive a release."""

from __future__ import annotations

import sys

import pytest
import torch

from engine.models.builtin import builtin_model_dir
from engine.models.loading import load_lm
from engine.models.offload import frozen_file_copy, is_offloaded, release_offloaded

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file mappings: Linux only")


def _lm() -> torch.nn.Module:
    return load_lm(str(builtin_model_dir("builtin:tiny-gpt2")), "causal")


def test_file_copy_gives_the_same_logits_before_and_after_a_release():
    torch.manual_seed(0)
    lm = _lm().eval()
    ref = frozen_file_copy(lm, min_bytes=0)
    assert ref is not None and is_offloaded(ref)
    ids = torch.randint(0, lm.config.vocab_size, (2, 7))
    with torch.no_grad():
        want = lm(input_ids=ids).logits
        assert torch.equal(ref(input_ids=ids).logits, want)
        assert release_offloaded() > 0
        assert torch.equal(ref(input_ids=ids).logits, want)  # read back from the mapping
    # tied weights stay tied, every parameter is frozen and none shares memory with the source
    assert ref.get_input_embeddings().weight is ref.get_output_embeddings().weight
    assert all(not p.requires_grad for p in ref.parameters())
    src = {p.data_ptr() for p in lm.parameters()}
    assert not any(p.data_ptr() in src for p in ref.parameters())


def test_writes_to_a_file_copy_survive_a_release():
    """A checkpoint's reference is loaded into the copy (``load_state_dict``): the mapping is shared, so
    the written bytes are the file's and a release must not bring back the old ones."""
    lm = _lm()
    ref = frozen_file_copy(lm, min_bytes=0)
    assert ref is not None
    state = {k: torch.full_like(v, 0.25) for k, v in ref.state_dict().items()}
    ref.load_state_dict(state)
    release_offloaded()
    assert all(torch.equal(v, state[k]) for k, v in ref.state_dict().items())


def test_small_models_stay_in_memory():
    assert frozen_file_copy(_lm()) is None  # below MIN_BYTES: nothing to gain


def test_a_file_copy_saves_and_loads_as_a_state_dict(tmp_path):
    """The trainer keeps the reference of a resumable run as ``torch.save(ref.state_dict())``."""
    lm = _lm()
    ref = frozen_file_copy(lm, min_bytes=0)
    assert ref is not None
    torch.save(ref.state_dict(), tmp_path / "reference.pt")
    loaded = torch.load(tmp_path / "reference.pt", weights_only=True)
    assert all(torch.equal(v, loaded[k]) for k, v in lm.state_dict().items())
    ref.load_state_dict(loaded)
