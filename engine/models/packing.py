"""Decode-step linears from prepacked weights (oneDNN), for CPU generation.

Why: a decode step multiplies a handful of rows (the batch) by every weight matrix of the model; on a
CPU that is bound by reading the weights, and the default matmul repacks each weight matrix on every
call. Packed once per generation for the batch size, SmolLM2-135M's 211 linears per step took 47 ms
instead of 58 and its 49k-row LM head 10.5 ms instead of 23 (2 threads, AVX2; docs/benchmarks.md).
Packing costs ~0.3 s for 135M parameters, so it is used only where enough steps pay it back.

The packed weights are a copy made at the start of a generation and dropped at its end: the policy
changes between generations, and keeping the copy would double the weights' memory for good.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

#: Generations shorter than this, or models smaller than ``MIN_PARAMS``, keep the default matmul:
#: the packing would cost more than the steps save.
MIN_STEPS = 16
MIN_PARAMS = 20_000_000


def _available() -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def worth_packing(lm: Any, steps: int) -> bool:
    """CPU, fp32 weights, a model large enough and a generation long enough to pay the packing."""
    if steps < MIN_STEPS or not _available():
        return False
    params = list(lm.parameters())
    if not params or params[0].device.type != "cpu":
        return False
    return sum(p.numel() for p in params) >= MIN_PARAMS


@contextlib.contextmanager
def packed_decode_linears(lm: Any, rows: int, enabled: bool = True) -> Iterator[int]:
    """Inside: every plain fp32 ``nn.Linear`` of ``lm`` answers inputs of at most ``rows`` rows (the
    decode steps) from weights packed for oneDNN; larger inputs, other dtypes and autocast take the
    module's own forward. Yields how many linears were packed (0 when disabled or unavailable)."""
    if not enabled or not _available():
        yield 0
        return
    patched: list[tuple[nn.Module, Any]] = []
    try:
        for mod in lm.modules():
            if (
                type(mod) is not nn.Linear
                or mod.weight.dtype != torch.float32
                or mod.weight.device.type != "cpu"
            ):
                continue
            packed = torch.ops.mkldnn._reorder_linear_weight(mod.weight.detach(), rows)
            bias = mod.bias.detach() if mod.bias is not None else None
            own = mod.forward

            def forward(x: torch.Tensor, _packed=packed, _bias=bias, _own=own) -> torch.Tensor:
                n = x.numel() // x.shape[-1] if x.dim() else 0
                if (
                    0 < n <= rows
                    and x.dtype == torch.float32
                    and not torch.is_grad_enabled()
                    and not torch.is_autocast_enabled("cpu")
                ):
                    y = torch.ops.mkldnn._linear_pointwise(
                        x.reshape(n, x.shape[-1]), _packed, _bias, "none", [], ""
                    )
                    return y.reshape(*x.shape[:-1], y.shape[-1])
                return _own(x)

            patched.append((mod, mod.__dict__.get("forward")))
            mod.forward = forward
        yield len(patched)
    finally:
        for mod, previous in patched:
            if previous is None:
                del mod.forward
            else:
                mod.forward = previous
