"""The eager engine: run the block's ATen graph as is, in PyTorch.

The reference every other engine is compared with, and the home of anything no other
engine takes (complex ops included: eager PyTorch has complex dtypes).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from tetrt_support.compiler.engines.base import DynamicDims, Engine, standalone_block

__all__ = ["EagerBlock", "EagerEngine"]


class EagerBlock(torch.nn.Module):
    """Calls the block's GraphModule; pickles as that GraphModule (FX pickles its code)."""

    def __init__(self, block: fx.GraphModule) -> None:
        super().__init__()
        self.block = block

    def forward(self, *inputs: torch.Tensor):
        return self.block(*inputs)

    def as_pytorch(self) -> fx.GraphModule:
        """The graph it runs (with the weights it computes with)."""
        return self.block


class EagerEngine(Engine):
    """Every ATen op runs in eager PyTorch, real or complex (the default ``supports``)."""

    name = "eager"

    def build_block(
        self, block: fx.GraphModule, example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None
    ) -> torch.nn.Module:
        # The graph takes whatever shapes its ops take: dynamic_dims needs no work here.
        return EagerBlock(standalone_block(block))
