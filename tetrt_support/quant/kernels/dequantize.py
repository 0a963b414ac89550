"""FP8 data times block scales, written as bf16: the operands of the emulated GEMMs.

For MXFP8 (E8M0 scales) and power-of-two FP8 blockwise scales the product is an FP8 value
times a power of two, which bf16 (8 significant bits, fp32's exponent range) holds
exactly unless it falls below bf16's normal range; the result then equals the
reference's fp32 dequantization converted to bf16, and the GEMM on it differs from the
reference's fp32 GEMM only by accumulation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tetrt_support.quant.kernels._common import e4m3_value, fp8_out, software_casts


@triton.jit
def _dequantize_kernel(data_ptr, scale_ptr, out_ptr, M, K, stride_s0, stride_s1,
                       BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, E8M0: tl.constexpr,
                       SOFTWARE: tl.constexpr, E4M3: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """One (BM x BK) tile; its (BM, BK / BLOCK_COLS) scales are loaded once and broadcast."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_k = pid_k * BK + tl.arange(0, BK)
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    q = tl.load(data_ptr + offs_m[:, None].to(tl.int64) * K + offs_k[None, :], mask=mask)
    if SOFTWARE:  # uint8 bit patterns: decode exactly (E5M2 is the top byte of an fp16)
        if E4M3:
            q = e4m3_value(q.to(tl.int32))
        else:
            q = (q.to(tl.int16) << 8).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        q = q.to(tl.float32)
    NB: tl.constexpr = BK // BLOCK_COLS
    offs_b = pid_k * NB + tl.arange(0, NB)
    scale_mask = (offs_m[:, None] < M) & (offs_b[None, :] < tl.cdiv(K, BLOCK_COLS))
    scale_offs = (offs_m[:, None] // BLOCK_ROWS).to(tl.int64) * stride_s0 + offs_b[None, :] * stride_s1
    if E8M0:
        biased = tl.load(scale_ptr + scale_offs, mask=scale_mask, other=127).to(tl.int32)
        scale = tl.where(biased == 0, 0x00400000, biased << 23).to(tl.float32, bitcast=True)
        scale = tl.where(biased == 255, float("nan"), scale)
    else:
        scale = tl.load(scale_ptr + scale_offs, mask=scale_mask, other=1.0)
    y = tl.reshape(tl.reshape(q, (BM, NB, BLOCK_COLS)) * scale[:, :, None], (BM, BK))
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * K + offs_k[None, :], y.to(tl.bfloat16), mask=mask)


def dequantize_bf16(data: torch.Tensor, scale: torch.Tensor, block_rows: int, block_cols: int, *,
                    e8m0: bool) -> torch.Tensor:
    """bf16 ``data * scale`` over (block_rows x block_cols) blocks; ``scale`` E8M0 (uint8) or fp32."""
    m, k = data.shape
    out = torch.empty((m, k), dtype=torch.bfloat16, device=data.device)
    bm, bk = 32, 256
    if m and k:
        _dequantize_kernel[(triton.cdiv(m, bm), triton.cdiv(k, bk))](
            fp8_out(data), scale, out, m, k, scale.stride(0), scale.stride(1),
            BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, E8M0=e8m0, SOFTWARE=software_casts(),
            E4M3=data.dtype == torch.float8_e4m3fn, BM=bm, BK=bk, num_warps=8,
        )
    return out


def blockwise_dequantize_bf16(data: torch.Tensor, scale_inv: torch.Tensor, block_rows: int) -> torch.Tensor:
    """FP8 blockwise data (R, C) with fp32 ``scale_inv`` over (block_rows x 128) blocks, as bf16."""
    return dequantize_bf16(data, scale_inv, block_rows, 128, e8m0=False)
