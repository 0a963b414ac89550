"""NVFP4: E2M1 values packed two per byte, an E4M3 scale per 16-element block, an fp32 global scale.

:class:`NVFP4Quantizer` takes TE's ``NVFP4Quantizer`` options by name and default (random
Hadamard transform, 2-D blocks, stochastic rounding, row-scaled amaxes, 4over6), refuses the
combinations TE refuses, and stores buffers in TE's shapes and padding. The numerics are in
:mod:`tetrt_support.quant.numerics`; the scaling formula and each option's rules are in
``docs/architecture.md`` ("Module notes", NVFP4).
Its CUDA fast paths (quantize, GEMM) are registered at the end (:mod:`.kernels.dispatch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tetrt_support.quant import kernels, numerics, philox, scale_layouts
from tetrt_support.quant.base import (
    BufferSpec, QuantizedTensor, RowColumnQuantizer, all_reduce_max, as_dims, check_block_multiple, rows_cols,
)
from tetrt_support.quant.dynamo import register_value_quantizer
from tetrt_support.quant.kernels import dispatch

BLOCK = numerics.NVFP4_BLOCK
TE_RHT_SIGN_MASK = numerics.TE_RHT_SIGN_MASK


class NVFP4Tensor(QuantizedTensor):
    """NVFP4: E2M1 codes packed two per byte (uint8 (..., K/2) in the input's leading dims;
    column-wise (K, M/2)), one E4M3 scale per 16-element block ((M, K/16); column-wise
    (K, M/16), 2-D) and a per-usage fp32 amax.
    Amax buffers last, as in TE's flatten order."""

    _FLATTEN_TENSOR_BUFFERS = (
        "_rowwise_data",
        "_rowwise_scale_inv",
        "_columnwise_data",
        "_columnwise_scale_inv",
        "_amax_rowwise",
        "_amax_columnwise",
    )


