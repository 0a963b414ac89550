"""TransformerEngine's quantizers and quantized tensors, traceable by torch.compile.

Pure PyTorch, CPU and CUDA, numerics bit for bit as TransformerEngine's kernels compute
them (:mod:`tetrt_support.quant.numerics`). Formats, one module each (quantizer and
tensor together, TE's ``tensor/`` layout):

- :mod:`.float8_tensor`: :class:`Float8Quantizer` (FP8 delayed scaling; holds live
  tensors: identity semantics) and :class:`Float8CurrentScalingQuantizer`;
- :mod:`.float8_blockwise_tensor`: :class:`Float8BlockQuantizer`, fp32 scales per 1x128 /
  128x128 block;
- :mod:`.mxfp8_tensor`: :class:`MXFP8Quantizer`, E8M0 scales per 1x32 / 32x1 (or 32x32) block;
- :mod:`.nvfp4_tensor`: :class:`NVFP4Quantizer`, E2M1 packed two per byte, E4M3 scales per
  1x16 (or 16x16) block, an fp32 global scale, optional random Hadamard transform,
  stochastic rounding, row-scaled amaxes and 4over6 block selection.

Constructor defaults are TE's (both usages, 128x128 blockwise, ...; listed with their TE
sources in ``tests/quant/test_te_defaults.py``); scale buffers are laid out as TE allocates
them (:mod:`.scale_layouts`).

The four stateless quantizers are value types, registered by their own modules through
:mod:`tetrt_support.quant.dynamo` (the only registration this package does at import).
:class:`Linear` runs its forward and backward as ``torch.library`` custom ops, with two
interchangeable fake-impl designs (``fake_impl="tensor_proto" | "make_empty_traceable"``).
TransformerEngine cannot be installed on the CPU machines used here; on a GPU machine its
kernels were run against these quantizers once, for FP8 delayed and current scaling only
(``docs/architecture.md``, "Equal to TE").
"""

from __future__ import annotations

from tetrt_support.quant.base import QuantizedTensor, Quantizer
from tetrt_support.quant.dynamo import (
    is_value_opaque_quantizer,
    opaque_api_available,
    rebuild_quantizer,
    register_value_quantizer,
)
from tetrt_support.quant.float8_blockwise_tensor import Float8BlockQuantizer, Float8BlockwiseTensor
from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor
from tetrt_support.quant.mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor
from tetrt_support.quant.nvfp4_tensor import NVFP4Quantizer, NVFP4Tensor

VALUE_QUANTIZERS = (Float8CurrentScalingQuantizer, Float8BlockQuantizer, MXFP8Quantizer, NVFP4Quantizer)
ALL_QUANTIZERS = (Float8Quantizer, *VALUE_QUANTIZERS)

# The custom-op Linear builds its op schemas from the registered opaque types, which the
# format modules above registered on import.
from tetrt_support.quant.fake_impls import FAKE_IMPLS, FakeImplStrategy, get_strategy  # noqa: E402
from tetrt_support.quant.fake_impls.make_empty_traceable import make_empty_traceable  # noqa: E402
from tetrt_support.quant.fake_impls.tensor_proto import TensorProto  # noqa: E402
from tetrt_support.quant.linear import Linear  # noqa: E402
from tetrt_support.quant.convert import convert_to_quantized_training, unsupported_reason  # noqa: E402
from tetrt_support.quant.ops import flatten_quantized, linear_ops  # noqa: E402
from tetrt_support.quant.recipes import RECIPES, Recipe, get_recipe  # noqa: E402


def _allow_weights_only_load() -> None:
    """``torch.load(weights_only=True)`` of quantized tensors: allow-list their classes, the
    quantizers and the reconstructor, as TE does (``transformer_engine/pytorch/__init__.py``)."""
    import torch

    from tetrt_support.quant.base import _make_quantized_tensor_in_reduce_ex

    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:  # torch >= 2.4
        add_safe_globals([_make_quantized_tensor_in_reduce_ex, *ALL_QUANTIZERS, *(q.tensor_class for q in ALL_QUANTIZERS)])


_allow_weights_only_load()

__all__ = [
    "ALL_QUANTIZERS",
    "FAKE_IMPLS",
    "RECIPES",
    "FakeImplStrategy",
    "Linear",
    "Recipe",
    "TensorProto",
    "convert_to_quantized_training",
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
    "register_value_quantizer",
    "unsupported_reason",
]
