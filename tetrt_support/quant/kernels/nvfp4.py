"""NVFP4 as Triton kernels: both layouts in one pass, and the bf16 operands of the emulated GEMM.

Twin of ``numerics.nvfp4_quantize`` (round-to-nearest, no Hadamard transform: the
quantizer runs the reference for those). The global amax comes first
(:func:`~._common.tensor_amax_bits`, one read); then one program per (BM x BK) tile writes
the row-wise layout (1 x 16 blocks along K: codes (M, K/2), E4M3 scales (M, K/16)) and the
column-wise one (the recipe on x^T: codes (K, M/2), scales (K, M/16)); 16 x 16 blocks
(``block_rows=16``) share one amax per tile of 16 x 16.

The emulated GEMM's operands are ``e2m1 * e4m3_scale`` in bf16: at most 2 x 4 significant
bits, exactly representable; TE's per-tensor alpha multiplies the fp32 GEMM result
(:mod:`.gemm`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tetrt_support.quant import philox
from tetrt_support.quant.kernels._common import (
    FP32_MAX,
    Launcher,
    bits_to_float,
    clamp_keep_nan,
    e4m3_value,
    fp8_codes,
    fp8_out,
    fp32,
    magnitude_bits,
    software_casts,
    tile_configs,
)

BLOCK = 16
GLOBAL_MAX = 448.0 * 6.0
RCP_SIX = fp32(1.0 / 6.0)


RCP_SIX_F32 = tl.constexpr(RCP_SIX)


@triton.jit
def _min_keep_nan(x, hi):
    return tl.where(x != x, x, tl.minimum(x, hi))


@triton.jit
def global_scales(amax):
    """``(S, 1 / S)`` of ``numerics.nvfp4_quantize`` from the fp32 global amax, each
    correctly rounded as the reference's torch ops round them: ``S = min(2688 / amax,
    FP32_MAX)`` (NaN kept; 1 where it is 0, an infinite amax)."""
    encode = _min_keep_nan(tl.math.div_rn(tl.full(amax.shape, 2688.0, tl.float32), amax), 3.4028234663852886e38)
    encode = tl.where(encode == 0.0, 1.0, encode)
    return encode, tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), encode)


@triton.jit
def _e2m1_magnitude(v):
    """|v| saturated at 6, NaN -> 6 (TE's cvt.satfinite: NaN becomes +6)."""
    return tl.where(v != v, 6.0, tl.minimum(tl.abs(v), 6.0))


@triton.jit
def _e2m1_codes(v):
    """``numerics.e2m1_encode(clamp(v, -6, 6))``: round-to-nearest-even E2M1 codes of fp32
    values of any magnitude (+-inf -> +-6, NaN -> code 7).

    By rounding instead of comparing against the seven midpoints (the kernels are bound
    by these instructions, not by memory): below 1 (the subnormal step of 0.5) the code
    is ``rint(2 |v|)``, from adding 1.5 * 2**23 and reading the integer off the bits
    (0.25 -> 0, 0.75 -> 2: ties to even); from 1 up, the fp32 bits are rounded to one
    mantissa bit (ties to even) and the code is exponent and that bit, rebiased."""
    m = _e2m1_magnitude(v)
    below_one = (m * 2.0 + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000
    bits = m.to(tl.int32, bitcast=True)
    from_one = ((bits + 0x1FFFFF + ((bits >> 22) & 1)) >> 22) - 252
    index = tl.where(m < 1.0, below_one, from_one)
    return tl.where(v < 0.0, index | 8, index)


@triton.jit
def _e2m1_codes_stochastic(v, u):
    """``numerics.e2m1_encode_stochastic(clamp(v, -6, 6), u)``: round away from zero with
    probability equal to the distance from the lower grid value over the gap.

    The lower grid value is the magnitude truncated to the grid (below 1: ``trunc(2 |v|)``
    halves; from 1 up: the fp32 bits cut to one mantissa bit), the gap a power of two
    (0.5 below 2, then the exponent's step), so ``(m - lower) * (1 / gap)`` is the
    reference's exact quotient; at 6 both are 0 (no step above)."""
    m = _e2m1_magnitude(v)
    bits = m.to(tl.int32, bitcast=True)
    below_one = m < 1.0
    halves = (m * 2.0).to(tl.int32)  # 0 or 1 below 1
    lower = tl.where(below_one, halves, (bits >> 22) - 252)
    value_lower = tl.where(below_one, halves.to(tl.float32) * 0.5, (bits & 0x7FC00000).to(tl.float32, bitcast=True))
    inverse_gap = tl.where(below_one, 2.0, ((255 - (bits >> 23)) << 23).to(tl.float32, bitcast=True))
    fraction = (m - value_lower) * inverse_gap
    index = tl.where(u < fraction, tl.minimum(lower + 1, 7), lower)
    return tl.where(v < 0.0, index | 8, index)


@triton.jit
def _codes_kernel(v_ptr, u_ptr, out_ptr, n, STOCHASTIC: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    if STOCHASTIC:
        codes = _e2m1_codes_stochastic(v, tl.load(u_ptr + offs, mask=mask, other=0.0))
    else:
        codes = _e2m1_codes(v)
    tl.store(out_ptr + offs, codes.to(tl.uint8), mask=mask)


def e2m1_codes(values: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """The E2M1 codes (uint8) the quantize kernel gives fp32 ``values`` (any magnitude),
    by nearest-even rounding or, with ``uniform`` (same shape, in [0, 1)), stochastically.

    The kernels' own encoding, element by element, so it can be checked over whole value
    ranges against ``numerics.e2m1_encode`` / ``e2m1_encode_stochastic`` of the clamped
    values (the tests, under the interpreter; ``scripts/gpu_check.py``, on the GPU)."""
    v = values.detach().float().contiguous().reshape(-1)
    u = v if uniform is None else uniform.detach().float().contiguous().reshape(-1)
    if u.numel() != v.numel():
        raise ValueError(f"e2m1_codes: uniform has {u.numel()} elements, values {v.numel()}")
    out = torch.empty(v.shape, dtype=torch.uint8, device=v.device)
    if v.numel():
        _codes_kernel[(triton.cdiv(v.numel(), 1024),)](v, u, out, v.numel(), STOCHASTIC=uniform is not None,
                                                        BLOCK_SIZE=1024, num_warps=4)
    return out.reshape(values.shape)


# Philox4x32-10's constants, as the reference (quant/philox.py) defines them
PHILOX_M0 = tl.constexpr(philox.MULTIPLIERS[0])
PHILOX_M1 = tl.constexpr(philox.MULTIPLIERS[1])
PHILOX_W0 = tl.constexpr(philox.KEY_BUMPS[0])
PHILOX_W1 = tl.constexpr(philox.KEY_BUMPS[1])
PHILOX_ROUNDS = tl.constexpr(philox.ROUNDS)


@triton.jit
def _philox_round(c0, c1, c2, c3, k0, k1):
    lo0 = c0 * PHILOX_M0  # uint32 products wrap: the low words
    lo1 = c2 * PHILOX_M1
    return (tl.umulhi(c2, PHILOX_M1) ^ c1 ^ k0, lo1, tl.umulhi(c0, PHILOX_M0) ^ c3 ^ k1, lo0)


@triton.jit
def _philox_uniform(seed_ptr, offs_m, pid_k, K, BM: tl.constexpr, BK: tl.constexpr):
    """(BM, BK) fp32 draws of :func:`tetrt_support.quant.philox.uniform` for this tile: element
    i of the matrix takes word i % 4 of Philox4x32-10 at counter i // 4, keyed by the seed."""
    seed = tl.load(seed_ptr)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    quads = offs_m[:, None] * (K // 4) + (pid_k * (BK // 4) + tl.arange(0, BK // 4))[None, :]  # int64
    c0 = (quads & 0xFFFFFFFF).to(tl.uint32)
    c1 = (quads >> 32).to(tl.uint32)
    c2 = tl.zeros_like(c0)
    c3 = tl.zeros_like(c0)
    for _ in tl.static_range(PHILOX_ROUNDS):
        c0, c1, c2, c3 = _philox_round(c0, c1, c2, c3, k0, k1)
        k0 = k0 + PHILOX_W0
        k1 = k1 + PHILOX_W1
    # words in element order: join puts its pair on a new last axis
    words = tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), (BM, BK))
    return (words >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24: exact


@triton.jit
def _quantize_rows(x, encode_global, decode_global, R: tl.constexpr, C: tl.constexpr, TWO_D: tl.constexpr,
                   SOFTWARE: tl.constexpr, u=None, STOCHASTIC: tl.constexpr = False):
    """(packed codes (R, C/2) uint8, E4M3 scales (R, C/16)) of an (R, C) fp32 tile, blocks along C."""
    bits = magnitude_bits(x)
    if TWO_D:
        amax4 = tl.max(tl.max(tl.reshape(bits, (R // 16, 16, C // 16, 16)), axis=3), axis=1)  # (R/16, C/16)
        amax = tl.reshape(tl.broadcast_to(amax4[:, None, :], (R // 16, 16, C // 16)), (R, C // 16))
        block = bits_to_float(amax)
    else:
        block = bits_to_float(tl.max(tl.reshape(bits, (R, C // 16, 16)), axis=2))  # (R, C/16)
    multiplier = encode_global * RCP_SIX_F32
    decode = _min_keep_nan(block * multiplier, 3.4028234663852886e38)
    if SOFTWARE:
        decode = fp8_codes(clamp_keep_nan(decode, 448.0), True)
        decode_value = e4m3_value(decode.to(tl.int32))
    else:
        decode = clamp_keep_nan(decode, 448.0).to(tl.float8e4nv)
        decode_value = decode.to(tl.float32)
    denominator = decode_value * decode_global
    encode = _min_keep_nan(tl.math.div_rn(tl.full(denominator.shape, 1.0, tl.float32), denominator),
                           3.4028234663852886e38)
    scaled = tl.reshape(tl.reshape(x, (R, C // 16, 16)) * encode[:, :, None], (R, C))
    if STOCHASTIC:
        codes = _e2m1_codes_stochastic(scaled, u)
    else:
        codes = _e2m1_codes(scaled)
    low, high = tl.split(tl.reshape(codes, (R, C // 2, 2)))
    return (low | (high << 4)).to(tl.uint8), decode


@triton.jit
def _nvfp4_kernel(
    x_ptr, amax_bits_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr, seed_ptr, M, K, stride_xm,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, TWO_D: tl.constexpr, SOFTWARE: tl.constexpr, STOCHASTIC: tl.constexpr,
    BM: tl.constexpr, BK: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    encode_global, decode_global = global_scales(bits_to_float(tl.load(amax_bits_ptr)))
    offs_m = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    offs_k = (pid_k * BK + tl.arange(0, BK)).to(tl.int64)
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    if ROWWISE:
        u = None
        if STOCHASTIC:
            u = _philox_uniform(seed_ptr, offs_m, pid_k, K, BM, BK)
        packed, scale = _quantize_rows(x, encode_global, decode_global, BM, BK, TWO_D, SOFTWARE, u, STOCHASTIC)
        pk = pid_k * (BK // 2) + tl.arange(0, BK // 2)
        tl.store(row_data_ptr + offs_m[:, None] * (K // 2) + pk[None, :], packed,
                 mask=(offs_m[:, None] < M) & (pk[None, :] < K // 2))
        sk = pid_k * (BK // 16) + tl.arange(0, BK // 16)
        tl.store(row_scale_ptr + offs_m[:, None] * (K // 16) + sk[None, :], scale,
                 mask=(offs_m[:, None] < M) & (sk[None, :] < K // 16))
    if COLUMNWISE:
        packed, scale = _quantize_rows(tl.trans(x), encode_global, decode_global, BK, BM, TWO_D, SOFTWARE)
        pm = pid_m * (BM // 2) + tl.arange(0, BM // 2)
        tl.store(col_data_ptr + offs_k[:, None] * (M // 2) + pm[None, :], packed,
                 mask=(offs_k[:, None] < K) & (pm[None, :] < M // 2))
        sm = pid_m * (BM // 16) + tl.arange(0, BM // 16)
        tl.store(col_scale_ptr + offs_k[:, None] * (M // 16) + sm[None, :], scale,
                 mask=(offs_k[:, None] < K) & (sm[None, :] < M // 16))


_NVFP4 = Launcher(
    _nvfp4_kernel,
    # the autotuner's candidates: small tiles for both layouts (the in-register transpose)
    # and for the stochastic path (Philox is compute), large ones for the plain row-wise layout
    tile_configs([(64, 64, 4), (32, 128, 4), (64, 128, 4), (128, 64, 4), (32, 64, 4), (16, 64, 2), (32, 32, 2),
                  (16, 128, 4)]),
    key=["M", "K", "ROWWISE", "COLUMNWISE", "TWO_D", "STOCHASTIC"], fixed={"BM": 64, "BK": 64},
)


def nvfp4_quantize(
    x2d: torch.Tensor,
    global_amax: torch.Tensor | None = None,
    block_rows: int = 1,
    *,
    rowwise: bool = True,
    columnwise: bool = False,
    seed: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """``(row_data, row_scale, col_data, col_scale, amax (1,))``.

    Row-wise: ``numerics.nvfp4_quantize(x2d, amax, block_rows)``; column-wise: the same of
    ``x2d.t()``; ``amax`` is ``numerics.amax(x2d)`` unless ``global_amax`` is given.
    ``seed`` (an int64 (1,) tensor on ``x2d``'s device; row-wise only) switches to
    stochastic rounding with the draws ``philox.uniform(seed, x2d.shape)``, made in the
    kernel, as the reference's ``uniform`` argument takes them.
    """
    if seed is not None and (columnwise or seed.dtype != torch.int64 or seed.numel() != 1 or seed.device != x2d.device):
        raise ValueError("nvfp4_quantize: a seed (one int64 on x2d's device) is taken for the row-wise layout only")
    if seed is not None and x2d.shape[1] % 4:
        raise ValueError(f"nvfp4_quantize: stochastic rounding needs rows of a multiple of 4, got {x2d.shape[1]}")
    if x2d.dim() != 2 or x2d.stride(1) != 1:
        raise ValueError(f"nvfp4_quantize: expected a 2-D row-major tensor, got strides {x2d.stride()}")
    if block_rows not in (1, 16):
        raise ValueError(f"nvfp4_quantize: block_rows must be 1 or 16, got {block_rows}")
    m, k = x2d.shape
    if (rowwise and k % BLOCK) or (columnwise and m % BLOCK) or (block_rows == 16 and (m % 16 or k % 16)):
        raise ValueError(f"nvfp4_quantize: shape {(m, k)} is not a multiple of {BLOCK} along the blocked dim")
    if global_amax is None:
        from tetrt_support.quant.kernels._common import tensor_amax_bits

        amax_bits = tensor_amax_bits(x2d if x2d.is_contiguous() else x2d.contiguous())
    else:
        amax_bits = global_amax.detach().float().reshape(1).contiguous().view(torch.int32)
    dev = x2d.device
    row_data = torch.empty((m, k // 2), dtype=torch.uint8, device=dev) if rowwise else None
    row_scale = torch.empty((m, k // BLOCK), dtype=torch.float8_e4m3fn, device=dev) if rowwise else None
    col_data = torch.empty((k, m // 2), dtype=torch.uint8, device=dev) if columnwise else None
    col_scale = torch.empty((k, m // BLOCK), dtype=torch.float8_e4m3fn, device=dev) if columnwise else None
    d8 = torch.empty(1, dtype=torch.uint8, device=dev)
    s8 = torch.empty(1, dtype=torch.float8_e4m3fn, device=dev)
    if m and k:
        _NVFP4(
            lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(k, meta["BK"])),
            x2d, amax_bits, row_data if rowwise else d8, fp8_out(row_scale) if rowwise else fp8_out(s8),
            col_data if columnwise else d8, fp8_out(col_scale) if columnwise else fp8_out(s8),
            seed if seed is not None else amax_bits, m, k, x2d.stride(0),
            ROWWISE=rowwise, COLUMNWISE=columnwise, TWO_D=block_rows == 16, SOFTWARE=software_casts(),
            STOCHASTIC=seed is not None,
        )
    return row_data, row_scale, col_data, col_scale, amax_bits.view(torch.float32)


@triton.jit
def _e2m1_value(code):
    """fp32 value of E2M1 codes (int32 0..15): magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (exact constants)."""
    magnitude_code = code & 7
    value = tl.where(magnitude_code < 4, magnitude_code.to(tl.float32) * 0.5,
                     tl.where(magnitude_code == 4, 2.0,
                              tl.where(magnitude_code == 5, 3.0, tl.where(magnitude_code == 6, 4.0, 6.0))))
    # The sign as a bit: ``-value`` can compile to +0.0 for code 8 (-0), a bf16 operand bit
    # that differs from the reference's; scripts/gpu_check.py compares these bytes
    # (benchmarks/results/gpu_check_cuda.json, "bit_identity").
    return (value.to(tl.int32, bitcast=True) | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _operand_kernel(data_ptr, scale_ptr, out_ptr, R, C, SOFTWARE: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr):
    """bf16 ``e2m1 * e4m3_scale`` of packed codes (R, C/2) with scales (R, C/16), one tile of
    (BR, BP) bytes: each byte's two bf16 values go out as one 32-bit word (element 2i in the
    low half, as in memory), so loads and stores stay contiguous."""
    pid_r = tl.program_id(0)
    pid_p = tl.program_id(1)
    offs_r = pid_r * BR + tl.arange(0, BR)
    offs_p = pid_p * BP + tl.arange(0, BP)
    row = offs_r[:, None].to(tl.int64)
    mask = (offs_r[:, None] < R) & (offs_p[None, :] < C // 2)
    packed = tl.load(data_ptr + row * (C // 2) + offs_p[None, :], mask=mask, other=0).to(tl.int32)
    NB: tl.constexpr = BP // 8  # 8 bytes = 16 elements share a scale
    offs_b = pid_p * NB + tl.arange(0, NB)
    scale = tl.load(scale_ptr + row * (C // 16) + offs_b[None, :], mask=(offs_r[:, None] < R) & (offs_b[None, :] < C // 16))
    if SOFTWARE:
        scale = e4m3_value(scale.to(tl.int32))
    else:
        scale = scale.to(tl.float32)
    low = tl.reshape(tl.reshape(_e2m1_value(packed & 0xF), (BR, NB, 8)) * scale[:, :, None], (BR, BP))
    high = tl.reshape(tl.reshape(_e2m1_value(packed >> 4), (BR, NB, 8)) * scale[:, :, None], (BR, BP))
    low_bits = low.to(tl.bfloat16).to(tl.uint16, bitcast=True).to(tl.uint32)
    high_bits = high.to(tl.bfloat16).to(tl.uint16, bitcast=True).to(tl.uint32)
    words = (low_bits | (high_bits << 16)).to(tl.int32, bitcast=True)
    tl.store(out_ptr + row * (C // 2) + offs_p[None, :], words, mask=mask)


def nvfp4_operand_bf16(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The (R, C) bf16 values ``e2m1 * e4m3_scale`` (no global scale) of packed codes (R, C/2)."""
    r, half = data.shape
    c = 2 * half
    out = torch.empty((r, c), dtype=torch.bfloat16, device=data.device)
    br, bp = 32, 128
    if r and c:
        _operand_kernel[(triton.cdiv(r, br), triton.cdiv(half, bp))](
            data, fp8_out(scale), out.view(torch.int32), r, c, SOFTWARE=software_casts(), BR=br, BP=bp, num_warps=8)
    return out


def decode_global(amax: torch.Tensor) -> torch.Tensor:
    """``1 / S`` of ``numerics.nvfp4_quantize`` as a (1,) fp32 tensor (torch ops, correctly rounded)."""
    amax = amax.float().reshape(1)
    s = torch.clamp(torch.div(torch.full_like(amax, GLOBAL_MAX), amax), max=FP32_MAX)
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.div(torch.ones_like(s), s)
