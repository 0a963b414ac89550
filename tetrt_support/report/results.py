"""The one reader of ``benchmarks/results/*.json``.

Notebooks never measure: they read the files that ``python -m benchmarks.perf`` wrote, so
a replay shows the same numbers until someone re-measures. Every file names the benchmark
that wrote it (``"benchmark"``), and each benchmark's file has the sections listed in
:data:`SECTIONS`; :func:`load` checks both and says which command writes a missing file.
A smoke run (``--quick``) is marked ``"smoke_run": true``; its figures are for checking the
machinery, not for quoting.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

__all__ = ["RESULTS_DIR", "SECTIONS", "is_smoke_run", "load"]

RESULTS_DIR = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"

# benchmark -> the top-level sections its results file must have
SECTIONS: dict[str, tuple[str, ...]] = {
    "perf": ("machine", "suites"),
    "lowering": ("machine", "lowering_time", "rope_runtime_cpu"),
    "fake_impls": ("machine", "versions", "config", "code_lines", "summary", "rows"),
    "train_step": ("machine", "suites"),
    "step_bounds": ("machine", "suites"),
    "loss_study": ("machine", "setup", "recipes"),
    "llama4": ("machine", "llama4"),
    "gpu_check": ("torch", "gpu", "bit_identity"),
    "hf_sweep": ("command", "versions", "tolerance", "rows"),
    "model_step": ("machine", "setup", "suites"),
    "te_conformance": ("machine", "versions", "comparison_rules"),
    "host_cost": ("machine", "host_cost"),
    "install_time": ("machine", "protocol", "commands", "rounds"),
    "omp_wait_policy": ("machine", "protocol", "files", "rounds"),
    "gc_settings": ("machine", "protocol", "file", "rounds"),
    "suite_cpu_time": ("machine", "protocol", "base", "targets", "rounds"),
}

_COMMANDS = {
    "perf": "python -m benchmarks.perf --device cpu|cuda --suites rope,attention,linear",
    "lowering": "python -m benchmarks.perf --suites lowering",
    "fake_impls": "python -m benchmarks.perf --suites fake_impls",
    "train_step": "python -m benchmarks.perf --device cuda --suites train_step",
    "step_bounds": "python -m benchmarks.perf --device cuda --suites step_bounds",
    "loss_study": "python -m benchmarks.perf --device cpu|cuda --suites loss_study",
    "llama4": "python -m benchmarks.perf --device cuda --suites llama4",
    "gpu_check": "python scripts/gpu_check.py   (CUDA)",
    "hf_sweep": "python scripts/sweep_hf.py",
    "model_step": "python -m benchmarks.perf --device cuda --suites model_step",
    "te_conformance": "python -m benchmarks.perf --device cuda --suites te_conformance   (needs TransformerEngine)",
    "host_cost": "python -m benchmarks.perf --device cpu --suites host_cost",
    "install_time": "python scripts/install_time.py",
    "omp_wait_policy": "python scripts/wait_policy_time.py",
    "gc_settings": "python scripts/gc_settings_time.py",
    "suite_cpu_time": "python scripts/suite_cpu_time.py",
}


def load(path: str | pathlib.Path, benchmark: str) -> dict[str, Any]:
    """The results file at ``path``, checked to be one that ``benchmark`` wrote."""
    if benchmark not in SECTIONS:
        raise ValueError(f"unknown benchmark {benchmark!r}; results files are written by {sorted(SECTIONS)}")
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `{_COMMANDS[benchmark]}` to write it")
    result = json.loads(path.read_text())
    written_by = result.get("benchmark") if isinstance(result, dict) else None
    if written_by != benchmark:
        raise ValueError(f"{path} was written by benchmark {written_by!r}, not {benchmark!r} (its 'benchmark' field)")
    missing = [key for key in SECTIONS[benchmark] if key not in result]
    if missing:
        raise ValueError(f"{path} lacks {missing}: not a complete {benchmark!r} results file")
    return result


def is_smoke_run(result: Mapping[str, Any]) -> bool:
    """Whether the file comes from a ``--quick`` smoke run (small sizes, few repeats)."""
    return bool(result.get("smoke_run", False))


def repeat_spread(rows: list[Mapping[str, Any]], key: str, by: tuple[str, ...]) -> tuple[float, float]:
    """The smallest and largest spread of ``key`` between the repeats of one configuration
    (rows equal on ``by``), as (max - min) / mean in percent: how far apart two runs of the
    same thing landed."""
    groups: dict[tuple[Any, ...], list[float]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in by), []).append(float(row[key]))
    spreads = [100 * (max(v) - min(v)) / (sum(v) / len(v)) for v in groups.values() if len(v) > 1 and sum(v)]
    if not spreads:
        raise ValueError(f"no configuration has two repeats of {key!r}")
    return min(spreads), max(spreads)
