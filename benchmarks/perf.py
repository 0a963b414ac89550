"""The one benchmark entry point: every suite, every results file.

    python -m benchmarks.perf --device cpu                 # every CPU suite, full sizes
    python -m benchmarks.perf --device cuda                # rope, attention, linear, train_step, loss_study, llama4
    python -m benchmarks.perf --suites lowering            # one suite
    python -m benchmarks.perf --suites rope --quick        # a smoke run

Suites, and the file each writes under ``benchmarks/results/``:

- ``rope``, ``attention`` (:mod:`benchmarks.rope`) and ``linear`` (:mod:`benchmarks.linear`)
  -> ``perf_<device>.json``: RoPE run time and bandwidth against a clone of the same bytes,
  the RoPE attention block, the quantized Linear against bf16 and raw ``torch._scaled_mm``;
- ``lowering`` (:mod:`benchmarks.lowering`, CPU) -> ``lowering.json``: lowering time against
  graph size for both strategies and torch's ``decompose_complex_in_graph``, and the CPU run
  time of the lowered RoPE;
- ``fake_impls`` (:mod:`benchmarks.fake_impls`, CPU) -> ``fake_impls.json``: TensorProto
  versus make_empty_traceable;
- ``train_step`` (:mod:`benchmarks.train_step`, CUDA only) -> ``train_step_cuda.json``: one
  quantized Linear's compiled training step per recipe against bf16 and torchao's float8
  (the ``bench`` extra), and the FP8 forward against raw ``torch._scaled_mm``; ``--modes
  default,reduce-overhead,cuda-graph-step`` adds torch.compile's CUDA graphs and the whole
  step as one CUDA graph, ``--profile DIR`` kernel and host profiles,
  ``--reference-too`` the reference quantizers;
- ``step_bounds`` (:mod:`benchmarks.step_bounds`, CUDA only) -> ``step_bounds_cuda.json``: the
  same step taken apart (its GEMMs alone, its quantization alone, a copy for the bandwidth)
  and the best speedup over bf16 its GEMMs allow;
- ``loss_study`` (:mod:`benchmarks.loss_study`, either device) -> ``loss_curves_<device>.json``:
  a small transformer trained with bf16 and every recipe, the loss of every step. Runs by
  default on cuda only; on a CPU (a smaller model, a few minutes) name it;
- ``llama4`` (:mod:`benchmarks.llama4`, either device; by default on cuda only) ->
  ``llama4_<device>.json``: a mid-size HF Llama 4 forward (bf16) eager, ``torch.compile``d and
  through ``tetrt_support.compile(backend="inductor")`` by both lowering strategies;
- ``te_conformance`` (:mod:`benchmarks.te_conformance`, CUDA only, needs TransformerEngine;
  not a default suite) -> ``te_conformance_cuda.json``: TE's quantizers and ``te.Linear``
  against tetrt's, byte for byte;
- ``model_step`` (:mod:`benchmarks.model_step`, cuda; on a CPU ``--quick`` only) ->
  ``model_step_<device>.json``: a Llama-3-style decoder's whole training step
  (``torch.compile(model)``, fused AdamW) in bf16, torchao float8, every recipe and
  TransformerEngine where it imports; ``--sizes`` names its cases, ``--recipes`` its variants.

    python -m benchmarks.perf --device cuda --suites train_step --rounds 5 --modes default,reduce-overhead
    python -m benchmarks.perf --device cpu --suites loss_study

A file holds the suites of this run only (figures of two runs are not comparable), with the
machine, versions, shapes and timing protocol. ``--quick`` is a smoke run: small sizes, few
repeats, written to ``benchmarks/results/smoke/`` (ignored by git) and marked
``"smoke_run": true``. A script, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

from benchmarks import record

record.private_inductor_cache("tetrt-perf-inductor-")  # before torch loads

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tetrt_support.report.timing import Stopwatch  # noqa: E402

# suite -> the results file it belongs to ({device} is filled in)
FILES = {"rope": "perf_{device}", "attention": "perf_{device}", "linear": "perf_{device}",
         "lowering": "lowering", "fake_impls": "fake_impls", "train_step": "train_step_{device}",
         "step_bounds": "step_bounds_{device}", "loss_study": "loss_curves_{device}", "llama4": "llama4_{device}",
         "te_conformance": "te_conformance_{device}", "model_step": "model_step_{device}",
         "host_cost": "host_cost_{device}"}
BENCHMARK_OF_FILE = {"perf_{device}": "perf", "lowering": "lowering", "fake_impls": "fake_impls",
                     "train_step_{device}": "train_step", "step_bounds_{device}": "step_bounds",
                     "loss_curves_{device}": "loss_study", "llama4_{device}": "llama4",
                     "te_conformance_{device}": "te_conformance", "model_step_{device}": "model_step",
                     "host_cost_{device}": "host_cost"}
HOST_SUITES = ("lowering", "fake_impls")  # measure host (CPU) work: --device cpu only
CUDA_SUITES = ("train_step", "step_bounds", "te_conformance")  # measure GPU kernels: --device cuda only
DEFAULT_SUITES = {"cpu": ("rope", "attention", "linear", "lowering", "fake_impls", "host_cost"),
                  "cuda": ("rope", "attention", "linear", "train_step", "step_bounds", "loss_study", "llama4",
                           "model_step")}

SIZES = {  # (device, quick) -> sizes of the device suites
    ("cpu", False): {"rope": [2, 512, 8, 64], "attention": (2, 256, 256, 4), "linear": (256, 512, 512), "llama4": "small"},
    ("cpu", True): {"rope": [1, 64, 4, 32], "attention": (1, 32, 64, 4), "linear": (64, 128, 128), "llama4": "tiny"},
    ("cuda", False): {"rope": [8, 4096, 32, 128], "attention": (8, 2048, 2048, 16), "linear": (8192, 8192, 8192),
                      "llama4": "mid"},
    ("cuda", True): {"rope": [2, 1024, 8, 64], "attention": (2, 512, 512, 8), "linear": (1024, 1024, 1024),
                     "llama4": "small"},
}

LINEAR_RECIPES = ("fp8_current", "mxfp8", "nvfp4")  # the linear suite's default cases

SMOKE_LABEL = "SMOKE RUN (--quick: small sizes, few repeats; not figures to quote)"


Write = Callable[[dict[str, Any]], None]  # stores a suite's partial section


def _rope(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks.rope import bench_rope

    return {"rope": bench_rope(args.device, SIZES[(args.device, args.quick)]["rope"], iters)}


def _attention(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks.rope import bench_attention

    return {"rope_attention": bench_attention(args.device, *SIZES[(args.device, args.quick)]["attention"], iters=iters)}


def _linear(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks.linear import bench_linear

    return {"linear": bench_linear(args.device, *SIZES[(args.device, args.quick)]["linear"], iters=iters,
                                   recipes=args.recipes or list(LINEAR_RECIPES))}


def _lowering(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks import lowering

    return lowering.run(lowering.QUICK if args.quick else lowering.FULL)


def _fake_impls(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks import fake_impls

    return fake_impls.run(fake_impls.QUICK if args.quick else fake_impls.FULL)


def _host_cost(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks import host_cost

    return host_cost.run(args.quick, variants=args.recipes, device=args.device)


def _train_step(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks import train_step

    return train_step.run(args.quick, sizes=args.sizes, variants=args.recipes, rounds=args.rounds, modes=args.modes,
                          profile_dir=args.profile, profile_variants=args.profile_variant,
                          reference_too=args.reference_too, write=write)


def _step_bounds(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks import step_bounds

    return step_bounds.run(args.quick, sizes=args.sizes, recipes=args.recipes, rounds=args.rounds, write=write)


def _loss_study(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks import loss_study

    return loss_study.run(args.device, args.quick, recipes=args.recipes, steps=args.steps)


def _llama4(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks import llama4

    case = llama4.CASES[SIZES[(args.device, args.quick)]["llama4"]]
    return {"llama4": llama4.run(args.device, case, rounds=args.rounds or max(5, iters // 2))}


def _te_conformance(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks import te_conformance

    return te_conformance.run(args.quick, write=write, formats=args.recipes)


def _model_step(args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    from benchmarks import model_step

    return model_step.run(args.device, args.quick, cases=args.sizes, variants=args.recipes, rounds=args.rounds,
                          steps=args.steps, modes=None if args.modes == ["default"] else args.modes, write=write)


# suite -> its runner: (parsed arguments, iterations, write) -> its section
RUNNERS: dict[str, Callable[[argparse.Namespace, int, Write], dict[str, Any]]] = {
    "rope": _rope, "attention": _attention, "linear": _linear, "lowering": _lowering, "fake_impls": _fake_impls,
    "train_step": _train_step, "step_bounds": _step_bounds, "loss_study": _loss_study, "llama4": _llama4,
    "te_conformance": _te_conformance, "model_step": _model_step,
    "host_cost": _host_cost}


def run_suite(suite: str, args: argparse.Namespace, iters: int, write: Write) -> dict[str, Any]:
    """One suite's section: a dict to put under ``suites`` (perf files) or at the top level.

    ``write`` stores a partial section (a long suite saves what it has after each size)."""
    if suite not in RUNNERS:
        raise ValueError(f"unknown suite {suite!r}; valid: {', '.join(FILES)}")
    return RUNNERS[suite](args, iters, write)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The headline ratios of one perf file."""
    s: dict[str, Any] = {}
    for name, entry in result.get("suites", {}).get("rope", {}).get("variants", {}).items():
        if "fraction_of_clone_bandwidth" in entry:
            s[f"rope.{name}.fraction_of_clone"] = round(entry["fraction_of_clone_bandwidth"], 3)
    for key, value in result.get("suites", {}).get("linear", {}).get("ratios", {}).items():
        s[f"linear.{key}"] = round(value, 3)
    return s


