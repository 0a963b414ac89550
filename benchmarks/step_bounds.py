"""How fast can a quantized training step get on this GPU? The step split into its GEMMs and its quantization.

    python -m benchmarks.perf --device cuda --suites step_bounds    # -> benchmarks/results/step_bounds_cuda.json

The train_step suite times whole steps. This one asks what bounds them. Per recipe and
size, each of these is one CUDA graph, and all of them are replayed round-robin in one
process (:mod:`tetrt_support.report.timing`):

- ``step``: the compiled training step captured whole (train_step's ``cuda-graph-step``,
  :mod:`benchmarks.steps`);
- ``gemms``: only the step's three GEMM calls (fprop, dgrad, wgrad) on operands that were
  quantized beforehand, through the same ``quantized_matmul`` with the same layouts. For
  MXFP8 and NVFP4 that includes their emulation on Hopper: bf16 operands dequantized from
  the quantized ones, and NVFP4's multiply-and-cast of the fp32 product;
- ``quantize``: only the step's three quantize calls (input, weight and output gradient,
  each in both layouts);
- ``gemm.fprop`` / ``gemm.dgrad`` / ``gemm.wgrad``: each of those three calls alone (FP8
  blockwise's wgrad is the one GEMM of its step with 1 x 128 scales on BOTH operands);
- ``copy``: a bf16 tensor of T x K elements copied, which gives the memory bandwidth.

After the timing, each ``gemms`` graph is replayed once more and its outputs compared with
an eager call of the same GEMMs (``gemms_replay_equals_eager``): a graph whose inputs had
been freed under it would read other tensors' bytes.

From those: the bytes any quantization kernel must move (every high-precision input read
once, twice where the format needs a per-tensor amax before its first cast, and every
quantized buffer written once), that traffic at copy speed (``quantize_floor_s``), and the
best speedup over bf16 that THESE GEMMs allow, ``bf16 step / (gemms + quantize_floor)``.
A target above that bound cannot be met by faster quantization kernels; only other GEMMs
(the native MXFP8 and NVFP4 GEMMs of Blackwell) or another recipe would reach it.

The same question for the FP8 forward against raw ``torch._scaled_mm`` (:func:`forward_bound`):
the GEMM on operands quantized beforehand, the layer's forward (weight quantized per call, or
cached), and the best ratio the quantization of ``x`` (and ``W``) at copy speed allows --
with current scaling's two reads of each input, and with one read, the floor of ANY
quantizer of those tensors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: How often a quantize pass must read its high-precision input. Per-tensor scales (FP8
#: current scaling; NVFP4's second-level scale) need the whole tensor's amax before any
#: element can be cast: one read for the amax, one for the cast. Block scales need only
#: the block, so one read does.
INPUT_READS = {"fp8_current": 2, "fp8_block": 1, "mxfp8": 1, "nvfp4": 2}
RECIPES = tuple(INPUT_READS)
GEMMS = ("fprop", "dgrad", "wgrad")


@dataclass
class StepParts:
    """A recipe's step taken apart: its quantize calls and its GEMM calls, each runnable
    on its own, and the bytes its quantization must move at least."""

    quantize: Callable[[], Any]
    gemm_calls: dict[str, Callable[[], torch.Tensor]]  # fprop, dgrad, wgrad: each GEMM alone
    floor_bytes: int

    def gemms(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(y, dx, dw)``: the three GEMM calls in the step's order."""
        return tuple(call() for call in self.gemm_calls.values())  # type: ignore[return-value]