@register_value_quantizer
class NVFP4Quantizer(RowColumnQuantizer):
    """NVFP4 with 1x16 or 16x16 blocks, optional RHT (column-wise), stochastic rounding,
    row-scaled amaxes and 4over6 block selection; value semantics. Fields, names and
    defaults are TE's ``NVFP4Quantizer``'s (``rht_sign_mask`` stands for TE's
    ``with_random_sign_mask``: TE's mask by default, 0 for none)."""

    tensor_class = NVFP4Tensor
    with_rht: bool
    with_post_rht_amax: bool
    rht_sign_mask: int
    with_2d_quantization: bool
    stochastic_rounding: bool
    row_scaled_nvfp4: bool
    nvfp4_use_4over6: bool
    nvfp4_e4m3_max: int
    nvfp4_4over6_err_mode: str
    optimize_for_gemm: bool
    rht_any_input_dtype: bool
    nvfp4_4over6_err_use_fast_math: bool

    def __init__(
        self,
        *,
        rowwise_usage: bool = True,
        columnwise_usage: bool = True,
        internal: bool = False,
        with_rht: bool = False,
        with_post_rht_amax: bool = False,
        rht_sign_mask: int = TE_RHT_SIGN_MASK,
        with_2d_quantization: bool = False,
        stochastic_rounding: bool = False,
        row_scaled_nvfp4: bool = False,
        nvfp4_use_4over6: bool = False,
        nvfp4_e4m3_max: int = 448,
        nvfp4_4over6_err_mode: str = "MAE",
        optimize_for_gemm: bool = False,
        rht_any_input_dtype: bool = False,
        nvfp4_4over6_err_use_fast_math: bool = False,
    ) -> None:
        super().__init__(rowwise_usage=rowwise_usage, columnwise_usage=columnwise_usage, internal=internal)
        if not 0 <= int(rht_sign_mask) < (1 << BLOCK):
            raise ValueError(f"NVFP4Quantizer: rht_sign_mask must fit in {BLOCK} bits, got {rht_sign_mask}")
        self.with_rht = bool(with_rht)
        self.with_post_rht_amax = bool(with_post_rht_amax)
        self.rht_sign_mask = int(rht_sign_mask)
        self.with_2d_quantization = bool(with_2d_quantization)
        self.stochastic_rounding = bool(stochastic_rounding)
        self.row_scaled_nvfp4 = bool(row_scaled_nvfp4)
        self.nvfp4_use_4over6 = bool(nvfp4_use_4over6)
        self.nvfp4_e4m3_max = int(nvfp4_e4m3_max) if self.nvfp4_use_4over6 else 448  # TE ignores it without 4over6
        self.nvfp4_4over6_err_mode = str(nvfp4_4over6_err_mode).upper()
        self.optimize_for_gemm = bool(optimize_for_gemm)
        self.rht_any_input_dtype = bool(rht_any_input_dtype) and self.with_rht  # no transform: nothing to allow
        self.nvfp4_4over6_err_use_fast_math = bool(nvfp4_4over6_err_use_fast_math) and self.nvfp4_use_4over6
        self._check_options()
        self._rebuild_derived_state()

    def _check_options(self) -> None:
        """The combinations TE refuses (its quantizer, C++ quantize path and recipe), refused here at construction."""
        name = type(self).__name__
        if self.with_rht and not self.with_post_rht_amax:
            raise ValueError(
                f"{name}: with_rht=True needs with_post_rht_amax=True (TE computes the column-wise amax after the "
                "Hadamard transform only; a pre-RHT amax is not supported)"
            )
        if self.nvfp4_e4m3_max not in (448, 256):
            raise ValueError(f"{name}: nvfp4_e4m3_max must be 448 or 256, got {self.nvfp4_e4m3_max}")
        if self.nvfp4_4over6_err_mode not in ("MAE", "MSE"):
            raise ValueError(f"{name}: nvfp4_4over6_err_mode must be 'MAE' or 'MSE', got {self.nvfp4_4over6_err_mode!r}")
        if self.nvfp4_use_4over6:
            for flag in ("with_rht", "stochastic_rounding"):
                if getattr(self, flag):
                    raise ValueError(f"{name}: 4over6 does not support {flag}=True (TE refuses the combination)")
        if self.row_scaled_nvfp4:
            if not self.rowwise_usage:
                raise ValueError(f"{name}: row-scaled NVFP4 requires rowwise usage")
            for flag in ("with_rht", "with_2d_quantization", "stochastic_rounding"):
                if getattr(self, flag):
                    raise ValueError(f"{name}: row-scaled NVFP4 does not support {flag}=True (TE refuses the combination)")

    def _check_usage(self) -> None:
        super()._check_usage()
        if getattr(self, "row_scaled_nvfp4", False) and not self.rowwise_usage:
            raise ValueError(f"{type(self).__name__}: row-scaled NVFP4 requires rowwise usage")

    def _rebuild_derived_state(self) -> None:
        """The Hadamard matrix is derived from the mask: rebuilt, never copied or keyed."""
        self._derived_rht_matrix = numerics.random_hadamard_matrix(self.rht_sign_mask, BLOCK) if self.with_rht else None

    @property
    def rht_matrix(self) -> torch.Tensor | None:
        """The 16 x 16 Hadamard matrix; a copy for a frozen (shared) quantizer, so that an
        in-place change by one caller cannot reach the others."""
        matrix = self._derived_rht_matrix
        return matrix.clone() if matrix is not None and self.is_frozen else matrix

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        check_block_multiple(type(self).__name__, shape, BLOCK)

    def _check_input(self, x: torch.Tensor) -> None:
        """TE's kernels refuse the transform on non-bf16 input, whatever the usage, and the
        column-wise layout of row-scaled NVFP4 unless the input is bf16 with both dims of its
        2-D view multiples of 32 and 4over6 is off (``common/cast/dispatch/quantize.cuh``).
        An empty input returns before TE's checks, so it passes here too."""
        if x.numel() == 0:
            return
        if self.row_scaled_nvfp4 and self.columnwise_usage:
            self._check_row_scaled_columnwise(x)
        if not self.with_rht or self.rht_any_input_dtype or x.dtype == torch.bfloat16:
            return
        layouts = " and ".join(layout.replace("wise", "-wise") for layout in self._used_layouts())
        raise TypeError(
            f"{type(self).__name__}.quantize: with_rht=True takes torch.bfloat16 input only, as TransformerEngine's "
            f"kernels do (\"RHT is only supported for bfloat16 input\"); got {x.dtype} to quantize {layouts} (the "
            "Hadamard transform applies to the column-wise layout). Cast the input to torch.bfloat16, or build the "
            "quantizer with rht_any_input_dtype=True to accept any dtype, as TE's reference quantizer does"
        )

    def _check_row_scaled_columnwise(self, x: torch.Tensor) -> None:
        name = type(self).__name__
        if self.nvfp4_use_4over6:
            raise ValueError(
                f"{name}.quantize: row-scaled NVFP4 with column-wise usage is not supported with 4over6, as in "
                "TransformerEngine (\"Row-scaled NVFP4 transpose quantization is not supported with 4over6 mode\": "
                "its 4over6 kernel does not read the per-row/per-column amaxes). Set columnwise_usage=False or "
                "nvfp4_use_4over6=False"
            )
        m, k = rows_cols(tuple(x.shape))
        if x.dtype != torch.bfloat16 or m % 32 or k % 32:
            raise ValueError(
                f"{name}.quantize: row-scaled NVFP4 with column-wise usage needs torch.bfloat16 input with the "
                "product of the leading dims and the last dim multiples of 32, as TransformerEngine requires "
                "(\"Row-scaled NVFP4 transpose quantization requires BF16 input and dimensions that are "
                f"multiples of 32\"); got {x.dtype} of shape {tuple(x.shape)}. Cast to torch.bfloat16, or set "
                "columnwise_usage=False"
            )

    def _layout_matrix(self, x2d: torch.Tensor, layout: str) -> torch.Tensor:
        if layout == "rowwise":
            return x2d
        x_t = x2d.t().contiguous()
        if not self.with_rht:
            return x_t
        return numerics.apply_hadamard(x_t, numerics.random_hadamard_matrix(self.rht_sign_mask, device=x_t.device))

    def _quantize_layout(
        self, matrix: torch.Tensor, layout: str, *, generator: torch.Generator | None = None, amax_reduction_group: Any = None
    ) -> dict[str, torch.Tensor]:
        del layout
        if self.row_scaled_nvfp4:
            if amax_reduction_group is not None:
                raise ValueError(f"{type(self).__name__}: row-scaled NVFP4 does not support amax reduction (TE refuses it)")
            amax = (numerics.block_amax(matrix, 1, matrix.shape[1]).reshape(-1) if matrix.shape[1]  # one per row
                    else matrix.new_zeros(matrix.shape[0], dtype=torch.float32))  # rows of nothing: amax 0
        else:
            amax = numerics.amax(matrix).reshape(1)
        if amax_reduction_group is not None:  # TE's with_amax_reduction: one global scale across ranks
            amax = all_reduce_max(amax, amax_reduction_group)
        uniform = None
        if self.stochastic_rounding:  # one seed per layout; the draws are counted per element
            uniform = philox.uniform(philox.draw_seed(generator, matrix.device), matrix.shape).to(matrix.device)
        data, scale = numerics.nvfp4_quantize(
            matrix, amax, BLOCK if self.with_2d_quantization else 1, uniform=uniform,
            e4m3_max=float(self.nvfp4_e4m3_max), four_over_six=self.nvfp4_4over6_err_mode if self.nvfp4_use_4over6 else None,
            four_over_six_fast_math=self.nvfp4_4over6_err_use_fast_math,
        )
        return {"data": data, "scale_inv": scale, "amax": amax}

    def _data_shape(self, shape: Sequence[int], layout: str) -> tuple[Any, ...]:
        """TE's ``NVFP4Quantizer::create_tensor``: row-wise codes in the N-D shape with the last
        dim halved (``convert_shape_for_fp4``); column-wise codes 2-D, (K, M/2), on purpose
        ("enforce 2D shape": a transposed (H, S, 1) would halve the 1 to 0). TE's pure-Python
        allocation (``inner_tensor_specs``) gives ``(K, *leading)`` halved instead; the
        C++ quantize path, which this quantizer stands for, allocates the 2-D one."""
        shape = as_dims(shape)
        if layout == "rowwise":
            return (*shape[:-1], shape[-1] // 2)
        m, k = rows_cols(shape)
        return (k, m // 2)

    def _store_scale_inv(self, compact: torch.Tensor, layout: str) -> torch.Tensor:
        del layout  # the column-wise scales belong to the transposed data: same padding rule
        return scale_layouts.store_microscales(compact, along_rows=False, swizzled=self.optimize_for_gemm)

    def _load_scale_inv(self, buffer: torch.Tensor, data: torch.Tensor, layout: str) -> torch.Tensor:
        del layout
        rows, half_cols = data.shape
        compact = (rows, 2 * half_cols // BLOCK)
        return scale_layouts.load_microscales(buffer, compact, along_rows=False, swizzled=self.optimize_for_gemm)

    def gemm_operand(self, tensor: NVFP4Tensor, layout: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, amax) of ``tensor``'s ``layout``: the (M, K) values WITHOUT the per-tensor
        factor (``e2m1 * e4m3``, the Hadamard rotation undone) and that layout's amax -- the
        operand TE's GEMM multiplies and the amax its alpha is formed from
        (:func:`~tetrt_support.quant.numerics.nvfp4_gemm_alpha`)."""
        layout, parts = self._layout_parts(tensor, layout)
        values = self._dequantize_layout(parts, layout, per_tensor=False)
        return (values.t() if self._is_transposed(layout) else values), parts["amax"]

    def _dequantize_layout(self, parts: dict[str, torch.Tensor], layout: str, *, per_tensor: bool = True) -> torch.Tensor:
        amax = parts["amax"] if per_tensor else None
        values = numerics.nvfp4_dequantize(parts["data"], parts["scale_inv"], amax, float(self.nvfp4_e4m3_max))
        if layout == "columnwise" and self.with_rht:
            matrix = numerics.random_hadamard_matrix(self.rht_sign_mask, device=values.device)
            values = numerics.apply_hadamard(values, matrix.t())
        return values

    def _describe_layout(self, rows: int, cols: int, layout: str) -> BufferSpec:
        del layout
        return {
            "data": ((rows, cols // 2), torch.uint8),
            "scale_inv": (scale_layouts.microscale_padded_shape((rows, cols // BLOCK), along_rows=False), torch.float8_e4m3fn),
            "amax": ((rows if self.row_scaled_nvfp4 else 1,), torch.float32),
        }


# ------------------------------------------------------------------ CUDA fast paths
@dispatch.QUANTIZE.register(NVFP4Quantizer)
def _nvfp4_buffers(q: NVFP4Quantizer, x: torch.Tensor, x2d: torch.Tensor,
                   options: dict[str, Any]) -> dict[str, torch.Tensor | None] | None:
    """The Triton kernels for 1 x 16 and 16 x 16 blocks, RHT and stochastic rounding; an
    amax reduction, row-scaled amaxes and 4over6 run the reference."""
    if set(options) - {"generator", "amax_reduction_group"}:
        return None
    if options.get("amax_reduction_group") is not None:
        return None
    if q.row_scaled_nvfp4 or q.nvfp4_use_4over6 or not kernels.enabled(x):
        return None
    from tetrt_support.quant.kernels.nvfp4 import nvfp4_quantize

    block_rows = BLOCK if q.with_2d_quantization else 1
    if not (q.columnwise_usage and (q.with_rht or q.stochastic_rounding)):
        # both layouts from one read of x (the column-wise one is the recipe on x^T)
        seed = None
        if q.stochastic_rounding:  # row-wise only here: the reference's one draw
            seed = philox.draw_seed(options.get("generator"), x2d.device)
        rd, rs, cd, cs, amax = nvfp4_quantize(x2d, None, block_rows, rowwise=q.rowwise_usage,
                                              columnwise=q.columnwise_usage, seed=seed)
        out = dispatch.kernel_layouts(q, rd, rs, cd, cs)
        if q.rowwise_usage:
            out["_amax_rowwise"] = amax
        if q.columnwise_usage:
            out["_amax_columnwise"] = amax.clone() if q.rowwise_usage else amax
        return out
    # The reference's structure, layout by layout: the layout's matrix (x, or x^T rotated by
    # the quantizer's Hadamard transform), its amax, its seed (same generator and order),
    # then the row-wise kernel on that matrix.
    out: dict[str, torch.Tensor | None] = {}
    for layout in ("rowwise", "columnwise"):
        if not getattr(q, f"{layout}_usage"):
            continue
        matrix = x2d if layout == "rowwise" else _columnwise_matrix(q, x2d)
        seed = None
        if q.stochastic_rounding:
            seed = philox.draw_seed(options.get("generator"), matrix.device)
        data, scale, _, _, amax = nvfp4_quantize(matrix, None, block_rows, seed=seed)
        out[f"_{layout}_data"] = data
        out[f"_{layout}_scale_inv"] = q._store_scale_inv(scale, layout)
        out[f"_amax_{layout}"] = amax
    return out


def _columnwise_matrix(q: NVFP4Quantizer, x2d: torch.Tensor) -> torch.Tensor:
    """``q._layout_matrix(x2d, "columnwise")``: ``x^T``, rotated by the quantizer's Hadamard
    matrix when ``with_rht`` -- in one kernel that transposes and rotates
    (:mod:`~tetrt_support.quant.kernels.hadamard`, the reference's float64 sums and
    roundings; the matrix is a compile-time constant of the kernel, given by its sign mask).
    The quantizer's own path builds the matrix from a Python list per call, a host-to-device
    copy that a CUDA graph capture refuses; where the reference runs here, the matrix is
    kept on the device."""
    if not q.with_rht:
        return x2d.t().contiguous()
    if x2d.shape[0] % BLOCK:  # the reference's own error, from its own code
        matrix = _device_hadamard(q.rht_sign_mask, x2d.device)
        return numerics.apply_hadamard(x2d.t().contiguous(), matrix)
    from tetrt_support.quant.kernels.hadamard import rht_transpose

    return rht_transpose(x2d, q.rht_sign_mask)


_HADAMARD: dict[tuple[int, str], torch.Tensor] = {}


def _device_hadamard(sign_mask: int, device: torch.device) -> torch.Tensor:
    """The quantizer's Hadamard matrix, built once per (mask, device) and kept there."""
    key = (sign_mask, str(device))
    if key not in _HADAMARD:
        _HADAMARD[key] = numerics.random_hadamard_matrix(sign_mask, device=device)
    return _HADAMARD[key]


@dispatch.GEMM.register(NVFP4Tensor)
def _nvfp4_mm(a: NVFP4Tensor, b: NVFP4Tensor, *, layout_a: str | None, layout_b: str | None,
              transpose_a: bool, transpose_b: bool, out_dtype: torch.dtype,
              fast_accum: bool) -> torch.Tensor | None:
    """Operands ``e2m1 * e4m3`` in bf16; TE's alpha after the GEMM. A column-wise
    copy is stored transposed, and when both copies carry the same Hadamard rotation along
    the contraction dim it cancels in the product (TE's wgrad), so it is not undone."""
    del fast_accum  # no such setting for the block formats' GEMMs
    both = dispatch.operands(a, b, layout_a, layout_b, dispatch.row_column_parts)
    if both is None:
        return None
    (ad, as_, aa, la), (bd, bs, ba, lb) = both
    if aa is None or ba is None or aa.numel() != 1 or ba.numel() != 1:
        return None  # row-scaled amaxes: the reference
    if a._quantizer.nvfp4_e4m3_max != 448 or b._quantizer.nvfp4_e4m3_max != 448:
        return None
    a_rows_are_op = (la == "columnwise") == transpose_a
    bt_rows_are_stored = (lb == "columnwise") != transpose_b
    rotated_a = la == "columnwise" and a._quantizer.with_rht
    rotated_b = lb == "columnwise" and b._quantizer.with_rht
    if rotated_a or rotated_b:  # the rotation cancels only between two copies rotated alike along K
        if not (rotated_a and rotated_b and a_rows_are_op and bt_rows_are_stored
                and a._quantizer.rht_sign_mask == b._quantizer.rht_sign_mask):
            return None
    from tetrt_support.quant.kernels import gemm
    from tetrt_support.quant.kernels.nvfp4 import nvfp4_operand_bf16

    lhs, rhs = nvfp4_operand_bf16(ad, as_), nvfp4_operand_bf16(bd, bs)
    return gemm.nvfp4_emulated_mm(lhs if a_rows_are_op else lhs.t(),
                                  rhs if bt_rows_are_stored else rhs.t(), aa, ba,
                                  out_dtype=out_dtype)
