"""benchmarks.record: a failed part is stored as one line plus the repository frames it passed;
a benchmark process's inductor cache is the caller's, or its own, gone when it exits."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import record

REPO = pathlib.Path(record.__file__).resolve().parent.parent


def _raise_here() -> None:
    raise RuntimeError("first line\nsecond line")


def test_an_error_is_stored_as_its_type_and_first_line() -> None:
    with pytest.raises(RuntimeError) as info:
        _raise_here()
    assert record.error_record(info.value) == {"error": "RuntimeError: first line"}


def test_package_frames_name_repo_files_relative_and_nothing_from_outside() -> None:
    with pytest.raises(RuntimeError) as info:
        _raise_here()
    frames = record.package_frames(info.value)
    here = pathlib.Path(__file__).resolve().relative_to(REPO).as_posix()
    line = _raise_here.__code__.co_firstlineno + 1
    assert frames[-1] == f"{here}:{line} in _raise_here"
    assert all(not f.startswith("/") and ".venv" not in f for f in frames)  # no machine path, no site-packages


def test_package_frames_read_the_user_code_lines_dynamo_puts_in_its_message() -> None:
    """Dynamo's Unsupported names the traced frames only in its message ("from user code")."""
    fake = RuntimeError('Unsupported\nfrom user code:\n   File "' + __file__ + '", line 3, in traced\n'
                        '    x = 1\n   File "/nowhere/else.py", line 9, in f')
    here = pathlib.Path(__file__).resolve().relative_to(REPO).as_posix()
    assert record.package_frames(fake) == [f"{here}:3 in traced"]  # the absent file is dropped


def test_a_benchmark_process_removes_the_inductor_cache_it_made_and_keeps_the_callers(tmp_path: pathlib.Path) -> None:
    code = "from benchmarks import record; print(record.private_inductor_cache('tetrt-record-test-'))"
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    made = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    path = pathlib.Path(made.stdout.strip())
    assert path.name.startswith("tetrt-record-test-") and not path.exists()  # removed at exit
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path)
    kept = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert kept.stdout.strip() == str(tmp_path) and tmp_path.is_dir()
