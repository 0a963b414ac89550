"""FP8 blockwise scaling (DeepSeek-V3 style): one fp32 scale per 1x128 or 128x128 block.

``block_scaling_dim=1`` (1x128: activations, gradients) or ``2`` (128x128: weights, the
default), as in TE's ``Float8BlockScaling``; each block follows TE's current-scaling rule
with power-of-two scales by default
(:func:`~tetrt_support.quant.numerics.float8_blockwise_quantize`). Any shape is accepted:
edge blocks are partial, their zero padding never raises an amax. Data shapes are TE's (column-wise ``(shape[-1], *shape[:-1])``) and
scales TE's GEMM-ready layout (:mod:`tetrt_support.quant.scale_layouts`).
Its CUDA fast paths (quantize, GEMM) are registered at the end (:mod:`.kernels.dispatch`).
"""

from __future__ import annotations

from typing import Any

import torch

from tetrt_support.quant import kernels, numerics, scale_layouts
from tetrt_support.quant.base import BufferSpec, QuantizedTensor, RowColumnQuantizer
from tetrt_support.quant.dynamo import register_value_quantizer
from tetrt_support.quant.kernels import dispatch

BLOCK = 128


class Float8BlockwiseTensor(QuantizedTensor):
    """FP8 with fp32 scales per 1x128 or 128x128 block; row-wise data in the logical shape
    (2-D view (M, K)), column-wise data ``(shape[-1], *shape[:-1])`` (view (K, M)) = the
    quantized transpose, each with its own 2-D scale_inv grid."""

    _FLATTEN_TENSOR_BUFFERS = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")


@register_value_quantizer
class Float8BlockQuantizer(RowColumnQuantizer):
    """FP8 with fp32 per-block scales; value semantics.

    TE's ``Float8BlockQuantizer`` requires ``rowwise`` and ``columnwise`` as keywords; here
    the usages default to both on, as every other quantizer of this package (and TE's other
    quantizers) defaults them, so one spelling builds any format. A recipe sets them per role."""

    tensor_class = Float8BlockwiseTensor
    fp8_dtype: torch.dtype
    block_scaling_dim: int
    force_pow_2_scales: bool
    amax_epsilon: float

    def __init__(
        self,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        *,
        rowwise_usage: bool = True,
        columnwise_usage: bool = True,
        internal: bool = False,
        block_scaling_dim: int = 2,
        force_pow_2_scales: bool = True,
        amax_epsilon: float = 0.0,
    ) -> None:
        super().__init__(rowwise_usage=rowwise_usage, columnwise_usage=columnwise_usage, internal=internal)
        numerics.check_fp8_dtype(fp8_dtype, type(self).__name__)
        if block_scaling_dim not in (1, 2):
            raise ValueError(f"Float8BlockQuantizer: block_scaling_dim must be 1 (1x128) or 2 (128x128), got {block_scaling_dim}")
        self.fp8_dtype = fp8_dtype
        self.block_scaling_dim = int(block_scaling_dim)
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = float(amax_epsilon)

    @property
    def block_shape(self) -> tuple[int, int]:
        """(1, 128) or (128, 128). A property: reading it on a value-opaque quantizer inside a
        Dynamo trace trips torch 2.14 (a reproduced hazard; the Linear never does)."""
        return (1, BLOCK) if self.block_scaling_dim == 1 else (BLOCK, BLOCK)

    def _quantize_layout(self, matrix: torch.Tensor, layout: str) -> dict[str, torch.Tensor]:
        del layout
        data, scale_inv = numerics.float8_blockwise_quantize(
            matrix, self.fp8_dtype, *self.block_shape,
            force_pow_2_scales=self.force_pow_2_scales, amax_epsilon=self.amax_epsilon,
        )
        return {"data": data, "scale_inv": scale_inv}

    def _store_scale_inv(self, compact: torch.Tensor, layout: str) -> torch.Tensor:
        del layout
        return scale_layouts.store_blockwise_scales(compact, self.block_scaling_dim)

    def _load_scale_inv(self, buffer: torch.Tensor, data: torch.Tensor, layout: str) -> torch.Tensor:
        del layout
        br, bc = self.block_shape
        compact = (numerics.ceil_div(data.shape[0], br), numerics.ceil_div(data.shape[1], bc))
        return scale_layouts.load_blockwise_scales(buffer, compact, self.block_scaling_dim)

    def _dequantize_layout(self, parts: dict[str, torch.Tensor], layout: str) -> torch.Tensor:
        del layout
        data = parts["data"]
        return data.float() * numerics.expand_block_scales(parts["scale_inv"], *self.block_shape, tuple(data.shape))

    def _describe_layout(self, rows: int, cols: int, layout: str) -> BufferSpec:
        del layout
        br, bc = self.block_shape
        return {
            "data": ((rows, cols), self.fp8_dtype),
            "scale_inv": (
                scale_layouts.blockwise_padded_shape(
                    (numerics.ceil_div(rows, br), numerics.ceil_div(cols, bc)), self.block_scaling_dim
                ),
                torch.float32,
            ),
        }


