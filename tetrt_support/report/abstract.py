"""Each notebook's abstract: the question, the answer with its key figures, where each part is.

A notebook reads as a short paper, so its answer comes first. The words of each abstract
live here, once (:data:`ABSTRACTS`): the one-line ``answer`` is also the README's "answer"
column (``tests/report/test_abstract.py`` checks that they agree), and the ``detail``
sentences are a template whose figures a notebook's second code cell computes from its own
models or its stored benchmark files and fills in (:func:`show`). No figure of an abstract
is typed in markdown.

The ``figures_NN`` functions compute those figures with the helpers the notebook's body
uses. They print nothing raw that varies from run to run: errors are shown as bounds
(:func:`bound`), timings only as read from a stored results file.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tetrt_support.report.tables import OUTPUT_WIDTH

_FIELD = re.compile(r"\{(\w+)[^}]*\}")


@dataclasses.dataclass(frozen=True)
class Abstract:
    """The fixed words of one notebook's abstract.

    ``answer`` is one line (the README's answer column); ``detail`` is two or three
    sentences with ``{name}`` fields for the figures; ``sections`` are ``(section, what)``
    pairs, ``section`` being a heading number of the notebook (``"4"``) or ``"open"``.
    """

    notebook: str
    answer: str
    detail: str = ""
    sections: tuple[tuple[str, str], ...] = ()

    @property
    def fields(self) -> tuple[str, ...]:
        """The figure names ``detail`` needs, in order."""
        return tuple(dict.fromkeys(_FIELD.findall(self.detail)))

    def figures_in(self, text: str) -> dict[str, str] | None:
        """The figures a rendered abstract (:meth:`markdown`'s text) shows, read back by its
        template; None if ``text`` is not this abstract."""
        pattern, last = [], 0
        for match in re.finditer(r"\{(\w+)\}", self.detail):
            pattern += [re.escape(self.detail[last:match.start()]), f"(?P<{match.group(1)}>.+?)"]
            last = match.end()
        pattern.append(re.escape(self.detail[last:]))
        found = re.search(re.escape(self.answer) + r"\s*" + "".join(pattern) + r"(?:\n|$)", text)
        return found.groupdict() if found else None

    def markdown(self, figures: Mapping[str, Any]) -> str:
        missing = [f for f in self.fields if f not in figures]
        if missing:
            raise KeyError(f"{self.notebook}: the abstract needs the figures {missing}")
        unused = sorted(set(figures) - set(self.fields))
        if unused:
            raise KeyError(f"{self.notebook}: figures {unused} are not in the abstract")
        where = "; ".join(f"{'§' + s if s[0].isdigit() else s}: {what}" for s, what in self.sections)
        parts = [f"**Answer.** {self.answer} {self.detail.format(**figures)}".strip()]
        if where:
            parts.append(f"**Where.** {where}.")
        return "\n\n".join(parts)


class AbstractView:
    """What :func:`show` returns: markdown for Lab and the site, wrapped text for a terminal."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_markdown_(self) -> str:
        return self.text

    def __repr__(self) -> str:
        import textwrap

        plain = self.text.replace("**", "").replace("`", "")
        return "\n\n".join(textwrap.fill(p, OUTPUT_WIDTH) for p in plain.split("\n\n"))


ABSTRACTS: dict[str, Abstract] = {
    "01": Abstract(
        "01_rotary_embedding_complex_graphs",
        "Complex RoPE exports as complex ATen nodes that an engine without complex dtypes "
        "refuses; one rule per op on a packed `[..., 2]` layout lowers it to real arithmetic "
        "with the eager numbers and the exported call signature, by either strategy.",
        "Here the RoPE module's export holds {complex_nodes} complex-valued nodes; after "
        "lowering, rewrite leaves {left_rewrite} and retrace {left_retrace}; both keep the "
        "exported call signature ({signature}), and their largest error against eager is "
        "{error}. In the stored benchmark, "
        "lowering costs {rewrite_ms} ms (rewrite) and {retrace_ms} ms (retrace) per Llama 4 "
        "decoder layer.",
        (("2", "the complex graph"), ("3", "the engine's refusal"), ("4", "the rules"),
         ("5-6", "both strategies, on ONNX Runtime"), ("7", "HF Llama 4"),
         ("9", "torch's own pass"), ("10", "lowering time"), ("open", "what remains")),
    ),
    "02": Abstract(
        "02_codegen_restoration",
        "Yes, once the retrace runs with a plain `CodeGen` and the export's codegen is restored "
        "afterwards, complex inputs and outputs get adapters on the real engine graph, and "
        "block boundaries see the getitems of multi-output blocks.",
        "Of {cases} signature cases (each called by position and by keyword, both strategies), "
        "the compiler before the fix returned eager's result in {before} and the shipped one "
        "in {final}.",
        (("2-4", "the three failures and the flatten fix"), ("5", "the fix"),
         ("6-7", "complex inputs and outputs"), ("8", "the matrix"), ("9", "Llama 4 by keyword"),
         ("10", "save and load"), ("open", "what remains")),
    ),
    "03": Abstract(
        "03_opaque_quantizer_tracing",
        "A stateless quantizer with value semantics (equal by configuration, registered as an "
        "opaque value type) compiles once and is rebuilt in FX code from its fields; one with "
        "identity semantics recompiles on every fresh object.",
        "Over {steps} training steps, each with a fresh quantizer, identity semantics compiled "
        "{identity} frames and value semantics {value} (outputs equal to eager: {same}).",
        (("1", "counting compiles"), ("2", "the FX code"), ("3", "`hoist=True`"),
         ("4", "the hazards"), ("5", "each format's error"), ("open", "what remains")),
    ),
    "04": Abstract(
        "04_tensorproto_vs_make_empty_traceable",
        "Neither design wins on speed or graph quality: both give the same graphs, no graph "
        "break and bit-identical losses; they differ in where their invariants live.",
        "In the stored benchmark ({runs} runs, {breaks} graph breaks) the median compile CPU "
        "time of tensor_proto is {compile_low}-{compile_high}x make_empty_traceable's across "
        "backends, inside the {spread_low}-{spread_high} % by which two repeats of one "
        "configuration differ, and rebuilding a saved quantized "
        "tensor takes {proto_us} µs against {empty_us} µs.",
        (("1", "why the op returns flat buffers"), ("2", "the two designs"),
         ("3", "what Dynamo sees"), ("4", "the measurements"), ("5", "the verdict")),
    ),
    "05": Abstract(
        "05_performance",
        "On an H200, compiled lowered RoPE runs at a hand-written real version's speed and the "
        "quantized Linear's training step beats bf16 and torchao at the large size; with custom "
        "ops, small steps and a whole model under plain `torch.compile` are bound by the host, "
        "and the inline step, now checked on a GPU, takes that host time away.",
        "Lowered RoPE reaches {rope} of the hand-written one-graph version, and fp8_current's "
        "training step, run three ways, is {large}x bf16 at the large size ({vs_torchao}x "
        "torchao's speed) "
        "and, at the small size, {small_graph}x as one CUDA graph but {small_default}x in the "
        "default mode. In the whole decoder the custom-op fp8_current runs at {model}x bf16, "
        "torchao at {model_torchao}x and TransformerEngine's te.Linear at {te}x; the inline "
        "step ran at {inline}x but with a loss {inline_loss} off bf16's (torch 2.11's Dynamo "
        "zeroed its gradients). With the fix, checked on an H100, the inline fp8_current step "
        "runs there at {h100_inline}x bf16 beside torchao's {h100_torchao}x and the custom ops' "
        "{h100_ops}x, its loss {h100_inline_loss} off bf16's.",
        (("1", "RoPE against the roofline"), ("2", "the attention block and a mid-size Llama 4"),
         ("3", "the quantized Linear"), ("4", "the training step, its targets and bounds"),
         ("5", "a whole model"), ("6", "the loss curves of every recipe"),
         ("open", "what remains")),
    ),
    "06": Abstract(
        "06_hugging_face_sweep",
        "Yes for every family in the sweep: one engine block, no fallback, the model's own "
        "output class and eager's numbers, static and dynamic; the old pipeline's silent wrong "
        "answer is now computed right, and a build-time check would catch one like it.",
        "The stored sweep passes {passed} of {rows} rows over {families} families "
        "({engines}; both strategies).",
        (("1", "the sweep"), ("2", "the silent wrong answer and its guard"),
         ("3", "the FFT lowering"), ("4", "infinities and NaN"), ("5", "a block boundary"),
         ("6", "the caller's program"), ("7", "what is out of reach")),
    ),
    "07": Abstract(
        "07_quantizer_numerics",
        "Yes, against an independent restatement of TransformerEngine's algorithms: every "
        "quantizer writes TE's data, scale and amax bytes in TE's layouts, for every format and "
        "input family tried; TE's own kernels were not run.",
        "Of {compared} comparisons ({configurations} quantizer configurations, "
        "{families} input families, fp32 and bf16 input), {exact} are equal in every byte of "
        "every buffer, scale padding included. Where TE's Python reference and its kernels "
        "disagree on special values the kernels' rule is followed, except for the E2M1 code "
        "of -0.0.",
        (("1", "bytes per format"), ("2", "one worked block per format"),
         ("3", "TE's scale layouts"), ("4", "the rules that changed"), ("open", "what remains")),
    ),
    "08": Abstract(
        "08_torch_tensorrt_interface",
        "Yes: module, `ExportedProgram` and `torch.compile(backend=...)` calls, the options, "
        "`ExportedProgram` save and weight refit take Torch-TensorRT's names and defaults and "
        "give the eager model's numbers on Llama 4.",
        "Compiled from its `ExportedProgram` and from the module called by keyword, tiny "
        "Llama 4 runs as {engines} engine block(s) and {fallbacks} fallback block(s), and "
        "the largest error of either against eager is {error}.",
        (("1", "three ways in"), ("2", "the options"), ("3", "save and load"),
         ("4", "refit"), ("open", "what remains")),
    ),
    "09": Abstract(
        "09_quantized_training_across_ranks",
        "Yes, once the input's and the output gradient's amaxes are all-reduced over the "
        "Linear's `amax_reduction_group`: every rank then quantizes with one process's scales, "
        "in one compiled graph; FSDP2 and tensor parallelism then agree with one process to "
        "fp32 summation order. Run on gloo CPU ranks only, no GPU.",
        "On {ranks} gloo ranks, each with half of the batch, {differ} of the output's and "
        "input gradient's {bytes} bytes differ from one process's without the group, "
        "{differ_grouped} with it; the compiled step is {graphs} graph with {breaks} graph "
        "breaks and {reduces} all-reduces (forward and backward). FSDP2's losses over {steps} "
        "steps differ from one process's by {fsdp} (relative), tensor parallelism's results "
        "by {tp}. FSDP2's FP8 weight all-gather sends {fp8_bytes} bytes a step where the bf16 "
        "all-gather sends {bf16_bytes}, and trains {fp8_equal} as one process.",
        (("1", "the amax a shard sees"), ("2", "the fix"), ("3", "two ranks against one process"),
         ("4", "one compiled step"), ("5", "FSDP2"), ("6", "tensor parallelism"),
         ("7", "the FP8 weight all-gather"), ("open", "what remains")),
    ),
}


def bound(error: float) -> str:
    """A stable statement of an error: ``0 (bit-identical)``, or at most the next power of
    ten (``≤ 1e-6``)."""
    if error == 0:
        return "0 (bit-identical)"
    return f"≤ 1e{math.ceil(math.log10(error))}"


def share(count: int, total: int) -> str:
    """A stable statement of ``count`` out of ``total``: exact at none and at all (``0``,
    ``all``), otherwise the whole percent (``≈38%``).

    How many rounding-level results differ moved by one between ATen's AVX2 and AVX-512
    kernels, so a stored output states the share, not the exact count.
    """
    if count == 0:
        return "0"
    if count == total:
        return "all"
    return f"≈{round(100 * count / total)}%"


def show(number: str, **figures: Any) -> AbstractView:
    """Notebook ``number``'s abstract with ``figures`` filled in (a cell's value)."""
    return AbstractView(ABSTRACTS[number].markdown(figures))


# ------------------------------------------------------------------ the figures, per notebook


def figures_01(lowering_file: Any) -> dict[str, Any]:
    import torch

    from tetrt_support import zoo
    from tetrt_support.report import complex_graphs as graphs
    from tetrt_support.report import results

    model = zoo.build_model("complex_rope")
    program, args, kwargs = zoo.export_model("complex_rope", model=model)
    with torch.no_grad():
        reference = model(*args, **kwargs)
    reports = {r.strategy: r for r in graphs.compare_strategies(
        program, args, kwargs, [graphs.tetrt_strategy(s) for s in ("rewrite", "retrace")],
        reference=reference)}
    fits = results.load(lowering_file, "lowering")["lowering_time"]["linear_fit"]
    return {
        "complex_nodes": len(graphs.complex_valued_nodes(program)),
        "left_rewrite": reports["rewrite"].complex_valued,
        "left_retrace": reports["retrace"].complex_valued,
        "signature": "yes" if all(r.keeps_signature for r in reports.values()) else "NO",
        "error": bound(max(r.max_abs_error for r in reports.values())),
        "rewrite_ms": f"{1e3 * fits['rewrite']['seconds_per_layer']:.1f}",
        "retrace_ms": f"{1e3 * fits['retrace']['seconds_per_layer']:.1f}",
    }


def figures_02() -> dict[str, Any]:
    from tetrt_support.history import BEFORE_FIX, FINAL, signature_matrix

    rows = signature_matrix([BEFORE_FIX, FINAL])
    return {"cases": len(rows), "before": sum(r[1] == "✓" for r in rows),
            "final": sum(r[2] == "✓" for r in rows)}


def figures_03(steps: int = 5) -> dict[str, Any]:
    from tetrt_support.quant import MXFP8Quantizer
    from tetrt_support.report.quant_tracing import IdentityMXFP8Quantizer, compiles_over_steps

    identity = compiles_over_steps(IdentityMXFP8Quantizer, IdentityMXFP8Quantizer, steps)
    value = compiles_over_steps(MXFP8Quantizer, MXFP8Quantizer, steps)
    return {"steps": steps, "identity": identity[0], "value": value[0],
            "same": "yes" if identity[2] and value[2] else "NO"}


def figures_04(bench: Mapping[str, Any]) -> dict[str, Any]:
    summary = bench["summary"]
    backends = sorted(summary["tensor_proto"])

    def ratio(key: str, backend: str) -> float:
        return summary["tensor_proto"][backend][key] / summary["make_empty_traceable"][backend][key]

    compile_ratios = [ratio("compile_cpu_s_median", be) for be in backends]
    reassemble = {name: [summary[name][be]["reassemble_us_median"] for be in backends]
                  for name in ("tensor_proto", "make_empty_traceable")}
    from tetrt_support.report.results import repeat_spread

    spread = repeat_spread(bench["rows"], "compile_cpu_s", ("strategy", "backend", "recipe"))
    return {"spread_low": f"{spread[0]:.0f}", "spread_high": f"{spread[1]:.0f}",
            "runs": len(bench["rows"]), "breaks": sum(r["graph_breaks"] for r in bench["rows"]),
            "compile_low": f"{min(compile_ratios):.2f}", "compile_high": f"{max(compile_ratios):.2f}",
            "proto_us": _range(reassemble["tensor_proto"]),
            "empty_us": _range(reassemble["make_empty_traceable"])}


def _range(values: list[float]) -> str:
    low, high = round(min(values)), round(max(values))
    return f"{low}" if low == high else f"{low}-{high}"


def figures_05(cuda: Mapping[str, Any], steps: Mapping[str, Any], model_run: Mapping[str, Any],
               h100_run: Mapping[str, Any], case: str = "8b_2048") -> dict[str, Any]:
    from tetrt_support.report import training
    from tetrt_support.report.perf import bandwidth_series

    frac = dict(zip(*bandwidth_series(cuda)))
    one_graph = frac["real_handwritten_compiled_one_graph"]
    lowered = [frac[n] / one_graph for n in frac
               if (n.startswith("lowered_") and n.endswith("compiled")) or n.startswith("tetrt_compile_")]
    speeds = {suite: training.step_speedups(steps, suite) for suite in training.step_suites(steps)}
    sizes = sorted(next(iter(speeds.values()))["fp8_current"],
                   key=lambda size: math.prod(int(d) for d in size.split("x")))
    small, large = sizes[0], sizes[-1]
    ways = list(speeds.values())
    variants = model_run["suites"]["model_step"]["cases"][case]["variants"]
    te = [v["speedup_vs_bf16"] for n, v in variants.items() if n.startswith("te_") and "speedup_vs_bf16" in v]
    h100 = h100_run["suites"]["model_step"]["cases"][case]["variants"]
    if h100["fp8_current"].get("compiled_step") != "inline":
        raise ValueError("figures_05: the H100 file's fp8_current did not take the inline step "
                         f"(compiled_step={h100['fp8_current'].get('compiled_step')!r})")
    return {
        "rope": _range3(lowered),
        "large": _range3([s["fp8_current"][large] for s in ways]),
        "vs_torchao": _range3([s["fp8_current"][large] / s[training.PEER][large] for s in ways]),
        "small_graph": f"{speeds['train_step_cuda-graph-step']['fp8_current'][small]:.3f}",
        "small_default": f"{speeds['train_step']['fp8_current'][small]:.3f}",
        "model": f"{variants['fp8_current']['speedup_vs_bf16']:.3f}",
        "model_torchao": f"{variants[training.PEER]['speedup_vs_bf16']:.3f}",
        "te": _range3(te),
        "inline": f"{variants['fp8_current_inline']['speedup_vs_bf16']:.3f}",
        "inline_loss": f"{100 * variants['fp8_current_inline']['loss_rel_diff_vs_bf16']:+.1f}%",
        "h100_inline": f"{h100['fp8_current']['speedup_vs_bf16']:.3f}",
        "h100_torchao": f"{h100[training.PEER]['speedup_vs_bf16']:.3f}",
        "h100_ops": f"{h100['fp8_current+custom_ops']['speedup_vs_bf16']:.3f}",
        "h100_inline_loss": f"{100 * h100['fp8_current']['loss_rel_diff_vs_bf16']:+.2f}%",
    }


def _range3(values: list[float]) -> str:
    low, high = f"{min(values):.3f}", f"{max(values):.3f}"
    return low if low == high else f"{low}-{high}"


def figures_06(record: Mapping[str, Any]) -> dict[str, Any]:
    rows = record["rows"]
    engines = sorted({r["engine"] for r in rows})
    return {"passed": sum(r["passed"] for r in rows), "rows": len(rows),
            "families": len({r["family"] for r in rows}),
            "engines": " and ".join({"onnxruntime": "ONNX Runtime"}.get(e, e) for e in engines)}


def figures_08(eager_logits: Any, compiled: Sequence[Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``compiled``: section 1's tiny Llama 4 compiled from its exported program (first) and
    from the module with keyword ``inputs``; ``eager_logits``: the model's own on ``inputs``."""
    import torch

    from tetrt_support.report.compare import max_abs_error

    with torch.no_grad():
        errors = [max_abs_error(eager_logits, c(**inputs).logits) for c in compiled]
    kinds = [b.kind for b in compiled[0].blocks()]
    return {"engines": kinds.count("engine"), "fallbacks": len(kinds) - kinds.count("engine"),
            "error": bound(max(errors))}


def figures_07(te_cases: Any) -> dict[str, Any]:
    """``te_cases``: the test helper ``tests.quant.te_cases`` (the oracle is not part of the
    package), whose cases section 1 of the notebook compares."""
    compared = exact = 0
    for case in te_cases.CASES:
        for name in te_cases.FAMILIES:
            if name not in case.families:
                continue
            for dtype in te_cases.DTYPES:
                equal = te_cases.compare_small(case, name, dtype)
                compared += 1
                exact += min(equal.values()) == 1.0
    return {"compared": compared, "configurations": len(te_cases.CASES),
            "families": len(te_cases.FAMILIES), "exact": exact}


def figures_09(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``summary``: :func:`tetrt_support.report.distributed_training.run_across_ranks`'s."""
    step = summary["data_parallel"]["custom_ops"]
    compiled = summary["compiled"]["custom_ops"]
    tp = [r["rel"] for style in summary["tensor_parallel"].values() for r in style.values()]
    f8 = summary["fsdp2_float8"]["decoder"]
    total = step["bytes_out"] + step["bytes_dgrad"]
    return {
        "ranks": summary["world_size"],
        "bytes": total,
        "differ": share(step["alone_out_differ"] + step["alone_dgrad_differ"], total),
        "differ_grouped": share(step["grouped_out_differ"] + step["grouped_dgrad_differ"], total),
        "graphs": compiled["graphs"], "breaks": compiled["graph_breaks"],
        "reduces": sum(line.count("_c10d_functional.all_reduce") for part in ("forward", "backward")
                       for line in compiled[part]),
        "steps": len(summary["fsdp2"]["losses"]), "fsdp": bound(summary["fsdp2"]["rel"]),
        "tp": bound(max(tp)),
        "fp8_bytes": f8["fp8"]["bytes"], "bf16_bytes": f8["bf16"]["bytes"],
        "fp8_equal": ("bit for bit" if f8["fp8"]["equal"] and f8["fp8 precomputed"]["equal"]
                      else "not bit for bit"),
    }
