"""Where the host's time goes in one quantized Linear training step (CUDA only).

At T=8192, K=N=4096 the fp8_current step's kernels take about 0.73 ms on an H200 while the
host issues a step in about 2.5 ms (the stored ``train_step_cuda.json``): in torch.compile's
default mode that step is bound by the host, not the GPU. This suite times, on the host
only, each layer of what a step issues -- an allocation, a Triton launch, a quantize, the
custom ops called directly, the compiled step -- so the cost of each layer is a difference
of two measured numbers instead of a guess from a profiler that inflates Python calls.

Protocol: each callable runs ``calls`` times back to back after a warm-up; the device is
synchronised every 16 calls (so its queue never fills and blocks a launch) and that wait is
left out; the median over 5 rounds of the per-call host time is reported, in microseconds.
A script's helper, not a test: nothing here asserts.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def host_us(fn: Callable[[], Any], calls: int = 64, rounds: int = 5) -> float:
    """Median over ``rounds`` of the host time per call of ``fn`` (device waits excluded)."""
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    per_round = []
    for _ in range(rounds):
        spent = 0.0
        for start in range(0, calls, 16):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(min(16, calls - start)):
                fn()
            spent += time.perf_counter() - t0
        per_round.append(spent / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per_round)


def breakdown(t: int = 8192, k: int = 4096, n: int = 4096, recipe: str = "fp8_current") -> dict[str, float]:
    """Host microseconds per call of each layer of a ``recipe`` Linear step at (t, k, n)."""
    from benchmarks.steps import CUSTOM_OPS, step_fn
    from tetrt_support.quant.kernels import _common
    from tetrt_support.quant.linear import Linear

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16, generator=g)
    dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16, generator=g)
    layer = Linear(k, n, bias=False, recipe=recipe, device="cuda", dtype=torch.bfloat16)
    qi, qw, qg = layer.input_quantizer, layer.weight_quantizer, layer.grad_quantizer
    out: dict[str, float] = {}
    out["torch.empty (cuda, 1 element)"] = host_us(lambda: torch.empty(1, device="cuda"))
    out["torch.zeros (cuda, 1 element)"] = host_us(lambda: torch.zeros(1, device="cuda"))
    if recipe == "fp8_current":
        flat = x.reshape(-1)
        out["tensor_amax_bits (one Triton launch)"] = host_us(lambda: _common.tensor_amax_bits(flat))
        from tetrt_support.quant.kernels.float8 import current_scaling_quantize

        out["current_scaling_quantize (amax + cast)"] = host_us(
            lambda: current_scaling_quantize(x, torch.float8_e4m3fn, rowwise=True, columnwise=True))
        data, _, scale_inv, _ = current_scaling_quantize(x, torch.float8_e4m3fn, rowwise=True)
        rhs = data[:n].t()  # any (k, n) column-major FP8 operand: host time does not depend on values
        one = scale_inv.reshape(())
        out["torch._scaled_mm (t x k x n)"] = host_us(
            lambda: torch._scaled_mm(data, rhs, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    out["input_quantizer.quantize(x)"] = host_us(lambda: qi.quantize(x))
    xq, wq = qi.quantize(x), qw.quantize(layer.weight.detach())
    from tetrt_support.quant.ops import quantized_matmul

    out["quantized_matmul (fprop GEMM)"] = host_us(lambda: quantized_matmul(
        xq, wq, transpose_a=False, transpose_b=True, layout_a="rowwise", layout_b="rowwise", out_dtype=torch.bfloat16))
    ops = layer._ops
    with torch.no_grad():
        out["forward custom op, called directly (training usages)"] = host_us(
            lambda: ops.forward(x, layer.weight, None, [], qi, qw, qg, True, True, list(layer.fast_accum), None, None))
    _, x_flat, w_flat = ops.forward(x, layer.weight, None, [], qi, qw, qg, True, True, list(layer.fast_accum), None, None)
    out["backward custom op, called directly"] = host_us(lambda: ops.backward(
        dy, list(x_flat), list(w_flat), qi, qw, qg, [t, k], [n, k], torch.bfloat16, False, True, True, True, True,
        list(layer.fast_accum), None))
    xg = x.clone().requires_grad_(True)
    out["eager Linear forward + backward"] = host_us(lambda: layer(xg).backward(dy), calls=32)
    out[f"compiled step ({recipe})"] = host_us(step_fn(recipe, t, k, n), calls=32)
    out[f"compiled step ({recipe}, custom ops)"] = host_us(step_fn(f"{recipe}{CUSTOM_OPS}", t, k, n), calls=32)
    out["compiled step (bf16 nn.Linear)"] = host_us(step_fn("bf16", t, k, n), calls=32)
    return out
