"""Where the quantizers and the quantized GEMM take the fast path, and where they do not.

:func:`fast_buffers` (from ``Quantizer.quantize``) and :func:`fast_matmul` (from
``ops.quantized_matmul``) return ``None`` when the reference must run instead; nothing here
changes a result beyond the GEMM's accumulation order. What is covered:
``docs/architecture.md`` ("Module notes", quantized GEMMs).
"""

from __future__ import annotations

from typing import Any

import torch

from tetrt_support.quant.kernels import enabled


# ------------------------------------------------------------------------- quantize
def fast_buffers(quantizer: Any, x: torch.Tensor, options: dict[str, Any]) -> dict[str, torch.Tensor | None] | None:
    """The buffers ``quantizer.quantize(x, **options)`` stores, or None (use the reference)."""
    if not enabled(x) or x.numel() == 0 or x.dim() == 0:
        return None
    handler = _HANDLERS.get(type(quantizer).__name__)
    if handler is None:
        return None
    x2d = x.reshape(-1, x.shape[-1])
    if x2d.stride(1) != 1:
        x2d = x2d.contiguous()
    return handler(quantizer, x, x2d, options)


def _current_scaling(q: Any, x: torch.Tensor, x2d: torch.Tensor, options: dict[str, Any]) -> dict | None:
    if any(v is not None for v in options.values()) or vars(q).get("amax_reduction_group") is not None:
        return None
    from tetrt_support.quant.kernels.float8 import current_scaling_quantize

    data, transpose, scale_inv, _ = current_scaling_quantize(
        x2d, q.fp8_dtype, force_pow_2_scales=q.force_pow_2_scales, amax_epsilon=q.amax_epsilon,
        rowwise=True, columnwise=q.columnwise_usage,
    )
    shape = tuple(x.shape)
    if transpose is not None and len(shape) > 2:
        transpose = transpose.reshape(shape[-1], *shape[:-1])
    return {"_data": data.reshape(shape) if q.rowwise_usage else None, "_transpose": transpose, "_scale_inv": scale_inv}


def _blockwise(q: Any, x: torch.Tensor, x2d: torch.Tensor, options: dict[str, Any]) -> dict | None:
    if options:
        return None
    from tetrt_support.quant.kernels.float8 import blockwise_quantize

    rd, rs, cd, cs = blockwise_quantize(
        x2d, q.fp8_dtype, q.block_scaling_dim, force_pow_2_scales=q.force_pow_2_scales, amax_epsilon=q.amax_epsilon,
        rowwise=q.rowwise_usage, columnwise=q.columnwise_usage, gemm_ready_scales=True,
    )
    return _layouts(q, rd, rs, cd, cs, stored=True)  # scales already in TE's GEMM-ready layout


def _mxfp8(q: Any, x: torch.Tensor, x2d: torch.Tensor, options: dict[str, Any]) -> dict | None:
    if options or q.with_2d_quantization:
        return None
    from tetrt_support.quant.kernels.mxfp8 import mxfp8_quantize

    rd, rs, cd, cs = mxfp8_quantize(x2d, q.fp8_dtype, rowwise=q.rowwise_usage, columnwise=q.columnwise_usage)
    return _layouts(q, rd, rs, cd, cs)


def _nvfp4(q: Any, x: torch.Tensor, x2d: torch.Tensor, options: dict[str, Any]) -> dict | None:
    if options.get("amax_reduction_group") is not None or set(options) - {"generator", "amax_reduction_group"}:
        return None
    if q.row_scaled_nvfp4 or q.nvfp4_use_4over6:  # no kernel for these: the reference runs
        return None
    from tetrt_support.quant import philox
    from tetrt_support.quant.kernels.nvfp4 import nvfp4_quantize

    block_rows = 16 if q.with_2d_quantization else 1
    if not (q.columnwise_usage and (q.with_rht or q.stochastic_rounding)):
        # both layouts from one read of x (the column-wise one is the recipe on x^T)
        seed = None
        if q.stochastic_rounding:  # row-wise only here: the reference's one draw
            seed = philox.draw_seed(options.get("generator"), x2d.device)
        rd, rs, cd, cs, amax = nvfp4_quantize(x2d, None, block_rows, rowwise=q.rowwise_usage,
                                              columnwise=q.columnwise_usage, seed=seed)
        out = _layouts(q, rd, rs, cd, cs)
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
        matrix = x2d if layout == "rowwise" else _nvfp4_columnwise_matrix(q, x2d)
        seed = philox.draw_seed(options.get("generator"), matrix.device) if q.stochastic_rounding else None
        data, scale, _, _, amax = nvfp4_quantize(matrix, None, block_rows, seed=seed)
        out.update({f"_{layout}_data": data, f"_{layout}_scale_inv": q._store_scale_inv(scale, layout),
                    f"_amax_{layout}": amax})
    return out


def _nvfp4_columnwise_matrix(q: Any, x2d: torch.Tensor) -> torch.Tensor:
    """``NVFP4Quantizer._layout_matrix(x2d, "columnwise")``: ``x^T``, rotated by the
    quantizer's Hadamard matrix when ``with_rht`` -- in one kernel that transposes and
    rotates (:mod:`.hadamard`, the reference's float64 sums and roundings; the matrix is a
    compile-time constant of the kernel, given by its sign mask). The quantizer's own path
    builds the matrix from a Python list per call, a host-to-device copy that a CUDA graph
    capture refuses; where the reference runs here, the matrix is kept on the device."""
    if not q.with_rht:
        return x2d.t().contiguous()
    from tetrt_support.quant import numerics

    if x2d.shape[0] % 16:  # the reference's own error, from its own code
        return numerics.apply_hadamard(x2d.t().contiguous(), _device_hadamard(q.rht_sign_mask, x2d.device))
    from tetrt_support.quant.kernels.hadamard import rht_transpose

    return rht_transpose(x2d, q.rht_sign_mask)


_HADAMARD: dict[tuple[int, str], torch.Tensor] = {}


def _device_hadamard(sign_mask: int, device: torch.device) -> torch.Tensor:
    """The quantizer's Hadamard matrix, built once per (mask, device) and kept there."""
    key = (sign_mask, str(device))
    if key not in _HADAMARD:
        from tetrt_support.quant import numerics

        _HADAMARD[key] = numerics.random_hadamard_matrix(sign_mask, device=device)
    return _HADAMARD[key]


def _layouts(q: Any, rd: Any, rs: Any, cd: Any, cs: Any, *, stored: bool = False) -> dict[str, torch.Tensor | None]:
    """The quantizer's buffers from a kernel's outputs. Compact scales go into TE's (padded,
    GEMM-ready or swizzled) layout through the same function the reference path uses;
    ``stored``: the kernel already wrote that layout."""
    def keep(scales: Any, layout: str) -> Any:
        return scales if stored else q._store_scale_inv(scales, layout)

    out: dict[str, torch.Tensor | None] = {}
    if q.rowwise_usage:
        out.update(_rowwise_data=rd, _rowwise_scale_inv=keep(rs, "rowwise"))
    if q.columnwise_usage:
        out.update(_columnwise_data=cd, _columnwise_scale_inv=keep(cs, "columnwise"))
    return out


_HANDLERS = {
    "Float8CurrentScalingQuantizer": _current_scaling,
    "Float8BlockQuantizer": _blockwise,
    "MXFP8Quantizer": _mxfp8,
    "NVFP4Quantizer": _nvfp4,
}


# --------------------------------------------------------------------------- GEMMs
def fast_matmul(a: Any, b: Any, *, transpose_a: bool, transpose_b: bool, out_dtype: torch.dtype,
                layout_a: str | None = None, layout_b: str | None = None,
                fast_accum: bool = False) -> torch.Tensor | None:
    """``op(a) @ op(b)`` of two 2-D quantized tensors on the fast GEMM, or None (use the reference).

    ``layout_a`` / ``layout_b`` name the quantized copy of each operand to read, as for
    ``ops.quantized_matmul`` (None: the first present, row-wise before column-wise)."""
    pa, pb = _parts(a, layout_a), _parts(b, layout_b)
    if pa is None or pb is None or not enabled(pa[0]) or type(a) is not type(b):
        return None
    kind = type(a).__name__
    if kind == "Float8Tensor":
        return _tensorwise(a, b, pa, pb, transpose_a, transpose_b, out_dtype, fast_accum)
    if kind == "Float8BlockwiseTensor":
        return _blockwise_mm(a, b, pa, pb, transpose_a, transpose_b, out_dtype)
    if kind == "MXFP8Tensor":
        return _mxfp8_mm(pa, pb, transpose_a, transpose_b, out_dtype)
    if kind == "NVFP4Tensor":
        return _nvfp4_mm(a, b, pa, pb, transpose_a, transpose_b, out_dtype)
    return None


