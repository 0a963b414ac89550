"""TransformerEngine itself against tetrt on a CUDA GPU: quantizers byte for byte, the Linear bit for bit.

    python -m benchmarks.perf --device cuda --suites te_conformance    # -> results/te_conformance_cuda.json
    python -m benchmarks.perf --device cuda --suites te_conformance --quick   # a smoke subset

Needs ``transformer_engine.pytorch`` (TE's own CUDA kernels) next to tetrt. Three parts:

1. **Quantizers** (:func:`build_cases`, :func:`run_quant_case`): every format TE runs on
   Hopper -- FP8 delayed scaling (a fixed scale), FP8 current scaling (E4M3 / E5M2,
   ``force_pow_2_scales`` on/off, ``amax_epsilon`` 0 / nonzero), FP8 block 1x128 and
   128x128 (power-of-2 scales on/off) -- on 2-D, 3-D and 4-D inputs in bf16, fp16 and fp32,
   shapes that are multiples of 128 and shapes that are not, special values (all-zero and
   denormal blocks, tiny, inf, NaN) and each usage. The same CUDA input goes through
   tetrt's quantizer and TE's; every inner buffer is compared by shape and bytes
   (:func:`compare_quantized`; the rules are :data:`COMPARISON_RULES`, written into the
   JSON), and ``dequantize()`` by value. Each case gets one outcome: ``identical`` |
   ``differs`` | ``te_refuses`` | ``tetrt_refuses`` | ``error``.
2. **Linear** (:func:`run_linear_case`): tetrt's quantized ``Linear`` against ``te.Linear``
   with the same bf16 weights, input and output gradient, recipes ``fp8_current`` and
   ``fp8_block``: forward output, dgrad and wgrad (and the bias gradient) compared
   bitwise; where not equal, the fraction of differing elements and the largest
   difference relative to max |TE's value|. tetrt runs with its default recipe and, where
   its recipes take TE's per-GEMM settings (``fp8_gemm_fprop`` ...), with TE's.
   FP8 delayed scaling has no tetrt Linear recipe, so no Linear case.
3. **What a Hopper TE user meets** with MXFP8 and NVFP4 (:func:`probe_hopper_formats`):
   run in a child process (a CUDA error there cannot poison this one), recording exactly
   what TE's quantize / dequantize do and whether their bytes match tetrt's.

One failing case never stops the run: every case records its own error. A script, not a
test: nothing here asserts (``tests/quant/test_te_conformance.py`` asserts on a subset).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import pathlib
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
OUTCOMES = ("identical", "differs", "te_refuses", "tetrt_refuses", "error")

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (rank 2, 3, 4) x (every dim a multiple of 128 | not): M is the product of the leading dims.
SHAPES: tuple[tuple[int, ...], ...] = (
    (384, 768), (200, 136),          # 2-D: multiple of 128 / not
    (2, 128, 512), (2, 3, 272),      # 3-D: M=256, K=512 / M=6, K=272
    (2, 2, 64, 256), (1, 2, 128, 48),  # 4-D: M=256, K=256 / M=256, K=48
)
USAGES = {"both": (True, True), "rowwise": (True, False), "columnwise": (False, True)}
FAMILIES = ("normal", "zero_and_denormal_blocks", "tiny", "inf", "nan")
SPECIAL_FAMILIES = FAMILIES[1:]
SPECIAL_SHAPES = ((384, 768), (200, 136), (1, 2, 128, 48))
AMAX_EPSILON = 1e-2  # nonzero: above the amax of the "tiny" family, below that of the others
DELAYED_SCALE = 0.5

PER_TENSOR_FORMATS = ("fp8_delayed", "fp8_current")
BLOCK_FORMATS = {"fp8_block_1x128": 1, "fp8_block_128x128": 2}
PER_TENSOR_BUFFERS = ("_data", "_transpose", "_scale_inv")
ROW_COLUMN_BUFFERS = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")
NVFP4_BUFFERS = (*ROW_COLUMN_BUFFERS, "_amax_rowwise", "_amax_columnwise")

COMPARISON_RULES = {
    "data": "every byte, exactly (.view(torch.uint8)); an FP8 NaN is a byte like any other (cases whose only "
            "differing bytes are NaN encodings on both sides are flagged nan_encoding_only, still 'differs')",
    "data_shape": "shapes must be equal: both sides keep TE's N-D data shapes (FP8 block (*lead, K) row-wise, "
                  "(K, *lead) column-wise); a differing shape is recorded as shape_difference and the buffer differs",
    "scales": "compared over their VALID region only: the top-left (rows, cols) block holding one entry per "
              "quantization block. FP8 block: 1x128 row-wise (ceil(K/128), M) of (ceil(K/128), roundup(M,4)), "
              "column-wise (ceil(M/128), K) of (ceil(M/128), roundup(K,4)); 128x128 row-wise (ceil(M/128), "
              "ceil(K/128)) of (ceil(M/128), roundup(ceil(K/128),4)), column-wise (ceil(K/128), ceil(M/128)) of "
              "(ceil(K/128), roundup(ceil(M/128),4)). MXFP8 row-wise (M, K/32), column-wise (M/32, K); NVFP4 "
              "row-wise (M, K/16), column-wise (K, M/16). Per-tensor scale_inv (1,): all of it.",
    "scale_padding": "TE allocates padded scale buffers with at::empty and its kernels write the valid region "
                     "only, so TE's padding is uninitialised (seen on the H200 for the 128x128 column-wise "
                     "scales); tetrt writes zeros. padding_equal is recorded for information and never decides "
                     "an outcome.",
    "dequantize": "tensor.dequantize() of each side (default dtype: the input's): same shape and dtype, equal "
                  "bits where both are not NaN, NaN at the same places (NaN payloads may differ)",
    "outcome": "identical: every buffer and dequantize() equal; differs: any is not; te_refuses: TE's "
               "quantizer (construction, quantize or dequantize) raised, message recorded; tetrt_refuses: "
               "tetrt's raised and TE's did not; error: anything else (input, comparison)",
}


# =============================================================================== cases
@dataclass(frozen=True)
class Config:
    """One quantizer configuration, named as in the results file."""

    format: str  # fp8_delayed | fp8_current | fp8_block_1x128 | fp8_block_128x128
    options: tuple[tuple[str, Any], ...]

    @property
    def opts(self) -> dict[str, Any]:
        return dict(self.options)


def _config(fmt: str, **options: Any) -> Config:
    return Config(fmt, tuple(sorted(options.items())))


CONFIGS: tuple[Config, ...] = (
    _config("fp8_delayed", fp8_dtype="e4m3", scale=DELAYED_SCALE),
    _config("fp8_delayed", fp8_dtype="e5m2", scale=DELAYED_SCALE),
    *(_config("fp8_current", fp8_dtype=d, force_pow_2_scales=p, amax_epsilon=e)
      for d in FP8 for p in (False, True) for e in (0.0, AMAX_EPSILON)),
    *(_config(fmt, fp8_dtype="e4m3", force_pow_2_scales=p, amax_epsilon=0.0)
      for fmt in BLOCK_FORMATS for p in (True, False)),
    _config("fp8_block_1x128", fp8_dtype="e4m3", force_pow_2_scales=True, amax_epsilon=AMAX_EPSILON),
)


@dataclass(frozen=True)
class QuantCase:
    config: Config
    dtype: str
    shape: tuple[int, ...]
    usage: str
    family: str
    seed: int = 0

    def header(self) -> dict[str, Any]:
        return {"format": self.config.format, "dtype": self.dtype, "shape": list(self.shape), "usage": self.usage,
                "options": self.config.opts, "family": self.family}


def build_cases(configs: Sequence[Config] = CONFIGS) -> list[QuantCase]:
    """The full case list, no duplicates, in a fixed order:

    - every config x dtype x shape, normal input, both usages;
    - every config x shape in bf16, normal input, row-wise only and column-wise only;
    - every config x special family x dtype on a 2-D multiple of 128, a 2-D non-multiple
      and a 4-D shape, both usages."""
    cases: list[QuantCase] = []
    for config in configs:
        cases += [QuantCase(config, d, s, "both", "normal") for d in DTYPES for s in SHAPES]
        cases += [QuantCase(config, "bf16", s, u, "normal") for u in ("rowwise", "columnwise") for s in SHAPES]
        cases += [QuantCase(config, d, s, "both", f) for f in SPECIAL_FAMILIES for d in DTYPES for s in SPECIAL_SHAPES]
    seen: set[QuantCase] = set()
    return [c for c in cases if not (c in seen or seen.add(c))]


def find_config(fmt: str, **options: Any) -> Config:
    """The first config of ``fmt`` whose options include ``options``."""
    for config in CONFIGS:
        if config.format == fmt and all(config.opts.get(k) == v for k, v in options.items()):
            return config
    raise KeyError(f"no config {fmt} {options}")


def smoke_cases() -> list[QuantCase]:
    """A small subset (the tests' and ``--quick``'s): every config on a 2-D non-multiple of 128
    and a 3-D multiple in bf16, plus fp32 / fp16, special values and single usages on one shape."""
    cases = []
    for config in CONFIGS:
        cases += [QuantCase(config, "bf16", (200, 136), "both", "normal"),
                  QuantCase(config, "bf16", (2, 128, 512), "both", "normal")]
    pick = (find_config("fp8_delayed", fp8_dtype="e4m3"),
            find_config("fp8_current", fp8_dtype="e4m3", force_pow_2_scales=False, amax_epsilon=0.0),
            find_config("fp8_current", fp8_dtype="e5m2", force_pow_2_scales=True, amax_epsilon=AMAX_EPSILON),
            find_config("fp8_block_1x128", force_pow_2_scales=True, amax_epsilon=0.0),
            find_config("fp8_block_128x128", force_pow_2_scales=False))
    for config in pick:
        cases += [QuantCase(config, "fp32", (1, 2, 128, 48), "both", "zero_and_denormal_blocks"),
                  QuantCase(config, "fp16", (200, 136), "both", "nan"),
                  QuantCase(config, "bf16", (384, 768), "columnwise", "inf"),
                  QuantCase(config, "bf16", (2, 3, 272), "rowwise", "tiny")]
    return cases


# ============================================================================= inputs
def _te_cases_family() -> Callable[..., torch.Tensor] | None:
    try:
        from tests.quant.te_cases import family
    except Exception:  # noqa: BLE001 - e.g. ml_dtypes missing: the fallback below
        return None
    return family


def make_input(family: str, shape: Sequence[int], dtype: str | torch.dtype, seed: int = 0,
               device: str | torch.device = "cuda") -> torch.Tensor:
    """A deterministic input (built on the CPU, then moved). ``normal``, ``tiny``, ``inf`` and
    ``nan`` are ``tests.quant.te_cases.family``'s families of those names (``tiny`` = x * 1e-30:
    zero in fp16); ``zero_and_denormal_blocks`` (any rank, on the (M, K) view): an all-zero
    first 128 x 128 block (rows x the first 128 columns, clipped to the shape) and a block of
    values subnormal in the input dtype (rows 128:256 x columns 128:256 where both exist, else
    the bottom half of the rows, all columns)."""
    dt = DTYPES[dtype] if isinstance(dtype, str) else dtype
    shape = tuple(int(s) for s in shape)
    if family == "zero_and_denormal_blocks":
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(shape, generator=g)
        m, k = math.prod(shape[:-1]), shape[-1]
        x2 = x.view(m, k)
        x2[:128, :128] = 0.0
        denormal = torch.randn(m, k, generator=g) * (torch.finfo(dt).tiny / 4)
        if m > 128 and k > 128:
            x2[128:256, 128:256] = denormal[128:256, 128:256]
        else:
            x2[m // 2:] = denormal[m // 2:]
        return x.to(dt).to(device)
    te_family = _te_cases_family()
    if te_family is not None and family in ("normal", "tiny", "inf", "nan"):
        return te_family(family, shape, dt, seed).to(device)
    g = torch.Generator().manual_seed(seed)  # the same families, where tests/ cannot be imported
    x = torch.randn(shape, generator=g)
    flat = x.reshape(-1)
    if family == "tiny":
        x = x * 1e-30
    elif family == "inf":
        flat[:: max(1, flat.numel() // 7)] = math.inf
        flat[1:: max(1, flat.numel() // 5)] = -math.inf
    elif family == "nan":
        flat[:: max(1, flat.numel() // 9)] = math.nan
    elif family != "normal":
        raise ValueError(f"unknown input family {family!r}")
    return x.to(dt).to(device)


# ========================================================================= quantizers
def make_tetrt_quantizer(config: Config, usage: str, device: str | torch.device = "cuda") -> Any:
    from tetrt_support.quant import Float8BlockQuantizer, Float8CurrentScalingQuantizer, Float8Quantizer

    o, (row, col) = config.opts, USAGES[usage]
    fp8 = FP8[o["fp8_dtype"]]
    if config.format == "fp8_delayed":
        return Float8Quantizer(fp8, rowwise_usage=row, columnwise_usage=col,
                               scale=torch.tensor([o["scale"]], dtype=torch.float32), device=device)
    if config.format == "fp8_current":
        return Float8CurrentScalingQuantizer(fp8, rowwise_usage=row, columnwise_usage=col,
                                             force_pow_2_scales=o["force_pow_2_scales"], amax_epsilon=o["amax_epsilon"])
    if config.format in BLOCK_FORMATS:
        return Float8BlockQuantizer(fp8, rowwise_usage=row, columnwise_usage=col,
                                    block_scaling_dim=BLOCK_FORMATS[config.format],
                                    force_pow_2_scales=o["force_pow_2_scales"], amax_epsilon=o["amax_epsilon"])
    raise ValueError(f"unknown format {config.format!r}")


def _tex_fp8(name: str) -> Any:
    import transformer_engine_torch as tex

    return {"e4m3": tex.DType.kFloat8E4M3, "e5m2": tex.DType.kFloat8E5M2}[name]


def make_te_quantizer(config: Config, usage: str, device: str | torch.device = "cuda") -> Any:
    """TE 2.20's quantizer for ``config`` (``transformer_engine.pytorch.tensor.*``)."""
    o, (row, col) = config.opts, USAGES[usage]
    fp8 = _tex_fp8(o["fp8_dtype"])
    if config.format == "fp8_delayed":
        from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer

        q = Float8Quantizer(torch.full((1,), float(o["scale"]), dtype=torch.float32, device=device),
                            torch.zeros(1, dtype=torch.float32, device=device), fp8, rowwise=row, columnwise=col)
    elif config.format == "fp8_current":
        from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer

        q = Float8CurrentScalingQuantizer(fp8, torch.device(device), rowwise=row, columnwise=col,
                                          force_pow_2_scales=o["force_pow_2_scales"], amax_epsilon=o["amax_epsilon"])
    elif config.format in BLOCK_FORMATS:
        from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer

        q = Float8BlockQuantizer(fp8, rowwise=row, columnwise=col, amax_epsilon=o["amax_epsilon"],
                                 force_pow_2_scales=o["force_pow_2_scales"], block_scaling_dim=BLOCK_FORMATS[config.format])
    else:
        raise ValueError(f"unknown format {config.format!r}")
    q.set_usage(rowwise=row, columnwise=col)
    return q


