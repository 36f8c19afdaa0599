"""``model.compile``: the transformer blocks compiled with ``torch.compile`` for the RL update only.

Why the blocks, and only in the update: the update's forward and backward passes are most of an
iteration (issue #30's profile: 16 passes over ~444 tokens, ~75 % of the time), and what is left in
them beyond the matrix products is elementwise work (RMSNorm, SwiGLU, rotary embeddings, the
autocast casts) that inductor fuses. Measured on one SmolLM2-135M trunk (30 blocks, 4 × 112 tokens,
bf16 autocast, 2 threads, Intel Xeon with AMX): forward + backward 0.80–0.87 s eager, 0.60 s
compiled, for a one-time compile of 14 s (docs/benchmarks.md). Compiling the blocks one by one
(``nn.Module.compile``) instead of the whole model leaves the embedding's custom gradient
(``tied_embedding_grad``) and the LM head's fused log-probs in eager code, and the 30 blocks share one
compiled graph. The rollout's scoring pass (policy, separate critic and frozen reference, no gradients:
a graph of its own) uses them too; generation (a KV cache that grows by one token per step) keeps the
eager blocks: :func:`compiled_blocks` switches the compiled call on for the update and the scoring and
off again.

The numbers are those of eager execution up to float rounding (fused kernels sum in another order),
so the option is off by default and the reproduction study leaves it off.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


class CompileError(RuntimeError):
    """model.compile cannot run here (no C++ compiler for inductor's CPU kernels, no blocks found)."""


def blocks_of(lm: Any) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face model: the modules whose class it lists in
    ``_no_split_modules`` (its own declaration of what one block is, e.g. ``LlamaDecoderLayer``)."""
    names = set(getattr(lm, "_no_split_modules", None) or [])
    return [m for m in lm.modules() if type(m).__name__ in names]


def check_compiler(device: torch.device) -> None:
    """Inductor writes C++ for CPU kernels: without a compiler the first update would fail deep in
    torch; say so before training starts."""
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise CompileError(
            "model.compile: torch.compile builds C++ kernels for the CPU and no C++ compiler (g++, c++ or "
            "clang++) is on PATH; install one (Debian: apt-get install g++) or set model.compile: false"
        )


_BLOCK_CALL: Any = None


def _call_block(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return block._call_impl(*args, **kwargs)


def _compiled_block_call() -> Any:
    """One compiled function for every block of every model: dynamic, since prompt and minibatch
    lengths vary from one update to the next (plus a few variants: with and without a padding mask,
    with and without gradients, a batch of one)."""
    global _BLOCK_CALL
    if _BLOCK_CALL is None:
        _BLOCK_CALL = torch.compile(_call_block, dynamic=True)
    return _BLOCK_CALL


class BlockCompiler:
    """Compiles each block once (lazily, at the first update) and switches the compiled call on only
    inside :meth:`active`."""

    def __init__(self, models: Iterable[Any]):
        self.blocks: list[nn.Module] = [b for lm in models if lm is not None for b in blocks_of(lm)]
        self._models: list[Any] = [lm for lm in models if lm is not None]
        if not self.blocks:
            raise CompileError(
                "model.compile: the model declares no transformer blocks (_no_split_modules), so there is "
                "nothing to compile; set model.compile: false"
            )
        self._compiled: dict[int, Any] = {}
        # One compiled graph per variant (grad mode, padding mask or none, inputs that require grad or
        # not — LoRA —, a batch of one): a worker process that trains run after run meets more than
        # dynamo's default 8, and past the limit blocks fall back to eager without a word.
        limit = getattr(torch._dynamo.config, "recompile_limit", None)
        if isinstance(limit, int) and limit < 64:
            torch._dynamo.config.recompile_limit = 64

    def add(self, lm: Any) -> None:
        """Also compile ``lm``'s blocks (the frozen reference, made after the policy), once."""
        if lm is not None and all(lm is not m for m in self._models):
            self._models.append(lm)
            self.blocks += blocks_of(lm)

    def _compiled_call(self, block: nn.Module) -> Any:
        fn = self._compiled.get(id(block))
        if fn is None:
            # The block is an argument of one compiled function, not bound into it: a deep copy of a
            # block made while the compiled call is on (a frozen reference, a masking policy) then
            # calls its own weights, since copy.deepcopy maps the partial's block to the copy.
            fn = self._compiled[id(block)] = functools.partial(_compiled_block_call(), block)
        return fn

    @contextmanager
    def active(self) -> Iterator[None]:
        for b in self.blocks:
            b._compiled_call_impl = self._compiled_call(b)
        try:
            yield
        finally:
            for b in self.blocks:
                b._compiled_call_impl = None


@contextmanager
def compiled_blocks(compiler: BlockCompiler | None) -> Iterator[None]:
    """The compiled blocks inside, the eager ones outside; a no-op without a compiler."""
    if compiler is None:
        yield
        return
    with compiler.active():
        yield