def step_parts(recipe: str, x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor) -> StepParts:
    """The quantize and GEMM calls of one training step of ``quant.Linear(recipe)`` without
    bias on ``x`` (T, K), ``weight`` (N, K) and the output gradient ``dy`` (T, N).

    ``gemms()`` returns ``(y, dx, dw)``: what the layer's forward and backward compute
    (``tests/report/test_step_bounds.py`` checks this against the layer on CPU)."""
    from tetrt_support.quant.ops import flatten_quantized, quantized_matmul, with_usage
    from tetrt_support.quant.recipes import as_recipe

    if recipe not in INPUT_READS:
        raise ValueError(f"step_parts: no quantize-traffic rule for recipe {recipe!r}; known: {', '.join(INPUT_READS)}")
    input_q, weight_q, grad_q = (with_usage(q, columnwise=True) for q in as_recipe(recipe).quantizers())
    operands = {"x": (input_q, x), "w": (weight_q, weight), "dy": (grad_q, dy.contiguous())}

    def quantize() -> dict[str, Any]:
        return {name: q.quantize(t) for name, (q, t) in operands.items()}

    quantized = quantize()
    xq, wq, gq = quantized["x"], quantized["w"], quantized["dy"]
    dtype = x.dtype

    def matmul(a: Any, b: Any, *, ta: bool, tb: bool, la: str, lb: str) -> Callable[[], torch.Tensor]:
        return lambda: quantized_matmul(a, b, transpose_a=ta, transpose_b=tb, layout_a=la, layout_b=lb,
                                        out_dtype=dtype).to(dtype)

    gemm_calls = {
        "fprop": matmul(xq, wq, ta=False, tb=True, la="rowwise", lb="rowwise"),  # y = x W^T
        "dgrad": matmul(gq, wq, ta=False, tb=False, la="rowwise", lb="columnwise"),  # dx = dy W
        "wgrad": matmul(gq, xq, ta=True, tb=False, la="columnwise", lb="columnwise"),  # dW = dy^T x
    }
    read = sum(t.numel() * t.element_size() for _, t in operands.values()) * INPUT_READS[recipe]
    written = sum(b.numel() * b.element_size() for q in quantized.values() for b in flatten_quantized(q))
    return StepParts(quantize=quantize, gemm_calls=gemm_calls, floor_bytes=read + written)


def bound(bf16_step_s: float, gemms_s: float, floor_bytes: int, copy_bytes_per_s: float) -> dict[str, float]:
    """The floor of the quantization (its bytes at copy speed) and the best speedup over
    the bf16 step that GEMMs taking ``gemms_s`` allow."""
    floor_s = floor_bytes / copy_bytes_per_s
    return {"quantize_floor_s": floor_s, "bound_speedup_vs_bf16": bf16_step_s / (gemms_s + floor_s)}


