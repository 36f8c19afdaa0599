"""A full disk named as such: "no space left on device" with the path, and no partial files left.

Why: ``torch.save`` reports a full disk as ``RuntimeError: [enforce fail at inline_container.cc:672]
. unexpected pos …`` or ``PytorchStreamWriter failed writing file …``, which says nothing about disk
space, and a checkpoint that failed half-way left its temporary directory (tens of MB) behind, using
up more of the space that was missing. ``writing`` wraps the writes of a checkpoint or a saved model:
on any failure it removes the temporary directory, and when the cause is a full disk (an ``OSError``
with ``ENOSPC``/``EDQUOT`` anywhere in the chain, or torch's writer error while the file system has
next to nothing free) it raises ``DiskFullError`` naming the path and the free space instead.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_TORCH_WRITE_ERRORS = ("unexpected pos", "file write failed", "PytorchStreamWriter failed")
_NEARLY_FULL = 1024 * 1024  # bytes free below which a failed write is taken as a full disk


class DiskFullError(OSError):
    """The file system holding ``filename`` ran out of space (``errno`` ENOSPC)."""


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


def is_disk_full(exc: BaseException, path: Path) -> bool:
    """Whether ``exc`` (or an exception it came from) means the disk under ``path`` is full."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    torch_write = False
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(cur, RuntimeError) and any(s in str(cur) for s in _TORCH_WRITE_ERRORS):
            torch_write = True
        cur = cur.__cause__ or cur.__context__
    if not torch_write:
        return False
    free = _free_bytes(path)
    return free is not None and free < _NEARLY_FULL


@contextmanager
def writing(path: Path, what: str, *, partial: Path | None = None) -> Iterator[None]:
    """Run the writes of ``what`` (a checkpoint, a model) to ``path``; on failure remove ``partial``
    (the temporary directory being written), and name a full disk as such."""
    try:
        yield
    except BaseException as exc:
        full = is_disk_full(exc, partial or path)
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        if not full:
            raise
        free = _free_bytes(path)
        raise DiskFullError(
            errno.ENOSPC,
            f"no space left on device while writing {what} to {path} "
            f"({(free or 0) / 1e6:.1f} MB free after removing the partial files); free some space or "
            "choose another train.output_dir, then resume from the last checkpoint",
            str(path),
        ) from exc
