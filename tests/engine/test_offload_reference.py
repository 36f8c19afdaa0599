"""Issue #30, memory: ``model.offload_reference`` keeps the frozen KL reference in a file between its
uses, so the update (where the peak is reached) runs without it. Real tiny GPT-2 models and real
training runs: the weights come back bit for bit, a run's metrics are those of the resident reference,
and the file is never mapped (a mapping would sit on top of the kept heap's high-water mark)."""

from __future__ import annotations

import copy
import gc
import json
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

import engine
import engine.rollout as rollout
from engine.config import ConfigError, parse_config
from engine.events import MultiSink, NullSink
from engine.kl import build_kl_controller
from engine.models.loading import load_lm
from engine.models.offload import OffloadedWeights
from engine.models.policy import frozen_copy
from engine.sinks import RunDirSink
from engine.trainer import Trainer, build_reward_fn
from tests.engine.conftest import BASE_CONFIG, merge


def _mapped(path: Path) -> bool:
    """Whether any region of this process maps ``path`` (Linux)."""
    return str(path) in Path("/proc/self/maps").read_text()


def test_weights_come_back_bit_for_bit_and_leave_no_mapping(tiny_dirs, tmp_path: Path):
    lm = frozen_copy(load_lm(tiny_dirs["causal"], "causal"))
    original = {k: v.clone() for k, v in lm.state_dict().items()}
    buffers = {k: v.clone() for k, v in lm.named_buffers()}  # GPT-2's causal mask is not in the state
    ids = torch.tensor([[464, 3807, 318, 922]])
    with torch.no_grad():
        expected = lm(ids).logits
    off = OffloadedWeights(lm, tmp_path / "ref.pt")
    # between uses: shapes only, no storage, and the file is not mapped
    assert not off.is_loaded and all(p.device.type == "meta" for p in lm.parameters())
    assert not _mapped(off.path)
    with off.loaded() as ref:
        assert ref is lm and not _mapped(off.path)  # read into the heap, not mapped (offload.py: why)
        state = ref.state_dict()
        assert state.keys() == original.keys()
        assert all(torch.equal(state[k], original[k]) for k in original)
        assert not any(p.requires_grad for p in ref.parameters())
        with off.loaded():  # nested uses share the one load
            pass
        assert off.is_loaded
        with torch.no_grad():
            assert torch.equal(ref(ids).logits, expected)
        del state
    assert not off.is_loaded and not _mapped(off.path)
    assert all(torch.equal(b, buffers[k]) for k, b in lm.named_buffers() if b.device.type != "meta")
    off.remove()
    assert not off.path.exists()


def test_tied_weights_stay_one_storage(tiny_dirs, tmp_path: Path):
    """GPT-2 ties its LM head to the token embedding (as SmolLM2 does): saved once, read back as one."""
    lm = frozen_copy(load_lm(tiny_dirs["causal"], "causal"))
    assert lm.lm_head.weight.data_ptr() == lm.transformer.wte.weight.data_ptr()
    off = OffloadedWeights(lm, tmp_path / "ref.pt")
    with off.loaded() as ref:
        assert ref.lm_head.weight.data_ptr() == ref.transformer.wte.weight.data_ptr()


def _run(tmp_path: Path, name: str, over: dict[str, Any]) -> tuple[list[dict[str, Any]], Path]:
    cfg = merge(BASE_CONFIG, merge({"train": {"output_dir": str(tmp_path / name), "n_iters": 3}}, over))
    engine.train(cfg)
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("phase") == "rl" and "loss/total" in r], tmp_path / name


NUMBERS = ("loss/total", "loss/policy", "loss/value", "train/kl", "train/reward_mean", "policy/param_drift")


@pytest.mark.parametrize(
    "over",
    [
        {"model": {"value_head": "separate"}, "algorithm": {"clip_grad_per_model": True}},
        {"model": {"value_head": "shared"}, "kl": {"init_coef": 0.2}},
        {"algorithm": {"id": "grpo", "n_epochs": 2, "group": {"group_size": 2, "beta": 0.1}}},
    ],
    ids=["ppo-separate-per-model-clip", "ppo-shared", "grpo"],
)
def test_a_run_with_the_reference_offloaded_logs_the_same_numbers(tmp_path: Path, over: dict[str, Any]):
    """Three iterations (rollout with reference scoring, KL-shaped rewards, update, drift read) with the
    reference resident and offloaded: every logged number identical, and the file gone afterwards."""
    resident, _ = _run(tmp_path, "resident", over)
    off_over = merge(over, {"model": {"offload_reference": True}})
    offloaded, run_dir = _run(tmp_path, "offloaded", off_over)
    assert len(resident) == len(offloaded) == 3
    for a, b in zip(resident, offloaded, strict=True):
        for key in NUMBERS:
            if key in a:
                assert a[key] == b[key], (key, a[key], b[key])
    assert any(r.get("train/kl", 0) != 0 for r in resident)  # the reference was really used
    assert not list((run_dir / "offload").glob("*.pt"))


@pytest.mark.parametrize(
    "over, fragment",
    [
        ({"model": {"lora": {"enabled": True}}}, "adapter off"),
        ({"algorithm": {"id": "dpo"}, "task": {"id": "preference_pairs"}}, "DPO reads the reference"),
        ({"model": {"compile": True}}, "model.compile"),
        ({"resources": {"strategy": "fsdp"}}, "fsdp"),
    ],
)
def test_unsupported_combinations_are_refused_by_name(over: dict[str, Any], fragment: str):
    cfg = merge(BASE_CONFIG, merge(over, {"model": {"offload_reference": True}}))
    with pytest.raises(ConfigError) as exc:
        parse_config(copy.deepcopy(cfg))
    assert "model.offload_reference" in str(exc.value) and fragment in str(exc.value)


