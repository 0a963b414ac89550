"""Tables, plots and target verdicts of the training benchmarks.

Two results files: the quantized Linear's training step against bf16 and torchao
(``train_step_<device>.json``, :mod:`benchmarks.train_step`) and the loss study
(``loss_curves_<device>.json``, :mod:`benchmarks.loss_study`). As in
:mod:`tetrt_support.report.perf`, a claim is a ratio of two figures of one run, and a
verdict is stated only for a GPU file: the targets were set for an H200.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tetrt_support.report.tables import Table

__all__ = [
    "COLORS",
    "FORWARD_TARGETS",
    "LOSS_RECIPES",
    "PEER",
    "STEP_TARGETS",
    "bound_baselines",
    "bound_table",
    "clock_table",
    "final_loss_table",
    "forward_bound_table",
    "forward_table",
    "gemm_split_table",
    "loss_claim",
    "loss_file_contents",
    "missed_against_bounds",
    "missed_targets",
    "plot_loss_studies",
    "plot_loss_study",
    "profile_table",
    "plot_step_speedups",
    "running_mean",
    "step_speedups",
    "step_suites",
    "step_table",
    "step_target_table",
]

PEER = "torchao_float8_tensorwise"  # the benchmark-only peer: torchao's float8 training, tensorwise
LOSS_RECIPES = ("bf16", "fp8_current", "fp8_block", "mxfp8", "nvfp4")  # what the loss study trains
_SMALL, _LARGE = "8192x4096x4096", "16384x8192x8192"
# one colour per variant in every plot
COLORS = {"bf16": "black", PEER: "tab:gray", "fp8_current": "tab:blue", "fp8_block": "tab:orange",
          "mxfp8": "tab:green", "nvfp4": "tab:red", "fp8_current+custom_ops": "tab:cyan",
          "te_fp8_current": "tab:purple", "te_fp8_delayed": "tab:brown", "te_fp8_block": "tab:pink"}

# The step targets: speedup over bf16 (bf16 time / variant time) per variant and size T x K x N.
# MXFP8 and NVFP4 are emulated on Hopper (no tensor-core GEMM for them there).
STEP_TARGETS: dict[str, dict[str, float]] = {
    "fp8_current": {_SMALL: 1.35, _LARGE: 1.6},
    "fp8_block": {_SMALL: 1.2, _LARGE: 1.2},
    "mxfp8": {_SMALL: 0.75, _LARGE: 0.75},
    "nvfp4": {_SMALL: 0.75, _LARGE: 0.75},
}
# The FP8 current-scaling forward (quantization included) as a fraction of raw torch._scaled_mm.
FORWARD_TARGETS = {"fp8_current_forward": 0.90, "fp8_current_forward_cached_weight": 0.95}
_FORWARD_NAMES = {"fp8_current_forward": "FP8 forward / raw _scaled_mm",
                  "fp8_current_forward_cached_weight": "FP8 fwd, cached W / _scaled_mm"}

# The suites of the step, one per way of running it: torch.compile's default mode, its
# CUDA graphs (reduce-overhead: one graph per forward and per backward, each replay checked
# by the host) and the whole compiled step captured into one CUDA graph (the GPU's time
# with the host out of the way), each with the label the tables print for it.
_MODE_LABELS = {"train_step": "default", "train_step_reduce-overhead": "reduce-overhead",
                "train_step_cuda-graph-step": "one CUDA graph"}


def _is_gpu(result: Mapping[str, Any]) -> bool:
    return bool(result["machine"].get("gpu"))


def _sizes(result: Mapping[str, Any], suite: str) -> dict[str, Any]:
    section = result["suites"].get(suite)
    if section is None or "sizes" not in section:
        raise KeyError(f"this train_step file has no suite {suite!r} (it has {sorted(result['suites'])})")
    return section["sizes"]


def _size_label(size: str) -> str:
    t, k, n = size.split("x")
    return f"T={t}\nK={k}, N={n}"


def step_speedups(result: Mapping[str, Any], suite: str = "train_step") -> dict[str, dict[str, float]]:
    """variant -> size -> speedup over bf16 (bf16 step time / the variant's), measured variants only."""
    out: dict[str, dict[str, float]] = {}
    for size, entry in _sizes(result, suite).items():
        for variant, v in entry["variants"].items():
            if "speedup_vs_bf16" in v:
                out.setdefault(variant, {})[size] = v["speedup_vs_bf16"]
    return out


def step_table(result: Mapping[str, Any], suite: str = "train_step") -> Table:
    """Per variant (rows) and size: step time (CUDA events), speedup over bf16, and the host's
    time per step issued back to back (above the step time: the step is host-bound)."""
    sizes = _sizes(result, suite)
    variants: list[str] = []
    for entry in sizes.values():
        variants += [v for v in entry["variants"] if v not in variants]
    rows = []
    for variant in variants:
        row: list[str] = [variant]
        for entry in sizes.values():
            v = entry["variants"].get(variant, {})
            if "median_s" in v:
                host = v.get("host_ms_per_step")
                row += [f"{1e3 * v['median_s']:.3f}", f"{v['speedup_vs_bf16']:.3f}x", "" if host is None else f"{host:.2f}"]
            else:
                row += ["failed" if "error" in v else "-", "", ""]
        rows.append(row)
    headers = ["variant"] + [h for size in sizes for h in (f"ms, {size}", "vs bf16", "host ms")]
    return Table(rows, headers, title=f"training step (compiled Linear, forward + backward), {_mode_title(suite)}")


def _mode_title(suite: str) -> str:
    if suite == "train_step_cuda-graph-step":
        return "the whole step as one CUDA graph"
    return f"torch.compile mode {_MODE_LABELS.get(suite, suite)!r}"


def _verdict(value: float | None, target: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value >= target else "MISSED"


def step_suites(result: Mapping[str, Any]) -> list[str]:
    """The step suites this file holds (default mode first, then reduce-overhead, then the
    whole step as one CUDA graph)."""
    return [suite for suite in _MODE_LABELS if "sizes" in result["suites"].get(suite, {})]


def _target_rows(result: Mapping[str, Any]) -> list[tuple[str, str, float, dict[str, float | None]]]:
    """(target, size, needed, {suite: value}) for every target; the forward has one value."""
    suites = step_suites(result)
    speeds = {suite: step_speedups(result, suite) for suite in suites}
    rows = []
    for variant, targets in STEP_TARGETS.items():
        for size, needed in targets.items():
            rows.append((f"{variant} / bf16", size, needed,
                         {suite: speeds[suite].get(variant, {}).get(size) for suite in suites}))
    for size in STEP_TARGETS["fp8_current"]:
        def over_peer(s: Mapping[str, Mapping[str, float]]) -> float | None:
            mine, peer = s.get("fp8_current", {}).get(size), s.get(PEER, {}).get(size)
            return None if mine is None or peer is None else mine / peer
        rows.append(("fp8_current / torchao float8", size, 1.0, {suite: over_peer(speeds[suite]) for suite in suites}))
    forward = result["suites"].get("forward_vs_scaled_mm", {})
    for name, needed in FORWARD_TARGETS.items():
        value = forward.get("variants", {}).get(name, {}).get("throughput_vs_scaled_mm")
        size = "x".join(map(str, forward.get("m_n_k", ["?"])))
        rows.append((_FORWARD_NAMES[name], size, needed, {"train_step": value}))
    return rows


def step_target_table(result: Mapping[str, Any]) -> Table:
    """Every target with the measured ratio and verdict in each way the step was run (the
    forward is measured once, in the default column)."""
    gpu = _is_gpu(result)
    suites = step_suites(result)

    def cell(value: float | None, needed: float) -> str:
        if value is None:
            return "-"
        return f"{value:.3f}x {_verdict(value, needed)}" if gpu else f"{value:.3f}x"

    rows = [[name, size, f">= {needed}x", *(cell(values.get(suite), needed) for suite in suites)]
            for name, size, needed, values in _target_rows(result)]
    headers = ["ratio", "size", "needed"] + [_MODE_LABELS[suite] for suite in suites]
    title = "targets: the ratio and its verdict, within one run, per way of running the step"
    return Table(rows, headers, title=title + ("" if gpu else "; no verdicts: not a GPU file"))


def missed_targets(result: Mapping[str, Any]) -> list[str]:
    """One plain sentence per target the run missed in some way of running the step, with
    its figure in each (a target met in every way gets no line)."""
    if not _is_gpu(result):
        return ["no verdicts: the targets were set for an H200 and this file is not from a GPU"]
    lines = []
    for name, size, needed, values in _target_rows(result):
        measured = {suite: v for suite, v in values.items() if v is not None}
        if measured and all(v >= needed for v in measured.values()):
            continue
        figures = "; ".join(f"{_MODE_LABELS[suite]} {v:.3f}x ({_verdict(v, needed)})" for suite, v in measured.items())
        lines.append(f"MISSED {name} at {size}, target >= {needed}x: {figures or 'not measured'}")
    return lines or ["every target met in every way the step was run"]


def _measured_bounds(name: str, size: str, bounds: Mapping[str, Any]) -> dict[str, float]:
    """The bounds a step-bounds file measured for one target row ({} where it has none)."""
    section = bounds["suites"]["step_bounds"]
    if name.endswith(" / bf16"):
        recipe = section.get("sizes", {}).get(size, {}).get("recipes", {}).get(name.removesuffix(" / bf16"), {})
        return {"bound": recipe["bound_speedup_vs_bf16"]} if "bound_speedup_vs_bf16" in recipe else {}
    variant = {label: key for key, label in _FORWARD_NAMES.items()}.get(name)
    entry = section.get("forward", {}).get("variants", {}).get(variant, {})
    return {"bound": entry["bound_two_reads"], "one-read bound": entry["bound_one_read"]} if entry else {}


def missed_against_bounds(steps: Mapping[str, Any], bounds: Mapping[str, Any]) -> list[str]:
    """Each target a ``train_step`` file missed in EVERY way it ran the step, beside what a
    ``step_bounds`` file measured for it: above its bound (these GEMMs at this bandwidth
    cannot reach it, however fast the quantization), or within it (faster kernels could)."""
    if not (_is_gpu(steps) and _is_gpu(bounds)):
        return ["no verdicts: the targets were set for an H200 and these files are not both from a GPU"]
    lines = []
    for name, size, needed, values in _target_rows(steps):
        measured = [v for v in values.values() if v is not None]
        if not measured or max(measured) >= needed:
            continue
        found = _measured_bounds(name, size, bounds)
        if not found:
            lines.append(f"{name} at {size}: best {max(measured):.3f}x, {needed}x aimed; no bound measured")
            continue
        above = [label for label, b in found.items() if needed > b]
        judged = ", ".join(f"{label} {b:.3f}x" for label, b in found.items())
        verdict = (f"ABOVE the {' and the '.join(above)}" if above else "within the bound: faster kernels could reach it")
        lines.append(f"{name} at {size}: best {max(measured):.3f}x, {needed}x aimed; {judged}: {verdict}")
    return lines or ["every target met in at least one way the step was run"]


def clock_table(result: Mapping[str, Any]) -> Table:
    """Per step suite and size: the SM clock and power nvidia-smi sampled while the variants
    were timed, and the share of samples under the power cap (a capped step's time depends
    on the power its variant draws, so ratios move between runs)."""
    rows = []
    for suite in step_suites(result):
        for size, entry in _sizes(result, suite).items():
            c = entry.get("gpu_clocks") or {}
            if "sm_clock_mhz" not in c:
                rows.append([_MODE_LABELS[suite], size, c.get("error", "not recorded"), "", "", ""])
                continue
            mhz = c["sm_clock_mhz"]
            rows.append([_MODE_LABELS[suite], size, f"{mhz['median']:.0f}", f"{mhz['min']:.0f}-{mhz['max']:.0f}",
                         f"{c['power_w']['max']:.0f}", f"{c['clock_event_reasons_fraction'].get('sw power cap', 0.0):.0%}"])
    headers = ["mode", "size", "SM MHz (median)", "SM MHz (range)", "power W (max)", "samples at power cap"]
    return Table(rows, headers, title="GPU clock and power while the steps were timed (nvidia-smi, every 100 ms)")


def bound_baselines(result: Mapping[str, Any]) -> list[str]:
    """Per size of a ``step_bounds_<device>.json``: the bf16 step and the copy the bounds are
    measured against (the table gives ratios; these are the times behind them)."""
    lines = []
    for size, entry in result["suites"]["step_bounds"]["sizes"].items():
        times = entry["median_s"]
        if "bf16.step" not in times or "copy" not in times:
            lines.append(f"{size}: no bf16 step or copy timed (errors: {entry.get('errors') or 'none recorded'})")
            continue
        lines.append(f"{size}: bf16 step {1e3 * times['bf16.step']:.3f} ms, copy of the T x K input "
                     f"{1e6 * times['copy']:.1f} us ({entry['copy_GBps'] / 1e3:.2f} TB/s)")
    return lines


def bound_table(result: Mapping[str, Any]) -> Table:
    """Per size and recipe (a ``step_bounds_<device>.json``): the step's speedup over bf16,
    its GEMMs alone and its quantization alone as CUDA-graph replays; the quantization's
    floor (its bytes at copy speed) and the best speedup over bf16 the GEMMs allow, beside
    the target. A
    target above its bound cannot be met by faster quantization kernels. "target is": above
    or within its bound; "replay": whether the GEMM graph, replayed after every other, still
    gave the eager call's bytes."""
    gpu = _is_gpu(result)
    rows = []
    for size, entry in result["suites"]["step_bounds"]["sizes"].items():
        for recipe, r in entry["recipes"].items():
            if "bound_speedup_vs_bf16" not in r:
                rows.append([size, recipe, "failed" if "error" in r else "-", *[""] * 7])
                continue
            target = r.get("target_speedup_vs_bf16")
            verdict = "" if target is None or not gpu else (
                "above" if target > r["bound_speedup_vs_bf16"] else "within")
            rows.append([size, recipe, f"{r['speedup_vs_bf16']:.3f}x", f"{1e3 * r['gemms_s']:.3f}",
                         f"{1e3 * r['quantize_s']:.3f}", f"{1e3 * r['quantize_floor_s']:.3f}",
                         f"{r['bound_speedup_vs_bf16']:.3f}x", "-" if target is None else f"{target}x", verdict,
                         {True: "yes", False: "NO"}.get(r.get("gemms_replay_equals_eager"), "not checked")])
    headers = ["size", "recipe", "step vs bf16", "GEMMs ms", "quant ms", "floor ms", "bound", "target",
               "target is", "replay"]
    return Table(rows, headers, title="bound = bf16 step / (GEMMs + quant floor); replay: the GEMM graph, "
                 "replayed last, gave the eager bytes"
                 + ("" if gpu else "; no verdicts: not a GPU file"))


def gemm_split_table(result: Mapping[str, Any]) -> Table:
    """Per size and recipe (a ``step_bounds_<device>.json``): each of the step's three GEMM
    calls alone, as CUDA-graph replays, and the wgrad's time over the fprop's (the two do
    the same FLOPs)."""
    rows = []
    for size, entry in result["suites"]["step_bounds"]["sizes"].items():
        for recipe, r in entry["recipes"].items():
            split = r.get("gemm_s") or {}
            if None in split.values() or len(split) != 3:
                rows.append([size, recipe, "not timed", "", "", ""])
                continue
            rows.append([size, recipe, *(f"{1e3 * split[g]:.3f}" for g in ("fprop", "dgrad", "wgrad")),
                         f"{split['wgrad'] / split['fprop']:.2f}"])
    return Table(rows, ["size", "recipe", "fprop ms", "dgrad ms", "wgrad ms", "wgrad / fprop"],
                 title="the step's GEMM calls one at a time (operands quantized beforehand)")


def forward_bound_table(result: Mapping[str, Any]) -> Table:
    """The FP8 forward over raw ``_scaled_mm`` (a ``step_bounds_<device>.json``'s ``forward``
    section) beside the best ratios quantization at copy speed allows: with current
    scaling's two reads of each input, and with one read (any quantizer). "target is": above
    or within the two-read bound (no verdict off a GPU)."""
    section = result["suites"]["step_bounds"].get("forward")
    if not section:
        raise KeyError("no forward section in this step_bounds file (run the suite with a forward size)")
    gpu = _is_gpu(result)
    rows = []
    for name, v in section["variants"].items():
        target = v.get("target_vs_scaled_mm")
        measured = v.get("vs_scaled_mm")
        verdict = "" if target is None or not gpu else ("above" if target > v["bound_two_reads"] else "within")
        rows.append([_FORWARD_NAMES.get(name, name), "failed" if measured is None else f"{measured:.3f}",
                     f"{1e6 * v['floor_two_reads_s']:.1f}", f"{v['bound_two_reads']:.3f}",
                     f"{v['bound_one_read']:.3f}", "-" if target is None else f"{target}", verdict])
    m, n, k = section["m_n_k"]
    return Table(rows, ["variant", "measured", "floor us", "bound", "bound, 1 read", "target", "target is"],
                 title=f"m=n=k={m}: raw _scaled_mm {1e3 * section['median_s']['scaled_mm_raw']:.3f} ms, copy "
                       f"{section['copy_GBps'] / 1e3:.2f} TB/s; bound = scaled_mm / (scaled_mm + floor)"
                 + ("" if gpu else "; no verdicts: not a GPU file"))


def forward_table(result: Mapping[str, Any]) -> Table:
    """The FP8 forward (quantization included) against raw ``torch._scaled_mm`` on quantized operands."""
    section = result["suites"]["forward_vs_scaled_mm"]
    rows = [(name, f"{1e3 * v['median_s']:.3f}", f"{v['TFLOPs']:.0f}", f"{v['throughput_vs_scaled_mm']:.3f}")
            for name, v in section["variants"].items() if "median_s" in v]
    m, n, k = section["m_n_k"]
    return Table(rows, ("variant", "ms", "TFLOP/s", "of raw _scaled_mm"), title=f"FP8 forward, m={m}, n={n}, k={k}, bf16 input")


def profile_table(result: Mapping[str, Any], key: str, rows: int = 8) -> Table:
    """The top GPU kernels of one profiled step (``VARIANT@TxKxN``), per step, with the host time."""
    profiles = result["suites"].get("profiles", {})
    if key not in profiles or "kernels" not in profiles[key]:
        raise KeyError(f"no profile {key!r} in this file (it has {sorted(profiles)})")
    p = profiles[key]
    body = [(k["name"][:64], f"{k['us_per_step']:.1f}", f"{k['calls_per_step']:g}") for k in p["kernels"][:rows]]
    title = (f"{key}: GPU kernels {p['gpu_us_per_step']:.0f} us per step, host {p['host_ms_per_step']:.2f} ms per step "
             f"(over {p['steps']} steps)")
    return Table(body, ("kernel", "us per step", "calls per step"), title=title)


def host_breakdown_table(result: Mapping[str, Any]) -> Table:
    """Host microseconds per call of each layer of a step (``benchmarks.host_breakdown``)."""
    section = result["suites"].get("host_breakdown")
    if not section or "host_us_per_call" not in section:
        raise KeyError(f"no host breakdown in this file ({(section or {}).get('error', 'not measured')})")
    rows = [(name, f"{us:.0f}") for name, us in section["host_us_per_call"].items()]
    return Table(rows, ("what the host issues", "host us per call"),
                 title=f"host time per call, {section['recipe']} at {section['size']} (device waits excluded)")


def plot_step_speedups(ax: Any, result: Mapping[str, Any], suite: str = "train_step") -> None:
    """Grouped bars: speedup over bf16 per variant, one group per size; targets as black ticks."""
    speed = step_speedups(result, suite)
    sizes = list(_sizes(result, suite))
    variants = [v for v in speed if v != "bf16"]
    width = 0.8 / max(len(variants), 1)
    for i, variant in enumerate(variants):
        xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(sizes))]
        ys = [speed[variant].get(size, 0.0) for size in sizes]
        ax.bar(xs, ys, width * 0.92, label=variant.replace(PEER, "torchao float8"), color=COLORS.get(variant))
        for x, size in zip(xs, sizes):
            target = STEP_TARGETS.get(variant, {}).get(size)
            if target is not None:
                ax.plot([x - width / 2, x + width / 2], [target, target], color="k", linewidth=1.5)
    ax.axhline(1.0, color="k", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(sizes)), [_size_label(s) for s in sizes])
    ax.set_ylabel("speedup over bf16 (x)")
    ax.set_title(_mode_title(suite), fontsize=10)


