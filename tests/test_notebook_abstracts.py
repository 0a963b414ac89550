"""Each notebook opens with its question and an abstract: the answer, its figures printed by
a code cell (not typed in markdown), and where each part is.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from tetrt_support.report.abstract import ABSTRACTS

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _text(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


@pytest.mark.parametrize("number", sorted(ABSTRACTS))
def test_the_notebook_opens_with_its_question_and_an_abstract_from_a_cell_output(number: str) -> None:
    spec = ABSTRACTS[number]
    cells = json.loads((ROOT / "notebooks" / f"{spec.notebook}.ipynb").read_text())["cells"]
    first = _text(cells[0]["source"])
    assert cells[0]["cell_type"] == "markdown" and first.startswith(f"# {number} ")
    assert "**Question.**" in first
    opening = cells[:6]
    calls = [i for i, c in enumerate(opening)
             if c["cell_type"] == "code" and f'abstract.show("{number}"' in _text(c["source"])]
    assert calls, f"no abstract.show(\"{number}\", ...) cell among the first {len(opening)} cells"
    cell = opening[calls[0]]
    shown = [_text(o["data"]["text/markdown"]) for o in cell.get("outputs", [])
             if "text/markdown" in o.get("data", {})]
    assert shown and shown[0].startswith("**Answer.** "), "the abstract cell has no stored answer"
    figures = spec.figures_in(shown[0])
    assert figures is not None and set(figures) == set(spec.fields)
    source = _text(cell["source"])
    for name, value in figures.items():
        assert not re.search(rf"(?<![\w.]){re.escape(value)}(?![\w.])", source.replace(f'"{number}"', "")), \
            f"figure {name}={value} is typed in the abstract cell instead of computed"
    for c in cells[:calls[0]]:
        assert "**Answer.**" not in _text(c["source"]), "an answer typed in markdown before the abstract"
    assert "**Where.**" in shown[0] or not spec.sections
