"""Engines that run engine blocks: eager, inductor, ONNX Runtime (CPU) and TensorRT (GPU).

``get_engine(name)`` is the one entry point the partitioner uses. Each engine module is
imported only when asked for, so ``torch_tensorrt`` and ``onnxruntime`` never load unless
their engine is used.
"""

from __future__ import annotations

import importlib

from tetrt_support.compiler.engines.base import COMPLEX_OPS, DynamicDims, Engine, is_complex_work

__all__ = ["ENGINE_NAMES", "COMPLEX_OPS", "DynamicDims", "Engine", "get_engine", "is_complex_work"]

# name -> (module, class); modules load lazily.
_ENGINES = {
    "eager": ("tetrt_support.compiler.engines.eager", "EagerEngine"),
    "inductor": ("tetrt_support.compiler.engines.inductor", "InductorEngine"),
    "onnxruntime": ("tetrt_support.compiler.engines.onnxruntime", "OnnxRuntimeEngine"),
    "tensorrt": ("tetrt_support.compiler.engines.tensorrt", "TensorRTEngine"),
}
ENGINE_NAMES: tuple[str, ...] = tuple(_ENGINES)


def get_engine(name: str) -> Engine:
    """The engine called ``name``; one of :data:`ENGINE_NAMES`."""
    if name not in _ENGINES:
        raise ValueError(f"unknown engine {name!r}; valid engines: {', '.join(ENGINE_NAMES)}")
    module_name, class_name = _ENGINES[name]
    return getattr(importlib.import_module(module_name), class_name)()
