"""One run on several processes: the process group and every collective the engine uses.

``python -m engine train CONFIG`` under ``torchrun --nproc_per_node N`` (or ``--nnodes``) finds
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR`` in its environment; :func:`setup` joins the
group (env:// rendezvous; gloo on the CPU, nccl on CUDA) with a timeout on every collective, so a
rank that dies makes the others fail instead of waiting for ever.

Everything rank-aware lives here so that the trainer and the algorithms stay readable: with one
process every helper is the identity (or the plain local statistic), so single-process runs compute
exactly what they computed before this module existed.

The split of the work (see docs/engine.md, "Distributed runs"):

* each rank rolls out a contiguous share of the iteration's prompts (GRPO/RLOO groups stay whole on
  one rank); sample ``i`` of the *global* batch draws its tokens from noise seeded by
  ``(seed, iteration, i)``, so the samples do not depend on how the batch is split;
* statistics over the whole batch (advantage whitening, GRPO's batch std, the KL controller's mean
  KL, the logged metrics) are all-reduced;
* gradients are averaged over ranks before clipping (:func:`sync_gradients`): the same mean DDP's
  reducer computes, flattened into one bucket per call;
* rank 0 alone writes the run directory, checkpoints and events; it alone asks ``should_stop`` and
  broadcasts the answer.

With ``resources.strategy: fsdp`` the model is sharded instead of replicated (FSDP2
``fully_shard`` per transformer block, :func:`shard_policy`): FSDP's own reduce-scatter averages
the gradients (:func:`sync_gradients` steps aside), generation runs inside :func:`unsharded` (a rank
stops generating when its own episodes end, which sharded forwards, each an all-gather, would not
survive), and checkpoints hold gathered full state dicts (:func:`full_state`), the same files a
DDP run writes for the policy.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard


class DistributedConfigError(ValueError):
    """A config that cannot be split over the processes (names the field to change)."""


@dataclass
class Group:
    """This process's place in the run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    #: True when :func:`setup` created the process group (and :func:`teardown` must destroy it).
    owned: bool = False
    #: ``ddp`` (replicas) or ``fsdp`` (sharded); always ``ddp`` for one process.
    strategy: str = "ddp"
    device_type: str = "cpu"

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.active and self.strategy == "fsdp"


_GROUP = Group()


def current() -> Group:
    return _GROUP


def is_active() -> bool:
    return _GROUP.active


def is_main() -> bool:
    return _GROUP.is_main


def is_sharded() -> bool:
    """True when this run's modules are FSDP-sharded (several processes, ``resources.strategy: fsdp``)."""
    return _GROUP.sharded


def launched_by_torchrun() -> bool:
    """True when the environment describes a multi-process launch (torchrun, torch.distributed.run)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(device: torch.device, timeout_s: float, strategy: str = "ddp") -> Group:
    """Join the process group described by the environment; a no-op for one process.

    The backend follows the device: nccl for CUDA, gloo otherwise (``GRUE_DIST_BACKEND`` overrides).
    ``strategy`` (``resources.strategy``) only matters with several processes: one process holds
    the whole model either way, and every helper stays the identity.
    """
    global _GROUP
    if not launched_by_torchrun():
        _GROUP = Group()
        return _GROUP
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = os.environ.get("GRUE_DIST_BACKEND") or ("nccl" if device.type == "cuda" else "gloo")
    owned = False
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=float(timeout_s)))
        owned = True
    _GROUP = Group(rank, world, local_rank, dist.get_backend(), owned, strategy, device.type)
    return _GROUP


def teardown() -> None:
    global _GROUP, _MESH
    if _GROUP.owned and dist.is_initialized():
        dist.destroy_process_group()
    _GROUP = Group()
    _MESH = None  # the mesh belongs to the process group just destroyed


def device_for(device: torch.device) -> torch.device:
    """The rank's device: ``cuda`` becomes ``cuda:LOCAL_RANK``; the CPU stays the CPU."""
    if _GROUP.active and device.type == "cuda" and device.index is None:
        return torch.device("cuda", _GROUP.local_rank)
    return device


def _comm_device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device()) if _GROUP.backend == "nccl" else torch.device("cpu")
    )


# ----------------------------------------------------------------------------- splitting the work


def share(n: int, field: str) -> tuple[int, int]:
    """``(start, stop)`` of this rank's contiguous share of ``n`` items; ``n`` must divide evenly,
    so every rank does the same number of steps (a rank with less work would wait in a collective)."""
    world = _GROUP.world_size
    if n % world:
        raise DistributedConfigError(
            f"{field} = {n} does not split over {world} processes: make it a multiple of {world}"
        )
    per = n // world
    return _GROUP.rank * per, (_GROUP.rank + 1) * per


