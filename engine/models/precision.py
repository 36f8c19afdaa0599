"""Mixed-precision compute: the one place that turns the run's autocast dtype into a context manager.

The weights stay fp32 (master weights); forward passes run under ``torch.autocast`` when the config asks
for bf16/fp16, and in plain fp32 when the dtype is None. ``torch.autocast`` wants a dtype even when it
is disabled, which every copy of this used to spell out by hand.
"""

from __future__ import annotations

import contextlib

import torch


def autocast(device: torch.device | str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """A fresh autocast context for ``device`` (a ``torch.device`` or a string such as ``"cuda:0"``):
    ``dtype`` compute, or disabled (fp32) when ``dtype`` is None."""
    device_type = device.type if isinstance(device, torch.device) else str(device).split(":", 1)[0]
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)
