"""CPU priority for a long study beside other work (``python -m engine study … --priority N``).

Why not plain ``nice``: on Linux with autogroup scheduling (the default on desktop and VM kernels) a
process's nice value only ranks it among the processes of its own session's group; groups share the CPU
equally whatever their members' nice values. A study started with ``setsid`` has a group of its own, and
that group's nice (``/proc/self/autogroup``) is what gives it more or less of the machine against test
runs from another shell (measured in docs/reproduction.md, "Running it beside other work"). Without
autogroup the process nice is the one that counts, so that is set instead.
"""

from __future__ import annotations

import os
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")


class PriorityError(RuntimeError):
    """The nice value could not be set; the message says why and what would allow it."""


def set_priority(nice: int, autogroup: Path = AUTOGROUP) -> str:
    """Give this process's scheduling group (autogroup) or, without autogroup, this process the nice
    value ``nice`` (−20 … 19; lower runs more). Children started afterwards inherit it. Returns a line
    saying what was set; raises ``PriorityError`` when it cannot be (a value out of range, or a negative
    one without root / CAP_SYS_NICE)."""
    if not -20 <= nice <= 19:
        raise PriorityError(f"--priority: {nice} is not a nice value (-20 to 19; lower runs more)")
    if autogroup.exists():
        try:
            autogroup.write_text(f"{nice}\n")
        except PermissionError:
            raise PriorityError(
                f"--priority {nice}: not permitted to set the session's autogroup nice "
                f"({autogroup}); a negative value needs root or CAP_SYS_NICE"
            ) from None
        return f"priority: this session's autogroup nice is {autogroup.read_text().split()[-1]} ({autogroup})"
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        raise PriorityError(
            f"--priority {nice}: not permitted to set the process nice; a negative value needs root "
            "or CAP_SYS_NICE"
        ) from None
    return f"priority: process nice {os.getpriority(os.PRIO_PROCESS, 0)} (no autogroup scheduling here)"
