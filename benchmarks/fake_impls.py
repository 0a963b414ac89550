"""TensorProto versus make_empty_traceable, measured: the numbers behind notebook 04.

For both fake-impl strategies of ``tetrt_support.quant.linear.Linear``, on CPU, with a
tiny MLP (Linear 64->64, ReLU, Linear 64->32, batch 32) trained by SGD under
``torch.compile(fullgraph=True)``, per recipe and backend (aot_eager, inductor):

- compile time: the first step's time minus the median later step (Dynamo + AOTAutograd
  + backend, forward and backward graphs), as wall clock and as CPU time of the process
  and its finished children (the C++ compiler; inductor compiles in-process here). On a
  shared, loaded machine the CPU time is the figure to compare: the wall clock counts
  the time spent waiting for a core;
- frames compiled, graphs captured and graph breaks over the steps;
- the steady-state time of one training step (the fastest later step), compiled and
  eager, wall clock and CPU;
- the time of one call of the forward op's fake impl under FakeTensorMode -- where the
  two strategies do different work at compile time -- and of one ``reassemble`` of a
  saved quantized tensor from its flat buffers -- their different work at run time (the
  backward op does it twice per layer and step); both in CPU time, the fastest of 7 samples
  of 40 calls;
- lines of code (non-blank, non-comment, docstrings excluded) of each strategy's module
  and of the plumbing both share.

Every (strategy, backend, repeat) runs in its own fresh process with its own empty
inductor cache, after a warm-up compile of a plain nn.Linear step, so that one-time costs
(imports, the C++ toolchain's first run) and cache hits favour neither strategy; the
order of the strategies alternates between repeats. Run by
``python -m benchmarks.perf --suites fake_impls`` (~5 min on 2 loaded cores; ``--quick``:
one repeat, aot_eager only), which writes ``benchmarks/results/fake_impls.json`` with the
machine, versions and shapes. ``python -m benchmarks.fake_impls STRATEGY BACKEND`` is the
child process of one (strategy, backend) run, not an entry point.

A script, not a test: timings on a shared machine are noisy, so nothing here asserts.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from benchmarks import record
from tetrt_support.report.timing import Stopwatch, time_calls

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIZES = (64, 64, 32)
BATCH = 32
STEPS = 10  # 1 compiling step + 9 timed steps
MICRO_BATCHES, CALLS_PER_BATCH = 7, 40  # micro-benchmarks: fastest of 7 samples of 40 calls


@dataclass(frozen=True)
class FakeImplSizes:
    backends: tuple[str, ...] = ("aot_eager", "inductor")
    repeats: int = 2


FULL = FakeImplSizes()
QUICK = FakeImplSizes(backends=("aot_eager",), repeats=1)


def _min_us(fn: Any) -> float:
    """CPU microseconds per call: the fastest sample (the least disturbed by the shared box)."""
    timing = time_calls(fn, calls=MICRO_BATCHES * CALLS_PER_BATCH, calls_per_sample=CALLS_PER_BATCH, warmup=0, clock="cpu")
    return timing.best_s * 1e6


def _child(strategy: str, backend: str) -> dict[str, Any]:
    """Runs in a fresh process: every measurement for one strategy and backend."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tetrt_support.quant  # noqa: F401  (registers the quantizers)
    from tetrt_support.quant.fake_impls import get_strategy
    from tetrt_support.report.fake_impl_measure import tiny_mlp, train
    from tetrt_support.quant.ops import flatten_quantized
    from tetrt_support.quant.recipes import RECIPES

    torch.set_num_threads(1)  # the box is shared; one thread keeps runs comparable
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(BATCH, SIZES[0], generator=g), torch.randn(BATCH, SIZES[-1], generator=g)

    # Warm-up: pay the one-time costs of this backend on a graph unrelated to either strategy.
    warm = torch.nn.Sequential(torch.nn.Linear(SIZES[0], SIZES[-1]))
    train(warm, x, target, steps=2, backend=backend)

    rows = []
    for recipe in RECIPES:
        compiled, _ = train(tiny_mlp(recipe, strategy, SIZES), x, target, steps=STEPS, backend=backend)
        eager, _ = train(tiny_mlp(recipe, strategy, SIZES), x, target, steps=STEPS)
        steady = statistics.median(compiled.step_s)  # compile time = first step - a typical step
        layer = tiny_mlp(recipe, strategy, SIZES)[0]
        weight = layer.weight.detach()
        with FakeTensorMode() as mode:
            fx, fw = mode.from_tensor(x), mode.from_tensor(weight)
            args = (fx, fw, None, [], layer.input_quantizer, layer.weight_quantizer, layer.grad_quantizer, True, True,
                    list(layer.fast_accum), None, None)
            fake_us = _min_us(lambda: layer._ops.forward._abstract_fn(*args))
        # The strategy's run-time work: rebuilding a saved quantized tensor in the backward op.
        impl = get_strategy(strategy)
        saved = flatten_quantized(layer.input_quantizer.quantize(x))
        reassemble_us = _min_us(lambda: impl.reassemble(
            impl.fake_quantized(layer.input_quantizer, x.shape, x.dtype, torch.device("meta")), saved))
        steady_cpu = statistics.median(compiled.step_cpu_s)
        rows.append({
            "strategy": strategy, "backend": backend, "recipe": recipe,
            "compile_s": compiled.first_step_s - steady,
            "compile_cpu_s": compiled.first_step_cpu_s - steady_cpu,
            "step_cpu_ms": min(compiled.step_cpu_s) * 1e3, "eager_step_cpu_ms": min(eager.step_cpu_s) * 1e3,
            "frames": compiled.frames, "graphs": compiled.graphs, "graph_breaks": compiled.graph_breaks,
            "step_ms": min(compiled.step_s) * 1e3, "eager_step_ms": min(eager.step_s) * 1e3,
            "fake_impl_us": fake_us, "reassemble_us": reassemble_us,
            "loss_max_rel_diff_vs_eager": max(abs(a - b) / abs(b) for a, b in zip(compiled.losses, eager.losses)),
        })
    return {"rows": rows}


