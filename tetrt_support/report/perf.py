"""Tables and claims from the stored benchmark results.

Every claim is computed here from one file, as a ratio of two figures of the same run:
absolute times on shared machines are not comparable between runs. Files are read by
:func:`tetrt_support.report.results.load`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tetrt_support.report.results import is_smoke_run
from tetrt_support.report.tables import Table

__all__ = [
    "FP8_LINEAR_TARGET",
    "LLAMA4_TARGET",
    "ROPE_TARGET",
    "ROPE_VS_ONE_GRAPH_TARGET",
    "attention_table",
    "bandwidth_series",
    "gpu_check_claims",
    "linear_claims",
    "linear_table",
    "llama4_claims",
    "llama4_table",
    "llama4_title",
    "lowering_claims",
    "lowering_curves",
    "machine_line",
    "rope_claims",
    "rope_table",
    "target_claims",
    "tflops_series",
]

# The performance targets, stated as ratios within one run on an H200.
ROPE_TARGET = 0.97  # lowered RoPE compiled, fraction of a clone's bandwidth
# lowered RoPE compiled (no inductor freezing), fraction of the hand-written one-graph version's bandwidth
ROPE_VS_ONE_GRAPH_TARGET = 0.99
FP8_LINEAR_TARGET = 0.70  # FP8 current-scaling Linear forward, fraction of raw _scaled_mm
# mid-size Llama 4 through tetrt_support.compile(backend="inductor"): torch.compile's time over its time
LLAMA4_TARGET = 1.0

_SMOKE = "SMOKE RUN (--quick: small sizes, few repeats; not figures to quote)"


def machine_line(result: Mapping[str, Any]) -> str:
    """Where and with what a file was measured, in one line."""
    m = result["machine"]
    where = m.get("gpu") or f"{m['processor']} CPU, {m['cpu_count']} cores, {m['torch_threads']} torch threads"
    extras = [f"torch {m['torch']}"] + [f"{k} {m[k]}" for k in ("triton", "torchao", "transformers") if k in m]
    load = m.get("load_average_at_start")
    if load and not m.get("gpu"):
        extras.append(f"load average {load[0]:.1f} at start")
    line = f"{where}; {', '.join(extras)}; measured {m['when_utc']}"
    return f"{_SMOKE}: {line}" if is_smoke_run(result) else line


def gpu_check_claims(result: Mapping[str, Any]) -> list[str]:
    """``scripts/gpu_check.py``'s byte-for-byte verdict: how many cases equal the CPU reference,
    and the unequal ones counted by kernel family and input dtype (a case is named
    ``"<family> ... <rows>x<cols> <dtype> ..."``; the blockwise family with its block shape)."""
    cases = result["bit_identity"]
    if not cases:
        return ["scripts/gpu_check.py: no quantizer case in this file (its run left the quantizers part out)"]
    lines = [f"scripts/gpu_check.py: {sum(bool(c.get('ok')) for c in cases)} of {len(cases)} cases equal the CPU reference"]
    groups: dict[str, int] = {}
    for case in cases:
        if case.get("ok"):
            continue
        words = case["case"].split()
        family = " ".join(words[:2]) if words[0] == "blockwise" else words[0]
        dtype = next((w for w in words if w in ("bfloat16", "float32", "float16")), "input dtype not named")
        groups[f"{family}, {dtype}"] = groups.get(f"{family}, {dtype}", 0) + 1
    lines += [f"  not equal: {name}: {count} cases" for name, count in sorted(groups.items())]
    return lines



def gpu_check_kernel_table(result: Mapping[str, Any]) -> Table:
    """The kernel times ``scripts/gpu_check.py`` took (median of CUDA-graph replays): each
    quantize kernel on an 8192 x 4096 input x (the weight kernel on a 4096 x 4096 W) beside a
    bf16 copy of x, and the GEMMs of m, n, k = 8192, 4096, 4096. A kernel that failed shows
    its error; one that could not be captured in a graph (timed with its launches) says so."""
    times = result.get("kernel_times_8192x4096")
    if not times:
        raise KeyError("gpu_check file has no kernel_times_8192x4096 section (run without --skip times)")
    ungraphed = set(times.get("timed_without_graphs", ()))
    rows = []
    for name, v in times.items():
        if name == "timed_without_graphs":
            continue
        label = f"{name} (no graph)" if name in ungraphed else name
        if "us" not in v:
            rows.append((label, "-", v.get("error", "not timed")))
        else:
            unit = f"{v['GBps']:.0f} GB/s" if "GBps" in v else f"{v['TFLOPs']:.0f} TFLOP/s"
            rows.append((label, f"{v['us']:.1f}", unit))
    return Table(rows, ["kernel", "us", "throughput"], title="scripts/gpu_check.py kernel times")


def _variants(result: Mapping[str, Any], suite: str) -> dict[str, Any]:
    section = result["suites"].get(suite)
    if section is None or "error" in section:
        raise KeyError(f"suite {suite!r} is missing or failed in this file: {section}")
    return section["variants"] if "variants" in section else section["cases"]


def rope_table(result: Mapping[str, Any]) -> Table:
    """RoPE variants: time, bandwidth, fraction of a clone of the same bytes."""
    rows = []
    for name, v in _variants(result, "rope").items():
        if "median_s" in v:
            rows.append((name, f"{1e3 * v['median_s']:.3f}", f"{v['bandwidth_GBps']:.0f}", f"{v['fraction_of_clone_bandwidth']:.3f}"))
        else:
            rows.append((name, "failed", v.get("error", "?")[:60], ""))
    shape = result["suites"]["rope"]["shape_q_k"]
    return Table(rows, ("variant", "ms", "GB/s", "of clone"), title=f"q, k of shape {shape}, float32")


def attention_table(result: Mapping[str, Any]) -> Table:
    """The RoPE attention block: time per variant, relative to the complex original."""
    rows = [(n, f"{1e3 * v['median_s']:.3f}", f"{v['relative_to_complex_eager']:.3f}") for n, v in _variants(result, "rope_attention").items() if "median_s" in v]
    s = result["suites"]["rope_attention"]
    title = f"attention block: batch {s['batch']}, seq {s['seq']}, hidden {s['hidden']}, {s.get('heads', '?')} heads, float32"
    return Table(rows, ("variant", "ms", "x complex eager"), title=title)


def linear_table(result: Mapping[str, Any]) -> Table:
    """The quantized Linear cases: time, throughput, error against bf16."""
    rows = []
    for name, v in _variants(result, "linear").items():
        if "median_s" in v:
            err = v.get("relative_error_vs_bf16")
            rows.append((name, f"{1e3 * v['median_s']:.3f}", _figure(v["TFLOPs"]), "" if err is None else f"{err:.4f}"))
    m, n, k = result["suites"]["linear"]["m_n_k"]
    return Table(rows, ("case", "ms", "TFLOP/s", "rel. err vs bf16"), title=f"m=n=k: {m}x{n}x{k}, bf16 input")


def _figure(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"


def bandwidth_series(result: Mapping[str, Any]) -> tuple[list[str], list[float]]:
    """(variant names, fraction of clone bandwidth) for a bar plot."""
    pairs = [(n, v["fraction_of_clone_bandwidth"]) for n, v in _variants(result, "rope").items() if "fraction_of_clone_bandwidth" in v]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def tflops_series(result: Mapping[str, Any]) -> tuple[list[str], list[float]]:
    """(case names, TFLOP/s) for a bar plot."""
    pairs = [(n, v["TFLOPs"]) for n, v in _variants(result, "linear").items() if "TFLOPs" in v]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _verdict(result: Mapping[str, Any], value: float, target: float) -> str:
    # The targets were set for the H200; a CPU file gets the same figures without verdicts.
    if not result["machine"].get("gpu"):
        return ""
    return f" (target >= {target}): {'met' if value >= target else 'NOT met'}"


def rope_claims(result: Mapping[str, Any]) -> list[str]:
    """RoPE bandwidth fractions, the lowered graphs against the hand-written one-graph version
    (compiled without freezing), the target verdicts, and the run's own noise yardstick."""
    frac = {n: v["fraction_of_clone_bandwidth"] for n, v in _variants(result, "rope").items() if "fraction_of_clone_bandwidth" in v}
    lowered = sorted(n for n in frac if n.startswith("lowered_") and "compiled" in n) + sorted(
        n for n in frac if n.startswith("tetrt_compile_"))
    lines = [f"RoPE {name}: {frac[name]:.3f} of clone bandwidth{_verdict(result, frac[name], ROPE_TARGET)}"
             for name in lowered]
    for name in ("complex_eager", "complex_compiled", "real_handwritten_compiled", "real_handwritten_compiled_one_graph"):
        if name in frac:
            lines.append(f"RoPE {name}: {frac[name]:.3f} of clone bandwidth")
    one_graph = frac.get("real_handwritten_compiled_one_graph")
    without_freezing = [n for n in lowered if not n.endswith("_frozen")]
    for name in without_freezing if one_graph else ():
        ratio = frac[name] / one_graph
        lines.append(f"RoPE {name} / real_handwritten_compiled_one_graph: {ratio:.3f}"
                     f"{_verdict(result, ratio, ROPE_VS_ONE_GRAPH_TARGET)}")
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
    """Every claim of one perf file: :func:`rope_claims` then :func:`linear_claims`."""
    lines = rope_claims(result) + linear_claims(result)
    return [_SMOKE, *lines] if is_smoke_run(result) else lines


