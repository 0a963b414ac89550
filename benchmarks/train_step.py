"""Training-step benchmark of quantized Linears on a GPU, against bf16 and torchao.

    python -m benchmarks.perf --device cuda --suites train_step     # -> benchmarks/results/train_step_cuda.json
    python -m benchmarks.perf --device cuda --suites train_step --sizes 8192x4096x4096 \
        --recipes bf16,fp8_current --modes default,reduce-overhead --profile prof/

(``python -m benchmarks.train_step ARGS`` is the same command.) One step
(:func:`benchmarks.steps.step_fn`): ``y = layer(x); y.backward(dy)`` for one Linear without
bias, bf16 weight and activations, the layer ``torch.compile``d (inductor), gradients reset
to None before each step. ``--modes``:
``default``, torch.compile's other modes (``reduce-overhead``: its CUDA graphs, one per
forward and per backward, each replay checked by the host), and ``cuda-graph-step``: the
default-mode step, forward and backward, captured into ONE CUDA graph and replayed (what
the GPU spends with the host out of the way; the small size is bound by the host in the
other modes). Variants: ``bf16``
(``torch.nn.Linear``), ``torchao_float8_tensorwise`` (torchao's float8 training, tensorwise
recipe; benchmark-only, from the optional ``bench`` extra) and this project's recipes
(``fp8_current``, ``fp8_block``, ``mxfp8``, ``nvfp4``; MXFP8 and NVFP4 emulated on Hopper).
Sizes ``TxKxN``: T tokens, K in-features, N out-features. All variants of a size are timed
round-robin in one process (:mod:`tetrt_support.report.timing`), so the ratios to bf16 are
side by side; a sample is 10 back-to-back steps between CUDA events. Each size records the
SM clock, the power and nvidia-smi's clock event reasons over its timing
(:mod:`benchmarks.gpu_clocks`): the H200 runs these steps at its power cap.

Also: the FP8 forward against raw ``torch._scaled_mm`` on already-quantized operands
(8192^3; with and without a cached weight), an optional profile (``--profile DIR``: the top
kernels by GPU time and the host time per step of each ``--profile-variant``, and a cProfile
of the first), and the quantize-path switch ``TETRT_QUANT_KERNELS=0`` (reference quantizers)
for a before/after in one run (``--reference-too``).
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Callable
from typing import Any

from benchmarks import record

record.private_inductor_cache("tetrt-train-step-")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

from benchmarks.steps import (  # noqa: E402
    CUSTOM_OPS,
    DEFAULT_SIZES,
    QUICK_SIZES,
    WHOLE_STEP_GRAPH,
    allow_recompiles,
    fp8_forward_case,
    host_ms_per_step,
    step_fn,
)

allow_recompiles()

RECIPES = ("fp8_current", "fp8_block", "mxfp8", "nvfp4")
DEFAULT_VARIANTS = ("bf16", "torchao_float8_tensorwise", *RECIPES, *(f"{r}{CUSTOM_OPS}" for r in ("fp8_current", "fp8_block")))


def machine_extras() -> dict[str, Any]:
    """What this suite adds to the machine record: torchao's version, when it is installed."""
    return record.torchao_version()


