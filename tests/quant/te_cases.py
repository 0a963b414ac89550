"""Input families and the byte-for-byte comparison of each quantizer with the TE oracle.

Shared by ``tests/quant/test_te_exact.py`` and the numerics notebook: one place says which
inputs are compared, which buffers, and how (the bytes of every buffer, as TE's own exact
tests compare them with ``atol=0, rtol=0``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tests.quant import te_reference as ref
from tetrt_support.quant import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def family(name: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """One input of a named family, deterministic from (name, shape, dtype, seed)."""
    g = _seeded(seed)
    x = torch.randn(shape, generator=g)
    if name == "normal":
        pass
    elif name == "outliers":
        flat = x.reshape(-1)
        idx = torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() // 200)]
        flat[idx] *= 1000.0
    elif name == "zero rows and blocks":
        if x.dim() == 2:
            x[: max(1, x.shape[0] // 8)] = 0.0
            x[-32:, :128] = 0.0
    elif name == "tiny":
        x = x * 1e-30
    elif name == "subnormal amax":
        x = x * 1e-40 if dtype == torch.float32 else x * 1e-38
    elif name == "huge":
        x = x * 1e30
    elif name == "near dtype max":
        x = x.clamp(-3, 3) * (torch.finfo(dtype).max / 4)
    elif name == "inf":
        flat = x.reshape(-1)
        flat[:: max(1, flat.numel() // 7)] = math.inf
        flat[1 :: max(1, flat.numel() // 5)] = -math.inf
    elif name == "nan":
        flat = x.reshape(-1)
        flat[:: max(1, flat.numel() // 9)] = math.nan
    else:
        raise ValueError(f"unknown input family {name!r}")
    return x.to(dtype)


FAMILIES = ("normal", "outliers", "zero rows and blocks", "tiny", "subnormal amax", "huge", "near dtype max", "inf", "nan")


def _bytes(t: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().contiguous().view(torch.uint8).numpy().reshape(-1)
    return np.ascontiguousarray(t).view(np.uint8).reshape(-1)


def _np(x: torch.Tensor) -> np.ndarray:
    return x.float().numpy()


def _dtype_name(x: torch.Tensor) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16"}[x.dtype]


def _fp8(dtype: torch.dtype) -> str:
    return "e4m3" if dtype == torch.float8_e4m3fn else "e5m2"


Buffers = dict[str, torch.Tensor | np.ndarray]


@dataclass(frozen=True)
class Case:
    """One quantizer configuration: its name, how to build it, and TE's oracle for it."""

    name: str
    make: Callable[[], object]
    oracle: Callable[[torch.Tensor], Buffers]
    families: tuple[str, ...] = FAMILIES
    shape: tuple[int, ...] = (256, 512)
    small: tuple[int, ...] | None = None  # the tests' shape (default: see small_shape)


def ours(case: Case, x: torch.Tensor) -> Buffers:
    return case.make().quantize(x).inner_buffers()


# ---------------------------------------------------------------- the oracles
def _current(fp8_dtype: torch.dtype, pow2: bool) -> Callable[[torch.Tensor], Buffers]:
    def oracle(x: torch.Tensor) -> Buffers:
        x2 = _np(x).reshape(-1, x.shape[-1]) if x.dim() else _np(x).reshape(1, 1)
        data, scale_inv, _ = ref.current_scaling(x2, _fp8(fp8_dtype), pow2=pow2)
        data = data.reshape(x.shape)
        transpose = data if data.ndim <= 1 else np.moveaxis(data, -1, 0)
        return {"_data": data, "_transpose": transpose, "_scale_inv": scale_inv}

    return oracle


def _blockwise(dim: int) -> Callable[[torch.Tensor], Buffers]:
    tile = (1, 128) if dim == 1 else (128, 128)

    def oracle(x: torch.Tensor) -> Buffers:
        x2 = _np(x).reshape(-1, x.shape[-1]) if x.dim() else _np(x).reshape(1, 1)
        rd, rs = ref.blockwise(x2, _dtype_name(x), "e4m3", tile)
        cd, cs = ref.blockwise(np.ascontiguousarray(x2.T), _dtype_name(x), "e4m3", tile)
        rs, cs = ref.blockwise_scale_buffer(rs, tile), ref.blockwise_scale_buffer(cs, tile)
        return {"_rowwise_data": rd, "_rowwise_scale_inv": rs, "_columnwise_data": cd, "_columnwise_scale_inv": cs}

    return oracle


