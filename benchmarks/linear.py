"""Quantized Linear throughput: each recipe against bf16, and FP8 against raw ``torch._scaled_mm``
and the collection's per-tensor FP8 GEMM (``numerics.tensorwise_fp8_mm``: ``_scaled_mm`` on a
GPU, the same definition on the fp32 GEMM on the CPU).

Run by ``python -m benchmarks.perf --suites linear``. Every figure is a median over samples
of back-to-back calls (:func:`tetrt_support.report.timing.time_calls`); TFLOP/s count
``2*m*n*k`` per GEMM (forward: 1 GEMM, forward+backward: 3), quantization included where
the row says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.record import error_record
from benchmarks.steps import fp8_tensorwise
from tetrt_support.quant.numerics import tensorwise_fp8_mm
from tetrt_support.report.timing import time_calls


def _tflops(gemms: int, m: int, n: int, k: int, seconds: float) -> float:
    return gemms * 2 * m * n * k / seconds / 1e12


def bench_linear(device: str, m: int, n: int, k: int, iters: int, recipes: list[str]) -> dict[str, Any]:
    from tetrt_support.quant.linear import Linear

    dtype = torch.bfloat16
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=dtype, generator=g)
    w = torch.randn(n, k, device=device, dtype=dtype, generator=g) / k**0.5
    dy = torch.randn(m, n, device=device, dtype=dtype, generator=g)
    x_data, x_scale = fp8_tensorwise(x)
    w_data, w_scale = fp8_tensorwise(w)
    w_col = w_data.t()  # (k, n) column-major view: what cuBLASLt wants for mat2

    def bf16_fwd() -> Any:
        return torch.nn.functional.linear(x, w)

    xg = x.clone().requires_grad_(True)
    wg = torch.nn.Parameter(w.clone())

    def bf16_fwd_bwd() -> Any:
        y = torch.nn.functional.linear(xg, wg)
        y.backward(dy)

    def scaled_mm() -> Any:
        return torch._scaled_mm(x_data, w_col, scale_a=x_scale, scale_b=w_scale, out_dtype=dtype)

    def tensorwise_mm() -> Any:
        return tensorwise_fp8_mm(x_data, w_col, x_scale, w_scale, dtype)

    cases: dict[str, tuple[Callable[[], Any], int]] = {
        "bf16_forward": (bf16_fwd, 1),
        "bf16_forward_backward": (bf16_fwd_bwd, 3),
        "fp8_scaled_mm_raw": (scaled_mm, 1),
        "fp8_tensorwise_mm": (tensorwise_mm, 1),
    }
    for recipe in recipes:
        layer = Linear(k, n, bias=False, recipe=recipe, device=device, dtype=dtype)
        with torch.no_grad():
            layer.weight.copy_(w)
        xr = x.clone().requires_grad_(True)

        def fwd(layer: Linear = layer) -> Any:
            with torch.no_grad():
                return layer(x)

        def fwd_cached(layer: Linear = layer) -> Any:
            with torch.no_grad():
                return layer(x, is_first_microbatch=False)

        def fwd_bwd(layer: Linear = layer, xr: torch.Tensor = xr) -> Any:
            layer(xr).backward(dy)

        cases[f"{recipe}_forward"] = (fwd, 1)
        cases[f"{recipe}_forward_cached_weight"] = (fwd_cached, 1)
        cases[f"{recipe}_forward_backward"] = (fwd_bwd, 3)
        with torch.no_grad():
            layer(x, is_first_microbatch=True)  # fills the weight cache for the cached variant

    results: dict[str, Any] = {}
    protocol: dict[str, Any] = {}
    reference = bf16_fwd().float()
    for name, (fn, gemms) in tqdm(cases.items(), desc=f"linear {device}", unit="case"):
        try:
            timing = time_calls(fn, calls=iters, device=device)
            protocol = timing.protocol() | {"order": "one case after another", "warmup": 3}
            seconds = timing.median_s
            entry: dict[str, Any] = {"median_s": seconds, "TFLOPs": _tflops(gemms, m, n, k, seconds), "gemms": gemms}
            if name.endswith(("forward", "cached_weight")) or name in ("fp8_scaled_mm_raw", "fp8_tensorwise_mm"):
                with torch.no_grad():
                    out = fn().float()
                entry["relative_error_vs_bf16"] = float((out - reference).norm() / reference.norm())
            results[name] = entry
        except Exception as e:  # noqa: BLE001 - record and measure the rest
            results[name] = error_record(e)

    def ratio(a: str, b: str) -> float | None:
        if "TFLOPs" in results.get(a, {}) and "TFLOPs" in results.get(b, {}):
            return results[a]["TFLOPs"] / results[b]["TFLOPs"]
        return None

    ratios = {
        "fp8_current_forward_over_scaled_mm": ratio("fp8_current_forward", "fp8_scaled_mm_raw"),
        "fp8_current_forward_cached_weight_over_scaled_mm": ratio("fp8_current_forward_cached_weight", "fp8_scaled_mm_raw"),
        "fp8_scaled_mm_over_bf16": ratio("fp8_scaled_mm_raw", "bf16_forward"),
        "fp8_tensorwise_mm_over_scaled_mm": ratio("fp8_tensorwise_mm", "fp8_scaled_mm_raw"),
    }
    for recipe in recipes:
        ratios[f"{recipe}_forward_over_bf16"] = ratio(f"{recipe}_forward", "bf16_forward")
        ratios[f"{recipe}_forward_backward_over_bf16"] = ratio(f"{recipe}_forward_backward", "bf16_forward_backward")
    return {
        "m_n_k": [m, n, k],
        "dtype": "bfloat16",
        "iters": iters,
        "timing": protocol,
        "note": "MXFP8 / NVFP4 / FP8-block GEMMs are emulated (dequantize + matmul): the block-scaled "
                "cuBLASLt GEMMs TransformerEngine uses were not run here.",
        "cases": results,
        "ratios": {k_: v for k_, v in ratios.items() if v is not None},
    }
