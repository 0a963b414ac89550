"""NVFP4: E2M1 values packed two per byte, an E4M3 scale per 1x16 block, an fp32 global scale.

Two-level scaling (TransformerEngine's reference recipe): the per-tensor global encode
scale ``S = 448 * 6 / amax`` (fp32; amax 0 or non-finite -> 1, an infinite S -> fp32 max)
maps the largest block scale onto E4M3's range; each block stores the E4M3 value of
``block_amax / 6 * S`` and its elements are encoded as E2M1 of ``x * S / stored``.
Dequantization: ``e2m1 * stored / S``. The per-tensor amax is stored (``_amax_*``),
S is recomputed from it.

Optional random Hadamard transform (RHT): each group of 16 consecutive elements along
the quantized dim is multiplied by ``diag(signs) @ H16 / 4`` before quantization (it
spreads outliers across the block), and by its transpose after dequantization. Only the
integer sign mask is a value field; the matrix is derived state, rebuilt from the mask
by ``_rebuild_derived_state``, never part of the value key. (TransformerEngine applies
the RHT only to the column-wise operand of the weight-gradient GEMM; here ``with_rht``
applies it to every usage the quantizer produces, which is exact for any GEMM over K as
long as both operands use the same matrix.) The quantized dim must be a multiple of 16.
"""

from __future__ import annotations

import torch

from tetrt_support.quant import numerics
from tetrt_support.quant.mxfp8 import _check_block_multiple
from tetrt_support.quant.quantizer import BufferSpec, RowColumnQuantizer
from tetrt_support.quant.tensors import NVFP4Tensor

BLOCK = 16
GLOBAL_MAX = 448.0 * numerics.E2M1_MAX
DEFAULT_RHT_SIGN_MASK = 0b1010_0111_0010_1101  # a fixed "random" pattern, as TransformerEngine ships one


def random_sign_mask(seed: int) -> int:
    """A reproducible random 16-bit sign mask for the Hadamard transform."""
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 2, (BLOCK,), generator=generator)
    return int(sum(int(b) << i for i, b in enumerate(bits)))


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """S = 448 * 6 / amax with the current-scaling rules (amax 0 or non-finite -> 1)."""
    return numerics.scale_from_amax(amax, GLOBAL_MAX)


class NVFP4Quantizer(RowColumnQuantizer):
    """NVFP4 with 1x16 blocks, optional 16x16 random Hadamard transform; value semantics."""

    tensor_class = NVFP4Tensor
    _value_semantics = True
    _format_fields = ("with_rht", "rht_sign_mask")

    def __init__(
        self,
        *,
        rowwise_usage: bool = True,
        columnwise_usage: bool = False,
        internal: bool = False,
        with_rht: bool = False,
        rht_sign_mask: int = DEFAULT_RHT_SIGN_MASK,
    ) -> None:
        super().__init__(rowwise_usage=rowwise_usage, columnwise_usage=columnwise_usage, internal=internal)
        if not 0 <= int(rht_sign_mask) < (1 << BLOCK):
            raise ValueError(f"NVFP4Quantizer: rht_sign_mask must fit in {BLOCK} bits, got {rht_sign_mask}")
        self.with_rht = bool(with_rht)
        self.rht_sign_mask = int(rht_sign_mask)
        self._rebuild_derived_state()

    def _rebuild_derived_state(self) -> None:
        """The Hadamard matrix is derived from the mask: rebuilt, never copied or keyed."""
        self._derived_rht_matrix = numerics.random_hadamard_matrix(self.rht_sign_mask, BLOCK) if self.with_rht else None

    @property
    def rht_matrix(self) -> torch.Tensor | None:
        return self._derived_rht_matrix

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        _check_block_multiple(type(self).__name__, shape, BLOCK, self.rowwise_usage, self.columnwise_usage)

    def _quantize_rows(self, x2d: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.with_rht:
            x2d = numerics.apply_hadamard(x2d, self._derived_rht_matrix)
        amax = x2d.abs().amax().reshape(1) if x2d.numel() else torch.zeros(1, device=x2d.device)
        s_enc = global_encode_scale(amax)
        block_amax = numerics.block_amax(x2d, 1, BLOCK)
        block_scale = numerics.cast_to_fp8(block_amax / numerics.E2M1_MAX, s_enc, torch.float8_e4m3fn)
        stored = block_scale.float()
        encode = torch.where(stored == 0, torch.zeros_like(stored), s_enc / stored)
        codes = numerics.e2m1_encode(x2d * numerics.expand_block_scales(encode, 1, BLOCK, tuple(x2d.shape)))
        return {"data": numerics.pack_fp4(codes), "scale_inv": block_scale, "amax": amax.float()}

    def _dequantize_rows(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        values = numerics.e2m1_decode(numerics.unpack_fp4(parts["data"]))
        decode = parts["scale_inv"].float() / global_encode_scale(parts["amax"])
        x2d = values * numerics.expand_block_scales(decode, 1, BLOCK, tuple(values.shape))
        if self.with_rht:
            x2d = numerics.apply_hadamard(x2d, self._derived_rht_matrix.t())
        return x2d

    def _describe_rows(self, rows: int, cols: int) -> BufferSpec:
        return {
            "data": ((rows, cols // 2), torch.uint8),
            "scale_inv": ((rows, cols // BLOCK), torch.float8_e4m3fn),
            "amax": ((1,), torch.float32),
        }