def _mxfp8(two_d: bool, swizzled: bool = False) -> Callable[[torch.Tensor], Buffers]:
    def oracle(x: torch.Tensor) -> Buffers:
        x2 = _np(x).reshape(-1, x.shape[-1])
        if two_d:
            rd, rs = ref.mxfp8(x2, "e4m3", "2d")
            cd, cs = rd, np.repeat(rs[::32], 32, axis=1)
        else:
            rd, rs = ref.mxfp8(x2, "e4m3", "rowwise")
            cd, cs = ref.mxfp8(x2, "e4m3", "columnwise")
        rs = ref.microscale_buffer(rs, along_rows=False, swizzled=swizzled)
        cs = ref.microscale_buffer(cs, along_rows=True, swizzled=swizzled)
        return {"_rowwise_data": rd, "_rowwise_scale_inv": rs, "_columnwise_data": cd, "_columnwise_scale_inv": cs}

    return oracle


def _nvfp4(two_d: bool, with_rht: bool, *, swizzled: bool = False, **options) -> Callable[[torch.Tensor], Buffers]:
    """``options``: te_reference.nvfp4's row_scaled / e4m3_max / four_over_six."""

    def oracle(x: torch.Tensor) -> Buffers:
        x2 = _np(x).reshape(-1, x.shape[-1])
        tile_rows = 16 if two_d else 1
        rd, rs, ra = ref.nvfp4(x2, tile_rows, **options)
        x_t = np.ascontiguousarray(x2.T)
        if with_rht:
            x_t = ref.rht(x_t, _dtype_name(x))
        cd, cs, ca = ref.nvfp4(x_t, tile_rows, **options)
        rs = ref.microscale_buffer(rs, along_rows=False, swizzled=swizzled)
        cs = ref.microscale_buffer(cs, along_rows=False, swizzled=swizzled)
        return {"_rowwise_data": rd, "_rowwise_scale_inv": rs, "_columnwise_data": cd, "_columnwise_scale_inv": cs,
                "_amax_rowwise": ra, "_amax_columnwise": ca}

    return oracle


# NVFP4 with NaN input follows TE's kernels: the amaxes skip NaN (fmaxf / __hmax) and the
# E2M1 conversion (cvt.satfinite) writes +6 for a NaN element. Under 4over6 a NaN makes
# both candidates' error sums NaN, so ``err_map4 < err_map6`` is false and map-to-6 is kept
# (quantize_4over6_nvfp4.cuh: ties and unordered compare select map-to-6).

def RHT_ANY_DTYPE() -> NVFP4Quantizer:
    return NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_any_input_dtype=True)


CASES = (
    Case("FP8 current E4M3", lambda: Float8CurrentScalingQuantizer(), _current(torch.float8_e4m3fn, False)),
    Case("FP8 current E5M2", lambda: Float8CurrentScalingQuantizer(torch.float8_e5m2), _current(torch.float8_e5m2, False)),
    Case("FP8 current E4M3 pow2", lambda: Float8CurrentScalingQuantizer(force_pow_2_scales=True), _current(torch.float8_e4m3fn, True)),
    Case("FP8 block 1x128", lambda: Float8BlockQuantizer(block_scaling_dim=1), _blockwise(1), shape=(200, 300)),
    Case("FP8 block 128x128", lambda: Float8BlockQuantizer(), _blockwise(2), shape=(200, 300)),
    Case("MXFP8 1x32 / 32x1", lambda: MXFP8Quantizer(), _mxfp8(False)),
    Case("MXFP8 1x32 / 32x1, 96 x 160 (padded)", lambda: MXFP8Quantizer(), _mxfp8(False), shape=(96, 160), small=(96, 160)),
    Case("MXFP8 1x32 / 32x1, GEMM-swizzled", lambda: MXFP8Quantizer(optimize_for_gemm=True), _mxfp8(False, True),
         shape=(160, 288), small=(160, 288)),
    Case("MXFP8 32x32", lambda: MXFP8Quantizer(with_2d_quantization=True), _mxfp8(True)),
    Case("NVFP4 1x16", lambda: NVFP4Quantizer(), _nvfp4(False, False), FAMILIES),
    Case("NVFP4 1x16, GEMM-swizzled", lambda: NVFP4Quantizer(optimize_for_gemm=True), _nvfp4(False, False, swizzled=True),
         FAMILIES, shape=(144, 80), small=(144, 80)),
    Case("NVFP4 16x16", lambda: NVFP4Quantizer(with_2d_quantization=True), _nvfp4(True, False), FAMILIES),
    # TE's kernels take bf16 only with the RHT; rht_any_input_dtype=True is TE's reference rule, which
    # lets the fp32 rows run and changes no bf16 byte (test_te_exact checks both).
    Case("NVFP4 1x16 + RHT, rht_any_input_dtype", RHT_ANY_DTYPE, _nvfp4(False, True), FAMILIES),
    # Row-wise only: TE's kernels take row-scaled NVFP4's column-wise layout from bf16 input with
    # both dims multiples of 32 only (test_te_exact checks that layout on such input).
    Case("NVFP4 1x16 row-scaled, row-wise", lambda: NVFP4Quantizer(row_scaled_nvfp4=True, columnwise_usage=False),
         _nvfp4(False, False, row_scaled=True), FAMILIES),
    Case("NVFP4 1x16 4over6 (MAE, 256)", lambda: NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256),
         _nvfp4(False, False, four_over_six="MAE", e4m3_max=256), FAMILIES),
    Case("NVFP4 16x16 4over6 (MSE, 448)", lambda: NVFP4Quantizer(nvfp4_use_4over6=True, with_2d_quantization=True,
                                                                 nvfp4_4over6_err_mode="MSE"),
         _nvfp4(True, False, four_over_six="MSE", e4m3_max=448), FAMILIES),
    # TE's opt-in NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH=1: the candidates' errors in the scaled domain.
    Case("NVFP4 1x16 4over6 fast (MSE, 256)",
         lambda: NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256, nvfp4_4over6_err_mode="MSE",
                                nvfp4_4over6_err_use_fast_math=True),
         _nvfp4(False, False, four_over_six="MSE", e4m3_max=256, fast_math=True), FAMILIES),
    Case("NVFP4 16x16 4over6 fast (MAE, 448)",
         lambda: NVFP4Quantizer(nvfp4_use_4over6=True, with_2d_quantization=True, nvfp4_4over6_err_use_fast_math=True),
         _nvfp4(True, False, four_over_six="MAE", e4m3_max=448, fast_math=True), FAMILIES),
)
CASES_BY_NAME = {case.name: case for case in CASES}
assert len(CASES_BY_NAME) == len(CASES), "two cases share a name"


