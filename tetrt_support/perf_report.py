"""Reading stored benchmark results (``benchmarks/results/*.json``) for notebook 05.

Notebook 05 never measures: it replays files written by ``python -m benchmarks.perf``
(and ``benchmarks/lowering.py``), so its outputs only change when a file is regenerated.
Every claim is computed here from one file, as a ratio of two figures of the same run:
absolute times on shared machines are not comparable between runs.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

from tetrt_support.complex.analysis import format_table

# Targets of issue 6, stated as ratios within one run on the H200.
ROPE_TARGET = 0.97  # lowered RoPE compiled, fraction of a clone's bandwidth
FP8_LINEAR_TARGET = 0.70  # FP8 current-scaling Linear forward, fraction of raw _scaled_mm


def load_results(path: str | pathlib.Path) -> dict[str, Any]:
    """A results file written by ``python -m benchmarks.perf``; a clear error if it is not one."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `python -m benchmarks.perf --device ...` to write it")
    result = json.loads(path.read_text())
    missing = [key for key in ("machine", "suites") if key not in result]
    if missing:
        raise ValueError(f"{path} lacks {missing}: not written by benchmarks/perf.py")
    return result


def machine_line(result: Mapping[str, Any]) -> str:
    """Where and with what a file was measured, in one line."""
    m = result["machine"]
    where = m.get("gpu") or f"{m['processor']} CPU, {m['cpu_count']} cores, {m['torch_threads']} torch threads"
    extras = [f"torch {m['torch']}"] + [f"{k} {m[k]}" for k in ("triton", "transformers") if k in m]
    load = m.get("load_average_at_start")
    if load and not m.get("gpu"):
        extras.append(f"load average {load[0]:.1f} at start")
    return f"{where}; {', '.join(extras)}; measured {m['when_utc']}"


def _variants(result: Mapping[str, Any], suite: str) -> dict[str, Any]:
    section = result["suites"].get(suite)
    if section is None or "error" in section:
        raise KeyError(f"suite {suite!r} is missing or failed in this file: {section}")
    return section["variants"] if "variants" in section else section["cases"]


def rope_table(result: Mapping[str, Any]) -> str:
    """RoPE variants: time, bandwidth, fraction of a clone of the same bytes."""
    rows = []
    for name, v in _variants(result, "rope").items():
        if "median_s" in v:
            rows.append((name, f"{1e3 * v['median_s']:.3f}", f"{v['bandwidth_GBps']:.0f}", f"{v['fraction_of_clone_bandwidth']:.3f}"))
        else:
            rows.append((name, "failed", v.get("error", "?")[:60], ""))
    shape = result["suites"]["rope"]["shape_q_k"]
    return f"q, k of shape {shape}, float32\n" + format_table(rows, ("variant", "ms", "GB/s", "of clone"))


def attention_table(result: Mapping[str, Any]) -> str:
    rows = [(n, f"{1e3 * v['median_s']:.3f}", f"{v['relative_to_complex_eager']:.3f}") for n, v in _variants(result, "rope_attention").items() if "median_s" in v]
    s = result["suites"]["rope_attention"]
    head = f"attention block: batch {s['batch']}, seq {s['seq']}, hidden {s['hidden']}, {s.get('heads', '?')} heads, float32\n"
    return head + format_table(rows, ("variant", "ms", "x complex eager"))


def linear_table(result: Mapping[str, Any]) -> str:
    rows = []
    for name, v in _variants(result, "linear").items():
        if "median_s" in v:
            err = v.get("relative_error_vs_bf16")
            rows.append((name, f"{1e3 * v['median_s']:.3f}", _figure(v["TFLOPs"]), "" if err is None else f"{err:.4f}"))
    m, n, k = result["suites"]["linear"]["m_n_k"]
    return f"m=n=k: {m}x{n}x{k}, bf16 input\n" + format_table(rows, ("case", "ms", "TFLOP/s", "rel. err vs bf16"))


def _figure(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"


def bandwidth_series(result: Mapping[str, Any]) -> tuple[list[str], list[float]]:
    """(variant names, fraction of clone bandwidth) for a bar plot."""
    pairs = [(n, v["fraction_of_clone_bandwidth"]) for n, v in _variants(result, "rope").items() if "fraction_of_clone_bandwidth" in v]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def tflops_series(result: Mapping[str, Any]) -> tuple[list[str], list[float]]:
    pairs = [(n, v["TFLOPs"]) for n, v in _variants(result, "linear").items() if "TFLOPs" in v]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _verdict(result: Mapping[str, Any], value: float, target: float) -> str:
    # The targets were set for the H200; a CPU file gets the same figures without verdicts.
    if not result["machine"].get("gpu"):
        return ""
    return f" (target >= {target}): {'met' if value >= target else 'NOT met'}"


def rope_claims(result: Mapping[str, Any]) -> list[str]:
    """RoPE bandwidth fractions, the target verdicts, and the run's own noise yardstick."""
    frac = {n: v["fraction_of_clone_bandwidth"] for n, v in _variants(result, "rope").items() if "fraction_of_clone_bandwidth" in v}
    lines = [f"RoPE {name}: {frac[name]:.3f} of clone bandwidth{_verdict(result, frac[name], ROPE_TARGET)}"
             for name in sorted(n for n in frac if n.startswith("lowered_") and "compiled" in n)]
    for name in ("complex_eager", "complex_compiled", "real_handwritten_compiled", "real_handwritten_compiled_one_graph"):
        if name in frac:
            lines.append(f"RoPE {name}: {frac[name]:.3f} of clone bandwidth")
    hand = [frac[n] for n in ("real_handwritten_compiled", "real_handwritten_compiled_one_graph") if n in frac]
    if len(hand) == 2:
        lines.append("noise yardstick: the two hand-written variants (same arithmetic; q and k in two graphs or one) "
                     f"differ by {abs(hand[0] - hand[1]):.3f}")
    return lines


def linear_claims(result: Mapping[str, Any]) -> list[str]:
    """The FP8 Linear target and the headline throughput ratios."""
    ratios = result["suites"].get("linear", {}).get("ratios", {})
    lines = []
    r = ratios.get("fp8_current_forward_over_scaled_mm")
    if r is not None:
        lines.append(f"FP8 current-scaling Linear forward: {r:.3f} of raw torch._scaled_mm throughput, "
                     f"quantization included{_verdict(result, r, FP8_LINEAR_TARGET)}")
    for key in ("fp8_current_forward_cached_weight_over_scaled_mm", "fp8_scaled_mm_over_bf16",
                "fp8_current_forward_backward_over_bf16", "mxfp8_forward_over_bf16", "nvfp4_forward_over_bf16"):
        if key in ratios:
            lines.append(f"{key}: {ratios[key]:.3f}")
    return lines


def target_claims(result: Mapping[str, Any]) -> list[str]:
    """Every claim of one file: :func:`rope_claims` then :func:`linear_claims`."""
    return rope_claims(result) + linear_claims(result)
