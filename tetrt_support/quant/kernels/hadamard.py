"""NVFP4's column-wise operand: ``x^T`` rotated by the random Hadamard transform, in one pass.

Twin of ``numerics.apply_hadamard(x.t().contiguous(), matrix)``: each group of 16
consecutive elements of a row of ``x^T`` (16 consecutive rows of one column of ``x``) is
multiplied by the 16 x 16 matrix ``diag(signs) @ H16 / 4``. The reference forms the sums
in float64, rounds once to fp32 and then to the input's dtype; so does this kernel, so the
bytes are the reference's whenever the float64 sums are exact -- which they are unless the
magnitudes inside one group of 16 span more than about 2^41 (bf16 input) or 2^25 (fp32):
the products ``x * (+-1/4)`` are exact and every partial sum fits in 53 bits.

Why a kernel: the reference on the device (transpose, widen to float64, a float64 matmul,
narrow twice) moves about 48 bytes per element; this reads ``x`` once and writes ``x^T``
once (4 bytes per bf16 element). On an H200 at 16384 x 8192 bf16 the reference took about
2.9 ms per call, twice per training step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tetrt_support.quant.kernels._common import software_casts

GROUP = 16


@triton.jit
def _rne_to_bf16_grid(y):
    """fp32 ``y`` rounded to the nearest bf16 (ties to even), still as fp32: Triton's
    interpreter truncates its own bf16 cast, so under it the rounding is done on the bits."""
    bits = y.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return tl.where(is_nan, y, rounded.to(tl.float32, bitcast=True))


@triton.jit
def _rht_transpose_kernel(x_ptr, h_ptr, out_ptr, M, K, stride_xm, SOFTWARE_BF16: tl.constexpr, G: tl.constexpr,
                          BK: tl.constexpr):
    """One tile of G groups of 16 rows of ``x`` times BK columns; writes the (BK, 16 G) tile of the output."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_g = pid_m * G + tl.arange(0, G)  # group index along M
    offs_k = (pid_k * BK + tl.arange(0, BK)).to(tl.int64)
    offs_j = tl.arange(0, 16)
    mask = (offs_g[:, None] * 16 < M) & (offs_k[None, :] < K)
    acc = tl.zeros((G, 16, BK), dtype=tl.float64)
    for i in tl.static_range(16):
        rows = (offs_g * 16 + i).to(tl.int64)
        x_i = tl.load(x_ptr + rows[:, None] * stride_xm + offs_k[None, :], mask=mask, other=0.0).to(tl.float64)
        h_i = tl.load(h_ptr + i * 16 + offs_j).to(tl.float64)  # row i of the matrix: exact +-1/4
        acc += x_i[:, None, :] * h_i[None, :, None]  # exact products, exact sums (see the module docstring)
    y = acc.to(tl.float32)  # fp64 -> fp32, round to nearest
    if SOFTWARE_BF16:
        y = _rne_to_bf16_grid(y)
    y = tl.reshape(y, (G * 16, BK)).to(out_ptr.dtype.element_ty)  # -> the input's dtype, round to nearest
    offs_m = (pid_m * G * 16 + tl.arange(0, G * 16)).to(tl.int64)
    out_mask = (offs_k[:, None] < K) & (offs_m[None, :] < M)
    tl.store(out_ptr + offs_k[:, None] * M + offs_m[None, :], tl.trans(y), mask=out_mask)


def rht_transpose(x2d: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``numerics.apply_hadamard(x2d.t().contiguous(), matrix)``: (K, M) in ``x2d``'s dtype.

    ``x2d``: (M, K) row-major, M a multiple of 16; ``matrix``: the quantizer's 16 x 16
    Hadamard matrix (entries +-1/4), on ``x2d``'s device.
    """
    if x2d.dim() != 2 or x2d.stride(1) != 1:
        raise ValueError(f"rht_transpose: expected a 2-D row-major tensor, got shape {tuple(x2d.shape)} "
                         f"strides {x2d.stride()}")
    m, k = x2d.shape
    if m % GROUP:
        raise ValueError(f"rht_transpose: the rows ({m}) must be a multiple of {GROUP}: the transform runs along them")
    if tuple(matrix.shape) != (GROUP, GROUP):
        raise ValueError(f"rht_transpose: expected a {GROUP} x {GROUP} matrix, got {tuple(matrix.shape)}")
    out = torch.empty((k, m), dtype=x2d.dtype, device=x2d.device)
    g, bk = 4, 64  # the fastest of six tilings on an H200 (186 us at 8192 x 4096 bf16; 8 x 32: 293 us)
    if m and k:
        h = matrix.to(device=x2d.device, dtype=torch.float32).contiguous()
        _rht_transpose_kernel[(triton.cdiv(m // GROUP, g), triton.cdiv(k, bk))](
            x2d, h, out, m, k, x2d.stride(0), SOFTWARE_BF16=software_casts() and x2d.dtype == torch.bfloat16,
            G=g, BK=bk, num_warps=4)
    return out


__all__ = ["rht_transpose"]
