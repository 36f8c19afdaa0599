"""Distributed runs: real ``torchrun`` subprocesses on gloo with the tiny GPT-2.

The claim (docs/engine.md, "Distributed runs"): 2 ranks with per-rank batch B/2 follow the same
trajectory as 1 rank with batch B from the same seed, because sample i of the global batch draws its
tokens from noise seeded by (seed, iteration, i), batch statistics are all-reduced and gradients are
averaged before clipping. A2C is the algorithm under test because its update is one in-order pass
(no shuffled minibatches) whose per-rank losses are exact power-of-two rescalings of the one-rank
chunks, so the two trajectories agree to the last bit on the CPU; the tolerance below only absorbs
the summation order of the all-reduced statistics. (Adam-based updates agree in the first iteration
and then only statistically: Adam's first step turns summation-order noise on near-zero gradients
into full-size steps, as it does for one process with a different ``grad_accumulation``.)
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import engine
from engine import distributed
from engine.rollout import SamplingSpec, collect, inverse_cdf_sample
from engine.trainer import latest_checkpoint
from tests.engine.conftest import BASE_CONFIG, merge

REPO = Path(__file__).resolve().parents[2]

#: Iterations compared; the 2-rank run is killed after its checkpoint 2, before this.
N_REF = 6
#: Fixed-length episodes (EOS banned until the last step) so every rank holds the same token count.
CONFIG = merge(
    BASE_CONFIG,
    {
        "name": "dist",
        "rollout": {"max_new_tokens": 6, "min_new_tokens": 6, "batch_size": 4},
        # No statistic all-reduced in float64 feeds back into the update (advantage whitening, an
        # adaptive KL coefficient): its last-bit differences from one process's float32 sums would
        # otherwise, rarely, flip a sampled token (measured once at iteration 6 of 6).
        "algorithm": {"id": "a2c", "learning_rate": 1e-3, "minibatch_size": 4, "whiten_advantages": False},
        "kl": {"controller": "fixed"},
        # written for 2 processes: per-sample sampling noise on 1 process too (engine/trainer.py)
        "resources": {"processes": 2},
        "train": {
            "n_iters": N_REF,
            "prompts_per_iter": 8,
            "save_every": 1,
            "seed": 3,
            "save_final_model": False,
        },
    },
)
#: |a - b| <= ABS_TOL + REL_TOL * |a| for every logged metric but the timings.
REL_TOL, ABS_TOL = 1e-4, 1e-6


def _metrics(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Every RL metric of each iteration (the training and evaluation rows of a step merged)."""
    out: dict[int, dict[str, Any]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("phase") == "rl":
            out.setdefault(row["step"], {}).update(row)
    return out


def _torchrun(config: Path, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "engine", "train", str(config), "--quiet", *args]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    """The launch's output; a hung launch is killed (whole process group) and fails the test."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s (a rank hung):\n{out[-4000:]}")
    return out


def _train_one_thread(config: dict[str, Any]) -> None:
    """The 1-process reference on one intra-op thread, as each torchrun rank runs (OMP_NUM_THREADS=1):
    with the machine's default (2 threads here) the CPU matmuls sum in another order, and those
    last-bit differences flipped a sampled token at iteration 4 (measured, also before FSDP)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine.train(config)
    finally:
        torch.set_num_threads(threads)


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= ABS_TOL + REL_TOL * abs(a)


def test_two_ranks_match_one_rank_and_a_killed_rank_resumes(tmp_path: Path, wait_for: Any) -> None:
    # 1 process, global batch B = 8, in this process.
    one = tmp_path / "one"
    _train_one_thread(merge(CONFIG, {"train": {"output_dir": str(one)}}))
    reference = _metrics(one)
    assert sorted(reference) == list(range(1, N_REF + 1))

    # 2 ranks, 4 prompts each, on a long run that rank 1's death interrupts.
    two = tmp_path / "two"
    cfg_file = tmp_path / "two.yaml"
    cfg_file.write_text(yaml.safe_dump(merge(CONFIG, {"train": {"n_iters": 1000, "output_dir": str(two)}})))
    proc = _torchrun(cfg_file)
    ranks = wait_for(lambda: json.loads((two / "ranks.json").read_text()), timeout=300, what="ranks.json")
    assert [r["rank"] for r in ranks["ranks"]] == [0, 1] and ranks["backend"] == "gloo"
    wait_for(
        lambda: (ck := latest_checkpoint(two)) is not None and int(ck.name.split("-")[1]) >= 2,
        timeout=300,
        interval=0.01,
        what="checkpoint rl-000002",
    )
    os.kill(ranks["ranks"][1]["pid"], signal.SIGKILL)
    out = _finish(proc)
    # Fails loudly, and fast: rank 0's collective errors (or torchrun stops it) instead of hanging.
    assert proc.returncode != 0, out[-4000:]
    assert "SIGKILL" in out or "exitcode: -9" in out, out[-4000:]
    killed_at = int(latest_checkpoint(two).name.split("-")[1])
    assert 2 <= killed_at < N_REF  # killed mid-run, with iterations left to resume

    # Resume the same directory on 2 ranks, up to the reference's length.
    proc = _torchrun(cfg_file, "--resume", str(two), "--set", f"train.n_iters={N_REF}")
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    resumed = _metrics(two)
    assert sorted(resumed) == list(range(1, N_REF + 1))  # what ran after the checkpoint was dropped
    for step, ref in reference.items():
        for key, value in ref.items():
            if key.startswith("time/") or key in ("step", "phase"):
                continue
            got = resumed[step][key]
            assert _close(value, got), f"iteration {step} {key}: 1 rank {value} vs 2 ranks {got}"
    assert reference[N_REF]["train/kl"] != 0  # the policy moved (k1 can be negative): not constants


def test_sampling_noise_makes_episodes_independent_of_chunking(make_policy: Any) -> None:
    """Per-sample seeds: the same tokens whether 4 prompts are generated as 1 chunk or 4."""
    policy, tok = make_policy("causal")
    spec = SamplingSpec(max_new_tokens=5, eos_id=tok.eos_token_id)

    class S:
        def __init__(self, i: int, prompt: str):
            self.id, self.prompt, self.references, self.meta = str(i), prompt, [], {}

    samples = [S(i, p) for i, p in enumerate(["1 2", "a much longer prompt here", "x", "3 4 5"])]
    seeds = [11, 12, 13, 14]
    runs = [
        collect(policy, None, tok, samples, spec, 32, bs, torch.device("cpu"), sample_seeds=seeds)
        for bs in (4, 1)
    ]
    assert runs[0].generations == runs[1].generations
    assert torch.equal(runs[0].gen_ids, runs[1].gen_ids)
    other = collect(
        policy, None, tok, samples, spec, 32, 4, torch.device("cpu"), sample_seeds=[21, 22, 23, 24]
    )
    assert not torch.equal(other.gen_ids, runs[0].gen_ids)  # the seeds, not the batch, decide


def test_inverse_cdf_sample_hand_values() -> None:
    probs = torch.tensor(
        [[0.1, 0.0, 0.6, 0.3], [0.1, 0.0, 0.6, 0.3], [0.1, 0.0, 0.6, 0.3], [0.5, 0.5, 0.0, 0.0]]
    )
    # cdf 0.1 0.1 0.7 1.0: u=0.05 -> 0; u=0.1 -> 2 (id 1 has no mass); u=0.95 -> 3; u=0.99 -> 1
    u = torch.tensor([0.05, 0.1, 0.95, 0.99])
    assert inverse_cdf_sample(probs, u).tolist() == [0, 2, 3, 1]


def test_single_process_helpers_are_identities() -> None:
    assert not distributed.is_active() and distributed.is_main()
    assert distributed.share(8, "train.prompts_per_iter") == (0, 8)
    x = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    mean, var = distributed.masked_moments(x, mask)
    assert float(mean) == pytest.approx(2.0) and float(var) == pytest.approx(2.0 / 3.0)  # (1+0+1)/3
    assert distributed.gather_rows(x) is x
    assert distributed.mean_dict({"a": 1.5}) == {"a": 1.5}
    assert distributed.broadcast_flag(True) is True


def test_uneven_split_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed, "_GROUP", distributed.Group(rank=1, world_size=3))
    with pytest.raises(
        distributed.DistributedConfigError, match=r"train.prompts_per_iter = 8 .* 3 processes"
    ):
        distributed.share(8, "train.prompts_per_iter")
    assert distributed.share(9, "train.prompts_per_iter") == (3, 6)


