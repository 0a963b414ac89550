"""TransformerEngine's quantizers and quantized tensors, traceable by torch.compile.

Pure PyTorch, numerics bit for bit as TE's kernels (:mod:`.numerics`); one module per format
(:mod:`.float8_tensor`, :mod:`.float8_blockwise_tensor`, :mod:`.mxfp8_tensor`,
:mod:`.nvfp4_tensor`) with TE's constructor defaults and scale layouts. The four stateless
quantizers are value types (:mod:`.dynamo`). :class:`Linear` runs as ``torch.library``
custom ops with two fake-impl designs. What was compared with TE itself:
``docs/architecture.md`` ("Equal to TE").
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
from tetrt_support.quant.fsdp_float8 import precompute_float8_dynamic_scale_for_fsdp  # noqa: E402
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
    "precompute_float8_dynamic_scale_for_fsdp",
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
