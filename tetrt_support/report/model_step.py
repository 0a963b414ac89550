"""Tables and claims of the whole-model training-step benchmark.

Reads ``model_step_<device>.json`` (:mod:`benchmarks.model_step`): a Llama-3-style decoder
trained by ``torch.compile(model)`` in bf16, torchao's float8 and this project's recipes.
As everywhere in :mod:`tetrt_support.report`, a claim is a ratio of two figures of one
case of one run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tetrt_support.report.tables import Table
from tetrt_support.report.training import COLORS, PEER

__all__ = ["LOSS_TOLERANCE", "case_label", "inline_case_lines", "inline_decoder_lines", "inline_error_lines",
           "inline_linear_lines", "model_step_claims", "model_step_table", "plot_model_step"]

#: the issue's bar for the loss after the run: within 1 % of bf16's
LOSS_TOLERANCE = 0.01


def _cases(result: Mapping[str, Any], suite: str) -> dict[str, Any]:
    return {name: entry for name, entry in result["suites"].get(suite, {}).get("cases", {}).items()
            if "variants" in entry}


def case_label(entry: Mapping[str, Any]) -> str:
    """``"4 layers, hidden 4096, FFN 14336, 2048 tokens"``: what a case trains."""
    config = entry["config"]
    return (f"{config['layers']} layers, hidden {config['hidden']}, FFN {config['ffn']}, "
            f"{entry['tokens']} tokens")


def model_step_table(result: Mapping[str, Any], case: str, suite: str = "model_step") -> Table:
    """One case's variants: step ms, speed against bf16, host ms per step (one step issued
    onto an idle GPU), peak memory, the first step's wall time (the compile) and the loss
    after the run against bf16's."""
    entry = _cases(result, suite)[case]
    rows = []
    for name, v in entry["variants"].items():
        if "median_ms" not in v:
            rows.append([name, "failed" if "error" in v else "-", "", "", "", "", ""])
            continue
        host, peak = v.get("host_ms_per_step"), v.get("peak_memory_gib")
        loss = v.get("loss_rel_diff_vs_bf16")
        rows.append([name, f"{v['median_ms']:.2f}", f"{v.get('speedup_vs_bf16', float('nan')):.3f}x",
                     "" if host is None else f"{host:.1f}", "" if peak is None else f"{peak:.2f}",
                     f"{v['first_step_s']:.0f}" if "first_step_s" in v else "",
                     "" if loss is None else f"{100 * loss:+.2f}%"])
    headers = ["variant", "step ms", "vs bf16", "host ms", "peak GiB", "1st step s", "loss vs bf16"]
    return Table(rows, headers, title=f"{case}: {case_label(entry)}, {result['machine'].get('gpu', 'cpu')}")


def model_step_claims(result: Mapping[str, Any], case: str, suite: str = "model_step") -> list[str]:
    """One line per claim the notebook makes of a case, each from the file: which variants
    are faster than bf16 and than torchao, whose host time exceeds torchao's, whose peak
    memory exceeds bf16's, and whose loss after the run is more than 1 % from bf16's; a
    quantized variant is named with the step its Linears compiled to where the file says."""
    variants = _cases(result, suite)[case]["variants"]
    timed = {n: v for n, v in variants.items() if "median_ms" in v}
    peer = timed.get(PEER, {})
    bf16 = timed.get("bf16", {})
    lines = []
    for name, v in timed.items():
        if name in ("bf16", PEER):
            continue
        step = v.get("compiled_step")
        parts = [f"{name}" + (f" ({step})" if step and not name.endswith(f"+{step}") else "")
                 + f": {v['speedup_vs_bf16']:.3f}x bf16"]
        if "speedup_vs_bf16" in peer:
            parts.append(f"{v['speedup_vs_bf16'] / peer['speedup_vs_bf16']:.3f}x torchao's speed")
        if v.get("host_ms_per_step") is not None and peer.get("host_ms_per_step"):
            parts.append(f"host {v['host_ms_per_step'] / peer['host_ms_per_step']:.2f}x torchao's")
        if v.get("peak_memory_gib") is not None and bf16.get("peak_memory_gib"):
            parts.append(f"peak memory {v['peak_memory_gib'] / bf16['peak_memory_gib']:.3f}x bf16's")
        loss = v.get("loss_rel_diff_vs_bf16")
        if loss is not None:
            verdict = "within" if abs(loss) <= LOSS_TOLERANCE else "OUTSIDE"
            parts.append(f"loss {100 * loss:+.2f}% ({verdict} 1% of bf16's)")
        lines.append("; ".join(parts))
    return lines


