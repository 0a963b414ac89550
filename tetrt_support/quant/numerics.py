"""Pure numeric building blocks of the quantization recipes (no state, no classes).

Everything the quantizers compute lives here as plain functions of tensors, so the
formats can be checked one step at a time against independent references (numpy,
ml_dtypes, torch's own float8 casts). The recipes follow TransformerEngine's reference
implementations (DESIGN.md section 4); where a detail differs it is said in place.

Special values, one rule for every format (TransformerEngine casts with "satfinite"):
finite values beyond the format's range saturate to +-max, +-inf saturates to +-max,
NaN stays NaN where the format has a NaN (FP8 E4M3/E5M2, E8M0, the E4M3 block scale of
NVFP4) and otherwise poisons its block through the block scale (E2M1 has no NaN).
Per-tensor scales treat a non-finite amax like zero (scale 1). One consequence worth
knowing: in MXFP8 an inf saturates its block's E8M0 scale at 2**127, so it dequantizes
to inf again (448 * 2**127 overflows fp32) and the rest of that block flushes to zero.
"""

from __future__ import annotations

import functools
import math

import torch

FP32_MAX = torch.finfo(torch.float32).max
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
E2M1_MAX = 6.0
# The eight E2M1 magnitudes in code order: code = sign << 3 | index into this tuple.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E8M0_BIAS = 127
E8M0_NAN = 255


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an FP8 format (448 for E4M3, 57344 for E5M2)."""
    if dtype not in FP8_DTYPES:
        raise ValueError(f"fp8_max: expected one of {FP8_DTYPES}, got {dtype}")
    return float(torch.finfo(dtype).max)


def cast_to_fp8(x: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """``saturate(x * scale)`` cast to ``dtype``: +-inf and overflow clamp to +-max, NaN stays NaN."""
    limit = fp8_max(dtype)
    scaled = x.float() * scale
    return torch.clamp(scaled, -limit, limit).to(dtype)  # clamp keeps NaN


def scale_from_amax(
    amax: torch.Tensor, max_value: float, *, power_of_2: bool = False, epsilon: float = 0.0
) -> torch.Tensor:
    """FP8 current/delayed-scaling scale ``max_value / amax`` (fp32).

    TransformerEngine's rules: amax is first raised to ``epsilon``; amax 0 or non-finite
    (a tensor holding inf or NaN) gives scale 1; an infinite quotient (tiny amax) gives
    the largest fp32; ``power_of_2`` rounds the scale DOWN to a power of two so that
    ``amax * scale`` still fits.
    """
    amax = amax.float()
    if epsilon > 0.0:
        amax = torch.clamp(amax, min=epsilon)
    scale = max_value / amax
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, FP32_MAX), scale)
    degenerate = (amax == 0) | ~torch.isfinite(amax)
    scale = torch.where(degenerate, torch.ones_like(scale), scale)
    if power_of_2:
        scale = round_down_to_power_of_2(scale)
    return scale


def round_down_to_power_of_2(x: torch.Tensor) -> torch.Tensor:
    """Largest power of two <= x for positive finite x (exact: works on the exponent)."""
    mantissa, exponent = torch.frexp(x.float())  # x = m * 2**e, m in [0.5, 1)
    del mantissa
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), exponent - 1)


def e8m0_round_up(ratio: torch.Tensor) -> torch.Tensor:
    """Biased E8M0 exponent (uint8) of the smallest power of two >= ``ratio``.

    MXFP8's block scale is ``amax / fp8_max`` rounded UP, so that ``amax / scale`` never
    exceeds the FP8 range. torch's ``.to(torch.float8_e8m0fnu)`` rounds to nearest
    (3.0 -> 4.0 but 5.0 -> 4.0), so the exponent is computed here from frexp, exactly.
    Zero (and anything below 2**-127) -> 0 (2**-127), beyond 2**127 and +inf saturate
    to 254 (2**127), NaN -> 255 (the E8M0 NaN).
    """
    ratio = ratio.float()
    mantissa, exponent = torch.frexp(ratio)  # ratio = m * 2**e, m in [0.5, 1)
    exact_power = mantissa == 0.5
    ceil_log2 = torch.where(exact_power, exponent - 1, exponent)
    biased = torch.clamp(ceil_log2 + E8M0_BIAS, 0, 254)
    biased = torch.where(ratio == 0, torch.zeros_like(biased), biased)
    biased = torch.where(torch.isposinf(ratio), torch.full_like(biased, 254), biased)
    biased = torch.where(torch.isnan(ratio), torch.full_like(biased, E8M0_NAN), biased)
    return biased.to(torch.uint8)


def e8m0_to_float(biased: torch.Tensor) -> torch.Tensor:
    """Decode biased E8M0 exponents (uint8) to fp32 powers of two; 255 -> NaN."""
    exponent = biased.to(torch.int32) - E8M0_BIAS
    value = torch.ldexp(torch.ones(biased.shape, dtype=torch.float32, device=biased.device), exponent)
    return torch.where(biased == E8M0_NAN, torch.full_like(value, math.nan), value)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to E2M1 codes (uint8 in [0, 15]), round-to-nearest-even.

    |x| > 6 and +-inf saturate to +-6; NaN encodes as 0 (E2M1 has no NaN: the caller's
    block scale carries it). Ties go to the even code, as in IEEE rounding: 0.25 -> 0,
    0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0.
    """
    x = x.float()
    magnitude = torch.nan_to_num(x.abs(), nan=0.0, posinf=E2M1_MAX)
    values = torch.tensor(E2M1_VALUES, device=x.device)
    midpoints = (values[1:] + values[:-1]) / 2
    lower = torch.bucketize(magnitude, midpoints, right=False)  # ties -> lower code
    upper = torch.bucketize(magnitude, midpoints, right=True)  # ties -> upper code
    index = torch.where(lower % 2 == 0, lower, upper)  # at a tie, keep the even one
    sign = (torch.signbit(x) & ~torch.isnan(x)).to(torch.uint8)
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
    pairs = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`: bytes -> twice as many 4-bit codes along the last dim."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], -1)


def sylvester_hadamard(n: int) -> torch.Tensor:
    """The n x n Sylvester Hadamard matrix (entries +-1), n a power of two."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"sylvester_hadamard: n must be a power of two, got {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


@functools.lru_cache(maxsize=64)
def _hadamard_from_mask(sign_mask: int, n: int) -> torch.Tensor:
    bits = torch.tensor([(sign_mask >> i) & 1 for i in range(n)], dtype=torch.float32)
    signs = 1.0 - 2.0 * bits  # bit i set -> row i negated
    return (signs[:, None] * sylvester_hadamard(n)) / math.sqrt(n)


def random_hadamard_matrix(sign_mask: int, n: int = 16) -> torch.Tensor:
    """Orthonormal ``diag(signs) @ H_n / sqrt(n)``; bit i of ``sign_mask`` negates row i.

    Derived state: rebuilt from the integer mask whenever needed (cached), so a quantizer
    only ever stores the mask. Returns a fresh fp32 CPU tensor (never the cached one).
    """
    if not 0 <= sign_mask < (1 << n):
        raise ValueError(f"random_hadamard_matrix: sign_mask must fit in {n} bits, got {sign_mask}")
    return _hadamard_from_mask(sign_mask, n).clone()


def apply_hadamard(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Multiply every consecutive group of n elements of the last dim by ``matrix`` (n x n)."""
    n = matrix.shape[0]
    if x.shape[-1] % n:
        raise ValueError(f"apply_hadamard: last dim {x.shape[-1]} is not a multiple of {n}")
    groups = x.float().reshape(*x.shape[:-1], -1, n)
    return (groups @ matrix.to(groups.device)).reshape(x.shape)


def flatten_2d(x: torch.Tensor) -> torch.Tensor:
    """(..., K) -> (M, K) with M the product of the leading dims (a 1-D x is one row)."""
    if x.dim() == 0:
        raise ValueError("flatten_2d: a quantized tensor needs at least one dimension")
    return x.reshape(-1, x.shape[-1])


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


def block_amax(x2d: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """max|x| of every (br x bc) block of an (M, K) tensor (fp32, NaN-propagating)."""
    return to_blocks(x2d.float().abs(), block_rows, block_cols).amax(dim=-1)


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
