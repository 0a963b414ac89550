"""The benchmarks' imports form a DAG: ``benchmarks.perf`` runs the suites and no module imports it back.

A suite's ``if __name__ == "__main__":`` block may hand its command line to
``perf.suite_main`` (``python -m benchmarks.<suite>``): that block runs only when the file
is the script, never when the module is imported, so it is left out of the graph. The
shared helpers import no suite.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
MODULES = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem != "__init__")
ENTRY = "perf"
HELPERS = ("gpu_clocks", "host_breakdown", "record", "steps")  # shared machinery, no suite
SUITES = tuple(m for m in MODULES if m != ENTRY and m not in HELPERS)


def _is_main_block(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` at the top level of a module."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    left, comparators = node.test.left, node.test.comparators
    return (isinstance(left, ast.Name) and left.id == "__name__" and len(comparators) == 1
            and isinstance(comparators[0], ast.Constant) and comparators[0].value == "__main__")


def _tree(module: str) -> ast.Module:
    return ast.parse((BENCHMARKS / f"{module}.py").read_text(), filename=f"benchmarks/{module}.py")


def _imported(nodes: list[ast.stmt]) -> set[str]:
    """The ``benchmarks`` modules that ``nodes`` import, at any depth (lazy imports included)."""
    found: set[str] = set()
    for node in (n for top in nodes for n in ast.walk(top)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("benchmarks."))
        elif isinstance(node, ast.ImportFrom):
            if node.level > 0 or node.module == "benchmarks":
                if node.module and node.level > 0:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(a.name for a in node.names if a.name in MODULES)
            elif node.module and node.module.startswith("benchmarks."):
                found.add(node.module.split(".")[1])
    return found


def imports_of(module: str) -> set[str]:
    """The ``benchmarks`` modules ``module`` imports when imported (its ``__main__`` block left out)."""
    return _imported([n for n in _tree(module).body if not _is_main_block(n)])


def test_the_modules_are_classified() -> None:
    from benchmarks import perf

    assert set(HELPERS) <= set(MODULES) and ENTRY in MODULES
    assert set(perf.RUNNERS) == set(perf.FILES)  # every suite has a runner in the one table
    # every suite module is run by the entry point; the helpers are not suites
    assert set(SUITES) <= imports_of(ENTRY), sorted(set(SUITES) - imports_of(ENTRY))


@pytest.mark.parametrize("module", MODULES)
def test_every_benchmarks_module_imports(module: str) -> None:
    importlib.import_module(f"benchmarks.{module}")


@pytest.mark.parametrize("module", [m for m in MODULES if m != ENTRY])
def test_no_module_but_its_main_block_imports_the_entry_point(module: str) -> None:
    assert ENTRY not in imports_of(module), f"benchmarks.{module} imports benchmarks.{ENTRY}"


@pytest.mark.parametrize("module", HELPERS)
def test_the_shared_helpers_import_no_suite(module: str) -> None:
    suites = imports_of(module) - set(HELPERS)
    assert not suites, f"benchmarks.{module} imports the suites {sorted(suites)}"


@pytest.mark.parametrize("module", MODULES)
def test_every_name_imported_from_a_benchmarks_module_exists(module: str) -> None:
    """Lazy imports too: the CUDA-only code paths import what they time inside functions."""
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("benchmarks."):
            source = importlib.import_module(node.module)
            missing = [a.name for a in node.names if not hasattr(source, a.name)]
            assert not missing, f"benchmarks.{module} line {node.lineno}: {node.module} has no {missing}"


def test_the_benchmarks_import_graph_has_no_cycle() -> None:
    graph = {m: imports_of(m) for m in MODULES}
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == "open":
                cycle = path[path.index(dep):] + [module, dep] if dep in path else [module, dep]
                pytest.fail(f"import cycle among benchmarks modules: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, [*path, module])
        state[module] = "done"

    for module in MODULES:
        if module not in state:
            visit(module, [])


@pytest.mark.parametrize("module", [m for m in SUITES if any(_is_main_block(n) for n in _tree(m).body)])
def test_a_suites_main_block_hands_its_command_line_to_the_entry_point(module: str) -> None:
    block = next(n for n in _tree(module).body if _is_main_block(n))
    calls = [n for n in ast.walk(block) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "suite_main"]
    if _imported([block]) == {ENTRY}:
        assert [c.args[0].value for c in calls if isinstance(c.args[0], ast.Constant)] == [module]


@pytest.mark.parametrize("module", ["train_step", "model_step", "loss_study"])
def test_python_dash_m_of_a_suite_is_the_entry_points_command_line(module: str) -> None:
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--help"], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "--suites" in done.stdout and "--out-dir" in done.stdout
