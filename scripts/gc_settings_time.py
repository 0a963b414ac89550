"""Time Python's garbage collection in one test file, with Python's defaults and with the
test run's settings (the root ``conftest.py`` freezes what collection imported and collects
in full after ``FULL_COLLECTION_AFTER`` younger collections).

    python scripts/gc_settings_time.py            # writes benchmarks/results/gc_settings.json
    python scripts/gc_settings_time.py --rounds 2 --file tests/zoo/test_hf_families.py

The file runs in its own process (``python -m pytest -q -n 0 FILE``) with a small plugin
that times every collection through ``gc.callbacks``; for Python's defaults the plugin undoes
the conftest's settings after collection. A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "gc_settings.json"
FILE = "tests/zoo/test_codec_models.py"
SETTINGS = ("python defaults", "test run (conftest.py)")

_PLUGIN = textwrap.dedent(
    """
    import gc, json, os, time

    import pytest

    _seconds, _counts, _began = [0.0, 0.0, 0.0], [0, 0, 0], [0.0]
    _PYTHON_THRESHOLD = gc.get_threshold()  # read when pytest loads the plugin, before the conftest's hook

    def _timed(phase, info):
        if phase == "start":
            _began[0] = time.perf_counter()
        else:
            _seconds[info["generation"]] += time.perf_counter() - _began[0]
            _counts[info["generation"]] += 1

    gc.callbacks.append(_timed)

    @pytest.hookimpl(trylast=True)  # after the conftest's hook
    def pytest_collection_finish(session):
        if os.environ["GC_SETTING"] == "python defaults":
            gc.unfreeze()
            gc.set_threshold(*_PYTHON_THRESHOLD)
        _seconds[:] = [0.0, 0.0, 0.0]
        _counts[:] = [0, 0, 0]

    def pytest_sessionfinish(session):
        with open(os.environ["GC_OUT"], "w") as f:
            json.dump({"seconds_per_generation": [round(s, 2) for s in _seconds], "collections_per_generation": _counts,
                       "frozen_objects": gc.get_freeze_count(), "threshold": list(gc.get_threshold())}, f)
    """
)


def _run(file: str, setting: str, workdir: pathlib.Path) -> dict[str, Any]:
    out = workdir / "gc.json"
    env = dict(os.environ, GC_SETTING=setting, GC_OUT=str(out),
               PYTHONPATH=os.pathsep.join([str(workdir), os.environ.get("PYTHONPATH", "")]))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "gc_timing", file], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    row: dict[str, Any] = {"seconds": round(time.perf_counter() - start, 1),
                           "summary": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""}
    if out.exists():
        row.update(json.loads(out.read_text()))
        row["gc_seconds"] = round(sum(row["seconds_per_generation"]), 2)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--file", default=FILE)
    args = parser.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="tetrt-gc-") as tmp:
        workdir = pathlib.Path(tmp)
        (workdir / "gc_timing.py").write_text(_PLUGIN)
        for i, order in enumerate(record.alternating_orders(SETTINGS, args.rounds)):
            row: dict[str, Any] = {"order": list(order)}
            for setting in order:
                row[setting] = _run(args.file, setting, workdir)
                print(f"round {i + 1}: {setting}: {row[setting].get('gc_seconds')} s collecting, "
                      f"{row[setting]['seconds']} s in all", flush=True)
            rounds.append(row)
    result = {
        "benchmark": "gc_settings",
        "machine": record.machine("cpu"),
        "protocol": "one test file in its own process (python -m pytest -q -n 0 FILE); the seconds of every "
                    "collection after test collection, timed by gc.callbacks, and the wall seconds of the run",
        "file": args.file,
        "rounds": rounds,
    }
    record.write(OUT, result)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
