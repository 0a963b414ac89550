"""Quantized GEMMs on Hopper: native FP8 blockwise, emulated MXFP8 and NVFP4.

Every function computes ``a @ b.T`` for row-major ``(M, K)`` and ``(N, K)`` operands quantized
along K. FP8 blockwise runs ``aten._scaled_mm_v2`` with block scales; MXFP8 and
NVFP4 are dequantized exactly into bf16 for cuBLAS's bf16 GEMM, NVFP4's alpha applied once
after it. :func:`emulated_reference_mm` is the float64 definition they are checked against.
Scale views and alpha: ``docs/architecture.md`` ("Module notes", quantized GEMMs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.nn.functional import ScalingType

from tetrt_support.quant.kernels._common import bf16_bits, software_casts

BLOCK = 128
# cuBLASLt's block recipes as the ints ``aten._scaled_mm_v2`` takes (what ``F.scaled_mm`` passes)
_RECIPE_1X128 = ScalingType.BlockWise1x128.value
_RECIPE_128X128 = ScalingType.BlockWise128x128.value


# --------------------------------------------------------------------- FP8 blockwise
def outer_major_scales(scale: torch.Tensor) -> torch.Tensor:
    """(rows, K/128) with strides (1, rows): the 1 x 128 scale layout cuBLASLt reads (a copy
    only when ``scale`` is not already that view)."""
    return scale if scale.stride(0) == 1 else scale.t().contiguous().t()


def blockwise_supported(m: int, n: int, k: int) -> bool:
    """Shapes this wrapper hands to the native blockwise GEMM: every dim a multiple of 128."""
    return m % BLOCK == 0 and n % BLOCK == 0 and k % BLOCK == 0


def blockwise_fp8_mm(
    a: torch.Tensor, a_scale_inv: torch.Tensor, b: torch.Tensor, b_scale_inv: torch.Tensor, *,
    b_two_d: bool, out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``dequant(a) @ dequant(b).T`` on the native FP8 blockwise GEMM.

    ``a`` (M, K) FP8 with 1 x 128 scales (M, K/128); ``b`` (N, K) FP8 with 128 x 128
    scales (N/128, K/128) (``b_two_d``) or 1 x 128 scales (N, K/128). Scales as
    ``numerics.float8_blockwise_quantize`` returns them (``scale_inv``, row-major) are
    re-laid here; in TE's GEMM-ready layout (1 x 128: the (rows, K/128) view of the stored
    transposed buffer; 128 x 128: the stored buffer, K/128 padded to 4) they pass as views.
    """
    if b_two_d:
        # (N/128, K/128) row-major, K/128 padded to a multiple of 4 (cuBLASLt's layout), as a
        # column-major (K/128, N/128) view
        blocks = b_scale_inv.shape[1]
        padded = -(-blocks // 4) * 4
        if padded != blocks or not b_scale_inv.is_contiguous():
            grown = torch.zeros((b_scale_inv.shape[0], padded), dtype=b_scale_inv.dtype, device=b_scale_inv.device)
            grown[:, :blocks] = b_scale_inv
            b_scale_inv = grown
        scale_b = b_scale_inv.t()
    else:
        scale_b = outer_major_scales(b_scale_inv)
    # The op itself, not ``F.scaled_mm``: torch 2.11's Dynamo refuses to trace the Python
    # binding ``torch._scaled_mm_v2`` that it calls (benchmarks/results/gpu_check_inline_cuda_h100.json)
    return torch.ops.aten._scaled_mm_v2.default(
        a, b.t(), [outer_major_scales(a_scale_inv)], [_RECIPE_1X128], [],
        [scale_b], [_RECIPE_128X128 if b_two_d else _RECIPE_1X128], [], None, out_dtype,
    )


# ------------------------------------------------------------------- emulated GEMMs
@triton.jit
def _scale_cast_kernel(x_ptr, alpha_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    alpha = tl.load(alpha_ptr)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, (x * alpha).to(out_ptr.dtype.element_ty), mask=mask)


def _mm_fp32(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    if a.is_cuda:
        return torch.mm(a, b_t, out_dtype=torch.float32)
    return torch.mm(a.float(), b_t.float())  # bf16 products are exact in fp32


def emulated_mm(
    a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor | None = None, *, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """``(a @ b.T) * alpha`` of bf16 operands holding dequantized values exactly.

    ``alpha`` None (MXFP8: the block scales are inside the operands): cuBLAS's bf16 GEMM
    writes ``out_dtype`` directly. ``alpha`` a (1,) fp32 tensor (NVFP4's per-tensor
    factors): an fp32 product, then one fused multiply-and-cast pass.
    """
    if alpha is None:
        if a.is_cuda and out_dtype == torch.bfloat16:
            return torch.mm(a, b.t())
        return _mm_fp32(a, b.t()).to(out_dtype)
    product = _mm_fp32(a, b.t())
    if not product.is_cuda:
        return (product * alpha.float()).to(out_dtype)
    out = torch.empty(product.shape, dtype=out_dtype, device=product.device)
    n = product.numel()
    _scale_cast_kernel[(triton.cdiv(n, 4096),)](product, alpha.float().reshape(1), out, n, BLOCK_SIZE=4096, num_warps=8)
    return out


@triton.jit
def _nvfp4_scale_cast_kernel(x_ptr, amax_a_ptr, amax_b_ptr, out_ptr, n, SOFTWARE_BF16: tl.constexpr,
                             BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    # nvfp4_gemm_alpha's operations; the literal is fp32(1 / (6 * 6 * 448 * 448)) exactly, TE's factor_inv
    alpha = (tl.load(amax_a_ptr) * tl.load(amax_b_ptr)) * 1.3840171675383317e-07
    y = tl.load(x_ptr + offs, mask=mask, other=0.0) * alpha
    if SOFTWARE_BF16:  # out_ptr: an int16 view of the bf16 result
        tl.store(out_ptr + offs, bf16_bits(y), mask=mask)
    else:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def nvfp4_emulated_mm(
    a: torch.Tensor, b: torch.Tensor, amax_a: torch.Tensor, amax_b: torch.Tensor, *,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``emulated_mm(a, b, nvfp4_alpha(amax_a, amax_b))``, bit for bit, with the per-tensor
    factor formed inside the multiply-and-cast pass from the two global amaxes.

    Why: :func:`nvfp4_alpha` in torch ops is several one-element kernels per GEMM, each a
    launch of host time and a gap on the device."""
    from tetrt_support.quant.kernels import interpreting

    product = _mm_fp32(a, b.t())
    if not (product.is_cuda or interpreting()):
        return (product * nvfp4_alpha(amax_a, amax_b)).to(out_dtype)
    out = torch.empty(product.shape, dtype=out_dtype, device=product.device)
    n = product.numel()
    software_bf16 = software_casts() and out_dtype == torch.bfloat16
    if n:
        _nvfp4_scale_cast_kernel[(triton.cdiv(n, 4096),)](
            product, amax_a.float().reshape(1), amax_b.float().reshape(1), out.view(torch.int16) if software_bf16 else out,
            n, SOFTWARE_BF16=software_bf16, BLOCK_SIZE=4096, num_warps=8)
    return out


def nvfp4_alpha(amax_a: torch.Tensor, amax_b: torch.Tensor) -> torch.Tensor:
    """TE's NVFP4 GEMM alpha for two 448-bounded operands (an infinite amax: an infinite alpha)."""
    from tetrt_support.quant.numerics import nvfp4_gemm_alpha

    return nvfp4_gemm_alpha(amax_a, amax_b)


def emulated_reference_mm(a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor | None = None) -> torch.Tensor:
    """The definition :func:`emulated_mm` implements, in float64: ``(a @ b.T) * alpha``."""
    product = a.double() @ b.double().t()
    return product if alpha is None else product * alpha.double()
