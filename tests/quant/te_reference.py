"""TransformerEngine's quantization algorithms, restated independently: the test oracle.

Written from TE's own reference code and kernels, NOT from ``tetrt_support.quant``, and in
a different medium on purpose: numpy float32 arithmetic (each operation rounds like the
CUDA float it stands for), ml_dtypes for the FP8/bf16 casts, integer bit manipulation for
E8M0, and TE's own comparison bins for E2M1. Sources, all in the NVIDIA/TransformerEngine
repository:

- per-tensor and blockwise scale: ``common/recipe/recipe_common.cuh``
  (``compute_scale_from_amax``: amax < eps -> eps; amax 0/inf/NaN -> 1; ``__fdiv_rn``;
  inf -> ``value_for_inf``; pow-2 by masking the mantissa) and
  ``tests/pytorch/references/quantize_scale_calc.py`` / ``ref_per_tensor_cs.py``;
- amax: the kernels' ``fmaxf`` reductions (``common/recipe/current_scaling.cu``,
  ``transpose/quantize_transpose_vector_blockwise.cu``, ``cast/mxfp8/quantize_mxfp8.cuh``),
  which skip NaN;
- delayed scaling: ``common/recipe/delayed_scaling.cu`` (``kernel_bulk``);
- blockwise FP8: ``tests/pytorch/references/blockwise_quantizer_reference.py`` with the
  kernel's ``value_for_inf`` = the input dtype's max;
- MXFP8: ``tests/cpp/operator/test_cast_mxfp8.cu`` and ``tests/cpp/test_common.h``
  (``float_to_e8m0(amax * max_reciprocal)``), ``common/util/ptx.cuh`` (``exp2f_rcp``),
  ``tests/pytorch/test_mxfp8_2d_quantize.py`` (32x32 tiles);
- NVFP4: ``pytorch/custom_recipes/reference_nvfp4.py`` (``_quantize_blockwise_reference``,
  ``cast_to_fp4x2``, ``_apply_rht``) and ``pytorch/tensor/nvfp4_tensor.py`` (sign vector).

Every function takes a float32 numpy array holding the input's values (bf16 inputs are
exactly representable) plus the input dtype name where a rule depends on it, and returns
numpy arrays; FP8 results are ml_dtypes arrays (compare their bytes).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
BF16_MAX = F32(float(ml_dtypes.finfo(ml_dtypes.bfloat16).max))
FP8 = {"e4m3": (ml_dtypes.float8_e4m3fn, F32(448.0)), "e5m2": (ml_dtypes.float8_e5m2, F32(57344.0))}
INPUT_MAX = {"float32": FLT_MAX, "bfloat16": BF16_MAX}
WGRAD_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=np.float32)


# ---------------------------------------------------------------------- pieces
def fmax_amax(values: np.ndarray, axis=None) -> np.ndarray:
    """max |v| the way ``fmaxf`` folds it, starting from 0: NaN is skipped."""
    magnitude = np.abs(values.astype(F32))
    return np.fmax.reduce(magnitude, axis=axis, initial=F32(0.0)).astype(F32)


def scale_from_amax(amax: np.ndarray, fp8_max: np.float32, *, eps: float, pow2: bool, value_for_inf: np.float32) -> np.ndarray:
    """recipe_common.cuh ``compute_scale_from_amax``, element by element."""
    amax = np.asarray(amax, dtype=F32)
    out = np.empty_like(amax)
    for index, a in np.ndenumerate(amax):
        if a < F32(eps):  # NaN compares false and stays NaN
            a = F32(eps)
        if np.isinf(a) or a == 0 or np.isnan(a):
            out[index] = F32(1.0)
            continue
        with np.errstate(over="ignore", divide="ignore"):
            s = F32(fp8_max) / a
        if np.isinf(s):
            s = F32(value_for_inf)
        if pow2:
            s = (np.array(s, dtype=F32).view(np.uint32) & np.uint32(0xFF800000)).view(F32)[()]
        out[index] = s
    return out


def cast_fp8(values: np.ndarray, fp8: str) -> np.ndarray:
    """Saturating (satfinite) RNE cast of float32 values to an FP8 format; every NaN becomes
    the positive NaN code 0x7F, as ``cvt.rn.satfinite`` writes it (measured on an H200)."""
    dtype, limit = FP8[fp8]
    clipped = np.clip(values.astype(F32), -limit, limit)
    out = clipped.astype(dtype)
    out.view(np.uint8)[np.isnan(clipped)] = 0x7F  # ml_dtypes' own e5m2 NaN is 0x7E
    return out


# ------------------------------------------------------------ per-tensor FP8
def current_scaling(x: np.ndarray, fp8: str, *, pow2: bool = False, eps: float = 0.0):
    """(data, scale_inv, amax): ref_per_tensor_cs_cast with the kernel's NaN-skipping amax."""
    amax = fmax_amax(x)
    scale = scale_from_amax(np.array([amax]), FP8[fp8][1], eps=eps, pow2=pow2, value_for_inf=FLT_MAX)
    with np.errstate(over="ignore", invalid="ignore"):
        data = cast_fp8(x.astype(F32) * scale[0], fp8)
    return data, (F32(1.0) / scale).astype(F32), np.array([amax], dtype=F32)