# --------------------------------------------------------------------------------------
# The loss study
# --------------------------------------------------------------------------------------


def loss_file_contents(result: Mapping[str, Any]) -> list[str]:
    """What the file holds, exactly: the model, the data, and each recipe's steps (or error)."""
    s = result["setup"]
    lines = [f"{s['layers']} layer{'s' if s['layers'] != 1 else ''}, width {s['width']}, {s['heads']} heads, MLP {s['mlp']}; batch {s['batch']} x "
             f"sequence {s['seq']}; {s['steps']} {s['optimizer']} steps at lr {s['lr']}; data: {s['data']}; "
             f"lowest reachable loss (entropy rate) {s['entropy_rate_nats']:.4f} nats"]
    for recipe, entry in result["recipes"].items():
        if "losses" in entry:
            done = len(entry["losses"])
            note = "" if done == s["steps"] else f" (stopped early: of {s['steps']})"
            lines.append(f"{recipe}: {done} steps{note}")
        else:
            lines.append(f"{recipe}: failed: {entry.get('error', '?')}")
    missing = [r for r in LOSS_RECIPES if r not in result["recipes"]]
    lines.append(f"recipes not in the file: {', '.join(missing)}" if missing else "every recipe of the study is in the file")
    return lines


def running_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of the last ``window`` values at each step (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def final_loss_table(result: Mapping[str, Any], last: int = 20) -> Table:
    """Per recipe: steps, the mean of the last ``last`` losses, its distance to bf16 and to the entropy rate."""
    recipes = result["recipes"]
    floor = result["setup"]["entropy_rate_nats"]

    def final(entry: Mapping[str, Any]) -> float:
        tail = entry["losses"][-last:]
        return sum(tail) / len(tail)

    base = final(recipes["bf16"]) if "losses" in recipes.get("bf16", {}) else None
    rows = []
    for recipe, entry in recipes.items():
        if "losses" not in entry:
            rows.append((recipe, "failed", "", "", "", ""))
            continue
        value = final(entry)
        rows.append((recipe, len(entry["losses"]), f"{value:.4f}", "" if base is None else f"{value - base:+.4f}",
                     f"{value - floor:.4f}", f"{entry['wall_s']:.1f}"))
    headers = ("recipe", "steps", f"mean of last {last}", "minus bf16", "above entropy rate", "wall s (eager)")
    return Table(rows, headers, title=f"final loss, {_where(result)}")


def loss_claim(result: Mapping[str, Any], last: int = 20) -> str:
    """How far the recipes end from bf16: the largest gap of the mean of the last ``last`` losses."""
    finals = {r: sum(e["losses"][-last:]) / len(e["losses"][-last:]) for r, e in result["recipes"].items() if "losses" in e}
    if "bf16" not in finals or len(finals) < 2:
        return f"{_where(result)}: no bf16 run and another recipe to compare"
    diverged = [r for r, v in finals.items() if not math.isfinite(v)]
    gaps = {r: v - finals["bf16"] for r, v in finals.items() if r != "bf16" and r not in diverged}
    if not gaps:
        return f"{_where(result)}: diverged (a non-finite loss): {', '.join(diverged)}"
    furthest = max(gaps, key=lambda r: abs(gaps[r]))
    line = (f"{_where(result)}: every recipe ends within {abs(gaps[furthest]):.4f} nats of bf16 (mean of the last "
            f"{last}); furthest: {furthest} ({gaps[furthest]:+.4f})")
    return line.replace("every recipe", "every other recipe") + f"; diverged: {', '.join(diverged)}" if diverged else line


def _where(result: Mapping[str, Any]) -> str:
    m = result["machine"]
    return m["gpu"] if m.get("gpu") else f"CPU ({m['cpu_count']} cores)"


def plot_loss_study(axes: Sequence[Any], result: Mapping[str, Any], window: int = 20) -> None:
    """Left: every recipe's loss (running mean over ``window`` steps) and the entropy rate;
    right: each recipe's running-mean loss minus bf16's, where the recipes differ."""
    curves, diff = axes
    recipes = {r: e["losses"] for r, e in result["recipes"].items() if "losses" in e}
    smooth = {r: running_mean(losses, window) for r, losses in recipes.items()}
    for recipe, values in smooth.items():
        curves.plot(range(1, len(values) + 1), values, label=recipe, linewidth=1.2, color=COLORS.get(recipe))
    curves.axhline(result["setup"]["entropy_rate_nats"], color="k", linestyle=":", linewidth=1)
    curves.set_xlabel("step")
    curves.set_ylabel(f"loss (nats, mean of {window})")
    curves.set_title(f"{_where(result)}: loss; dotted: entropy rate", fontsize=10)
    if "bf16" in smooth:
        for recipe, values in smooth.items():
            if recipe != "bf16":
                n = min(len(values), len(smooth["bf16"]))
                diff.plot(range(1, n + 1), [a - b for a, b in zip(values[:n], smooth["bf16"][:n])], label=recipe,
                          linewidth=1.2, color=COLORS.get(recipe))
        diff.axhline(0.0, color="k", linewidth=1)
    diff.set_xlabel("step")
    diff.set_ylabel("loss minus bf16's (nats)")
    diff.set_title(f"{_where(result)}: distance to bf16", fontsize=10)


def plot_loss_studies(studies: Sequence[Mapping[str, Any]], window: int = 20) -> Any:
    """One row per loss-study file (e.g. the CPU run, then the H200 run), each with
    :func:`plot_loss_study`'s two panels; one legend for all, below. Returns the figure,
    8 in wide so it keeps to the page column."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(studies), 2, figsize=(8.0, 2.9 * len(studies) + 1.0), squeeze=False)
    for row, study in zip(axes, studies):
        plot_loss_study(row, study, window)
    for ax in axes[:-1].flat:
        ax.set_xlabel("")
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles))
    fig.suptitle(f"Training loss per recipe (running mean of {window} steps)\n"
                 "and its distance to bf16's, one row per machine")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig
