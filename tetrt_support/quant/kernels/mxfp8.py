"""MXFP8 as Triton kernels: both layouts from one read of x, and bf16 dequantization (twins of ``numerics``).

One program reads a (32 x BK) tile from memory once (its second pass re-reads it from
cache) and writes the row-wise layout (1 x 32 blocks, scales (M, K/32)) and the
column-wise layout (32 x 1 blocks over the SAME (M, K) data layout, scales (M/32, K)), as ``numerics.mxfp8_quantize(x, dtype, 1, 32)`` and
``(x, dtype, 32, 1)`` return them. The dequantized values ``fp8 * 2**(e - 127)`` are
exactly representable in bf16 (4 significant bits) unless the block scale is tiny
(below about 2**-118, where bf16's subnormals round), so the emulated GEMM runs on bf16
operands with no other rounding than cuBLAS's fp32 accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tetrt_support.quant.kernels._common import (
    TL_FP8,
    Launcher,
    bits_to_float,
    fp8_out,
    fp32,
    load_rows,
    magnitude_bits,
    saturating_fp8_cast,
    software_casts,
    tile_configs,
)

BLOCK = 32


@triton.jit
def _float_to_e8m0(v):
    """``numerics.float_to_e8m0`` on non-negative fp32 values (int32 result)."""
    bits = v.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    round_up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    biased = exponent + round_up.to(tl.int32)
    biased = tl.where(v == 0.0, 0, biased)
    biased = tl.where(v == float("inf"), 0xFE, biased)
    return tl.where(v != v, 0xFF, biased)


@triton.jit
def _inverse_scale(biased):
    """1 / 2**(biased - 127) as an exact fp32 power of two (NaN for the E8M0 NaN 255)."""
    bits = tl.where(biased == 254, 0x00400000, (254 - biased) << 23)
    inverse = bits.to(tl.float32, bitcast=True)
    return tl.where(biased == 255, float("nan"), inverse)


@triton.jit
def _mxfp8_kernel(
    x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr, M, K, stride_xm,
    RCP_MAX: tl.constexpr, MAX_VALUE: tl.constexpr, ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr,
    OUT_DTYPE: tl.constexpr, SOFTWARE: tl.constexpr, E4M3: tl.constexpr, B: tl.constexpr, BK: tl.constexpr,
    R: tl.constexpr,
):
    """One program: B (= 32) rows, one column block of the column-wise layout, times BK
    columns, read in slabs of R rows. Pass 1 writes the row-wise layout slab by slab and
    keeps an elementwise running max of the magnitudes (R x BK), so the column amaxes
    need one reduction over R rows at the end, not a reduction across the 32 rows of
    every slab. Pass 2 re-reads the slabs (from cache) and writes the
    column-wise layout."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_k = (pid_k * BK + tl.arange(0, BK)).to(tl.int64)
    mask_k = offs_k < K
    running = tl.zeros((R, BK), dtype=tl.int32)
    for s in tl.static_range(B // R):
        offs_m, mask, x = load_rows(x_ptr, pid_m * B + s * R, R, offs_k, mask_k, M, stride_xm)
        bits = magnitude_bits(x)
        if COLUMNWISE:
            running = tl.maximum(running, bits)
        if ROWWISE:
            amax = bits_to_float(tl.max(tl.reshape(bits, (R, BK // B, B)), axis=2))  # (R, BK/B)
            biased = _float_to_e8m0(amax * RCP_MAX)
            y = tl.reshape(tl.reshape(x, (R, BK // B, B)) * _inverse_scale(biased)[:, :, None], (R, BK))
            tl.store(row_data_ptr + offs_m[:, None] * K + offs_k[None, :],
                     saturating_fp8_cast(y, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False), mask=mask)
            sk = pid_k * (BK // B) + tl.arange(0, BK // B)
            tl.store(row_scale_ptr + offs_m[:, None] * (K // B) + sk[None, :], biased.to(tl.uint8),
                     mask=(offs_m[:, None] < M) & (sk[None, :] < K // B))
    if COLUMNWISE:
        biased = _float_to_e8m0(bits_to_float(tl.max(running, axis=0)) * RCP_MAX)  # (BK,)
        inverse = _inverse_scale(biased)
        tl.store(col_scale_ptr + pid_m * K + offs_k, biased.to(tl.uint8), mask=mask_k)
        for s in tl.static_range(B // R):
            offs_m, mask, x = load_rows(x_ptr, pid_m * B + s * R, R, offs_k, mask_k, M, stride_xm)
            tl.store(col_data_ptr + offs_m[:, None] * K + offs_k[None, :],
                     saturating_fp8_cast(x * inverse[None, :], MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False), mask=mask)


_MXFP8 = Launcher(
    _mxfp8_kernel,
    # The autotuner's candidates, (256, 8, 2) first; wider tiles are left out (more registers
    # for the running max, fewer programs in flight).
    tile_configs([(256, 8, 2), (256, 8, 4), (256, 4, 2), (512, 8, 4)], names=("BK", "R")),
    key=["M", "K", "ROWWISE", "COLUMNWISE"], fixed={"BK": 64, "R": 8},
)


def mxfp8_quantize(
    x2d: torch.Tensor, fp8_dtype: torch.dtype, *, rowwise: bool = True, columnwise: bool = False
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``(row_data, row_scale, col_data, col_scale)``: ``numerics.mxfp8_quantize(x2d, dtype, 1, 32)``
    and ``numerics.mxfp8_quantize(x2d, dtype, 32, 1)`` from one read of ``x2d``.

    M and K must be multiples of 32 (where the layout is asked for), as the quantizer requires.
    """
    if x2d.dim() != 2 or x2d.stride(1) != 1:
        raise ValueError(f"mxfp8_quantize: expected a 2-D row-major tensor, got strides {x2d.stride()}")
    m, k = x2d.shape
    if (rowwise and k % BLOCK) or (columnwise and m % BLOCK):
        raise ValueError(f"mxfp8_quantize: shape {(m, k)} is not a multiple of {BLOCK} along the blocked dim")
    dev = x2d.device
    row_data = torch.empty((m, k), dtype=fp8_dtype, device=dev) if rowwise else None
    row_scale = torch.empty((m, k // BLOCK), dtype=torch.uint8, device=dev) if rowwise else None
    col_data = torch.empty((m, k), dtype=fp8_dtype, device=dev) if columnwise else None
    col_scale = torch.empty((m // BLOCK, k), dtype=torch.uint8, device=dev) if columnwise else None
    dummy = torch.empty(1, dtype=torch.uint8, device=dev)
    if m and k:
        _MXFP8(
            lambda meta: (triton.cdiv(m, BLOCK), triton.cdiv(k, meta["BK"])), x2d, fp8_out(row_data) if rowwise else dummy, row_scale if rowwise else dummy,
            fp8_out(col_data) if columnwise else dummy, col_scale if columnwise else dummy, m, k, x2d.stride(0),
            RCP_MAX=fp32(1.0 / float(torch.finfo(fp8_dtype).max)), MAX_VALUE=float(torch.finfo(fp8_dtype).max),
            ROWWISE=rowwise, COLUMNWISE=columnwise, OUT_DTYPE=TL_FP8[fp8_dtype], SOFTWARE=software_casts(),
            E4M3=fp8_dtype == torch.float8_e4m3fn, B=BLOCK,
        )
    return row_data, row_scale, col_data, col_scale


def mxfp8_dequantize_bf16(data: torch.Tensor, scale: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """``numerics.mxfp8_dequantize(...)`` rounded to bf16 (exact for block scales >= 2**-118)."""
    from tetrt_support.quant.kernels.dequantize import dequantize_bf16

    return dequantize_bf16(data, scale, block_rows, block_cols, e8m0=True)
