"""Whole-model training-step benchmark: a Llama-3-style decoder, ``torch.compile(model)``, fused AdamW.

    python -m benchmarks.perf --device cuda --suites model_step     # -> benchmarks/results/model_step_cuda.json
    python -m benchmarks.perf --device cuda --suites model_step --sizes 8b_2048 --recipes bf16,fp8_current \
        --modes default,cuda-graph-step --rounds 10 --steps 50
    python -m benchmarks.perf --device cpu --suites model_step --quick   # CPU smoke run -> results/smoke/

(``python -m benchmarks.model_step ARGS`` is the same command on cuda; ``python -m
benchmarks.model_step merge OUT IN [IN ...]`` writes :func:`merge_runs` of the IN files to
OUT.) What users run: the model of :mod:`tetrt_support.zoo.decoder` in bf16, every Linear but ``lm_head`` converted,
``torch.compile(model)`` with no options, and one step = ``zero_grad(set_to_none=True)``,
``loss = model(ids, labels)``, ``loss.backward()``, ``AdamW(fused=True).step()`` (the
optimizer not compiled). Modes: ``default`` and ``cuda-graph-step`` (the same compiled model
and the whole step, optimizer included (``capturable=True``), captured into one CUDA graph by
:func:`benchmarks.steps.whole_step_graph`: the GPU's work with the host out of the way).

Variants: ``bf16``; ``torchao_float8_tensorwise`` (torchao's float8 training, the ``bench``
extra); this project's recipes ``fp8_current``, ``fp8_block``, ``mxfp8``, ``nvfp4``
(``tetrt_support.quant.convert_to_quantized_training``; MXFP8 and NVFP4 emulated on Hopper);
TransformerEngine's ``te.Linear`` under ``te.autocast`` with ``te_fp8_current``,
``te_fp8_delayed``, ``te_fp8_block`` where ``transformer_engine`` imports. A ``_eager`` suffix
runs any variant without ``torch.compile``. Each case builds its model once from a seed; every
variant starts from a deep copy of it and trains ``--steps`` steps on the same batches
(:class:`Data`; the loss after them is recorded beside bf16's), then all variants of the case
are timed round-robin in one process (:func:`tetrt_support.report.timing.time_round_robin`).
Per variant: median and best step ms, speedup over bf16, tokens/s, host ms per step, peak
memory, the first step's wall time (the compile), the loss curve.

The default plan (no ``--recipes`` or ``--modes`` given) is :data:`PLAN`: the headline
figures first; ``--sizes`` alone runs the plan's phases of those cases (a plan split over
two processes). Naming ``--recipes`` or ``--modes`` runs their grid instead (``--modes
default`` alone, perf.py's default, keeps the plan); ``--modes cuda-graph-step`` implies
``default``.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch._dynamo

from benchmarks import record
from benchmarks.steps import (CUSTOM_OPS, WHOLE_STEP_GRAPH, allow_recompiles, compiled_steps, host_ms_per_step,
                              whole_step_graph)
from tetrt_support.zoo.decoder import Decoder, DecoderConfig, decoder_config

allow_recompiles()

RECIPES = ("fp8_current", "fp8_block", "mxfp8", "nvfp4")
TORCHAO = "torchao_float8_tensorwise"
INLINE = "fp8_current_inline"  # fp8_current with compile_as="inline" named explicitly (the default where verified)
# A recipe with an inline step through its two custom ops (compile_as="custom_ops", the
# suffix CUSTOM_OPS): the step as it ran before the inline step, beside the default
CUSTOM_OPS_VARIANTS = tuple(f"{r}{CUSTOM_OPS}" for r in ("fp8_current", "fp8_block"))
TE_RECIPES = {"te_fp8_current": "Float8CurrentScaling", "te_fp8_delayed": "DelayedScaling",
              "te_fp8_block": "Float8BlockScaling"}
BASE_VARIANTS = ("bf16", TORCHAO, *RECIPES, INLINE, *CUSTOM_OPS_VARIANTS, *TE_RECIPES)
EAGER = "_eager"  # suffix: the variant without torch.compile
MODES = ("default", WHOLE_STEP_GRAPH)
HEADLINE = ("bf16", TORCHAO, "fp8_current", "fp8_block")

LR = 3e-4
WEIGHT_DECAY = 0.01
LOSS_STEPS = 20
ROUNDS = 8
CALLS_PER_SAMPLE = {"cuda": 3, "cpu": 1}  # one step is tens of ms on the GPU
GRAPH_WARMUP = 3  # whole_step_graph's warm-up steps (they train too)
SEED, DATA_SEED = 0, 1
LABEL_NOISE = 0.5  # the fraction of targets drawn uniformly at random instead of perm[token]
DATA_VOCAB = 1024  # the token ids of the data: the first this many of the vocabulary


@dataclass(frozen=True)
class Data:
    """The batches every variant of a case trains on, the same for all: a fresh batch per
    step of token ids drawn uniformly from the first ``data_vocab`` ids, each target
    ``perm[id]`` for a fixed random permutation ``perm`` of those ids, or with probability
    :data:`LABEL_NOISE` a uniform random one of them. Each batch holds every id a few times,
    so the loss falls within a few steps from about ``ln(vocab)`` towards ``entropy_floor``
    (the targets' entropy, which no model beats) and then stays near it; a variant that
    learns slower or worse stays above. Drawn on the CPU (the same data on every device),
    then moved."""

    batches: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    data_vocab: int
    entropy_floor: float

    @staticmethod
    def draw(vocab: int, batch: int, seq: int, count: int, device: str, *, data_vocab: int = DATA_VOCAB,
             seed: int = DATA_SEED) -> Data:
        n = min(vocab, data_vocab)
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(n, generator=g)
        batches = []
        for _ in range(count):
            ids = torch.randint(0, n, (batch, seq), generator=g)
            noise = torch.randint(0, n, (batch, seq), generator=g)
            keep = torch.rand((batch, seq), generator=g) >= LABEL_NOISE
            batches.append((ids.to(device), torch.where(keep, perm[ids], noise).to(device)))
        hit = 1 - LABEL_NOISE + LABEL_NOISE / n  # the probability of the target perm[id]
        miss = LABEL_NOISE / n  # of each other id of the data
        floor = -(hit * math.log(hit) + (n - 1) * miss * math.log(miss))
        return Data(tuple(batches), n, floor)


@dataclass(frozen=True)
class Case:
    """A model (preset cut to ``layers``), a batch of ``batch`` x ``seq`` tokens, AdamW's ``lr``
    and the ids of the data (:class:`Data`)."""

    preset: str
    layers: int
    batch: int
    seq: int
    lr: float = LR
    data_vocab: int = DATA_VOCAB

    def config(self) -> DecoderConfig:
        return decoder_config(self.preset, layers=self.layers, max_seq=max(self.seq, 128))

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


CASES: dict[str, Case] = {
    "8b_8192": Case("llama3_8b_width", layers=4, batch=2, seq=4096),
    "8b_2048": Case("llama3_8b_width", layers=4, batch=1, seq=2048),
    "1b_8192": Case("1b_width", layers=4, batch=2, seq=4096),
    "1b_1024_2l": Case("1b_width", layers=2, batch=1, seq=1024),  # --quick on cuda
    "tiny": Case("tiny", layers=2, batch=2, seq=64, lr=3e-3, data_vocab=64),  # --quick on cpu, tests: learns in a few steps
}
DEFAULT_CASES = ("8b_2048", "1b_8192", "8b_8192")


@dataclass(frozen=True)
class Phase:
    """One case of a plan: the variants of each mode. ``cuda-graph-step`` reuses the
    default mode's compiled models (no second compile), so its variants must be there too."""

    case: str
    modes: dict[str, tuple[str, ...]] = field(default_factory=dict)


# The default run, most important figures first; about 12 minutes on one H200 (the compiles
# dominate: each compiled variant of a 4-layer model is one inductor compile, 10-50 s), so
# run it as two processes (``--sizes 8b_2048``, then ``--sizes 1b_8192,8b_8192``) and merge.
# MXFP8 and NVFP4 (emulated on Hopper) fill the time of the TransformerEngine variants at
# 2048 tokens where TE does not import: TE_TIME_FILL runs only then.
TE_TIME_FILL, TE_TIME_FILL_CASE = ("mxfp8", "nvfp4"), "8b_2048"
PLAN = (
    Phase(TE_TIME_FILL_CASE, {"default": (*HEADLINE, *CUSTOM_OPS_VARIANTS, *TE_RECIPES, *TE_TIME_FILL, "bf16_eager",
                                  *(f"{v}{EAGER}" for v in TE_RECIPES)),
                      WHOLE_STEP_GRAPH: HEADLINE}),
    Phase("1b_8192", {"default": (*HEADLINE, *TE_RECIPES)}),
    Phase("8b_8192", {"default": (*HEADLINE, "mxfp8", "nvfp4", *TE_RECIPES)}),
)
QUICK_PLAN = {
    "cuda": (Phase("1b_1024_2l", {"default": ("bf16", TORCHAO, "fp8_current", INLINE, "te_fp8_current", "bf16_eager",
                                              "te_fp8_current_eager"),
                                  WHOLE_STEP_GRAPH: ("bf16", "fp8_current")}),),
    "cpu": (Phase("tiny", {"default": ("bf16", TORCHAO, "fp8_current", "bf16_eager", "fp8_current_eager")}),),
}


def base_variant(variant: str) -> str:
    return variant.removesuffix(EAGER)


def is_eager(variant: str) -> bool:
    return variant.endswith(EAGER)


def check_variant(variant: str) -> None:
    if base_variant(variant) not in BASE_VARIANTS:
        raise ValueError(f"model_step: unknown variant {variant!r}; expected one of {', '.join(BASE_VARIANTS)}, "
                         f"each optionally with the suffix {EAGER!r}")


def torchao_available() -> bool:
    try:
        import torchao.float8  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to import means: not available
        return False
    return True


def te_module() -> Any | None:
    """``transformer_engine.pytorch``, or None where it does not import (or there is no GPU)."""
    if not torch.cuda.is_available():
        return None
    try:
        import transformer_engine.pytorch as te
    except Exception:  # noqa: BLE001 - an install that fails to load is as good as none
        return None
    return te


def machine_extras() -> dict[str, Any]:
    """What this suite adds to the machine record: torchao's and TransformerEngine's versions."""
    out: dict[str, Any] = {}
    try:
        import torchao

        out["torchao"] = torchao.__version__
    except Exception:  # noqa: BLE001
        pass
    if te_module() is not None:
        import transformer_engine

        out["transformer_engine"] = getattr(transformer_engine, "__version__", "unknown")
    return out


def not_lm_head(module: torch.nn.Module, fqn: str) -> bool:
    return fqn != "lm_head"


def _convert_to_quantized_training() -> Callable[..., torch.nn.Module]:
    from tetrt_support.quant import convert_to_quantized_training

    return convert_to_quantized_training


def te_recipe(variant: str) -> Any:
    from transformer_engine.common import recipe

    return getattr(recipe, TE_RECIPES[base_variant(variant)])()


def te_autocast(te: Any, fp8_recipe: Any) -> contextlib.AbstractContextManager[Any]:
    """TE's FP8 region: ``te.autocast(enabled, recipe)`` (TE 2.20), else ``te.fp8_autocast``."""
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=fp8_recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe)


