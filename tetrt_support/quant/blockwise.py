"""FP8 blockwise scaling (DeepSeek-V3 style): one fp32 scale per 1x128 or 128x128 block.

1x128 blocks (``block_scaling_dim=1``) suit activations and gradients, 128x128 blocks
(``block_scaling_dim=2``) weights. Each block's scale follows the current-scaling rules
(fp8_max / block amax; amax 0 -> 1; optionally rounded DOWN to a power of two, the
default as in TransformerEngine). Any shape is accepted: edge blocks are partial (the
scale grid is ceil-divided, padding is zeros and never raises an amax).
"""

from __future__ import annotations

import torch

from tetrt_support.quant import numerics
from tetrt_support.quant.quantizer import BufferSpec, RowColumnQuantizer
from tetrt_support.quant.tensors import Float8BlockwiseTensor

BLOCK = 128


class Float8BlockQuantizer(RowColumnQuantizer):
    """FP8 with fp32 per-block scales; value semantics."""

    tensor_class = Float8BlockwiseTensor
    _value_semantics = True
    _format_fields = ("fp8_dtype", "block_scaling_dim", "force_pow_2_scales", "amax_epsilon")

    def __init__(
        self,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        *,
        rowwise_usage: bool = True,
        columnwise_usage: bool = False,
        internal: bool = False,
        block_scaling_dim: int = 1,
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
        return (1, BLOCK) if self.block_scaling_dim == 1 else (BLOCK, BLOCK)

    def _quantize_rows(self, x2d: torch.Tensor) -> dict[str, torch.Tensor]:
        rows, cols = self.block_shape
        amax = numerics.block_amax(x2d, rows, cols)
        scale = numerics.scale_from_amax(
            amax, numerics.fp8_max(self.fp8_dtype), power_of_2=self.force_pow_2_scales, epsilon=self.amax_epsilon
        )
        full_scale = numerics.expand_block_scales(scale, rows, cols, tuple(x2d.shape))
        return {"data": numerics.cast_to_fp8(x2d, full_scale, self.fp8_dtype), "scale_inv": 1.0 / scale}

    def _dequantize_rows(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        rows, cols = self.block_shape
        data = parts["data"]
        return data.float() * numerics.expand_block_scales(parts["scale_inv"], rows, cols, tuple(data.shape))

    def _describe_rows(self, rows: int, cols: int) -> BufferSpec:
        br, bc = self.block_shape
        return {
            "data": ((rows, cols), self.fp8_dtype),
            "scale_inv": ((numerics.ceil_div(rows, br), numerics.ceil_div(cols, bc)), torch.float32),
        }