def _suite_summary(benchmark: str) -> Callable[[dict[str, Any]], Any]:
    return importlib.import_module(f"benchmarks.{benchmark}").summary


# benchmark -> (the key its file must hold, or None, and the headline printed under it)
HEADLINES: dict[str, tuple[str | None, Callable[[dict[str, Any]], str]]] = {
    "perf": (None, lambda r: json.dumps(summary(r), indent=1)),
    "lowering": ("lowering_time", lambda r: "\n".join(_suite_summary("lowering")(r))),
    "train_step": ("suites", lambda r: json.dumps(_suite_summary("train_step")(r), indent=1)),
    "loss_study": ("recipes", lambda r: json.dumps(_suite_summary("loss_study")(r), indent=1)),
    "llama4": ("llama4", lambda r: json.dumps(_suite_summary("llama4")(r), indent=1)),
    "te_conformance": (None, lambda r: json.dumps(_suite_summary("te_conformance")(r), indent=1)),
    "fake_impls": ("summary", lambda r: json.dumps({"code_lines": r["code_lines"], "summary": r["summary"]}, indent=1)),
}


def headline(result: dict[str, Any]) -> str | None:
    """What :func:`main` prints under a written file; None where its suite has no headline."""
    key, text = HEADLINES.get(result["benchmark"], (None, None))
    if text is None or (key is not None and key not in result):
        return None
    return text(result)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--suites", default=None, help=f"comma-separated, of: {', '.join(FILES)} "
                        "(default: every suite of the device)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few iterations, written to results/smoke/")
    parser.add_argument("--iters", type=int, default=None, help="calls per timed variant of rope, attention, linear")
    parser.add_argument("--recipes", default=None, help="comma-separated recipes of linear and loss_study, variants of "
                        "train_step and model_step (bf16 and torchao_float8_tensorwise included), quantizer formats "
                        "of te_conformance; default: each suite's own")
    parser.add_argument("--out-dir", type=pathlib.Path, default=None, help="write the files here instead")
    training = parser.add_argument_group("train_step and loss_study")
    training.add_argument("--sizes", default=None, help="train_step sizes TxKxN, comma-separated")
    training.add_argument("--rounds", type=int, default=None, help="train_step, llama4: round-robin rounds (samples) per variant")
    training.add_argument("--modes", default="default", help="train_step: torch.compile modes, comma-separated "
                          "(default; reduce-overhead = torch.compile's CUDA graphs; cuda-graph-step = the compiled "
                          "step, forward and backward, captured into one CUDA graph)")
    training.add_argument("--profile", type=pathlib.Path, default=None, help="train_step: write kernel and host profiles here")
    training.add_argument("--profile-variant", default="fp8_current",
                          help="train_step: comma-separated VARIANT or VARIANT@TxKxN to profile (default size: the first)")
    training.add_argument("--reference-too", action="store_true",
                          help="train_step: also time the recipes with TETRT_QUANT_KERNELS=0 (reference quantizers)")
    training.add_argument("--steps", type=int, default=None, help="loss_study: training steps per recipe")
    args = parser.parse_args(argv)
    split = lambda text: [v.strip() for v in text.split(",") if v.strip()] if text else None  # noqa: E731
    args.recipes, args.sizes, args.modes = split(args.recipes), split(args.sizes), split(args.modes)
    args.profile_variant = split(args.profile_variant)
    args.suites = [s.strip() for s in args.suites.split(",") if s.strip()] if args.suites else list(DEFAULT_SUITES[args.device])
    unknown = [s for s in args.suites if s not in FILES]
    if unknown:
        parser.error(f"unknown suites {unknown}; valid: {', '.join(FILES)}")
    host = [s for s in args.suites if s in HOST_SUITES]
    if host and args.device != "cpu":
        parser.error(f"suites {host} measure host work: run them with --device cpu")
    gpu_only = [s for s in args.suites if s in CUDA_SUITES]
    if gpu_only and args.device != "cuda":
        parser.error(f"suites {gpu_only} measure GPU kernels: run them with --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    return args


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    iters = args.iters or (5 if args.quick else (50 if args.device == "cuda" else 10))
    if args.quick:
        print(SMOKE_LABEL)
    torch.manual_seed(0)
    files: dict[str, dict[str, Any]] = {}
    for suite in tqdm(args.suites, desc="suites", unit="suite"):
        name = FILES[suite].format(device=args.device)
        benchmark = BENCHMARK_OF_FILE[FILES[suite]]
        result = files.setdefault(name, {"benchmark": benchmark, "smoke_run": args.quick, "machine": record.machine(args.device)})
        path = record.results_path(name, smoke=args.quick, out_dir=args.out_dir)
        indent = 1 if benchmark in ("fake_impls", "train_step", "step_bounds", "loss_study") else 2

        def store(section: dict[str, Any], result: dict[str, Any] = result, benchmark: str = benchmark,
                  path: pathlib.Path = path, indent: int = indent) -> None:
            result["machine"].update(section.pop("machine", {}))  # a suite may add what it saw at its end
            if benchmark == "perf":
                result.setdefault("suites", {}).update(section)
            else:
                result.update(section)
            record.write(path, result, indent=indent)

        with Stopwatch() as wall:
            try:
                section = run_suite(suite, args, iters, lambda partial: store(dict(partial)))
            except Exception as e:  # noqa: BLE001 - one failing suite must not lose the others' results
                section = {suite: record.error_record(e)}
        result["machine"]["benchmark_wall_s"] = result["machine"].get("benchmark_wall_s", 0.0) + wall.wall_s
        store(section)
    for name, result in files.items():
        path = record.results_path(name, smoke=args.quick, out_dir=args.out_dir)
        print(f"wrote {path}" + (f"  [{SMOKE_LABEL}]" if args.quick else ""))
        text = headline(result)
        if text is not None:
            print(text)


def suite_main(suite: str, argv: list[str] | None = None) -> None:
    """``python -m benchmarks.<suite> ARGS``: :func:`main` with ``--suites <suite> ARGS``.

    ``train_step`` runs on cuda; ``loss_study`` and ``model_step`` on cuda where there is
    one, else on the CPU (``--device`` overrides). ``python -m benchmarks.model_step merge
    OUT IN [IN ...]`` writes :func:`benchmarks.model_step.merge_runs` of the IN files to OUT."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if suite == "train_step":
        main(["--device", "cuda", "--suites", suite, *argv])
        return
    if suite == "model_step" and argv[:1] == ["merge"]:
        from benchmarks.model_step import merge_runs

        if len(argv) < 3:
            raise SystemExit("usage: python -m benchmarks.model_step merge OUT IN [IN ...]")
        parts = [json.loads(pathlib.Path(p).read_text()) for p in argv[2:]]
        record.write(pathlib.Path(argv[1]), merge_runs(parts), indent=2)
        return
    if "--device" not in argv:
        argv = ["--device", "cuda" if torch.cuda.is_available() else "cpu", *argv]
    main(["--suites", suite, *argv])


if __name__ == "__main__":
    sys.exit(main())
