"""A frozen model whose weights live in a file between uses (``model.offload_reference``).

Why: the KL reference of PPO-style runs is read once per iteration, in the rollout's scoring pass (and by
the parameter-drift read after the update), yet it stays resident through the update, where the
process's peak is reached: policy and critic weights, their AdamW state, one model's gradients and a
trunk's activations. Out of memory during the update it lowers the peak by one model's size (513 MiB
for SmolLM2-135M in fp32) with the same numbers: the weights come back bit for bit from the file.

How: the weights are saved once with ``torch.save``; between uses every parameter is a ``meta`` tensor
(a shape, no storage), and a use reads the file back (from the page cache: no disk) into freshly
allocated tensors assigned in place. Read, not mapped: a CPU training process keeps its heap's
high-water mark (``resources.retain_freed_memory``), so a mapping would sit on top of the update's
peak whenever it is used (the drift read after the update, the next rollout), and the peak would not
move — measured so on an H200 host's CPU (docs/benchmarks.md). Read into the heap, the reference takes
the blocks the update freed (the policy's gradients have its exact shapes) and gives them back to the
next update. Non-persistent buffers (rotary tables, causal masks) are not in a state dict and stay.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn


class OffloadedWeights:
    """``module``'s parameters and persistent buffers kept in ``path`` except inside ``loaded()``."""

    def __init__(self, module: nn.Module, path: Path, existing: bool = False):
        """``existing``: ``path`` already holds exactly ``module.state_dict()`` (a supervised+RL run's
        ``checkpoints/reference.pt``, kept for resumes): use it instead of writing a second full copy of
        the weights, and leave it in place when the run ends (it is not this object's to delete)."""
        self.module = module
        self.path = Path(path)
        self.owned = not existing
        self.device = next(module.parameters()).device
        if self.owned:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            torch.save(module.state_dict(), tmp)  # tied weights are saved once and come back tied
            tmp.replace(self.path)
        elif not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no saved weights to offload the module to")
        self._depth = 0
        self.release()

    @property
    def is_loaded(self) -> bool:
        return any(p.device.type != "meta" for p in self.module.parameters())

    def release(self) -> None:
        """Replace every parameter and persistent buffer by a storage-less ``meta`` tensor of its shape."""
        with torch.no_grad():
            for mod in self.module.modules():
                for name, p in list(mod._parameters.items()):
                    if p is not None and p.device.type != "meta":
                        meta = torch.empty(p.shape, dtype=p.dtype, device="meta")
                        mod._parameters[name] = nn.Parameter(meta, requires_grad=p.requires_grad)
                for name, b in list(mod._buffers.items()):
                    if b is None or name in mod._non_persistent_buffers_set or b.device.type == "meta":
                        continue
                    mod._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="meta")

    @contextlib.contextmanager
    def loaded(self) -> Iterator[nn.Module]:
        """The module with its weights back (read from the file onto its device) for the duration of
        the block; nested uses share one load."""
        if self._depth == 0:
            state: dict[str, Any] = torch.load(self.path, weights_only=True, map_location=self.device)
            self.module.load_state_dict(state, strict=True, assign=True)
            del state
        self._depth += 1
        try:
            yield self.module
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.release()

    def remove(self) -> None:
        """Delete the file if this object wrote it (the run is over); the module stays released."""
        if self.owned:
            self.path.unlink(missing_ok=True)
