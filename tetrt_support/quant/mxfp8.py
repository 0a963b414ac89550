"""MXFP8 (OCP microscaling): FP8 values with one E8M0 power-of-two scale per 1x32 block.

The block scale is ``amax / fp8_max`` rounded UP to a power of two (so no element of the
block overflows) and stored as a biased E8M0 exponent in a uint8. torch's own
``float8_e8m0fnu`` cast rounds to NEAREST and would overflow blocks (see
:func:`tetrt_support.quant.numerics.e8m0_round_up`). The quantized dimension must be a
multiple of 32 (K for row-wise, M for column-wise), as TransformerEngine requires.
"""

from __future__ import annotations

import torch

from tetrt_support.quant import numerics
from tetrt_support.quant.quantizer import BufferSpec, RowColumnQuantizer
from tetrt_support.quant.tensors import MXFP8Tensor

BLOCK = 32


class MXFP8Quantizer(RowColumnQuantizer):
    """MXFP8 with 1x32 blocks (row-wise) and 32x1 blocks (column-wise); value semantics."""

    tensor_class = MXFP8Tensor
    _value_semantics = True
    _format_fields = ("fp8_dtype",)

    def __init__(
        self,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        *,
        rowwise_usage: bool = True,
        columnwise_usage: bool = False,
        internal: bool = False,
    ) -> None:
        super().__init__(rowwise_usage=rowwise_usage, columnwise_usage=columnwise_usage, internal=internal)
        if fp8_dtype not in numerics.FP8_DTYPES:
            raise ValueError(f"MXFP8Quantizer: fp8_dtype must be one of {numerics.FP8_DTYPES}, got {fp8_dtype}")
        self.fp8_dtype = fp8_dtype

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        _check_block_multiple(type(self).__name__, shape, BLOCK, self.rowwise_usage, self.columnwise_usage)

    def _quantize_rows(self, x2d: torch.Tensor) -> dict[str, torch.Tensor]:
        amax = numerics.block_amax(x2d, 1, BLOCK)
        biased = numerics.e8m0_round_up(amax / numerics.fp8_max(self.fp8_dtype))
        inverse = 1.0 / numerics.e8m0_to_float(biased)  # exact: a power of two
        data = numerics.cast_to_fp8(x2d, numerics.expand_block_scales(inverse, 1, BLOCK, tuple(x2d.shape)), self.fp8_dtype)
        return {"data": data, "scale_inv": biased}

    def _dequantize_rows(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        data = parts["data"]
        scale = numerics.e8m0_to_float(parts["scale_inv"])
        return data.float() * numerics.expand_block_scales(scale, 1, BLOCK, tuple(data.shape))

    def _describe_rows(self, rows: int, cols: int) -> BufferSpec:
        return {"data": ((rows, cols), self.fp8_dtype), "scale_inv": ((rows, cols // BLOCK), torch.uint8)}


def _check_block_multiple(owner: str, shape: tuple[int, ...], block: int, rowwise: bool, columnwise: bool) -> None:
    """Row-wise blocks run along K (last dim), column-wise ones along M (product of the rest)."""
    k = shape[-1]
    m = 1
    for s in shape[:-1]:
        m *= s
    if rowwise and k % block:
        raise ValueError(f"{owner}: row-wise usage needs the last dim to be a multiple of {block}, got shape {shape}")
    if columnwise and m % block:
        raise ValueError(
            f"{owner}: column-wise usage needs the product of the leading dims to be a multiple of {block}, got shape {shape}"
        )
