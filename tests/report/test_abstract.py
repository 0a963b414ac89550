"""The abstracts' words (tetrt_support.report.abstract): templates, figures, the README's
answer column and the sections each abstract points at."""

from __future__ import annotations

import pathlib
import re

import pytest

from tetrt_support.report import abstract, collapsed, results
from tetrt_support.report.abstract import ABSTRACTS, Abstract, bound
from tetrt_support.report.tables import Table

ROOT = pathlib.Path(__file__).resolve().parents[2]
README_ROW = re.compile(r"^\| \[`(\d\d)_(\w+)`\]\(notebooks/(\d\d_\w+)\.ipynb\) \| (.+?) \| (.+?) \|$", re.M)


def test_markdown_fills_the_figures_and_reads_them_back() -> None:
    a = Abstract("99_x", "Yes.", "It took {n} steps within {error}.", (("1", "the set-up"), ("open", "rest")))
    text = a.markdown({"n": 3, "error": bound(4e-7)})
    assert text == "**Answer.** Yes. It took 3 steps within ≤ 1e-6.\n\n**Where.** §1: the set-up; open: rest."
    assert a.fields == ("n", "error")
    assert a.figures_in(text) == {"n": "3", "error": "≤ 1e-6"}
    assert a.figures_in("**Answer.** No.") is None


def test_markdown_refuses_missing_and_unused_figures() -> None:
    a = Abstract("99_x", "Yes.", "{n} steps.")
    with pytest.raises(KeyError, match="needs the figures"):
        a.markdown({})
    with pytest.raises(KeyError, match="not in the abstract"):
        a.markdown({"n": 1, "m": 2})


def test_bound_is_zero_or_the_next_power_of_ten() -> None:
    assert [bound(0.0), bound(3e-7), bound(1e-5), bound(0.2)] == [
        "0 (bit-identical)", "≤ 1e-6", "≤ 1e-5", "≤ 1e0"]


def test_the_view_is_markdown_for_lab_and_wrapped_text_for_a_terminal() -> None:
    view = abstract.show("06", passed=1, rows=2, families=3, engines="eager")
    assert view._repr_markdown_().startswith("**Answer.** Yes")
    assert all(len(line) <= 110 for line in repr(view).splitlines()) and "**" not in repr(view)


def test_readme_answer_column_is_the_abstracts_answer() -> None:
    rows = README_ROW.findall((ROOT / "README.md").read_text())
    assert [r[0] for r in rows] == sorted(ABSTRACTS)
    for number, name, target, _question, answer in rows:
        assert ABSTRACTS[number].notebook == f"{number}_{name}" == target
        assert (ROOT / "notebooks" / f"{target}.ipynb").exists()
        assert answer == ABSTRACTS[number].answer, f"README's answer for {number} differs from its abstract"


@pytest.mark.parametrize("number", sorted(ABSTRACTS))
def test_each_section_an_abstract_names_is_a_heading_of_its_notebook(number: str) -> None:
    source = (ROOT / "notebooks" / f"{ABSTRACTS[number].notebook}.py").read_text()
    headings = set(re.findall(r"^# ## (\d+)\.", source, re.M))
    for section, _what in ABSTRACTS[number].sections:
        if section == "open":
            assert re.search(r"^# ## .*(remains open|out of reach|Verdict)", source, re.M | re.I)
            continue
        first, _, last = section.partition("-")
        assert {first, last or first} <= headings, f"{number}: no section {section}"


def test_figures_from_the_stored_results_fill_their_abstracts() -> None:
    fake = results.load(results.RESULTS_DIR / "fake_impls.json", "fake_impls")
    sweep = results.load(results.RESULTS_DIR / "hf_sweep.json", "hf_sweep")
    perf = abstract.figures_05(*(results.load(results.RESULTS_DIR / f"{name}_cuda.json", name)
                                 for name in ("perf", "train_step", "model_step")),
                               results.load(results.RESULTS_DIR / "model_step_recipes_cuda_h100.json", "model_step"))
    for number, figures in (("04", abstract.figures_04(fake)), ("05", perf),
                            ("06", abstract.figures_06(sweep))):
        text = abstract.show(number, **figures)._repr_markdown_()
        assert ABSTRACTS[number].figures_in(text) == {k: str(v) for k, v in figures.items()}


def test_collapsed_shows_its_summary_and_keeps_the_whole_text_twin() -> None:
    table = Table([(i, i * i) for i in range(50)], ["n", "n^2"])
    shown = collapsed(table, "50 squares <all>")
    html = shown._repr_html_()
    assert html.startswith("<details><summary>50 squares &lt;all&gt;</summary>") and "</details>" in html
    assert "<details open" not in html and table._repr_html_() in html
    assert repr(shown) == "50 squares <all>\n" + table.text()
    assert "<pre>def f():" in collapsed("def f():\n    pass\n", "f")._repr_html_()