def bench_size(size: str, recipes: list[str], rounds: int) -> dict[str, Any]:
    """Every part of every recipe at one size, timed round-robin as CUDA-graph replays."""
    from benchmarks.gpu_clocks import ClockSampler
    from benchmarks.steps import WHOLE_STEP_GRAPH, GraphReplay, step_fn, whole_step_graph
    from tetrt_support.report.timing import time_round_robin
    from tetrt_support.report.training import STEP_TARGETS

    t, k, n = (int(v) for v in size.split("x"))
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16, generator=g)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5
    dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16, generator=g)
    copy_dst = torch.empty_like(x)
    fns: dict[str, Callable[[], Any]] = {
        "bf16.step": step_fn("bf16", t, k, n, mode=WHOLE_STEP_GRAPH),
        "copy": whole_step_graph(lambda: copy_dst.copy_(x)),
    }
    out: dict[str, Any] = {"T_K_N": [t, k, n], "recipes": {}}
    floors: dict[str, int] = {}
    gemm_graphs: dict[str, GraphReplay] = {}
    eager: dict[str, tuple[torch.Tensor, ...]] = {}
    for recipe in recipes:
        t0 = time.perf_counter()
        try:
            parts = step_parts(recipe, x, weight, dy)
            floors[recipe] = parts.floor_bytes
            fns[f"{recipe}.step"] = step_fn(recipe, t, k, n, mode=WHOLE_STEP_GRAPH)
            fns[f"{recipe}.quantize"] = whole_step_graph(parts.quantize)
            fns[f"{recipe}.gemms"] = gemm_graphs[recipe] = whole_step_graph(parts.gemms)
            for gemm, call in parts.gemm_calls.items():
                fns[f"{recipe}.gemm.{gemm}"] = whole_step_graph(call)
            eager[recipe] = parts.gemms()
            out["recipes"][recipe] = {"setup_s": time.perf_counter() - t0, "quantize_floor_bytes": parts.floor_bytes}
        except Exception as e:  # noqa: BLE001 - one broken recipe must not hide the others
            out["recipes"][recipe] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    torch.cuda.synchronize()
    errors: dict[str, BaseException] = {}
    with ClockSampler() as clocks:
        timings = time_round_robin(fns, rounds=rounds, device="cuda", calls_per_sample=10, warmup=2, errors=errors)
    out["gpu_clocks"] = clocks.summary
    out["errors"] = {name: f"{type(e).__name__}: {str(e)[:300]}" for name, e in errors.items()}
    out["median_s"] = {name: timing.median_s for name, timing in timings.items()}
    out["protocol"] = next(iter(timings.values())).protocol() if timings else {}
    copy_s, bf16_s = out["median_s"].get("copy"), out["median_s"].get("bf16.step")
    if copy_s and bf16_s:
        copy_bytes_per_s = 2 * x.numel() * x.element_size() / copy_s
        out["copy_GBps"] = copy_bytes_per_s / 1e9
        for recipe, floor_bytes in floors.items():
            entry = out["recipes"][recipe]
            times = {p: out["median_s"].get(f"{recipe}.{p}") for p in ("step", "gemms", "quantize")}
            if None in times.values():
                continue
            entry.update({f"{p}_s": s for p, s in times.items()})
            entry["gemm_s"] = {gemm: out["median_s"].get(f"{recipe}.gemm.{gemm}") for gemm in GEMMS}
            entry.update(bound(bf16_s, times["gemms"], floor_bytes, copy_bytes_per_s))
            entry["speedup_vs_bf16"] = bf16_s / times["step"]
            entry["quantize_fraction_of_copy_speed"] = entry["quantize_floor_s"] / times["quantize"]
            entry["target_speedup_vs_bf16"] = STEP_TARGETS.get(recipe, {}).get(size)
    for recipe, graph in gemm_graphs.items():  # after every capture and replay: no graph read freed memory
        graph()
        torch.cuda.synchronize()
        out["recipes"][recipe]["gemms_replay_equals_eager"] = all(
            torch.equal(r, e) for r, e in zip(graph.outputs, eager[recipe], strict=True))
    del gemm_graphs, eager
    del fns
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return out


def forward_floor_bytes(m: int, n: int, k: int, *, cached_weight: bool, reads: int) -> int:
    """The least bytes the FP8 forward's quantization moves: ``x`` (m, k), and ``W`` (n, k)
    unless its quantized copy is cached, each read ``reads`` times as bf16 and written once
    as FP8, with its fp32 scale_inv."""
    elements = [m * k] + ([] if cached_weight else [n * k])
    return sum(reads * 2 * e + e + 4 for e in elements)


