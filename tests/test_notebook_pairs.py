"""Each notebook's py:percent source and its stored .ipynb hold the same cells."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_notebook_pairs_are_in_sync() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "notebooks.py"), "check-sync"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