def bench_size(size: str, variants: list[str], rounds: int, mode: str = "default") -> dict[str, Any]:
    from benchmarks.gpu_clocks import ClockSampler
    from tetrt_support.report.timing import time_round_robin

    t, k, n = (int(v) for v in size.split("x"))
    fns: dict[str, Callable[[], None]] = {}
    out: dict[str, Any] = {"T_K_N": [t, k, n], "compile_mode": mode, "variants": {}}
    for variant in variants:
        t0 = time.perf_counter()
        try:
            fn = step_fn(variant, t, k, n, mode=mode)
            fn()  # compile
            fn()  # (reduce-overhead records its CUDA graphs on the first calls)
            torch.cuda.synchronize()
            fns[variant] = fn
            out["variants"][variant] = {"first_step_s": time.perf_counter() - t0}
        except Exception as e:  # noqa: BLE001 - one broken variant must not hide the others
            out["variants"][variant] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    errors: dict[str, BaseException] = {}
    with ClockSampler() as clocks:
        timings = time_round_robin(fns, rounds=rounds, device="cuda", calls_per_sample=10, warmup=2, errors=errors)
    out["gpu_clocks"] = clocks.summary
    for name, e in errors.items():
        out["variants"][name]["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    flops = 3 * 2 * t * k * n
    for name, timing in timings.items():
        entry = out["variants"][name]
        entry.update(median_s=timing.median_s, best_s=timing.best_s, TFLOPs=flops / timing.median_s / 1e12,
                     host_ms_per_step=host_ms_per_step(fns[name]), **timing.protocol())
    base = out["variants"].get("bf16", {}).get("median_s")
    for entry in out["variants"].values():
        if base and "median_s" in entry:
            entry["speedup_vs_bf16"] = base / entry["median_s"]
    del fns
    torch._dynamo.reset()  # the next size (or mode) compiles afresh
    torch.cuda.empty_cache()
    return out


def bench_forward(size: int, rounds: int) -> dict[str, Any]:
    """FP8 current-scaling forward (quantize x and W, GEMM) against raw ``torch._scaled_mm``."""
    from tetrt_support.report.timing import time_round_robin

    m = n = k = size
    case = fp8_forward_case(size)
    compiled = torch.compile(case.layer, fullgraph=True)

    def forward_compiled() -> Any:
        with torch.no_grad():
            return compiled(case.x)

    fns = {"scaled_mm_raw": case.raw, "fp8_current_forward": case.forward(None),
           "fp8_current_forward_cached_weight": case.forward(False), "fp8_current_forward_compiled": forward_compiled}
    errors: dict[str, BaseException] = {}
    timings = time_round_robin(fns, rounds=rounds, device="cuda", calls_per_sample=10, warmup=3, errors=errors)
    out: dict[str, Any] = {"m_n_k": [m, n, k], "variants": {}}
    for name, timing in timings.items():
        out["variants"][name] = {"median_s": timing.median_s, "best_s": timing.best_s,
                                 "TFLOPs": 2 * m * n * k / timing.median_s / 1e12}
    for name, e in errors.items():
        out["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    raw_s = out["variants"].get("scaled_mm_raw", {}).get("median_s")
    for name, entry in out["variants"].items():
        if raw_s and "median_s" in entry:
            entry["throughput_vs_scaled_mm"] = raw_s / entry["median_s"]
    return out


def host_profile(variant: str, size: str, directory: pathlib.Path, steps: int = 30) -> dict[str, Any]:
    """cProfile of ``steps`` steps: where the host's time per step goes (top functions)."""
    import cProfile
    import io
    import pstats

    t, k, n = (int(v) for v in size.split("x"))
    step = step_fn(variant, t, k, n)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).sort_stats("tottime")
    stats.print_stats(45)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"host_profile_{variant}_{size}.txt").write_text(text.getvalue())
    cumulative = io.StringIO()
    pstats.Stats(profiler, stream=cumulative).sort_stats("cumulative").print_stats(45)
    (directory / f"host_profile_{variant}_{size}_cumulative.txt").write_text(cumulative.getvalue())
    return {"variant": variant, "size": size, "steps": steps}


