"""The stored notebooks as JupyterLab and a reviewer meet them.

Each notebook's py:percent source and its .ipynb hold the same cells (jupytext's own
comparison), jupytext's configuration pairs them (so saving either in Lab writes both),
the .ipynb records the kernel Lab would record (so opening it leaves the file untouched),
and the stored errors are short and free of machine paths.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import subprocess
import sys

import pytest
from jupytext.config import load_jupytext_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
_spec = importlib.util.spec_from_file_location("tetrt_notebook_script", ROOT / "scripts" / "notebooks.py")
_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_script)
KERNELSPEC = _script.KERNELSPEC  # the one definition, in the machinery script
# What ipykernel reports in its kernel_info reply; Lab stores it on opening, so a stored
# notebook missing any of these fields would be rewritten by autosave.
LANGUAGE_INFO_KEYS = {"codemirror_mode", "file_extension", "mimetype", "name",
                      "nbconvert_exporter", "pygments_lexer", "version"}
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|root|tmp|usr|opt|var)/[\w.-]+|site-packages|ipykernel_\d+")


def test_notebook_pairs_are_in_sync() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "notebooks.py"), "check-sync"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_jupytext_pairs_the_notebook_with_its_source(ipynb: pathlib.Path) -> None:
    config = load_jupytext_config(str(ipynb.parent))
    assert config is not None, "notebooks/jupytext.toml is missing"
    assert config.default_formats(str(ipynb)) == "ipynb,py:percent"


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_notebook_records_the_kernel_lab_records(ipynb: pathlib.Path) -> None:
    metadata = json.loads(ipynb.read_text())["metadata"]
    assert metadata.get("kernelspec") == KERNELSPEC
    missing = LANGUAGE_INFO_KEYS - set(metadata.get("language_info", {}))
    assert not missing, f"language_info lacks {sorted(missing)}: regenerate the notebook"


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_stored_outputs_are_short_errors_without_machine_paths(ipynb: pathlib.Path) -> None:
    problems = []
    for number, cell in enumerate(json.loads(ipynb.read_text())["cells"]):
        for output in cell.get("outputs", []):
            text = json.dumps({k: v for k, v in output.items() if k != "data"} |
                              {k: v for k, v in output.get("data", {}).items() if k.startswith("text/")})
            for match in MACHINE_PATH.finditer(text):
                problems.append(f"cell {number}: machine path {match.group(0)!r}")
            if output.get("output_type") == "error" and "Traceback (most recent call last)" in text:
                problems.append(f"cell {number}: full traceback of {output['ename']}")
    assert not problems, "\n".join(problems[:20]) + "\n(regenerate with tetrt_support.notebook.setup())"
