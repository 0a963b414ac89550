#!/usr/bin/env python3
"""The one benchmark entry point: lowering time, RoPE run time and bandwidth, quantized Linear.

    python -m benchmarks.perf --device cpu                 # -> benchmarks/results/perf_cpu.json
    python -m benchmarks.perf --device cuda                # -> benchmarks/results/perf_cuda.json
    python -m benchmarks.perf --device cpu --suites rope --quick

Suites:
- ``lowering``: lowering time against graph size (tiny HF Llama 4, 2..32 layers) for the
  "rewrite" and "retrace" strategies and torch's ``decompose_complex_in_graph``
  (shared with ``benchmarks/lowering.py``). Host work: run it on the CPU machine.
- ``rope``: Llama RoPE on q and k: complex eager, complex compiled, lowered eager, lowered
  compiled (both strategies), a hand-written real version eager and compiled, and a clone
  of the same bytes (the practical roofline).
- ``attention``: the RoPE attention block, complex against lowered, eager and compiled.
- ``linear``: the quantized Linear (FP8 current scaling, MXFP8, NVFP4; emulated where the
  hardware lacks the format) forward and forward+backward against bf16, and FP8 forward
  against raw ``torch._scaled_mm`` on already-quantized operands.

Results hold the machine, versions and shapes. A script, not a test: nothing here asserts,
and figures from a shared machine are only comparable within one run (quote ratios).
Runs on torch 2.11 (the H200 box) as well as 2.14.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tetrt-perf-inductor-"))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tetrt_support import zoo  # noqa: E402
from tetrt_support.complex import analysis  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------------------
# Machine and timing
# --------------------------------------------------------------------------------------


def machine(device: str) -> dict[str, Any]:
    """benchmarks/lowering.py's machine record, plus the device (and the GPU's, on CUDA)."""
    from benchmarks.lowering import machine as host_machine

    info = host_machine() | {"device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count, cuda_runtime=torch.version.cuda)
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            pass
    return info


def time_fn(fn: Callable[[], Any], device: str, iters: int, warmup: int = 3) -> float:
    """Median seconds per call.

    On a GPU each sample times ``inner`` back-to-back calls between two CUDA events, so the
    host's per-call work (Python, guards, pytree) overlaps the device work as it does in a
    real loop; synchronising after every call would charge launch latency to the kernel.
    On the CPU, a host clock around each call.
    """
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        inner = 10
        for _ in range(max(3, iters // inner)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / inner)
        return statistics.median(times)
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_medians(fns: dict[str, Callable[[], Any]], device: str, rounds: int) -> dict[str, float]:
    """Median seconds per call of each function, sampled round-robin (one sample per round)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in tqdm(range(rounds), desc="interleaved rounds", unit="round", leave=False):
        for name, fn in fns.items():
            samples[name].append(time_fn(fn, device, iters=1, warmup=0))
    return {name: statistics.median(values) for name, values in samples.items()}


def _error(e: BaseException) -> dict[str, str]:
    return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}


# --------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------


def real_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hand-written real RoPE on interleaved pairs (what a lowering should be able to match)."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    xr, xi = pairs[..., 0], pairs[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((xr * c - xi * s, xr * s + xi * c), dim=-1).flatten(3).type_as(x)


def _lowered(program: torch.export.ExportedProgram, strategy: str) -> torch.nn.Module:
    from tetrt_support.complex import lower

    return lower(program, strategy=strategy)