# ------------------------------------------------------------------ CUDA fast paths
@dispatch.QUANTIZE.register(Float8BlockQuantizer)
def _blockwise_buffers(q: Float8BlockQuantizer, x: torch.Tensor, x2d: torch.Tensor,
                       options: dict[str, Any]) -> dict[str, torch.Tensor | None] | None:
    """The Triton kernel writes both layouts and TE's GEMM-ready scale buffers in one pass."""
    if options or not kernels.enabled(x):
        return None
    from tetrt_support.quant.kernels.float8 import blockwise_quantize

    rd, rs, cd, cs = blockwise_quantize(
        x2d, q.fp8_dtype, q.block_scaling_dim, force_pow_2_scales=q.force_pow_2_scales,
        amax_epsilon=q.amax_epsilon, rowwise=q.rowwise_usage, columnwise=q.columnwise_usage,
        gemm_ready_scales=True,
    )
    return dispatch.kernel_layouts(q, rd, rs, cd, cs, stored=True)


def gemm_ready_block_scales(t: Float8BlockwiseTensor, layout: str) -> torch.Tensor:
    """The scales of ``t``'s ``layout`` as cuBLASLt's blockwise GEMM reads them, as views of
    the stored (TE's GEMM-ready) buffer where its layout already is that: 1 x 128 scales as
    an (rows, K/128) view with strides (1, rows) (the stored transposed buffer, when rows
    needs no padding); 128 x 128 scales as the stored (rows/128, K/128 padded to 4) buffer,
    which :func:`~tetrt_support.quant.kernels.gemm.blockwise_fp8_mm` reads transposed.
    Otherwise a re-laid copy."""
    from tetrt_support.quant.kernels.gemm import outer_major_scales

    stored = getattr(t, f"_{layout}_scale_inv")
    rows = t._quantizer.data_2d(t, layout).shape[0]
    if t._quantizer.block_scaling_dim == 2:
        return stored if stored.is_contiguous() else t._quantizer.compact_scale_inv(t, layout)
    if stored.shape[1] == rows and stored.is_contiguous():
        return stored.t()
    return outer_major_scales(t._quantizer.compact_scale_inv(t, layout))


def _stored_parts(t: Float8BlockwiseTensor, layout: str | None) -> dispatch.Parts | None:
    # no compact scales: the GEMM reads the stored ones and makes compact ones where it needs them
    return dispatch.row_column_parts(t, layout, compact_scales=False)


@dispatch.GEMM.register(Float8BlockwiseTensor)
def _blockwise_mm(a: Float8BlockwiseTensor, b: Float8BlockwiseTensor, *, layout_a: str | None,
                  layout_b: str | None, transpose_a: bool, transpose_b: bool,
                  out_dtype: torch.dtype, fast_accum: bool) -> torch.Tensor | None:
    """Native blockwise GEMM when op(a)'s blocks run along the contraction dim as 1 x 128
    rows and op(b)^T's do too (1 x 128 rows, or 128 x 128 tiles in either orientation);
    otherwise, with power-of-two scales, a bf16 GEMM of the exactly dequantized operands."""
    del fast_accum  # no such setting for the block formats' GEMMs
    both = dispatch.operands(a, b, layout_a, layout_b, _stored_parts)
    if both is None or out_dtype != torch.bfloat16:
        return None
    from tetrt_support.quant.kernels import gemm
    from tetrt_support.quant.kernels.transpose import transpose_fp8

    (ad, _, _, la), (bd, _, _, lb) = both
    a2d, b2d = a._quantizer.block_scaling_dim == 2, b._quantizer.block_scaling_dim == 2
    # stored row-major matrices: row-wise (rows, cols) = the tensor; column-wise = its transpose
    a_rows_are_op = (la == "columnwise") == transpose_a  # the stored rows are op(a)'s rows
    bt_rows_are_stored = (lb == "columnwise") != transpose_b  # op(b)^T == the stored matrix
    if not a2d and a_rows_are_op and ad.is_cuda:
        m, k = ad.shape
        if b2d:
            if bt_rows_are_stored:
                b_nk, b_scale = bd, gemm_ready_block_scales(b, lb)
            else:  # a 128 x 128 copy transposes exactly: bytes and block scales
                b_nk = transpose_fp8(bd)
                b_scale = b._quantizer.compact_scale_inv(b, lb).t().contiguous()
            if gemm.blockwise_supported(m, b_nk.shape[0], k):
                return gemm.blockwise_fp8_mm(ad, gemm_ready_block_scales(a, la), b_nk, b_scale,
                                             b_two_d=True, out_dtype=out_dtype)
        elif bt_rows_are_stored and gemm.blockwise_supported(m, bd.shape[0], k):
            return gemm.blockwise_fp8_mm(ad, gemm_ready_block_scales(a, la), bd,
                                         gemm_ready_block_scales(b, lb), b_two_d=False,
                                         out_dtype=out_dtype)
    as_, bs = a._quantizer.compact_scale_inv(a, la), b._quantizer.compact_scale_inv(b, lb)
    # Otherwise: FP8 times power-of-two scales is exact in bf16 (for normal results), so a
    # bf16 GEMM of the dequantized copies differs from the reference only by accumulation.
    if not (a._quantizer.force_pow_2_scales and b._quantizer.force_pow_2_scales):
        return None
    from tetrt_support.quant.kernels.dequantize import blockwise_dequantize_bf16

    lhs = blockwise_dequantize_bf16(ad, as_, 128 if a2d else 1)
    rhs = blockwise_dequantize_bf16(bd, bs, 128 if b2d else 1)
    lhs = lhs if a_rows_are_op else lhs.t()
    rhs = rhs if bt_rows_are_stored else rhs.t()
    return gemm.emulated_mm(lhs, rhs, out_dtype=out_dtype)