def _run_child(strategy: str, backend: str) -> list[dict[str, Any]]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="tetrt-bench-fake-impls-"),
               TORCHINDUCTOR_COMPILE_THREADS="1")  # compile in-process: its CPU time is then counted
    env.pop("TORCH_LOGS", None)
    done = subprocess.run([sys.executable, "-m", "benchmarks.fake_impls", strategy, backend],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"fake_impls child ({strategy}, {backend}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["rows"]


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for strategy in sorted({r["strategy"] for r in rows}):
        for backend in sorted({r["backend"] for r in rows}):
            sel = [r for r in rows if r["strategy"] == strategy and r["backend"] == backend]
            out.setdefault(strategy, {})[backend] = {
                "compile_s_median": statistics.median(r["compile_s"] for r in sel),
                "compile_cpu_s_median": statistics.median(r["compile_cpu_s"] for r in sel),
                "step_cpu_ms_median": statistics.median(r["step_cpu_ms"] for r in sel),
                "eager_step_cpu_ms_median": statistics.median(r["eager_step_cpu_ms"] for r in sel),
                "step_ms_median": statistics.median(r["step_ms"] for r in sel),
                "eager_step_ms_median": statistics.median(r["eager_step_ms"] for r in sel),
                "fake_impl_us_median": statistics.median(r["fake_impl_us"] for r in sel),
                "reassemble_us_median": statistics.median(r["reassemble_us"] for r in sel),
                "frames_max": max(r["frames"] for r in sel),
                "graphs_max": max(r["graphs"] for r in sel),
                "graph_breaks_total": sum(r["graph_breaks"] for r in sel),
                "n": len(sel),
            }
    return out


def run(sizes: FakeImplSizes) -> dict[str, Any]:
    """Every (strategy, backend, repeat) in a fresh child process; the results file's content."""
    import torch
    from tqdm import tqdm

    from tetrt_support.quant.fake_impls import FAKE_IMPLS
    from tetrt_support.report.fake_impl_measure import strategy_code_lines

    jobs = []
    for repeat, order in enumerate(record.alternating_orders(FAKE_IMPLS, sizes.repeats)):
        jobs += [(s, b, repeat) for b in sizes.backends for s in order]
    rows = []
    with Stopwatch() as wall:
        for strategy, backend, repeat in tqdm(jobs, desc="fake_impls", unit="run"):
            rows += [dict(r, repeat=repeat) for r in _run_child(strategy, backend)]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # added to the machine record the entry point took at the start
        "machine": {"loadavg_at_end": list(os.getloadavg()), "threads_per_run": 1},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "config": {"mlp_sizes": list(SIZES), "batch": BATCH, "steps": STEPS, "repeats": sizes.repeats,
                   "backends": list(sizes.backends), "micro_batches": MICRO_BATCHES, "calls_per_batch": CALLS_PER_BATCH,
                   "device": "cpu"},
        "code_lines": strategy_code_lines(),
        "summary": _summary(rows),
        "rows": rows,
        "wall_s": wall.wall_s,
    }


if __name__ == "__main__":  # the child process of one (strategy, backend) run
    print(json.dumps(_child(*sys.argv[1:3])))
