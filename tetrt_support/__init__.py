"""tetrt_support: the real mechanisms behind the tetrt notebooks, runnable on a CPU.

Two wings and the compiler between them:

- :mod:`tetrt_support.complex` lowers graphs with complex numbers (rotary position
  embeddings) to real arithmetic;
- :mod:`tetrt_support.compiler` compiles exported programs into engine blocks while
  keeping their call signature (:func:`compile`, :func:`save`, :func:`load`);
- :mod:`tetrt_support.quant` holds TransformerEngine-style quantizers, quantized tensor
  subclasses and a custom-op Linear that torch.compile can trace.

TensorRT, torch-tensorrt and TransformerEngine are optional back ends, imported lazily
(see :mod:`tetrt_support.optional`); nothing here needs them.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "compile", "load", "refit_module_weights", "save"]

_COMPILER_EXPORTS = ("compile", "load", "refit_module_weights", "save")


def __getattr__(name: str) -> Any:
    # Re-exported lazily so that ``import tetrt_support`` stays cheap and the
    # quantization side never imports the compiler side.
    if name in _COMPILER_EXPORTS:
        import tetrt_support.compiler as compiler

        return getattr(compiler, name)
    raise AttributeError(f"module 'tetrt_support' has no attribute {name!r}")
