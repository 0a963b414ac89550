"""TransformerEngine-style quantizers and quantized tensors that torch.compile can trace.

Pure PyTorch, CPU and CUDA. Formats (numerics after TransformerEngine's recipes):

- :class:`Float8Quantizer` -- FP8 delayed scaling (holds live tensors: identity semantics)
- :class:`Float8CurrentScalingQuantizer` -- FP8, scale from this tensor's amax
- :class:`Float8BlockQuantizer` -- FP8 with fp32 scales per 1x128 / 128x128 block
- :class:`MXFP8Quantizer` -- FP8 with E8M0 scales per 1x32 block
- :class:`NVFP4Quantizer` -- E2M1 packed two per byte, E4M3 scales per 1x16 block,
  fp32 global scale, optional 16x16 random Hadamard transform

:class:`Linear` runs its forward and backward as ``torch.library`` custom ops, with two
interchangeable fake-impl designs (``fake_impl="tensor_proto" | "make_empty_traceable"``).

The four stateless quantizers have value semantics and are registered here as opaque
value types (see :mod:`tetrt_support.quant.opaque`). TransformerEngine itself was not run
to produce or check any of this (it cannot be installed on the CPU machines used here).
"""

from __future__ import annotations

from tetrt_support.quant.blockwise import Float8BlockQuantizer
from tetrt_support.quant.float8 import Float8CurrentScalingQuantizer, Float8Quantizer
from tetrt_support.quant.mxfp8 import MXFP8Quantizer
from tetrt_support.quant.nvfp4 import NVFP4Quantizer
from tetrt_support.quant.opaque import is_value_opaque_quantizer, opaque_api_available, register_value_opaque_quantizer
from tetrt_support.quant.quantizer import Quantizer, rebuild_quantizer
from tetrt_support.quant.tensors import Float8BlockwiseTensor, Float8Tensor, MXFP8Tensor, NVFP4Tensor, QuantizedTensor

VALUE_QUANTIZERS = (Float8CurrentScalingQuantizer, Float8BlockQuantizer, MXFP8Quantizer, NVFP4Quantizer)
ALL_QUANTIZERS = (Float8Quantizer, *VALUE_QUANTIZERS)

for _cls in VALUE_QUANTIZERS:
    register_value_opaque_quantizer(_cls)
del _cls

# The custom-op Linear builds its op schemas from the registered opaque types: import it
# only after the registration loop above.
from tetrt_support.quant.fake_impls import FAKE_IMPLS, FakeImplStrategy, get_strategy  # noqa: E402
from tetrt_support.quant.fake_impls.make_empty_traceable import make_empty_traceable  # noqa: E402
from tetrt_support.quant.fake_impls.tensor_proto import TensorProto  # noqa: E402
from tetrt_support.quant.linear import Linear  # noqa: E402
from tetrt_support.quant.ops import flatten_quantized, linear_ops  # noqa: E402
from tetrt_support.quant.recipes import RECIPES, Recipe, get_recipe  # noqa: E402

__all__ = [
    "ALL_QUANTIZERS",
    "FAKE_IMPLS",
    "RECIPES",
    "FakeImplStrategy",
    "Linear",
    "Recipe",
    "TensorProto",
    "flatten_quantized",
    "get_recipe",
    "get_strategy",
    "linear_ops",
    "make_empty_traceable",
    "VALUE_QUANTIZERS",
    "Float8BlockQuantizer",
    "Float8BlockwiseTensor",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "QuantizedTensor",
    "Quantizer",
    "is_value_opaque_quantizer",
    "opaque_api_available",
    "rebuild_quantizer",
    "register_value_opaque_quantizer",
]
