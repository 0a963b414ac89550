"""Time two test files run side by side, as two pytest-xdist workers run them, with torch's
OpenMP threads waiting as they do by default (spinning, then sleeping) and passively (the
root ``conftest.py``'s setting for test runs).

    python scripts/wait_policy_time.py            # writes benchmarks/results/omp_wait_policy.json
    python scripts/wait_policy_time.py --rounds 3 --files tests/a.py tests/b.py

Each round runs the pair once per policy, alternating which policy goes first. A script, not
a test: it asserts nothing, and a run whose tests fail is recorded with its last line.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "omp_wait_policy.json"
FILES = ("tests/quant/test_linear_dynamic.py", "tests/quant/test_linear_usage.py")
# An empty value keeps libgomp's default (it warns and ignores it); the root conftest.py only
# fills the variable in when it is absent.
POLICIES = {"default (spin, then sleep)": "", "PASSIVE": "PASSIVE"}


def _pair(files: tuple[str, ...], policy: str) -> dict[str, Any]:
    env = dict(os.environ, OMP_WAIT_POLICY=policy)
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-n", "0", f], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for f in files]
    ends: dict[str, Any] = {}
    for f, proc in zip(files, procs):
        out, _ = proc.communicate()
        ends[f] = {"seconds": round(time.perf_counter() - start, 1), "returncode": proc.returncode,
                   "summary": out.strip().splitlines()[-1] if out.strip() else ""}
    return {"both_seconds": round(time.perf_counter() - start, 1), "files": ends}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--files", nargs=2, default=list(FILES))
    args = parser.parse_args(argv)
    files = tuple(args.files)
    rounds = []
    for i, order in enumerate(record.alternating_orders(list(POLICIES), args.rounds)):
        row: dict[str, Any] = {"order": list(order)}
        for name in order:
            row[name] = _pair(files, POLICIES[name])
            print(f"round {i + 1}: {name}: {row[name]['both_seconds']} s", flush=True)
        rounds.append(row)
    result = {
        "benchmark": "omp_wait_policy",
        "machine": record.machine("cpu"),
        "protocol": "the two files started together, each `python -m pytest -q -n 0 FILE` in its own process; "
                    "wall seconds until each ends and until both have; OMP_WAIT_POLICY set per run",
        "files": list(files),
        "rounds": rounds,
    }
    record.write(OUT, result)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