def swap_to_te_linears(model: torch.nn.Module, te: Any) -> torch.nn.Module:
    """Every ``nn.Linear`` but ``lm_head`` replaced by a ``te.Linear`` holding a copy of its weight."""
    for fqn, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear) and not_lm_head(module, fqn):
            if module.bias is not None:
                raise ValueError(f"swap_to_te_linears: {fqn} has a bias; the decoder's Linears have none")
            layer = te.Linear(module.in_features, module.out_features, bias=False, params_dtype=torch.bfloat16,
                              device="cuda")
            with torch.no_grad():
                layer.weight.copy_(module.weight)
            parent, _, name = fqn.rpartition(".")
            setattr(model.get_submodule(parent), name, layer)
    return model


def convert(model: torch.nn.Module, variant: str) -> tuple[torch.nn.Module, Callable[[], contextlib.AbstractContextManager[Any]]]:
    """``model`` (converted in place) for ``variant``, and the context each forward runs under."""
    base = base_variant(variant)
    if base == "bf16":
        return model, contextlib.nullcontext
    if base == TORCHAO:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                                   module_filter_fn=not_lm_head)
        return model, contextlib.nullcontext
    if base in RECIPES:
        return _convert_to_quantized_training()(model, base, module_filter_fn=not_lm_head), contextlib.nullcontext
    if base == INLINE:
        return (_convert_to_quantized_training()(model, "fp8_current", module_filter_fn=not_lm_head, compile_as="inline"),
                contextlib.nullcontext)
    if base in CUSTOM_OPS_VARIANTS:
        recipe = base.removesuffix(CUSTOM_OPS)
        return (_convert_to_quantized_training()(model, recipe, module_filter_fn=not_lm_head, compile_as="custom_ops"),
                contextlib.nullcontext)
    if base in TE_RECIPES:
        te = te_module()
        if te is None:
            raise RuntimeError("transformer_engine.pytorch does not import here")
        fp8_recipe = te_recipe(base)
        return swap_to_te_linears(model, te), lambda: te_autocast(te, fp8_recipe)
    raise ValueError(f"model_step: unknown variant {variant!r}")


