"""NVFP4's column-wise operand: ``x^T`` rotated by the random Hadamard transform, in one pass.

Twin of ``numerics.apply_hadamard(x.t().contiguous(), matrix)``, computed as a fast
Walsh-Hadamard transform from the sign mask alone; the bytes are the reference's while the
float64 sums are exact (``docs/architecture.md``, section 5, for the bound and the speed).
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
def _butterfly(a, b):
    return a + b, a - b


@triton.jit
def _scaled_row(x_ptr, rows, offs_k, stride_xm, mask, NEGATE: tl.constexpr):
    """One row of each group, widened to float64 and times +-1/4 (exact): the matrix's sign."""
    x = tl.load(x_ptr + rows[:, None] * stride_xm + offs_k[None, :], mask=mask, other=0.0).to(tl.float64)
    return x * (-0.25 if NEGATE else 0.25)


@triton.jit
def _rht_transpose_kernel(x_ptr, out_ptr, M, K, stride_xm, SIGN_MASK: tl.constexpr, SOFTWARE_BF16: tl.constexpr,
                          G: tl.constexpr, BK: tl.constexpr):
    """One tile of G groups of 16 rows of ``x`` times BK columns; writes the (BK, 16 G) tile of the output."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_g = pid_m * G + tl.arange(0, G)  # group index along M
    offs_k = (pid_k * BK + tl.arange(0, BK)).to(tl.int64)
    mask = (offs_g[:, None] * 16 < M) & (offs_k[None, :] < K)
    base = (offs_g * 16).to(tl.int64)
    z0 = _scaled_row(x_ptr, base + 0, offs_k, stride_xm, mask, (SIGN_MASK >> 0) & 1)
    z1 = _scaled_row(x_ptr, base + 1, offs_k, stride_xm, mask, (SIGN_MASK >> 1) & 1)
    z2 = _scaled_row(x_ptr, base + 2, offs_k, stride_xm, mask, (SIGN_MASK >> 2) & 1)
    z3 = _scaled_row(x_ptr, base + 3, offs_k, stride_xm, mask, (SIGN_MASK >> 3) & 1)
    z4 = _scaled_row(x_ptr, base + 4, offs_k, stride_xm, mask, (SIGN_MASK >> 4) & 1)
    z5 = _scaled_row(x_ptr, base + 5, offs_k, stride_xm, mask, (SIGN_MASK >> 5) & 1)
    z6 = _scaled_row(x_ptr, base + 6, offs_k, stride_xm, mask, (SIGN_MASK >> 6) & 1)
    z7 = _scaled_row(x_ptr, base + 7, offs_k, stride_xm, mask, (SIGN_MASK >> 7) & 1)
    z8 = _scaled_row(x_ptr, base + 8, offs_k, stride_xm, mask, (SIGN_MASK >> 8) & 1)
    z9 = _scaled_row(x_ptr, base + 9, offs_k, stride_xm, mask, (SIGN_MASK >> 9) & 1)
    z10 = _scaled_row(x_ptr, base + 10, offs_k, stride_xm, mask, (SIGN_MASK >> 10) & 1)
    z11 = _scaled_row(x_ptr, base + 11, offs_k, stride_xm, mask, (SIGN_MASK >> 11) & 1)
    z12 = _scaled_row(x_ptr, base + 12, offs_k, stride_xm, mask, (SIGN_MASK >> 12) & 1)
    z13 = _scaled_row(x_ptr, base + 13, offs_k, stride_xm, mask, (SIGN_MASK >> 13) & 1)
    z14 = _scaled_row(x_ptr, base + 14, offs_k, stride_xm, mask, (SIGN_MASK >> 14) & 1)
    z15 = _scaled_row(x_ptr, base + 15, offs_k, stride_xm, mask, (SIGN_MASK >> 15) & 1)
    # Sylvester butterflies, bit 0 to bit 3: output j = sum_i z_i (-1)^popcount(i & j)
    z0, z1 = _butterfly(z0, z1)
    z2, z3 = _butterfly(z2, z3)
    z4, z5 = _butterfly(z4, z5)
    z6, z7 = _butterfly(z6, z7)
    z8, z9 = _butterfly(z8, z9)
    z10, z11 = _butterfly(z10, z11)
    z12, z13 = _butterfly(z12, z13)
    z14, z15 = _butterfly(z14, z15)
    z0, z2 = _butterfly(z0, z2)
    z1, z3 = _butterfly(z1, z3)
    z4, z6 = _butterfly(z4, z6)
    z5, z7 = _butterfly(z5, z7)
    z8, z10 = _butterfly(z8, z10)
    z9, z11 = _butterfly(z9, z11)
    z12, z14 = _butterfly(z12, z14)
    z13, z15 = _butterfly(z13, z15)
    z0, z4 = _butterfly(z0, z4)
    z1, z5 = _butterfly(z1, z5)
    z2, z6 = _butterfly(z2, z6)
    z3, z7 = _butterfly(z3, z7)
    z8, z12 = _butterfly(z8, z12)
    z9, z13 = _butterfly(z9, z13)
    z10, z14 = _butterfly(z10, z14)
    z11, z15 = _butterfly(z11, z15)
    z0, z8 = _butterfly(z0, z8)
    z1, z9 = _butterfly(z1, z9)
    z2, z10 = _butterfly(z2, z10)
    z3, z11 = _butterfly(z3, z11)
    z4, z12 = _butterfly(z4, z12)
    z5, z13 = _butterfly(z5, z13)
    z6, z14 = _butterfly(z6, z14)
    z7, z15 = _butterfly(z7, z15)
    # (G, BK, 16) with the output index j = 8 b3 + 4 b2 + 2 b1 + b0: a join puts its pair on a
    # new LAST axis, so the innermost joins pair outputs that differ in bit 3, the outermost in bit 0
    t = tl.join(tl.join(tl.join(tl.join(z0, z8), tl.join(z4, z12)), tl.join(tl.join(z2, z10), tl.join(z6, z14))),
                tl.join(tl.join(tl.join(z1, z9), tl.join(z5, z13)), tl.join(tl.join(z3, z11), tl.join(z7, z15))))
    y = tl.reshape(t, (G, BK, 16))
    y = tl.where(y == 0.0, 0.0, y).to(tl.float32)  # an exact zero as +0; fp64 -> fp32, round to nearest
    if SOFTWARE_BF16:
        y = _rne_to_bf16_grid(y)
    y = y.to(out_ptr.dtype.element_ty)  # -> the input's dtype, round to nearest
    y = tl.reshape(tl.permute(y, (1, 0, 2)), (BK, G * 16))
    offs_m = (pid_m * G * 16 + tl.arange(0, G * 16)).to(tl.int64)
    out_mask = (offs_k[:, None] < K) & (offs_m[None, :] < M)
    tl.store(out_ptr + offs_k[:, None] * M + offs_m[None, :], y, mask=out_mask)


def rht_transpose(x2d: torch.Tensor, sign_mask: int) -> torch.Tensor:
    """``numerics.apply_hadamard(x2d.t().contiguous(), numerics.random_hadamard_matrix(sign_mask))``:
    (K, M) in ``x2d``'s dtype.

    ``x2d``: (M, K) row-major, M a multiple of 16; ``sign_mask``: the quantizer's 16-bit
    mask (bit i negates row i of the Hadamard matrix).
    """
    if x2d.dim() != 2 or x2d.stride(1) != 1:
        raise ValueError(f"rht_transpose: expected a 2-D row-major tensor, got shape {tuple(x2d.shape)} "
                         f"strides {x2d.stride()}")
    m, k = x2d.shape
    if m % GROUP:
        raise ValueError(f"rht_transpose: the rows ({m}) must be a multiple of {GROUP}: the transform runs along them")
    if not 0 <= int(sign_mask) < 1 << GROUP:
        raise ValueError(f"rht_transpose: sign_mask must fit in {GROUP} bits, got {sign_mask}")
    out = torch.empty((k, m), dtype=x2d.dtype, device=x2d.device)
    g, bk, warps = TILE
    if m and k:
        _rht_transpose_kernel[(triton.cdiv(m // GROUP, g), triton.cdiv(k, bk))](
            x2d, out, m, k, x2d.stride(0), SIGN_MASK=int(sign_mask),
            SOFTWARE_BF16=software_casts() and x2d.dtype == torch.bfloat16, G=g, BK=bk, num_warps=warps)
    return out


#: (groups of 16 rows, columns, warps) per program, one fixed tiling (no autotuning): the
#: kernel is a copy with a transform, so tilings differ little; its time next to a plain copy
#: is in benchmarks/results/gpu_check_cuda.json ("kernel_times_8192x4096")
TILE = (2, 128, 4)


__all__ = ["rht_transpose"]