# ======================================================================== comparison
def _err(e: BaseException, limit: int = 400) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit]}"


def _num(value: float) -> float | str:
    """A float for the JSON file: non-finite ones as strings ("inf", "nan"), so the file stays strict JSON."""
    value = float(value)
    return value if math.isfinite(value) else str(value)


def rows_cols(shape: Sequence[int]) -> tuple[int, int]:
    if len(shape) == 0:
        return 1, 1
    return math.prod(int(s) for s in shape[:-1]), int(shape[-1])


def buffer_names(fmt: str) -> tuple[str, ...]:
    if fmt in PER_TENSOR_FORMATS:
        return PER_TENSOR_BUFFERS
    if fmt == "nvfp4":
        return NVFP4_BUFFERS
    return ROW_COLUMN_BUFFERS


def scale_valid_shape(fmt: str, name: str, shape: Sequence[int]) -> tuple[int, int] | None:
    """The valid (top-left) region of the scale buffer ``name`` of format ``fmt`` for an input
    of logical ``shape``; None where the whole buffer is valid (per-tensor scales, amaxes)."""
    if not name.endswith("_scale_inv") or fmt in PER_TENSOR_FORMATS:
        return None
    m, k = rows_cols(shape)
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    row = name.startswith("_rowwise")
    if fmt == "fp8_block_1x128":
        return (cdiv(k, 128), m) if row else (cdiv(m, 128), k)
    if fmt == "fp8_block_128x128":
        return (cdiv(m, 128), cdiv(k, 128)) if row else (cdiv(k, 128), cdiv(m, 128))
    if fmt == "mxfp8":
        return (m, k // 32) if row else (m // 32, k)
    if fmt == "nvfp4":
        return (m, k // 16) if row else (k, m // 16)
    raise ValueError(f"unknown format {fmt!r}")


def _u8(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    return (t if t.dtype == torch.uint8 else t.view(torch.uint8)).cpu()


def _first_differences(a: torch.Tensor, b: torch.Tensor, limit: int = 4) -> list[list[Any]]:
    where = torch.nonzero(a.reshape(-1) != b.reshape(-1)).reshape(-1)[:limit].tolist()
    return [[i, hex(int(a.reshape(-1)[i])), hex(int(b.reshape(-1)[i]))] for i in where]


def compare_buffer(te: torch.Tensor | None, tetrt: torch.Tensor | None, *, valid: tuple[int, int] | None = None,
                   fp8_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """One inner buffer of each side: ``{"equal": bool, ...}``.

    Bytes exactly; ``valid`` (rows, cols): compare only that top-left region of 2-D buffers
    (the padding's equality is reported as ``padding_equal``, information only); shapes
    must be equal; ``fp8_dtype``: flag differences that are NaN encodings on both sides."""
    if te is None or tetrt is None:
        return {"equal": te is None and tetrt is None, "present": {"te": te is not None, "tetrt": tetrt is not None}}
    entry: dict[str, Any] = {"te_shape": list(te.shape), "tetrt_shape": list(tetrt.shape)}
    if te.element_size() != tetrt.element_size():
        entry.update(equal=False, problem=f"element sizes differ: TE {te.dtype}, tetrt {tetrt.dtype}")
        return entry
    if tuple(te.shape) != tuple(tetrt.shape):
        entry.update(equal=False, shape_difference="unexpected")
        return entry
    if valid is not None and te.dim() == 2:
        r, c = valid
        if r > te.shape[0] or c > te.shape[1]:
            entry.update(equal=False, problem=f"valid region {valid} exceeds the buffer")
            return entry
        entry["compared"] = f"valid region [:{r}, :{c}] of {list(te.shape)}"
        full_a, full_b = _u8(te), _u8(tetrt)
        a, b = _u8(te[:r, :c]), _u8(tetrt[:r, :c])
        entry["padding_equal"] = bool(torch.equal(full_a, full_b)) if (r, c) != tuple(te.shape) else None
    else:
        a, b = _u8(te), _u8(tetrt)
    equal = bool(torch.equal(a, b))
    entry["equal"] = equal
    if not equal:
        diff = a.reshape(-1) != b.reshape(-1)
        entry["mismatched_bytes"] = int(diff.sum())
        entry["bytes"] = int(a.numel())
        entry["first_differences"] = _first_differences(a, b)
        if fp8_dtype is not None and a.dtype == torch.uint8:
            nan_a = torch.isnan(a.reshape(-1).view(fp8_dtype).float())
            nan_b = torch.isnan(b.reshape(-1).view(fp8_dtype).float())
            entry["nan_encoding_only"] = bool((nan_a & nan_b)[diff].all())
    return entry


def compare_values(te: torch.Tensor, tetrt: torch.Tensor) -> dict[str, Any]:
    """Two dequantized tensors: shape, dtype, equal bits where not NaN, NaN at the same places."""
    entry: dict[str, Any] = {"te_shape": list(te.shape), "tetrt_shape": list(tetrt.shape),
                             "te_dtype": str(te.dtype), "tetrt_dtype": str(tetrt.dtype)}
    if tuple(te.shape) != tuple(tetrt.shape) or te.dtype != tetrt.dtype:
        entry["equal"] = False
        return entry
    a, b = te.detach().contiguous().cpu(), tetrt.detach().contiguous().cpu()
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    same = (a.view(ints) == b.view(ints)) | (nan_a & nan_b)
    entry["equal"] = bool(same.all())
    if not entry["equal"]:
        entry["differing_elements"] = int((~same).sum())
        finite = ~(nan_a | nan_b)
        if finite.any():
            entry["max_abs_diff"] = _num((a.double() - b.double())[finite].abs().max())
    return entry


def compare_quantized(te_t: Any, tetrt_t: Any, fmt: str, shape: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Every inner buffer of ``fmt``'s tensors, by name (see :data:`COMPARISON_RULES`)."""
    fp8 = getattr(tetrt_t, "_quantizer", None)
    fp8_dtype = getattr(fp8, "fp8_dtype", None) if fmt != "nvfp4" else None
    out = {}
    for name in buffer_names(fmt):
        te_buf, tetrt_buf = getattr(te_t, name, None), getattr(tetrt_t, name, None)
        data = name in ("_data", "_transpose") or name.endswith("_data")
        out[name] = compare_buffer(te_buf, tetrt_buf, valid=scale_valid_shape(fmt, name, shape),
                                   fp8_dtype=fp8_dtype if data else None)
    if fmt in PER_TENSOR_FORMATS and getattr(te_t, "_transpose_invalid", False):
        out["_transpose"]["te_transpose_invalid"] = True
    return out


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_quant_case(case: QuantCase, device: str = "cuda") -> dict[str, Any]:
    """One case: the same input through tetrt's and TE's quantizer, every buffer and
    ``dequantize()`` compared; never raises."""
    row = case.header()
    try:
        x = make_input(case.family, case.shape, case.dtype, case.seed, device)
    except Exception as e:  # noqa: BLE001
        return {**row, "outcome": "error", "details": {"input": _err(e)}}
    tetrt_t = tetrt_q = te_t = te_q = None
    tetrt_error = te_error = None
    with torch.no_grad():
        try:
            tetrt_q = make_tetrt_quantizer(case.config, case.usage, device)
            tetrt_t = tetrt_q.quantize(x)
            _sync()
        except Exception as e:  # noqa: BLE001
            tetrt_error = _err(e)
        try:
            te_q = make_te_quantizer(case.config, case.usage, device)
            te_t = te_q(x)
            _sync()
        except Exception as e:  # noqa: BLE001
            te_error = _err(e)
    if te_error is not None:
        return {**row, "outcome": "te_refuses", "details": {"te": f"TE refuses: {te_error}", "tetrt": tetrt_error or "ok"}}
    if tetrt_error is not None:
        return {**row, "outcome": "tetrt_refuses", "details": {"tetrt": tetrt_error, "te": "ok"}}
    details: dict[str, Any] = {}
    try:
        details["buffers"] = compare_quantized(te_t, tetrt_t, case.config.format, case.shape)
        with torch.no_grad():
            tetrt_v = tetrt_t.dequantize()
            try:
                te_v = te_t.dequantize()
                _sync()
            except Exception as e:  # noqa: BLE001
                details["dequantize"] = {"te": f"TE refuses: {_err(e)}"}
                return {**row, "outcome": "te_refuses", "details": details}
        details["dequantize"] = compare_values(te_v, tetrt_v)
        te_amax = getattr(te_q, "amax", None)
        if case.config.format == "fp8_delayed" and isinstance(te_amax, torch.Tensor):
            # the amax each side records in its quantizer state (information only, no outcome)
            te_amax, tetrt_amax = float(te_amax.reshape(-1)[0]), float(tetrt_q.amax_history[0])
            same = te_amax == tetrt_amax or (math.isnan(te_amax) and math.isnan(tetrt_amax))
            details["recorded_amax"] = {"te": _num(te_amax), "tetrt": _num(tetrt_amax), "equal": same}
    except Exception as e:  # noqa: BLE001
        details["comparison"] = _err(e)
        return {**row, "outcome": "error", "details": details}
    equal = all(b["equal"] for b in details["buffers"].values()) and details["dequantize"]["equal"]
    return {**row, "outcome": "identical" if equal else "differs", "details": details}


def summarize(cases: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Counts: total, by outcome, by format (x outcome), and the flagged peculiarities."""
    cases = list(cases)
    by_format: dict[str, Counter] = {}
    nan_only = padding_differs = 0
    for c in cases:
        by_format.setdefault(c["format"], Counter())[c["outcome"]] += 1
        details = c.get("details", {}) or {}
        buffers = details.get("buffers", {}) or {}
        nan_only += any(b.get("nan_encoding_only") for b in buffers.values())
        padding_differs += any(b.get("padding_equal") is False for b in buffers.values())
    outcomes = Counter(c["outcome"] for c in cases)
    return {
        "total": len(cases),
        "by_outcome": {o: outcomes.get(o, 0) for o in OUTCOMES},
        "by_format": {f: {o: n for o, n in sorted(cnt.items())} for f, cnt in by_format.items()},
        "differing_only_in_fp8_nan_encodings": nan_only,
        "scale_padding_differs_valid_region_compared": padding_differs,
        "not_identical": [_case_label(c) for c in cases if c["outcome"] != "identical"][:50],
    }


def _case_label(c: dict[str, Any]) -> str:
    opts = ",".join(f"{k}={v}" for k, v in sorted(c.get("options", {}).items()))
    shape = "x".join(map(str, c["shape"]))
    return f"{c['format']}[{opts}] {c['dtype']} {shape} {c['usage']} {c.get('family', '')}: {c['outcome']}"


def cuda_usable(device: str | torch.device = "cuda") -> bool:
    """Whether a trivial kernel still runs (False after a sticky CUDA error); True off CUDA."""
    if torch.device(device).type != "cuda":
        return True
    try:
        return float(torch.ones(1, device=device).add_(1).item()) == 2.0
    except Exception:  # noqa: BLE001
        return False


def run_quant_cases(cases: Sequence[QuantCase], *, budget_s: float = 420.0, progress_every: int = 50,
                    device: str = "cuda") -> tuple[list[dict[str, Any]], int]:
    """Every case; returns the rows and how many were not run (past ``budget_s``, or after a
    sticky CUDA error)."""
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for i, case in enumerate(cases):
        if time.perf_counter() - start > budget_s:
            print(f"te_conformance: time budget of {budget_s:.0f} s spent, {len(cases) - i} cases not run", flush=True)
            return rows, len(cases) - i
        rows.append(run_quant_case(case, device))
        if rows[-1]["outcome"] in ("te_refuses", "error") and not cuda_usable(device):
            # a sticky CUDA error (an illegal access in a kernel) fails every later call: stop here
            rows[-1]["details"]["cuda_context_broken_after_this_case"] = True
            print(f"te_conformance: the CUDA context is broken after {_case_label(rows[-1])}; "
                  f"{len(cases) - i - 1} cases not run", flush=True)
            return rows, len(cases) - i - 1
        if (i + 1) % progress_every == 0 or i + 1 == len(cases):
            counts = Counter(r["outcome"] for r in rows)
            print(f"te_conformance: {i + 1}/{len(cases)} quantizer cases, {time.perf_counter() - start:.1f} s, "
                  f"{dict(counts)}", flush=True)
    return rows, 0


# ============================================================================= Linear
LINEAR_SHAPES: tuple[tuple[int, int, int], ...] = (
    (1024, 2048, 4096), (4096, 4096, 4096),
    (1000, 2048, 4096),  # M not a multiple of 128; TE's assert_dim_for_fp8_exec needs M % 8 == 0, K % 16 == 0
    (1004, 2048, 4096),  # M % 8 != 0: TE's refusal, recorded
)
LINEAR_RECIPES = ("fp8_current", "fp8_block")
LINEAR_NOTES = {
    "fp8_delayed": "skipped: tetrt has no Linear recipe for FP8 delayed scaling (its Float8Quantizer is driven "
                   "through update_scale; tetrt_support.quant.recipes has no such recipe)",
    "shape_rule": "TE (module/linear.py -> utils.assert_dim_for_fp8_exec): prod(leading dims) % 8 == 0 and the last "
                  "dim % 16 == 0 for FP8 execution",
    "tetrt_paths": "tetrt's recipes carry TE's per-GEMM MMParams (Recipe.fast_accum); its Linear runs in eager "
                   "through the custom ops by default, and for FP8 current scaling also has an inline step "
                   "(compile_as='inline'). Each variant records its recipe, recipe.fast_accum, the layer's "
                   "fast_accum and the Linear keywords it was built with",
    "metrics": "per tensor: equal (bitwise), fraction_differing (elements), max_abs_diff_rel = max|tetrt - TE| / "
               "max|TE| (TE's value as the reference)",
}


def te_recipe(name: str) -> Any:
    from transformer_engine.common import recipe as R

    return {"fp8_current": R.Float8CurrentScaling, "fp8_block": R.Float8BlockScaling}[name]()


def te_split_flags(recipe: Any) -> tuple[bool, bool, bool] | None:
    """``use_split_accumulator`` of a TE recipe's (fprop, dgrad, wgrad) GEMMs, or None."""
    try:
        return tuple(bool(getattr(recipe, f"fp8_gemm_{g}").use_split_accumulator)  # type: ignore[return-value]
                     for g in ("fprop", "dgrad", "wgrad"))
    except AttributeError:
        return None


def _gemm_parameters(name: str) -> dict[str, inspect.Parameter]:
    """The ``fp8_gemm_*`` keywords tetrt's recipe ``name`` accepts (get_recipe's own, else its factory's)."""
    from tetrt_support.quant import recipes

    params = dict(inspect.signature(recipes.get_recipe).parameters)
    if "fp8_gemm_fprop" not in params:
        factory = getattr(recipes, "_RECIPES", {}).get(name)
        params = dict(inspect.signature(factory).parameters) if factory is not None else {}
    return {k: v for k, v in params.items() if k.startswith("fp8_gemm_")}


def _mm_params(param: inspect.Parameter, split: bool) -> Any:
    from tetrt_support.quant import recipes

    cls = getattr(recipes, "MMParams", None)
    if cls is not None:
        return cls(use_split_accumulator=split)
    default = param.default
    if dataclasses.is_dataclass(default) and hasattr(default, "use_split_accumulator"):
        return dataclasses.replace(default, use_split_accumulator=split)
    raise TypeError(f"{param.name}: cannot tell what value stands for use_split_accumulator={split} "
                    f"(default {default!r})")


def _inline_kwargs(name: str) -> dict[str, Any] | None:
    """``{"compile_as": "inline"}`` where tetrt's Linear has that eager path for recipe ``name``
    (the path that applies a recipe's per-GEMM accumulation: FP8 current scaling only), else None."""
    if name != "fp8_current":
        return None
    from tetrt_support.quant import Linear

    return {"compile_as": "inline"} if "compile_as" in inspect.signature(Linear.__init__).parameters else None


def tetrt_recipe_variants(name: str, te_split: tuple[bool, bool, bool] | None) -> list[dict[str, Any]]:
    """tetrt Linears to run against TE's: ``{"variant", "recipe", "linear_kwargs"}`` or
    ``{"variant", "not_available"}``.

    - the default recipe and Linear (in eager: the custom ops);
    - TE's per-GEMM accumulation settings, where tetrt's recipe takes a keyword
      ``fp8_gemm_fprop`` (checked with inspect); for fp8_current run through the Linear's
      inline step (``compile_as="inline"``) where it has one, the path that applies them;
    - fp8_current only, for information: split accumulation in every GEMM, same path
      (what the fast forward GEMM changes)."""
    from tetrt_support.quant.recipes import get_recipe

    out: list[dict[str, Any]] = []
    try:
        out.append({"variant": "tetrt default recipe", "recipe": get_recipe(name), "linear_kwargs": {}})
    except Exception as e:  # noqa: BLE001
        out.append({"variant": "tetrt default recipe", "not_available": _err(e)})
    try:
        params = _gemm_parameters(name)
        inline = _inline_kwargs(name)
    except Exception as e:  # noqa: BLE001
        params, inline, why = {}, None, _err(e)
    else:
        why = f"not available: tetrt's get_recipe({name!r}) takes no keyword fp8_gemm_fprop"
    te_label = "tetrt with TE's GEMM accumulation settings"
    wanted: list[tuple[str, tuple[bool, bool, bool] | None, dict[str, Any]]] = [(te_label, te_split, {})]
    if inline is not None:
        wanted.append((te_label + ", inline step", te_split, inline))
    if name == "fp8_current":
        wanted.append(("tetrt with split accumulation in every GEMM", (True, True, True), {}))
    for label, split, linear_kwargs in wanted:
        if "fp8_gemm_fprop" not in params:
            out.append({"variant": label, "not_available": why})
            continue
        if split is None:
            out.append({"variant": label, "not_available": "TE's recipe has no fp8_gemm_* settings"})
            continue
        try:
            kwargs = {f"fp8_gemm_{g}": _mm_params(params[f"fp8_gemm_{g}"], s)
                      for g, s in zip(("fprop", "dgrad", "wgrad"), split) if f"fp8_gemm_{g}" in params}
            out.append({"variant": label, "recipe": get_recipe(name, **kwargs), "use_split_accumulator": list(split),
                        "linear_kwargs": dict(linear_kwargs)})
        except Exception as e:  # noqa: BLE001
            out.append({"variant": label, "not_available": _err(e)})
    return out


def compare_outputs(te: torch.Tensor, tetrt: torch.Tensor) -> dict[str, Any]:
    """Bitwise equality of one output; where not equal, how far apart."""
    if tuple(te.shape) != tuple(tetrt.shape) or te.dtype != tetrt.dtype:
        return {"equal": False, "problem": f"TE {tuple(te.shape)} {te.dtype}, tetrt {tuple(tetrt.shape)} {tetrt.dtype}"}
    equal = bool(torch.equal(_u8(te), _u8(tetrt)))
    entry: dict[str, Any] = {"equal": equal}
    if not equal:
        a, b = te.detach().float(), tetrt.detach().float()
        entry["fraction_differing"] = float((a != b).float().mean())
        ref = float(a.abs().max())
        entry["max_abs_diff_rel"] = _num(float((a - b).abs().max()) / ref if ref else float("inf"))
        entry["nan"] = {"te": int(torch.isnan(a).sum()), "tetrt": int(torch.isnan(b).sum())}
    return entry


def _te_autocast(recipe: Any) -> Any:
    import transformer_engine.pytorch as te

    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)  # older TE


def _step(layer: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor,
          ctx: Callable[[], Any] | None = None) -> dict[str, torch.Tensor]:
    xi = x.detach().clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    if ctx is None:
        y = layer(xi)
    else:
        with ctx():
            y = layer(xi)
    y.backward(dy)
    _sync()
    out = {"y": y.detach(), "dgrad": xi.grad.detach(), "wgrad": layer.weight.grad.detach()}
    bias = getattr(layer, "bias", None)
    if isinstance(bias, torch.Tensor) and bias.numel() and bias.grad is not None:
        out["bgrad"] = bias.grad.detach()
    return out


def _set_params(layer: torch.nn.Module, w: torch.Tensor, b: torch.Tensor | None) -> None:
    with torch.no_grad():
        layer.weight.copy_(w)
        if b is not None:
            layer.bias.copy_(b)


def run_linear_case(m: int, k: int, n: int, bias: bool, recipe_name: str, seed: int = 0,
                    device: str = "cuda") -> dict[str, Any]:
    """tetrt's Linear (each recipe variant) against ``te.Linear``; never raises."""
    row: dict[str, Any] = {"recipe": recipe_name, "shape": {"M": m, "K": k, "N": n}, "bias": bias}
    try:
        g = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=g)
        w = (torch.randn(n, k, device=device, generator=g) / k**0.5).to(torch.bfloat16)
        b = (torch.randn(n, device=device, generator=g) * 0.1).to(torch.bfloat16) if bias else None
        dy = torch.randn(m, n, device=device, dtype=torch.bfloat16, generator=g)
    except Exception as e:  # noqa: BLE001
        return {**row, "outcome": "error", "details": _err(e)}
    te_out = None
    row["te_use_split_accumulator"] = None
    try:
        import transformer_engine.pytorch as te

        recipe = te_recipe(recipe_name)
        row["te_recipe"] = repr(recipe)
        split = te_split_flags(recipe)
        row["te_use_split_accumulator"] = list(split) if split else None
        layer = te.Linear(k, n, bias=bias, params_dtype=torch.bfloat16, device=device)
        _set_params(layer, w, b)
        te_out = _step(layer, x, dy, lambda: _te_autocast(recipe))
        again = _step(layer, x, dy, lambda: _te_autocast(recipe))
        row["te_repeatable"] = all(torch.equal(_u8(te_out[key]), _u8(again[key])) for key in te_out)
        del layer, again
    except Exception as e:  # noqa: BLE001
        row["te"] = f"TE refuses: {_err(e)}"
    variants = []
    te_split = row["te_use_split_accumulator"]
    for variant in tetrt_recipe_variants(recipe_name, tuple(te_split) if te_split else None):
        entry: dict[str, Any] = {"variant": variant["variant"]}
        if "recipe" not in variant:
            entry.update(outcome="not_available", details=variant["not_available"])
            variants.append(entry)
            continue
        recipe = variant["recipe"]
        entry["tetrt_recipe"] = str(recipe)
        entry["tetrt_linear_kwargs"] = variant["linear_kwargs"]
        if hasattr(recipe, "fast_accum"):
            entry["tetrt_use_fast_accum"] = list(recipe.fast_accum)
        try:
            from tetrt_support.quant import Linear

            layer = Linear(k, n, bias=bias, recipe=recipe, device=device, dtype=torch.bfloat16, **variant["linear_kwargs"])
            if hasattr(layer, "fast_accum"):
                entry["tetrt_layer_fast_accum"] = list(layer.fast_accum)
            _set_params(layer, w, b)
            tetrt_out = _step(layer, x, dy)
            del layer
        except Exception as e:  # noqa: BLE001
            entry.update(outcome="tetrt_refuses", details=_err(e))
            variants.append(entry)
            continue
        if te_out is None:
            entry.update(outcome="te_refuses", details=row.get("te"))
            variants.append(entry)
            continue
        try:
            comparison = {key: compare_outputs(te_out[key], tetrt_out[key]) for key in te_out}
            missing = sorted(set(tetrt_out) ^ set(te_out))
            if missing:
                comparison["missing"] = {"equal": False, "problem": f"outputs on one side only: {missing}"}
            entry.update(outcome="identical" if all(c["equal"] for c in comparison.values()) else "differs",
                         details=comparison)
        except Exception as e:  # noqa: BLE001
            entry.update(outcome="error", details=_err(e))
        variants.append(entry)
    row["variants"] = variants
    return row


def run_linear_cases(shapes: Sequence[tuple[int, int, int]] = LINEAR_SHAPES,
                     recipes: Sequence[str] = LINEAR_RECIPES) -> list[dict[str, Any]]:
    rows = []
    for recipe_name in recipes:
        for m, k, n in shapes:
            for bias in (False, True):
                start = time.perf_counter()
                row = run_linear_case(m, k, n, bias, recipe_name)
                rows.append(row)
                outcomes = [f"{v['variant']}: {v['outcome']}" for v in row.get("variants", [])]
                print(f"te_conformance: Linear {recipe_name} {m}x{k}->{n} bias={bias} "
                      f"({time.perf_counter() - start:.1f} s): {'; '.join(outcomes) or row.get('outcome')}", flush=True)
                torch.cuda.empty_cache()
    return rows


# ==================================================================== MXFP8 and NVFP4
PROBE_MARKER = "TE_CONFORMANCE_PROBE_JSON "
PROBE_SHAPE = (256, 512)  # no scale padding for MXFP8 or NVFP4


def _availability() -> dict[str, Any]:
    import transformer_engine.pytorch as te

    out = {}
    for name in ("is_fp8_available", "is_fp8_block_scaling_available", "is_mxfp8_available", "is_nvfp4_available"):
        fn = getattr(te, name, None)
        try:
            result = fn(return_reason=True) if fn is not None else "no such function"
            out[name] = list(result) if isinstance(result, tuple) else result
        except Exception as e:  # noqa: BLE001
            out[name] = _err(e)
    return out


def probe_hopper_formats(device: str = "cuda") -> dict[str, Any]:
    """TE's MXFP8 and NVFP4 quantizers on one bf16 input each: what quantize and dequantize do,
    and whether the bytes match tetrt's (run in a child process by :func:`run_probe_subprocess`)."""
    from tetrt_support.quant import MXFP8Quantizer as TetrtMX
    from tetrt_support.quant import NVFP4Quantizer as TetrtNV

    out: dict[str, Any] = {"input": {"shape": list(PROBE_SHAPE), "dtype": "bf16", "family": "normal"}}
    try:
        out["availability"] = _availability()
    except Exception as e:  # noqa: BLE001
        out["availability"] = _err(e)
    x = make_input("normal", PROBE_SHAPE, "bf16", 0, device)

    def te_mxfp8() -> Any:
        from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

        return MXFP8Quantizer(_tex_fp8("e4m3"), rowwise=True, columnwise=True)

    def te_nvfp4() -> Any:
        from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

        return NVFP4Quantizer(rowwise=True, columnwise=True)  # no RHT, no 2-D, no stochastic rounding

    for fmt, make_te, make_tetrt, label in (
        ("mxfp8", te_mxfp8, lambda: TetrtMX(), "MXFP8Quantizer(kFloat8E4M3), both usages"),
        ("nvfp4", te_nvfp4, lambda: TetrtNV(), "NVFP4Quantizer() defaults (no RHT / 2-D / SR), both usages"),
    ):
        entry: dict[str, Any] = {"quantizer": label}
        tetrt_t = None
        try:
            with torch.no_grad():
                tetrt_t = make_tetrt().quantize(x)
            _sync()
        except Exception as e:  # noqa: BLE001
            entry["tetrt"] = _err(e)
        try:
            with torch.no_grad():
                te_t = make_te()(x)
            _sync()
            entry["te_quantize"] = "returned without an error"
        except Exception as e:  # noqa: BLE001
            entry["te_quantize"] = f"raised {_err(e, 1000)}"
            out[fmt] = entry
            continue
        if tetrt_t is not None:
            try:
                buffers = compare_quantized(te_t, tetrt_t, fmt, PROBE_SHAPE)
                entry["buffers"] = buffers
                entry["bytes_match_tetrt"] = all(b["equal"] for b in buffers.values())
            except Exception as e:  # noqa: BLE001
                entry["buffers"] = _err(e)
        try:
            with torch.no_grad():
                te_v = te_t.dequantize()
            _sync()
            entry["te_dequantize"] = "returned without an error"
            if tetrt_t is not None:
                entry["dequantize_vs_tetrt"] = compare_values(te_v, tetrt_t.dequantize())
        except Exception as e:  # noqa: BLE001
            entry["te_dequantize"] = f"raised {_err(e, 1000)}"
        out[fmt] = entry
    return out


def run_probe_subprocess(timeout_s: float = 240.0) -> dict[str, Any]:
    """:func:`probe_hopper_formats` in a child Python (``--probe-hopper-formats``)."""
    cmd = [sys.executable, "-m", "benchmarks.te_conformance", "--probe-hopper-formats"]
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())
    except subprocess.TimeoutExpired as e:
        return {"error": f"child process timed out after {timeout_s:.0f} s", "stderr_tail": str(e.stderr or "")[-2000:]}
    except Exception as e:  # noqa: BLE001
        return {"error": _err(e)}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(PROBE_MARKER):
            result = json.loads(line[len(PROBE_MARKER):])
            result["child_returncode"] = proc.returncode
            return result
    return {"error": f"child process exited {proc.returncode} without a result",
            "stdout_tail": proc.stdout[-2000:], "stderr_tail": proc.stderr[-4000:]}


# ================================================================================ run
def versions() -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda}
    try:
        import transformer_engine

        info["transformer_engine"] = getattr(transformer_engine, "__version__", "unknown")
    except Exception as e:  # noqa: BLE001
        info["transformer_engine"] = f"not importable: {_err(e)}"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["compute_capability"] = "sm_{}{}".format(*torch.cuda.get_device_capability(0))
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    info["TETRT_QUANT_KERNELS"] = os.environ.get("TETRT_QUANT_KERNELS", "(unset: CUDA kernels on)")
    return info


def run(quick: bool = False, write: Callable[[dict[str, Any]], None] | None = None,
        budget_s: float = 420.0, formats: Sequence[str] | None = None) -> dict[str, Any]:
    """The whole suite; ``write`` stores the section after each part. ``formats`` (perf's
    ``--recipes``) keeps the quantizer cases of those formats only (e.g. ``fp8_block_1x128``)."""
    known = sorted({c.format for c in CONFIGS})
    unknown = sorted(set(formats or ()) - set(known))
    if unknown:
        raise ValueError(f"te_conformance: unknown format(s) {', '.join(unknown)}; expected some of {', '.join(known)}")
    wall = time.perf_counter()
    info = versions()
    section: dict[str, Any] = {"machine": {"transformer_engine": info.get("transformer_engine"),
                                           "compute_capability": info.get("compute_capability")},
                               "versions": info, "comparison_rules": COMPARISON_RULES}

    def save() -> None:
        if write is not None:
            write(dict(section))

    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as e:  # noqa: BLE001
        section["error"] = f"transformer_engine.pytorch does not import: {_err(e)}"
        return section
    if not torch.cuda.is_available():
        section["error"] = "no CUDA device"
        return section

    cases = smoke_cases() if quick else build_cases()
    if formats:
        cases = [c for c in cases if c.config.format in formats]
        section["formats_run"] = sorted(formats)
    print(f"te_conformance: TE {info.get('transformer_engine')}, torch {info['torch']}, {info.get('gpu')}; "
          f"{len(cases)} quantizer cases", flush=True)
    start = time.perf_counter()
    # Default tile sizes, no autotuning: the tile does not change a byte (gpu_check compares
    # the bytes across tiles), and tuning each new shape and dtype of the block formats
    # stalled the first H200 run at case 650 of 990 past its time limit.
    autotune = os.environ.get("TETRT_KERNELS_AUTOTUNE")
    os.environ["TETRT_KERNELS_AUTOTUNE"] = "0"
    try:
        rows, not_run = run_quant_cases(cases, budget_s=budget_s)
    finally:
        if autotune is None:
            os.environ.pop("TETRT_KERNELS_AUTOTUNE", None)
        else:
            os.environ["TETRT_KERNELS_AUTOTUNE"] = autotune
    section["quantizers"] = {"summary": {**summarize(rows), "not_run": not_run},
                             "wall_s": round(time.perf_counter() - start, 1), "cases": rows}
    print(f"te_conformance: quantizers {json.dumps(section['quantizers']['summary']['by_outcome'])}", flush=True)
    save()

    start = time.perf_counter()
    shapes = LINEAR_SHAPES[:1] + LINEAR_SHAPES[2:3] if quick else LINEAR_SHAPES
    linear = run_linear_cases(shapes)
    counts = Counter(v["outcome"] for r in linear for v in r.get("variants", []))
    section["linear"] = {"notes": LINEAR_NOTES, "summary": dict(counts), "wall_s": round(time.perf_counter() - start, 1),
                         "cases": linear}
    save()

    start = time.perf_counter()
    section["hopper_mxfp8_nvfp4"] = run_probe_subprocess()
    section["hopper_mxfp8_nvfp4"]["wall_s"] = round(time.perf_counter() - start, 1)
    print("te_conformance: MXFP8/NVFP4 probe: " + json.dumps(
        {f: {k: v for k, v in (section["hopper_mxfp8_nvfp4"].get(f) or {}).items()
             if k in ("te_quantize", "bytes_match_tetrt", "te_dequantize")} for f in ("mxfp8", "nvfp4")})[:1500], flush=True)
    section["wall_s"] = round(time.perf_counter() - wall, 1)
    return section


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The headline of a results file (what benchmarks.perf prints)."""
    q = result.get("quantizers", {}).get("summary", {})
    return {"versions": {k: result.get("versions", {}).get(k) for k in ("transformer_engine", "torch", "gpu")},
            "quantizer_cases": q.get("total"), "quantizer_outcomes": q.get("by_outcome"),
            "linear_outcomes": result.get("linear", {}).get("summary"),
            "mxfp8": (result.get("hopper_mxfp8_nvfp4", {}).get("mxfp8") or {}).get("te_quantize"),
            "nvfp4": (result.get("hopper_mxfp8_nvfp4", {}).get("nvfp4") or {}).get("te_quantize"),
            "error": result.get("error")}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe-hopper-formats", action="store_true",
                        help="(internal) run the MXFP8/NVFP4 probe and print its JSON on one line")
    parser.add_argument("--count", action="store_true", help="print the number of quantizer cases and exit")
    args = parser.parse_args(argv)
    if args.count:
        print(len(build_cases()), "quantizer cases;", len(smoke_cases()), "in the smoke subset")
        return 0
    if args.probe_hopper_formats:
        try:
            result = probe_hopper_formats()
        except Exception as e:  # noqa: BLE001
            result = {"error": _err(e, 1000)}
        print(PROBE_MARKER + json.dumps(result), flush=True)
        return 0
    parser.error("run the suite through benchmarks.perf: python -m benchmarks.perf --device cuda --suites te_conformance")
    return 2


if __name__ == "__main__":
    sys.exit(main())
