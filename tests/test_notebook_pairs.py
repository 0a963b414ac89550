"""The stored notebooks as JupyterLab and a reviewer meet them.

Each notebook's py:percent source and its .ipynb hold the same cells (jupytext's own
comparison), jupytext's configuration pairs them (so saving either in Lab writes both),
the .ipynb records the kernel Lab would record (so opening it leaves the file untouched),
the stored errors are short and free of machine paths, every stored line fits the page
(``OUTPUT_WIDTH``), every line of code does too (``CODE_WIDTH``) and every table is an HTML
table with its text twin.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import jupytext
import pytest
from jupytext.config import load_jupytext_config

from tetrt_support.report.tables import OUTPUT_WIDTH

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
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The dashed rule under a text table's headers (two or more columns): what a Table's text
# twin, tabulate or a hand-made table prints. Stored as text, it renders as monospace.
TEXT_TABLE_RULE = re.compile(r"^ *-+(?: {2,}-+)+ *$", re.MULTILINE)
# The widest line of code a notebook's code cell may hold: the rendered site shows cells at
# this width, and a longer line scrolls sideways.
CODE_WIDTH = 100
# A stored error's header and failing line as IPython prints them ("Cell In[7], line 2", then
# "----> 2 <the line>", which setup() cuts with "…" to fit the page).
ERROR_CELL_LINE = re.compile(r"^Cell In\[(\d+)\], line (\d+)")
ERROR_ARROW_LINE = re.compile(r"^-+> (\d+) (.*?)…?$", re.MULTILINE)
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


def _text(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


def _shown_text(output: dict) -> str:
    """The text a reader sees of one stored output (a stream, a result's text/plain, an
    error's traceback), colour codes removed. An error's ``evalue`` is left out: it is the
    exception's own message, which nbval compares whole; the traceback shows it wrapped."""
    if output["output_type"] == "stream":
        return _text(output["text"])
    if output["output_type"] == "error":
        return ANSI.sub("", "\n".join(output["traceback"]))
    return _text(output.get("data", {}).get("text/plain", ""))


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_every_stored_output_line_fits_the_page(ipynb: pathlib.Path) -> None:
    problems = []
    for number, cell in enumerate(json.loads(ipynb.read_text())["cells"]):
        for output in cell.get("outputs", []):
            for line in _shown_text(output).splitlines():
                if len(line) > OUTPUT_WIDTH:
                    problems.append(f"cell {number} ({output['output_type']}): {len(line)} characters: {line[:70]}...")
    assert not problems, (
        f"{len(problems)} stored line(s) wider than {OUTPUT_WIDTH} characters:\n" + "\n".join(problems[:15])
        + "\n(display tables as tetrt_support.report.Table, which fits them to the page; shorten or"
        " break printed lines; errors are wrapped by tetrt_support.notebook.setup(); then regenerate)")


def _lines_its_error_quotes(cell: dict) -> set[int]:
    """Numbers (from 1) of the lines of a code cell that its own stored error shows as the
    failing line. Rewrapping one would leave the stored traceback quoting a line the source no
    longer has, so such a line stays as it ran until the notebook is regenerated."""
    quoted = set()
    for output in cell.get("outputs", []):
        if output["output_type"] != "error":
            continue
        text = ANSI.sub("", "\n".join(output["traceback"]))
        header = ERROR_CELL_LINE.match(text)
        if header is None or int(header.group(1)) != cell.get("execution_count"):
            continue
        lines = _text(cell["source"]).splitlines()
        for arrow in ERROR_ARROW_LINE.finditer(text):
            number = int(arrow.group(1))
            shown = lines[number - 1] if 0 < number <= len(lines) else None
            if number == int(header.group(2)) and shown is not None and shown.startswith(arrow.group(2)):
                quoted.add(number)
    return quoted


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_every_code_line_fits_the_page(ipynb: pathlib.Path) -> None:
    problems = []
    for number, cell in enumerate(json.loads(ipynb.read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        exempt = _lines_its_error_quotes(cell)
        for line_number, line in enumerate(_text(cell["source"]).splitlines(), start=1):
            if len(line) > CODE_WIDTH and line_number not in exempt:
                problems.append(f"{ipynb.name} cell {number} line {line_number}: {len(line)} characters: {line[:60]}...")
    assert not problems, (
        f"{len(problems)} line(s) of code wider than {CODE_WIDTH} characters:\n" + "\n".join(problems[:15])
        + f"\n(break them inside brackets in {ipynb.with_suffix('.py').name}, then"
        f" jupytext --sync notebooks/{ipynb.with_suffix('.py').name})")


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_tables_are_stored_as_html_with_a_text_twin(ipynb: pathlib.Path) -> None:
    problems = []
    for number, cell in enumerate(json.loads(ipynb.read_text())["cells"]):
        for output in cell.get("outputs", []):
            if output["output_type"] == "error" or not TEXT_TABLE_RULE.search(_shown_text(output)):
                continue
            if output["output_type"] == "stream":
                problems.append(f"cell {number}: a table printed as text")
            elif "text/html" not in output.get("data", {}):
                problems.append(f"cell {number}: a text table with no text/html twin")
    assert not problems, "\n".join(problems) + (
        "\n(show a tetrt_support.report.Table as the cell's last expression or with IPython's display(),"
        " not print(): the page then gets its HTML table and nbval its text twin)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_saving_an_ipynb_through_jupyterlab_writes_its_py_too(tmp_path: pathlib.Path) -> None:
    """The README's `jupyter lab --no-browser notebooks/`, saved through Lab's contents API
    (what Ctrl+S does): jupytext's contents manager writes the paired .py as well."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    shutil.copy(ROOT / "notebooks" / "jupytext.toml", folder)
    source = folder / "99_scratch.py"
    source.write_text("# %% [markdown]\n# A scratch pair\n\n# %%\nprint(1 + 1)\n")
    jupytext.write(jupytext.read(source), folder / "99_scratch.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
               f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0", str(folder)]
    if os.geteuid() == 0:
        command.append("--allow-root")  # as the README says: Lab refuses root without it
    server = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base, headers = f"http://127.0.0.1:{port}/api/contents/99_scratch.ipynb", {"Authorization": f"token {token}"}
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(urllib.request.Request(base, headers=headers), timeout=5) as reply:
                    model = json.load(reply)
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"jupyter lab did not serve the notebook:\n{server.communicate()[1][-2000:]}")
                time.sleep(0.5)
        model["content"]["cells"][1]["source"] = "print('edited in Lab')"
        body = json.dumps({"type": "notebook", "format": "json", "content": model["content"]}).encode()
        request = urllib.request.Request(base, data=body, method="PUT", headers=headers | {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.status == 200
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert "print('edited in Lab')" in source.read_text()
    assert "print('edited in Lab')" in (folder / "99_scratch.ipynb").read_text()
    assert _script.difference(folder / "99_scratch.ipynb", source) is None