# --------------------------------------------------------------------------------------
# The lowering benchmark (benchmarks/lowering.py)
# --------------------------------------------------------------------------------------


def lowering_curves(results: Mapping[str, Any]) -> dict[str, tuple[list[int], list[float]]]:
    """Per strategy: the layer counts and median lowering seconds it has measurements for."""
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for row in results["lowering_time"]["rows"]:
        for name, entry in row["strategies"].items():
            if "median_s" in entry:
                layers, seconds = curves.setdefault(name, ([], []))
                layers.append(row["layers"])
                seconds.append(entry["median_s"])
    return curves


def lowering_claims(results: Mapping[str, Any]) -> list[str]:
    """Stable one-line statements about a stored lowering run (for notebook output).

    Raw seconds vary run to run; these lines only change when the stored file does.
    """
    low = results["lowering_time"]
    curves = lowering_curves(results)
    m = results["machine"]
    lines = [_SMOKE] if is_smoke_run(results) else []
    lines.append(f"measured on {m['platform']}, torch {m['torch']}, {m['cpu_count']} CPUs")
    for name, fit in low["linear_fit"].items():
        lines.append(f"{name}: {1e3 * fit['seconds_per_layer']:.1f} ms per layer, linear fit R^2 = {fit['r2']:.3f}")
    if "rewrite" in curves and "retrace" in curves:
        faster = all(a < b for a, b in zip(curves["rewrite"][1], curves["retrace"][1]))
        lines.append(f"rewrite faster than retrace at every size: {faster}")
    for r in low["rewrite_over_decompose"]:
        lines.append(f"{r['layers']:>2} layers: rewrite / decompose_complex_in_graph = {r['rewrite_over_decompose']:.2f}")
    lines.append(f"target ({low['target']}) met: {low['target_met']}")
    for row in low["rows"]:
        errors = [f"{k}: {e['error']}" for k, e in row["strategies"].items() if "error" in e]
        lines += [f"{row['layers']} layers, failed: {e}" for e in errors]
    rope = results["rope_runtime_cpu"]
    for name, r in rope["variants"].items():
        if "median_s" in r:
            lines.append(f"RoPE {rope['shape_q_k']} {name}: {r['relative_to_complex_eager']:.2f}x complex eager time")
    return lines


