"""The TensorRT engine, through torch_tensorrt's dynamo path. GPU machines only.

NOT RUN HERE: torch_tensorrt cannot be installed or imported on the CPU machines where
this project is built (its import needs an NVIDIA driver), so this code path was never
executed by this project's tests or notebooks. It is the code we expect to work on a
machine with torch-tensorrt 2.14 and a GPU; ``onnxruntime`` is the engine that runs the
same blocks on CPU. ``torch_tensorrt`` is imported inside the methods, never at import.
``build`` returns a :class:`TensorRTBlock` around torch_tensorrt's own compiled
GraphModule; we expect that to pickle through torch_tensorrt's engine serialization, but
that too was not run here. The block keeps the graph it was built from for a saved program.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from tetrt_support.compiler.engines.base import (
    DynamicDims,
    Engine,
    dynamic_shapes_for_export,
    keep_scalars_0d,
    refuse_gradient_inputs,
    scalar_outputs,
    standalone_block,
)
from tetrt_support.optional import available

__all__ = ["TensorRTBlock", "TensorRTEngine"]


def _import_torch_tensorrt() -> Any:
    try:
        import torch_tensorrt
    except Exception as error:  # noqa: BLE001 - ImportError, or a driver error raised on import
        raise RuntimeError(
            f"torch_tensorrt is not installed/importable here: {type(error).__name__}: {error}. "
            f"The tensorrt engine needs torch-tensorrt and an NVIDIA GPU; use the 'onnxruntime' "
            f"engine for a CPU engine without complex dtypes"
        ) from error
    return torch_tensorrt


class TensorRTBlock(torch.nn.Module):
    """torch_tensorrt's compiled module for one block, and the block's ATen graph.

    The graph is kept outside ``_modules``: the TensorRT plan computes with the weights
    built into it, so ``state_dict`` and refit must not see (or replace) the graph's.
    A 0-d output that comes back as shape ``(1,)`` is made 0-d again.
    """

    def __init__(self, engine: torch.nn.Module, graph_module: fx.GraphModule) -> None:
        super().__init__()
        self.engine = engine
        self.__dict__["graph_module"] = graph_module
        self.scalar_outputs = scalar_outputs(graph_module)

    has_backward = False  # a TensorRT plan computes forward only

    def forward(self, *inputs: torch.Tensor) -> Any:
        names = getattr(self, "input_labels", None) or [
            str(n.target) for n in self.graph_module.graph.find_nodes(op="placeholder")]
        refuse_gradient_inputs("tensorrt", names, inputs)
        return keep_scalars_0d(self.engine(*inputs), self.scalar_outputs)

    def as_pytorch(self) -> fx.GraphModule:
        """The ATen graph the engine was built from (traceable by torch.export)."""
        return self.graph_module


class TensorRTEngine(Engine):
    """``torch_tensorrt.dynamo.compile`` of each block's exported program, fp32.

    ``dynamic_range`` bounds every dynamic dim for TensorRT's optimization profile:
    (min, max), with the example size as the optimum.
    """

    name = "tensorrt"
    complex_dtypes = False

    def __init__(self, dynamic_range: tuple[int, int] = (1, 4096)) -> None:
        self.dynamic_range = dynamic_range

    def supports_op(self, node: fx.Node) -> bool:
        """TensorRT's converter registry when torch_tensorrt imports; else every real op.

        Without torch_tensorrt the answer is only "not complex": TensorRT has no complex
        dtypes, whichever converters exist.
        """
        if not available("torch_tensorrt"):
            return True
        return node in _import_torch_tensorrt().dynamo.conversion.DYNAMO_CONVERTERS

    def build_block(
        self, block: fx.GraphModule, example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None
    ) -> torch.nn.Module:
        torch_tensorrt = _import_torch_tensorrt()
        device = torch.device("cuda")
        example_inputs = [x.to(device) for x in example_inputs]
        exported = torch.export.export(
            block, tuple(example_inputs), dynamic_shapes=dynamic_shapes_for_export(example_inputs, dynamic_dims, block)
        )
        low, high = self.dynamic_range
        trt_inputs = []
        for i, x in enumerate(example_inputs):
            dims = (dynamic_dims or [{}] * len(example_inputs))[i] or {}
            if not dims:
                trt_inputs.append(torch_tensorrt.Input(shape=tuple(x.shape), dtype=x.dtype))
                continue
            dynamic = {d % x.dim() for d in dims}
            min_shape = tuple(low if d in dynamic else s for d, s in enumerate(x.shape))
            max_shape = tuple(high if d in dynamic else s for d, s in enumerate(x.shape))
            trt_inputs.append(
                torch_tensorrt.Input(min_shape=min_shape, opt_shape=tuple(x.shape), max_shape=max_shape, dtype=x.dtype)
            )
        compiled = torch_tensorrt.dynamo.compile(
            exported,
            arg_inputs=trt_inputs,
            enabled_precisions={torch.float32},
            min_block_size=1,
            require_full_compilation=True,
        )
        return TensorRTBlock(compiled, standalone_block(block))
