"""Figures fit the page: one style for the collection, and every stored figure
shown at most as wide as the site's page column, with text no smaller than 9 pt there.
"""

from __future__ import annotations

import base64
import json
import pathlib
import re
import struct

import pytest

from tetrt_support import notebook

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _cases() -> list:
    return [pytest.param(p, id=p.stem[:2]) for p in NOTEBOOKS]


def test_the_style_fits_the_page_column_with_text_of_at_least_9_pt() -> None:
    style = notebook.FIGURE_STYLE
    width_in, _ = style["figure.figsize"]
    assert width_in * style["figure.dpi"] <= notebook.PAGE_WIDTH_PX
    assert notebook.FIGURE_MAX_WIDTH_IN * style["figure.dpi"] == notebook.PAGE_WIDTH_PX
    sizes = [v for k, v in style.items() if k.endswith(("size", "fontsize")) and k != "figure.figsize"]
    assert sizes and all(isinstance(v, (int, float)) and v >= notebook.MIN_FONT_PT for v in sizes)


def test_setup_applies_the_style() -> None:
    import matplotlib.pyplot as plt

    notebook.setup()
    for key, value in notebook.FIGURE_STYLE.items():
        assert plt.rcParams[key] == (list(value) if isinstance(value, tuple) else value), key


def test_alt_text_is_the_figures_titles_or_what_it_plots() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2)
    fig.suptitle("Both"); a.set_title("left panel"); b.set_xlabel("x (s)"); b.set_ylabel("y (m)")
    assert notebook.figure_alt_text(fig) == "Both; left panel; y (m) against x (s)"
    plt.close(fig)


def _png_width(data: str) -> int:
    raw = base64.b64decode(data)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", raw[16:20])[0]


@pytest.mark.parametrize("ipynb", _cases())
def test_every_stored_figure_fits_the_page_and_has_alt_text(ipynb: pathlib.Path) -> None:
    problems = []
    for number, cell in enumerate(json.loads(ipynb.read_text())["cells"]):
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            if png is None:
                continue
            meta = output.get("metadata", {})
            natural = _png_width(png)
            shown = meta.get("image/png", {}).get("width", natural)  # retina: half the pixels
            if shown > notebook.PAGE_WIDTH_PX:
                problems.append(f"cell {number}: shown {shown} px wide > {notebook.PAGE_WIDTH_PX} px")
            if natural < 1.5 * shown:
                problems.append(f"cell {number}: not a retina PNG ({natural} px stored for {shown} shown)")
            if not meta.get("alt") or meta["alt"] == "figure":
                problems.append(f"cell {number}: no alt text (give the figure a title)")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("ipynb", _cases())
def test_no_figure_text_below_9_pt_is_asked_for(ipynb: pathlib.Path) -> None:
    source = ipynb.with_suffix(".py").read_text()
    small = [m.group(0) for m in re.finditer(r"fontsize\s*=\s*(\d+(\.\d+)?)", source)
             if float(m.group(1)) < notebook.MIN_FONT_PT]
    assert not small, f"{ipynb.stem}: {small}"
