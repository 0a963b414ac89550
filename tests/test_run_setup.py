"""How ``python -m pytest`` sets up the run (the root ``conftest.py``): the files handed out
first exist, torch's OpenMP threads wait passively in every process the run starts, and the
garbage collector runs full collections rarely."""

from __future__ import annotations

import gc
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _root_conftest():  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_files_handed_out_first_exist_once_each() -> None:
    long_first = _root_conftest().LONG_FIRST
    assert len(set(long_first)) == len(long_first)
    missing = [path for path in long_first if not (ROOT / path).is_file()]
    assert not missing, f"LONG_FIRST names files that are gone: {missing}"


def test_torch_in_a_process_the_run_starts_waits_passively() -> None:
    """The policy is in the run's environment (PASSIVE unless the caller set another), and
    torch's own OpenMP runtime in a child process takes it: ``OMP_DISPLAY_ENV=VERBOSE`` prints
    the settings the runtime read when torch loaded it, and passive threads never spin."""
    policy = os.environ.get("OMP_WAIT_POLICY")
    assert policy is not None, "the root conftest.py sets OMP_WAIT_POLICY before torch loads"
    if policy.upper() != "PASSIVE":
        pytest.skip(f"the caller set OMP_WAIT_POLICY={policy!r}, which the run keeps")
    env = dict(os.environ, OMP_DISPLAY_ENV="VERBOSE")
    child = subprocess.run([sys.executable, "-c", "import torch; torch.ones(4).sum()"], env=env,
                           capture_output=True, text=True, timeout=300, check=True)
    shown = child.stderr + child.stdout
    # OpenMP shows its default as PASSIVE too; the spin count tells them apart (300000 there)
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in shown and "GOMP_SPINCOUNT = '0'" in shown, shown[-2000:]


def test_this_process_froze_what_collection_made_and_collects_in_full_rarely() -> None:
    """Set once the tests are collected, in every worker (and in a run without workers)."""
    assert gc.get_freeze_count() > 10_000  # torch alone leaves more than that
    assert gc.get_threshold()[2] == _root_conftest().FULL_COLLECTION_AFTER
