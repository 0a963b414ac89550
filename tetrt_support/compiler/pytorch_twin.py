"""A compiled module's twin in plain PyTorch ops: what ``torch.export`` can trace and save.

An engine block is a Python object around an engine (an ONNX Runtime session over ONNX
bytes, a TensorRT plan): ``torch.export`` cannot trace into it, and
``torch.export.save`` cannot store it. Torch-TensorRT solves that with a TorchBind engine
class and a custom op (``torch.ops.tensorrt.execute_engine``) that its runtime registers.
This package has no such runtime to ship, so a saved program keeps each engine block as
its REAL GRAPH instead: the lowered, real-arithmetic ATen graph the engine was built
from, with the same weights. The program then loads with ``torch.export.load`` in any
process (no tetrt_support import, no custom op library) and computes what the engines
computed; what it does not keep is the engine itself (the ``"pickle"`` format does).

:func:`as_pytorch` builds the twin without touching the compiled module: the graph is
copied, blocks are swapped on the copy, and tensors are shared, not copied.
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

