"""The one set-up call: short, path-free errors in a real kernel; inductor caches cleaned up."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import tempfile

import nbformat
from nbclient import NotebookClient

from tetrt_support import notebook

ROOT = pathlib.Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ENUM_DEPRECATION = ("<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile "
                    "as an opaque value type. Calling register_constant() on Enum subclasses is deprecated and "
                    "will be an error in a future release.")


def test_a_kernel_after_setup_has_short_path_free_errors_and_drops_only_known_noise(tmp_path: pathlib.Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from tetrt_support import notebook; notebook.setup()"),
        nbformat.v4.new_code_cell("import torch\ndef f(x):\n    return torch.cat(x, dim=3)"),
        nbformat.v4.new_code_cell("f([torch.ones(2)])", metadata={"tags": ["raises-exception"]}),
        nbformat.v4.new_code_cell("import warnings; warnings.warn('careful')"),
        nbformat.v4.new_code_cell("raise ValueError(' '.join(f'word{i}' for i in range(60)))",
                                  metadata={"tags": ["raises-exception"]}),
        # torchao (the bench extra), where transformers imports it, logs torch's deprecation
        # of register_constant on Enums; set-up drops that line only, and only once installed
        nbformat.v4.new_code_cell(
            "import logging\nnotebook.setup()\nlog = logging.getLogger('torch.utils._pytree')\n"
            f"log.warning({ENUM_DEPRECATION!r})\nlog.warning('another pytree warning')\n"
            "print(log.filters.count(notebook._drop_enum_register_constant))"),
    ]
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    (error,) = nb.cells[2].outputs
    assert error.output_type == "error" and error.ename == "IndexError"
    assert "Dimension out of range" in error.evalue  # the exception's own message, compared by nbval
    traceback = "\n".join(error.traceback)
    assert "Cell In[2], line 3, in f" in traceback and "torch.cat(x, dim=3)" in traceback
    assert "Traceback (most recent call last)" not in traceback and "site-packages" not in traceback
    assert str(ROOT) not in traceback and tempfile.gettempdir() + "/" not in traceback
    (warning,) = nb.cells[3].outputs
    assert warning.name == "stderr" and warning.text == "UserWarning: careful\n"
    (long,) = nb.cells[4].outputs
    assert long.evalue == " ".join(f"word{i}" for i in range(60))  # compared whole
    shown = [ANSI.sub("", line) for line in "\n".join(long.traceback).splitlines()]
    assert max(map(len, shown)) <= notebook.OUTPUT_WIDTH < len(long.evalue)
    assert " ".join(shown[shown.index("") + 1:]).split() == ["ValueError:", *long.evalue.split()]
    streams = {out.name: out.text for out in nb.cells[5].outputs}
    assert streams["stdout"] == "1\n"
    assert "another pytree warning" in streams["stderr"] and "register_constant" not in streams["stderr"]


def test_wrap_lines_keeps_short_lines_and_indents_continuations() -> None:
    url = "https://example.org/" + "x" * 120
    assert notebook.wrap_lines("short\n  two", 20) == ["short", "  two"]
    assert notebook.wrap_lines("  alpha beta gamma delta", 14) == ["  alpha beta", "    gamma", "    delta"]
    assert notebook.wrap_lines(f"see {url}", 40) == ["see", f"  {url}"]  # a long word is kept whole


def test_short_paths_makes_library_checkout_and_cell_paths_relative() -> None:
    purelib = sysconfig.get_paths()["purelib"]
    text = (f'File "{purelib}/torch/_dynamo/eval_frame.py", line 1\n'
            f'File "{ROOT}/tetrt_support/zoo.py", line 2\n'
            f'File "{tempfile.gettempdir()}/ipykernel_123/456.py", line 3')
    assert notebook.short_paths(text) == ('File "torch/_dynamo/eval_frame.py", line 1\n'
                                          'File "tetrt_support/zoo.py", line 2\n'
                                          'File "<cell>", line 3')


def test_caches_of_dead_processes_are_removed(tmp_path: pathlib.Path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f"tetrt-inductor-{dead}-abc"
    alive = tmp_path / f"tetrt-inductor-{os.getpid()}-def"
    other = tmp_path / "tetrt-inductor-unrelated"
    for folder in (stale, alive, other):
        folder.mkdir()
    notebook._remove_stale_caches()
    assert not stale.exists() and alive.exists() and other.exists()


def test_a_short_error_drops_pointers_to_the_stack_trace_it_leaves_out() -> None:
    error = RuntimeError("conversion failed. See the stack trace for more information.\n\n"
                         "(Refer to the full stack trace above for more information.)")
    shown = ANSI.sub("", "\n".join(notebook.format_short_exception(None, RuntimeError, error, None)))
    assert "stack trace above" not in shown and "See the stack trace" not in shown
    assert shown.startswith("RuntimeError: conversion failed.")
    assert shown.endswith("(library frames left out; setup(short_tracebacks=False) shows the full traceback)")


def test_regeneration_stores_errors_and_streams_without_colour_codes() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("tetrt_notebook_script_ansi", ROOT / "scripts" / "notebooks.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[
        nbformat.v4.new_output("error", ename="E", evalue="\x1b[96mstep\x1b[0m 3",
                               traceback=["\x1b[31mE\x1b[39m: \x1b[96mstep\x1b[0m 3"]),
        nbformat.v4.new_output("stream", name="stderr", text="\x1b[1mbold\x1b[0m\n")])])
    script.strip_ansi(nb)
    error, stream = nb.cells[0].outputs
    assert (error.evalue, error.traceback, stream.text) == ("step 3", ["E: step 3"], "bold\n")
    # nbval's sanitizer removes what a live run may still print, so the replay compares equal
    cfg = (ROOT / "notebooks" / "nbval_sanitize.cfg").read_text()
    patterns = re.findall(r"^regex: (.*)$\n^replace: (.*)$", cfg, flags=re.M)
    text = "a \x1b[96mstep\x1b[0m\x1b[1m 3\n\x1b[0m\nend"
    for regex, replace in patterns:
        text = re.sub(regex, replace, text)
    assert text == "a step 3\n\nend"