def make_step(forward: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer, ids: torch.Tensor,
              labels: torch.Tensor, context: Callable[[], contextlib.AbstractContextManager[Any]]) -> Callable[[], torch.Tensor]:
    """One training step; returns the (detached) loss without reading it."""

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with context():
            loss = forward(ids, labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def resident_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of ``model``'s parameters and buffers and of ``optimizer``'s state tensors."""
    seen: set[int] = set()
    total = 0

    def add(t: torch.Tensor) -> None:
        nonlocal total
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()

    for t in (*model.parameters(), *model.buffers()):
        add(t)
    if optimizer is not None:
        for state in optimizer.state.values():
            for t in state.values():
                if isinstance(t, torch.Tensor) and t.numel() > 1:  # not the step counters
                    add(t)
    return total


def _error(e: BaseException) -> str:
    return record.error_record(e)["error"]


@dataclass
class Run:
    """One variant's live objects within a case."""

    model: torch.nn.Module
    forward: Callable[..., torch.Tensor]
    context: Callable[[], contextlib.AbstractContextManager[Any]]
    optimizer: torch.optim.Optimizer | None = None
    step: Callable[[], Any] | None = None


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _losses_entry(losses: list[float], steps: int, first_after: int) -> dict[str, Any]:
    """``losses[i]`` is the loss of the forward after ``first_after + i`` updates; the last after ``steps``."""
    return {"loss_after_steps": losses[-1], "loss_steps": steps, "losses": losses, "losses_first_after_updates": first_after,
            "loss_mean": statistics.fmean(losses),
            "loss_finite": all(math.isfinite(v) for v in losses), "loss_decreased": losses[-1] < losses[0]}


def _compare_losses(variants: dict[str, dict[str, Any]]) -> None:
    """Each variant's loss after the steps (and mean loss) beside bf16's, and their relative difference."""
    ref = variants.get("bf16") if "loss_after_steps" in variants.get("bf16", {}) else variants.get("bf16_eager", {})
    if "loss_after_steps" not in ref:
        return
    for entry in variants.values():
        if "loss_after_steps" in entry:
            entry["bf16_loss_after_steps"] = ref["loss_after_steps"]
            entry["loss_rel_diff_vs_bf16"] = (entry["loss_after_steps"] - ref["loss_after_steps"]) / ref["loss_after_steps"]
            entry["loss_mean_rel_diff_vs_bf16"] = (entry["loss_mean"] - ref["loss_mean"]) / ref["loss_mean"]
            ref_progress = ref["losses"][0] - ref["loss_after_steps"]
            if ref_progress > 0:
                entry["loss_progress_vs_bf16"] = (entry["losses"][0] - entry["loss_after_steps"]) / ref_progress


def _host_ms(step: Callable[[], Any], device: str, repeats: int = 5) -> float | None:
    """Median host time of one step issued onto an idle GPU (synchronised before each)."""
    if device != "cuda":
        return None
    return statistics.median(host_ms_per_step(step, steps=1) for _ in range(repeats))


def _time(fns: dict[str, Callable[[], Any]], variants: dict[str, dict[str, Any]], device: str, rounds: int,
          tokens: int) -> dict[str, Any]:
    """Round-robin timing of ``fns`` into ``variants``; returns the GPU clock summary."""
    from benchmarks.gpu_clocks import ClockSampler
    from tetrt_support.report.timing import time_round_robin

    errors: dict[str, BaseException] = {}
    sampler = ClockSampler() if device == "cuda" else contextlib.nullcontext()
    with sampler:
        timings = time_round_robin(fns, rounds=rounds, device=device, calls_per_sample=CALLS_PER_SAMPLE[device],
                                   warmup=1, errors=errors)
    for name, e in errors.items():
        variants[name]["error"] = _error(e)
    for name, timing in timings.items():
        entry = variants[name]
        entry.update(median_ms=timing.median_s * 1e3, best_ms=timing.best_s * 1e3, tokens_per_s=tokens / timing.median_s,
                     **timing.protocol())
        try:
            host = _host_ms(fns[name], device)
        except Exception as e:  # noqa: BLE001
            entry["host_error"] = _error(e)
        else:
            entry["host_ms_per_step"] = host if host is not None else entry["median_ms"]  # on a CPU the host is the device
    for ref_name, key in (("bf16", "speedup_vs_bf16"), ("bf16_eager", "speedup_vs_bf16_eager")):
        ref = variants.get(ref_name, {}).get("median_ms")
        for entry in variants.values():
            if ref and "median_ms" in entry:
                entry[key] = ref / entry["median_ms"]
    return sampler.summary if device == "cuda" else {}  # type: ignore[union-attr]


def _peak_memory(run: Run, device: str) -> dict[str, Any]:
    """The step's peak allocation, with the other variants' resident memory taken out."""
    if device != "cuda":
        return {"peak_memory_gib": None}
    assert run.step is not None and run.optimizer is not None
    run.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        run.step()
    torch.cuda.synchronize()
    above = torch.cuda.max_memory_allocated() - before
    resident = resident_bytes(run.model, run.optimizer)
    return {"peak_memory_gib": (above + resident) / 2**30, "step_memory_gib": above / 2**30,
            "resident_memory_gib": resident / 2**30}


def _restore(model: torch.nn.Module, pristine: dict[str, torch.Tensor]) -> None:
    """The case's initial weights copied back into ``model``'s own parameters (same objects)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in pristine or pristine[name].shape != p.shape:
                raise KeyError(f"parameter {name} of the converted model has no initial weight to restore")
            p.copy_(pristine[name])


def step_description(mode: str, device: str) -> str:
    compiled = "torch.compile(model)" if device == "cuda" else 'torch.compile(model, backend="aot_eager")'
    text = (f"optimizer.zero_grad(set_to_none=True); loss = {compiled}(ids, labels); loss.backward(); "
            "AdamW(fused=True).step() (not compiled); variants ending in _eager without torch.compile")
    if mode == WHOLE_STEP_GRAPH:
        text += ("; the whole step (AdamW capturable=True) captured into one CUDA graph and replayed, the same "
                 "compiled model as the default mode")
    return text


def bench_case(name: str, modes: dict[str, list[str]], *, device: str, rounds: int, steps: int,
               save: Callable[[], None], sections: dict[str, dict[str, Any]]) -> None:
    """Every variant of every mode of case ``name``; the entries go into ``sections[mode]["cases"][name]``."""
    case = CASES[name]
    config = case.config()
    started = time.perf_counter()
    default_variants = modes.get("default", [])
    graph_variants = modes.get(WHOLE_STEP_GRAPH, [])
    if graph_variants and device != "cuda":
        raise ValueError(f"{WHOLE_STEP_GRAPH} needs a CUDA device")
    base = Decoder(config, seed=SEED, device=device, dtype=torch.bfloat16)
    data = Data.draw(config.vocab, case.batch, case.seq, steps + 1, device, data_vocab=case.data_vocab)
    ids, labels = (t.clone() for t in data.batches[0])  # the step's inputs: batch i is copied in before step i

    def load(i: int) -> None:
        ids.copy_(data.batches[i][0])
        labels.copy_(data.batches[i][1])

    info = {"preset": case.preset, "config": asdict(config), "batch": case.batch, "seq": case.seq, "tokens": case.tokens,
            "lr": case.lr,
            "parameters": sum(p.numel() for p in base.parameters()), "data_vocab": data.data_vocab,
            "loss_entropy_floor": data.entropy_floor,
            "linear_parameters_converted": sum(m.weight.numel() for fqn, m in base.named_modules()
                                               if isinstance(m, torch.nn.Linear) and fqn != "lm_head")}
    entries: dict[str, dict[str, Any]] = {}
    for mode, variants in modes.items():
        entries[mode] = sections[mode]["cases"][name] = {**info, "variants": {v: {} for v in variants}}
    pristine = {n: p.detach().clone() for n, p in base.named_parameters()} if graph_variants else {}
    runs: dict[str, Run] = {}
    backend = {} if device == "cuda" else {"backend": "aot_eager"}
    needed = list(dict.fromkeys([*default_variants, *graph_variants]))
    for variant in needed:  # the deep copies first: every variant starts from the untouched model
        entry = entries["default"]["variants"].setdefault(variant, {}) if variant in default_variants else None
        try:
            t0 = time.perf_counter()
            model, context = convert(copy.deepcopy(base), variant)
            forward = model if is_eager(variant) else torch.compile(model, **backend)
            runs[variant] = Run(model, forward, context)
            if entry is not None:
                entry["convert_s"] = time.perf_counter() - t0
                form = None if is_eager(variant) else compiled_steps(model, case.tokens)
                if form:
                    entry["compiled_step"] = form
        except Exception as e:  # noqa: BLE001 - one broken variant must not hide the others
            for mode in modes:
                if variant in entries[mode]["variants"]:
                    entries[mode]["variants"][variant]["error"] = _error(e)
    del base
    gc.collect()

    # default mode: the first step (compile), the loss after `steps` steps, peak memory; then timing
    fns: dict[str, Callable[[], Any]] = {}
    for variant in needed:
        if variant not in runs:
            continue
        run = runs[variant]
        entry = entries["default"]["variants"].get(variant) if variant in default_variants else {}
        try:
            run.optimizer = torch.optim.AdamW(run.model.parameters(), lr=case.lr, weight_decay=WEIGHT_DECAY, fused=True)
            run.step = make_step(run.forward, run.optimizer, ids, labels, run.context)
            losses = []
            t0 = time.perf_counter()
            for i in range(steps + 1):  # the last forward sees the weights after `steps` updates
                load(i)
                losses.append(float(run.step()))
                if i == 0:
                    entry["first_step_s"] = time.perf_counter() - t0
            entry.update(_losses_entry(losses, steps, first_after=0))
            if variant in default_variants:
                entry.update(_peak_memory(run, device))
                fns[variant] = run.step
            print(f"model_step {name} {variant}: first step {entry['first_step_s']:.1f} s, "
                  f"loss {losses[0]:.4f} -> {losses[-1]:.4f} after {steps} steps", flush=True)
        except Exception as e:  # noqa: BLE001
            msg = _error(e)
            entry["error"] = msg
            print(f"model_step {name} {variant}: {msg}", flush=True)
            runs.pop(variant, None)
            for mode in modes:
                if variant in entries[mode]["variants"] and mode != "default":
                    entries[mode]["variants"][variant]["error"] = f"default mode failed: {msg}"
        save()
    if default_variants:
        section = entries["default"]
        _compare_losses(section["variants"])
        section["gpu_clocks"] = _time(fns, section["variants"], device, rounds, case.tokens)
        section["case_wall_s"] = time.perf_counter() - started
        save()
        _print_case(name, "default", section)
    fns.clear()

    if graph_variants:
        graph_started = time.perf_counter()
        section = entries[WHOLE_STEP_GRAPH]
        section["peak_memory"] = "not comparable (the graphs' private pools): not measured"
        section["losses_note"] = (f"{GRAPH_WARMUP} warm-up steps on batch 0 (their losses not read), then one replay "
                                  f"per loss on batches {GRAPH_WARMUP}, {GRAPH_WARMUP + 1}, ...: losses[i] after "
                                  f"{GRAPH_WARMUP} + i updates, the last after `loss_steps`; compare within this mode")
        for variant in graph_variants:
            if variant not in runs:
                continue
            run, entry = runs[variant], section["variants"][variant]
            try:
                if is_eager(variant) or base_variant(variant) in TE_RECIPES:
                    raise ValueError(f"{WHOLE_STEP_GRAPH} runs the compiled model of this project's recipes, bf16 "
                                     "and torchao only")
                run.optimizer = run.step = None  # the default mode's optimizer state and gradients go
                for p in run.model.parameters():
                    p.grad = None
                gc.collect()
                _restore(run.model, pristine)
                optimizer = torch.optim.AdamW(run.model.parameters(), lr=case.lr, weight_decay=WEIGHT_DECAY, fused=True,
                                              capturable=True)
                t0 = time.perf_counter()
                load(0)  # the warm-up steps all see batch 0
                replay = whole_step_graph(make_step(run.forward, optimizer, ids, labels, run.context), warmup=GRAPH_WARMUP)
                torch.cuda.synchronize()
                entry["capture_s"] = time.perf_counter() - t0
                losses = []
                for i in range(GRAPH_WARMUP, max(steps, GRAPH_WARMUP) + 1):
                    load(i)
                    replay()
                    losses.append(float(replay.outputs))
                entry.update(_losses_entry(losses, max(steps, GRAPH_WARMUP), first_after=GRAPH_WARMUP))
                entry["peak_memory_gib"] = None
                run.optimizer, run.step = optimizer, replay
                fns[variant] = replay
                print(f"model_step {name} {variant} [{WHOLE_STEP_GRAPH}]: captured in {entry['capture_s']:.1f} s, "
                      f"loss {losses[-1]:.4f} after {entry['loss_steps']} steps", flush=True)
            except Exception as e:  # noqa: BLE001
                entry["error"] = _error(e)
                print(f"model_step {name} {variant} [{WHOLE_STEP_GRAPH}]: {entry['error']}", flush=True)
            save()
        _compare_losses(section["variants"])
        section["gpu_clocks"] = _time(fns, section["variants"], device, rounds, case.tokens)
        section["case_wall_s"] = time.perf_counter() - graph_started
        save()
        _print_case(name, WHOLE_STEP_GRAPH, section)
    fns.clear()
    runs.clear()
    pristine.clear()
    gc.collect()
    torch._dynamo.reset()  # the next case compiles afresh
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _print_case(name: str, mode: str, section: dict[str, Any]) -> None:
    cells = {v: (f"{e['median_ms']:.2f} ms {e.get('speedup_vs_bf16', float('nan')):.3f}x" if "median_ms" in e
                 else e.get("error", "-")) for v, e in section["variants"].items()}
    print(f"model_step {name} [{mode}] ({section.get('case_wall_s', 0):.0f} s):", cells, flush=True)


def plan(device: str, quick: bool, cases: list[str] | None, variants: list[str] | None,
         modes: list[str] | None) -> list[Phase]:
    """The phases to run: the default plan, or the grid of what was named."""
    for case in cases or ():
        if case not in CASES:
            raise ValueError(f"model_step: unknown case {case!r}; expected one of {', '.join(CASES)}")
    if variants is None and modes is None:  # the plan, or the phases of its cases that were named
        phases = [p for p in (QUICK_PLAN[device] if quick else PLAN) if cases is None or p.case in cases]
        if cases is not None and not phases:
            raise ValueError(f"model_step: no phase of the plan is for {', '.join(cases)}; the plan's cases: "
                             f"{', '.join(p.case for p in (QUICK_PLAN[device] if quick else PLAN))} (name --recipes "
                             "or --modes too for a grid)")
    else:
        modes = modes or ["default"]
        for mode in modes:
            if mode not in MODES:
                raise ValueError(f"model_step: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        if device != "cuda" and WHOLE_STEP_GRAPH in modes:
            raise ValueError(f"model_step: {WHOLE_STEP_GRAPH} needs --device cuda")
        cases = cases or ([QUICK_PLAN[device][0].case] if quick else list(DEFAULT_CASES))
        variants = variants or list(dict.fromkeys(v for p in (QUICK_PLAN[device] if quick else PLAN)
                                                  for v in p.modes.get("default", ())))
        if WHOLE_STEP_GRAPH in modes and "default" not in modes:
            modes = ["default", *modes]  # the graph mode captures the default mode's compiled model
        phases = [Phase(c, {m: tuple(variants) for m in modes}) for c in cases]
    for phase in phases:
        if phase.case not in CASES:
            raise ValueError(f"model_step: unknown case {phase.case!r}; expected one of {', '.join(CASES)}")
        for vs in phase.modes.values():
            for v in vs:
                check_variant(v)
    return phases


def _available(phases: list[Phase], explicit: bool) -> tuple[list[Phase], dict[str, str]]:
    """The plan less the variants whose package does not import (the default plan only)."""
    if explicit:
        return phases, {}
    skipped: dict[str, str] = {}
    if te_module() is None:
        skipped.update({v: "transformer_engine.pytorch does not import here" for p in phases for vs in p.modes.values()
                        for v in vs if base_variant(v) in TE_RECIPES})
    else:
        skipped.update({f"{TE_TIME_FILL_CASE}:{v}": "left out of the default plan where TransformerEngine runs (time); "
                        "name it with --recipes" for v in TE_TIME_FILL})
    if not torch.cuda.is_available() and not torchao_available():
        skipped.update({v: "torchao does not import here" for p in phases for vs in p.modes.values()
                        for v in vs if base_variant(v) == TORCHAO})
    kept = [Phase(p.case, {m: tuple(v for v in vs if v not in skipped and f"{p.case}:{v}" not in skipped)
                           for m, vs in p.modes.items()}) for p in phases]
    return kept, skipped


def run(device: str = "cuda", quick: bool = False, *, cases: list[str] | None = None,
        variants: list[str] | None = None, modes: list[str] | None = None, rounds: int | None = None,
        steps: int | None = None, write: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The ``model_step`` suite of ``python -m benchmarks.perf``.

    Returns ``{"machine": {...}, "setup": {...}, "suites": {"model_step": ..., "model_step_cuda-graph-step":
    ...}}``, each suite ``{"step", "cases": {case: {config, "variants": {variant: {...}}, "gpu_clocks"}}}``.
    ``write`` gets the partial result after every variant. On a CPU only ``quick`` runs (a smoke run).
    """
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the model_step suite on cuda needs a CUDA device")
    if device == "cpu" and not quick:
        raise RuntimeError("the model_step suite runs on cuda; on a CPU only its smoke run (--quick)")
    explicit = not (variants is None and modes is None)
    phases, skipped = _available(plan(device, quick, cases, variants, modes), explicit)
    steps = steps if steps is not None else (5 if quick else LOSS_STEPS)
    rounds = rounds or (2 if quick else ROUNDS)
    if WHOLE_STEP_GRAPH in {m for p in phases for m in p.modes} and steps < GRAPH_WARMUP:
        raise ValueError(f"model_step: {WHOLE_STEP_GRAPH} trains {GRAPH_WARMUP} warm-up steps: --steps >= {GRAPH_WARMUP}")
    result: dict[str, Any] = {
        "machine": machine_extras(),
        "setup": {"dtype": "bfloat16", "optimizer": f"torch.optim.AdamW(fused=True, lr=each case's lr, weight_decay={WEIGHT_DECAY})",
                  "converted": "every Linear but lm_head", "seed": SEED,
                  "data": f"a fresh batch per step, the same for every variant: token ids uniform over the first "
                          "data_vocab ids (per case), each target a fixed random permutation of its id, or with probability "
                          f"{LABEL_NOISE} a uniform random id (seed {DATA_SEED}); each case records the loss's entropy "
                          "floor; the timed steps repeat the last batch",
                  "loss_progress_vs_bf16": "(first loss - loss after the steps) / bf16's: the fraction of bf16's "
                                           "progress a variant makes",
                  "loss_steps": steps, "rounds": rounds, "calls_per_sample": CALLS_PER_SAMPLE[device],
                  "compile": "torch.compile(model)" if device == "cuda" else 'torch.compile(model, backend="aot_eager")',
                  "plan": [asdict(p) for p in phases], "skipped_variants": skipped,
                  "speedup": "bf16 median / variant median, same mode and case",
                  "peak_memory_gib": "max_memory_allocated over 3 default-mode steps above the memory before them, "
                                     "plus the variant's own parameters, buffers and optimizer state (the other "
                                     "variants of the case, resident in the same process, are left out)",
                  "host_ms_per_step": "median of 5: one step issued onto an idle GPU, host wall time"},
        "suites": {},
    }
    sections: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        if any(mode in p.modes for p in phases):
            suite = "model_step" if mode == "default" else f"model_step_{mode}"
            sections[mode] = result["suites"][suite] = {"step": step_description(mode, device), "cases": {}}

    def save() -> None:
        if write is not None:
            write(result)

    started = time.perf_counter()
    for phase in phases:
        modes_of_phase = {m: list(vs) for m, vs in phase.modes.items() if vs}
        if not modes_of_phase:
            continue
        try:
            bench_case(phase.case, modes_of_phase, device=device, rounds=rounds, steps=steps, save=save,
                       sections=sections)
        except Exception as e:  # noqa: BLE001 - one failed case must not lose the others
            for mode in modes_of_phase:
                sections[mode]["cases"].setdefault(phase.case, {})["error"] = _error(e)
            print(f"model_step {phase.case}: {_error(e)}", flush=True)
            gc.collect()
            torch._dynamo.reset()
            if device == "cuda":
                torch.cuda.empty_cache()
        result["setup"]["suite_wall_s"] = time.perf_counter() - started
        save()
    for key, line in summary(result).items():
        print(f"{key}: {line}", flush=True)
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Per mode, case and variant: step ms, speedup over bf16, tokens/s, host ms, peak memory, compile, loss."""
    s: dict[str, Any] = {}
    for suite, section in result.get("suites", {}).items():
        mode = suite.removeprefix("model_step").removeprefix("_") or "default"
        for case, entry in section.get("cases", {}).items():
            if "error" in entry and "variants" not in entry:
                s[f"{mode}.{case}"] = entry["error"]
                continue
            for name, v in entry.get("variants", {}).items():
                key = f"{mode}.{case}.{name}"
                if "median_ms" not in v:
                    s[key] = v.get("error", "not timed")
                    continue
                parts = [f"{v['median_ms']:.2f} ms"]
                if "speedup_vs_bf16" in v:
                    parts.append(f"({v['speedup_vs_bf16']:.3f}x)")
                parts.append(f"{v['tokens_per_s'] / 1e3:.1f}k tok/s")
                if v.get("host_ms_per_step") is not None:
                    parts.append(f"host {v['host_ms_per_step']:.2f} ms")
                if v.get("peak_memory_gib") is not None:
                    parts.append(f"peak {v['peak_memory_gib']:.1f} GiB")
                if "first_step_s" in v:
                    parts.append(f"first step {v['first_step_s']:.1f} s")
                if "loss_after_steps" in v:
                    loss = f"loss {v['loss_after_steps']:.4f}"
                    if "loss_rel_diff_vs_bf16" in v:
                        loss += f" ({v['loss_rel_diff_vs_bf16'] * 100:+.2f}% vs bf16"
                        if "loss_progress_vs_bf16" in v:
                            loss += f", {v['loss_progress_vs_bf16']:.2f} of its progress"
                        loss += ")"
                    parts.append(loss)
                s[key] = ", ".join(parts)
    return s


def merge_runs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One results file from runs of disjoint cases (the plan split over processes to fit a
    time limit). Each case keeps the figures of the one process that ran it, so its ratios
    stay within one run; ``machine`` and ``setup`` are the first run's, and ``runs`` keeps
    every run's own, with the cases it ran. A case found in two runs is refused."""
    if not parts:
        raise ValueError("merge_runs: no runs given")
    merged: dict[str, Any] = {key: copy.deepcopy(value) for key, value in parts[0].items() if key != "suites"}
    merged["suites"], merged["runs"], seen = {}, [], {}
    for index, part in enumerate(parts):
        cases = sorted({c for section in part.get("suites", {}).values() for c in section.get("cases", {})})
        for case in cases:
            if case in seen:
                raise ValueError(f"merge_runs: case {case!r} is in run {seen[case]} and run {index}")
            seen[case] = index
        merged["runs"].append({"machine": part.get("machine"), "setup": part.get("setup"), "cases": cases})
        for suite, section in part.get("suites", {}).items():
            target = merged["suites"].setdefault(suite, {k: v for k, v in section.items() if k != "cases"})
            target.setdefault("cases", {}).update(copy.deepcopy(section.get("cases", {})))
    return merged


if __name__ == "__main__":  # python -m benchmarks.model_step ARGS: the entry point, this suite
    from benchmarks import perf

    perf.suite_main("model_step")
