"""The inductor engine: ``torch.compile(block, backend="inductor")``, compiled on first call.

The compiled callable is never pickled: the module pickles its block and recompiles
lazily after loading (inductor's own on-disk cache makes that cheap when it is warm).
Dims named in ``dynamic_dims`` are marked with ``torch._dynamo.maybe_mark_dynamic`` on
every call, so one compiled graph serves every batch/sequence size; ``maybe_`` because
size 0/1 inputs are specialized instead of raising.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from tetrt_support.compiler.engines.base import DynamicDims, Engine, standalone_block

__all__ = ["InductorBlock", "InductorEngine"]


class InductorBlock(torch.nn.Module):
    def __init__(self, block: fx.GraphModule, dynamic_dims: DynamicDims | None = None) -> None:
        super().__init__()
        self.block = block
        self.dynamic_dims = [dict(d) for d in dynamic_dims] if dynamic_dims else None
        # Kept out of _modules (it wraps self.block: state_dict would list the weights twice).
        self.__dict__["_compiled"] = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_compiled"] = None  # recompiled lazily after unpickling
        return state

    def _compile(self, inputs: tuple[Any, ...]) -> Any:
        if self._compiled is None:
            # an int input (a size made outside the block) must not stay specialised to its
            # first value: dynamic=None lets dynamo make it symbolic when it changes
            takes_ints = any(isinstance(x, int) for x in inputs)
            dynamic = None if self.dynamic_dims or takes_ints else False
            self.__dict__["_compiled"] = torch.compile(self.block, backend="inductor", dynamic=dynamic, fullgraph=True)
        return self._compiled

    def forward(self, *inputs: torch.Tensor):
        compiled = self._compile(inputs)
        for x, dims in zip(inputs, self.dynamic_dims or ()):
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(x, dim)
        return compiled(*inputs)

    def as_pytorch(self) -> fx.GraphModule:
        """The graph it compiles (with the weights it computes with)."""
        return self.block


class InductorEngine(Engine):
    """Inductor lowers what it can and falls back to the ATen kernel for the rest, so it
    takes every ATen op (the default ``supports``)."""

    name = "inductor"

    def build_block(
        self, block: fx.GraphModule, example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None
    ) -> torch.nn.Module:
        return InductorBlock(standalone_block(block), dynamic_dims)
