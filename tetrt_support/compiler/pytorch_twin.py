"""A compiled module's twin in plain PyTorch ops: what ``torch.export`` can trace and save.

Each engine block is replaced by the lowered, real-arithmetic ATen graph it was built from,
with the same weights, so a saved program loads with ``torch.export.load`` in any process
and computes what the engines computed (``docs/architecture.md``, "Module notes").
:func:`as_pytorch` builds the twin on a copy of the graph, sharing tensors, without touching
the compiled module.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from tetrt_support.compiler.engines.base import standalone_block
from tetrt_support.compiler.partition import block_kind

__all__ = ["as_pytorch"]


def as_pytorch(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every engine block replaced by the ATen graph it was built from."""
    as_pytorch_method = getattr(module, "as_pytorch", None)
    if callable(as_pytorch_method):
        return as_pytorch_method()
    block = getattr(module, "block", None)
    if isinstance(block, fx.GraphModule) and not isinstance(module, fx.GraphModule):
        return block  # eager and inductor engine blocks keep the graph they run
    if isinstance(module, fx.GraphModule):
        twin = standalone_block(module)
        for name, child in module.named_children():
            if block_kind(name) is not None and hasattr(twin, name):
                setattr(twin, name, as_pytorch(child))
        return twin
    raise NotImplementedError(
        f"{type(module).__name__} keeps no PyTorch graph of what it computes (not an engine block "
        f"of this package?); it cannot be re-exported. Save it with output_format='pickle'"
    )

