"""How long does lowering complex arithmetic take, and what does the lowered RoPE cost to run?

Run by ``python -m benchmarks.perf --suites lowering`` (CPU host work), which writes
``benchmarks/results/lowering.json`` with two measurements:

1. Lowering time against model size: HF Llama 4 (tiny config, random weights) with 2 to 32
   layers, exported once per size, lowered by tetrt's ``"rewrite"`` (in-place FX rewrite)
   and ``"retrace"`` (Interpreter under make_fx) strategies and by torch's own
   ``decompose_complex_in_graph`` (torch >= 2.14). Median of a few repeats per size, the
   repeats round-robin over the strategies with the garbage collector held off; a linear
   fit (seconds per layer, R^2) per strategy; the ratio rewrite / torch per size against
   the target ``rewrite <= 0.5 x decompose_complex_in_graph``. Every lowered graph is also
   checked against eager logits once per size.
2. Run time of the lowered RoPE (eager and inductor) against the complex original, on CPU
   at a modest size.

One torch thread by default: timings on shared, loaded cores are steadier with one.
A script, not a test: nothing here asserts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from benchmarks.record import error_record
from tetrt_support import zoo
from tetrt_support.report import complex_graphs as graphs
from tetrt_support.report.compare import max_abs_error
from tetrt_support.report.timing import Stopwatch, time_round_robin

TARGET_RATIO = 0.5  # rewrite should take at most half of decompose_complex_in_graph's time


@dataclass(frozen=True)
class LoweringSizes:
    layers: tuple[int, ...] = (2, 4, 8, 16, 32)
    repeats: int = 5  # lowerings per size (median)
    repeats_large: int = 3  # from large_from layers on
    large_from: int = 16
    rope_shape: tuple[int, int, int, int] = (2, 256, 8, 64)  # batch, seq, heads, head_dim
    rope_iters: int = 50
    threads: int = 1


FULL = LoweringSizes()
QUICK = LoweringSizes(layers=(2, 4), repeats=2, repeats_large=2, rope_shape=(1, 64, 4, 32), rope_iters=5)


def strategies() -> list[graphs.Strategy]:
    return [graphs.tetrt_strategy("rewrite"), graphs.tetrt_strategy("retrace"), graphs.TORCH_DECOMPOSE]


def linear_fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares ``y = slope * x + intercept`` and its R^2."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    residual = float(((y - (slope * x + intercept)) ** 2).sum())
    total = float(((y - y.mean()) ** 2).sum())
    return {"seconds_per_layer": float(slope), "intercept_s": float(intercept), "r2": 1.0 - residual / total if total else 1.0}


def bench_lowering(layers: tuple[int, ...], repeats: int, repeats_large: int, large_from: int) -> dict[str, Any]:
    chosen = strategies()
    rows: list[dict[str, Any]] = []
    total = sum(repeats_large if n >= large_from else repeats for n in layers) * len(chosen)
    progress = tqdm(total=total, desc="lowering", unit="lowering")
    for n in layers:
        model = zoo.tiny_llama4(num_layers=n, with_moe=False, seed=0)
        with Stopwatch() as export:
            program, args, kwargs = zoo.export_llama4(model, batch=2, seq=16)
        with torch.no_grad():
            reference = model(**kwargs)
        row: dict[str, Any] = {
            "layers": n,
            "export_s": export.wall_s,
            "exported_call_function_nodes": sum(graphs.op_histogram(program).values()),
            "exported_complex_valued_nodes": len(graphs.complex_valued_nodes(program)),
            "strategies": {},
        }
        reps = repeats_large if n >= large_from else repeats
        # The last lowered graph of each strategy, checked below. A replaced graph is cyclic
        # garbage (nodes and graph refer to each other): it is collected before the next
        # sample, outside the timed region.
        graphs_of: dict[str, Any] = {}

        def lowering(s: graphs.Strategy) -> Callable[[], None]:
            def run() -> None:
                graphs_of[s.name] = s.lower(program, args, kwargs)
            return run

        errors: dict[str, BaseException] = {}
        timings = time_round_robin({s.name: lowering(s) for s in chosen}, rounds=reps, warmup=0, gc_off=True,
                                   errors=errors, progress=progress.update)
        for s in chosen:
            entry: dict[str, Any] = {"repeats": reps}
            if s.name in errors:
                entry.update(error_record(errors[s.name]))
            else:
                gm = graphs_of[s.name]
                entry.update(
                    median_s=timings[s.name].median_s,
                    times_s=list(timings[s.name].samples_s),
                    call_function_nodes=sum(graphs.op_histogram(gm).values()),
                    complex_valued_nodes_left=len(graphs.complex_valued_nodes(gm)),
                    # torch's pass returns a plain dict where the model returned a ModelOutput: compare leaves.
                    max_abs_error_vs_eager=max_abs_error(reference, s.call(gm, args, kwargs)),
                )
            row["strategies"][s.name] = entry
        rows.append(row)
    progress.close()

    fits, ratios = {}, []
    for s in chosen:
        ok = [(r["layers"], r["strategies"][s.name]["median_s"]) for r in rows if "median_s" in r["strategies"][s.name]]
        if len(ok) >= 2:
            fits[s.name] = linear_fit([x for x, _ in ok], [y for _, y in ok])
    for r in rows:
        a, b = r["strategies"]["rewrite"], r["strategies"]["decompose_complex_in_graph"]
        if "median_s" in a and "median_s" in b:
            ratios.append({"layers": r["layers"], "rewrite_over_decompose": a["median_s"] / b["median_s"]})
    met = bool(ratios) and all(x["rewrite_over_decompose"] <= TARGET_RATIO for x in ratios)
    return {
        "model": "HF Llama4ForCausalLM, tetrt_support.zoo.llama4_config (hidden 64, 4 heads, 2 KV heads, head_dim 16, vocab 128, dense MLP, every 4th layer no-RoPE)",
        "inputs": {"input_ids": [2, 16]},
        "rows": rows,
        "linear_fit": fits,
        "rewrite_over_decompose": ratios,
        "target": f"rewrite <= {TARGET_RATIO} x decompose_complex_in_graph at every size",
        "target_met": met,
    }


def bench_rope_runtime(batch: int, seq: int, heads: int, head_dim: int, iters: int) -> dict[str, Any]:
    rope = zoo.ComplexRoPE(head_dim=head_dim, max_seq_len=seq).eval()
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(batch, seq, heads, head_dim, generator=g) for _ in range(2))
    program = torch.export.export(rope, (q, k), strict=False)
    with torch.no_grad():
        reference = rope(q, k)
    variants: dict[str, Callable[[], Any]] = {"complex_eager": lambda: rope(q, k)}
    results: dict[str, Any] = {}
    for name in ("rewrite", "retrace"):
        try:
            gm = graphs.tetrt_strategy(name).lower(program, (q, k), {})
        except Exception as e:  # noqa: BLE001
            results[f"lowered_{name}_eager"] = error_record(e)
            continue
        variants[f"lowered_{name}_eager"] = lambda gm=gm: gm(q, k)
        compiled = torch.compile(gm, backend="inductor", fullgraph=True)
        variants[f"lowered_{name}_inductor"] = lambda c=compiled: c(q, k)
    variants["complex_inductor"] = lambda c=torch.compile(rope, backend="inductor"): c(q, k)
    working: dict[str, Callable[[], Any]] = {}
    for name, fn in tqdm(variants.items(), desc="rope: first calls (inductor compiles)", unit="variant"):
        try:
            with torch.no_grad(), Stopwatch() as first:
                out = fn()
            results[name] = {"first_call_s": first.wall_s, "max_abs_error_vs_eager": max_abs_error(reference, out)}
            working[name] = fn
        except Exception as e:  # noqa: BLE001
            results[name] = error_record(e)
    errors: dict[str, BaseException] = {}
    with torch.no_grad():
        timings = time_round_robin(working, rounds=iters, warmup=1, errors=errors)
    for name, e in errors.items():
        results[name] = error_record(e)
    for name, timing in timings.items():
        results[name]["median_s"] = timing.median_s
    base = results["complex_eager"]["median_s"]
    for r in results.values():
        if "median_s" in r:
            r["relative_to_complex_eager"] = r["median_s"] / base
    nbytes = 4 * (q.numel() + k.numel()) * 2  # read q, k; write two outputs
    return {
        "shape_q_k": [batch, seq, heads, head_dim],
        "dtype": "float32",
        "iters": iters,
        "bytes_moved": nbytes,
        "variants": results,
        "notes": "median_s: round-robin over variants after the first call and one warm-up call. first_call_s "
        "(the first call alone) of the first inductor variant also pays inductor's one-time start-up in this "
        "process, so first calls are not comparable with each other. complex_inductor: inductor has no complex "
        "codegen and falls back.",
    }


def run(sizes: LoweringSizes) -> dict[str, Any]:
    """Both measurements with ``sizes``, on ``sizes.threads`` torch threads (restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(sizes.threads)
    try:
        return {
            "machine": {"torch_threads": sizes.threads},  # what the file's machine record must say
            "lowering_time": bench_lowering(sizes.layers, sizes.repeats, sizes.repeats_large, sizes.large_from),
            "rope_runtime_cpu": bench_rope_runtime(*sizes.rope_shape, iters=sizes.rope_iters),
        }
    finally:
        torch.set_num_threads(threads)


def summary(result: dict[str, Any]) -> list[str]:
    """The lines a run prints when it is done."""
    low = result["lowering_time"]
    lines = [f"{name:28s} {1e3 * fit['seconds_per_layer']:8.2f} ms/layer  R^2={fit['r2']:.3f}" for name, fit in low["linear_fit"].items()]
    lines += [f"layers={r['layers']:3d}  rewrite / decompose_complex_in_graph = {r['rewrite_over_decompose']:.2f}" for r in low["rewrite_over_decompose"]]
    lines.append(f"target {low['target']}: {'met' if low['target_met'] else 'NOT met'}")
    for name, r in result["rope_runtime_cpu"]["variants"].items():
        lines.append(f"{name:28s} " + (f"{1e3 * r['median_s']:8.2f} ms  x{r['relative_to_complex_eager']:.2f}" if "median_s" in r else r["error"]))
    return lines
