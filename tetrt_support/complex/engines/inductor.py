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

from tetrt_support.complex.engines.base import DynamicDims, Engine, check_tensor_inputs, standalone_block

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

    def _compile(self) -> Any:
        if self._compiled is None:
            dynamic = None if self.dynamic_dims else False
            self.__dict__["_compiled"] = torch.compile(self.block, backend="inductor", dynamic=dynamic, fullgraph=True)
        return self._compiled

    def forward(self, *inputs: torch.Tensor):
        compiled = self._compile()
        for x, dims in zip(inputs, self.dynamic_dims or ()):
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(x, dim)
        return compiled(*inputs)


class InductorEngine(Engine):
    name = "inductor"

    def supports(self, node: fx.Node) -> bool:
        # Inductor lowers what it can and falls back to the ATen kernel for the rest.
        return node.op == "call_function"

    def build(
        self,
        block: fx.GraphModule,
        example_inputs: list[torch.Tensor],
        dynamic_dims: DynamicDims | None = None,
    ) -> torch.nn.Module:
        check_tensor_inputs(self.name, example_inputs)
        if dynamic_dims is not None and len(dynamic_dims) != len(example_inputs):
            raise ValueError(
                f"dynamic_dims has {len(dynamic_dims)} entries but the block has {len(example_inputs)} inputs"
            )
        return InductorBlock(standalone_block(block), dynamic_dims)
