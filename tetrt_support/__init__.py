"""tetrt_support: the real mechanisms behind the tetrt notebooks, runnable on a CPU.

Two sides, one subpackage each:

- :mod:`tetrt_support.complex` lowers graphs with complex numbers (rotary position
  embeddings) to real arithmetic, and compiles exported programs into engine blocks while
  keeping their call signature;
- :mod:`tetrt_support.quant` holds TransformerEngine-style quantizers, quantized tensor
  subclasses and a custom-op Linear that torch.compile can trace.

TensorRT, torch-tensorrt and TransformerEngine are optional back ends, imported lazily
(see :mod:`tetrt_support.optional`); nothing here needs them.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["compile", "__version__"]


def __getattr__(name: str) -> Any:
    # ``tetrt_support.compile`` is re-exported lazily so that ``import tetrt_support``
    # stays cheap and the quantization side never imports the compiler side.
    if name == "compile":
        from tetrt_support.complex.compiler import compile as _compile

        return _compile
    raise AttributeError(f"module 'tetrt_support' has no attribute {name!r}")