# --------------------------------------------------------------------------------------
# The mid-size Llama 4 benchmark (benchmarks/llama4.py)
# --------------------------------------------------------------------------------------


def _llama4_section(result: Mapping[str, Any]) -> Mapping[str, Any]:
    section = result.get("llama4")
    if section is None or "error" in section:
        raise KeyError(f"suite 'llama4' is missing or failed in this file: {section}")
    return section


def llama4_title(result: Mapping[str, Any]) -> str:
    """The model and input of a ``llama4`` file, in one line."""
    c = _llama4_section(result)["config"]
    return (f"Llama 4 text: {c['layers']} layers, hidden {c['hidden_size']}, {c['num_attention_heads']} heads of "
            f"{c['head_dim']} ({c['num_key_value_heads']} KV), MLP {c['intermediate_size_mlp']}, vocab "
            f"{c['vocab_size']}; {c['batch']} x {c['seq']} tokens, {c['dtype']}")


def llama4_table(result: Mapping[str, Any]) -> Table:
    """Each variant of the Llama 4 forward: time; speed against ``torch.compile`` (its time over
    the variant's); seconds to the first result (compile and first call, export not counted);
    blocks; the logit error, relative to the largest logit, against eager bf16 and eager fp32."""
    rows = []
    for name, v in _llama4_section(result)["variants"].items():
        if "median_s" not in v:
            rows.append((name, "failed", v.get("error", "?")[:60], "", "", ""))
            continue
        to_first = v["first_call_s"] + v.get("compile_s", 0.0) if name != "eager" else None
        blocks = v.get("blocks_summary", "").replace(" blocks", "").replace(" block", "")
        rows.append((name, f"{1e3 * v['median_s']:.3f}", f"{v['speed_vs_torch_compile']:.3f}",
                     "" if to_first is None else f"{to_first:.1f}", blocks,
                     f"{v['max_rel_error_vs_eager_bf16']:.2g} / {v['max_rel_error_vs_eager_fp32']:.2g}"))
    headers = ("variant", "ms", "vs torch.compile", "compile s", "blocks", "err bf16 / fp32")
    return Table(rows, headers, title=llama4_title(result))


