"""Keep freed memory in the process on CPU (glibc): big tensors stop costing page faults.

Why: glibc's malloc serves every block above its mmap threshold (at most 32 MB) with a fresh ``mmap``
and gives it back with ``munmap`` when freed, and trims the heap's free top back to the kernel. A CPU
update of a 135M model with a 49k vocabulary allocates and frees several 100-150 MB tensors per step
(logits, the embedding's dense gradient, the LM head's gradient), so every one of them arrives as
zeroed pages, one fault per 4 kB: on the benchmark VM a fresh (49152, 576) ``zeros`` took 40 ms against
5 ms for a reused block, and a GRPO update spent ~1 s faulting (docs/benchmarks.md). With mmap off and
trimming limited, freed blocks return to the heap and the next step reuses them, as the jemalloc or
tcmalloc that CPU training guides preload would. The cost is that the process keeps its high-water
mark of heap (what a training process reaches again at the next step anyway).

Set once per training process (when a trainer starts on the CPU with ``resources.retain_freed_memory``),
never at import: the web server and other importers keep glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# The largest trim threshold mallopt takes (an int): free heap top beyond 2 GB is still given back.
_TRIM_THRESHOLD = 2**31 - 1

_applied = False


def retain_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks (no mmap'd chunks, a 2 GB trim threshold) for the rest of
    the process. True when applied (now or before); False where it does not apply (not Linux, not
    glibc, e.g. musl or macOS), which leaves the allocator as it was."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl has mallopt but ignores it
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) != 1:
        return False
    _applied = True
    return True