# ----------------------------------------------------------------------------- collectives


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (a new tensor on ``t``'s device); ``t`` itself for one process."""
    if not _GROUP.active:
        return t
    buf = t.detach().to(_comm_device(), dtype=torch.float64 if t.is_floating_point() else t.dtype).clone()
    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
    return buf.to(t.device, dtype=t.dtype)


def all_mean(value: float | torch.Tensor) -> float:
    """Mean over ranks of one number (every rank gets the same float, e.g. to take the same branch)."""
    v = float(value)
    if not _GROUP.active:
        return v
    return float(all_sum(torch.tensor(v, dtype=torch.float64))) / _GROUP.world_size


def mean_dict(values: dict[str, float]) -> dict[str, float]:
    """Per-key mean over ranks of a statistics dict with the same keys on every rank (one collective)."""
    if not _GROUP.active or not values:
        return values
    keys = sorted(values)
    summed = all_sum(torch.tensor([float(values[k]) for k in keys], dtype=torch.float64))
    return {k: float(v) / _GROUP.world_size for k, v in zip(keys, summed.tolist())}


def broadcast_flag(flag: bool) -> bool:
    """Rank 0's answer on every rank (stop requests: rank 0 decides)."""
    if not _GROUP.active:
        return bool(flag)
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=_comm_device())
    dist.broadcast(t, src=0)
    return bool(t.item())


def broadcast_module(module: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (as DDP does at construction), so a
    randomly initialised value head starts the same everywhere."""
    if not _GROUP.active:
        return
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            buf = t.detach().to(_comm_device()).clone()
            dist.broadcast(buf, src=0)
            t.copy_(buf.to(t.device))


def gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Rows of every rank concatenated in rank order (the global batch of a per-sample tensor).

    Ranks may hold different numbers of rows and (for (B, T) tensors) different T: rows are padded
    with zeros to the longest T, which is what every (B, T) tensor of a rollout holds after an episode.
    """
    if not _GROUP.active:
        return t
    world = _GROUP.world_size
    dev = _comm_device()
    shape = torch.tensor(list(t.shape), dtype=torch.int64, device=dev)
    shapes = [torch.zeros_like(shape) for _ in range(world)]
    dist.all_gather(shapes, shape)
    shapes_l = [s.tolist() for s in shapes]
    max_shape = [max(s[d] for s in shapes_l) for d in range(t.dim())]
    padded = torch.zeros(max_shape, dtype=t.dtype, device=dev)
    padded[tuple(slice(0, n) for n in t.shape)] = t.detach().to(dev)
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    rows = [p[: s[0]] for p, s in zip(parts, shapes_l)]
    return torch.cat(rows, 0).to(t.device)


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's (small, picklable) object in rank order; ``[obj]`` for one process."""
    if not _GROUP.active:
        return [obj]
    out: list[Any] = [None] * _GROUP.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if _GROUP.active:
        dist.barrier()


def sync_gradients(params: list[torch.Tensor]) -> None:
    """Average ``.grad`` over ranks in one flat bucket: DDP's all-reduce, before clipping and the
    optimizer step, so every rank clips the same global gradient and stays bit-identical.

    Call it before ``GradScaler.unscale_``: an inf on one rank then reaches every rank, and all of
    them skip the same step. A parameter without a gradient on every rank (an unused head) is skipped
    on every rank, because each rank runs the same code on the same model.
    """
    if not _GROUP.active or _GROUP.sharded:
        return  # FSDP's backward already reduce-scattered (and averaged) every sharded gradient
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.detach().reshape(-1).to(_comm_device(), torch.float32) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= _GROUP.world_size
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g).to(g.device, g.dtype))
        offset += n


# ----------------------------------------------------------------------------- FSDP (strategy fsdp)


_MESH: Any = None


def _mesh() -> Any:
    """One 1-D device mesh over every rank (cached: FSDP groups of the same run share it)."""
    global _MESH
    if _MESH is None or _MESH.size() != _GROUP.world_size:
        _MESH = init_device_mesh(_GROUP.device_type, (_GROUP.world_size,))
    return _MESH


def shard_module(module: torch.nn.Module) -> torch.nn.Module:
    """FSDP2-shard one HF model: each transformer block (the classes its ``_no_split_modules``
    names, e.g. ``GPT2Block``, ``T5Block``) is its own group, all-gathered just before its forward
    and freed after it; the rest (embeddings, tied LM head, final norm) forms the root group.
    Parameters are always resharded after forward (``set_reshard_after_forward``, which
    :func:`unsharded` toggles, then reads back the same setting on every group)."""
    block_names = set(getattr(module, "_no_split_modules", None) or [])
    mesh = _mesh()
    for sub in list(module.modules()):
        if sub is not module and type(sub).__name__ in block_names:
            fully_shard(sub, mesh=mesh, reshard_after_forward=True)
    fully_shard(module, mesh=mesh, reshard_after_forward=True)
    return module