def inline_decoder_lines(check: Mapping[str, Any], recipe: str = "fp8_current") -> list[str]:
    """One line per way ``scripts/gpu_check.py --only inline_decoder`` ran a tiny decoder
    converted to ``recipe``: its loss, and the parameters whose gradient came out zero or
    missing, against the custom ops run eagerly."""
    runs = check.get(f"inline_{recipe}_decoder", {})
    lines = []
    for name, run in runs.items():
        if "error" in run:
            lines.append(f"{name}: failed ({run['error']})")
            continue
        zero = run.get("zero_or_missing_grads", [])
        total = len(run.get("grad_norms", {}))
        worst = run.get("max_rel_norm_diff")
        lines.append(f"{name}: loss {run['loss']:.4f}; zero or missing gradients: {len(zero)} of {total} parameters"
                     + (f" ({', '.join(z.rsplit('.', 2)[-2] for z in zero)})" if zero else "")
                     + ("" if worst is None else f"; largest gradient-norm difference {worst:.4f}"))
    return lines


def inline_case_lines(check: Mapping[str, Any], recipe: str = "fp8_current") -> list[str]:
    """One line per use of one inline ``recipe`` Linear that ``scripts/gpu_check.py --only
    inline_cases`` compiled with aot_eager: whether its weight and input gradient norms equal
    the same call run eagerly, and both pairs where they do not."""
    lines = []
    for name, row in check.get(f"inline_{recipe}_cases", {}).items():
        if row.get("equal"):
            lines.append(f"{name}: aot_eager gradients equal eager's")
            continue
        lines.append(f"{name}: aot_eager (weight, input) gradient norms {_pair(row.get('aot_eager'))}, "
                     f"eager {_pair(row.get('eager'))}")
    return lines


def inline_linear_lines(check: Mapping[str, Any], recipe: str = "fp8_current") -> list[str]:
    """One line per shape ``scripts/gpu_check.py --only inline`` ran one ``recipe`` Linear
    through the compiled inline step (inductor) against the custom ops run eagerly: which of
    y, dgrad, wgrad (dbias) are equal byte for byte, and the count of differing elements
    where not."""
    lines = []
    for row in check.get(f"inline_{recipe}", []):
        t, k, n = row["shape"]
        equal = row["equal"]
        same = [name for name, ok in equal.items() if ok]
        differ = [f"{name} ({row['mismatches'][name]} elements)" for name, ok in equal.items() if not ok]
        lines.append(f"{t} x {k} -> {n}{', bias' if row['bias'] else ''}: "
                     + (f"equal bytes: {', '.join(same)}" if same else "no output equal")
                     + (f"; differ: {', '.join(differ)}" if differ else ""))
    return lines


def inline_error_lines(check: Mapping[str, Any]) -> list[str]:
    """What stopped ``scripts/gpu_check.py --only inline`` (its error and the frames of this
    repository it passed through, innermost last), or nothing when it ran through."""
    error = check.get("inline_error")
    if not error:
        return []
    return [f"inline check stopped: {error}"] + [f"  at {frame}" for frame in check.get("inline_error_package_frames", [])]


def _pair(norms: Any) -> str:
    if isinstance(norms, list):
        return "(" + ", ".join(f"{v:.4g}" for v in norms) + ")"
    return f"failed ({norms})"


#: the quantities :func:`plot_model_step` draws: (variant field, axis label)
PLOTTED = (("speedup_vs_bf16", "speed vs bf16 (x)"), ("host_ms_per_step", "host ms per step"),
           ("peak_memory_gib", "peak memory (GiB)"))


