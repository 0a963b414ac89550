#!/usr/bin/env python3
"""How long does lowering complex arithmetic take, and what does the lowered RoPE cost to run?

Two measurements, written to ``benchmarks/results/lowering.json``:

1. Lowering time against model size: HF Llama 4 (tiny config, random weights) with 2 to 32
   layers, exported once per size, lowered by tetrt's ``"rewrite"`` (in-place FX rewrite)
   and ``"retrace"`` (Interpreter under make_fx) strategies and by torch's own
   ``decompose_complex_in_graph`` (torch >= 2.14). Median of a few repeats per size; a
   linear fit (seconds per layer, R^2) per strategy; the ratio rewrite / torch per size
   against the target ``rewrite <= 0.5 x decompose_complex_in_graph``. Every lowered graph
   is also checked against eager logits once per size.
2. Run time of the lowered RoPE (eager and inductor) against the complex original, on CPU
   at a modest size.

    python benchmarks/lowering.py                   # the full run (~5-8 min on 2 loaded cores)
    python benchmarks/lowering.py --layers 2 4 --repeats 2 --rope-iters 5   # a quick look

A script, not a test: timings on shared machines are noisy, so nothing here asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tetrt-bench-inductor-"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tetrt_support import zoo  # noqa: E402
from tetrt_support.complex import analysis  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent
DEFAULT_OUT = ROOT / "results" / "lowering.json"
TARGET_RATIO = 0.5  # rewrite should take at most half of decompose_complex_in_graph's time

Lowering = Callable[[torch.export.ExportedProgram, tuple, dict], Any]


def _tetrt(strategy: str) -> Lowering:
    def run(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> Any:
        from tetrt_support.complex import lower

        return lower(program, strategy=strategy)

    return run


STRATEGIES: dict[str, tuple[Lowering, bool]] = {  # name -> (lowering, called with flat inputs)
    "rewrite": (_tetrt("rewrite"), False),
    "retrace": (_tetrt("retrace"), False),
    "decompose_complex_in_graph": (analysis.torch_decompose_complex, True),
}


def machine() -> dict[str, Any]:
    import transformers

    return {
        "when_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.cuda.is_available(),
    }


def linear_fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares ``y = slope * x + intercept`` and its R^2."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    residual = float(((y - (slope * x + intercept)) ** 2).sum())
    total = float(((y - y.mean()) ** 2).sum())
    return {"seconds_per_layer": float(slope), "intercept_s": float(intercept), "r2": 1.0 - residual / total if total else 1.0}


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Collect, then keep the cyclic GC off while timing (as ``timeit`` does): a collection
    over the previous repeat's thousands of FX nodes otherwise lands in a random repeat."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def bench_lowering(layers: list[int], repeats: int, repeats_large: int, large_from: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    total = sum(repeats_large if n >= large_from else repeats for n in layers) * len(STRATEGIES)
    progress = tqdm(total=total, desc="lowering", unit="lowering")
    for n in layers:
        model = zoo.tiny_llama4(num_layers=n, with_moe=False, seed=0)
        start = time.perf_counter()
        program, args, kwargs = zoo.export_llama4(model, batch=2, seq=16)
        export_s = time.perf_counter() - start
        with torch.no_grad():
            reference = model(**kwargs)
        row: dict[str, Any] = {
            "layers": n,
            "export_s": export_s,
            "exported_call_function_nodes": sum(analysis.op_histogram(program).values()),
            "exported_complex_valued_nodes": len(analysis.complex_valued_nodes(program)),
            "strategies": {},
        }
        reps = repeats_large if n >= large_from else repeats
        # Repeats go round-robin over the strategies, so a burst of load from the other
        # processes on a shared machine hits all of them rather than one.
        times: dict[str, list[float]] = {name: [] for name in STRATEGIES}
        graphs: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for _ in range(reps):
            for name, (lower, _flat) in STRATEGIES.items():
                if name in errors:
                    continue
                graphs.pop(name, None)
                try:
                    with _no_gc():
                        t0 = time.perf_counter()
                        graphs[name] = lower(program, args, kwargs)
                        times[name].append(time.perf_counter() - t0)
                except Exception as e:  # noqa: BLE001 - record and go on: one broken strategy must not hide the others
                    errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                progress.update()
        for name, (_lower, flat) in STRATEGIES.items():
            entry: dict[str, Any] = {"repeats": reps}
            if name in errors:
                entry["error"] = errors[name]
            else:
                gm = graphs[name]
                with torch.no_grad():
                    out = gm(*pytree.tree_leaves((args, kwargs))) if flat else gm(*args, **kwargs)
                entry.update(
                    median_s=statistics.median(times[name]),
                    times_s=times[name],
                    call_function_nodes=sum(analysis.op_histogram(gm).values()),
                    complex_valued_nodes_left=len(analysis.complex_valued_nodes(gm)),
                    # torch's pass returns a plain dict where the model returned a ModelOutput: compare leaves.
                    max_abs_error_vs_eager=analysis.max_abs_error(reference, out),
                )
            row["strategies"][name] = entry
        rows.append(row)
    progress.close()

    fits, ratios = {}, []
    for name in STRATEGIES:
        ok = [(r["layers"], r["strategies"][name]["median_s"]) for r in rows if "median_s" in r["strategies"][name]]
        if len(ok) >= 2:
            fits[name] = linear_fit([x for x, _ in ok], [y for _, y in ok])
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


def _time_round_robin(fns: dict[str, Callable[[], Any]], iters: int) -> dict[str, float]:
    """Median seconds per call of each function, timed one call each in turn (not one after
    the other), so load from other processes spreads over all of them."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    with torch.no_grad():
        for _ in range(iters):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_rope_runtime(batch: int, seq: int, heads: int, head_dim: int, iters: int) -> dict[str, Any]:
    rope = zoo.ComplexRoPE(head_dim=head_dim, max_seq_len=seq).eval()
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(batch, seq, heads, head_dim, generator=g) for _ in range(2))
    program = torch.export.export(rope, (q, k), strict=False)
    with torch.no_grad():
        reference = rope(q, k)
    variants: dict[str, Callable[[], Any]] = {"complex_eager": lambda: rope(q, k)}
    results: dict[str, Any] = {}
    for strategy in ("rewrite", "retrace"):
        try:
            gm = _tetrt(strategy)(program, (q, k), {})
        except Exception as e:  # noqa: BLE001
            results[f"lowered_{strategy}_eager"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            continue
        variants[f"lowered_{strategy}_eager"] = lambda gm=gm: gm(q, k)
        compiled = torch.compile(gm, backend="inductor", fullgraph=True)
        variants[f"lowered_{strategy}_inductor"] = lambda c=compiled: c(q, k)
    variants["complex_inductor"] = lambda c=torch.compile(rope, backend="inductor"): c(q, k)
    working: dict[str, Callable[[], Any]] = {}
    for name, fn in tqdm(variants.items(), desc="rope: first calls (inductor compiles)", unit="variant"):
        try:
            t0 = time.perf_counter()
            with torch.no_grad():
                out = fn()
                fn()  # warm-up
            results[name] = {"first_call_s": time.perf_counter() - t0, "max_abs_error_vs_eager": analysis.max_abs_error(reference, out)}
            working[name] = fn
        except Exception as e:  # noqa: BLE001
            results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    for name, median in _time_round_robin(working, iters).items():
        results[name]["median_s"] = median
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
        "notes": "median_s: round-robin over variants after two warm-up calls. first_call_s of the first "
        "inductor variant also pays inductor's one-time start-up in this process, so first calls are "
        "not comparable with each other. complex_inductor: inductor has no complex codegen and falls back.",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=5, help="lowerings per size (median)")
    parser.add_argument("--repeats-large", type=int, default=3, help="lowerings per size from --large-from layers on")
    parser.add_argument("--large-from", type=int, default=16)
    parser.add_argument("--rope-shape", type=int, nargs=4, default=[2, 256, 8, 64], metavar=("BATCH", "SEQ", "HEADS", "HEAD_DIM"))
    parser.add_argument("--rope-iters", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads; 1 keeps timings stable on shared, loaded cores")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    started = time.perf_counter()
    result = {
        "machine": machine(),
        "lowering_time": bench_lowering(args.layers, args.repeats, args.repeats_large, args.large_from),
        "rope_runtime_cpu": bench_rope_runtime(*args.rope_shape, iters=args.rope_iters),
    }
    result["machine"]["benchmark_wall_s"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    low = result["lowering_time"]
    for name, fit in low["linear_fit"].items():
        print(f"{name:28s} {1e3 * fit['seconds_per_layer']:8.2f} ms/layer  R^2={fit['r2']:.3f}")
    for r in low["rewrite_over_decompose"]:
        print(f"layers={r['layers']:3d}  rewrite / decompose_complex_in_graph = {r['rewrite_over_decompose']:.2f}")
    print(f"target {low['target']}: {'met' if low['target_met'] else 'NOT met'}")
    for name, r in result["rope_runtime_cpu"]["variants"].items():
        print(f"{name:28s} " + (f"{1e3 * r['median_s']:8.2f} ms  x{r['relative_to_complex_eager']:.2f}" if "median_s" in r else r["error"]))


if __name__ == "__main__":
    main()