def _parts(t: Any, layout: str | None) -> tuple[Any, ...] | None:
    """(data, COMPACT scale_inv, amax-or-None, layout) of the named copy, None when it is absent.
    FP8 blockwise gives no scale here: its GEMM reads the stored buffers
    (:func:`gemm_ready_block_scales`) and makes compact ones only where it needs them.

    Data shapes, as the 2-D views the quantizers give of their stored (TE's N-D) buffers:
    per-tensor FP8 row-wise (M, K), column-wise (K, M); FP8 blockwise and NVFP4 column-wise
    (K, M) (the recipe on x^T); MXFP8 column-wise (M, K) with 32 x 1 blocks."""
    if type(t).__name__ == "Float8Tensor":
        names = {"rowwise": "_data", "columnwise": "_transpose"}
        for name in ([layout] if layout else ["rowwise", "columnwise"]):
            data = getattr(t, names[name], None)
            if data is not None:
                return (data, t._scale_inv, None, name) if data.dim() == 2 else None
        return None
    blockwise = type(t).__name__ == "Float8BlockwiseTensor"  # its GEMM reads the stored scales (_blockwise_mm)
    for name in ([layout] if layout else ["rowwise", "columnwise"]):
        if getattr(t, f"_{name}_data", None) is not None:
            data = t._quantizer.data_2d(t, name)  # stored N-D, as TE allocates it
            scale = None if blockwise else t._quantizer.compact_scale_inv(t, name)
            return data, scale, getattr(t, f"_amax_{name}", None), name
    return None


def gemm_ready_block_scales(t: Any, layout: str) -> torch.Tensor:
    """The scales of ``t``'s ``layout`` as cuBLASLt's blockwise GEMM reads them, as views of
    the stored (TE's GEMM-ready) buffer where its layout already is that: 1 x 128 scales as
    an (rows, K/128) view with strides (1, rows) (the stored transposed buffer, when rows
    needs no padding); 128 x 128 scales as the stored (rows/128, K/128 padded to 4) buffer,
    which :func:`~.gemm.blockwise_fp8_mm` reads transposed. Otherwise a re-laid copy."""
    from tetrt_support.quant.kernels.gemm import outer_major_scales

    stored = getattr(t, f"_{layout}_scale_inv")
    rows = t._quantizer.data_2d(t, layout).shape[0]
    if t._quantizer.block_scaling_dim == 2:
        return stored if stored.is_contiguous() else t._quantizer.compact_scale_inv(t, layout)
    if stored.shape[1] == rows and stored.is_contiguous():
        return stored.t()
    return outer_major_scales(t._quantizer.compact_scale_inv(t, layout))


def _matrix(parts: tuple[Any, ...], transposed_storage: bool) -> tuple[torch.Tensor, bool]:
    """(stored 2-D data, whether it holds the logical tensor transposed)."""
    data, _, _, layout = parts
    return data, transposed_storage and layout == "columnwise"


def _tensorwise(a: Any, b: Any, pa: tuple, pb: tuple, ta: bool, tb: bool, out_dtype: torch.dtype,
                fast_accum: bool = False) -> torch.Tensor | None:
    """``_scaled_mm(lhs row-major, rhs column-major)``; a per-tensor scale makes every
    transpose exact, so the other copy (or a transpose kernel) serves when one is missing."""
    from tetrt_support.quant.kernels.transpose import transpose_fp8

    if a._scale_inv.numel() != 1 or b._scale_inv.numel() != 1:
        return None

    def row_major(t: Any, parts: tuple, transposed: bool) -> torch.Tensor:
        """op(t) as a row-major matrix, from the stored copy ``parts`` (or the other one)."""
        data, stored_transposed = _matrix(parts, True)
        if stored_transposed == transposed:
            return data
        other = t._transpose if parts[3] == "rowwise" else t._data
        if other is not None and other.dim() == 2:
            return other
        return transpose_fp8(data)

    lhs = row_major(a, pa, ta)
    rhs_t = row_major(b, pb, not tb)  # op(b)^T row-major == op(b) column-major
    return torch._scaled_mm(lhs, rhs_t.t(), scale_a=a._scale_inv.reshape(()), scale_b=b._scale_inv.reshape(()),
                            out_dtype=out_dtype, use_fast_accum=fast_accum)