def bench_rope(device: str, shape: list[int], iters: int) -> dict[str, Any]:
    batch, seq, heads, head_dim = shape
    rope = zoo.ComplexRoPE(head_dim=head_dim, max_seq_len=seq).eval().to(device)
    g = torch.Generator(device=device).manual_seed(0)
    q, k = (torch.randn(batch, seq, heads, head_dim, generator=g, device=device) for _ in range(2))
    freqs = rope.freqs_cis[:seq]
    cos, sin = freqs.real.contiguous(), freqs.imag.contiguous()
    with torch.no_grad():
        reference = rope(q, k)
    variants: dict[str, Callable[[], Any]] = {
        "clone": lambda: (q.clone(), k.clone()),
        "complex_eager": lambda: rope(q, k),
        "complex_compiled": lambda c=torch.compile(rope): c(q, k),
        "real_handwritten_eager": lambda: (real_rope(q, cos, sin), real_rope(k, cos, sin)),
        "real_handwritten_compiled": lambda c=torch.compile(real_rope): (c(q, cos, sin), c(k, cos, sin)),
        # q and k in ONE compiled graph, as in the lowered module (two calls above).
        "real_handwritten_compiled_one_graph": lambda c=torch.compile(
            lambda q, k, cos, sin: (real_rope(q, cos, sin), real_rope(k, cos, sin))): c(q, k, cos, sin),
    }
    results: dict[str, Any] = {}
    try:
        program = torch.export.export(rope, (q, k), strict=False)
        for strategy in ("rewrite", "retrace"):
            try:
                gm = _lowered(program, strategy)
                variants[f"lowered_{strategy}_eager"] = lambda gm=gm: gm(q, k)
                variants[f"lowered_{strategy}_compiled"] = lambda c=torch.compile(gm): c(q, k)
                # Inference freezing folds slice/unsqueeze/select of the packed [..., 2] freqs
                # buffer into contiguous real and imaginary planes, as an engine build folds
                # constants; without it each thread reads the freqs with a stride of 2.
                variants[f"lowered_{strategy}_compiled_frozen"] = lambda c=torch.compile(
                    gm, options={"freezing": True}): c(q, k)
            except Exception as e:  # noqa: BLE001 - record, keep measuring the rest
                results[f"lowered_{strategy}"] = _error(e)
    except Exception as e:  # noqa: BLE001
        results["export"] = _error(e)
    nbytes = 2 * 2 * q.numel() * q.element_size()  # read q and k, write two outputs
    ready: dict[str, Callable[[], Any]] = {}
    for name, fn in tqdm(variants.items(), desc=f"rope {device} (compile, check)", unit="variant"):
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                out = fn()
                if device == "cuda":
                    torch.cuda.synchronize()
                results[name] = {"first_call_s": time.perf_counter() - t0}
            if name != "clone":
                results[name]["max_abs_error_vs_complex_eager"] = analysis.max_abs_error(reference, out)
            ready[name] = fn
        except Exception as e:  # noqa: BLE001
            results[name] = _error(e)
    # Round-robin: every round times each variant once, so clock and thermal drift hit all
    # variants alike (timing them one after another gave +-4% between identical kernels).
    with torch.no_grad():
        samples = interleaved_medians(ready, device, rounds=max(5, iters // 2))
    for name, seconds in samples.items():
        results[name].update(median_s=seconds, bandwidth_GBps=nbytes / seconds / 1e9)
    clone_bw = results.get("clone", {}).get("bandwidth_GBps")
    if clone_bw:
        for entry in results.values():
            if "bandwidth_GBps" in entry:
                entry["fraction_of_clone_bandwidth"] = entry["bandwidth_GBps"] / clone_bw
    return {"shape_q_k": shape, "dtype": "float32", "bytes_moved": nbytes, "iters": iters, "variants": results}


def bench_attention(device: str, batch: int, seq: int, hidden: int, heads: int, iters: int) -> dict[str, Any]:
    model = zoo.ComplexRoPEAttention(hidden=hidden, heads=heads, max_seq_len=seq).eval().to(device)
    x = torch.randn(batch, seq, hidden, device=device, generator=torch.Generator(device=device).manual_seed(0))
    with torch.no_grad():
        reference = model(x)
    variants: dict[str, Callable[[], Any]] = {
        "complex_eager": lambda: model(x),
        "complex_compiled": lambda c=torch.compile(model): c(x),
    }
    results: dict[str, Any] = {}
    try:
        program = torch.export.export(model, (x,), strict=False)
        for strategy in ("rewrite", "retrace"):
            try:
                gm = _lowered(program, strategy)
                variants[f"lowered_{strategy}_eager"] = lambda gm=gm: gm(x)
                variants[f"lowered_{strategy}_compiled"] = lambda c=torch.compile(gm): c(x)
            except Exception as e:  # noqa: BLE001
                results[f"lowered_{strategy}"] = _error(e)
    except Exception as e:  # noqa: BLE001
        results["export"] = _error(e)
    for name, fn in tqdm(variants.items(), desc=f"attention {device}", unit="variant"):
        try:
            with torch.no_grad():
                out = fn()
                seconds = time_fn(fn, device, iters)
            results[name] = {"median_s": seconds, "max_abs_error_vs_complex_eager": analysis.max_abs_error(reference, out)}
        except Exception as e:  # noqa: BLE001
            results[name] = _error(e)
    base = results.get("complex_eager", {}).get("median_s")
    for entry in results.values():
        if base and "median_s" in entry:
            entry["relative_to_complex_eager"] = entry["median_s"] / base
    return {"batch": batch, "seq": seq, "hidden": hidden, "heads": heads, "dtype": "float32", "iters": iters, "variants": results}


# --------------------------------------------------------------------------------------
# Quantized Linear
# --------------------------------------------------------------------------------------


def bench_linear(device: str, m: int, n: int, k: int, iters: int, recipes: list[str]) -> dict[str, Any]:
    from benchmarks.linear import bench_linear_suite

    return bench_linear_suite(device, m, n, k, iters, recipes)


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------

SIZES = {  # (device, quick) -> sizes
    ("cpu", False): {"rope": [2, 512, 8, 64], "attention": (2, 256, 256, 4), "linear": (256, 512, 512), "layers": [2, 4, 8, 16, 32]},
    ("cpu", True): {"rope": [1, 64, 4, 32], "attention": (1, 32, 64, 4), "linear": (64, 128, 128), "layers": [2, 4]},
    ("cuda", False): {"rope": [8, 4096, 32, 128], "attention": (8, 2048, 2048, 16), "linear": (8192, 8192, 8192), "layers": [2, 4, 8, 16, 32]},
    ("cuda", True): {"rope": [2, 1024, 8, 64], "attention": (2, 512, 512, 8), "linear": (1024, 1024, 1024), "layers": [2, 4]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--suites", default="lowering,rope,attention,linear",
                        help="comma-separated: lowering,rope,attention,linear")
    parser.add_argument("--quick", action="store_true", help="small sizes, few iterations (a smoke run)")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--recipes", default="fp8_current,mxfp8,nvfp4")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here")
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    sizes = SIZES[(args.device, args.quick)]
    iters = args.iters or (5 if args.quick else (50 if args.device == "cuda" else 10))
    out = args.out or RESULTS / f"perf_{args.device}{'_quick' if args.quick else ''}.json"

    torch.manual_seed(0)
    started = time.perf_counter()
    result: dict[str, Any] = {"machine": machine(args.device), "suites": {}}
    for suite in tqdm(suites, desc="suites", unit="suite"):
        try:
            if suite == "lowering":
                from benchmarks.lowering import bench_lowering

                result["suites"]["lowering"] = bench_lowering(sizes["layers"], repeats=3, repeats_large=2, large_from=16)
            elif suite == "rope":
                result["suites"]["rope"] = bench_rope(args.device, sizes["rope"], iters)
            elif suite == "attention":
                result["suites"]["rope_attention"] = bench_attention(args.device, *sizes["attention"], iters=iters)
            elif suite == "linear":
                result["suites"]["linear"] = bench_linear(args.device, *sizes["linear"], iters=iters,
                                                          recipes=args.recipes.split(","))
            else:
                raise ValueError(f"unknown suite {suite!r}; valid: lowering, rope, attention, linear")
        except Exception as e:  # noqa: BLE001 - one failing suite must not lose the others' results
            result["suites"][suite] = _error(e)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    result["machine"]["benchmark_wall_s"] = time.perf_counter() - started
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    print(json.dumps(summary(result), indent=1))


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The headline ratios of one run (also used by notebook 05)."""
    s: dict[str, Any] = {}
    rope = result["suites"].get("rope", {}).get("variants", {})
    for name, entry in rope.items():
        if "fraction_of_clone_bandwidth" in entry:
            s[f"rope.{name}.fraction_of_clone"] = round(entry["fraction_of_clone_bandwidth"], 3)
    lin = result["suites"].get("linear", {})
    for key, value in lin.get("ratios", {}).items():
        s[f"linear.{key}"] = round(value, 3)
    return s


if __name__ == "__main__":
    main()
