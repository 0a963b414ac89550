"""A tiled transpose of FP8 (one-byte) matrices, for GEMM operands that lack their transposed buffer."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _transpose_kernel(x_ptr, out_ptr, M, N, stride_m, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    offs_n = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tile = tl.load(x_ptr + offs_m[:, None] * stride_m + offs_n[None, :], mask=mask)
    tl.store(out_ptr + offs_n[:, None] * M + offs_m[None, :], tl.trans(tile), mask=tl.trans(mask))


def transpose_fp8(x: torch.Tensor) -> torch.Tensor:
    """``x.t().contiguous()`` of a 2-D row-major one-byte tensor (bytes moved, not converted)."""
    if x.dim() != 2 or x.stride(1) != 1 or x.element_size() != 1:
        raise ValueError(f"transpose_fp8: expected a 2-D row-major one-byte tensor, got {x.dtype} strides {x.stride()}")
    m, n = x.shape
    out = torch.empty((n, m), dtype=x.dtype, device=x.device)
    if m and n:
        _transpose_kernel[(triton.cdiv(m, 128), triton.cdiv(n, 128))](
            x.view(torch.uint8), out.view(torch.uint8), m, n, x.stride(0), BM=128, BN=128, num_warps=8)
    return out