def _blockwise_mm(a: Any, b: Any, pa: tuple, pb: tuple, ta: bool, tb: bool, out_dtype: torch.dtype) -> torch.Tensor | None:
    """Native blockwise GEMM when op(a)'s blocks run along the contraction dim as 1 x 128
    rows and op(b)^T's do too (1 x 128 rows, or 128 x 128 tiles in either orientation)."""
    from tetrt_support.quant.kernels import gemm
    from tetrt_support.quant.kernels.transpose import transpose_fp8

    if out_dtype != torch.bfloat16:
        return None
    (ad, _, _, la), (bd, _, _, lb) = pa, pb
    a2d, b2d = a._quantizer.block_scaling_dim == 2, b._quantizer.block_scaling_dim == 2
    # stored row-major matrices: row-wise (rows, cols) = the tensor; column-wise = its transpose
    a_rows_are_op = (la == "columnwise") == ta  # the stored rows are op(a)'s rows
    bt_rows_are_stored = (lb == "columnwise") != tb  # op(b)^T == the stored matrix
    if not a2d and a_rows_are_op and ad.is_cuda:
        m, k = ad.shape
        if b2d:
            if bt_rows_are_stored:
                b_nk, b_scale = bd, gemm_ready_block_scales(b, lb)
            else:  # a 128 x 128 copy transposes exactly: bytes and block scales
                b_nk, b_scale = transpose_fp8(bd), b._quantizer.compact_scale_inv(b, lb).t().contiguous()
            if gemm.blockwise_supported(m, b_nk.shape[0], k):
                return gemm.blockwise_fp8_mm(ad, gemm_ready_block_scales(a, la), b_nk, b_scale, b_two_d=True,
                                             out_dtype=out_dtype)
        elif bt_rows_are_stored and gemm.blockwise_supported(m, bd.shape[0], k):
            return gemm.blockwise_fp8_mm(ad, gemm_ready_block_scales(a, la), bd, gemm_ready_block_scales(b, lb),
                                         b_two_d=False, out_dtype=out_dtype)
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


def _mxfp8_mm(pa: tuple, pb: tuple, ta: bool, tb: bool, out_dtype: torch.dtype) -> torch.Tensor | None:
    """Both MXFP8 copies keep the (M, K) layout: row-wise scales per 1 x 32, column-wise per 32 x 1."""
    from tetrt_support.quant.kernels import gemm
    from tetrt_support.quant.kernels.mxfp8 import mxfp8_dequantize_bf16

    def values(parts: tuple) -> torch.Tensor:
        data, scale, _, layout = parts
        return mxfp8_dequantize_bf16(data, scale, *((1, 32) if layout == "rowwise" else (32, 1)))

    lhs, rhs = values(pa), values(pb)
    return gemm.emulated_mm(lhs.t() if ta else lhs, rhs if tb else rhs.t(), out_dtype=out_dtype)


def _nvfp4_mm(a: Any, b: Any, pa: tuple, pb: tuple, ta: bool, tb: bool, out_dtype: torch.dtype) -> torch.Tensor | None:
    """Operands ``e2m1 * e4m3`` in bf16; TE's alpha after the GEMM. A column-wise
    copy is stored transposed, and when both copies carry the same Hadamard rotation along
    the contraction dim it cancels in the product (TE's wgrad), so it is not undone."""
    from tetrt_support.quant.kernels import gemm
    from tetrt_support.quant.kernels.nvfp4 import nvfp4_operand_bf16

    (ad, as_, aa, la), (bd, bs, ba, lb) = pa, pb
    if aa is None or ba is None or aa.numel() != 1 or ba.numel() != 1:  # row-scaled amaxes: the reference
        return None
    if a._quantizer.nvfp4_e4m3_max != 448 or b._quantizer.nvfp4_e4m3_max != 448:
        return None
    a_rows_are_op = (la == "columnwise") == ta
    bt_rows_are_stored = (lb == "columnwise") != tb
    rotated_a = la == "columnwise" and a._quantizer.with_rht
    rotated_b = lb == "columnwise" and b._quantizer.with_rht
    if rotated_a or rotated_b:  # the rotation cancels only between two copies rotated alike along K
        if not (rotated_a and rotated_b and a_rows_are_op and bt_rows_are_stored
                and a._quantizer.rht_sign_mask == b._quantizer.rht_sign_mask):
            return None
    lhs, rhs = nvfp4_operand_bf16(ad, as_), nvfp4_operand_bf16(bd, bs)
    return gemm.nvfp4_emulated_mm(lhs if a_rows_are_op else lhs.t(), rhs if bt_rows_are_stored else rhs.t(), aa, ba,
                                  out_dtype=out_dtype)