def profile(variant: str, size: str, directory: pathlib.Path) -> dict[str, Any]:
    """Top kernels by GPU time over 5 steps, per step; the table also goes to ``directory``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    t, k, n = (int(v) for v in size.split("x"))
    step = step_fn(variant, t, k, n)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    steps = 5
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    table = events.table(sort_by="self_cuda_time_total", row_limit=30)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"profile_{variant}_{size}.txt").write_text(table + "\n")
    kernels = []
    for e in events:
        if not str(getattr(e, "device_type", "")).endswith("CUDA"):
            continue  # CPU-side ranges (ops, custom ops) would count their kernels twice
        device_us = getattr(e, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(e, "self_cuda_time_total", 0)
        if device_us > 0:
            kernels.append({"name": e.key[:120], "us_per_step": device_us / steps, "calls_per_step": e.count / steps})
    kernels.sort(key=lambda r: -r["us_per_step"])
    return {"variant": variant, "size": size, "steps": steps, "gpu_us_per_step": sum(r["us_per_step"] for r in kernels),
            "kernels": kernels[:25], "host_ms_per_step": host_ms_per_step(step)}


STEP = "y = layer(x); y.backward(dy); torch.compile(layer, fullgraph=True), inductor"


def step_description(mode: str) -> str:
    """What one timed step of ``mode`` is, as the results file records it."""
    if mode == "default":
        return STEP
    if mode == WHOLE_STEP_GRAPH:
        return f"{STEP}, the whole step captured into one CUDA graph (torch.cuda.graph) and replayed"
    return f"{STEP}, mode={mode!r}"


def run(quick: bool = False, *, sizes: list[str] | None = None, variants: list[str] | None = None,
        rounds: int | None = None, modes: list[str] | None = None, profile_dir: pathlib.Path | None = None,
        profile_variants: list[str] | None = None, reference_too: bool = False, forward_size: int | None = None,
        write: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The ``train_step`` suite of ``python -m benchmarks.perf`` (a CUDA device needed).

    Returns ``{"machine": {...}, "suites": {...}}``: ``train_step`` (default compile mode) and
    ``train_step_<mode>`` per other mode, each ``{"step", "sizes": {TxKxN: bench_size(...)}}``;
    ``train_step_reference_quantizers`` with ``reference_too``; ``forward_vs_scaled_mm``;
    ``profiles`` and ``host_breakdown`` (:mod:`benchmarks.host_breakdown`) with ``profile_dir``.
    ``write`` gets the partial result after each size.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("the train_step suite needs a CUDA device")
    sizes = sizes or list(QUICK_SIZES if quick else DEFAULT_SIZES)
    variants = variants or list(DEFAULT_VARIANTS)
    rounds = rounds or (3 if quick else 10)
    forward_size = forward_size if forward_size is not None else (1024 if quick else 8192)
    result: dict[str, Any] = {"machine": machine_extras(), "suites": {}}

    def save() -> None:
        if write is not None:
            write(result)

    for mode in modes or ["default"]:
        suite = "train_step" if mode == "default" else f"train_step_{mode}"
        section = result["suites"][suite] = {"step": step_description(mode), "sizes": {}}
        for size in sizes:
            section["sizes"][size] = bench_size(size, variants, rounds, mode)
            save()
            print(mode, size, {v: round(e.get("speedup_vs_bf16", float("nan")), 3)
                               for v, e in section["sizes"][size]["variants"].items()}, flush=True)
    if reference_too:
        before = os.environ.get("TETRT_QUANT_KERNELS")
        os.environ["TETRT_QUANT_KERNELS"] = "0"
        try:
            result["suites"]["train_step_reference_quantizers"] = {
                size: bench_size(size, ["bf16", *[v for v in variants if v in RECIPES]], max(3, rounds // 3)) for size in sizes}
        finally:
            if before is None:
                del os.environ["TETRT_QUANT_KERNELS"]
            else:
                os.environ["TETRT_QUANT_KERNELS"] = before
        save()
    if forward_size:
        result["suites"]["forward_vs_scaled_mm"] = bench_forward(forward_size, rounds)
        save()
    if profile_dir is not None:
        profiles = result["suites"]["profiles"] = {}
        for i, item in enumerate(profile_variants or ["fp8_current"]):
            variant, _, size = item.partition("@")
            size = size or sizes[0]
            try:
                profiles[f"{variant}@{size}"] = profile(variant, size, profile_dir)
            except Exception as e:  # noqa: BLE001 - one failed profile must not lose the timings
                profiles[f"{variant}@{size}"] = {"error": f"{type(e).__name__}: {e}"}
            if i == 0:
                try:
                    host_profile(variant, size, profile_dir)
                except Exception as e:  # noqa: BLE001
                    result["suites"]["host_profile_error"] = f"{type(e).__name__}: {e}"
            torch._dynamo.reset()
        from benchmarks.host_breakdown import breakdown

        t, k, n = (int(v) for v in sizes[0].split("x"))
        try:
            result["suites"]["host_breakdown"] = {"size": sizes[0], "recipe": "fp8_current",
                                                  "host_us_per_call": breakdown(t, k, n)}
        except Exception as e:  # noqa: BLE001 - a failed breakdown must not lose the timings
            result["suites"]["host_breakdown"] = {"error": f"{type(e).__name__}: {e}"}
        torch._dynamo.reset()
        save()
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Step speedups over bf16 per size, forward throughput over raw _scaled_mm, GPU/host ms."""
    s: dict[str, Any] = {}
    for size, entry in result["suites"].get("train_step", {}).get("sizes", {}).items():
        for name, v in entry["variants"].items():
            if "median_s" in v:
                s[f"{size}.{name}"] = f"{v['median_s'] * 1e3:.3f} ms ({v['speedup_vs_bf16']:.3f}x), host {v['host_ms_per_step']:.2f} ms"
            else:
                s[f"{size}.{name}"] = v.get("error")
    for suite, section in result["suites"].items():
        if suite.startswith("train_step_") and suite != "train_step_reference_quantizers":
            for size, entry in section.get("sizes", {}).items():
                for name, v in entry["variants"].items():
                    s[f"{suite}.{size}.{name}"] = (f"{v['median_s'] * 1e3:.3f} ms ({v['speedup_vs_bf16']:.3f}x)"
                                                   if "median_s" in v else v.get("error"))
    for size, entry in result["suites"].get("train_step_reference_quantizers", {}).items():
        for name, v in entry["variants"].items():
            if "median_s" in v:
                s[f"reference_quantizers.{size}.{name}"] = f"{v['median_s'] * 1e3:.3f} ms"
    for name, v in result["suites"].get("forward_vs_scaled_mm", {}).get("variants", {}).items():
        s[f"forward.{name}"] = round(v["throughput_vs_scaled_mm"], 3) if "throughput_vs_scaled_mm" in v else v.get("error")
    for key, prof in result["suites"].get("profiles", {}).items():
        if "kernels" not in prof:
            s[f"profile {key}"] = prof.get("error")
            continue
        s[f"profile {key}"] = f"GPU {prof['gpu_us_per_step']:.0f} us/step (kernels), host {prof['host_ms_per_step']:.2f} ms/step"
        for r in prof["kernels"][:14]:
            s[f"profile {key}: {r['name'][:60]}"] = f"{r['us_per_step']:.1f} us x{r['calls_per_step']:.0f}"
    return s


if __name__ == "__main__":  # python -m benchmarks.train_step ARGS: the entry point, this suite
    from benchmarks import perf

    perf.suite_main("train_step")
