"""Triton building blocks shared by the quantization kernels (the reference's scalar rules).

Every helper restates one rule of :mod:`tetrt_support.quant.numerics` on fp32 values:

- magnitudes are compared as int32 bit patterns (for non-negative floats the integer
  order is the float order), so amax reductions are exact and can use integer atomics;
  NaN is mapped to 0 first, as the reference's amax ignores NaN;
- divisions are ``div_rn`` (correctly rounded), because Triton's ``/`` on fp32 is an
  approximate division;
- saturating casts clamp with NaN kept, as ``torch.clamp`` does (Triton's min/max drop
  a NaN operand); on the GPU the FP8 conversion's own saturation is that clamp.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import torch
import triton
import triton.language as tl

FP32_MAX = float(torch.finfo(torch.float32).max)

TL_FP8 = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e5m2: tl.float8e5}


def software_casts() -> bool:
    """FP8 conversions in integer arithmetic (Triton's interpreter truncates its own)."""
    from tetrt_support.quant.kernels import interpreting

    return interpreting()


def fp8_out(t: torch.Tensor | None) -> torch.Tensor | None:
    """The tensor a kernel stores FP8 results into: a uint8 view under software casts."""
    return t.view(torch.uint8) if t is not None and software_casts() else t


def fp32(value: float) -> float:
    """``value`` rounded to the nearest fp32 (so a kernel constant is the reference's constant)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


@triton.jit
def magnitude_bits(x):
    """|x| as int32 bits, NaN -> 0 (the reference's amax ignores NaN)."""
    bits = x.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return tl.where(bits > 0x7F800000, 0, bits)


@triton.jit
def bits_to_float(bits):
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def clamp_keep_nan(y, limit):
    clamped = tl.minimum(tl.maximum(y, -limit), limit)
    return tl.where(y != y, y, clamped)


@triton.jit
def bf16_bits(y):
    """Round-to-nearest-even fp32 -> bf16 bit patterns (int16) by integer arithmetic, every
    NaN -> 0x7FC0: torch's cast. Used where Triton's interpreter is the runtime (its own
    bf16 conversion truncates); on the GPU the kernels use the hardware conversion."""
    bits = y.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return tl.where(y != y, 0x7FC0, rounded).to(tl.int16)


@triton.jit
def fp8_codes(y, E4M3: tl.constexpr):
    """Round-to-nearest-even fp32 -> FP8 bit patterns (uint8) by integer arithmetic.

    For values already clamped to the format's range (every NaN -> 0x7F, sign dropped),
    the same bytes as torch's cast. Used where Triton's interpreter is the runtime: its
    own float8 conversion truncates. On the GPU the kernels use the hardware conversion
    (``cvt.rn.satfinite``), checked against the reference by ``scripts/gpu_check.py``.
    """
    bits = y.to(tl.int32, bitcast=True)
    sign = ((bits >> 24) & 0x80).to(tl.int32)
    a = bits & 0x7FFFFFFF
    if E4M3:
        MANT: tl.constexpr = 3
        BIAS: tl.constexpr = 7
        SUB_SCALE: tl.constexpr = 512.0  # 2**9: units of the smallest subnormal
        MIN_NORMAL_BITS: tl.constexpr = (127 - 6) << 23
        NAN_CODE: tl.constexpr = 0x7F
    else:
        MANT: tl.constexpr = 2
        BIAS: tl.constexpr = 15
        SUB_SCALE: tl.constexpr = 65536.0  # 2**16
        MIN_NORMAL_BITS: tl.constexpr = (127 - 14) << 23
        NAN_CODE: tl.constexpr = 0x7F
    shift: tl.constexpr = 23 - MANT
    exponent = (a >> 23) - 127 + BIAS
    base = (exponent << MANT) | ((a & 0x7FFFFF) >> shift)
    rem = a & ((1 << shift) - 1)
    half: tl.constexpr = 1 << (shift - 1)
    normal = base + ((rem > half) | ((rem == half) & ((base & 1) == 1))).to(tl.int32)
    magnitude = tl.abs(y) * SUB_SCALE
    sub = ((magnitude + 12582912.0) - 12582912.0).to(tl.int32)  # rint for |v| < 2**22
    code = tl.where(a < MIN_NORMAL_BITS, sub, normal)
    code = tl.where(a > 0x7F800000, NAN_CODE, code | sign)  # every NaN -> 0x7F, as cvt.satfinite
    return code.to(tl.uint8)


@triton.jit
def saturating_fp8_cast(y, MAX_VALUE: tl.constexpr, OUT_DTYPE: tl.constexpr, SOFTWARE: tl.constexpr,
                        E4M3: tl.constexpr, EXPLICIT_CLAMP: tl.constexpr):
    """``torch.clamp(y, -MAX_VALUE, MAX_VALUE)`` cast to FP8 (NaN kept, as the reference's clamp keeps it).

    On the GPU the conversion itself saturates: Triton lowers fp32 -> FP8 on sm90 to
    ``cvt.rn.satfinite``, which maps +-inf and every finite value beyond the format's
    largest to +-largest and keeps NaN, which is exactly the clamp; so the clamp's four
    instructions per element are left out (``scripts/gpu_check.py`` compares the bytes
    with the reference's, special values included). ``EXPLICIT_CLAMP`` keeps them where
    that check failed without them: kernels that store one cast tile both as it is and
    transposed wrote wrong transposed bytes from fp32 inputs (Triton 3.6; bf16 inputs were
    right). The interpreter's integer rounding (:func:`fp8_codes`) needs its
    input clamped first."""
    if SOFTWARE:
        return fp8_codes(clamp_keep_nan(y, MAX_VALUE), E4M3)
    elif EXPLICIT_CLAMP:
        return clamp_keep_nan(y, MAX_VALUE).to(OUT_DTYPE)
    else:
        return y.to(OUT_DTYPE)


def clamp_before_dual_store(x: torch.Tensor) -> bool:
    """Whether a kernel that can store a cast tile both as it is and transposed casts with the
    explicit clamp (:func:`saturating_fp8_cast`): for every input dtype but bf16, the one
    checked on the GPU without it."""
    return x.dtype != torch.bfloat16


@triton.jit
def load_rows(x_ptr, first_row, ROWS: tl.constexpr, offs_k, mask_k, M, stride_xm):
    """Rows ``first_row`` .. ``first_row + ROWS`` of a row-major x at columns ``offs_k``, as
    fp32 (0 outside x): ``(row offsets, mask, values)``, the slab every quantize kernel walks."""
    offs_m = (first_row + tl.arange(0, ROWS)).to(tl.int64)
    mask = (offs_m[:, None] < M) & mask_k[None, :]
    return offs_m, mask, tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def block_amax(x, axis: tl.constexpr):
    """max|x| along ``axis``, NaN ignored (the reference's amax): the float maximum, which
    drops a NaN operand on the GPU (``max.f32``) and under the interpreter (``nanmax``),
    and is exact: the same value as a maximum of the magnitudes' bits (:func:`magnitude_bits`)
    at fewer instructions per element. A slice of NaNs alone reduces to NaN, mapped to 0 here
    as the reference's amax is 0 there."""
    amax = tl.max(tl.abs(x), axis=axis)
    return tl.where(amax != amax, 0.0, amax)


@triton.jit
def e4m3_value(code):
    """fp32 value of E4M3 bit patterns (int32 0..255)."""
    e = (code >> 3) & 0xF
    m = code & 7
    normal = (((e - 7 + 127) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    value = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    value = tl.where((code & 0x7F) == 0x7F, float("nan"), value)
    return tl.where((code & 0x80) != 0, -value, value)


@triton.jit
def scale_from_amax(amax, MAX_VALUE: tl.constexpr, POWER_OF_2: tl.constexpr, EPSILON: tl.constexpr,
                    VALUE_FOR_INF: tl.constexpr):
    """``numerics.compute_scale_from_amax``: max / amax (one division), inf -> VALUE_FOR_INF,
    optional power-of-2 rounding (mantissa cleared), amax 0 / inf / NaN -> 1."""
    if EPSILON > 0.0:
        amax = tl.where(amax < EPSILON, EPSILON, amax)
    scale = tl.math.div_rn(tl.full(amax.shape, MAX_VALUE, tl.float32), amax)
    scale = tl.where(scale == float("inf"), VALUE_FOR_INF, scale)
    if POWER_OF_2:
        scale = (scale.to(tl.int32, bitcast=True) & -0x800000).to(tl.float32, bitcast=True)
    degenerate = (amax == 0.0) | (amax == float("inf")) | (amax != amax)
    return tl.where(degenerate, 1.0, scale)


@triton.jit
def reciprocal(x):
    return tl.math.div_rn(tl.full(x.shape, 1.0, tl.float32), x)


@triton.jit
def tensor_amax_kernel(x_ptr, amax_bits_ptr, n, BLOCK: tl.constexpr):
    """One program per BLOCK elements: max of the magnitudes' bits, atomically maxed into one int32."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_max(amax_bits_ptr, tl.max(magnitude_bits(x), axis=0), sem="relaxed")


def tile_configs(shapes: list[tuple[int, ...]], names: tuple[str, ...] = ("BM", "BK")) -> list[triton.Config]:
    """Autotuning candidates: (tile dims..., num_warps) tuples -> triton.Config."""
    return [triton.Config(dict(zip(names, shape[:-1])), num_warps=shape[-1]) for shape in shapes]


class Launcher:
    """A kernel launched autotuned on the GPU, and with fixed tile sizes under the interpreter
    (where there is nothing to tune) or with ``TETRT_KERNELS_AUTOTUNE=0``. The tile sizes
    only regroup the same per-element and per-block arithmetic: every configuration
    computes the same bytes (``scripts/gpu_check.py`` checks both the fixed and the tuned).

    ``triton.autotune``'s wrapper adds host time to every launch, comparable to what a
    small cast takes on the GPU. So the wrapper runs once per tuning key (it tunes
    and reports the winner); later launches with that key go to the kernel directly with
    the winning configuration."""

    def __init__(self, kernel: triton.JITFunction, configs: list[triton.Config], key: list[str], fixed: dict[str, int]):
        self.kernel = kernel
        self.tuned = triton.autotune(configs=configs, key=key)(kernel)
        self.fixed = fixed
        self._key_positions = [kernel.arg_names.index(name) for name in key]
        self._key_names = key
        self._best: dict[tuple[Any, ...], dict[str, Any]] = {}

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The tuning key, as triton.autotune forms it: the named arguments' values and the
        tensor arguments' dtypes."""
        named = tuple(args[i] if i < len(args) else kwargs[name] for i, name in zip(self._key_positions, self._key_names))
        return named + tuple(a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))

    def __call__(self, grid, *args, **kwargs) -> None:  # grid: callable of the meta-parameters
        from tetrt_support.quant.kernels import interpreting

        if interpreting() or os.environ.get("TETRT_KERNELS_AUTOTUNE", "1") == "0":
            self.kernel[grid(self.fixed)](*args, **kwargs, **self.fixed)
            return
        key = self._key(args, kwargs)
        best = self._best.get(key)
        if best is not None:
            self.kernel[grid](*args, **kwargs, **best)
            return
        self.tuned[grid](*args, **kwargs)
        config = getattr(self.tuned, "best_config", None)
        if config is not None:
            self._best[key] = config.all_kwargs()


AMAX_BLOCK = 8192


def tensor_amax_bits(x: torch.Tensor) -> torch.Tensor:
    """max|x| (NaN ignored) of a contiguous tensor as a (1,) int32 buffer holding fp32 bits.

    ``.view(torch.float32)`` of the result is ``numerics.amax(x)`` bit for bit.
    """
    if not x.is_contiguous():
        raise ValueError("tensor_amax_bits: expected a contiguous tensor")
    out = torch.zeros(1, dtype=torch.int32, device=x.device)
    n = x.numel()
    if n:
        tensor_amax_kernel[(triton.cdiv(n, AMAX_BLOCK),)](x, out, n, BLOCK=AMAX_BLOCK, num_warps=8)
    return out
