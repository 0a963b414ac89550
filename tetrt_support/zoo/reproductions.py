"""Minimal models that reproduce what the Hugging Face sweep found, and the pipeline as it was.

Showcase, not the shipped compiler: these show a bug on
the old pipeline (:data:`BEFORE_THE_GUARDS`, a :class:`~tetrt_support.history.HistoricalPolicy`)
and its fix on the current one.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tetrt_support.compiler.pipeline import CompiledModule
    from tetrt_support.history import HistoricalPolicy

__all__ = [
    "BEFORE_THE_GUARDS",
    "ITEM_IN_PYTORCH",
    "CountThenArange",
    "InPlaceAdd",
    "SizeInPython",
    "SliceWrites",
    "compile_as_before",
    "slice_writes_program",
]


class SliceWrites(torch.nn.Module):
    """DeepSeek-V2's key construction in miniature: ``copy_`` into slices of ``new_empty``."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        q = a.new_empty(a.shape[0], 8)
        q[:, :4] = a
        q[..., 4:].copy_(b)
        return q * 2


def slice_writes_program(seed: int = 0) -> tuple[torch.export.ExportedProgram, tuple[torch.Tensor, torch.Tensor]]:
    """:class:`SliceWrites` exported, and its example inputs."""
    g = torch.Generator().manual_seed(seed)
    args = (torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g))
    return torch.export.export(SliceWrites(), args, strict=False), args


class InPlaceAdd(torch.nn.Module):
    """FNet's embeddings: ``x += y`` on a tensor the graph made, and ``detach_`` of a literal."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = ids.float() * 2
        x += 1
        scale = torch.tensor([0.5])  # a tensor literal: export records lift_fresh_copy + detach_
        return x * scale


class SizeInPython(torch.nn.Module):
    """A size computed in Python from two dynamic dims: ``b * s``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return torch.arange(b * s, dtype=x.dtype).view(b, s, 1) + x


class CountThenArange(torch.nn.Module):
    """A size made from data (``counts.sum().item()``) that an engine block consumes
    (``arange(n)``): with ``aten.item`` in PyTorch (:data:`ITEM_IN_PYTORCH`), the size
    crosses a block boundary as a plain int (a SymInt)."""

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        n = counts.sum().item()
        torch._check(n >= 2)
        torch._check(n <= 64)
        return torch.arange(n, dtype=x.dtype).view(n, 1) * x.sum(0)


#: ``torch_executed_ops`` that keeps :class:`CountThenArange`'s ``.item()`` in PyTorch
ITEM_IN_PYTORCH = frozenset({"torch.ops.aten.item.default"})


@functools.cache
def _before_the_guards() -> HistoricalPolicy:
    from tetrt_support import history
    from tetrt_support.compiler.pipeline import build_engine_blocks, partition_into_blocks

    return history.HistoricalPolicy(
        "before the guards",
        history.substituted(
            {
                "partition_into_blocks": history.on_the_bare_engine(partition_into_blocks),
                "build_engine_blocks": history.on_the_bare_engine(build_engine_blocks),
            },
            drop=("functionalize_view_writes", "keep_reference_blocks", "check_engine_blocks"),
        ),
    )


def compile_as_before(program: torch.export.ExportedProgram, backend: str = "onnxruntime", strategy: str = "rewrite") -> CompiledModule:
    """The pipeline as it was: no functionalization, no build-time check, and the bare engine
    (which does not refuse in-place ops), every engine-capable op in an engine block."""
    from tetrt_support import history

    return history.compile_as(_before_the_guards(), program, backend, strategy)


def __getattr__(name: str):
    if name == "BEFORE_THE_GUARDS":  # history and the compiler import lazily
        return _before_the_guards()
    raise AttributeError(name)