def compare(case: Case, x: torch.Tensor) -> dict[str, float]:
    """Per buffer: the fraction of bytes equal to TE's (1.0 = bit-exact); shapes must agree."""
    mine, theirs = ours(case, x), case.oracle(x)
    out = {}
    for name, buf in mine.items():
        a, b = _bytes(buf), _bytes(theirs[name])
        if a.shape != b.shape:
            raise AssertionError(f"{case.name}: buffer {name} has {a.size} bytes, TE's has {b.size}")
        equal = a == b
        if buf.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            # An FP8 NaN has several encodings (E5M2: any nonzero mantissa); which one a cast
            # writes is not part of TE's contract: any NaN equals any NaN.
            equal |= torch.isnan(buf.reshape(-1).float()).numpy() & np.isnan(np.asarray(theirs[name], dtype=np.float32).reshape(-1))
        out[name] = float(equal.mean()) if a.size else 1.0
    return out


def small_shape(case: Case) -> tuple[int, ...]:
    """A quarter of the case's shape (still partial blocks where the case has them): for tests."""
    if case.small is not None:
        return case.small
    return tuple(max(32, s // 2) for s in case.shape) if case.shape != (200, 300) else (130, 200)


def compare_small(case: Case, family_name: str, dtype_name: str) -> dict[str, float]:
    """:func:`compare` on the seed-0 input of ``family_name`` at :func:`small_shape`, in the
    input dtype ``dtype_name`` (a key of :data:`DTYPES`). Notebook 07's abstract counts these
    and its section 1 tabulates them: each is computed once per process."""
    return dict(_small_comparison(case.name, family_name, dtype_name))


@functools.lru_cache(maxsize=None)
def _small_comparison(case_name: str, family_name: str, dtype_name: str) -> tuple[tuple[str, float], ...]:
    case = CASES_BY_NAME[case_name]
    return tuple(compare(case, family(family_name, small_shape(case), DTYPES[dtype_name])).items())


def equality_rows(cases=CASES, dtypes=("fp32", "bf16"), seed: int = 0) -> list[dict[str, object]]:
    """One row per (case, family, dtype): the fraction of equal bytes over all buffers,
    and the buffers that differ."""
    rows = []
    for case in cases:
        for fam in case.families:
            for dname in dtypes:
                fractions = compare(case, family(fam, case.shape, DTYPES[dname], seed))
                worst = min(fractions.values())
                rows.append({"format": case.name, "family": fam, "dtype": dname,
                             "bytes equal": f"{100 * worst:.2f} %" if worst < 1 else "all",
                             "differing buffers": ", ".join(k for k, v in fractions.items() if v < 1) or "-"})
    return rows


def format_table_rows(case: Case, dtypes=("fp32", "bf16"), seed: int = 0, shape: tuple[int, ...] | None = None) -> list[list[str]]:
    """Rows ``[family, <dtype>...]`` for one format: "all" where every byte of every buffer
    equals TE's, else the worst buffer's fraction and the buffers that differ."""
    rows = []
    for fam in case.families:
        cells = [fam]
        for dname in dtypes:
            fractions = compare(case, family(fam, shape or case.shape, DTYPES[dname], seed))
            worst = min(fractions.values())
            bad = [k for k, v in fractions.items() if v < 1]
            cells.append("all" if not bad else f"{100 * worst:.2f} % ({', '.join(bad)})")
        rows.append(cells)
    return rows