#: FSDP (resources.strategy fsdp): the same A2C run with clipping out of reach. With clipping active
#: FSDP's total gradient norm is summed shard by shard, so the clip coefficient differs from one
#: process's in the last bit and the trajectories agree only statistically (measured: parameters 1
#: ulp apart after update 2, a flipped token by iteration 3).
FSDP_ITERS = 4
FSDP_CONFIG = merge(
    CONFIG,
    {
        "name": "fsdp",
        "algorithm": {"max_grad_norm": 1000.0},
        "train": {"n_iters": FSDP_ITERS, "save_every": 1},
    },
)


def test_fsdp_two_ranks_match_one_rank_and_resume(tmp_path: Path) -> None:
    one = tmp_path / "one"
    _train_one_thread(merge(FSDP_CONFIG, {"train": {"output_dir": str(one)}}))
    reference = _metrics(one)
    assert sorted(reference) == list(range(1, FSDP_ITERS + 1))

    # 2 sharded ranks stop after half the iterations (final model saved from gathered shards) ...
    two = tmp_path / "two"
    cfg_file = tmp_path / "fsdp.yaml"
    cfg_file.write_text(
        yaml.safe_dump(
            merge(
                FSDP_CONFIG,
                {
                    "resources": {"strategy": "fsdp"},
                    "train": {"n_iters": FSDP_ITERS // 2, "output_dir": str(two), "save_final_model": True},
                },
            )
        )
    )
    proc = _torchrun(cfg_file)
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    saved = json.loads((two / "model" / "config.json").read_text())
    assert saved["architectures"] == ["GPT2LMHeadModel"]  # the model's class, not FSDP's wrapper
    full = torch.load(latest_checkpoint(two) / "state.pt", weights_only=True)
    assert full["strategy"] == "fsdp"
    assert full["policy"]["lm.transformer.wte.weight"].shape[0] == 50257  # gathered, not a shard
    # ... and resume from the checkpoint to the reference's length.
    proc = _torchrun(cfg_file, "--resume", str(two), "--set", f"train.n_iters={FSDP_ITERS}")
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    resumed = _metrics(two)
    for step, ref in reference.items():
        for key, value in ref.items():
            if key.startswith("time/") or key in ("step", "phase"):
                continue
            got = resumed[step][key]
            assert _close(value, got), f"iteration {step} {key}: 1 rank {value} vs 2 FSDP ranks {got}"
    assert reference[FSDP_ITERS]["train/kl"] != 0  # k1 can be negative


@pytest.mark.parametrize("algorithm", ["trpo", "nlpo"])
def test_fsdp_refuses_algorithms_it_cannot_shard(algorithm: str) -> None:
    with pytest.raises(
        engine.ConfigError, match=rf"resources.strategy 'fsdp' does not support algorithm '{algorithm}'"
    ):
        engine.parse_config(
            merge(CONFIG, {"algorithm": {"id": algorithm}, "resources": {"strategy": "fsdp"}})
        )
    engine.parse_config(merge(CONFIG, {"algorithm": {"id": algorithm}}))  # ddp: fine
