"""SwiGLU MLPs (Llama, Qwen, Mistral) whose ``silu(gate) * up`` keeps two activations for the backward, not three.

Why: autograd keeps ``gate`` (for SiLU's backward), ``silu(gate)`` and ``up`` (for the product's) and
the product (``down_proj``'s input) — four (tokens × intermediate) tensors per layer, ~half of a
decoder layer's saved activations on SmolLM2-135M (1536 of 576 wide). :class:`_SwiGLU` keeps ``gate``
and ``up`` and recomputes ``silu(gate)`` in the backward, one elementwise pass over a tensor the
backward reads anyway. In PPO with a separate critic both trunks' activations are alive when the
backward starts, where the process reaches its peak (issue #30). The forward computes the same
operations, and the backward the same kernels (``silu_backward``, the products) on the same values as
autograd would, so values and gradients are bitwise those of the module it replaces (tests).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return torch.nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        gate, up = ctx.saved_tensors
        grad_gate = grad_up = None
        if ctx.needs_input_grad[0]:
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        if ctx.needs_input_grad[1]:
            grad_up = grad * torch.nn.functional.silu(gate)
        return grad_gate, grad_up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``; with gradients, through :class:`_SwiGLU` (two saved tensors, not three)."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SwiGLU.apply(gate, up)
    return torch.nn.functional.silu(gate) * up


def _forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


_CLASSES: dict[type, type] = {}


def _is_silu(act: Any) -> bool:
    """``nn.SiLU``, or transformers' ``SiLUActivation`` whose forward is still ``nn.functional.silu``
    (a kernel from the hub may replace it: then the module is left alone)."""
    if type(act) is nn.SiLU:
        return True
    code = getattr(getattr(type(act), "forward", None), "__code__", None)
    return (
        type(act).__name__ == "SiLUActivation"
        and code is not None
        and code.co_names == ("nn", "functional", "silu")
    )


def _is_swiglu_mlp(module: nn.Module) -> bool:
    """A module computing exactly ``down_proj(silu(gate_proj(x)) * up_proj(x))``: HF's Llama-style MLPs
    (checked by their forward's own code, so a subclass that changes it is left alone)."""
    if not _is_silu(getattr(module, "act_fn", None)):
        return False
    if not all(
        isinstance(getattr(module, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")
    ):
        return False
    forward = type(module).forward
    code = getattr(forward, "__code__", None)
    return code is not None and code.co_names[:4] == ("down_proj", "act_fn", "gate_proj", "up_proj")


def use_lean_swiglu(model: nn.Module) -> int:
    """Switch every Llama-style SwiGLU MLP of ``model`` to :func:`swiglu` (in place, by class, so deep
    copies — a separate critic, a reference — keep it). Returns how many modules were switched."""
    n = 0
    for module in model.modules():
        cls = type(module)
        if cls in _CLASSES.values() or not _is_swiglu_mlp(module):
            continue
        if cls not in _CLASSES:
            name = f"Lean{cls.__name__}"
            _CLASSES[cls] = type(
                name, (cls,), {"forward": _forward, "__module__": __name__, "__qualname__": name}
            )
            globals()[name] = _CLASSES[cls]  # findable by pickle in this process
        module.__class__ = _CLASSES[cls]
        n += 1
    return n
