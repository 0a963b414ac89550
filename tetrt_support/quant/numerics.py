"""The quantization algorithms as pure PyTorch functions (no state, no classes).

The single definition of each format's numerics, producing the bytes TransformerEngine's
kernels produce (each docstring restates the semantics); quantizers are thin shells around
them, and GPU kernels are checked against them. Inputs are 2-D in their original dtype and
block scales are returned compact. Shared conventions (rounding, NaN, saturation):
``docs/architecture.md`` ("Module notes", numerics conventions).
"""

from __future__ import annotations

import math

import torch

FP32_MAX = torch.finfo(torch.float32).max
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
E2M1_MAX = 6.0
# The eight E2M1 magnitudes in code order: code = sign << 3 | index into this tuple.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = tuple((a + b) / 2 for a, b in zip(E2M1_VALUES, E2M1_VALUES[1:]))
E8M0_BIAS = 127
E8M0_NAN = 255
NVFP4_BLOCK = 16
NVFP4_GLOBAL_MAX = 448.0 * E2M1_MAX  # E4M3 max times E2M1 max
MXFP8_BLOCK = 32
# TransformerEngine's fixed sign vector of the 16-point random Hadamard transform (its
# ``get_wgrad_sign_vector``): entry i multiplies row i of the Hadamard matrix.
TE_RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def check_fp8_dtype(dtype: torch.dtype, owner: str) -> torch.dtype:
    """``dtype`` when it is one of :data:`FP8_DTYPES`, else a ValueError naming ``owner``:
    the one FP8 dtype check of the package."""
    if dtype not in FP8_DTYPES:
        raise ValueError(f"{owner}: fp8_dtype must be one of {FP8_DTYPES}, got {dtype!r}")
    return dtype


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an FP8 format (448 for E4M3, 57344 for E5M2)."""
    return float(torch.finfo(check_fp8_dtype(dtype, "fp8_max")).max)


def input_dtype_max(dtype: torch.dtype) -> float:
    """Largest finite value of a high-precision input dtype (the blockwise scale's ceiling)."""
    return float(torch.finfo(dtype).max)


# ------------------------------------------------------------------------- amax
def amax(x: torch.Tensor) -> torch.Tensor:
    """max|x| over the whole tensor as a 0-d fp32 tensor, NaN ignored (0 for empty or all-NaN)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    magnitude = x.detach().abs().float()
    return torch.where(torch.isnan(magnitude), torch.zeros_like(magnitude), magnitude).amax()


def block_amax(x2d: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """max|x| of every (br x bc) block of an (M, K) tensor (fp32, NaN ignored, zero padding)."""
    magnitude = x2d.abs().float()
    magnitude = torch.where(torch.isnan(magnitude), torch.zeros_like(magnitude), magnitude)
    return to_blocks(magnitude, block_rows, block_cols).amax(dim=-1)


# ------------------------------------------------------------------- FP8 scales
def compute_scale_from_amax(
    amax: torch.Tensor,
    max_value: float,
    *,
    force_pow_2_scales: bool = False,
    epsilon: float = 0.0,
    value_for_inf: float = FP32_MAX,
) -> torch.Tensor:
    """The FP8 scale of current and blockwise scaling (TE's ``compute_scale_from_amax``).

    amax is first raised to ``epsilon``; an amax that is 0, inf or NaN gives scale 1;
    otherwise ``max_value / amax`` (one fp32 division), an infinite quotient replaced by
    ``value_for_inf``; ``force_pow_2_scales`` clears the mantissa bits (rounds DOWN to a
    power of two, so ``amax * scale`` still fits).
    """
    amax = amax.float()
    if epsilon > 0.0:
        amax = torch.where(amax < epsilon, torch.full_like(amax, epsilon), amax)
    scale = torch.div(torch.full_like(amax, max_value), amax)
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, value_for_inf), scale)
    if force_pow_2_scales:
        scale = (scale.contiguous().view(torch.int32) & _EXPONENT_MASK).view(torch.float32)
    degenerate = (amax == 0) | torch.isinf(amax) | torch.isnan(amax)
    return torch.where(degenerate, torch.ones_like(scale), scale)


_EXPONENT_MASK = -0x800000  # 0xFF800000 as an int32: sign and exponent bits


def cast_to_fp8(x: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """``saturate(x * scale)`` cast to ``dtype``: +-inf and overflow clamp to +-max, NaN stays NaN.

    Every NaN becomes the one positive NaN code 0x7F, whatever its sign: TE's kernels cast
    with ``cvt.rn.satfinite`` (``common/util/ptx.cuh``), which writes 0x7F for -NaN, as
    torch's CUDA cast does, where torch's CPU cast keeps the sign (0xFF).
    """
    limit = fp8_max(dtype)
    y = torch.clamp(x.float() * scale, -limit, limit)  # clamp keeps NaN
    return torch.where(torch.isnan(y), torch.full_like(y, float("nan")).abs(), y).to(dtype)


def float8_current_scaling_quantize(
    x2d: torch.Tensor,
    fp8_dtype: torch.dtype,
    *,
    force_pow_2_scales: bool = False,
    amax_epsilon: float = 0.0,
    tensor_amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FP8 current scaling: ``(data (M, K), scale_inv (1,), amax (1,))``.

    ``tensor_amax`` overrides the tensor's own amax (an amax all-reduced over a group).
    """
    amax_value = amax(x2d) if tensor_amax is None else tensor_amax.float().reshape(())
    scale = compute_scale_from_amax(
        amax_value, fp8_max(fp8_dtype), force_pow_2_scales=force_pow_2_scales, epsilon=amax_epsilon
    )
    data = cast_to_fp8(x2d, scale, fp8_dtype)
    return data, torch.reciprocal(scale).reshape(1), amax_value.reshape(1)


def tensorwise_fp8_mm(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """``lhs @ rhs`` of FP8 matrices with per-tensor dequantization scales (0-d fp32), as the
    FP8 GEMM defines it: exact products summed in fp32, the sum times ``scale_a * scale_b``,
    rounded once to ``out_dtype``.

    Off the CPU this is ``torch._scaled_mm`` (cuBLASLt; ``use_fast_accum`` is its fast
    accumulation). On the CPU it is the same definition on torch's fp32 GEMM: an FP8 value
    and the product of two are exact in fp32, so only the summation order is the GEMM's own.
    torch's CPU ``_scaled_mm`` runs oneDNN's FP8 kernel where the CPU has one, and otherwise
    oneDNN's reference matmul, which scales each product rather than the sum and was about
    2000 times slower than this on a 2-core CPU (``benchmarks/results/perf_cpu.json``,
    ``linear``: ``fp8_scaled_mm_raw`` against ``fp8_tensorwise_mm``).
    """
    if lhs.device.type != "cpu":
        return torch._scaled_mm(lhs, rhs, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype,
                                use_fast_accum=use_fast_accum)
    product = torch.mm(lhs.to(torch.float32), rhs.to(torch.float32))
    return (product * (scale_a.float() * scale_b.float())).to(out_dtype)


def delayed_scaling_update(
    amax_history: torch.Tensor, scale: torch.Tensor, *, max_value: float, amax_compute_algo: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """End-of-step update of FP8 delayed scaling: ``(new_history, new_scale)``.

    TE's fused update: the amax to scale with is the history's max (``"max"``) or its
    newest entry, ``history[0]`` (``"most_recent"``); the history rolls one step toward
    the front (``history[i] <- history[i + 1]``, the newest amax moves to the end) and
    ``history[0]`` is cleared for the next step. The new scale is ``max_value / amax``
    (``max_value`` = fp8_max / 2**margin); an amax that is 0, inf or NaN KEEPS the previous
    scale; an infinite quotient becomes FP32_MAX. When ``history[0]`` is 0 (nothing was
    recorded this step) TE's kernel neither rolls the history nor changes the scale.
    """
    newest = amax_history[0]
    if amax_compute_algo == "max":
        chosen = torch.where(torch.isnan(amax_history), torch.zeros_like(amax_history), amax_history).amax()
    elif amax_compute_algo == "most_recent":
        chosen = newest
    else:
        raise ValueError(f"delayed_scaling_update: amax_compute_algo must be 'max' or 'most_recent', got {amax_compute_algo!r}")
    rolled = torch.roll(amax_history, -1, 0).clone()
    rolled[0] = 0.0
    recorded = newest != 0
    new_history = torch.where(recorded, rolled, amax_history)
    usable = recorded & torch.isfinite(chosen) & (chosen > 0)
    quotient = torch.div(torch.full_like(chosen, max_value), chosen)
    quotient = torch.where(torch.isinf(quotient), torch.full_like(quotient, FP32_MAX), quotient)
    new_scale = torch.where(usable, quotient, scale.reshape(()).float()).reshape(scale.shape)
    return new_history, new_scale


# ------------------------------------------------------------------- FP8 blocks
def float8_blockwise_quantize(
    x2d: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_rows: int,
    block_cols: int,
    *,
    force_pow_2_scales: bool = True,
    amax_epsilon: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 blockwise scaling over (1 x 128) or (128 x 128) blocks: ``(data (M, K), scale_inv)``.

    ``scale_inv`` is (ceil(M/br), ceil(K/bc)) fp32; edge blocks are zero-padded. An
    infinite quotient (a tiny amax) becomes the INPUT dtype's max, as TE's kernels use
    ``TypeInfo<IType>::max_finite_value``.
    """
    m, k = x2d.shape
    mb, kb = ceil_div(m, block_rows), ceil_div(k, block_cols)
    # The zero-padded input as (mb, br, kb, bc) blocks, each scaled by a broadcast of its
    # block's scale (no repeat_interleave: compiled for the CPU, inductor 2.14 wrote NaNs
    # into a partial last block of that form).
    padded = torch.nn.functional.pad(x2d, (0, kb * block_cols - k, 0, mb * block_rows - m))
    # (1 x bc blocks without the unit dim: inductor 2.14's CPU codegen failed to fuse the
    # row-wise and column-wise quantizations of one input with it)
    blocks = padded.reshape(mb, kb, block_cols) if block_rows == 1 else padded.reshape(mb, block_rows, kb, block_cols)
    magnitude = blocks.abs().float()
    magnitude = torch.where(torch.isnan(magnitude), torch.zeros_like(magnitude), magnitude)
    block = magnitude.amax(dim=-1) if block_rows == 1 else magnitude.amax(dim=(1, 3))
    scale = compute_scale_from_amax(
        block,
        fp8_max(fp8_dtype),
        force_pow_2_scales=force_pow_2_scales,
        epsilon=amax_epsilon,
        value_for_inf=input_dtype_max(x2d.dtype),
    )
    broadcast = scale[:, :, None] if block_rows == 1 else scale[:, None, :, None]
    data = cast_to_fp8(blocks, broadcast, fp8_dtype).reshape(mb * block_rows, kb * block_cols)
    return data[:m, :k].contiguous(), torch.reciprocal(scale)


def float8_blockwise_dequantize(data: torch.Tensor, scale_inv: torch.Tensor, block_rows: int,
                                block_cols: int) -> torch.Tensor:
    """fp32 ``data * scale_inv`` of :func:`float8_blockwise_quantize`'s output, each block's
    scale broadcast over its (zero-padded) block."""
    m, k = data.shape
    mb, kb = ceil_div(m, block_rows), ceil_div(k, block_cols)
    padded = torch.nn.functional.pad(data.float(), (0, kb * block_cols - k, 0, mb * block_rows - m))
    if block_rows == 1:
        full = padded.reshape(mb, kb, block_cols) * scale_inv[:, :, None]
    else:
        full = padded.reshape(mb, block_rows, kb, block_cols) * scale_inv[:, None, :, None]
    return full.reshape(mb * block_rows, kb * block_cols)[:m, :k]


# ------------------------------------------------------------------------ MXFP8
def float_to_e8m0(value: torch.Tensor) -> torch.Tensor:
    """Biased E8M0 exponent (uint8) of the smallest power of two >= ``value``, on the fp32 bits.

    TE's conversion (``cvt.rp.satfinite.ue8m0`` and its software twin): NaN -> 255,
    +inf -> 254, 0 -> 0; otherwise the fp32 exponent field, plus one when any mantissa bit
    is set, except that it saturates at 254 and that a subnormal <= 2**-127 stays at 0.
    """
    value = value.float().contiguous()
    bits = value.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    round_up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    biased = exponent + round_up.to(torch.int32)
    biased = torch.where(value == 0, torch.zeros_like(biased), biased)
    biased = torch.where(torch.isinf(value), torch.full_like(biased, 0xFE), biased)
    biased = torch.where(torch.isnan(value), torch.full_like(biased, E8M0_NAN), biased)
    return biased.to(torch.uint8)


def e8m0_to_float(biased: torch.Tensor) -> torch.Tensor:
    """Decode biased E8M0 exponents (uint8) to fp32 powers of two (0 -> 2**-127); 255 -> NaN."""
    exponent = biased.to(torch.int32) - E8M0_BIAS
    value = torch.ldexp(torch.ones(biased.shape, dtype=torch.float32, device=biased.device), exponent)
    return torch.where(biased == E8M0_NAN, torch.full_like(value, math.nan), value)


def mxfp8_quantize(
    x2d: torch.Tensor, fp8_dtype: torch.dtype, block_rows: int, block_cols: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 over (1 x 32), (32 x 1) or (32 x 32) blocks: ``(data (M, K), scale (uint8 E8M0))``.

    The block scale is ``float_to_e8m0(amax * fp32(1 / fp8_max))`` (a multiplication by
    the rounded reciprocal, as the kernel does, not a division) and the elements are cast
    as ``x * 2**-e`` (exact). Scale layouts, as TE's: row-wise (1 x 32) -> (M, K/32);
    column-wise (32 x 1) -> (M/32, K) over the SAME (M, K) data layout; 2-D (32 x 32) ->
    one scale per tile, returned for the rowwise layout (M, K/32) (a row per row of the
    tile) -- :func:`mxfp8_2d_columnwise_scales` gives the column-wise copy.
    """
    block = block_amax(x2d, block_rows, block_cols)
    rcp = torch.tensor(1.0 / fp8_max(fp8_dtype), dtype=torch.float32, device=x2d.device)
    biased = float_to_e8m0(block * rcp)
    inverse = torch.reciprocal(e8m0_to_float(biased))  # exact: a power of two
    data = cast_to_fp8(x2d, expand_block_scales(inverse, block_rows, block_cols, tuple(x2d.shape)), fp8_dtype)
    if block_rows == MXFP8_BLOCK and block_cols == MXFP8_BLOCK:
        biased = biased.repeat_interleave(MXFP8_BLOCK, 0)[: x2d.shape[0]]
    return data, biased


def mxfp8_2d_columnwise_scales(rowwise_scales: torch.Tensor, cols: int) -> torch.Tensor:
    """The (M/32, K) column-wise scales of a 2-D (32 x 32) MXFP8 tensor from its (M, K/32) ones."""
    return rowwise_scales[::MXFP8_BLOCK].repeat_interleave(MXFP8_BLOCK, 1)[:, :cols]


def mxfp8_dequantize(data: torch.Tensor, scale: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """fp32 values of MXFP8 data (M, K) with E8M0 scales over (br x bc) blocks."""
    return data.float() * expand_block_scales(e8m0_to_float(scale), block_rows, block_cols, tuple(data.shape))


# ------------------------------------------------------------------------ NVFP4
def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values (already clamped to [-6, 6]) to E2M1 codes, round-to-nearest-even.

    Ties go to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0,
    3.5 -> 4.0, 5.0 -> 4.0. As in TE: the sign bit is set only for x < 0, so -0.0 is code
    0; +-inf saturate to +-6. E2M1 has no NaN: a NaN becomes +6 (code 7), as TE's
    kernels' ``cvt.satfinite`` E2M1 conversion does ("NaN becomes positive MAX_NORM",
    ``common/util/ptx.cuh``); TE's pure-PyTorch reference would write code 0 there.
    """
    x = x.float()
    magnitude = torch.nan_to_num(x.abs(), nan=E2M1_MAX, posinf=E2M1_MAX)
    # Codes are counts of midpoints passed (exact in fp32): strictly above, or at least at one.
    # Seven comparisons each cost less than two torch.bucketize calls on the CPU.
    lower = torch.zeros(magnitude.shape, dtype=torch.uint8, device=x.device)  # ties -> lower code
    upper = torch.zeros_like(lower)  # ties -> upper code
    for midpoint in _E2M1_MIDPOINTS:
        lower += magnitude > midpoint
        upper += magnitude >= midpoint
    index = torch.where(lower % 2 == 0, lower, upper)  # at a tie, keep the even one
    sign = (x < 0).to(torch.uint8)
    return (sign << 3) | index


def e2m1_encode_stochastic(x: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding to E2M1: round away from zero with probability equal to the
    distance from the lower neighbour over the gap (``uniform`` in [0, 1), same shape).

    Unbiased: E[decode(code)] = x for |x| <= 6. Values already on the grid never move.
    NaN -> +6 (code 7), as TE's stochastic-rounding kernel path.
    """
    x = x.float()
    magnitude = torch.nan_to_num(x.abs(), nan=E2M1_MAX, posinf=E2M1_MAX).clamp(max=E2M1_MAX)
    values = torch.tensor(E2M1_VALUES, device=x.device)
    lower = (torch.bucketize(magnitude, values, right=True) - 1).clamp(0, len(E2M1_VALUES) - 1)
    upper = (lower + 1).clamp(max=len(E2M1_VALUES) - 1)
    gap = values[upper] - values[lower]
    fraction = torch.where(gap > 0, (magnitude - values[lower]) / torch.where(gap > 0, gap, 1.0), 0.0)
    index = torch.where(uniform.float() < fraction, upper, lower)
    sign = (x < 0).to(torch.uint8)
    return (sign << 3) | index.to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 in [0, 15]) -> fp32 values."""
    values = torch.tensor(E2M1_VALUES, device=codes.device)
    magnitude = values[(codes & 0x7).long()]
    return torch.where((codes & 0x8) != 0, -magnitude, magnitude)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack pairs of 4-bit codes along the last dim into bytes: element 2i in the low nibble.

    That is the byte layout of torch.float4_e2m1fn_x2 (which torch cannot cast to on CPU).
    """
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4: last dim must be even, got shape {tuple(codes.shape)}")
    pairs = codes.to(torch.uint8).reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)  # no -1: may be empty
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`: bytes -> twice as many 4-bit codes along the last dim."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def nvfp4_global_encode_scale(global_amax: torch.Tensor, e4m3_max: float = 448.0) -> torch.Tensor:
    """S = min(e4m3_max * 6 / amax, FP32_MAX) (one division; amax 0 -> FP32_MAX); S == 0 (an
    infinite amax) -> 1. ``e4m3_max`` is 448, or 256 for TE's 4over6 tensors."""
    global_amax = global_amax.float()
    scale = torch.div(torch.full_like(global_amax, e4m3_max * E2M1_MAX), global_amax)
    scale = torch.clamp(scale, max=FP32_MAX)
    return torch.where(scale == 0, torch.ones_like(scale), scale)


def nvfp4_quantize(
    x2d: torch.Tensor,
    global_amax: torch.Tensor,
    block_rows: int = 1,
    *,
    uniform: torch.Tensor | None = None,
    e4m3_max: float = 448.0,
    four_over_six: str | None = None,
    four_over_six_fast_math: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 over (1 x 16) or (16 x 16) blocks: ``(packed codes (M, K/2), E4M3 scales (M, K/16))``.

    With S = :func:`nvfp4_global_encode_scale` of ``global_amax`` (one value, or one per row
    -- shape (M,) -- for TE's row-scaled NVFP4): each block's decode scale is
    ``e4m3(min(block_amax * (S * fp32(1/6)), FP32_MAX))`` (saturating at 448), its encode
    scale ``min(1 / (decode * fp32(1/S)), FP32_MAX)`` -- a block whose decode scale rounds
    to 0 encodes with FP32_MAX, so its nonzero elements saturate to +-6 -- and the elements
    are ``e2m1(clamp(x * encode, -6, 6))``. 16 x 16 blocks share one amax and one scale
    (repeated on the 16 rows of the tile). ``uniform`` (same shape as ``x2d``, in [0, 1))
    switches the E2M1 rounding to stochastic. ``four_over_six`` ("MAE" / "MSE") selects
    per block between two candidates, see :func:`_nvfp4_four_over_six`
    (``four_over_six_fast_math``: its error in the scaled domain).
    """
    rows, cols = x2d.shape
    block = block_amax(x2d, block_rows, NVFP4_BLOCK)  # (ceil(M/br), ceil(K/16))
    if block_rows > 1:
        block = block.repeat_interleave(block_rows, 0)[:rows]
    per_row = global_amax.float().reshape(-1, 1)  # (1, 1), or (M, 1) row-scaled
    encode_global = nvfp4_global_encode_scale(per_row, e4m3_max)
    decode_global = torch.div(torch.ones_like(encode_global), encode_global)
    if four_over_six is not None:
        if uniform is not None:
            raise ValueError("nvfp4_quantize: 4over6 does not support stochastic rounding (TE's recipe refuses it)")
        return _nvfp4_four_over_six(x2d, block, per_row, encode_global, decode_global, block_rows, e4m3_max, four_over_six,
                                    four_over_six_fast_math)
    multiplier = encode_global * torch.reciprocal(torch.tensor(E2M1_MAX, device=x2d.device))
    decode = torch.clamp(block * multiplier, max=FP32_MAX)
    decode = torch.clamp(decode, -448.0, 448.0).to(torch.float8_e4m3fn)
    encode = torch.clamp(torch.div(torch.ones_like(block), decode.float() * decode_global), max=FP32_MAX)
    scaled = x2d.float() * expand_block_scales(encode, 1, NVFP4_BLOCK, (rows, cols))
    clipped = torch.clamp(scaled, -E2M1_MAX, E2M1_MAX)
    codes = e2m1_encode(clipped) if uniform is None else e2m1_encode_stochastic(clipped, uniform)
    return pack_fp4(codes), decode


def _nvfp4_four_over_six(
    x2d: torch.Tensor,
    block: torch.Tensor,
    global_amax: torch.Tensor,
    encode_global: torch.Tensor,
    decode_global: torch.Tensor,
    block_rows: int,
    e4m3_max: float,
    err_mode: str,
    fast_math: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TE's "4over6" NVFP4 block scaling (``nvfp4_use_4over6``): two candidates per block.

    Map-to-6 is plain NVFP4 with the decode scale ``e4m3(clamp((amax / 6) * S, +-448))``;
    map-to-4 scales that by 1.5 before the E4M3 cast, so the block's largest magnitude lands
    on E2M1's 4 instead of 6 (finer steps for the rest). Both encode as plain NVFP4. Each
    candidate's error is measured in the input domain, element by element in order:
    ``((code * scale) * global_amax) / (6 * e4m3_max) - x``, summed as |diff| ("MAE") or
    diff^2 ("MSE") over the 16 elements (16 x 16 tiles: the 16 row sums added pairwise
    8+8, 4+4, 2+2, 1+1, as TE's warp reduction does). Map-to-4 wins only when strictly
    smaller (ties, and NaN errors, keep map-to-6). After TE's
    ``_quantize_blockwise_4over6_reference`` and ``cast/nvfp4/quantize_4over6_nvfp4.cuh``
    (``compute_scale_pair``, ``accumulate_dequant_error``: the same operations in the same
    order).

    ``fast_math`` is TE's opt-in ``NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH=1`` (off by default):
    the error of each element is measured in the scaled domain instead,
    ``fp16(code * scale) - x * S`` (``accumulate_fp16_scaled_error_pair``: ``mul.rn.f16x2``
    of the E2M1 value and the E4M3 scale, the input times the global encode scale in fp32).
    That fp16 product is exact (at most 6 significant bits, magnitudes in [2**-10, 2688]),
    so it is computed here as the fp32 product.
    """
    rows, cols = x2d.shape
    nb = block.shape[1]
    base = torch.div(block, torch.tensor(E2M1_MAX, device=x2d.device)) * encode_global
    candidates = []
    x = x2d.float()
    denom = torch.tensor(E2M1_MAX * e4m3_max, dtype=torch.float32, device=x2d.device)
    for factor in (1.5, 1.0):
        pre = base * factor if factor != 1.0 else base
        decode = torch.clamp(pre, -448.0, 448.0).to(torch.float8_e4m3fn)
        encode = torch.clamp(torch.div(torch.ones_like(block), decode.float() * decode_global), max=FP32_MAX)
        codes = e2m1_encode(torch.clamp(x * expand_block_scales(encode, 1, NVFP4_BLOCK, (rows, cols)), -E2M1_MAX, E2M1_MAX))
        values = e2m1_decode(codes).reshape(rows, nb, NVFP4_BLOCK)
        xb = x.reshape(rows, nb, NVFP4_BLOCK)
        err = torch.zeros((rows, nb), dtype=torch.float32, device=x2d.device)
        scaled_x = xb * encode_global.reshape(-1, 1, 1) if fast_math else None
        for i in range(NVFP4_BLOCK):
            if fast_math:
                diff = values[:, :, i] * decode.float() - scaled_x[:, :, i]
            else:
                diff = torch.div((values[:, :, i] * decode.float()) * global_amax, denom) - xb[:, :, i]
            err = err + (diff * diff if err_mode == "MSE" else diff.abs())
        candidates.append((codes, decode, err))
    (codes4, decode4, err4), (codes6, decode6, err6) = candidates
    if block_rows > 1:
        err4, err6 = (_tile_row_sum(e, block_rows).repeat_interleave(block_rows, 0) for e in (err4, err6))
    pick4 = err4 < err6
    codes = torch.where(expand_block_scales(pick4, 1, NVFP4_BLOCK, (rows, cols)), codes4, codes6)
    return pack_fp4(codes), torch.where(pick4, decode4.view(torch.uint8), decode6.view(torch.uint8)).view(torch.float8_e4m3fn)


def _tile_row_sum(err: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """Sum each tile's ``tile_rows`` rows pairwise (halves added until one row is left)."""
    rows = err.reshape(err.shape[0] // tile_rows, tile_rows, err.shape[1])
    while rows.shape[1] > 1:
        half = rows.shape[1] // 2
        rows = rows[:, :half] + rows[:, half:]
    return rows[:, 0]


def nvfp4_dequantize(
    packed: torch.Tensor, scale: torch.Tensor, global_amax: torch.Tensor | None, e4m3_max: float = 448.0
) -> torch.Tensor:
    """fp32 values of NVFP4 codes as TE's dequantize kernel forms them:
    ``e2m1 * ((e4m3_scale * amax) * fp32(1 / (6 * e4m3_max)))``; ``global_amax`` one value
    or one per row (row-scaled). An infinite amax (an inf in the input) makes every value
    +-inf, or NaN for code 0, and so does ``e4m3_scale * amax`` overflowing (amax > ~7.6e35),
    as in TE (``common/cast/nvfp4/dequantize_nvfp4.cuh``: ``final_scale = scale * amax *
    factor_inv``). ``global_amax`` None: the block-scaled values ``e2m1 * e4m3_scale`` (exact
    in fp32) without the per-tensor factor, what TE's GEMM multiplies (:func:`nvfp4_gemm_alpha`)."""
    values = e2m1_decode(unpack_fp4(packed))
    if global_amax is None:
        return values * expand_block_scales(scale.float(), 1, NVFP4_BLOCK, tuple(values.shape))
    factor = torch.reciprocal(torch.tensor(E2M1_MAX * e4m3_max, dtype=torch.float32, device=packed.device))
    block = (scale.float() * global_amax.float().reshape(-1, 1)) * factor
    return values * expand_block_scales(block, 1, NVFP4_BLOCK, tuple(values.shape))


def nvfp4_gemm_alpha(
    amax_a: torch.Tensor, amax_b: torch.Tensor, e4m3_max_a: float = 448.0, e4m3_max_b: float = 448.0
) -> torch.Tensor:
    """The per-tensor factor TE's NVFP4 GEMM applies to the fp32 product of the block-scaled
    operands: ``amax_a * amax_b * fp32(1 / (6 * 6 * e4m3_max_a * e4m3_max_b))``, left to right
    (``compute_nvfp4_per_tensor_scale_kernel``, ``common/recipe/nvfp4.cu``; cuBLAS's alpha).
    A (1,) fp32 tensor; an infinite amax gives an infinite alpha, so an output is +-inf, or
    NaN where the block-scaled product is 0."""
    device = amax_a.device
    factor_inv = torch.div(torch.ones(1, device=device),
                           torch.tensor([E2M1_MAX * E2M1_MAX * e4m3_max_a * e4m3_max_b], device=device))
    return (amax_a.float().reshape(1) * amax_b.float().reshape(1).to(device)) * factor_inv


def sylvester_hadamard(n: int) -> torch.Tensor:
    """The n x n Sylvester Hadamard matrix (entries +-1), n a power of two."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"sylvester_hadamard: n must be a power of two, got {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def sign_mask_from_signs(signs: tuple[int, ...]) -> int:
    """Bit i set where sign i is -1 (TE's encoding of the RHT sign vector)."""
    return sum(1 << i for i, s in enumerate(signs) if s == -1)


TE_RHT_SIGN_MASK = sign_mask_from_signs(TE_RHT_SIGNS)


def _hadamard_rows(sign_mask: int, n: int) -> tuple[tuple[float, ...], ...]:
    # Plain Python (Dynamo may trace this inside a fake impl): the Sylvester entry (i, j) is
    # (-1)**popcount(i & j); bit i of the mask negates row i.
    scale = 1.0 / math.sqrt(n)
    rows = []
    for i in range(n):
        sign = -1.0 if (sign_mask >> i) & 1 else 1.0
        rows.append(tuple(sign * scale * (-1.0 if bin(i & j).count("1") % 2 else 1.0) for j in range(n)))
    return tuple(rows)


def random_hadamard_matrix(
    sign_mask: int = TE_RHT_SIGN_MASK, n: int = NVFP4_BLOCK, *, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Orthonormal ``diag(signs) @ H_n / sqrt(n)`` (fp32); bit i of ``sign_mask`` negates row i.

    Derived state: rebuilt from the integer mask whenever needed, so a quantizer only ever
    stores the mask. Built from Python data (no cache, no tensor ops), so it can also be
    made under a fake-tensor mode or traced by Dynamo.
    """
    if not 0 <= sign_mask < (1 << n):
        raise ValueError(f"random_hadamard_matrix: sign_mask must fit in {n} bits, got {sign_mask}")
    return torch.tensor(_hadamard_rows(sign_mask, n), dtype=torch.float32, device=device)


def apply_hadamard(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``groups @ matrix`` for every consecutive group of n elements of the last dim.

    The 16-term sums of +-x/4 are formed in float64 (exact for any realistic spread of
    magnitudes) and rounded once to fp32, then to the input's dtype: a correctly rounded
    transform, bf16 for bf16 input as TE's RHT writes it, independent of summation order.
    """
    n = matrix.shape[0]
    if x.shape[-1] % n:
        raise ValueError(f"apply_hadamard: last dim {x.shape[-1]} is not a multiple of {n}")
    groups = x.double().reshape(*x.shape[:-1], x.shape[-1] // n, n)  # no -1: x may be empty
    return (groups @ matrix.double().to(groups.device)).reshape(x.shape).float().to(x.dtype)


# ------------------------------------------------------------------------ blocks
def flatten_2d(x: torch.Tensor) -> torch.Tensor:
    """(..., K) -> (M, K) with M the product of the leading dims; a 0-d x is one 1 x 1 row."""
    if x.dim() == 0:
        return x.reshape(1, 1)
    # Not reshape(-1, K): with K == 0 the -1 is ambiguous and raises, for (256, 0) as for (0, 0).
    return x.unsqueeze(0) if x.dim() == 1 else x.flatten(0, -2)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def to_blocks(x2d: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """(M, K) -> (ceil(M/br), ceil(K/bc), br * bc), zero-padded (zeros never raise an amax)."""
    m, k = x2d.shape
    mb, kb = ceil_div(m, block_rows), ceil_div(k, block_cols)
    padded = torch.nn.functional.pad(x2d, (0, kb * block_cols - k, 0, mb * block_rows - m))
    blocks = padded.reshape(mb, block_rows, kb, block_cols).permute(0, 2, 1, 3)
    return blocks.reshape(mb, kb, block_rows * block_cols)


def expand_block_scales(scales: torch.Tensor, block_rows: int, block_cols: int, shape: tuple[int, int]) -> torch.Tensor:
    """(ceil(M/br), ceil(K/bc)) per-block values -> (M, K), each repeated over its block."""
    full = scales.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)
    return full[: shape[0], : shape[1]]


def error_stats(reference: torch.Tensor, approx: torch.Tensor) -> dict[str, float]:
    """How far ``approx`` is from ``reference``: relative RMS error, max |error|, SQNR in dB."""
    ref = reference.double()
    err = approx.double() - ref
    signal = ref.pow(2).mean()
    noise = err.pow(2).mean()
    return {
        "rel_rms": float((noise / signal).sqrt()),
        "max_abs": float(err.abs().max()),
        "sqnr_db": float(10 * torch.log10(signal / noise)) if noise > 0 else math.inf,
    }
