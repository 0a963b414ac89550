"""CPU seconds of test files at a base commit and in the working tree, alternating: what a change
to the test set-up or the pipeline costs or saves, on a shared machine where wall time is noisy.

    python scripts/suite_cpu_time.py                  # writes benchmarks/results/suite_cpu_time.json
    python scripts/suite_cpu_time.py --base HEAD~2 --rounds 3 tests/quant/test_distributed.py

The base runs from a detached ``git worktree`` of ``--base`` (its own ``tetrt_support`` first
on the path), the working tree from the repository. Each run is one ``python -m pytest -q
-n 0 TARGETS`` process; its CPU seconds are user + system time of that process and every
process it waited for (xdist is off; notebook kernels, ranks, compilers and subprocesses are
counted), from ``getrusage(RUSAGE_CHILDREN)``. A script, not a test: it asserts nothing, and
a run whose tests fail is recorded with its last line.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "suite_cpu_time.json"
# the files the engine's build cache, the exact decompositions' single trace and the ranks'
# launcher touch most
TARGETS = (
    "tests/compiler/test_compile_matrix.py",
    "tests/compiler/test_caller_program_unchanged.py",
    "tests/compiler/test_interface.py",
    "tests/complex/test_rules_elementwise.py::test_special_value_tables_run_in_one_onnxruntime_block",
    "tests/quant/test_distributed_training.py",
    "notebooks/09_quantized_training_across_ranks.ipynb",
)


def _run(cwd: pathlib.Path, targets: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # each run makes its own (tests/conftest.py)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *targets],
                          cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = done.stdout.strip().splitlines()
    return {"wall_seconds": round(wall, 1), "user_seconds": round(after.ru_utime - before.ru_utime, 1),
            "system_seconds": round(after.ru_stime - before.ru_stime, 1),
            "cpu_seconds": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "returncode": done.returncode, "summary": lines[-1] if lines else done.stderr[-300:]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the commit to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    parser.add_argument("targets", nargs="*", default=list(TARGETS))
    args = parser.parse_args(argv)
    base = subprocess.run(["git", "rev-parse", args.base], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    changed = subprocess.run(["git", "status", "--short"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    with tempfile.TemporaryDirectory(prefix="tetrt-suite-base-") as tmp:
        tree = pathlib.Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            places = {f"base {base[:10]}": tree, "working tree": ROOT}
            rounds = []
            for i, order in enumerate(record.alternating_orders(list(places), args.rounds)):
                row: dict[str, Any] = {"order": list(order)}
                for name in order:
                    row[name] = _run(places[name], args.targets)
                    print(f"round {i + 1}: {name}: {row[name]['cpu_seconds']} CPU s, "
                          f"{row[name]['wall_seconds']} s wall | {row[name]['summary']}", flush=True)
                rounds.append(row)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    result = {
        "benchmark": "suite_cpu_time",
        "machine": record.machine("cpu"),
        "protocol": "per run one `python -m pytest -q -n 0 -p no:cacheprovider TARGETS` process; CPU seconds "
                    "are user + system time of it and of every process it waited for (getrusage "
                    "RUSAGE_CHILDREN); the base from a git worktree, its package first on PYTHONPATH",
        "base": base,
        "working_tree_changes": changed,
        "targets": list(args.targets),
        "rounds": rounds,
    }
    record.write(args.out, result)
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
