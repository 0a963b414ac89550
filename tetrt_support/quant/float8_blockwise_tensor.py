"""FP8 blockwise scaling (DeepSeek-V3 style): one fp32 scale per 1x128 or 128x128 block.

``block_scaling_dim=1`` (1x128: activations, gradients) or ``2`` (128x128: weights, the
default), as in TE's ``Float8BlockScaling``; each block follows TE's current-scaling rule
with power-of-two scales by default
(:func:`~tetrt_support.quant.numerics.float8_blockwise_quantize`). Any shape is accepted:
edge blocks are partial, their zero padding never raises an amax. Data shapes are TE's (column-wise ``(shape[-1], *shape[:-1])``) and
scales TE's GEMM-ready layout (:mod:`tetrt_support.quant.scale_layouts`).
"""

from __future__ import annotations

import torch

from tetrt_support.quant import numerics, scale_layouts
from tetrt_support.quant.base import BufferSpec, QuantizedTensor, RowColumnQuantizer
from tetrt_support.quant.dynamo import register_value_quantizer

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
        if fp8_dtype not in numerics.FP8_DTYPES:
            raise ValueError(f"Float8BlockQuantizer: fp8_dtype must be one of {numerics.FP8_DTYPES}, got {fp8_dtype}")
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
