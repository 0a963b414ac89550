"""Minimal models that reproduce what the Hugging Face sweep found, and the pipeline as it was.

Showcase, not the shipped compiler: the tests and notebook 06 use these to show a bug on
the old pass list (:data:`PASSES_BEFORE_THE_GUARDS`) and its fix on the current one.
"""

from __future__ import annotations

import torch

__all__ = [
    "ITEM_IN_PYTORCH",
    "CountThenArange",
    "InPlaceAdd",
    "PASSES_BEFORE_THE_GUARDS",
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


def _passes_before_the_guards() -> tuple:
    from tetrt_support.compiler import pipeline
    from tetrt_support.compiler.functionalize import functionalize_view_writes
    from tetrt_support.compiler.verify import check_engine_blocks, check_whole_program, keep_reference_blocks

    guards = (functionalize_view_writes, keep_reference_blocks, check_engine_blocks, check_whole_program)
    return tuple(p for p in pipeline.PASSES if p not in guards)


def compile_as_before(program: torch.export.ExportedProgram, backend: str = "onnxruntime", strategy: str = "rewrite"):
    """The pipeline as it was: no functionalization, no build-time check, and the bare engine
    (which does not refuse in-place ops), every engine-capable op in an engine block."""
    from tetrt_support.compiler import pipeline
    from tetrt_support.compiler.context import CompileContext
    from tetrt_support.compiler.engines import get_engine
    from tetrt_support.compiler.settings import CompilationSettings

    settings = CompilationSettings(backend=backend, strategy=strategy, min_block_size=1)
    ctx = CompileContext(program, backend, strategy, get_engine(backend), pipeline.flat_example_inputs(program), settings)
    gm = program.module()
    for compile_pass in _passes_before_the_guards():
        gm = compile_pass(gm, ctx)
    return gm


def __getattr__(name: str):
    if name == "PASSES_BEFORE_THE_GUARDS":  # the compiler imports lazily
        return _passes_before_the_guards()
    raise AttributeError(name)
