"""What the host does per compiled Linear training step, counted.

    python -m benchmarks.perf --device cpu --suites host_cost   # -> results/host_cost_cpu.json
    python -m benchmarks.perf --device cuda --suites host_cost  # -> results/host_cost_cuda.json

One step as in :mod:`benchmarks.train_step` (``y = layer(x); y.backward(dy)``, the layer
``torch.compile``d in the default mode, ``fullgraph=True``) at a size whose arithmetic is a
few microseconds, so what a step costs is what the host does for it. Per variant: the
Python function calls per step (cProfile; a count, the same on any machine for the same
versions), the ATen operators it dispatches per step (torch.profiler; a count too) and the
median wall time per step (noisy on a shared machine: read its ratios, not its values; on
CUDA the GPU's work at this size is shorter than the host's, so it is the host's time).

The inline step compiles the quantization into the graph on every device. The custom ops
call the quantizers from Python; on the CPU those run their eager reference (no Triton
there), on CUDA the Triton kernels, so the CPU's counts for the custom ops are not the
GPU's: each device has its own file.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.record import torchao_version
from benchmarks.steps import CUSTOM_OPS, compiled_steps, make_layer, step_fn

TORCHAO = "torchao_float8_tensorwise"
VARIANTS = ("bf16", TORCHAO, "fp8_current", f"fp8_current{CUSTOM_OPS}", "fp8_block",
            f"fp8_block{CUSTOM_OPS}")
# T tokens, K in, N out: a few microseconds of arithmetic (bf16 GEMMs are slow on CPUs without
# bf16 instructions: at 32x256x256 they took ms); on CUDA the smallest size whose every dim the
# block formats' GEMM takes (multiples of 128), so that the inline step can run there.
SIZE = {"cpu": (16, 64, 64), "cuda": (128, 128, 128)}
QUICK_SIZE = {"cpu": (8, 32, 32), "cuda": (128, 128, 128)}


def python_calls_per_step(step: Callable[[], None], steps: int) -> float:
    """Python function calls (cProfile's count, primitive and recursive) per call of ``step``."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    return pstats.Stats(profiler).total_calls / steps  # type: ignore[attr-defined]


def aten_ops_per_step(step: Callable[[], None], steps: int) -> float:
    """ATen operators dispatched per call of ``step`` (torch.profiler's ``aten::`` events)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return sum(1 for e in prof.events() if e.name.startswith("aten::")) / steps


def wall_us_per_step(step: Callable[[], None], calls: int, rounds: int, device: str = "cpu") -> float:
    """Median over ``rounds`` of the wall time per call of ``step``, in microseconds (on
    CUDA each round ends when the device has finished its work)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    samples = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        sync()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def torchao_missing() -> str | None:
    """Why torchao's float8 training cannot run here, or None."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        return f"torchao does not import ({e}); install the bench extra"
    return None


def run(quick: bool = False, variants: list[str] | None = None, device: str = "cpu") -> dict[str, Any]:
    """Every variant's counts and time at :data:`SIZE` (``quick``: :data:`QUICK_SIZE`) on ``device``."""
    unknown = sorted(set(variants or ()) - set(VARIANTS))
    if unknown:
        raise ValueError(f"host_cost: unknown variant(s) {', '.join(unknown)}; expected some of "
                         f"{', '.join(VARIANTS)}")
    t, k, n = (QUICK_SIZE if quick else SIZE)[device]
    steps, calls, rounds = (5, 10, 3) if quick else (20, 50, 7)
    rows: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for variant in variants or VARIANTS:
        reason = torchao_missing() if variant == TORCHAO else None
        if reason:
            skipped[variant] = reason
            continue
        torch._dynamo.reset()
        step = step_fn(variant, t, k, n, device=device)
        form = compiled_steps(make_layer(variant, k, n, torch.empty(n, k, device=device, dtype=torch.bfloat16)), t)
        t0 = time.perf_counter()
        step()
        first = time.perf_counter() - t0
        for _ in range(3):
            step()
        rows[variant] = {"python_calls_per_step": python_calls_per_step(step, steps),
                         "aten_ops_per_step": aten_ops_per_step(step, steps),
                         "wall_us_per_step": round(wall_us_per_step(step, calls, rounds, device), 1),
                         "first_step_s": round(first, 2), **({"compiled_step": form} if form else {})}
        print(f"host_cost {variant}: {rows[variant]}", flush=True)
    return {"machine": torchao_version(), "host_cost": {"size": {"tokens": t, "in_features": k, "out_features": n},
                          "steps_counted": steps, "calls_per_sample": calls, "rounds": rounds,
                          "torch": torch.__version__, "variants": rows, "skipped": skipped}}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The headline of a results file (what benchmarks.perf prints)."""
    rows = result.get("host_cost", {}).get("variants", {})
    return {v: {"python_calls": r["python_calls_per_step"], "aten_ops": r["aten_ops_per_step"],
                "wall_us": r["wall_us_per_step"]} for v, r in rows.items()}


if __name__ == "__main__":
    from benchmarks import perf

    perf.suite_main("host_cost")
