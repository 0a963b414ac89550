"""Import boundaries: the quantization wing and the report helpers load no lowering stack.

Checked in a fresh interpreter, since this test process has long imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

LOWERING_AND_COMPILER = ("tetrt_support.complex", "tetrt_support.compiler", "tetrt_support.history")


def _modules_after(statement: str) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('tetrt_support'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, f"`{statement}` failed in a fresh interpreter:\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _under(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_importing_the_quant_wing_loads_no_lowering_or_compiler_module() -> None:
    modules = _modules_after("import tetrt_support.quant")
    assert "tetrt_support.quant" in modules
    assert _under(modules, LOWERING_AND_COMPILER) == []


@pytest.mark.parametrize("module", ["tetrt_support.report", "tetrt_support.report.tables", "tetrt_support.report.timing",
                                    "tetrt_support.report.results", "tetrt_support.report.perf",
                                    "tetrt_support.report.compare", "tetrt_support.report.complex_graphs",
                                    "tetrt_support.report.training", "tetrt_support.report.abstract"])
def test_report_helpers_load_neither_wing_until_called(module: str) -> None:
    modules = _modules_after(f"import {module}")
    assert _under(modules, (*LOWERING_AND_COMPILER, "tetrt_support.quant")) == []
