"""MXFP8 (OCP microscaling): FP8 values with one E8M0 power-of-two scale per 32-element block.

The block scale is TE's ``float_to_e8m0(amax * fp32(1 / fp8_max))``, rounded UP so no element
overflows (torch's ``float8_e8m0fnu`` cast rounds to nearest), stored as a biased exponent
in a uint8 (:func:`~tetrt_support.quant.numerics.mxfp8_quantize`). Layouts are TE's: data in
the input's N-D shape, 1x32 row-wise and 32x1 column-wise blocks, or 32x32 tiles with
``with_2d_quantization``; M and K must be multiples of 32. Scale buffers are padded or
swizzled as TE allocates them (:mod:`tetrt_support.quant.scale_layouts`).
Its CUDA fast paths (quantize, GEMM) are registered at the end (:mod:`.kernels.dispatch`).
"""

from __future__ import annotations

from typing import Any

import torch

from tetrt_support.quant import kernels, numerics, scale_layouts
from tetrt_support.quant.base import BufferSpec, QuantizedTensor, RowColumnQuantizer, check_block_multiple
from tetrt_support.quant.dynamo import register_value_quantizer
from tetrt_support.quant.kernels import dispatch

BLOCK = numerics.MXFP8_BLOCK


class MXFP8Tensor(QuantizedTensor):
    """MXFP8: FP8 data in the logical N-D shape (2-D view (M, K)) with one E8M0 exponent
    (uint8, biased by 127) per block: row-wise scales (M, K/32), column-wise data again in
    the logical shape with scales (M/32, K)."""

    _FLATTEN_TENSOR_BUFFERS = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")


@register_value_quantizer
class MXFP8Quantizer(RowColumnQuantizer):
    """MXFP8 with 1x32 (row-wise) and 32x1 (column-wise) or 32x32 (2-D) blocks; value semantics."""

    tensor_class = MXFP8Tensor
    fp8_dtype: torch.dtype
    with_2d_quantization: bool
    optimize_for_gemm: bool

    def __init__(
        self,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        *,
        rowwise_usage: bool = True,
        columnwise_usage: bool = True,
        internal: bool = False,
        with_2d_quantization: bool = False,
        optimize_for_gemm: bool = False,
    ) -> None:
        super().__init__(rowwise_usage=rowwise_usage, columnwise_usage=columnwise_usage, internal=internal)
        numerics.check_fp8_dtype(fp8_dtype, type(self).__name__)
        self.fp8_dtype = fp8_dtype
        self.with_2d_quantization = bool(with_2d_quantization)
        self.optimize_for_gemm = bool(optimize_for_gemm)

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        check_block_multiple(type(self).__name__, shape, BLOCK)

    # Both usages quantize x itself and keep its (M, K) layout.
    _COLUMNWISE_TRANSPOSED = False  # TE keeps MXFP8's column-wise data in the logical shape, scales (M/32, K)

    def _block_shape(self, layout: str) -> tuple[int, int]:
        if self.with_2d_quantization:
            return (BLOCK, BLOCK)
        return (1, BLOCK) if layout == "rowwise" else (BLOCK, 1)

    def _quantize_layout(self, matrix: torch.Tensor, layout: str) -> dict[str, torch.Tensor]:
        data, scale = numerics.mxfp8_quantize(matrix, self.fp8_dtype, *self._block_shape(layout))
        if self.with_2d_quantization and layout == "columnwise":
            scale = numerics.mxfp8_2d_columnwise_scales(scale, matrix.shape[1])
        return {"data": data, "scale_inv": scale}

    def _store_scale_inv(self, compact: torch.Tensor, layout: str) -> torch.Tensor:
        return scale_layouts.store_microscales(compact, along_rows=layout == "columnwise", swizzled=self.optimize_for_gemm)

    def _load_scale_inv(self, buffer: torch.Tensor, data: torch.Tensor, layout: str) -> torch.Tensor:
        rows, cols = data.shape
        compact = (rows, cols // BLOCK) if layout == "rowwise" else (rows // BLOCK, cols)
        return scale_layouts.load_microscales(
            buffer, compact, along_rows=layout == "columnwise", swizzled=self.optimize_for_gemm
        )

    def _dequantize_layout(self, parts: dict[str, torch.Tensor], layout: str) -> torch.Tensor:
        block = (1, BLOCK) if layout == "rowwise" else (BLOCK, 1)  # the stored scale layout
        return numerics.mxfp8_dequantize(parts["data"], parts["scale_inv"], *block)

    def _describe_layout(self, rows: int, cols: int, layout: str) -> BufferSpec:
        compact = (rows, cols // BLOCK) if layout == "rowwise" else (rows // BLOCK, cols)
        scale_shape = scale_layouts.microscale_padded_shape(compact, along_rows=layout == "columnwise")
        return {"data": ((rows, cols), self.fp8_dtype), "scale_inv": (scale_shape, torch.uint8)}


# ------------------------------------------------------------------ CUDA fast paths
@dispatch.QUANTIZE.register(MXFP8Quantizer)
def _mxfp8_buffers(q: MXFP8Quantizer, x: torch.Tensor, x2d: torch.Tensor,
                   options: dict[str, Any]) -> dict[str, torch.Tensor | None] | None:
    """1 x 32 and 32 x 1 blocks from one read of x; 32 x 32 blocks run the reference."""
    if options or q.with_2d_quantization or not kernels.enabled(x):
        return None
    from tetrt_support.quant.kernels.mxfp8 import mxfp8_quantize

    rd, rs, cd, cs = mxfp8_quantize(x2d, q.fp8_dtype, rowwise=q.rowwise_usage,
                                    columnwise=q.columnwise_usage)
    return dispatch.kernel_layouts(q, rd, rs, cd, cs)


@dispatch.GEMM.register(MXFP8Tensor)
def _mxfp8_mm(a: MXFP8Tensor, b: MXFP8Tensor, *, layout_a: str | None, layout_b: str | None,
              transpose_a: bool, transpose_b: bool, out_dtype: torch.dtype,
              fast_accum: bool) -> torch.Tensor | None:
    """Emulated: bf16 operands holding the dequantized values exactly. Both copies keep the
    (M, K) layout: row-wise scales per 1 x 32, column-wise per 32 x 1."""
    del fast_accum  # no such setting for the block formats' GEMMs
    both = dispatch.operands(a, b, layout_a, layout_b, dispatch.row_column_parts)
    if both is None:
        return None
    from tetrt_support.quant.kernels import gemm
    from tetrt_support.quant.kernels.mxfp8 import mxfp8_dequantize_bf16

    def values(parts: dispatch.Parts) -> torch.Tensor:
        data, scale, _, layout = parts
        block = (1, BLOCK) if layout == "rowwise" else (BLOCK, 1)
        return mxfp8_dequantize_bf16(data, scale, *block)

    lhs, rhs = values(both[0]), values(both[1])
    return gemm.emulated_mm(lhs.t() if transpose_a else lhs, rhs if transpose_b else rhs.t(),
                            out_dtype=out_dtype)
