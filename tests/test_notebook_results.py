"""Each notebook reads the results files it says it reads.

The rule: every file name ``<name>.json`` that a notebook's header (its first markdown
cell) names and that exists in ``benchmarks/results/`` is loaded by one of its code cells.
"Loaded" means a string literal in a code cell ends in ``.json`` and, with each f-string
field (``{...}``) taken as any run of characters without a ``/``, its last path part
matches ``<name>.json`` in full. So ``f"{RESULTS}/loss_curves_{device}.json"`` counts as
loading both ``loss_curves_cpu.json`` and ``loss_curves_cuda.json``; a name in prose or a
comment does not count.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
JSON_NAME = re.compile(r"[\w.-]+\.json")


def _header_names(cells: list[dict]) -> set[str]:
    header = next(c for c in cells if c["cell_type"] == "markdown")
    names = set(JSON_NAME.findall("".join(header["source"])))
    return {n for n in names if (RESULTS / n).is_file()}


def _loaded_patterns(cells: list[dict]) -> list[re.Pattern[str]]:
    patterns = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        try:
            tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
        except SyntaxError:
            continue
        parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        for node in ast.walk(tree):
            if id(node) in parts:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
            else:
                continue
            last = text.rsplit("/", 1)[-1]
            if last.endswith(".json"):
                patterns.append(re.compile("[^/]*".join(re.escape(part) for part in last.split("\0"))))
    return patterns


def test_the_rule_reads_f_strings_and_ignores_comments() -> None:
    cells = [{"cell_type": "markdown", "source": ["results/perf_cpu.json and results/perf_cuda.json"]},
             {"cell_type": "code", "source": ["# perf_cuda.json\n", "x = f'{R}/perf_{d}.json'\n"]}]
    assert [p.pattern for p in _loaded_patterns(cells)] == ["perf_[^/]*\\.json"]
    cells[1]["source"] = ["# perf_cpu.json perf_cuda.json\n"]
    assert _loaded_patterns(cells) == [] and _header_names(cells) == {"perf_cpu.json", "perf_cuda.json"}


@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=[p.stem[:2] for p in NOTEBOOKS])
def test_every_results_file_the_header_names_is_loaded(ipynb: pathlib.Path) -> None:
    cells = json.loads(ipynb.read_text())["cells"]
    patterns = _loaded_patterns(cells)
    unread = sorted(n for n in _header_names(cells) if not any(p.fullmatch(n) for p in patterns))
    assert not unread, f"{ipynb.name} names these results files in its header but loads none of them: {unread}"
