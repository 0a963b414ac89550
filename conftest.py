"""How ``python -m pytest`` spreads the run over CPU cores (pyproject's ``-n auto --dist loadfile``).

Each test file and each notebook runs whole, in its own order, on one pytest-xdist worker, so
a module-scoped fixture is built once and a notebook's cells share one kernel. ``-n auto``
starts a worker per CPU core (at most ``MAX_WORKERS``; ``PYTEST_XDIST_AUTO_NUM_WORKERS``
overrides), and none when the arguments name a single file or tests of one file, which run
in-process as without xdist. ``-n 0`` runs everything in-process. The files in ``LONG_FIRST``
are handed out first, so that no worker is left alone with a long one at the end.
"""

from __future__ import annotations

import gc
import os
import pathlib

import pytest

# A worker per core, plus notebook kernels, gloo ranks and compiler subprocesses: more busy
# processes than cores. torch's OpenMP threads spin on a core for a while when they wait for
# work, taking the core another worker computes on; passive threads sleep instead
# (benchmarks/results/omp_wait_policy.json, scripts/wait_policy_time.py). The same threads
# split the same work, so every number stays the same. OpenMP reads the variable when torch
# loads it, before any test imports torch; processes the tests start inherit it. A value
# you set is kept (an empty one leaves OpenMP's default).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

MAX_WORKERS = 8
# Python's full garbage collection walks every tracked object, and torch, transformers and the
# collected tests make that slow. After collection the run freezes what exists (it lives to the
# end) and collects in full after this many younger collections instead of 10: an export-heavy
# file spent 7.2-9.4 s collecting with Python's defaults, 1.1-1.2 s so
# (benchmarks/results/gc_settings.json). Young garbage goes as usual; what only a full
# collection frees goes later.
FULL_COLLECTION_AFTER = 1000
# The longest units of the run, longest first: each took 15 s or more of one worker in a
# full run on a loaded 2-core machine (the site's browser test, last, is long only where
# Chromium is). The rest keep their collection order. A stale entry costs balance, never a
# check. The two codecs' whole-forward compiles are two files so that two workers share them.
LONG_FIRST = (
    "tests/quant/test_inline_linear.py",
    "tests/zoo/test_codec_models.py",
    "tests/quant/test_linear_dynamic.py",
    "tests/zoo/test_hf_families.py",
    "notebooks/07_quantizer_numerics.ipynb",
    "tests/complex/test_rules_elementwise.py",
    "tests/zoo/test_codec_neucodec.py",
    "tests/quant/test_kernels_cpu.py",
    "tests/quant/test_distributed_training.py",
    "notebooks/08_torch_tensorrt_interface.ipynb",
    "tests/compiler/test_compile_matrix.py",
    "notebooks/06_hugging_face_sweep.ipynb",
    "tests/quant/test_linear_usage.py",
    "tests/compiler/test_backend.py",
    "tests/quant/test_te_exact.py",
    "tests/compiler/test_save_load_formats.py",
    "tests/compiler/test_user_reports.py",
    "notebooks/02_codegen_restoration.ipynb",
    "tests/quant/test_linear_compile.py",
    "tests/report/test_llama4_benchmark.py",
    "tests/report/test_model_step.py",
    "tests/test_site.py",
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    override = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if override:
        return None  # xdist's own hook reads it
    here = pathlib.Path(config.invocation_params.dir)
    files = {arg.split("::")[0] for arg in config.args}
    if len(files) == 1 and (here / next(iter(files))).is_file():
        return 0
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    root = config.rootpath

    def key(item: pytest.Item) -> int:
        try:
            name = item.path.relative_to(root).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(name, len(rank))

    items.sort(key=key)  # stable: every file keeps its own order


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)