def delayed_update(history: np.ndarray, scale: np.float32, *, fp8_max: float, margin: int, algo: str):
    """delayed_scaling.cu ``kernel_bulk`` for one tensor: (new history, new scale)."""
    h = history.astype(F32).copy()
    length = len(h)
    last = h[0]
    amax = F32(0.0)
    if last != 0:
        rolled = np.empty_like(h)
        for i in range(length):
            a = h[i + 1] if i < length - 1 else last
            amax = np.fmax(amax, a)
            rolled[i] = a if i > 0 else F32(0.0)
        h = rolled
    if algo == "most_recent":
        amax = last
    scaled_max = F32(fp8_max) * F32(2.0 ** (-margin))
    if np.isfinite(amax) and amax > 0:
        with np.errstate(over="ignore"):
            new_scale = scaled_max / F32(amax)
    else:
        new_scale = F32(scale)
    if np.isinf(new_scale):
        new_scale = FLT_MAX
    return h, F32(new_scale)


# ----------------------------------------------------------------- blockwise
def blockwise(x: np.ndarray, input_dtype: str, fp8: str, tile: tuple[int, int], *, pow2: bool = True, eps: float = 0.0):
    """(data, scale_inv (row tiles, column tiles)) of one layout; tiles zero-padded."""
    rows, cols = x.shape
    tr, tc = tile
    pr, pc = -(-rows // tr) * tr, -(-cols // tc) * tc
    padded = np.zeros((pr, pc), dtype=F32)
    padded[:rows, :cols] = x
    tiles = padded.reshape(pr // tr, tr, pc // tc, tc)
    amax = fmax_amax(tiles.transpose(0, 2, 1, 3).reshape(pr // tr, pc // tc, tr * tc), axis=-1)
    scale = scale_from_amax(amax, FP8[fp8][1], eps=eps, pow2=pow2, value_for_inf=INPUT_MAX[input_dtype])
    with np.errstate(over="ignore", invalid="ignore"):
        data = cast_fp8(tiles * scale[:, None, :, None], fp8).reshape(pr, pc)[:rows, :cols]
    return data, (F32(1.0) / scale).astype(F32)


# --------------------------------------------------------------------- MXFP8
def float_to_e8m0(value: np.float32) -> int:
    """test_common.h ``float_to_e8m0`` (the software twin of cvt.rp.satfinite.ue8m0)."""
    value = F32(value)
    if np.isnan(value):
        return 0xFF
    if np.isinf(value):
        return 0xFE
    if value == 0:
        return 0x00
    bits = int(np.array(value, dtype=F32).view(np.uint32))
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    if mantissa > 0 and exponent != 0xFE and not (exponent == 0 and mantissa <= 0x400000):
        exponent += 1
    return exponent


def exp2f_rcp(biased: int) -> np.float32:
    """ptx.cuh ``exp2f_rcp``: 2**(127 - biased) as fp32 bits (254 -> 2**-127, 255 -> NaN)."""
    if biased == 255:
        return np.array(0x7FFFFFFF, dtype=np.uint32).view(F32)[()]
    if biased == 254:
        return np.array(0x00400000, dtype=np.uint32).view(F32)[()]
    return np.array((254 - biased) << 23, dtype=np.uint32).view(F32)[()]


def mxfp8(x: np.ndarray, fp8: str, mode: str):
    """(data (M, K), E8M0 scales) for ``mode`` "rowwise" (1x32, scales (M, K/32)),
    "columnwise" (32x1, scales (M/32, K)) or "2d" (32x32; returns row-wise scales)."""
    rows, cols = x.shape
    tr, tc = {"rowwise": (1, 32), "columnwise": (32, 1), "2d": (32, 32)}[mode]
    rcp = F32(1.0 / float(FP8[fp8][1]))  # Quantized_Limits::max_reciprocal
    data = np.empty((rows, cols), dtype=FP8[fp8][0])
    scales = np.empty((rows // tr, cols // tc), dtype=np.uint8)
    for bi in range(rows // tr):
        for bj in range(cols // tc):
            block = x[bi * tr:(bi + 1) * tr, bj * tc:(bj + 1) * tc].astype(F32)
            biased = float_to_e8m0(F32(fmax_amax(block)) * rcp)
            scales[bi, bj] = biased
            with np.errstate(over="ignore", invalid="ignore"):
                data[bi * tr:(bi + 1) * tr, bj * tc:(bj + 1) * tc] = cast_fp8(block * exp2f_rcp(biased), fp8)
    if mode == "2d":
        scales = np.repeat(scales, 32, axis=0)
    return data, scales


# --------------------------------------------------------------------- NVFP4
def cast_to_fp4x2(v: np.ndarray) -> np.ndarray:
    """reference_nvfp4.py ``cast_to_fp4x2``: TE's bins (ties to even), two codes a byte."""
    r = np.zeros(v.shape, dtype=np.uint8)
    bins = [
        ((v >= 0.0) & (v <= 0.25), 0), ((v > 0.25) & (v < 0.75), 1), ((v >= 0.75) & (v <= 1.25), 2),
        ((v > 1.25) & (v < 1.75), 3), ((v >= 1.75) & (v <= 2.5), 4), ((v > 2.5) & (v < 3.5), 5),
        ((v >= 3.5) & (v <= 5.0), 6), (v > 5.0, 7),
        ((v >= -0.25) & (v < -0.0), 8), ((v < -0.25) & (v > -0.75), 9), ((v <= -0.75) & (v >= -1.25), 10),
        ((v < -1.25) & (v > -1.75), 11), ((v <= -1.75) & (v >= -2.5), 12), ((v < -2.5) & (v > -3.5), 13),
        ((v <= -3.5) & (v >= -5.0), 14), (v < -5.0, 15),
    ]
    for mask, code in bins:
        r[mask] = code
    # NaN: the reference's bins leave code 0, but TE's kernels convert with cvt.satfinite,
    # which turns a NaN into positive MAX_NORM (common/util/ptx.cuh): code 7. The kernel wins.
    r[np.isnan(v)] = 7
    return (r[:, ::2] + r[:, 1::2] * 16).astype(np.uint8)


def rht(x_t: np.ndarray, input_dtype: str) -> np.ndarray:
    """reference_nvfp4.py ``_apply_rht`` on the (K, M) column-wise operand: groups of 16
    along M times diag(signs) @ H16 * 0.25, in the input's precision (bf16 rounds)."""
    h = np.array([[1.0]], dtype=F32)
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]]).astype(F32)
    transform = (WGRAD_SIGNS[:, None] * h * F32(0.25)).astype(F32)
    out = (x_t.astype(np.float64).reshape(-1, 16) @ transform.astype(np.float64)).reshape(x_t.shape)
    if input_dtype == "bfloat16":
        return out.astype(ml_dtypes.bfloat16).astype(F32)
    return out.astype(F32)


def nvfp4(x: np.ndarray, tile_rows: int = 1, *, row_scaled: bool = False, e4m3_max: int = 448,
          four_over_six: str | None = None, fast_math: bool = False):
    """(packed codes (M, K/2), E4M3 scales (M, K/16), global amax (1,) or (M,) row-scaled) of one layout.

    ``row_scaled``: one global amax and encode scale per row (TE's ``row_scaled_nvfp4``).
    ``four_over_six`` ("MAE"/"MSE"): ``_quantize_blockwise_4over6_reference`` -- two
    candidates per block (decode scale x1.5 "map to 4", x1 "map to 6"), the one with the
    strictly smaller input-domain error wins; ``e4m3_max`` 256 or 448 bounds the global scale.
    ``fast_math`` (TE's ``NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH=1``): the error in the scaled
    domain, the fp16 product of E2M1 value and E4M3 scale minus the fp32 ``x * s_enc``.
    """
    rows, cols = x.shape
    x = x.astype(F32)
    if row_scaled:
        global_amax = fmax_amax(x, axis=1).astype(F32).reshape(rows, 1)
    else:
        global_amax = np.full((1, 1), fmax_amax(x), dtype=F32)
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = np.minimum(F32(float(e4m3_max) * 6.0) / global_amax, FLT_MAX).astype(F32)
    s_enc = np.where(s_enc == 0, F32(1.0), s_enc).astype(F32)
    s_dec = (F32(1.0) / s_enc).astype(F32)
    padded_rows = -(-rows // tile_rows) * tile_rows
    padded = np.zeros((padded_rows, cols), dtype=F32)
    padded[:rows] = x
    tiles = padded.reshape(padded_rows // tile_rows, tile_rows, cols // 16, 16)
    vec_max = fmax_amax(tiles.transpose(0, 2, 1, 3).reshape(padded_rows // tile_rows, cols // 16, -1), axis=-1)
    vec_max = np.repeat(vec_max, tile_rows, axis=0)[:rows].astype(F32)  # (M, K/16)
    amax_out = global_amax.reshape(-1)
    if four_over_six is not None:
        codes, decode = _nvfp4_four_over_six(x, vec_max, global_amax, s_enc, s_dec, tile_rows, e4m3_max, four_over_six,
                                             fast_math)
        return codes, decode, amax_out
    multiplier = (s_enc * (F32(1.0) / F32(6.0))).astype(F32)
    with np.errstate(over="ignore"):
        decode = np.minimum(vec_max * multiplier, FLT_MAX)
    decode = np.clip(decode, -448.0, 448.0).astype(F32).astype(ml_dtypes.float8_e4m3fn)
    return _nvfp4_encode(x, decode, s_dec), decode, amax_out


def _nvfp4_encode(x: np.ndarray, decode: np.ndarray, s_dec: np.ndarray) -> np.ndarray:
    rows, cols = x.shape
    with np.errstate(divide="ignore", over="ignore"):
        encode = np.minimum(F32(1.0) / (decode.astype(F32) * s_dec), FLT_MAX).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = x.reshape(rows, cols // 16, 16) * encode[:, :, None]
    return cast_to_fp4x2(np.clip(scaled, -6.0, 6.0).reshape(rows, cols).astype(F32))


E2M1_TABLE = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=F32)


def _unpack(packed: np.ndarray) -> np.ndarray:
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)


def _nvfp4_four_over_six(x, vec_max, global_amax, s_enc, s_dec, tile_rows, e4m3_max, mode, fast_math=False):
    rows, cols = x.shape
    nb = cols // 16
    base = ((vec_max / F32(6.0)).astype(F32) * s_enc).astype(F32)
    denom = F32(6.0) * F32(float(e4m3_max))
    results = []
    for factor in (F32(1.5), None):
        pre = (base * factor).astype(F32) if factor is not None else base
        decode = np.clip(pre, -448.0, 448.0).astype(F32).astype(ml_dtypes.float8_e4m3fn)
        packed = _nvfp4_encode(x, decode, s_dec)
        values = E2M1_TABLE[_unpack(packed)].reshape(rows, nb, 16)
        sf = decode.astype(F32)
        err = np.zeros((rows, nb), dtype=F32)
        xb = x.reshape(rows, nb, 16)
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = (xb * s_enc.reshape(-1, 1, 1)).astype(F32)  # fast math: x * S_enc, fp32
        for i in range(16):  # element by element, in order, as TE's loop
            if fast_math:  # mul.rn.f16x2 of the E2M1 value and the E4M3 scale, then fp32
                v = (values[:, :, i].astype(np.float16) * sf.astype(np.float16)).astype(F32)
                d = (v - scaled[:, :, i]).astype(F32)
            else:
                v = (values[:, :, i] * sf).astype(F32)
                v = (v * global_amax).astype(F32)
                v = (v / denom).astype(F32)
                d = (v - xb[:, :, i]).astype(F32)
            err = (err + (d * d if mode == "MSE" else np.abs(d))).astype(F32)
        results.append((packed, decode, err))
    (p4, d4, e4), (p6, d6, e6) = results
    if tile_rows > 1:  # TE's warp tree over a tile's 16 row errors: 8+8, 4+4, 2+2, 1+1
        def tree(e):
            t = e.reshape(rows // 16, 16, nb)
            while t.shape[1] > 1:
                h = t.shape[1] // 2
                t = (t[:, :h] + t[:, h:]).astype(F32)
            return np.repeat(t[:, 0], 16, axis=0)
        e4, e6 = tree(e4), tree(e6)
    pick4 = e4 < e6
    codes = np.where(np.repeat(pick4, 8, axis=1), p4.reshape(rows, -1), p6.reshape(rows, -1)).astype(np.uint8)
    decode = np.where(pick4, d4.view(np.uint8), d6.view(np.uint8)).view(ml_dtypes.float8_e4m3fn)
    return codes, decode


# ------------------------------------------------------------ TE's scale buffers
def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def swizzled_index(i: np.ndarray, j: np.ndarray, tiles_x: int) -> np.ndarray:
    """``gemm_swizzled_scale_idx`` (common/cast/mxfp8/swizzle.cuh): where scale (i, j) of a
    (128 x 4)-tiled buffer lives in the GEMM-swizzled byte order."""
    tile = 128 * 4
    idx = ((i // 128) * tiles_x + j // 4) * tile
    return idx + (i % 128 % 32) * 16 + (i % 128 // 32) * 4 + j % 4


def microscale_buffer(compact: np.ndarray, *, along_rows: bool, swizzled: bool) -> np.ndarray:
    """The scale buffer TE allocates (``get_scale_shape``: (128, 4) multiples, or (4, 128)
    for MXFP8's column-wise scales), valid region in place, padding zero; swizzled: the
    bytes in ``gemm_swizzled_scale_idx`` order (column-wise: over the (K, M/32) transpose,
    as ``swizzle_col_scaling_kernel`` reads them)."""
    raw = np.ascontiguousarray(compact).view(np.uint8)
    r, c = raw.shape
    shape = (_round_up(r, 4), _round_up(c, 128)) if along_rows else (_round_up(r, 128), _round_up(c, 4))
    out = np.zeros(shape, dtype=np.uint8)
    out[:r, :c] = raw
    if swizzled:
        mat = out.T if along_rows else out
        i, j = np.indices(mat.shape)
        flat = np.zeros(mat.size, dtype=np.uint8)
        flat[swizzled_index(i, j, mat.shape[1] // 4).reshape(-1)] = mat.reshape(-1)
        out = flat.reshape(shape)
    return out.view(compact.dtype)


def blockwise_scale_buffer(compact: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    """``Float8BlockQuantizer.get_scale_shape`` (GEMM-ready): 1 x 128 scales transposed,
    (K/128, roundup(M, 4)); 128 x 128 ones (M/128, roundup(K/128, 4)); padding zero."""
    oriented = compact.T if tile[0] == 1 else compact
    r, c = oriented.shape
    out = np.zeros((r, _round_up(c, 4)), dtype=F32)
    out[:, :c] = oriented
    return out


def nvfp4_dequantize(packed: np.ndarray, scales: np.ndarray, global_amax, e4m3_max: int = 448) -> np.ndarray:
    """dequantize_nvfp4.cuh: value * ((float(scale) * amax) * (1.0f / (6.0f * E4M3_MAX))),
    amax one value or one per row (row-scaled)."""
    codes = _unpack(packed)
    factor = F32(1.0) / (F32(6.0) * F32(float(e4m3_max)))
    amax = np.asarray(global_amax, dtype=F32).reshape(-1, 1)
    final = ((scales.astype(F32) * amax).astype(F32) * factor).astype(F32)  # (M, K/16)
    return E2M1_TABLE[codes] * np.repeat(final, 16, axis=1)


def mxfp8_dequantize(data: np.ndarray, scales: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    """dequantize_mxfp8.cuh: value * exp2f(biased) (2**(biased - 127), 0 -> 2**-127)."""
    powers = np.ldexp(np.ones(scales.shape, dtype=F32), scales.astype(np.int32) - 127).astype(F32)
    return data.astype(F32) * np.repeat(np.repeat(powers, tile[0], axis=0), tile[1], axis=1)
