"""Frozen models whose weights live in a file mapping: resident while they run, dropped during updates.

Why: a reference model (and NLPO's masking model) is read once per iteration — one scoring pass — yet in
a plain copy its weights stay in the process's memory through the whole update, where the policy's and
critic's gradients, their Adam states and the activations reach the process's peak. With PPO's separate
critic on SmolLM2-135M (fp32) the reference is 0.54 GB of a ~6 GB peak (issue #30). Here the frozen
copy's parameters are views of one shared mapping of a file written once; :func:`release_offloaded`
(called by :class:`engine.models.policy.ActorCritic` when a training forward starts) drops the mapping's
pages from the process, and the next forward reads them back from the page cache (or the disk, when the
kernel has reclaimed them): ~0.1-0.2 s per iteration on the benchmark VM. The numbers are the same
bytes: nothing is converted, only where the bytes live changes.

The mapping is shared, not private, so a write to the weights (a checkpoint's reference loaded into
the copy) goes to the file and survives a release. CPU only; other devices keep ordinary tensors.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import mmap
import os
import sys
import tempfile
import weakref
from typing import Any

import torch

# Below this size a frozen copy stays in ordinary memory (tiny test models: nothing to gain).
MIN_BYTES = 64 << 20
_ALIGN = 64
_MADV_DONTNEED = 4

_offloaded: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
_madvise: Any = None


def _libc_madvise() -> Any:
    global _madvise
    if _madvise is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
            _madvise = fn
        except (OSError, AttributeError):
            _madvise = False
    return _madvise


def frozen_file_copy(
    module: torch.nn.Module, directory: str | None = None, min_bytes: int = MIN_BYTES
) -> torch.nn.Module | None:
    """A deep copy of ``module`` whose parameters are frozen views of one shared mapping of a temporary
    file, or None where that does not apply (not Linux, parameters off the CPU or sharded, fewer than
    ``min_bytes`` of them). The parameters are written straight into the mapping: no second copy in
    the heap. The file is unlinked at once (the mapping keeps it alive as long as the copy). Tied
    parameters stay tied: each distinct parameter is written once."""
    if not sys.platform.startswith("linux") or not _libc_madvise():
        return None
    params: list[torch.nn.Parameter] = []
    seen: set[int] = set()
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p.device.type != "cpu" or type(p.data) is not torch.Tensor:
            return None
        params.append(p)
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += -(-p.numel() * p.element_size() // _ALIGN) * _ALIGN
    if total < min_bytes:
        return None
    total = -(-total // mmap.PAGESIZE) * mmap.PAGESIZE
    fd, path = tempfile.mkstemp(prefix="grue-frozen-", suffix=".bin", dir=directory)
    try:
        os.ftruncate(fd, total)
        flat = torch.from_file(path, shared=True, size=total, dtype=torch.uint8)
    finally:
        os.close(fd)
        os.unlink(path)
    memo: dict[int, Any] = {}
    with torch.no_grad():
        for p, off in zip(params, offsets, strict=True):
            view = flat[off : off + p.numel() * p.element_size()].view(p.dtype).view(p.shape)
            view.copy_(p.detach())
            memo[id(p)] = torch.nn.Parameter(view, requires_grad=False)
    old = getattr(module, "_grue_file_weights", None)
    if old is not None:  # a copy of a copy: the old mapping is not copied into the heap
        memo[id(old)] = flat
    copy_ = copy.deepcopy(module, memo)
    copy_._grue_file_weights = flat  # type: ignore[attr-defined]
    _offloaded.add(copy_)
    return copy_


def release_offloaded() -> int:
    """Drop the resident pages of every offloaded module's weights from the process (they stay in the
    file; the next access reads them back). Returns the bytes released."""
    madvise = _libc_madvise()
    released = 0
    for module in list(_offloaded):
        flat = getattr(module, "_grue_file_weights", None)
        if flat is None or not madvise:
            continue
        n = flat.numel()
        if madvise(ctypes.c_void_p(flat.data_ptr()), n, _MADV_DONTNEED) == 0:
            released += n
    return released


def is_offloaded(module: torch.nn.Module) -> bool:
    return getattr(module, "_grue_file_weights", None) is not None
