"""The training loop behind ``engine.train``.

supervised warm start (optional) -> RL iterations: rollout -> task reward -> KL-shaped per-token
rewards -> GAE -> whitening -> algorithm update -> KL controller -> eval every N -> checkpoint.

Reproducibility: data order, sampling and minibatch shuffles use generators seeded from
``(train.seed, iteration)``, and checkpoints hold model, optimizer, KL controller, algorithm state
and RNG states, so a run resumed from its last checkpoint follows the same trajectory on CPU.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import shutil
import time
import traceback as tb
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine import distributed
from engine.algorithms.ppo import explained_variance, gae, kl_penalty_rewards, masked_mean, whiten
from engine.algorithms.sft import build_sft_batch, sft_loss, sft_pairs, sft_schedule
from engine.checkpoint_layout import STATE_FILE
from engine.config import RunConfig, parse_config
from engine.data import load_task
from engine.diskspace import writing
from engine.evaluation import (
    PolicyContext,
    eval_results,
    generate_texts,
    reward_details,
    score_generations,
    write_eval_results,
)
from engine.events import MultiSink, NullSink
from engine.kl import build_kl_controller
from engine.launch_checks import compile_errors
from engine.models.compiled import BlockCompiler, check_compiler, compiled_blocks
from engine.models.loading import (
    autocast_dtype,
    detect_kind,
    load_lm,
    load_tokenizer,
    resolve_device,
    resolve_model_path,
)
from engine.models.lora import (
    AdapterDisabledReference,
    apply_lora,
    load_trainable_state,
    save_lora_model,
    trainable_state,
)
from engine.models.memory import retain_freed_memory
from engine.models.offload import OffloadedWeights
from engine.models.policy import ActorCritic, frozen_copy
from engine.models.precision import autocast
from engine.registry import algorithms
from engine.rewards import build_reward
from engine.rollout import RolloutBatch, SamplingSpec, collect
from engine.sinks import RunDirSink
from engine.trackers import build_trackers
from engine.trackers import check_available as check_trackers


class OutOfMemoryHint(RuntimeError):
    """Out of memory, with a suggestion that names the batch settings."""


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _mix(*parts: int) -> int:
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFF)) * 1099511628211) % (2**63)
    return h


def _rank_rows(rows: list[int]) -> list[int]:
    """This rank's rows of one supervised batch (every W-th; the whole batch when it has fewer
    rows than ranks, so no rank trains on nothing)."""
    group = distributed.current()
    if len(rows) < group.world_size:
        return rows
    return rows[group.rank :: group.world_size]


def _support_stats(support: Any, mask: torch.Tensor) -> dict[str, float]:
    """Share of the vocabulary in the sampled action space (top-k, top-p, NLPO mask), when one is stored."""
    if not isinstance(support, torch.Tensor):
        return {}
    valid = mask.bool()
    if not bool(valid.any()):
        return {}
    return {"rollout/support_frac": float(support[valid].float().mean())}


def _add_drift_sums(sums: torch.Tensor, a: torch.Tensor, b: torch.Tensor, block: int = 1 << 20) -> None:
    """Add Σ(a − b)² and Σb² to ``sums`` (fp64), ``block`` elements at a time. Why blocks: whole-tensor fp64
    copies were up to ~0.7 GB of temporaries at once for SmolLM2's embedding (28M weights: two fp64
    copies and their difference), made right after every update; blocks keep them at a few MB. The
    same sums up to fp64 rounding."""
    a, b = a.reshape(-1), b.reshape(-1)
    for i in range(0, a.numel(), block):
        x, y = a[i : i + block].double(), b[i : i + block].double()
        sums[0] += torch.sum((x - y) ** 2)
        sums[1] += torch.sum(y**2)


def _time_metrics(timings: dict[str, float], t0: float) -> dict[str, float]:
    """Seconds spent in each step of an iteration begun at ``t0`` (``time.perf_counter``)."""
    return {
        "time/generate_s": timings.get("generate", 0.0),
        "time/score_s": timings.get("score", 0.0),
        "time/reward_s": timings.get("reward", 0.0),
        "time/update_s": timings.get("update", 0.0),
        "time/iteration_s": time.perf_counter() - t0,
    }


def load_split(cfg: RunConfig, split: str) -> list[Any]:
    return load_task(cfg.task, split)


def build_reward_fn(cfg: RunConfig) -> Any:
    return build_reward(cfg.reward)


def default_run_dir(cfg: RunConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in cfg.name) or "run"
    return Path("runs") / f"{safe}-{stamp}"


def _rng_state() -> dict[str, Any]:
    """RNG states as tensors and plain numbers only, so checkpoints load with ``weights_only=True``
    (a pickled numpy array or tuple would need the unsafe loader, which runs code from the file)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {
            "version": int(version),
            "state": torch.tensor(internal, dtype=torch.int64),
            "gauss": gauss,
        },
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``_rng_state`` saved. The state file is loaded onto the run's device (its tensors
    land on CUDA in a GPU run), while numpy and torch's setters take host tensors only: hence ``.cpu()``."""
    py, npst = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    keys = npst["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state((npst["kind"], keys, npst["pos"], npst["has_gauss"], npst["cached"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _plain(obj: Any) -> Any:
    """numpy scalars/arrays → Python numbers/tensors, recursively (safe for ``weights_only``)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


#: The only checkpoint directory names the engine writes (``rl-000012``, ``sft-000340``).
CHECKPOINT_NAME = re.compile(r"(rl|sft)-[0-9]{6,12}")


class CheckpointError(ValueError):
    """A checkpoint pointer or file the engine did not write (tampered, foreign or too old)."""


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest.json"
    if not pointer.exists():
        return None
    try:
        name = json.loads(pointer.read_text())["name"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{pointer}: not a checkpoint pointer written by the engine ({exc})") from None
    # Only names the engine writes: never an absolute path, a separator or "..", which would leave
    # the run directory and load whatever file an attacker placed elsewhere.
    if not isinstance(name, str) or not CHECKPOINT_NAME.fullmatch(name):
        raise CheckpointError(f"{pointer}: refusing checkpoint name {name!r} (expected e.g. 'rl-000012')")
    path = run_dir / "checkpoints" / name
    return path if (path / STATE_FILE).exists() else None


class Trainer:
    def __init__(
        self,
        cfg: RunConfig,
        events: Any,
        run_dir: Path,
        run_sink: RunDirSink,
        should_stop: Any = None,
        resume_from: str | None = None,
    ):
        self.cfg = cfg
        self.events = events
        self.run_dir = run_dir
        self.run_sink = run_sink
        self.should_stop = should_stop or (lambda: False)
        self.resume_from = resume_from
        _seed_all(cfg.train.seed)

        self.device = distributed.device_for(resolve_device(cfg.model.device))
        if self.device.type == "cpu" and cfg.resources.retain_freed_memory:
            retain_freed_memory()  # big per-step tensors reuse pages (engine/models/memory.py)
        self.amp = autocast_dtype(cfg.model.mixed_precision, self.device)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp == torch.float16 else None
        path = resolve_model_path(cfg.model.name_or_path, cfg.model.gguf_file)
        self.kind = detect_kind(path, cfg.model.type, cfg.model.revision)
        tok_path = resolve_model_path(cfg.tokenizer.name_or_path) if cfg.tokenizer.name_or_path else path
        self.tokenizer = load_tokenizer(
            tok_path,
            cfg.tokenizer.padding_side,
            cfg.tokenizer.truncation_side,
            cfg.tokenizer.pad_token_as_eos_token,
            kind=self.kind,
        )
        lm = load_lm(path, self.kind, cfg.model.revision)
        if cfg.model.gradient_checkpointing:
            # transformers 5.x renamed it (the old name warns, and goes in v6)
            enable = getattr(lm, "activation_checkpointing_enable", None) or lm.gradient_checkpointing_enable
            enable()
        if cfg.model.lora.enabled:
            apply_lora(lm, cfg.model.lora)  # in place: base frozen, adapter trainable
        self.policy = ActorCritic(lm, self.kind == "seq2seq", cfg.model.value_head).to(self.device)
        # Every rank starts from rank 0's weights (a random value head included), then draws its own
        # global RNG stream (dropout); rollout noise is seeded per sample, not per rank.
        distributed.broadcast_module(self.policy)
        if distributed.current().rank > 0:
            _seed_all(_mix(cfg.train.seed, distributed.current().rank, 7))
        self.frozen_copy = frozen_copy
        if distributed.is_sharded():  # resources.strategy fsdp: shards, not replicas
            distributed.shard_policy(self.policy)
            self.frozen_copy = lambda lm: distributed.sharded_frozen_copy(
                lm, lambda: load_lm(path, self.kind, cfg.model.revision)
            )
        self.algo = algorithms.build(cfg.algorithm.id, cfg=cfg.algorithm)
        self.compiler: BlockCompiler | None = None
        if cfg.model.compile:
            problems = compile_errors(cfg.to_dict())
            if problems:
                raise ValueError("; ".join(f"{field}: {msg}" for field, msg in problems))
            check_compiler(self.device)
            self.compiler = BlockCompiler([self.policy.lm, self.policy.critic])
        self.ref_path = cfg.model.reference_name_or_path
        self.ref_lm: Any | None = None
        self.ref_offload: OffloadedWeights | None = None  # model.offload_reference
        self.kl_ctl = None
        self.optimizer = None
        self.reward_fn = None
        self.train_samples: list[Any] | None = None
        self.eval_samples: list[Any] | None = None
        self.iteration = 0
        self.sft_step = 0
        self.sft_done = False
        self.history: list[dict[str, float]] = []
        self.last_eval: dict[str, float] = {}
        self.final_eval: tuple[dict[str, float], list[dict[str, Any]], dict[str, float]] | None = None
        self.last_checkpoint: Path | None = None

    # ----------------------------------------------------------------- what algorithms may use
    # ``engine.algorithms.base.TrainerView``: cfg, iteration, policy, optimizer, tokenizer, device,
    # ref_lm, scaler (attributes set in __init__ and run) and the two methods below.
    def autocast(self) -> contextlib.AbstractContextManager:
        """The run's mixed-precision context for a forward pass (``engine.models.precision``)."""
        return autocast(self.device, self.amp)

    def prompts_for(self, iteration: int) -> list[Any]:
        """The samples of one iteration (every rank's; ``train.prompts_per_iter`` of them), in the
        run's seeded per-epoch order, so a resumed run continues the same sequence."""
        return self._prompts_for(iteration)  # bench/engine_step.py replaces this for a fixed workload

    # ----------------------------------------------------------------- helpers
    @property
    def wants_rl(self) -> bool:
        return self.algo.is_rl and self.cfg.train.n_iters > 0

    @property
    def wants_sft(self) -> bool:
        return self.cfg.supervised.enabled or not self.algo.is_rl

    def _train_samples(self) -> list[Any]:
        if self.train_samples is None:
            self.train_samples = load_split(self.cfg, "train")
        return self.train_samples

    def _sft_samples(self) -> list[Any]:
        """SFT data: ``supervised.task`` when set (e.g. positive reviews only), else the run's task."""
        task = self.cfg.supervised.task
        if task is None:
            return self._train_samples()
        return load_task(task, "train")

    def _eval_samples(self) -> list[Any]:
        if self.eval_samples is None:
            self.eval_samples = load_split(self.cfg, self.cfg.eval.split)
        return self.eval_samples

    def _prompts_for(self, iteration: int) -> list[Any]:
        """Prompts of one iteration: a stream of per-epoch shuffles, cut in ``prompts_per_iter`` slices."""
        data = self._train_samples()
        n, k = len(data), self.cfg.train.prompts_per_iter
        out = []
        pos = iteration * k
        while len(out) < k:
            epoch, offset = divmod(pos, n)
            perm = list(range(n))
            random.Random(_mix(self.cfg.train.seed, epoch, 17)).shuffle(perm)
            take = min(k - len(out), n - offset)
            out.extend(data[i] for i in perm[offset : offset + take])
            pos += take
        return out

    def _make_rl_optimizer(self) -> torch.optim.Optimizer:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        own = self.algo.make_optimizer(params)  # e.g. A2C's RMSprop; None = AdamW
        if own is not None:
            return own
        return torch.optim.AdamW(
            params, lr=self.cfg.algorithm.learning_rate, weight_decay=self.cfg.algorithm.weight_decay
        )

    @property
    def lora(self) -> bool:
        return self.cfg.model.lora.enabled

    def _reference_of_policy(self) -> Any:
        """The starting policy as a frozen reference: a copy, or with LoRA the adapter switched off."""
        if self.lora:
            return AdapterDisabledReference(self.policy.lm)
        return self.frozen_copy(self.policy.lm)

    def _param_drift(self) -> dict[str, float]:
        """``policy/param_drift``: ‖θ − θ₀‖ / ‖θ₀‖ of the language model's weights against the frozen
        reference (the policy at the start of RL). Why: a scaled learning rate is only comparable with
        RL4LMs's if the drift it causes is (docs/reproduction.md, "Learning rate"); measured, not argued.
        Under FSDP each rank sums its own shards (policy and reference are sharded alike) and the sums
        are all-reduced. Skipped where the reference is not the starting policy's copy (LoRA, another model)."""
        ref = self.ref_lm
        if ref is None or self.lora or self.ref_path or not hasattr(ref, "named_parameters"):
            return {}
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        with torch.no_grad(), self._reference() as ref:
            ref_params = dict(ref.named_parameters())
            for name, p in self.policy.lm.named_parameters():
                p0 = ref_params.get(name)
                if p0 is None:
                    continue
                a, b = p.detach(), p0.detach()
                a = a.to_local() if hasattr(a, "to_local") else a  # an FSDP shard (DTensor)
                b = b.to_local() if hasattr(b, "to_local") else b
                if a.shape != b.shape:
                    continue
                _add_drift_sums(sums, a, b)
        if distributed.is_sharded():
            sums = distributed.all_sum(sums)
        diff, base = float(sums[0]), float(sums[1])
        return {"policy/param_drift": math.sqrt(diff / base)} if base > 0 else {}

    def _policy_state(self) -> dict[str, Any]:
        """What a checkpoint stores of the policy: everything, or with LoRA the adapter and value head.
        Sharded (FSDP): the gathered full state dict, on rank 0 only; every rank must call this."""
        if self.lora:
            return trainable_state(self.policy)
        return distributed.full_state(self.policy)

    def _setup_reference(self) -> None:
        self._load_reference()
        if self.cfg.model.offload_reference and self.ref_lm is not None and self.ref_offload is None:
            ref_file = self.run_dir / "checkpoints" / "reference.pt"
            if not self.ref_path and distributed.is_main() and ref_file.is_file():
                # Supervised + RL: rank 0 has just written (or resumed from) the supervised reference
                # for resumes; it is the offload file already, so the disk holds one copy, not two.
                self.ref_offload = OffloadedWeights(self.ref_lm, ref_file, existing=True)
                return
            # one file per rank: the ranks of a one-host DDP run share the run folder
            name = f"reference-rank{distributed.current().rank}.pt"
            self.ref_offload = OffloadedWeights(self.ref_lm, self.run_dir / "offload" / name)

    @contextlib.contextmanager
    def _reference(self) -> Iterator[Any]:
        """The reference for one use: as it is, or read back from its file (``model.offload_reference``)."""
        if self.ref_offload is None:
            yield self.ref_lm
            return
        with self.ref_offload.loaded() as ref:
            yield ref

    def _load_reference(self) -> None:
        if self.ref_lm is not None or not self.algo.needs_reference:
            return  # critic-free algorithms with beta 0 never load a reference
        if self.ref_path:
            self.ref_lm = self.frozen_copy(load_lm(resolve_model_path(self.ref_path), self.kind)).to(
                self.device
            )
            return
        if self.lora:  # the base model with the adapter off: no copy, nothing to save for resumes
            self.ref_lm = self._reference_of_policy()
            return
        ref_file = self.run_dir / "checkpoints" / "reference.pt"
        self.ref_lm = self.frozen_copy(self.policy.lm)
        if distributed.is_sharded():  # every rank loads, or gathers for rank 0 to save
            if ref_file.exists() and self.resume_from:
                distributed.load_full_state(
                    self.ref_lm, torch.load(ref_file, map_location="cpu", weights_only=True)
                )
            elif self.sft_done and self.cfg.supervised.enabled:
                state = distributed.full_state(self.ref_lm)
                if distributed.is_main():
                    ref_file.parent.mkdir(parents=True, exist_ok=True)
                    torch.save(state, ref_file)
            return
        # Only rank 0 writes the file; the other ranks hold the same weights already, and read the
        # file only when resuming (never while rank 0 may be writing it).
        if ref_file.exists() and (distributed.is_main() or self.resume_from):
            self.ref_lm.load_state_dict(torch.load(ref_file, map_location=self.device, weights_only=True))
        elif self.sft_done and self.cfg.supervised.enabled and distributed.is_main():
            # The reference of "supervised + RL" is the supervised model; keep it for resumes.
            ref_file.parent.mkdir(parents=True, exist_ok=True)
            torch.save(self.ref_lm.state_dict(), ref_file)

    # ----------------------------------------------------------------- checkpoints
    def save_checkpoint(self, phase: str, sft_optimizer: Any = None) -> Path:
        ck_root = self.run_dir / "checkpoints"
        ck_root.mkdir(parents=True, exist_ok=True)
        name = f"{phase}-{(self.iteration if phase == 'rl' else self.sft_step):06d}"
        final = ck_root / name
        self.last_checkpoint = final
        # Sharded (FSDP): every rank takes part in gathering the full states for rank 0.
        policy_state = self._policy_state()
        optimizer_state = (
            distributed.optimizer_state(self.policy, self.optimizer) if self.optimizer is not None else None
        )
        sft_state = (
            distributed.optimizer_state(self.policy.lm, sft_optimizer) if sft_optimizer is not None else None
        )
        if not distributed.is_main():
            return final  # rank 0 writes the (identical, or gathered) state of every rank
        tmp = ck_root / f".tmp-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        with writing(final, "the checkpoint", partial=tmp):  # a full disk says so; no partial files
            tmp.mkdir()
            self._write_checkpoint(tmp, phase, policy_state, optimizer_state, sft_state)
        # Everything reported up to here is stored before this checkpoint can be resumed from: a resume
        # starts after its step, so a step whose metrics were still queued would be missing for good.
        self.events.flush()
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        pointer_tmp = ck_root / ".latest.json"
        pointer_tmp.write_text(json.dumps({"name": name}))
        os.replace(pointer_tmp, ck_root / "latest.json")
        kept = sorted(
            (p for p in ck_root.iterdir() if p.is_dir() and not p.name.startswith(".")),
            key=lambda p: (p.name.startswith("rl-"), p.name),
        )
        for old in kept[: -self.cfg.train.keep_checkpoints]:
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
        self.events.checkpoint(self.iteration if phase == "rl" else self.sft_step, str(final))
        return final

    def _write_checkpoint(
        self, tmp: Path, phase: str, policy_state: Any, optimizer_state: Any, sft_state: Any
    ) -> None:
        state = {
            "phase": phase,
            "iteration": self.iteration,
            "sft_step": self.sft_step,
            "sft_done": self.sft_done,
            "policy": policy_state,
            "optimizer": optimizer_state,
            "sft_optimizer": sft_state,
            # optimizer states of FSDP runs are keyed by parameter name, DDP's by index
            "strategy": "fsdp" if distributed.is_sharded() else "ddp",
            "kl": _plain(self.kl_ctl.state_dict()) if self.kl_ctl is not None else None,
            "algorithm": _plain(self.algo.state_dict()),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": _rng_state(),
            "last_eval": _plain(self.last_eval),
        }
        torch.save(state, tmp / STATE_FILE)
        (tmp / "trainer_state.json").write_text(
            json.dumps({"phase": phase, "iteration": self.iteration, "sft_step": self.sft_step}, indent=2)
        )

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        sharded = distributed.is_sharded()
        try:  # tensors and plain containers only: a pickle in a checkpoint must never run code
            state = torch.load(
                path / STATE_FILE, map_location="cpu" if sharded else self.device, weights_only=True
            )
        except Exception as exc:
            raise CheckpointError(
                f"{path / STATE_FILE}: refusing to load: not a safe checkpoint (tensors and plain values "
                f"only; tampered, or written by an older version): {str(exc).splitlines()[0][:300]}"
            ) from None
        written = state.get("strategy", "ddp")
        if written != ("fsdp" if sharded else "ddp"):
            raise CheckpointError(
                f"{path}: written with resources.strategy {written!r}; resume it with the same strategy "
                "(the optimizer states of the two are stored differently)"
            )
        if self.lora:
            load_trainable_state(self.policy, state["policy"])
        else:
            distributed.load_full_state(self.policy, state["policy"])
        self.iteration = int(state["iteration"])
        self.sft_step = int(state["sft_step"])
        self.sft_done = bool(state["sft_done"])
        self.last_eval = state.get("last_eval") or {}
        return state

    # ----------------------------------------------------------------- SFT
    def run_sft(self, resume_state: dict[str, Any] | None) -> bool:
        """Supervised phase; returns False when stopped early (a checkpoint was written)."""
        sc = self.cfg.supervised
        task_id = (sc.task or self.cfg.task).id
        pairs = sft_pairs(self._sft_samples())
        if not pairs:
            where = "supervised.task" if sc.task is not None else "task"
            raise ValueError(f"supervised fine-tuning needs references, but {where} {task_id!r} has none")
        schedule = sft_schedule(len(pairs), sc.batch_size, sc.epochs, self.cfg.train.seed, sc.max_steps)
        self.events.log(
            f"supervised fine-tuning on task {task_id!r}: {len(pairs)} (prompt, reference) pairs, "
            f"{len(schedule)} steps"
        )
        opt = torch.optim.AdamW(
            [p for p in self.policy.lm.parameters() if p.requires_grad], lr=sc.learning_rate, weight_decay=0.0
        )
        if resume_state is not None and resume_state.get("sft_optimizer") is not None:
            distributed.load_optimizer_state(self.policy.lm, opt, resume_state["sft_optimizer"])
        total = len(schedule)
        t_start = time.perf_counter()
        done_here = 0
        self.events.progress(self.sft_step, total, None, "sft")
        self.policy.train()
        for step in range(self.sft_step, total):
            if self._stop_requested():
                self.save_checkpoint("sft", sft_optimizer=opt)
                return False
            batch = build_sft_batch(
                self.tokenizer,
                [pairs[i] for i in _rank_rows(schedule[step])],
                self.kind == "seq2seq",
                self.cfg.tokenizer.max_prompt_length,
                sc.max_target_length,
                self.device,
            )
            opt.zero_grad(set_to_none=True)
            with self.autocast():
                loss = sft_loss(self.policy.lm, self.kind == "seq2seq", batch)
            loss.backward()
            distributed.sync_gradients([p for p in self.policy.lm.parameters() if p.requires_grad])
            gnorm = torch.nn.utils.clip_grad_norm_(
                self.policy.lm.parameters(), self.cfg.algorithm.max_grad_norm * 2
            )
            opt.step()
            self.sft_step = step + 1
            done_here += 1
            self.events.metrics(
                self.sft_step,
                {"sft/loss": distributed.all_mean(loss.detach()), "sft/grad_norm": float(gnorm)},
            )
            elapsed = time.perf_counter() - t_start
            eta = elapsed / done_here * (total - self.sft_step)
            self.events.progress(self.sft_step, total, eta, "sft")
        self.sft_done = True
        return True

    # ----------------------------------------------------------------- RL
    def _eval(self, step: int, final: bool = False) -> dict[str, float]:
        """Generate on the eval split; all rows go to the sink at the end, ``log_samples`` rows before.

        Distributed runs evaluate on rank 0 only (the others wait at their next collective); sharded
        ones first gather the whole policy on every rank, so rank 0 generates without collectives.
        """
        with distributed.unsharded(self.policy):  # a no-op unless sharded
            return self._eval_main(step, final)

    def _eval_main(self, step: int, final: bool) -> dict[str, float]:
        if not distributed.is_main():
            return {}
        samples = self._eval_samples()
        masked = self.algo.uses_masking_policy and self.cfg.algorithm.nlpo.masked_eval
        timings: dict[str, float] = {}
        started = time.perf_counter()
        gens = generate_texts(
            self.policy.lm,
            self.policy.is_seq2seq,
            self.tokenizer,
            [s.prompt for s in samples],
            self.cfg.eval.generation,
            self.cfg.tokenizer.max_prompt_length,
            self.device,
            self.amp,
            seed=_mix(self.cfg.train.seed, step, 99),
            decoder_start_id=self.policy.decoder_start_id,
            masking_lm=self.algo.masking_model() if masked else None,
            nlpo=self.cfg.algorithm.nlpo if masked else None,
        )
        timings["generate"] = time.perf_counter() - started
        corpus, rows = score_generations(
            samples,
            gens,
            self.reward_fn,
            list(self.cfg.eval.metrics),
            policy=PolicyContext(self.policy.lm, self.policy.is_seq2seq, self.tokenizer, self.device),
            timings=timings,
        )
        values = {f"eval/{k}": v for k, v in corpus.items()}
        self.events.metrics(step, values)
        self.events.samples(step, self.cfg.eval.split, rows if final else rows[: self.cfg.train.log_samples])
        self.last_eval = values
        if final:
            self.final_eval = (corpus, rows, timings)
        return values

    # ----------------------------------------------------------------- one iteration
    def rl_iteration(self) -> dict[str, float]:
        """One on-policy iteration, top to bottom: rollout -> score -> advantages -> update -> adapt the
        KL coefficient -> log. Each step is a method below, in this order.

        Every random draw is seeded from ``(train.seed, iteration, k)`` (k = 1: sampling, 2: the
        minibatch shuffles), so a run resumed from its checkpoint repeats the same iteration."""
        t0 = time.perf_counter()
        it = self.iteration
        timings: dict[str, float] = {}
        self.algo.on_iteration_start(it, self.policy)
        batch, temperature = self._rollout(it, timings)
        scores, task_r = self._score(batch, timings)
        beta = float(self.kl_ctl.value)
        adv, ret, rewards = self._advantages(task_r, batch, beta)
        stats = self._update(batch, adv, ret, temperature, it, timings)
        seq_kl, token_kl, glob = self._adapt_kl(task_r, rewards, batch, ret)
        self.iteration = it + 1
        metrics = {
            **self._batch_metrics(task_r, rewards, batch, ret, beta, seq_kl, token_kl),
            **stats,
            **self._param_drift(),
            **_time_metrics(timings, t0),
        }
        if glob:  # algorithm statistics and timings: mean over ranks; batch statistics: exact
            metrics = {**distributed.mean_dict(metrics), **glob}
        self.events.metrics(self.iteration, metrics)
        self._log_train_samples(batch, scores)
        return metrics

    def _rollout(self, it: int, timings: dict[str, float]) -> tuple[RolloutBatch, float]:
        """Generate this rank's episodes of iteration ``it`` and score them under the policy, its value
        function and the reference; returns the batch and the sampling temperature."""
        cfg = self.cfg
        spec = SamplingSpec.from_config(
            cfg.rollout,
            self.tokenizer.eos_token_id,
            cfg.algorithm.nlpo if self.algo.uses_masking_policy else None,
            special_ids=self.tokenizer.all_special_ids,
        )
        gen = torch.Generator(device=self.device).manual_seed(_mix(cfg.train.seed, it, 1))
        samples, seeds = self._rollout_samples(it)
        group_size = self.algo.group_size
        # Sharded (FSDP): every rank gathers the whole policy once for generation, in which ranks
        # run different numbers of steps (distributed.unsharded).
        with distributed.unsharded(self.policy), self._reference() as ref_lm:
            batch = collect(
                self.policy,
                ref_lm,
                self.tokenizer,
                samples,
                spec,
                cfg.tokenizer.max_prompt_length,
                cfg.rollout.batch_size,
                self.device,
                generator=gen,
                masking_lm=self.algo.masking_model(),
                autocast_dtype=self.amp,
                timings=timings,
                kl_estimator=cfg.kl.estimator,
                # a one-step critic-free update scores the policy in its own forward (group.py)
                score_policy=self.algo.needs_rollout_scores(len(samples)),
                sample_seeds=seeds,
                share_prompts=group_size > 1,  # a group's G completions share one prompt pass
                score_context=self._score_context if self.compiler else None,
            )
        return batch, spec.temperature

    def _score_context(self) -> Any:
        """model.compile: the compiled blocks for the rollout's scoring pass, the reference's included
        (made after the policy, or replaced by a supervised warm start)."""
        if self.compiler is not None:
            self.compiler.add(self.ref_lm)
        return compiled_blocks(self.compiler)

    def _rollout_samples(self, it: int) -> tuple[list[Any], list[int] | None]:
        """This rank's samples of iteration ``it`` (G consecutive copies of each prompt for a group
        algorithm) and their per-sample noise seeds (None: the batch generator samples)."""
        group_size = self.algo.group_size
        samples = self.prompts_for(it)
        if group_size > 1:
            samples = [s for s in samples for _ in range(group_size)]
        # This rank's share (whole groups), and one noise seed per sample of the *global* batch, so a
        # config written for N processes samples the same episodes on 1 or N of them. One-process
        # configs keep the batch generator: with per-sample noise the PPO learning run of
        # tests/engine/test_learning.py (seed 0) did not take off within its 10 iterations, where the
        # generator's stream did (docs/engine.md, "Distributed runs").
        lo, hi = distributed.share(len(samples) // group_size, "train.prompts_per_iter")
        lo, hi = lo * group_size, hi * group_size
        per_sample = distributed.is_active() or self.cfg.resources.processes > 1
        seeds = [_mix(self.cfg.train.seed, it, 1, i) for i in range(lo, hi)] if per_sample else None
        return samples[lo:hi], seeds

    def _score(self, batch: RolloutBatch, timings: dict[str, float]) -> tuple[list[Any], torch.Tensor]:
        """The task reward of every episode: as the reward returned them (logged with the samples) and
        as a (B,) tensor."""
        t_reward = time.perf_counter()
        scores = self.reward_fn(batch.prompts, batch.generations, batch.references, batch.meta)
        task_r = torch.tensor([float(s) for s in scores], dtype=torch.float32, device=self.device)
        timings["reward"] = time.perf_counter() - t_reward
        return scores, task_r

    def _advantages(
        self, task_r: torch.Tensor, batch: RolloutBatch, beta: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(advantages, returns, per-token rewards): GAE on the KL-shaped rewards for an actor-critic
        algorithm; a critic-free one computes its own (its returns are its advantages)."""
        if not self.algo.uses_critic:  # GRPO, RLOO, REINFORCE++: no value, no GAE
            adv, rewards = self.algo.advantages(task_r, batch)
            return adv, adv, rewards
        mask, a = batch.gen_mask, self.cfg.algorithm
        # The penalty's KL is between the full tempered distributions (batch.kl, kl.estimator); the
        # stored support only serves the PPO ratio.
        rewards, _ = kl_penalty_rewards(task_r, batch.kl, mask, beta)
        adv, ret = gae(rewards, batch.values, mask, a.gamma, a.gae_lambda)
        if a.whiten_advantages and not self.algo.whitens_per_minibatch:
            adv = whiten(adv, mask)  # PPO/NLPO normalise each minibatch instead (SB3)
        return adv, ret, rewards

    def _update(
        self,
        batch: RolloutBatch,
        adv: torch.Tensor,
        ret: torch.Tensor,
        temperature: float,
        it: int,
        timings: dict[str, float],
    ) -> dict[str, float]:
        """The algorithm's update on the batch; returns its statistics."""
        t_update = time.perf_counter()
        shuffle = torch.Generator().manual_seed(_mix(self.cfg.train.seed, it, 2))
        with compiled_blocks(self.compiler):  # model.compile: compiled blocks for the update only
            stats = self.algo.update(
                self.policy,
                self.optimizer,
                batch,
                advantages=adv,
                returns=ret,
                generator=shuffle,
                temperature=temperature,
                autocast_dtype=self.amp,
                scaler=self.scaler,
            )
        timings["update"] = time.perf_counter() - t_update
        return stats

    def _adapt_kl(
        self, task_r: torch.Tensor, rewards: torch.Tensor, batch: RolloutBatch, ret: torch.Tensor
    ) -> tuple[torch.Tensor, float, dict[str, Any]]:
        """Feed the iteration's KL to the KL controller; returns (per-episode KL, per-token mean KL,
        the batch statistics over every rank: empty for one process)."""
        mask = batch.gen_mask
        # Read after the update: a rollout that skipped the policy's scoring pass gets its KL from it.
        kl = batch.kl * mask
        seq_kl = kl.sum(1)
        token_kl = float(masked_mean(kl, mask))
        glob = self._global_stats(task_r, kl, mask, rewards, batch, ret, self.algo.uses_critic)
        if glob:  # several ranks: the controller and the metrics see the whole batch
            seq_kl, token_kl = glob.pop("seq_kl"), float(glob["train/kl"])
        # Each controller reads the KL in its own units (RL4LMs's: per-token mean; Ziegler's: per episode).
        per_episode = getattr(self.kl_ctl, "unit", "episode") == "episode"
        n_global = len(batch) * distributed.current().world_size
        self.kl_ctl.update(float(seq_kl.mean()) if per_episode else token_kl, n_global)
        return seq_kl, token_kl, glob

    def _batch_metrics(
        self,
        task_r: torch.Tensor,
        rewards: torch.Tensor,
        batch: RolloutBatch,
        ret: torch.Tensor,
        beta: float,
        seq_kl: torch.Tensor,
        token_kl: float,
    ) -> dict[str, float]:
        """The rollout's statistics on this rank (a distributed run overwrites them with every rank's)."""
        mask = batch.gen_mask
        return {
            "train/reward_mean": float(task_r.mean()),
            "train/reward_std": float(task_r.std(unbiased=False)),
            "train/kl": token_kl,
            "train/kl_episode": float(seq_kl.mean()),
            "train/kl_coef": beta,
            "train/entropy": float(masked_mean(batch.entropy, mask)),
            **_support_stats(batch.support, mask),
            "train/episode_length": float(mask.sum(1).mean()),
            "train/shaped_return": float(rewards.sum(1).mean()),
            # a critic-free algorithm (GRPO, RLOO, REINFORCE++) has no value to report: no value/* keys,
            # so that no chart shows a line of zeros
            **(
                {
                    "value/mean": float(masked_mean(batch.values, mask)),
                    "value/explained_var": explained_variance(batch.values, ret, mask),
                }
                if self.algo.uses_critic
                else {}
            ),
        }

    def _log_train_samples(self, batch: RolloutBatch, scores: list[Any]) -> None:
        """The first ``train.log_samples`` episodes with their rewards (and the reward's details)."""
        n_log = min(self.cfg.train.log_samples, len(batch))
        if not n_log:
            return
        extra = reward_details(
            self.reward_fn,
            batch.prompts[:n_log],
            batch.generations[:n_log],
            batch.references[:n_log],
            batch.meta[:n_log],
        )
        rows = [
            {
                "sample_id": batch.ids[i],
                "prompt": batch.prompts[i],
                "generation": batch.generations[i],
                "references": batch.references[i],
                "reward": float(scores[i]),
                **({"metrics": extra[i]} if extra[i] else {}),
            }
            for i in range(n_log)
        ]
        self.events.samples(self.iteration, "train", rows)

    def offline_iteration(self) -> dict[str, float]:
        """One iteration of an offline algorithm (DPO): no rollout, the algorithm steps on its pairs
        through the trainer's public view (``engine.algorithms.base.TrainerView``)."""
        t0 = time.perf_counter()
        metrics = self.algo.offline_iteration(self)
        self.iteration += 1
        metrics["time/iteration_s"] = time.perf_counter() - t0
        self.events.metrics(self.iteration, metrics)
        return metrics

    def _global_stats(
        self,
        task_r: torch.Tensor,
        kl: torch.Tensor,
        mask: torch.Tensor,
        rewards: torch.Tensor,
        batch: Any,
        ret: torch.Tensor,
        has_critic: bool,
    ) -> dict[str, Any]:
        """The iteration's batch statistics over every rank (empty for one process): the same
        numbers one process computes on the whole batch, up to summation order."""
        if not distributed.is_active():
            return {}
        task_all = distributed.gather_rows(task_r)
        seq_kl = distributed.gather_rows(kl.sum(1))
        return {
            "seq_kl": seq_kl,
            "train/reward_mean": float(task_all.mean()),
            "train/reward_std": float(task_all.std(unbiased=False)),
            "train/kl": float(distributed.masked_mean(kl, mask)),
            "train/kl_episode": float(seq_kl.mean()),
            "train/entropy": float(distributed.masked_mean(batch.entropy, mask)),
            "train/episode_length": float(distributed.gather_rows(mask.sum(1)).mean()),
            "train/shaped_return": float(distributed.gather_rows(rewards.sum(1)).mean()),
            **(
                {
                    "value/mean": float(distributed.masked_mean(batch.values, mask)),
                    "value/explained_var": distributed.explained_variance(batch.values, ret, mask),
                }
                if has_critic
                else {}
            ),
        }

    def _stop_requested(self) -> bool:
        """Rank 0 asks ``should_stop`` and every rank gets its answer, so all stop at the same step."""
        return distributed.broadcast_flag(bool(self.should_stop()) if distributed.is_main() else False)

    def _record_ranks(self) -> None:
        """``ranks.json`` (host, pid, device of every rank) and a log line: where the run runs."""
        group = distributed.current()
        ranks = distributed.all_gather_objects(distributed.host_info(self.device))
        if not group.active or not group.is_main:
            return
        (self.run_dir / "ranks.json").write_text(
            json.dumps({"backend": group.backend, "ranks": ranks}, indent=2)
        )
        hosts = sorted({r["host"] for r in ranks})
        self.events.log(
            f"distributed: {group.world_size} processes ({group.backend}) on {', '.join(hosts)}: "
            + ", ".join(f"rank {r['rank']} pid {r['pid']} {r['device']}" for r in ranks)
        )

    # ----------------------------------------------------------------- main
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.events.run_started(cfg.to_dict(), str(self.run_dir))
        self._record_ranks()
        if self.wants_rl and not self.ref_path and not self.wants_sft and self.algo.needs_reference:
            # The reference is the initial model: copy it before a checkpoint overwrites the policy.
            self.ref_lm = self._reference_of_policy()
        resume_state = None
        if self.resume_from:
            ck = latest_checkpoint(self.run_dir)
            if ck is None:
                self.events.log(f"no checkpoint in {self.run_dir}; starting from scratch")
            else:
                resume_state = self.load_checkpoint(ck)
                if self.run_sink is not None:
                    self.run_sink.truncate_after(self.iteration)
                self.events.log(f"resumed from {ck}")
                finished = resume_state["phase"] == "rl" and self.iteration >= cfg.train.n_iters
                if finished and (not cfg.train.save_final_model or (self.run_dir / "model").is_dir()):
                    return self._finish(stopped=False, model_saved=True)
        self.algo.setup(self.policy)
        stopped = False
        if self.wants_sft and not self.sft_done:
            ok = self.run_sft(resume_state if resume_state and resume_state["phase"] == "sft" else None)
            if not ok:
                return self._finish(stopped=True)
        if self.wants_rl:
            if self.algo.uses_masking_policy:
                self.algo.setup(self.policy)  # masking policy starts as the (warm-started) policy
            self.reward_fn = build_reward_fn(cfg)
            self._setup_reference()
            self.kl_ctl = build_kl_controller(cfg.kl)
            self.optimizer = self._make_rl_optimizer()
            if resume_state is not None and resume_state["phase"] == "rl":
                if resume_state.get("optimizer") is not None:
                    distributed.load_optimizer_state(self.policy, self.optimizer, resume_state["optimizer"])
                if resume_state.get("kl") is not None:
                    self.kl_ctl.load_state_dict(resume_state["kl"])
                self.algo.load_state_dict(resume_state.get("algorithm") or {})
                if self.scaler is not None and resume_state.get("scaler") is not None:
                    self.scaler.load_state_dict(resume_state["scaler"])
                _set_rng_state(resume_state["rng"])  # rank 0's state
                if distributed.current().rank > 0:
                    _seed_all(_mix(cfg.train.seed, distributed.current().rank, self.iteration, 7))
            total = cfg.train.n_iters
            resumed_rl = resume_state is not None and resume_state["phase"] == "rl"
            if cfg.train.eval_at_start and self.iteration == 0 and not resumed_rl:
                # RL4LMs evaluates before its first iteration; a run resumed in RL has that point already.
                self._eval(0)
            t_start = time.perf_counter()
            start_it = self.iteration
            self.events.progress(self.iteration, total, None, "rl")
            while self.iteration < total:
                if self._stop_requested():
                    stopped = True
                    break
                # DPO: no rollout
                self.history.append(self.offline_iteration() if self.algo.offline else self.rl_iteration())
                done = self.iteration - start_it
                eta = (time.perf_counter() - t_start) / done * (total - self.iteration)
                self.events.progress(self.iteration, total, eta, "rl")
                if cfg.train.eval_every > 0 and self.iteration % cfg.train.eval_every == 0:
                    self._eval(self.iteration, final=self.iteration == total)
                last = self.iteration == total
                if cfg.train.save_every > 0 and self.iteration % cfg.train.save_every == 0 and not last:
                    self.save_checkpoint("rl")
            if stopped:
                self.save_checkpoint("rl")
                return self._finish(stopped=True)
            if cfg.train.eval_every == 0 or self.iteration % cfg.train.eval_every != 0:
                self._eval(self.iteration, final=True)
            self.save_checkpoint("rl")
        else:
            self.reward_fn = build_reward_fn(cfg)
            self._eval(self.iteration, final=True)
            self.save_checkpoint("sft")
        return self._finish(stopped=False)

    def _finish(self, stopped: bool, model_saved: bool = False) -> dict[str, Any]:
        model_dir = None
        if not stopped and self.cfg.train.save_final_model:
            model_dir = self.run_dir / "model"
            if not model_saved:
                self.save_model(model_dir)
        summary: dict[str, Any] = {
            "run_dir": str(self.run_dir),
            "stopped": stopped,
            "iterations": self.iteration,
            "sft_steps": self.sft_step,
            "model_dir": str(model_dir) if model_dir else None,
            "final_metrics": self.history[-1] if self.history else {},
            "eval": self.last_eval,
        }
        if not stopped and self.final_eval is not None:
            summary["eval_results"] = str(self._write_eval_results(model_dir))
        self.events.finished(summary)
        return summary

    def _write_eval_results(self, model_dir: Path | None) -> Path:
        """The final evaluation in the format of ``python -m engine eval --output``, so a run and a
        later re-evaluation of its model compare file to file."""
        corpus, rows, timings = self.final_eval
        if model_dir is not None:
            model = str(model_dir)
        elif self.iteration or self.sft_step:
            model = str(self.last_checkpoint)  # trained, but the HF model was not saved
        else:
            model = self.cfg.model.name_or_path  # zero-shot: the evaluated model is the config's
        return write_eval_results(
            self.run_dir / "eval_results.json",
            eval_results(self.cfg.eval.split, model, corpus, rows, timings),
        )

    def save_model(self, out: Path) -> None:
        """HF format (``from_pretrained`` works) plus the value head, for reuse as a warm start.
        Sharded (FSDP): every rank gathers the full state dicts (a collective); rank 0 writes them."""
        from safetensors.torch import save_file

        sharded = distributed.is_sharded()
        lm_state = distributed.full_state(self.policy.lm) if sharded else None
        head_state = distributed.full_state(self.policy.value_head)
        if not distributed.is_main():
            return
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with writing(out, "the model", partial=tmp):
            if self.lora:
                save_lora_model(self.policy.lm, tmp, self.cfg.model.lora.save)
            else:
                self.policy.lm.save_pretrained(str(tmp), **({"state_dict": lm_state} if sharded else {}))
            self.tokenizer.save_pretrained(str(tmp))
            save_file({k: v.contiguous() for k, v in head_state.items()}, str(tmp / "value_head.safetensors"))
        shutil.rmtree(out, ignore_errors=True)
        os.rename(tmp, out)


def _oom_hint(cfg: RunConfig) -> str:
    return (
        "out of memory: reduce rollout.batch_size (now "
        f"{cfg.rollout.batch_size}), algorithm.minibatch_size (now {cfg.algorithm.minibatch_size}) with "
        "algorithm.grad_accumulation to keep the effective batch, train.prompts_per_iter, "
        "rollout.max_new_tokens or tokenizer.max_prompt_length; or enable model.gradient_checkpointing"
    )


def train(
    config: RunConfig | dict[str, Any],
    sink: Any = None,
    should_stop: Any = None,
    resume_from: str | None = None,
) -> dict[str, Any]:
    """Run a config end to end; with ``resume_from`` continue the run directory's latest checkpoint."""
    cfg = parse_config(config)
    check_trackers(cfg.train.report_to)  # a missing tracker package fails before anything is written
    if resume_from:
        run_dir = Path(resume_from)
        if not run_dir.is_dir():
            raise FileNotFoundError(f"run directory to resume not found: {run_dir}")
    elif cfg.train.output_dir:
        run_dir = Path(cfg.train.output_dir)
    else:
        run_dir = default_run_dir(cfg)
    metrics_file = run_dir / "metrics.jsonl"
    if not resume_from and (
        (run_dir / "checkpoints" / "latest.json").exists()
        or (metrics_file.exists() and metrics_file.stat().st_size)
    ):
        raise FileExistsError(
            f"{run_dir} already holds a run: continue it with resume_from={str(run_dir)!r} "
            f"(CLI: --resume {run_dir}) or choose another train.output_dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    # Under torchrun: join the process group; only rank 0 writes the run directory and sends events.
    distributed.setup(
        resolve_device(cfg.model.device), cfg.resources.collective_timeout_s, cfg.resources.strategy
    )
    main = distributed.is_main()
    run_sink = RunDirSink(run_dir) if main else None
    events = MultiSink(run_sink, sink) if main else NullSink()
    if main and cfg.train.report_to:
        # Trackers first: at the end they flush (bounded) and their warnings still reach the run's log.
        exports = build_trackers(
            cfg.train.report_to, cfg.train.trackers.model_dump(), cfg.to_dict(), run_dir, warn=events.log
        )
        events = MultiSink(*exports, events)
    trainer: Trainer | None = None
    try:
        trainer = Trainer(cfg, events, run_dir, run_sink, should_stop=should_stop, resume_from=resume_from)
        result = trainer.run()
        # The ranks leave together: a rank that destroys the process group while its peer still finishes
        # (rank 0 writes the final model and events) can leave gloo work threads holding tensors at
        # interpreter exit, which aborted a process under load ("terminate called without an active
        # exception"). A no-op for one process.
        distributed.barrier()
        return result
    except torch.OutOfMemoryError as exc:
        msg = _oom_hint(cfg)
        events.failed(msg, tb.format_exc())
        raise OutOfMemoryHint(msg) from exc
    except Exception as exc:
        events.failed(f"{type(exc).__name__}: {exc}", tb.format_exc())
        raise
    finally:
        if trainer is not None and trainer.ref_offload is not None:  # a failed run leaves no copy behind
            trainer.ref_offload.remove()
        distributed.teardown()