def plot_model_step(axes: Any, result: Mapping[str, Any], suite: str = "model_step",
                    variants: tuple[str, ...] | None = None) -> None:
    """One panel per quantity of :data:`PLOTTED` (``axes``: as many), grouped bars per case:
    each compiled variant's speed against bf16, host time per step and peak memory (eager
    variants and failed ones are left out; a variant not run in a case leaves a gap)."""
    cases = _cases(result, suite)
    names = variants or tuple(dict.fromkeys(
        v for entry in cases.values() for v, row in entry["variants"].items()
        if "median_ms" in row and not v.endswith("_eager")))
    width = 0.84 / max(len(names), 1)
    for ax, (field, label) in zip(axes, PLOTTED):
        for i, name in enumerate(names):
            xs, ys = [], []
            for j, entry in enumerate(cases.values()):
                value = entry["variants"].get(name, {}).get(field)
                if value is not None:
                    xs.append(j + (i - (len(names) - 1) / 2) * width)
                    ys.append(value)
            base = name.split("+")[0]
            ax.bar(xs, ys, width * 0.92, label=name.replace(PEER, "torchao float8"), color=COLORS.get(base),
                   hatch="//" if "+" in name else None, edgecolor="white" if "+" in name else None)
        if field == "speedup_vs_bf16":
            ax.axhline(1.0, color="k", linestyle=":", linewidth=1)
        ax.set_xticks(range(len(cases)), [f"{c}\n{case_label(e).split(', ', 1)[1]}" for c, e in cases.items()],
                      fontsize=8)
        ax.set_ylabel(label)


def host_cost_table(result: Mapping[str, Any]) -> Table:
    """``benchmarks/host_cost.py``'s file: per variant, the Python calls and ATen operators of
    one compiled Linear training step, its median wall time on the file's device, and which
    step a quantized Linear compiled to where the file records it."""
    section = result["host_cost"]
    size = section["size"]
    variants = section["variants"]
    steps = any("compiled_step" in v for v in variants.values())
    rows = [[name, f"{v['python_calls_per_step']:.0f}", f"{v['aten_ops_per_step']:.0f}",
             f"{v['wall_us_per_step']:.0f}", *([v.get("compiled_step", "-")] if steps else [])]
            for name, v in variants.items()]
    rows += [[name, "skipped", "", "", *([""] if steps else [])] for name in section.get("skipped", {})]
    device = str(result.get("machine", {}).get("device", "cpu")).upper()
    title = (f"one Linear step, {size['tokens']}x{size['in_features']}->{size['out_features']}, "
             f"torch {section['torch']}, {device}")
    return Table(rows, ["variant", "Python calls", "ATen ops", "wall us", *(["step"] if steps else [])], title=title)


def host_cost_claims(result: Mapping[str, Any]) -> list[str]:
    """Each recipe's default (``compile_as="auto"``) step against its custom ops and against
    torchao, from the file; where the default took the custom ops, that is what is said."""
    rows = result["host_cost"]["variants"]
    peer = rows.get(PEER)
    lines = []
    for recipe in ("fp8_current", "fp8_block"):
        auto, ops = rows.get(recipe), rows.get(f"{recipe}+custom_ops")
        if auto is None or ops is None:
            continue
        taken = auto.get("compiled_step")
        if taken is None:
            line = (f"{recipe}: {auto['python_calls_per_step']:.0f} Python calls a step, its custom ops "
                    f"{ops['python_calls_per_step']:.0f} (this file does not record which step "
                    "compile_as='auto' took)")
        elif taken != "inline":
            line = (f"{recipe}: compile_as='auto' took the {taken} here (the inline step is not verified "
                    f"on this device or does not fit the shape): {auto['python_calls_per_step']:.0f} Python "
                    "calls a step")
        else:
            line = (f"{recipe}: the inline step makes {auto['python_calls_per_step']:.0f} Python calls a "
                    f"step where its custom ops make {ops['python_calls_per_step']:.0f} "
                    f"({ops['python_calls_per_step'] / auto['python_calls_per_step']:.1f}x), "
                    f"and runs {ops['wall_us_per_step'] / auto['wall_us_per_step']:.1f}x faster")
        if peer is not None:
            line += (f"; torchao makes {peer['python_calls_per_step']:.0f} "
                     f"({auto['python_calls_per_step'] - peer['python_calls_per_step']:+.0f})")
        lines.append(line)
    return lines