def test_inside_a_run_the_update_runs_without_the_reference(tmp_path: Path):
    """The memory the option is for: the reference's weights are alive in the rollout's scoring pass
    and gone (freed, not merely detached) by the time the update runs."""
    over = {"model": {"value_head": "separate", "offload_reference": True}, "train": {"n_iters": 1}}
    cfg = parse_config(merge(BASE_CONFIG, over))
    sink = RunDirSink(tmp_path)
    t = Trainer(cfg, MultiSink(sink, NullSink()), tmp_path, sink)
    t.reward_fn = build_reward_fn(cfg)
    t._setup_reference()
    t.optimizer = t._make_rl_optimizer()
    t.kl_ctl = build_kl_controller(cfg.kl)
    t.algo.setup(t.policy)
    seen: list[weakref.ref] = []
    alive_in_update: list[int] = []
    score, update = rollout.reference_logprobs, t.algo.update

    def scoring(ref_lm: Any, *a: Any, **k: Any) -> Any:
        seen.extend(weakref.ref(p) for p in ref_lm.parameters())
        assert all(p.device.type != "meta" for p in ref_lm.parameters())
        return score(ref_lm, *a, **k)

    def updating(*a: Any, **k: Any) -> Any:
        gc.collect()
        alive_in_update.append(sum(r() is not None for r in seen))
        return update(*a, **k)

    rollout.reference_logprobs, t.algo.update = scoring, updating
    try:
        t.rl_iteration()
    finally:
        rollout.reference_logprobs = score
    assert seen and alive_in_update == [0]
    assert t.ref_offload is not None and not t.ref_offload.is_loaded


def test_a_failed_run_leaves_no_offloaded_copy_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The reference's file is a full copy of the model's weights: a run that fails mid-way (here its
    reward raises in the second iteration, after the first iteration's update read the file) must not
    leave it on disk, and the failure is still recorded with its traceback."""
    import engine.trainer as trainer_mod

    build = trainer_mod.build_reward_fn
    run_dir = tmp_path / "failing"
    seen: list[bool] = []

    def failing_reward(cfg: Any) -> Any:
        inner = build(cfg)

        def score(*a: Any, **k: Any) -> Any:
            seen.append(any((run_dir / "offload").glob("*.pt")))
            if len(seen) == 2:
                raise RuntimeError("the reward service went away")
            return inner(*a, **k)

        return score

    monkeypatch.setattr(trainer_mod, "build_reward_fn", failing_reward)
    over = {"model": {"value_head": "separate", "offload_reference": True}}
    cfg = merge(BASE_CONFIG, {"train": {"output_dir": str(run_dir), "n_iters": 3}, **over})
    with pytest.raises(RuntimeError, match="reward service went away"):
        engine.train(cfg)
    assert seen == [True, True]  # the copy was on disk while the run lived
    assert not list((run_dir / "offload").glob("*.pt")) and not list((run_dir / "offload").glob("*.tmp"))
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["event"] == "failed"]
    assert len(failed) == 1 and "reward service went away" in failed[0]["error"]
    assert "failing_reward" in failed[0]["traceback"] or "score" in failed[0]["traceback"]


def test_supervised_rl_offloads_to_its_reference_checkpoint_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Supervised + RL keeps the supervised model as ``checkpoints/reference.pt`` for resumes; the
    offload uses that file instead of writing a second full copy, leaves it in place when the run ends
    (a later resume needs it), and a run stopped after its first RL iteration resumes to the numbers of
    the resident, uninterrupted run."""
    import engine.trainer as trainer_mod
    from tests.engine.test_resume import StepWatcher

    over = {
        "model": {"value_head": "separate"},
        "supervised": {"enabled": True, "max_steps": 2, "batch_size": 4},
        "train": {"n_iters": 3, "save_every": 1},
    }
    resident, _ = _run(tmp_path, "resident", over)

    build = trainer_mod.build_reward_fn
    copies: list[list[str]] = []
    split = tmp_path / "split"

    def watched_reward(cfg: Any) -> Any:
        inner = build(cfg)

        def score(*a: Any, **k: Any) -> Any:
            copies.append(sorted(p.name for p in split.rglob("*.pt") if "reference" in p.name))
            return inner(*a, **k)

        return score

    monkeypatch.setattr(trainer_mod, "build_reward_fn", watched_reward)
    off = merge(over, {"model": {"offload_reference": True}, "train": {"output_dir": str(split)}})
    cfg = merge(BASE_CONFIG, off)
    watcher = StepWatcher()
    part = engine.train(cfg, sink=watcher, should_stop=lambda: watcher.rl_step >= 1)
    assert part["stopped"] and (split / "checkpoints" / "reference.pt").is_file()
    engine.train(cfg, resume_from=str(split))
    assert copies and all(c == ["reference.pt"] for c in copies)  # one copy on disk, never two
    assert (split / "checkpoints" / "reference.pt").is_file()  # left for resumes
    rows = [json.loads(x) for x in (split / "metrics.jsonl").read_text().splitlines()]
    offloaded = [r for r in rows if r.get("phase") == "rl" and "loss/total" in r]
    assert len(resident) == len(offloaded) == 3
    for a, b in zip(resident, offloaded, strict=True):
        for key in NUMBERS:
            if key in a:
                assert a[key] == b[key], (key, a[key], b[key])