def shard_policy(policy: torch.nn.Module) -> None:
    """Shard an ``ActorCritic`` in place: the LM, a separate critic LM, and the value head each as
    their own FSDP root, because the algorithms call them directly (``policy.lm`` for SFT and DPO,
    ``forward_tokens`` for the rest) rather than through one ``forward`` of the container."""
    shard_module(policy.lm)
    if getattr(policy, "critic", None) is not None:
        shard_module(policy.critic)
    fully_shard(policy.value_head, mesh=_mesh(), reshard_after_forward=True)


def _fsdp_modules(modules: tuple[Any, ...]) -> list[FSDPModule]:
    out: list[FSDPModule] = []
    for m in modules:
        if isinstance(m, torch.nn.Module):
            out.extend(x for x in m.modules() if isinstance(x, FSDPModule))
    return out


@contextlib.contextmanager
def unsharded(*modules: Any) -> Iterator[None]:
    """Every rank gathers the full parameters of ``modules`` once, then runs any number of forwards
    without a collective: generation (a rank stops when its own episodes end, so ranks run different
    numbers of steps) and rank 0's evaluation. Every rank must enter; a no-op unless sharded.
    Costs one full copy of the modules' parameters per device for the duration."""
    groups = _fsdp_modules(modules) if _GROUP.sharded else []
    for g in groups:
        g.unshard()
        g.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for g in groups:
            g.reshard()
            g.set_reshard_after_forward(True)


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state(module: torch.nn.Module) -> dict[str, Any]:
    """The module's full state dict on rank 0's CPU (``{}`` on the other ranks). Sharded: a
    collective every rank must call; otherwise ``module.state_dict()``."""
    if not _GROUP.sharded:
        return module.state_dict()
    return get_model_state_dict(module, options=_FULL)


def load_full_state(module: torch.nn.Module, state: dict[str, Any]) -> None:
    """Load a full state dict (every rank passes the same one) into a sharded or plain module."""
    if not _GROUP.sharded:
        module.load_state_dict(state)
        return
    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True))


def optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state: ``optimizer.state_dict()``, or sharded the full state keyed by
    parameter name on rank 0 (a collective)."""
    if not _GROUP.sharded:
        return optimizer.state_dict()
    return get_optimizer_state_dict(module, optimizer, options=_FULL)


def load_optimizer_state(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    if not _GROUP.sharded:
        optimizer.load_state_dict(state)
        return
    set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))


def sharded_frozen_copy(source: torch.nn.Module, fresh: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """A frozen, sharded copy of ``source`` (sharded modules cannot be deep-copied): ``fresh()``
    loads a new module of the same architecture, which is sharded like ``source`` and receives
    ``source``'s local shards (no gather). An unsharded ``source`` (a reference model just loaded
    from its own path) is itself sharded and frozen."""
    if isinstance(source, FSDPModule):
        out = shard_module(fresh())
        set_model_state_dict(out, get_model_state_dict(source))
    else:
        out = shard_module(source)
    out.eval()
    for p in out.parameters():
        p.requires_grad_(False)
    return out


# ----------------------------------------------------------------------------- batch statistics


def masked_sum_count(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the masked entries, number of masked entries), over every rank's batch."""
    both = all_sum(torch.stack([(x * mask).sum(), mask.sum()]).double())
    return both[0].to(x.dtype), both[1].to(x.dtype)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the masked entries of the global batch (the local ``masked_mean`` for one process)."""
    s, c = masked_sum_count(x, mask)
    return s / c.clamp(min=1.0)


def masked_moments(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, population variance) of the masked entries of the global batch, in two passes as
    the single-process ``masked_var`` (mean first, then the mean squared deviation)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return mean, var


def explained_variance(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(target - pred) / Var(target)`` over the global batch (NaN when the targets are constant)."""
    _, var_t = masked_moments(target, mask)
    if float(var_t) == 0.0:
        return float("nan")
    _, var_r = masked_moments(target - pred, mask)
    return float(1.0 - var_r / var_t)


def host_info(device: torch.device) -> dict[str, Any]:
    """Where this rank runs (for ``ranks.json`` and the run page)."""
    return {
        "rank": _GROUP.rank,
        "local_rank": _GROUP.local_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(device),
    }