def llama4_claims(result: Mapping[str, Any]) -> list[str]:
    """Each ``tetrt_compile_inductor_*`` variant against ``torch.compile`` of the complex
    original (:data:`LLAMA4_TARGET`), its blocks, and what failed; verdicts for GPU runs only."""
    variants = _llama4_section(result)["variants"]
    judged = bool(result["machine"].get("gpu")) and not is_smoke_run(result)
    lines = [_SMOKE] if is_smoke_run(result) else []
    if "export" in _llama4_section(result):
        lines.append(f"export failed: {_llama4_section(result)['export']['error']}")
    for name, v in variants.items():
        if "error" in v:
            lines.append(f"{name}: failed: {v['error']}")
        elif name.startswith("tetrt_compile") and "speed_vs_torch_compile" in v:
            speed = v["speed_vs_torch_compile"]
            verdict = f" (target >= {LLAMA4_TARGET}): {'met' if speed >= LLAMA4_TARGET else 'NOT met'}" if judged else ""
            lines.append(f"{name}: torch.compile's time / its time = {speed:.3f}{verdict}; {v['blocks_summary']}")
    eager = variants.get("eager", {}).get("speed_vs_torch_compile")
    if eager is not None:
        lines.append(f"eager (complex original): torch.compile's time / its time = {eager:.3f}")
    control = variants.get("torch_compile_again", {}).get("speed_vs_torch_compile")
    if control is not None:
        lines.append(f"A/A control: the same torch.compile'd model timed as a second variant = {control:.3f} "
                     f"(a ratio within {abs(1 - control):.3f} of 1 is within this run's spread)")
    if "export_s" in _llama4_section(result):
        lines.append(f"torch.export of the model, before tetrt_support.compile: {_llama4_section(result)['export_s']:.1f} s")
    return lines
