"""A mid-size Llama 4 through ``tetrt_support.compile(backend="inductor")`` against ``torch.compile``.

Run by ``python -m benchmarks.perf --device cuda --suites llama4``, which writes
``benchmarks/results/llama4_cuda.json``. The model is Hugging Face's ``Llama4ForCausalLM``
(random weights, nothing downloaded; :func:`tetrt_support.zoo.tiny_llama4` with larger
sizes), every layer a dense MLP, bf16, eval mode, no grad. Its rotary embedding is complex
(``torch.polar``, ``view_as_complex``, a complex multiply): the "complex original".

Variants, one forward pass each (``input_ids=`` by keyword, logits of every position):

- ``eager``: the complex original;
- ``torch_compile``: ``torch.compile`` of it (inductor; inductor falls back to ATen's
  kernels for the complex ops);
- ``torch_compile_again``: the same compiled model timed as a second variant, an A/A
  control: its speed against ``torch_compile`` is the spread of this run's ratios;
- ``tetrt_compile_inductor_<strategy>``: the exported program through
  :data:`tetrt_support.compiler.pipeline.PASSES` (what ``tetrt_support.compile`` runs) with
  ``backend="inductor"``, complex lowered by ``"rewrite"`` and by ``"retrace"``.

All are timed round-robin with :func:`tetrt_support.report.timing.time_round_robin` (CUDA
events, 10 back-to-back calls a sample, median over rounds, each round in a new order), so
drift hits them alike and no variant always follows the same one.
Recorded per variant: the median and best time, the speed against ``torch_compile`` (its
time over the variant's: >= 1 is at least as fast), the first call (where inductor
compiles; the first compiled variant also pays inductor's one-time start-up), the largest logit error relative to the largest logit against eager bf16 and
against an fp32 eager run of the same (bf16-rounded) weights; for the compiled program the
export and each pass's wall time and the blocks (engine / PyTorch fallback).

The build-time check (``check_engine_blocks``) is on, with its bf16 bound (a few bf16 ulps
of the largest value); if it rejects the engine, the error is recorded and the program is
compiled again without the check, so the file says both what the check found and the speed.
A script, not a test: nothing here asserts.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.record import error_record
from tetrt_support import zoo
from tetrt_support.report.perf import LLAMA4_TARGET
from tetrt_support.report.timing import Stopwatch, time_round_robin

STRATEGIES = ("rewrite", "retrace")
BASELINE = "torch_compile"
#: the baseline again, timed as a variant of its own: its speed against the baseline is
#: the spread this run's ratios carry (an A/A comparison)
CONTROL = "torch_compile_again"


@dataclasses.dataclass(frozen=True)
class Llama4Case:
    """One model size and input shape (``sizes``: :data:`tetrt_support.zoo.LLAMA4_TINY_SIZES` names)."""

    layers: int
    batch: int
    seq: int
    sizes: dict[str, int]
    dtype: torch.dtype = torch.bfloat16

    def describe(self) -> dict[str, Any]:
        return {"layers": self.layers, "batch": self.batch, "seq": self.seq, "dtype": str(self.dtype).removeprefix("torch."),
                "mlp": "dense (moe_layers=[])", **(zoo.LLAMA4_TINY_SIZES | self.sizes)}


CASES = {
    # 4 layers, hidden 2048, 16 heads of 128 (8 KV heads), dense MLP 8192, a small vocabulary
    # so that the LM head does not dominate; chunked attention at Llama 4's own 8192.
    "mid": Llama4Case(4, 4, 2048, {"vocab_size": 8192, "hidden_size": 2048, "intermediate_size": 8192,
                                   "intermediate_size_mlp": 8192, "num_attention_heads": 16, "num_key_value_heads": 8,
                                   "head_dim": 128, "max_position_embeddings": 8192, "attention_chunk_size": 8192}),
    "small": Llama4Case(2, 1, 256, {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
                                    "intermediate_size_mlp": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "head_dim": 64, "max_position_embeddings": 1024, "attention_chunk_size": 1024}),
    "tiny": Llama4Case(2, 1, 16, {}),  # zoo.tiny_llama4's own sizes
}


def _logits(output: Any) -> torch.Tensor:
    return output["logits"]


def relative_error(reference: torch.Tensor, value: torch.Tensor) -> float:
    """``max |value - reference| / max |reference|``, in float64."""
    ref, val = reference.double(), value.double()
    return float((val - ref).abs().max() / ref.abs().max())


def _dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]), "graph_breaks": int(sum(counters["graph_break"].values()))}


def _inductor_graphs(compiled: torch.nn.Module) -> int:
    """Graphs the inductor engine blocks of ``compiled`` compiled (they bypass Dynamo)."""
    from tetrt_support.compiler.engines.inductor import InductorBlock

    return sum(m.compiled_graphs for m in compiled.modules() if isinstance(m, InductorBlock))


def _timed_passes(passes: tuple[Callable[..., Any], ...], seconds: dict[str, float]) -> list[Callable[..., Any]]:
    def timed(compile_pass: Callable[..., Any]) -> Callable[..., Any]:
        def run(gm: Any, ctx: Any) -> Any:
            with Stopwatch() as watch:
                out = compile_pass(gm, ctx)
            seconds[compile_pass.__name__] = watch.wall_s
            return out

        return run

    return [timed(p) for p in passes]


def compile_program(program: torch.export.ExportedProgram, strategy: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    """``tetrt_support.compile(program, backend="inductor", strategy=...)``, each pass timed."""
    from tetrt_support.compiler.pipeline import PASSES, run_passes
    from tetrt_support.compiler.settings import settings_from_options

    from tetrt_support.compiler.verify import EngineMismatchError

    facts: dict[str, Any] = {"check_engine_blocks": "passed"}
    settings = settings_from_options(backend="inductor", strategy=strategy)
    seconds: dict[str, float] = {}
    with Stopwatch() as watch:
        try:
            compiled = run_passes(program, settings.backend, settings.strategy, _timed_passes(PASSES, seconds), settings)
        except EngineMismatchError as err:  # recorded, then timed without the check
            facts["check_engine_blocks"] = f"rejected: {err}"
            settings = settings_from_options(backend="inductor", strategy=strategy, check_engine_blocks=False)
            compiled = run_passes(program, settings.backend, settings.strategy, _timed_passes(PASSES, seconds), settings)
    blocks = [{"name": b.name, "kind": b.kind, "runs_on": b.runner, "ops": len(b.ops)} for b in compiled.blocks()]
    return compiled, facts | {"compile_s": watch.wall_s, "lower_complex_s": seconds.get("lower_complex"),
                              "pass_s": seconds, "blocks_summary": compiled.blocks_summary(), "blocks": blocks}


def run(device: str, case: Llama4Case, rounds: int, seed: int = 0) -> dict[str, Any]:
    """The ``llama4`` section of a results file."""
    model = zoo.tiny_llama4(case.layers, seed=seed, **case.sizes).to(device=device, dtype=case.dtype)
    ids = zoo.llama4_example_inputs(model, case.batch, case.seq, seed=seed)["input_ids"].to(device)
    params = sum(p.numel() for p in model.parameters())
    section: dict[str, Any] = {"config": case.describe() | {"parameters": params}, "input": "input_ids= by keyword",
                               "settings": {"backend": "inductor", "check_engine_blocks": True,
                                            "bf16_bound": "LOW_PRECISION_ULPS bf16 epsilons of the largest value"}}
    with torch.no_grad():
        reference_fp32 = copy.deepcopy(model).float()  # the same bf16-rounded weights, computed in fp32
        logits_fp32 = _logits(reference_fp32(input_ids=ids))
        del reference_fp32
        logits_eager = _logits(model(input_ids=ids))
    baseline = torch.compile(model)
    variants: dict[str, Callable[[], Any]] = {"eager": lambda: model(input_ids=ids),
                                              BASELINE: lambda: baseline(input_ids=ids),
                                              CONTROL: lambda: baseline(input_ids=ids)}
    results: dict[str, dict[str, Any]] = {name: {} for name in variants}
    compiled_modules: dict[str, torch.nn.Module] = {}
    try:
        with torch.no_grad(), Stopwatch() as export:
            program = torch.export.export(model, (), {"input_ids": ids}, strict=False)
        section["export_s"] = export.wall_s
        for strategy in STRATEGIES:
            name = f"tetrt_compile_inductor_{strategy}"
            try:
                before_build = _dynamo_counts()
                with torch.no_grad():
                    compiled, facts = compile_program(program, strategy)
                after_build = _dynamo_counts()  # the build-time check runs (and compiles) the engine block
                facts["_built"] = {k: after_build[k] - before_build[k] for k in after_build}
                variants[name] = lambda c=compiled: c(input_ids=ids)
                compiled_modules[name] = compiled
                results[name] = facts
            except Exception as e:  # noqa: BLE001 - record, keep measuring the rest
                results[name] = error_record(e)
    except Exception as e:  # noqa: BLE001
        section["export"] = error_record(e)
    ready: dict[str, Callable[[], Any]] = {}
    for name, fn in tqdm(variants.items(), desc=f"llama4 {device} (first call, check)", unit="variant"):
        try:
            before = _dynamo_counts()
            with torch.no_grad(), Stopwatch() as first:
                logits = _logits(fn())
                if device == "cuda":
                    torch.cuda.synchronize()
            after = _dynamo_counts()
            built = results[name].pop("_built", {"graphs": 0, "graph_breaks": 0})  # counted at build, if any
            results[name].update(first_call_s=first.wall_s,
                                 dynamo_graphs=after["graphs"] - before["graphs"] + built["graphs"],
                                 graph_breaks=after["graph_breaks"] - before["graph_breaks"] + built["graph_breaks"],
                                 max_rel_error_vs_eager_bf16=relative_error(logits_eager, logits),
                                 max_rel_error_vs_eager_fp32=relative_error(logits_fp32, logits))
            if name in compiled_modules:  # the engine block compiles with inductor itself, not Dynamo
                results[name]["inductor_graphs"] = _inductor_graphs(compiled_modules[name])
            ready[name] = fn
        except Exception as e:  # noqa: BLE001
            results[name] = error_record(e)
        logits = None
    errors: dict[str, BaseException] = {}
    with torch.no_grad():
        timings = time_round_robin(ready, rounds=rounds, device=device, errors=errors)
    for name, e in errors.items():
        results[name] = error_record(e)
    for name, timing in timings.items():
        results[name].update(median_s=timing.median_s, best_s=timing.best_s)
    base = results.get(BASELINE, {}).get("median_s")
    for entry in results.values():
        if base and "median_s" in entry:
            entry["speed_vs_torch_compile"] = base / entry["median_s"]
    protocol = next(iter(timings.values())).protocol() | {"order": "round-robin, shuffled each round", "rounds": rounds} if timings else {}
    return section | {"timing": protocol, "target": f"tetrt_compile_inductor_* speed_vs_torch_compile >= {LLAMA4_TARGET}",
                      "first_calls": "in variant order; the first compiled one (torch_compile) also pays inductor's "
                                     "one-time start-up", "variants": results}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a ``llama4`` results file."""
    s: dict[str, Any] = {}
    for name, entry in result.get("llama4", {}).get("variants", {}).items():
        if "median_s" in entry:
            s[f"{name}.ms"] = round(1e3 * entry["median_s"], 3)
            s[f"{name}.speed_vs_torch_compile"] = round(entry["speed_vs_torch_compile"], 3)
        elif "error" in entry:
            s[f"{name}.error"] = entry["error"]
    return s