def forward_bound(size: int, rounds: int) -> dict[str, Any]:
    """The FP8 current-scaling forward at ``size`` cubed against raw ``torch._scaled_mm`` on
    operands quantized beforehand, as CUDA-graph replays round-robin with a copy of ``x``,
    and the best ratio to raw ``_scaled_mm`` that quantization at copy speed allows:
    ``scaled_mm / (scaled_mm + floor)``, with current scaling's two reads of each input
    (``bound_two_reads``) and with one (``bound_one_read``: any quantizer)."""
    from benchmarks.steps import fp8_forward_case, whole_step_graph
    from tetrt_support.report.timing import time_round_robin
    from tetrt_support.report.training import FORWARD_TARGETS

    m = n = k = size
    case = fp8_forward_case(size)
    x = case.x
    copy_dst = torch.empty_like(x)
    fns = {
        "scaled_mm_raw": whole_step_graph(case.raw),
        "fp8_current_forward": whole_step_graph(case.forward(None)),
        "fp8_current_forward_cached_weight": whole_step_graph(case.forward(False)),
        "copy": whole_step_graph(lambda: copy_dst.copy_(x)),
    }
    errors: dict[str, BaseException] = {}
    timings = time_round_robin(fns, rounds=rounds, device="cuda", calls_per_sample=10, warmup=2, errors=errors)
    out: dict[str, Any] = {"m_n_k": [m, n, k], "median_s": {name: t.median_s for name, t in timings.items()},
                           "errors": {name: f"{type(e).__name__}: {str(e)[:300]}" for name, e in errors.items()},
                           "variants": {}}
    raw_s, copy_s = out["median_s"].get("scaled_mm_raw"), out["median_s"].get("copy")
    if raw_s and copy_s:
        copy_bytes_per_s = 2 * x.numel() * x.element_size() / copy_s
        out["copy_GBps"] = copy_bytes_per_s / 1e9
        for name, cached in (("fp8_current_forward", False), ("fp8_current_forward_cached_weight", True)):
            entry: dict[str, Any] = {"target_vs_scaled_mm": FORWARD_TARGETS.get(name)}
            if name in out["median_s"]:
                entry["vs_scaled_mm"] = raw_s / out["median_s"][name]
            for label, reads in (("two_reads", 2), ("one_read", 1)):
                floor_s = forward_floor_bytes(m, n, k, cached_weight=cached, reads=reads) / copy_bytes_per_s
                entry[f"floor_{label}_s"] = floor_s
                entry[f"bound_{label}"] = raw_s / (raw_s + floor_s)
            out["variants"][name] = entry
    del fns
    torch.cuda.empty_cache()
    return out


def run(quick: bool = False, *, sizes: list[str] | None = None, recipes: list[str] | None = None,
        rounds: int | None = None, write: Callable[[dict[str, Any]], None] | None = None,
        forward_size: int | None = None) -> dict[str, Any]:
    """The ``step_bounds`` suite of ``python -m benchmarks.perf`` (a CUDA device needed):
    ``{"machine": {...}, "suites": {"step_bounds": {"sizes": {TxKxN: bench_size(...)},
    "forward": forward_bound(...)}}}`` (``forward_size`` 0: no forward section)."""
    from benchmarks.record import torchao_version
    from benchmarks.steps import DEFAULT_SIZES, QUICK_SIZES

    if not torch.cuda.is_available():
        raise RuntimeError("the step_bounds suite needs a CUDA device")
    sizes = sizes or list(QUICK_SIZES if quick else DEFAULT_SIZES)
    recipes = recipes or list(RECIPES)
    rounds = rounds or (3 if quick else 10)
    result: dict[str, Any] = {"machine": torchao_version(), "suites": {"step_bounds": {"sizes": {}}}}
    section = result["suites"]["step_bounds"]
    section["definition"] = ("bound_speedup_vs_bf16 = bf16 step / (gemms + quantize_floor); quantize_floor = "
                             "quantize_floor_bytes at the copy's bandwidth; every figure a CUDA-graph replay")
    for size in sizes:
        section["sizes"][size] = bench_size(size, recipes, rounds)
        if write is not None:
            write(result)
        print(size, {r: round(e.get("bound_speedup_vs_bf16", float("nan")), 3)
                     for r, e in section["sizes"][size]["recipes"].items()}, flush=True)
    forward_size = forward_size if forward_size is not None else (1024 if quick else 8192)
    if forward_size:
        section["forward"] = forward_bound(forward_size, rounds)
        if write is not None:
            write(result)
        print("forward", {v: round(e.get("bound_two_reads", float("nan")), 3)
                          for v, e in section["forward"]["variants"].items()}, flush=True)
    return result
